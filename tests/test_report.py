"""The report of an assembled run (hddm_flower.evaluation.report via the assemble stage) and the ServerApp's summary metrics."""

import json
import time

import pytest

from hddm_flower.checkpoints import save_expert
from hddm_flower.data import Dataset, read_meta
from hddm_flower.stages.assemble import finish_run
from hddm_flower.stages.expert import build_expert
from hddm_flower.stages.prepare import assign_objectives

from .test_provenance import expected_source_commit


@pytest.fixture(scope="module")
def report_run(tiny_config, dataset_dir, tmp_path_factory):
    """Experts 0 and 1 (untrained: the report's layout does not need trained ones) assembled with 2 and 3 missing."""
    import torch

    run = tmp_path_factory.mktemp("run")
    objectives = assign_objectives(tiny_config, Dataset.open(dataset_dir))
    for k in (0, 1):
        torch.manual_seed(k)
        expert, model_config, meta = build_expert(tiny_config, read_meta(dataset_dir), objectives[k], expert_id=k)
        meta |= {"expert_id": k, "cluster_id": k, "steps": 3, "images_seen": 12, "device_seconds": 0.5}
        save_expert(run / "experts" / f"expert-{k}", expert.net.transformer.state_dict(), model_config, meta)
    missing = [{"expert_id": 2, "reason": "error reply (code 2)"}, {"expert_id": 3, "reason": "no reply within 2 s"}]
    return run, finish_run(tiny_config, run, Dataset.open(dataset_dir), missing)


def test_report_json_names_experts_missing_metrics_and_versions(report_run):
    run, returned = report_run
    report = json.loads((run / "report.json").read_text())
    assert report == json.loads(json.dumps(returned)) and report["num_experts"] == 4
    assert [(e["expert_id"], e["objective"]) for e in report["experts"]] == [(0, "fm"), (1, "ddpm")]
    for e in report["experts"]:
        assert {"expert_id", "objective", "cluster_id", "steps", "images_seen", "device_seconds", "sha256"} <= set(e)
    assert [m["expert_id"] for m in report["missing"]] == [2, 3]
    assert {"metrics", "versions", "dataset", "config"} <= set(report) and report["versions"]["flwr"] == "1.42.0"
    assert report["source"].get("commit") == expected_source_commit()  # the checkout's, read apart; None: none
    assert report["metrics"]["feature_network"].startswith("hddm feature classifier")


def test_report_md_grids_and_plots_are_written(report_run):
    run, report = report_run
    md = (run / "report.md").read_text()
    assert md.startswith("# hddm-flower run") and "2 of 4 experts" in md
    assert "- expert 2: error reply (code 2)" in md and "- expert 3: no reply within 2 s" in md
    assert "FID/KID features: **hddm feature classifier" in md  # every result names its feature network
    assert "![samples](samples.png)" in md and (run / "samples.png").stat().st_size > 0
    ev = report["metrics"]["evaluation"]
    for name in ev["plots"].values():
        assert (run / name).stat().st_size > 0
    assert all((run / g["file"]).is_file() for g in ev["grids"])
    assert (run / "router" / "config.json").exists()


def test_server_summary_metrics_follow_the_configured_times():
    """evaluation.times need not contain 0.5 (the ServerApp indexed it with .index(0.5) and crashed)."""
    from strategies.server_app import summary_metrics

    report = {"metrics": {"times": [0.2, 0.8], "router_top1_accuracy": [0.9, 0.4], "ensemble_velocity_mse": [1.0, 2.0]}}
    assert summary_metrics(report) == {
        "router-top1-accuracy-t0.2": 0.9,
        "ensemble-velocity-mse-t0.2": 1.0,
        "router-top1-accuracy-t0.8": 0.4,
        "ensemble-velocity-mse-t0.8": 2.0,
    }


