"""The demo's open choices measured over independent trainings on the embedded data: the DDPM experts' clean
estimate (``sampling.clean_estimate``, ``sampling.handover_t``) and the router's input (``router.conditioning``).

    python -m benchmarks.embedded_trainings [--trainings 3] [--seeds 3] [--jobs 2] [--out DIR]

Training i of ``configs/default.yaml`` (:func:`hddm_flower.training_seeds.training_config`: expert and router seeds
moved by i) trains the 8 experts (2 DDPM : 6 FM) once and two routers on them, the paper's (``conditioning:
none``) and the prompt-aware one (``text``); each run is finished as ``flwr run .`` finishes it (router, evaluation,
report, samples.png). Every arm, a router and a set of sampling overrides, is then measured on its training's run
with the protocol of :mod:`benchmarks.first_ten_minutes`: **one shared feature classifier** (trained once), the same
held-out prompts and noise per sampling seed, FID/KID and adherence of the top-2 evaluation samples, adherence of
the sample grid. Intervals: Student-t over trainings (outer) beside the mean half-width over sampling seeds within
one training (inner); differences to the first arm (today's default) paired by training and seed. The first seed's
sample grid of every arm of training 0 is saved beside the results.

Writes ``benchmarks/results/embedded_trainings.{json,md}`` (and ``embedded_trainings/``: grids) with the command,
machine, load and date.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch
import yaml

from benchmarks import first_ten_minutes
from benchmarks.common import RESULTS, ROOT, machine, write_result
from hddm_flower.config.io import config_from_dict, load_config
from hddm_flower.data import Dataset
from hddm_flower.evaluation.evaluate import feature_network
from hddm_flower.reproduce.run import relative_symlink
from hddm_flower.reproduce.training import dataset_id, fingerprint_of, run_jobs, train_job
from hddm_flower.rundir import CONFIG, EXPERTS, expert_dir, experts_dir
from hddm_flower.stages.assemble import evaluate_and_report
from hddm_flower.stages.prepare import assign_objectives, prepare_data
from hddm_flower.stages.router import fit_router
from hddm_flower.training_seeds import nested_interval, paired, training_config

NAME = "embedded_trainings"
METRICS = first_ten_minutes.METRICS
_iv = first_ten_minutes._iv  # mean ± half-width, one format for both benchmarks
SHRINK_HANDOVER = {"clean_estimate": "shrink", "handover_t": 0.8}
ARMS = {  # name: (router conditioning, sampling overrides); the first is the baseline
    "none · clamp": ("none", {}),
    "none · shrink": ("none", {"clean_estimate": "shrink"}),
    "none · handover 0.8": ("none", {"handover_t": 0.8}),
    "none · shrink + handover 0.8": ("none", SHRINK_HANDOVER),
    "text · clamp": ("text", {}),
    "text · shrink + handover 0.8": ("text", SHRINK_HANDOVER),
}


def _train(
    cfg, dataset: Dataset, out: Path, feature_dir: Path, feature_steps: int, conditionings: set[str], jobs: int
) -> dict[str, Path]:
    """The experts of training ``cfg`` (trained once, reused by fingerprint) and one finished run per router
    (router, evaluation, report and samples.png as at the end of ``flwr run .``, scored with the shared feature
    classifier instead of one trained per run)."""
    objectives = assign_objectives(cfg, dataset)
    fp = fingerprint_of(cfg.expert, cfg.ddpm, dataset_id(dataset))
    folders = {k: out / EXPERTS / f"cluster-{k}-{o}" for k, o in enumerate(objectives)}
    args = [
        (cfg.to_dict(), str(dataset.root), k, o, str(folders[k]), fp, jobs > 1, False) for k, o in enumerate(objectives)
    ]
    run_jobs(train_job, args, jobs, False, "training")  # train_or_reuse: a folder with this fingerprint is kept
    runs = {}
    for conditioning in sorted(conditionings):
        run_dir = out / f"router-{conditioning}"
        d = cfg.to_dict()
        d["router"]["conditioning"] = conditioning
        d["evaluation"]["feature_steps"] = feature_steps  # the shared classifier's (it is checked on load)
        c = config_from_dict(d, NAME)
        if not (run_dir / "report.json").is_file():
            if run_dir.exists():
                shutil.rmtree(run_dir)
            experts_dir(run_dir).mkdir(parents=True)
            for k, folder in folders.items():
                relative_symlink(expert_dir(run_dir, k), folder)
            (run_dir / CONFIG).write_text(yaml.safe_dump(c.to_dict(), sort_keys=False))
            torch.set_num_threads(jobs)
            router = fit_router(c, dataset, run_dir)
            evaluate_and_report(c, run_dir, dataset, [], router=router, feature_dir=feature_dir)
        runs[conditioning] = run_dir
    return runs


def _measure_job(a: tuple) -> dict:
    run_dir, feature_dir, args, sampling, grid = a
    torch.set_num_threads(1)
    return first_ten_minutes.measure(Path(run_dir), Path(feature_dir), args, None, sampling, grid)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "default.yaml")
    p.add_argument("--trainings", type=int, default=3)
    p.add_argument("--seeds", type=int, default=3, help="sampling seeds per training")
    p.add_argument("--prompts", type=int, default=32, help="held-out prompts per seed")
    p.add_argument("--samples", type=int, default=4, help="samples per held-out prompt")
    p.add_argument("--feature-steps", type=int, default=1200, help="steps of the shared feature classifier")
    p.add_argument("--arms", nargs="*", default=list(ARMS), help=f"a subset of {list(ARMS)}")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--out", type=Path, default=ROOT / ".cache" / NAME, help="trainings and runs (reused)")
    args = p.parse_args()
    bad = [a for a in args.arms if a not in ARMS]
    if bad:
        sys.exit(f"--arms: {bad[0]!r} is none of {list(ARMS)}")
    load0, start = os.getloadavg(), time.time()
    base = load_config(args.config)
    dataset = prepare_data(base, args.cache_dir)
    args.out.mkdir(parents=True, exist_ok=True)
    protocol = argparse.Namespace(**vars(args) | {"out": args.out / "ftm"})
    feature_dir = args.out / "ftm_feature_net"
    timings = {"training": 0.0, "measuring": 0.0}
    values: dict[str, dict[str, list[list[float]]]] = {a: {m: [] for m in METRICS} for a in args.arms}
    grids = RESULTS / NAME
    torch.set_num_threads(args.jobs)
    c = dataclasses.replace(base, evaluation=dataclasses.replace(base.evaluation, feature_steps=args.feature_steps))
    feature_network(
        c, dataset, feature_dir, decode=dataset.decoder(c)
    )  # trained once, before the runs and the measuring processes share it
    conditionings = {ARMS[a][0] for a in args.arms}  # only the routers the chosen arms use
    for i in range(args.trainings):
        t0 = time.time()
        runs = _train(
            training_config(base, i),
            dataset,
            args.out / f"training-{i}",
            feature_dir,
            args.feature_steps,
            conditionings,
            args.jobs,
        )
        timings["training"] += time.time() - t0
        t0 = time.time()
        jobs = [
            (
                str(runs[ARMS[a][0]]),
                str(feature_dir),
                protocol,
                ARMS[a][1],
                grids / f"{_slug(a)}.png" if i == 0 else None,
            )
            for a in args.arms
        ]
        for a, point in zip(args.arms, run_jobs(_measure_job, jobs, args.jobs, False, f"training {i}")):
            for m in METRICS:
                values[a][m].append(point["per_seed"][m])
        timings["measuring"] += time.time() - t0
    baseline = args.arms[0]
    summary = {
        a: {
            m: nested_interval(v) | ({"minus_baseline": nested_interval(paired(v, values[baseline][m]))} if a != baseline else {})
            for m, v in per.items()
        }
        for a, per in values.items()
    }  # fmt: skip
    info = json.loads((feature_dir / "hddm_feature_net.json").read_text())
    record = {
        "command": "python -m benchmarks.embedded_trainings " + " ".join(sys.argv[1:]),
        "config": _shown(args.config),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(start)),
        "machine": f"{machine()}, torch {torch.__version__}, {args.jobs} processes",
        "load_average": {"start": [round(x, 2) for x in load0], "end": [round(x, 2) for x in os.getloadavg()]},
        "seconds": round(time.time() - start, 1),
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "feature_network": f"hddm feature classifier 64-d, {args.feature_steps} steps, shared by every arm "
        f"({info['trained_on']}; accuracy {info['train_accuracy']:.3f} on its last training batches)",
        "protocol": f"{args.trainings} trainings × {args.seeds} sampling seeds; per seed {args.prompts} held-out "
        f"prompts × {args.samples} samples (top-2, the config's evaluation steps) and the sample grid",
        "arms": {a: {"router_conditioning": ARMS[a][0], "sampling": ARMS[a][1]} for a in args.arms},
        "baseline": baseline,
        "values": values,
        "summary": summary,
    }
    write_result(RESULTS / f"{NAME}.json", record)
    (RESULTS / f"{NAME}.md").write_text(markdown(record))
    print(markdown(record))


def _slug(arm: str) -> str:
    """``none · shrink + handover 0.8`` → ``none-shrink-handover-0.8`` (a file name)."""
    return "-".join(w for w in arm.replace("·", " ").replace("+", " ").split())


def _shown(path: Path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def markdown(r: dict) -> str:
    lines = [
        f"`{r['command']}` on {r['date']}, {r['machine']}, {r['seconds']} s (load {r['load_average']['start'][0]} at "
        f"start, {r['load_average']['end'][0]} at the end); config `{r['config']}`. Features and adherence: "
        f"{r['feature_network']}. Protocol: {r['protocol']}. ± = 95 % Student-t over trainings (outer); [inner] = "
        "mean half-width over sampling seeds within one training; differences paired by training and seed.",
        "",
        "| router · clean estimate | FID ↓ [inner] | KID ↓ | adherence, held-out prompts ↑ [inner] "
        "| adherence, grid rows ↑ |",
        "|---|---|---|---|---|",
    ]
    for a, s in r["summary"].items():
        lines.append(
            f"| {a} | {_iv(s['fid'], '.2f')} [{s['fid']['inner_half']:.2f}] | {_iv(s['kid'], '.2f')} "
            f"| {_iv(s['adherence'], '.3f')} [{s['adherence']['inner_half']:.3f}] | {_iv(s['adherence_rows'], '.3f')} |"
        )
    lines += ["", f"Paired by training and seed, arm − {r['baseline']} (± over trainings; [inner]: mean half-width of "
              "the paired difference over sampling seeds within one training):", ""]  # fmt: skip
    lines += ["| arm − baseline | FID [inner] | KID [inner] | adherence, held-out prompts [inner] | adherence, grid rows [inner] |",
              "|---|---|---|---|---|"]  # fmt: skip
    for a, s in r["summary"].items():
        if "minus_baseline" not in s["fid"]:
            continue
        d = {m: s[m]["minus_baseline"] for m in METRICS}
        cell = lambda x, f: f"{_iv(x, f)} [{x['inner_half']:{f.lstrip('+')}}]"  # noqa: E731
        lines.append(
            f"| {a} | {cell(d['fid'], '+.2f')} | {cell(d['kid'], '+.2f')} | {cell(d['adherence'], '+.3f')} "
            f"| {cell(d['adherence_rows'], '+.3f')} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
