"""Sample quality of finished runs measured with one yardstick: the default against faster candidates.

Each run's report measures FID and prompt adherence with the run's own feature classifier, retrained in every run,
on 64 samples: two runs' reports do not compare. Here every run is measured with **one shared feature classifier**
(trained once, with ``--feature-steps`` steps, saved in ``OUT_feature_net/``) on the **same prompts and noise**:

* top-2 evaluation protocol per seed (``--prompts`` held-out captions × ``--samples`` samples, the config's
  evaluation Euler steps): FID and KID against the whole dataset, and adherence (the fraction of samples the
  shared classifier puts in the cluster of the prompt's image);
* the run's sample grid per seed (``sampling.prompts`` × ``sampling.samples_per_prompt``, ``sampling.num_steps``,
  what samples.png shows): adherence per row.

Seeds pair the runs (a seed fixes the prompts and the noise for every run), so each candidate's difference from
the ``--baseline`` run is a per-seed difference with a Student-t 95 % interval. ``--cfg`` evaluates each run at
other CFG scales (the run's own scale if not given); ``NAME=RUN_DIR@SCALE`` one run at one scale. No training of
experts or routers: the runs' own.

    python -m benchmarks.first_ten_minutes --runs default=RUN_A fast=RUN_B --baseline default --seeds 5

Writes ``benchmarks/results/first_ten_minutes.json`` and ``.md`` with the command, machine, load and date.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import ROOT, machine, write_result
from hddm_flower.config.io import load_config
from hddm_flower.devices import resolve_device
from hddm_flower.evaluation.adherence import classify, prompt_adherence, prompt_clusters
from hddm_flower.evaluation.evaluate import evaluate_run, feature_network
from hddm_flower.evaluation.metrics import FeatureClassifier
from hddm_flower.evaluation.report import save_grid
from hddm_flower.gmm.truth import interval
from hddm_flower.hddm_pipeline import load_pipeline, sample_images
from hddm_flower.rundir import CONFIG, REPORT_JSON
from hddm_flower.stages.assemble import load_ensemble
from hddm_flower.stages.prepare import prepare_data

OUT = ROOT / "benchmarks" / "results" / "first_ten_minutes"
METRICS = ("fid", "kid", "adherence", "adherence_rows")


def measure(
    run_dir: Path, feature_dir: Path, args, scale: float | None, sampling: dict | None = None, grid: Path | None = None
) -> dict:
    """Per-seed metrics of one run at one CFG scale, with the shared feature classifier; kept in
    ``OUT_points/`` and reused by a later call with the same run and protocol (separate calls can measure runs
    in parallel, and a last call with all of them writes the comparison). ``sampling``: keys of the run's
    ``sampling`` section to override (``clean_estimate``, ``handover_t``, …), in the evaluation ensemble and in
    the sample grid alike; ``grid``: where to save the first seed's sample grid (PNG)."""
    sampling = sampling or {}
    key = {"run_dir": str(run_dir), "cfg": scale, "seeds": args.seeds, "prompts": args.prompts}
    key |= {"samples": args.samples, "feature_steps": args.feature_steps, "sampling": sampling}
    tag = "".join(f"-{k}={v}" for k, v in sorted(sampling.items()))
    kept = args.out.parent / (args.out.name + "_points") / f"{run_dir.parent.name}-{run_dir.name}-cfg{scale}{tag}.json"
    if kept.is_file() and json.loads(kept.read_text())["key"] == key and (grid is None or grid.is_file()):
        return json.loads(kept.read_text())["point"]
    point = _measure(run_dir, feature_dir, args, scale, sampling, grid)
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text(json.dumps({"key": key, "point": point}, indent=2))
    return point


