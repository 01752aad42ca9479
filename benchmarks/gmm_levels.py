"""The mean-only yardsticks of a Gaussian mixture (:mod:`hddm_flower.gmm.yardsticks`): per cluster and t, the excess
loss over Bayes of a denoiser that knows each caption's mean and takes one covariance for every caption — the
mixture's average variance (``isotropic``) or its average covariance (``pooled``) — in closed form, on the same
scale as ``benchmarks.gmm_capacity_pilot``'s excess losses (per dimension, the cluster's components weighted as the
mixture weighs them, at the pilot's times).

    python -m benchmarks.gmm_levels --config configs/reproduce-gmm-nano.yaml \
        --set "data.gmm_covariance=cluster data.gmm_rank=8" --clusters 0 3 4 --name clu-r8

Adds (or replaces) the entry ``--name`` of ``benchmarks/results/gmm_levels.json`` and writes ``gmm_levels.md`` from
all its entries.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from benchmarks.common import RESULTS
from benchmarks.gmm_ladder import TIMES, cluster_draws
from hddm_flower.config.io import load_config, parse_overrides
from hddm_flower.gmm.dataset import load_reference
from hddm_flower.gmm.yardsticks import mean_only_covariances, mean_only_levels, velocity_gain
from hddm_flower.stages.prepare import prepare_data

OUT = RESULTS / "gmm_levels.json"
LEVELS = ("isotropic", "pooled", "isotropic_on_the_draws")


def on_the_draws(reference, k: int, samples: int, seed: int) -> list[float]:
    """The ``isotropic`` denoiser's excess per t estimated on the draws the pilot scores cluster k's networks on
    (:func:`benchmarks.gmm_ladder.cluster_draws`): paired draw for draw with their estimates."""
    m = reference.mixture
    iso = mean_only_covariances(m)["isotropic"]
    out = []
    for _, t, x_t, _, _, comps, v_star in cluster_draws(reference, k, samples, seed):
        mu, x = m.means[comps], x_t.reshape(samples, -1)
        v = (x - (1 - t) * mu) @ velocity_gain(iso, t).T - mu
        out.append(float(((v - v_star.reshape(samples, -1)) ** 2).mean(1).mean()))
    return out


def levels_of(reference, clusters: list[int], samples: int, seed: int) -> dict:
    """Per cluster and level the excess per t of :data:`TIMES` (and the ``isotropic`` one estimated on the pilot's
    draws, ``isotropic_on_the_draws``), and per level the mean over the clusters per t and over t too."""
    per = {
        str(k): mean_only_levels(reference.mixture, (reference.cluster_of == k).nonzero().squeeze(1), TIMES)
        | {"isotropic_on_the_draws": on_the_draws(reference, k, samples, seed)}
        for k in clusters
    }
    mean = {lv: [sum(per[k][lv][i] for k in per) / len(per) for i in range(len(TIMES))] for lv in LEVELS}
    inner = [i for i, t in enumerate(TIMES) if 0 < t < 1]  # where the levels are not 0 by construction
    return {
        "times": list(TIMES),
        "per_cluster": per,
        "mean_over_clusters": mean,
        "mean_over_t_and_clusters": {lv: sum(v) / len(v) for lv, v in mean.items()},
        "mean_over_inner_t_and_clusters": {lv: sum(v[i] for i in inner) / len(inner) for lv, v in mean.items()},
    }


def render(entries: dict) -> str:
    lines = [
        "# gmm_levels: the mean-only yardsticks",
        "",
        "Excess loss over Bayes per dimension, in closed form, of a denoiser that knows each caption's mean and "
        "takes one covariance for every caption: the mixture's average within-component variance (`isotropic`) or "
        "covariance (`pooled`); mean over the entry's clusters (each cluster's components weighted as the mixture "
        "weighs them). At t = 0 and t = 1 every such denoiser is exact. `isotropic_on_the_draws`: the isotropic "
        "one estimated on the draws `benchmarks.gmm_capacity_pilot` scores its networks on (the same `--samples`), "
        "to be compared draw for draw with them. Each entry: `python -m benchmarks.gmm_levels "
        "--config CONFIG --set SET --clusters … --name NAME`.",
        "",
        "| name | config | `--set` | clusters | level | mean over t | mean over 0 < t < 1 | "
        + " | ".join(f"t = {t:g}" for t in TIMES)
        + " |",
        "|---|---|---|---|---|---|---|" + "---|" * len(TIMES),
    ]
    for name, e in entries.items():
        for lv in LEVELS:
            cells = " | ".join(f"{x:.3f}" for x in e["mean_over_clusters"][lv])
            lines.append(
                f"| {name} | `{e['config']}` | `{e['set']}` | {' '.join(e['per_cluster'])} | {lv} "
                f"| {e['mean_over_t_and_clusters'][lv]:.3f} | {e['mean_over_inner_t_and_clusters'][lv]:.3f} | {cells} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True)
    p.add_argument("--set", default="", help="overrides, as the pilot's --set")
    p.add_argument("--clusters", type=int, nargs="+", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--samples", type=int, default=256, help="draws per t and cluster, as the pilot's --samples")
    p.add_argument("--cache-dir", default=None)
    args = p.parse_args()
    cfg = load_config(args.config, parse_overrides(args.set))
    if cfg.data.name != "gmm":
        p.error(f"--config {args.config}: data.name is {cfg.data.name!r}; the levels are a gmm mixture's")
    if bad := [k for k in args.clusters if not 0 <= k < cfg.num_experts]:
        p.error(f"--clusters {' '.join(map(str, bad))}: the mixture has clusters 0..{cfg.num_experts - 1}")
    reference = load_reference(prepare_data(cfg, args.cache_dir))
    entries = json.loads(OUT.read_text())["entries"] if OUT.exists() else {}
    entries[args.name] = {
        "command": "python -m benchmarks.gmm_levels " + " ".join(sys.argv[1:]),
        "config": args.config,
        "set": args.set,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "samples": args.samples,
    } | levels_of(reference, args.clusters, args.samples, cfg.evaluation.seed)
    OUT.write_text(json.dumps({"entries": entries}, indent=1) + "\n")
    (RESULTS / "gmm_levels.md").write_text(md := render(entries))
    print(md)


if __name__ == "__main__":
    main()
