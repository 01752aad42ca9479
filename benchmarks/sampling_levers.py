"""Sampling levers of a finished run, measured: CFG scale and Euler steps against prompt adherence and FID.

For each (CFG scale, steps) the run's ensemble samples (a) the evaluation protocol of its config in top-2 routing
(held-out prompts × samples, same noise for every point) for FID/KID with the run's feature network and the
adherence of those samples, and (b) the run's own sample grid (``sampling.prompts``) for adherence per row. No
training: the experts, router and feature network are the run's.

    python -m benchmarks.sampling_levers RUN_DIR [--cfg 3 5 7.5 10] [--steps 25 50]

Writes ``benchmarks/results/sampling_levers.json`` and ``.md`` with the command, machine, load and date.
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
from hddm_flower.evaluation.adherence import prompt_adherence, prompt_clusters
from hddm_flower.evaluation.evaluate import evaluate_run
from hddm_flower.evaluation.metrics import FeatureClassifier
from hddm_flower.hddm_pipeline import load_pipeline, sample_images
from hddm_flower.rundir import CONFIG, FEATURE_NET
from hddm_flower.stages.assemble import load_ensemble
from hddm_flower.stages.prepare import prepare_data

OUT = ROOT / "benchmarks" / "results" / "sampling_levers"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--cfg", type=float, nargs="+", default=[3.0, 5.0, 7.5, 10.0])
    p.add_argument("--steps", type=int, nargs="+", default=[25, 50])
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--out", type=Path, default=OUT, help="results path without suffix")
    args = p.parse_args()
    run_dir = args.run_dir.resolve()
    if not (run_dir / CONFIG).is_file() or not (run_dir / FEATURE_NET).is_dir():
        sys.exit(f"{run_dir} is not a finished run (no {CONFIG} or {FEATURE_NET}/)")
    torch.set_num_threads(1)
    cfg = load_config(run_dir / CONFIG)
    dataset = prepare_data(cfg, args.cache_dir)
    classifier = FeatureClassifier.from_pretrained(run_dir / FEATURE_NET, low_cpu_mem_usage=False).eval()
    s = cfg.sampling
    clusters = prompt_clusters(dataset, s.prompts)
    pipe = load_pipeline(run_dir).to(resolve_device(cfg.coordinator.device))  # where the ensemble and decoding run
    load0, start, points = os.getloadavg(), time.time(), []
    for steps in args.steps:
        for scale in args.cfg:
            c = dataclasses.replace(
                cfg,
                sampling=dataclasses.replace(s, cfg_scale=scale, num_steps=steps),
                evaluation=dataclasses.replace(cfg.evaluation, num_steps=steps),
            )
            ensemble, _ = load_ensemble(c, run_dir)
            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory() as tmp:
                ev = evaluate_run(
                    c,
                    ensemble,
                    dataset,
                    Path(tmp),
                    decode=pipe.pixels,
                    feature_dir=run_dir / FEATURE_NET,
                    modes=["top2"],
                    per_expert=False,
                )
            top2 = ev["modes"]["top2"]
            images = sample_images(
                pipe,
                s.prompts,
                samples_per_prompt=s.samples_per_prompt,
                seed=s.seed,
                num_inference_steps=steps,
                guidance_scale=scale,
            )
            rows = prompt_adherence(classifier, images, clusters, s.samples_per_prompt)
            points.append(
                {
                    "cfg_scale": scale,
                    "num_steps": steps,
                    "fid_top2": top2["fid"],
                    "kid_top2": top2["kid"],
                    "adherence_top2": top2["adherence"],
                    "adherence_rows": rows["per_prompt"],
                    "adherence_rows_mean": rows["mean"],
                    "seconds": time.perf_counter() - t0,
                }
            )
            print(json.dumps(points[-1]), flush=True)
    record = {
        "command": "python -m benchmarks.sampling_levers " + " ".join(sys.argv[1:]),
        "run_dir": str(run_dir),
        "feature_network": ev["feature_network"],
        "adherence_classifier": ev["adherence_classifier"],
        "protocol": ev["protocol"],
        "prompts": s.prompts,
        "machine": f"{machine()}, torch {torch.__version__}, one torch thread",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(start)),
        "load_average": [round(load0[0], 1), round(os.getloadavg()[0], 1)],
        "wall_seconds": time.time() - start,
        "points": points,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_result(args.out.with_suffix(".json"), record)
    args.out.with_suffix(".md").write_text(_markdown(record))


def _markdown(r: dict) -> str:
    lines = [
        "# Sampling levers of one run: CFG scale and Euler steps",
        "",
        f"`{r['command']}` — {r['machine']}; {r['date']}, load average {r['load_average'][0]}–"
        f"{r['load_average'][1]}; FID features: {r['feature_network']}; adherence: {r['adherence_classifier']}.",
        "",
        "| CFG | steps | FID top-2 ↓ | adherence top-2 (held-out prompts) ↑ | adherence, sample rows ↑ | rows |",
        "|---|---|---|---|---|---|",
    ]
    for x in r["points"]:
        rows = " ".join("–" if a is None else f"{a:.2f}" for a in x["adherence_rows"])
        lines.append(
            f"| {x['cfg_scale']:g} | {x['num_steps']} | {x['fid_top2']:.2f} | {x['adherence_top2']:.3f} "
            f"| {x['adherence_rows_mean']:.3f} | {rows} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
