"""The coordinator's benchmarks run end to end at tiny sizes, each in its own interpreter as ``python -m`` runs it
(they fork a process per measurement, which must not inherit the test process's thread pools), and what they
record is measured: per stage an RSS increase over its own post-import RSS, bytes read that follow what the stage
reads, times; per thread count wall and CPU time."""

import json
import os
import subprocess
import sys

from benchmarks.common import ROOT

STAGES = ("router", "feature", "reference", "diagnostics", "report", "monolith")


def _run(module: str, *args: str, cpus: set[int] | None = None) -> None:
    """``python -m module args``, on the CPUs ``cpus`` only when given (set by the child itself: no pre-exec hook
    in a process that may hold threads)."""
    pin = "" if cpus is None else f"os.sched_setaffinity(0, {sorted(cpus)}); "
    code = (
        f"import os, runpy, sys; {pin}sys.argv = {[module, *args]!r}; runpy.run_module({module!r}, run_name='__main__')"
    )
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True, capture_output=True)


def test_coordinator_scale_records_each_stages_increase_and_reads(tmp_path):
    out = tmp_path / "scale"
    _run(
        "benchmarks.coordinator_scale",
        *("--n", "160", "--shard-size", "5", "--router-steps", "2", "--feature-steps", "2", "--expert-steps", "1"),
        *("--prompts", "2", "--sample-steps", "1", "--kid-reservoir", "20", "--diagnostic-images", "16"),
        *("--out", str(out)),
    )
    r = json.loads(out.with_suffix(".json").read_text())
    n, big = r["sizes"]["N"], r["sizes"]["4N"]
    assert (n["samples"], big["samples"]) == (160, 640) and r["dataset_bytes_4N"] > 640 * 1000
    for size in (n, big):
        for name in STAGES:
            s = size[name]
            # the increase is over the stage's own post-import RSS (≈ 0.5–1.5 GiB of libraries), not its peak
            assert 0 <= s["increase_mib"] < s["rss_after_imports_mib"] and s["rss_after_imports_mib"] > 200, name
            assert s["rchar"] > 0 and s["must_read_bytes"] > 0 and s["seconds"] > 0 and s["threads"] == 1, name
    # the reference pass reads every sample: its bytes follow the dataset, 4× at 4N
    assert big["reference"]["rchar"] >= big["reference"]["must_read_bytes"] > 3 * n["reference"]["must_read_bytes"]
    assert big["reference"]["rchar"] > 2 * n["reference"]["rchar"]
    assert big["reference"]["images"] == 640 and big["monolith"]["steps"] == 8  # K × expert.steps
    assert set(r["ratios_4N_over_N"]) == set(STAGES) and isinstance(r["goal_met"], bool)
    assert r["command"].startswith("python -m benchmarks.coordinator_scale --n 160")
    assert "| reference |" in out.with_suffix(".md").read_text()


def test_coordinator_threads_records_wall_and_cpu_per_thread_count(tmp_path):
    """On one CPU of the affinity mask (the benchmark's thread counts are 1 and the process's CPUs: here one run
    alone and one beside the busy process, the same code as on more CPUs, without two threads spinning against a
    shared machine's load)."""
    out = tmp_path / "threads"
    _run(
        "benchmarks.coordinator_threads",
        *("--steps", "2", "--batch-size", "8", "--n", "160", "--latent-side", "8", "--busy-warmup", "0.5"),
        *("--out", str(out)),
        cpus={min(os.sched_getaffinity(0))},
    )
    r = json.loads(out.with_suffix(".json").read_text())
    cpus = 1
    assert r["available_cpus"] == cpus
    runs = {(x["threads"], x["busy_process"]): x for x in r["runs"]}
    assert set(runs) == {(t, b) for t in {1, cpus} for b in (False, True)}
    for x in runs.values():
        assert 0 < x["cpu_seconds"] and 0 < x["seconds"] and x["load_average_at_start"] >= 0
    assert set(r["busy_slowdown"]) == {str(t) for t in {1, cpus}}
    assert "| 1 | yes |" in out.with_suffix(".md").read_text()


def _table(doc: str, header: str) -> list[list[str]]:
    """The rows (cells) of the markdown table of ``doc`` whose header line starts with ``header``."""
    lines = (ROOT / doc).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip().strip("*") for c in line.strip("|").split("|")])
    return rows


def test_the_committed_results_meet_the_goal_and_the_docs_quote_them():
    """benchmarks/results/coordinator_scale.json: N ≥ 20,000, every stage's increase at 4N ≤ 1.15× at N; the tables
    of docs/performance.md are these results and coordinator_threads.json's, to their last digit."""
    scale = json.loads((ROOT / "benchmarks" / "results" / "coordinator_scale.json").read_text())
    n, big = scale["sizes"]["N"], scale["sizes"]["4N"]
    assert n["samples"] >= 20_000 and big["samples"] == 4 * n["samples"] and scale["goal_met"] is True
    names = {"feature classifier": "feature", "reference statistics": "reference", "evaluate_and_report": "report"}
    rows = _table("docs/performance.md", "| stage | increase N (MiB)")
    assert {names.get(r[0], r[0]) for r in rows} == set(STAGES)
    for label, inc_n, inc_4n, ratio, read_n, read_4n, bound_4n in rows:
        a, b = n[names.get(label, label)], big[names.get(label, label)]
        assert b["increase_mib"] <= 1.15 * a["increase_mib"] and f"{b['increase_mib'] / a['increase_mib']:.3f}" == ratio
        assert (inc_n, inc_4n) == (f"{a['increase_mib']:.1f}", f"{b['increase_mib']:.1f}"), label
        assert (read_n, read_4n) == (f"{a['rchar'] / 1e6:.1f}", f"{b['rchar'] / 1e6:.1f}"), label
        assert bound_4n == f"{b['must_read_bytes'] / 1e6:.1f}", label
    threads = json.loads((ROOT / "benchmarks" / "results" / "coordinator_threads.json").read_text())
    quoted = [(int(t), busy == "yes", wall, cpu) for t, busy, wall, cpu in _table("docs/performance.md", "| threads |")]
    assert quoted == [
        (r["threads"], r["busy_process"], f"{r['seconds']:.1f}", f"{r['cpu_seconds']:.1f}") for r in threads["runs"]
    ]


def test_the_docs_quote_the_committed_dispatch_comparison():
    """benchmarks/results/sampling_dense.json: dense dispatch against gathered top-2 of 8, as the docs quote it."""
    r = json.loads((ROOT / "benchmarks" / "results" / "sampling_dense.json").read_text())
    ratio = f"{r['dense_cost_over_grouped']:.1f}×"
    assert r["max_abs_diff_grouped_vs_dense"] < 1e-5 and r["batch_size"] == 32 and r["steps"] == 10
    for doc, quote in (
        ("paper-scale.md", f"dense dispatch cost {ratio} gathered"),
        ("performance.md", f"cost {ratio}"),
    ):
        assert quote in " ".join((ROOT / "docs" / doc).read_text().split()), doc
