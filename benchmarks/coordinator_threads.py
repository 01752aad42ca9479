#!/usr/bin/env python3
"""The coordinator's thread count beside a busy process: router training (the ServerApp's first stage after the
experts arrive) at ``coordinator.threads`` 1 and the CPUs of the process, alone and beside one process that keeps
one core busy.

Each run is its own process (forked from one that imported everything) that sets its threads as the ServerApp does
(:func:`hddm_flower.devices.coordinator_threads`) and trains the router for a fixed number of steps from the
stream of a small synthetic dataset in the paper's layout (:func:`benchmarks.coordinator_scale.generate`); it
reports wall time and CPU time. The busy process is one thread of float32 matrix products (torch, one thread),
started before the run and stopped after it. On a machine that other jobs share, compare the ratios of one call;
the result records the load.

    python -m benchmarks.coordinator_threads
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, commit, forked, machine, write_result

BUSY = "import torch; torch.set_num_threads(1); a = torch.randn(512, 512)\nwhile True: a = (a @ a).tanh()"


def config(args, threads: int):
    from hddm_flower.config.io import config_from_dict

    return config_from_dict(
        {
            "num_experts": 8,
            "data": {"stream": True, "max_caption_tokens": args.tokens},
            "router": {"preset": args.preset, "steps": args.steps, "batch_size": args.batch_size},
            "coordinator": {"device": "cpu", "threads": threads},
        },
        "coordinator_threads",
    )


def child(args, dataset: str, work: str, threads: int) -> dict:
    """One router training in this (forked) process."""
    from hddm_flower.data import Dataset
    from hddm_flower.devices import coordinator_threads
    from hddm_flower.stages.router import fit_router

    cfg = config(args, threads)
    threads = coordinator_threads(cfg.coordinator.threads)
    d = Dataset.open(dataset)
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    fit_router(cfg, d, Path(work))
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return {"threads": threads, "seconds": round(time.perf_counter() - t0, 2), "cpu_seconds": round(cpu, 2)}


def run(args, dataset: Path, work: Path, threads: int, busy: bool) -> dict:
    spinner = subprocess.Popen([sys.executable, "-c", BUSY]) if busy else None
    try:
        if spinner is not None:
            time.sleep(args.busy_warmup)  # its imports done, spinning
        load = os.getloadavg()[0]
        out = forked(child, args, str(dataset), str(work), threads)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    return out | {"busy_process": busy, "load_average_at_start": load}


def main() -> None:
    from benchmarks import coordinator_scale

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--preset", default="tiny", help="router preset")
    p.add_argument("--n", type=int, default=8000, help="samples of the synthetic dataset")
    p.add_argument("--latent-side", type=int, default=16)
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--conditions", default="", help="what else ran on the machine (recorded with the result)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "coordinator_threads"))
    p.add_argument("--busy-warmup", type=float, default=10.0, help="seconds the busy process gets to start")
    args = p.parse_args()
    import hddm_flower.stages.router  # noqa: F401  (imported once; every run is forked from here)
    from hddm_flower.devices import available_cpus

    cpus = available_cpus()
    root = Path(tempfile.mkdtemp(prefix="coordinator-threads-"))
    gen = argparse.Namespace(latent_side=args.latent_side, tokens=args.tokens, shard_size=125, val_every=10)
    runs = []
    try:
        dataset = coordinator_scale.generate(root / "data", args.n, gen)
        for busy in (False, True):
            for threads in sorted({1, cpus}):
                r = run(args, dataset, root / f"work-{threads}-{busy}", threads, busy)
                runs.append(r)
                print(json.dumps(r), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    by = {(r["threads"], r["busy_process"]): r for r in runs}
    result = {
        "runs": runs,
        "available_cpus": cpus,
        "busy_slowdown": {str(t): round(by[(t, True)]["seconds"] / by[(t, False)]["seconds"], 2) for t in {1, cpus}},
        "command": "python -m benchmarks.coordinator_threads " + " ".join(sys.argv[1:]),
        "machine": f"{machine()}, Python {platform.python_version()}",
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "conditions": (args.conditions + "; " if args.conditions else "")
        + "1-minute load average "
        + ", ".join(f"{r['load_average_at_start']:.1f}" for r in runs)
        + " at the runs' starts",
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
    }
    out = Path(args.out)
    write_result(out.with_suffix(".json"), result)
    lines = [
        "# The coordinator's threads beside a busy process: router training",
        "",
        f"`{result['command']}` on {result['machine']}, commit {result['commit']}, {result['date']}; "
        f"{result['conditions']}",
        "",
        "| coordinator threads | beside a busy process | wall (s) | CPU (s) |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r['threads']} | {'yes' if r['busy_process'] else 'no'} | {r['seconds']:.1f} | {r['cpu_seconds']:.1f} |"
        for r in runs
    ]
    lines += ["", f"{args.steps} steps of the `{args.preset}` router at batch {args.batch_size}, "
              f"{args.latent_side}² latents; the busy process: one thread of 512² matrix products."]  # fmt: skip
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