def _measure(run_dir: Path, feature_dir: Path, args, scale: float | None, sampling: dict, grid: Path | None) -> dict:
    cfg = load_config(run_dir / CONFIG)
    s, ev = cfg.sampling, cfg.evaluation
    scale = s.cfg_scale if scale is None else scale
    c = dataclasses.replace(
        cfg,
        sampling=dataclasses.replace(s, cfg_scale=scale, **sampling),
        evaluation=dataclasses.replace(
            ev, num_prompts=args.prompts, samples_per_prompt=args.samples, feature_steps=args.feature_steps, seed=0
        ),
    )
    dataset = prepare_data(c, args.cache_dir)
    pipe = load_pipeline(run_dir).to(resolve_device(c.coordinator.device))  # where the ensemble and decoding run
    _, classifier, _ = feature_network(c, dataset, feature_dir, decode=pipe.pixels, progress=True)
    ensemble, _ = load_ensemble(c, run_dir)
    pipe.register_to_config(sampling=dict(pipe.config.sampling) | sampling)  # what pipe.ensemble() reads
    clusters = prompt_clusters(dataset, s.prompts)
    per_seed = {m: [] for m in METRICS}
    rows = []
    for seed in range(args.seeds):
        with tempfile.TemporaryDirectory() as tmp:
            top2 = evaluate_run(
                c,
                ensemble,
                dataset,
                Path(tmp),
                decode=pipe.pixels,
                feature_dir=feature_dir,
                modes=["top2"],
                per_expert=False,
                seed=seed,
            )["modes"]["top2"]
        images = sample_images(
            pipe,
            s.prompts,
            samples_per_prompt=s.samples_per_prompt,
            seed=s.seed + seed,
            num_inference_steps=s.num_steps,
            guidance_scale=scale,
        )
        if grid is not None and seed == 0:
            grid.parent.mkdir(parents=True, exist_ok=True)
            save_grid(images, len(s.prompts), grid)
        a = prompt_adherence(classifier, images, clusters, s.samples_per_prompt)
        for m, v in (("fid", top2["fid"]), ("kid", top2["kid"]), ("adherence", top2["adherence"])):
            per_seed[m].append(v)
        per_seed["adherence_rows"].append(a["mean"])
        rows.append(a["per_prompt"])
        print(f"{run_dir.name} cfg {scale:g} seed {seed}: " + " ".join(f"{m} {v[-1]:.4f}" for m, v in per_seed.items()))
    report = json.loads((run_dir / REPORT_JSON).read_text())
    return {
        "run_dir": str(run_dir),
        "cfg_scale": scale,
        "sampling": sampling,
        "expert_steps": cfg.expert.steps,
        "per_seed": per_seed,
        "rows_per_prompt": [sum(r[i] for r in rows) / len(rows) for i in range(len(s.prompts))],
        "summary": {m: interval(v) for m, v in per_seed.items()},
        "ensemble_velocity_mse": report["metrics"]["ensemble_velocity_mse"],
        "times": report["metrics"]["times"],
    }


