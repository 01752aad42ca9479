"""The paper's comparison with independent trainings in the intervals: 8FM, 2DDPM:6FM (``auto`` and random DDPM
pairs) and 4DDPM:4FM at equal budget on ``configs/reproduce-gmm.yaml``, top-2 with each training's own router,
scored against the exact density; the DDPM mixes also under the remedies (``sampling.clean_estimate: shrink``,
``sampling.handover_t``).

    python -m benchmarks.hetero_trainings [--trainings 3] [--pairs 8] [--per-prompt 16] [--jobs 2] [--out DIR]

Training i (:func:`hddm_flower.training_seeds.training_config`) trains every expert it needs (FM and DDPM on every
cluster) and its router with seeds moved by i; every configuration of training i shares those experts and that
router. Each row is sampled on the same ``evaluation.seeds`` sampling seeds in every training. Intervals: over
trainings (outer, Student-t on the per-training means) with the mean half-width over sampling seeds within one
training beside it (inner); differences to 8FM paired by training and seed.

Writes ``benchmarks/results/hetero_trainings.{json,md}`` with the command, machine, load and date.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

import torch

from hddm_flower.checkpoints import ROUTER_META
from hddm_flower.config.io import config_from_dict, load_config
from hddm_flower.data import Dataset
from hddm_flower.gmm.evaluate import Row, evaluate_group
from hddm_flower.reproduce.training import (
    NotTrained,
    config_for,
    dataset_id,
    fingerprint_of,
    run_jobs,
    train_job,
    train_or_reuse,
)
from hddm_flower.rundir import ROUTER
from hddm_flower.stages.prepare import prepare_data
from hddm_flower.stages.router import fit_router
from hddm_flower.training_seeds import nested_interval, paired, training_config

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
METRICS = ("delta_log_density", "cluster_adherence", "mmd2", "mode_tv")
REMEDIES = {
    "shrink": {"clean_estimate": "shrink"},
    "handover 0.8": {"handover_t": 0.8},
    "shrink + handover 0.8": {"clean_estimate": "shrink", "handover_t": 0.8},
}


def _configs(cfg, details: list[float], pairs: int, pool: str) -> dict[str, list[str]]:
    """8FM, 2DDPM:6FM auto, ``pairs`` random other DDPM pairs (drawn from every cluster, or with ``pool="auto4"``
    from the four clusters 4DDPM:4FM gives DDPM, whose DDPM experts are trained anyway), 4DDPM:4FM auto."""
    K = cfg.num_experts
    auto2 = config_for(cfg, 2).objective_of(details)
    auto4 = config_for(cfg, K // 2).objective_of(details)
    auto_pair = tuple(k for k, o in enumerate(auto2) if o == "ddpm")
    clusters = [k for k, o in enumerate(auto4) if o == "ddpm"] if pool == "auto4" else range(K)
    others = [p for p in itertools.combinations(clusters, 2) if p != auto_pair]
    chosen = sorted(random.Random(0).sample(others, min(pairs, len(others))))
    out = {f"{K}FM": ["fm"] * K, f"2DDPM:{K - 2}FM auto {list(auto_pair)}": auto2}
    for p in chosen:
        out[f"2DDPM:{K - 2}FM {list(p)}"] = ["ddpm" if k in p else "fm" for k in range(K)]
    ddpm4 = [k for k, o in enumerate(auto4) if o == "ddpm"]
    out[f"{K // 2}DDPM:{K // 2}FM auto {ddpm4}"] = auto4
    return out


def _train(cfg, dataset: Dataset, out: Path, needed: set[tuple[int, str]], jobs: int) -> list[str]:
    data_id = dataset_id(dataset)
    fp = fingerprint_of(cfg.expert, cfg.ddpm, data_id)
    pending = []
    for k, o in sorted(needed):
        folder = out / "experts" / f"cluster-{k}-{o}"
        try:
            train_or_reuse(folder, fp, None)
        except NotTrained:
            pending.append((k, o, folder))
    args = [(cfg.to_dict(), str(dataset.root), k, o, str(f), fp, jobs > 1, False) for k, o, f in pending]
    run_jobs(train_job, args, jobs, False, "training")
    fp_router = fingerprint_of(cfg.router, data_id)
    router_meta = out / ROUTER / ROUTER_META
    if not router_meta.exists() or json.loads(router_meta.read_text()).get("reproduce_fingerprint") != fp_router:
        fit_router(cfg, dataset, out)
        router_meta.write_text(
            json.dumps(json.loads(router_meta.read_text()) | {"reproduce_fingerprint": fp_router}, indent=2)
        )
        pending.append(("router", "", None))
    return [f"cluster-{k}-{o}" if o else k for k, o, _ in pending]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / ".cache" / "hetero_trainings"))
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--trainings", type=int, default=3)
    p.add_argument("--pairs", type=int, default=8, help="random DDPM pairs besides auto")
    p.add_argument("--pair-pool", choices=("all", "auto4"), default="all", help="clusters the pairs are drawn from")
    p.add_argument("--per-prompt", type=int, default=16, help="samples per caption and seed (32 captions)")
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(1 if args.jobs > 1 else 2)
    load0, start = os.getloadavg(), time.time()
    base = load_config(ROOT / "configs" / "reproduce-gmm.yaml")
    base.evaluation.samples_per_prompt = args.per_prompt
    base.evaluation.training_seeds = args.trainings
    dataset = prepare_data(base, args.cache_dir)
    details = [c["detail"] for c in dataset.meta["clusters"]]
    configs = _configs(base, details, args.pairs, args.pair_pool)
    needed = {(k, o) for objs in configs.values() for k, o in enumerate(objs)}
    arms = [(name, "clamp", {}) for name in configs]
    arms += [(name, r, o) for name in configs if "auto" in name and "DDPM" in name for r, o in REMEDIES.items()]
    trained, timings = {}, {"training": 0.0, "evaluation": 0.0}
    values: dict[str, dict[str, list[list[float]]]] = {}
    for i in range(args.trainings):
        cfg = training_config(base, i)
        out = Path(args.out) / f"training-{i}"
        t0 = time.time()
        trained[i] = _train(cfg, dataset, out, needed, args.jobs)
        timings["training"] += time.time() - t0
        t0 = time.time()
        jobs = []
        for name, remedy, overrides in arms:
            c = config_from_dict(
                cfg.to_dict() | {"sampling": dataclasses.asdict(cfg.sampling) | overrides}, "hetero_trainings"
            )
            row = Row(f"{name} · {remedy}", f"{name} · {remedy}", "top2")
            jobs.append((c.to_dict(), str(out), str(dataset.root), [row], configs[name], args.jobs > 1))
        for part in run_jobs(evaluate_group, jobs, args.jobs, False, f"training {i}"):
            for row_name, r in part.items():
                for m in METRICS:
                    values.setdefault(row_name, {}).setdefault(m, []).append([s[m] for s in r["per_seed"]])
        timings["evaluation"] += time.time() - t0
    homo = next(iter(values))
    summary = {
        name: {
            m: nested_interval(v)
            | ({"minus_homo": nested_interval(paired(v, values[homo][m]))} if name != homo else {})
            for m, v in per.items()
        }
        for name, per in values.items()
    }
    random_rows = [n for n in values if "auto" not in n and "2DDPM" in n and n.endswith("· clamp")]
    pooled = {}
    for m in METRICS:  # the mean over the random pairs, per training and seed
        v = [[sum(values[n][m][i][j] for n in random_rows) / len(random_rows) for j in range(len(values[homo][m][i]))]
             for i in range(args.trainings)]  # fmt: skip
        pooled[m] = nested_interval(v) | {"minus_homo": nested_interval(paired(v, values[homo][m]))}
    out = {
        "command": "python -m benchmarks.hetero_trainings " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {args.jobs} processes, "
        "shared with other processes (load below)",
        "load_average": {"start": load0, "end": os.getloadavg()},
        "seconds": round(time.time() - start, 1),
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "trained": trained,
        "config": "configs/reproduce-gmm.yaml",
        "trainings": args.trainings,
        "sampling_seeds": base.evaluation.seeds,
        "samples_per_seed": 32 * args.per_prompt,
        "configs": configs,
        "pair_pool": args.pair_pool,
        "values": values,
        "summary": summary,
        "random_pairs_pooled": pooled,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "hetero_trainings.json").write_text(json.dumps(out, indent=1))
    c = lambda x, s=1, f=".1f": f"{x['mean'] * s:{f}} ± {x['half'] * s:{f}}"  # noqa: E731
    lines = [
        f"`{out['command']}` on {out['date']}, {out['machine']}, {out['seconds']} s (load {load0[0]:.1f} at start); "
        f"{args.trainings} independent trainings of experts and router × {base.evaluation.seeds} sampling seeds × "
        f"{32 * args.per_prompt} samples, top-2, trained router. ± = 95 % Student-t over trainings (outer); "
        "[inner] = mean half-width over sampling seeds within one training; differences paired by training and seed.",
        "",
        "| configuration · conversion | Δlog p [inner] | − 8FM (paired) | cluster adherence [inner] | − 8FM | MMD² ×10³ |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in list(summary.items()) + [("random pairs pooled (mean of the pairs) · clamp", pooled)]:
        d, a = s["delta_log_density"], s["cluster_adherence"]
        dd = c(d["minus_homo"]) if "minus_homo" in d else "–"
        da = c(a["minus_homo"], 1, ".3f") if "minus_homo" in a else "–"
        lines.append(
            f"| {name} | {c(d)} [{d['inner_half']:.1f}] | {dd} | {c(a, 1, '.3f')} [{a['inner_half']:.3f}] | {da} "
            f"| {c(s['mmd2'], 1e3, '.2f')} |"
        )
    (RESULTS / "hetero_trainings.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