def _acceptable_meta():
    """Metadata a valid expert 1 (DDPM, as the tiny config assigns it) may send: every checked field in range, plus
    whatever extra fields (bounded JSON) a node adds."""
    from hypothesis import strategies as st

    finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e30, max_value=1e30)
    json_values = st.recursive(
        st.none() | st.booleans() | st.integers(-(2**62), 2**62) | finite | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=12,
    )
    return st.fixed_dictionaries(
        {
            "steps": st.integers(0, 2**62),
            "images_seen": st.integers(0, 2**62),
            "device_seconds": st.floats(0, 1e12),
            "schedule": st.sampled_from(["linear", "cosine"]),
            "num_train_timesteps": st.integers(2, 100_000),
        },
        optional={
            "final_loss": finite,
            "resumed_steps": st.integers(0, 2**62),
            "peak_memory_bytes": st.integers(0, 2**62),
            "objective_assigned": st.just("ddpm"),
            "loss_curve": st.lists(st.tuples(st.integers(0, 10**6), finite).map(list), max_size=5),
            "notes": json_values,
        },
    )


def test_fuzzed_acceptable_experts_are_accepted_and_reach_report_cards_and_pipeline(
    report_run, tiny_config, dataset_dir, tmp_path_factory
):
    """Generated metadata that is valid for the run is accepted (not only refused, as the reply fuzzers check),
    and the accepted expert goes through every consumer: report.json (strict JSON), report.md, the model cards
    and loading the experts as the pipeline does."""
    import hashlib
    import shutil

    from hypothesis import HealthCheck, given, settings

    from hddm_flower.accept import accept_expert
    from hddm_flower.checkpoints import META, MODEL_CONFIG, WEIGHTS
    from hddm_flower.evaluation.report import write_report
    from hddm_flower.hddm_pipeline import HDDMExperts
    from hddm_flower.stages.expert import expert_spec

    run, report = report_run
    spec = expert_spec(tiny_config, Dataset.open(dataset_dir))
    source = run / "experts" / "expert-1"
    base = json.loads((source / META).read_text())
    blob = (source / WEIGHTS).read_bytes()
    meta0 = json.loads((run / "experts" / "expert-0" / META).read_text())

    @settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(fields=_acceptable_meta())
    def check(fields):
        target = tmp_path_factory.mktemp("fuzzed-run")
        shutil.copytree(run / "experts" / "expert-0", target / "experts" / "expert-0")
        (target / "experts" / "config.json").write_text((run / "experts" / "config.json").read_text())
        incoming = target / "experts" / ".incoming-expert-1.safetensors"
        incoming.write_bytes(blob)
        keep = {k: base[k] for k in ("expert_id", "cluster_id", "objective", "preset", "time_convention")}
        meta = keep | {"weights_dtype": "float32", "sha256": hashlib.sha256(blob).hexdigest()} | fields
        installed = accept_expert(
            target, incoming, json.dumps(meta), (source / MODEL_CONFIG).read_text(), spec, expert_id=1,
            objective_assigned="ddpm",
        )  # fmt: skip
        assert installed["expert_id"] == 1 and (target / "experts" / "expert-1" / WEIGHTS).is_file()
        out = write_report(
            tiny_config, target, Dataset.open(dataset_dir), [meta0, installed], [], report["metrics"], {}
        )
        json.loads(json.dumps(out, allow_nan=False))
        md = (target / "report.md").read_text()
        assert f"| 1 | 1 | ddpm ({fields['schedule']}) |" in md and f"| {fields['steps']} |" in md
        assert (target / "README.md").is_file() and (target / "experts" / "expert-1" / "README.md").is_file()
        assert HDDMExperts.from_pretrained(target / "experts").ids == [0, 1]

    check()