def held_out_accuracy(feature_dir: Path, runs: dict, args) -> float:
    """The shared classifier's accuracy on the dataset's validation split (the ceiling of adherence)."""
    cfg = load_config(Path(next(iter(runs.values()))) / CONFIG)
    val = prepare_data(cfg, args.cache_dir).split(None, "val")
    net = FeatureClassifier.from_pretrained(feature_dir, low_cpu_mem_usage=False).eval()
    return float((classify(net, val.images) == val.labels).double().mean())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--runs", nargs="+", required=True, help="NAME=RUN_DIR of finished runs; NAME=RUN_DIR@SCALE: at this CFG scale"
    )
    p.add_argument("--baseline", required=True, help="the NAME every other run is compared with")
    p.add_argument("--cfg", type=float, nargs="*", default=[], help="CFG scales of runs without @ (default: their own)")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--prompts", type=int, default=32, help="held-out prompts per seed")
    p.add_argument("--samples", type=int, default=4, help="samples per held-out prompt")
    p.add_argument("--feature-steps", type=int, default=1200, help="steps of the shared feature classifier")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--out", type=Path, default=OUT, help="results path without suffix")
    args = p.parse_args()
    runs, scales = {}, {}
    for spec in args.runs:
        name, _, where = spec.partition("=")
        d, at, scale = where.rpartition("@") if "@" in where else (where, "", "")
        runs[name] = d
        try:
            scales[name] = [float(scale)] if at else (args.cfg or [None])
        except ValueError:
            sys.exit(f"{spec}: {scale!r} after @ is not a CFG scale")
        if not (Path(d) / REPORT_JSON).is_file():
            sys.exit(f"{name}={d}: not a finished run (no {REPORT_JSON})")
    if args.baseline not in runs:
        sys.exit(f"--baseline {args.baseline!r} is none of the runs {sorted(runs)}")
    torch.set_num_threads(1)
    feature_dir = args.out.parent / (args.out.name + "_feature_net")
    load0, start = os.getloadavg(), time.time()
    points = {
        f"{name} @ cfg {scale:g}" if scale is not None else name: measure(Path(d).resolve(), feature_dir, args, scale)
        | {"name": name}
        for name, d in runs.items()
        for scale in scales[name]
    }
    base = {p["cfg_scale"]: p for p in points.values() if p["name"] == args.baseline}
    for pt in points.values():
        ref = base.get(pt["cfg_scale"]) or next(iter(base.values()))
        if pt is ref:
            continue
        pt["minus_baseline"] = {
            m: interval([a - b for a, b in zip(pt["per_seed"][m], ref["per_seed"][m])]) for m in METRICS
        } | {"baseline": f"{args.baseline} @ cfg {ref['cfg_scale']:g}"}
    info = json.loads((feature_dir / "hddm_feature_net.json").read_text())
    record = {
        "command": "python -m benchmarks.first_ten_minutes " + " ".join(sys.argv[1:]),
        "feature_network": f"hddm feature classifier 64-d, {args.feature_steps} steps, shared by every run "
        f"({info['trained_on']}; accuracy {info['train_accuracy']:.3f} on its last training batches, "
        f"{held_out_accuracy(feature_dir, runs, args):.3f} on the validation split)",
        "protocol": f"{args.seeds} seeds; per seed {args.prompts} held-out prompts × {args.samples} samples (top-2, "
        "the config's evaluation steps) and the sample grid (sampling.prompts × sampling.samples_per_prompt)",
        "machine": f"{machine()}, torch {torch.__version__}, one torch thread",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(start)),
        "load_average": [round(load0[0], 1), round(os.getloadavg()[0], 1)],
        "wall_seconds": round(time.time() - start),
        "points": points,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_result(args.out.with_suffix(".json"), record)
    args.out.with_suffix(".md").write_text(markdown(record))
    print(markdown(record))


def _iv(x: dict, spec: str) -> str:
    return f"{x['mean']:{spec}} ± {x['half']:{spec.lstrip('+')}}"


def markdown(r: dict) -> str:
    lines = [
        "# Sample quality with one yardstick: the default against faster candidates",
        "",
        f"`{r['command']}` — {r['machine']}; {r['date']}, load average {r['load_average'][0]}–"
        f"{r['load_average'][1]}; {r['wall_seconds']} s. Features and adherence: {r['feature_network']}. "
        f"Protocol: {r['protocol']}. Cells: mean over seeds ± half-width of the 95 % Student-t interval.",
        "",
        "| run | expert steps | CFG | FID ↓ | KID ↓ | adherence, held-out prompts ↑ | adherence, grid rows ↑ "
        "| held-out velocity MSE (report) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, p in r["points"].items():
        s = p["summary"]
        mse = " / ".join(f"{v:.3f}" for v in p["ensemble_velocity_mse"] if v is not None)
        lines.append(
            f"| {key} | {p['expert_steps']} | {p['cfg_scale']:g} | {_iv(s['fid'], '.2f')} | {_iv(s['kid'], '.2f')} "
            f"| {_iv(s['adherence'], '.3f')} | {_iv(s['adherence_rows'], '.3f')} | {mse} |"
        )
    diffs = [(k, p["minus_baseline"]) for k, p in r["points"].items() if "minus_baseline" in p]
    if diffs:
        lines += [
            "",
            "Paired by seed, run − baseline (an interval that excludes 0 is a resolved difference):",
            "",
            "| run − baseline | FID | KID | adherence, held-out prompts | adherence, grid rows |",
            "|---|---|---|---|---|",
        ]
        for key, d in diffs:
            lines.append(
                f"| {key} − {d['baseline']} | {_iv(d['fid'], '+.2f')} | {_iv(d['kid'], '+.2f')} "
                f"| {_iv(d['adherence'], '+.3f')} | {_iv(d['adherence_rows'], '+.3f')} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
