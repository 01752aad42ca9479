"""A cheap pilot for a capacity-limited Gaussian mixture: one training of a few FM experts and of the monolith
under the config's budget, at several budgets, and the excess loss over Bayes of each on the experts' own clusters.

    python -m benchmarks.gmm_capacity_pilot --config configs/reproduce-gmm-capacity.yaml \
        --set "expert.preset=nano" --steps 400 1600 --clusters 0 4 --label nano --work /tmp/pilot

For every budget S of ``--steps`` the config is loaded with ``expert.steps=S`` and ``--set``; FM experts for
``--clusters`` (the expert's own steps and batch under ``reproduce.budget``, :func:`hddm_flower.budget.expert_config`)
and the monolith (:func:`hddm_flower.reproduce.training.train_monolith`) are trained exactly as ``hddm reproduce``
trains them, with the seeds of one training (``--training i``, 0 unless given: the seeds
:func:`hddm_flower.training_seeds.training_config` gives training i of ``evaluation.training_seeds``), and scored by
:func:`benchmarks.gmm_ladder.excess_loss`. One training per call, so no interval: a pilot says where to look, and
its reruns with ``--training 1``, ``2`` give independent trainings. Appends one JSON record per budget to
``WORK/pilot.jsonl`` and prints it. ``--train-only experts`` and ``--train-only monolith`` in two processes train one
budget's networks on both cores; a call without it then reuses them and scores.
``--device cuda`` trains on a GPU (scoring stays on the CPU); on an H200 a `nano` expert's step is no faster than
one CPU core's, the monolith's about 3.5× (docs/performance.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import machine
from benchmarks.gmm_ladder import TIMES, excess_loss
from hddm_flower.budget import budget_of
from hddm_flower.budget import expert_config as budget_expert_config
from hddm_flower.checkpoints import META, save_expert
from hddm_flower.config.io import load_config, parse_overrides
from hddm_flower.gmm.dataset import load_reference
from hddm_flower.reproduce.training import train_monolith
from hddm_flower.stages.expert import train_one_expert
from hddm_flower.stages.prepare import prepare_data
from hddm_flower.training_seeds import training_config

SECONDS = "pilot_seconds.json"  # beside each network: its training time, read back when a later call reuses it


def train(cfg, dataset, root: Path, clusters: list[int], only: str | None = None, device: str = "cpu") -> dict:
    """Train (or reuse from ``root``) the FM experts of ``clusters`` and the monolith (``only``: just the
    ``experts`` or just the ``monolith``) on ``device``; returns each network's training seconds, the parameter
    count and what trained them (``trained_on``: the device and torch of each network)."""
    seconds, trained_on = {}, {}
    cfg = dataclasses.replace(cfg, coordinator=dataclasses.replace(cfg.coordinator, device=device))  # the monolith's
    jobs = [(f"experts/cluster-{k}-fm", k) for k in clusters] + [("monolith", None)]
    for name, k in jobs:
        if only and (only == "monolith") != (k is None):
            continue
        folder = root / name
        if not (folder / META).exists():
            t0 = time.perf_counter()
            if k is None:
                state, model_config, meta = train_monolith(cfg, dataset)
            else:
                state, model_config, meta = train_one_expert(budget_expert_config(cfg), dataset, k, "fm", device=device)
            save_expert(folder, state, model_config, meta)
            took = {
                "seconds": round(time.perf_counter() - t0, 1),
                "parameters": sum(v.numel() for v in state.values()),
                "device": torch.cuda.get_device_name(device) if device.startswith("cuda") else device,
                "torch": torch.__version__,
            }
            (folder / SECONDS).write_text(json.dumps(took))
        if (folder / SECONDS).exists():  # (networks of an older pilot have no record)
            took = json.loads((folder / SECONDS).read_text())
            seconds[name], seconds["parameters"] = took["seconds"], took["parameters"]
            trained_on[name] = f"{took.get('device', 'device not recorded')}, torch {took.get('torch', 'not recorded')}"
    return seconds | ({"trained_on": trained_on} if trained_on else {})


def pilot(cfg, dataset, root: Path, clusters: list[int], samples: int, device: str = "cpu") -> dict:
    """Train (or reuse from ``root``) the experts of ``clusters`` and the monolith; their excess losses."""
    seconds = train(cfg, dataset, root, clusters, device=device)
    ref = load_reference(dataset)
    per_cluster = excess_loss(cfg, ref, root, samples, seed=cfg.evaluation.seed)
    mean = {
        who: sum(sum(v[who]) / len(TIMES) for v in per_cluster.values()) / len(per_cluster)
        for who in ("expert", "monolith")
    }
    return {"per_cluster": per_cluster, "mean_over_t_and_clusters": mean, "train_seconds": seconds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True)
    p.add_argument("--set", default="", help='overrides, e.g. "expert.preset=nano data.gmm_rank=12"')
    p.add_argument("--steps", type=int, nargs="+", required=True, help="the budgets S (expert.steps)")
    p.add_argument("--clusters", type=int, nargs="+", default=[0])
    p.add_argument("--samples", type=int, default=256, help="x_t per cluster and t for the excess loss")
    p.add_argument("--label", required=True)
    p.add_argument("--work", required=True, help="where the pilot's networks and pilot.jsonl go")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--training",
        type=int,
        default=0,
        help="the independent training whose seeds train the networks (0: the config's own; i: its seeds moved as "
        "hddm reproduce moves training i's); i > 0 goes to WORK/LABEL/steps-S-training-i",
    )
    p.add_argument("--device", default="cpu", help="where the networks train (cpu, cuda, cuda:N); scoring is on cpu")
    p.add_argument(
        "--train-only",
        choices=("experts", "monolith"),
        help="train just these networks into WORK and stop (a later call without it reuses them and scores): the "
        "experts and the monolith of one budget in two processes",
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    work = Path(args.work)
    for steps in args.steps:
        start, load0 = time.time(), os.getloadavg()
        cfg = load_config(args.config, parse_overrides(args.set) | {"expert.steps": steps})
        dataset = prepare_data(cfg, args.cache_dir)
        cfg = training_config(cfg, args.training)
        root = work / args.label / (f"steps-{steps}" + (f"-training-{args.training}" if args.training else ""))
        if args.train_only:
            print(train(cfg, dataset, root, args.clusters, args.train_only, args.device), flush=True)
            continue
        result = pilot(cfg, dataset, root, args.clusters, args.samples, args.device)
        record = {
            "label": args.label,
            "command": "python -m benchmarks.gmm_capacity_pilot " + " ".join(sys.argv[1:]),
            "config": args.config,
            "set": args.set,
            "steps": steps,
            "training": args.training,
            "budget": dataclasses.asdict(budget_of(cfg)),
            "preset": cfg.expert.preset,
            "dataset": dataset.root.name,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": machine() + f", {args.threads} torch threads",
            "load_average": {"start": load0, "end": os.getloadavg()},
            "seconds": round(time.time() - start, 1),
        } | result
        with open(work / "pilot.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        m = result["mean_over_t_and_clusters"]
        print(
            f"{args.label} S={steps}: expert {m['expert']:.4f} monolith {m['monolith']:.4f} "
            f"monolith − expert {m['monolith'] - m['expert']:+.4f} ({record['seconds']} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
