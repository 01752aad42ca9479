"""The exact rows of ``configs/reproduce-gmm.yaml`` (no training): true vs true, exact FM experts with the exact
router (oracle, 8× Euler steps, top-2, full on the empty caption), exact DDPM experts through both conversions.

    python -m benchmarks.gmm_exact_rows [--samples-per-prompt 8] [--steps-factor-samples 4]

Writes ``benchmarks/results/gmm_exact_rows.json`` and ``.md`` with the command, machine, load and date.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from benchmarks.common import ROOT, machine, write_result
from hddm_flower.config.io import load_config
from hddm_flower.gmm.evaluate import evaluate_group, truth_rows
from hddm_flower.stages.prepare import prepare_data


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples-per-prompt", type=int, default=8)
    p.add_argument("--steps-factor-samples", type=int, default=4, help="samples per prompt of the 8×-steps row")
    p.add_argument("--cache-dir", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(ROOT / "configs" / "reproduce-gmm.yaml")
    dataset = prepare_data(cfg, args.cache_dir)
    exact = [r for r in truth_rows(["2DDPM:6FM"], ["top2"], "2DDPM:6FM") if r.group == "exact"]
    load0, start, results = os.getloadavg(), time.time(), {}
    for rows, per_prompt in (
        (
            [r for r in exact if r.steps_factor == 1 and r.name != "exact FM experts · exact router · full"],
            args.samples_per_prompt,
        ),
        ([r for r in exact if r.steps_factor > 1], args.steps_factor_samples),
    ):
        cfg.evaluation.samples_per_prompt = per_prompt
        results |= evaluate_group((cfg.to_dict(), str(ROOT), str(dataset.root), rows, None, False))
    out = {
        "command": "python " + " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{machine()}, one torch thread",
        "load_average": {"start": load0, "end": os.getloadavg()},
        "seconds": round(time.time() - start, 1),
        "results": results,
    }
    res = ROOT / "benchmarks" / "results"
    write_result(res / "gmm_exact_rows.json", out, indent=1)
    lines = [f"`{out['command']}` on {out['date']}, {out['machine']}, {out['seconds']} s, load {load0[0]:.1f}", ""]
    lines += ["| row | samples | Δ log p | MMD² ×10³ | mode TV | adherence |", "|---|---|---|---|---|---|"]
    for name, r in results.items():
        m = r["metrics"]
        c = lambda k, s=1, f=".2f": f"{m[k]['mean'] * s:{f}} ± {m[k]['half'] * s:{f}}" if k in m else "–"  # noqa: E731
        lines.append(
            f"| {name} | {r['samples_per_seed']} × {r['seeds']} | {c('delta_log_density')} | {c('mmd2', 1e3)} | "
            f"{c('mode_tv', 1, '.3f')} | {c('adherence', 1, '.3f')} |"
        )
    (res / "gmm_exact_rows.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
