"""What the prompt is worth to the router, where the answer is known: exact FM experts of ``configs/reproduce-gmm.yaml``
under top-2 routing with four routers: the exact text-free router p(k | x_t, t), the exact prompt-aware router
p(k | x_t, t, c), and the trained router with ``router.conditioning: none`` and ``text`` (each trained
``--trainings`` times with different seeds, central, the config's budget).

    python -m benchmarks.gmm_prompt_router [--samples-per-prompt 4] [--trainings 3]

Every row samples every component's caption from the same noise (aligned inference, the config's seeds) and is
scored against fresh true samples (:mod:`hddm_flower.gmm.evaluate`). A trained router's row is the mean over its
trainings with a Student-t 95 % interval across trainings. Writes ``benchmarks/results/gmm_prompt_router.json`` and
``.md`` with the command, machine, load and date.
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

from benchmarks.common import RESULTS, ROOT, machine
from hddm_flower.config.io import load_config
from hddm_flower.gmm.evaluate import Row, evaluate_group
from hddm_flower.gmm.truth import interval
from hddm_flower.stages.prepare import prepare_data
from hddm_flower.stages.router import fit_router

METRICS = ("cluster_adherence", "adherence", "mode_tv", "mmd2", "delta_log_density")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples-per-prompt", type=int, default=4)
    p.add_argument("--trainings", type=int, default=3, help="trainings (router seeds) of each trained router")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cache-dir", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(ROOT / "configs" / "reproduce-gmm.yaml")
    cfg.evaluation.samples_per_prompt = args.samples_per_prompt
    dataset = prepare_data(cfg, args.cache_dir)
    load0, start, rows = os.getloadavg(), time.time(), {}

    def run(row: Row, out: Path, c=cfg) -> dict:
        return evaluate_group((c.to_dict(), str(out), str(dataset.root), [row], None, False))[row.name]

    for router, name in (("exact", "exact router"), ("exact-text", "exact prompt-aware router")):
        r = run(Row(f"exact FM experts · {name} · top2", "exact", "top2", router, "exact-fm"), ROOT)
        rows[r["row"]["name"]] = {"trainings": 0, "metrics": r["metrics"], "seconds": r["sampling_seconds"]}
    for conditioning in ("none", "text"):
        name = f"exact FM experts · trained router ({conditioning}) · top2"
        per_training, train_s, sample_s, losses = [], 0.0, 0.0, []
        for i in range(args.trainings):
            c = dataclasses.replace(cfg, router=dataclasses.replace(cfg.router, conditioning=conditioning, seed=i))
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.time()
                fit_router(c, dataset, Path(tmp), device="cpu")
                train_s += time.time() - t0
                losses.append(json.loads((Path(tmp) / "router" / "hddm_router.json").read_text())["final_loss"])
                r = run(Row(name, "exact", "top2", "trained", "exact-fm"), Path(tmp), c)
            sample_s += r["sampling_seconds"]
            per_training.append({k: r["metrics"][k]["mean"] for k in METRICS})
        rows[name] = {
            "trainings": args.trainings,
            "metrics": {k: interval([m[k] for m in per_training]) for k in METRICS},
            "per_training": per_training,
            "final_loss": losses,
            "training_seconds": round(train_s, 1),
            "seconds": round(sample_s, 1),
        }
    out = {
        "command": "python -m benchmarks.gmm_prompt_router " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{machine()}, {args.threads} torch thread(s)",
        "load_average": {"start": load0, "end": os.getloadavg()},
        "seconds": round(time.time() - start, 1),
        "protocol": {
            "samples_per_seed": 32 * args.samples_per_prompt,
            "seeds": cfg.evaluation.seeds,
            "num_steps": cfg.evaluation.num_steps,
            "router": {
                "preset": cfg.router.preset,
                "steps": cfg.router.steps,
                "caption_dropout": cfg.router.caption_dropout,
            },
        },
        "rows": rows,
    }
    res = RESULTS
    (res / "gmm_prompt_router.json").write_text(json.dumps(out, indent=1))
    pr = out["protocol"]
    lines = [
        f"`{out['command']}` on {out['date']}, {out['machine']}, {out['seconds']} s, load average "
        f"{load0[0]:.1f} at the start, {out['load_average']['end'][0]:.1f} at the end (a shared machine).",
        "",
        f"Exact FM experts, top-2 routing, every component's caption × {args.samples_per_prompt} = "
        f"{pr['samples_per_seed']} samples per seed, {pr['seeds']} seeds, {pr['num_steps']} Euler steps. Exact rows: "
        f"mean ± 95 % half-width across seeds. Trained rows: router `{pr['router']['preset']}` × "
        f"{pr['router']['steps']} steps (caption dropout {pr['router']['caption_dropout']} for `text`), "
        f"{args.trainings} trainings (seeds 0…{args.trainings - 1}); mean ± 95 % half-width across trainings.",
        "",
        "| row | trainings | cluster adherence | adherence | mode TV | MMD² ×10³ |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        m = r["metrics"]
        c = lambda k, s=1, f=".3f": f"{m[k]['mean'] * s:{f}} ± {m[k]['half'] * s:{f}}"  # noqa: E731
        lines.append(
            f"| {name} | {r['trainings'] or '–'} | {c('cluster_adherence')} | {c('adherence')} | {c('mode_tv')} | "
            f"{c('mmd2', 1e3, '.2f')} |"
        )
    (res / "gmm_prompt_router.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