def test_the_flwr_run_benchmark_reads_a_real_report_and_refuses_a_used_run_dir(report_run, monkeypatch):
    """benchmarks/flwr_run.py keeps the experts, the missing ones and top-2's numbers of a report.json as written,
    and refuses to time a run into a folder that exists (its figure is for a fresh run directory)."""
    from benchmarks import flwr_run

    run, _ = report_run
    report = json.loads((run / "report.json").read_text())
    s = flwr_run.summarise(report)
    assert (s["experts"], s["num_experts"], [m["expert_id"] for m in s["missing"]]) == (2, 4, [2, 3])
    assert s["objectives"] == ["fm", "ddpm"] and s["expert_device_seconds"] == {"min": 0.5, "max": 0.5}
    assert s["top2_fid"] == report["metrics"]["evaluation"]["modes"]["top2"]["fid"] > 0
    assert s["grid_adherence"] == report["metrics"]["sampling"]["adherence"]["mean"]
    record = {
        "command": "flwr run . --stream",
        "commit": "abc1234",
        "machine": "m",
        "date": "d",
        "load_average": {"start": 0.1, "end": 1.2},
        "seconds": 532.04,
        "report": s,
    }
    assert "**532.0 s (8.9 min)** | 2/4 |" in flwr_run.render(record)
    # the log line by which a record knows the dataset was prepared inside the timed run is the one the core writes
    from pathlib import Path

    embedded = (Path(flwr_run.ROOT) / "hddm_flower" / "embedded.py").read_text()
    assert f'log.info("{flwr_run.PREPARING} in %s"' in embedded
    no_fid = {**record, "report": {**s, "top2_fid": None, "top2_kid": None}}  # a run that did not evaluate top-2
    assert "top-2 FID –, KID –" in flwr_run.render(no_fid)
    monkeypatch.setattr("sys.argv", ["flwr_run", "--run-dir", str(run)])
    with pytest.raises(SystemExit, match="exists; the figure is for a fresh run directory"):
        flwr_run.main()
    # a committed record is never overwritten: a name in use is refused before anything runs
    monkeypatch.setattr(flwr_run, "RESULTS", run.parent)
    (run.parent / "taken.json").write_text("{}")
    monkeypatch.setattr("sys.argv", ["flwr_run", "--run-dir", str(run.parent / "fresh"), "--name", "taken"])
    with pytest.raises(SystemExit, match="taken.json exists; give another --name"):
        flwr_run.main()
    assert not (run.parent / "fresh").exists() and (run.parent / "taken.json").read_text() == "{}"


def test_the_flwr_run_benchmark_stops_flwrs_managed_superlink_and_nothing_else(tmp_path, monkeypatch):
    """Only a ``flower-superlink`` carrying flwr's local-superlink log file is the benchmark's to stop; a process
    that merely names flower-superlink in its arguments is left alone."""
    import subprocess
    import sys

    import flwr.supercore.utils

    from benchmarks import flwr_run

    log = tmp_path / "local-superlink" / "superlink.log"  # flwr's managed SuperLink logs under FLWR_HOME
    monkeypatch.setattr(flwr.supercore.utils, "get_flwr_home", lambda: tmp_path)
    # flwr 1.42 starts its managed SuperLink with this log file: the benchmark's way to recognise it
    import inspect

    import flwr.cli.local_superlink as local

    assert '"local-superlink"' in inspect.getsource(local) and '"superlink.log"' in inspect.getsource(local)
    sleeper = f"{sys.executable} -c 'import time; time.sleep(120)'"
    managed = subprocess.Popen(["bash", "-c", f"exec -a flower-superlink {sleeper} --log-file {log}"])
    bystander = subprocess.Popen(["bash", "-c", f"exec {sleeper} flower-superlink --log-file {log}"])
    try:
        deadline = time.monotonic() + 10
        while managed.pid not in flwr_run.managed_superlink_pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert flwr_run.managed_superlink_pids() == [managed.pid]
        assert flwr_run.stop(flwr_run.managed_superlink_pids(), timeout=10) == []
        assert managed.wait(5) is not None and bystander.poll() is None
    finally:
        for p in (managed, bystander):
            p.kill()
            p.wait()
