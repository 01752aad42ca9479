"""All the performance figures in one command, written as JSON and as the Markdown table docs/performance.md shows.

    python -m benchmarks.bench                 # CPU figures (≈ 25 min on 2 cores, most of it the federation runs)
    python -m benchmarks.bench --quick         # fewer steps and repetitions (≈ 3 min): a smoke run, not for docs/performance.md
    python -m benchmarks.bench --skip federation

Parts (each a script of its own in ``benchmarks/``, runnable alone):

* ``train_step``: expert training samples/s, ours vs the diffusers-examples loop, FM and DDPM (goal ≥ 1.0×);
* ``sampling``: grouped top-2 vs the per-sample routing loop (goal ≥ 3× at batch 64) and vs one expert
  (goal ≤ 2.2×);
* ``federation``: ``flwr run .`` vs the same stages through the CLI (goal ≤ 1.10×), with the peak memory of the
  ServerApp and ClientApp processes;
* ``gpu``: when CUDA is available, ``benchmarks/gpu.py`` (XL/2 and B/2 training, 256² sampling).

Every figure is a median over ≥ 5 repetitions (2 for the federation, whose repetitions take minutes), with the
peer measured alternately in the same run. Writes ``benchmarks/results/bench.json`` and ``bench.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path

import torch

from benchmarks import federation, gpu, sampling, train_step
from benchmarks.common import RESULTS, commit, machine, write_result
from hddm_flower.provenance import versions

PARTS = ("train_step", "sampling", "federation", "gpu")


def _fmt(x, digits=2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def table(r: dict) -> str:
    rows = ["| figure | ours | peer | ratio | goal | met | reps | how |", "|---|---|---|---|---|---|---|---|"]

    def row(name, ours, peer, ratio, goal, ok, reps, how):
        rows.append(
            f"| {name} | {ours} | {peer} | {_fmt(ratio)}× | {goal} | {'yes' if ok else '**no**'} | {reps} | `{how}` |"
        )

    for obj, t in r.get("train_step", {}).items():
        row(
            f"training samples/s, {t['preset']} {obj}, batch {t['batch_size']}, {t['threads']} thread",
            _fmt(t["samples_per_s"]["ours"], 1),
            f"{_fmt(t['samples_per_s']['plain'], 1)} (diffusers loop)",
            t["ratio_ours_over_plain"],
            "≥ 1.0×",
            t["ratio_ours_over_plain"] >= 1.0,
            t["reps"],
            t["command"],
        )
    if s := r.get("sampling"):
        sec = s["seconds_median"]
        how = f"{s['command']} ({s['steps']} steps, batch {s['batch_size']}, CFG {s['cfg_scale']})"
        row(
            "sampling: grouped top-2 vs per-sample routing loop (s per batch)",
            _fmt(sec["grouped"]),
            _fmt(sec["per_sample"]),
            s["grouped_speedup_over_per_sample"],
            "≥ 3× faster",
            s["grouped_speedup_over_per_sample"] >= 3,
            s["reps"],
            how,
        )
        row(
            "sampling: grouped top-2 vs one expert (s per batch)",
            _fmt(sec["grouped"]),
            _fmt(sec["one_expert"]),
            s["grouped_cost_over_one_expert"],
            "≤ 2.2× the cost",
            s["grouped_cost_over_one_expert"] <= 2.2,
            s["reps"],
            how,
        )
    if f := r.get("federation"):
        w = f["wall_seconds_median"]
        c = f["cpu_seconds_median"]
        row(
            f"federation: wall time of {f['experts']} experts + router + evaluation ({f['overrides']})",
            f"{_fmt(w['flwr'], 0)} s (flwr run)",
            f"{_fmt(w['cli'], 0)} s (hddm CLI)",
            f["ratio_flwr_over_cli"],
            "≤ 1.10×",
            f["ratio_flwr_over_cli"] <= 1.10,
            f["reps"],
            f["command"],
        )
        row(
            "federation: CPU seconds of all processes (same runs)",
            f"{_fmt(c['flwr'], 0)} s",
            f"{_fmt(c['cli'], 0)} s",
            f["cpu_ratio_flwr_over_cli"],
            "(steadier on a busy machine)",
            f["cpu_ratio_flwr_over_cli"] <= 1.10,
            f["reps"],
            f["command"],
        )
        m = f["peak_rss_mib"]
        rows.append(
            f"| peak RSS: ServerApp {_fmt(m['flwr_server'], 0)} MiB, ClientApp {_fmt(m['flwr_client'], 0)} MiB "
            f"(CLI: assemble {_fmt(m['cli_assemble'], 0)}, train-expert {_fmt(m['cli_train_expert'], 0)}) "
            f"| | | | | | {f['reps']} | `{f['command']}` |"
        )
    return "\n".join(rows)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="short smoke run (figures not comparable)")
    p.add_argument("--skip", action="append", default=[], choices=PARTS)
    p.add_argument("--config", default=None, help="experiment YAML (default configs/default.yaml)")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--federation-reps", type=int, default=2, help="repetitions of the federation comparison")
    p.add_argument("--out-dir", default=str(RESULTS))
    args = p.parse_args(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    q = args.quick
    common = [*(["--config", args.config] if args.config else [])]
    t0 = time.perf_counter()
    r: dict = {
        "command": " ".join(["python -m benchmarks.bench", *(sys.argv[1:] if argv is None else argv)]),
        "machine": machine(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": commit(),
    }
    if "train_step" not in args.skip:
        r["train_step"] = {
            obj: train_step.main(
                [
                    *common,
                    *(["--cache-dir", args.cache_dir] if args.cache_dir else []),
                    "--objective",
                    obj,
                    *(["--steps", "3", "--reps", "1"] if q else []),
                    "--out",
                    str(out / f"train_step_{obj}.json"),
                ]
            )
            for obj in ("fm", "ddpm")
        }
    if "sampling" not in args.skip:
        r["sampling"] = sampling.main(
            [
                *common,
                *(["--steps", "2", "--reps", "1", "--batch-size", "8"] if q else []),
                "--out",
                str(out / "sampling.json"),
            ]
        )
    if "federation" not in args.skip:
        r["federation"] = federation.main(
            [
                *common,
                *(["--cache-dir", args.cache_dir] if args.cache_dir else []),
                *(["--set", "expert.steps=5", "--set", "router.steps=5", "--set", "sampling.num_steps=5"] if q else []),
                "--reps",
                "1" if q else str(args.federation_reps),
                "--out",
                str(out / "federation.json"),
            ]
        )
    if "gpu" not in args.skip and torch.cuda.is_available():
        r["gpu"] = gpu.main(["--out-dir", str(out)])
    r["seconds"] = round(time.perf_counter() - t0, 1)
    r["versions"] = versions()
    write_result(out / "bench.json", r)
    md = (
        f"Benchmarks ({r['date']}, commit {r['commit']}, {r['machine']}; torch {r['versions'].get('torch')}, "
        f"flwr {r['versions'].get('flwr')}, diffusers {r['versions'].get('diffusers')}). "
        f"Produced by `{r['command']}` in {r['seconds'] / 60:.1f} min.\n\n{table(r)}\n"
    )
    (out / "bench.md").write_text(md)
    print(md)
    return r


if __name__ == "__main__":
    main()
