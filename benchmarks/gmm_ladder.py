"""The budget ladder on the Gaussian mixture: which budget, if any, lets the ensemble beat one network of equal
compute, and why — read from finished ``hddm reproduce`` runs.

    python -m benchmarks.gmm_ladder --runs 200=OUT_200 800=OUT_800 capacity-800=OUT_CAP [--samples 256] [--name N]

Each ``OUT`` is a finished ``hddm reproduce`` run on a ``data.name: gmm`` config with ``evaluation.training_seeds``
> 1 (e.g. ``configs/reproduce-gmm-equal-steps.yaml`` with ``--set expert.steps=800``). For every rung:

1. From its manifest's paired table: per configuration, top-2 − the monolith, top-2 − top-1, top-2 − full and
   top-2 with the trained − the exact router, as paired differences over trainings (outer) with the mean
   half-width over sampling seeds within a training (inner).
2. From its trained networks, per training: the **excess loss over Bayes** of each FM expert and of the monolith
   on the expert's own cluster, ``E‖v̂(x_t, t, c) − v*(x_t, t, c)‖²`` per dimension with ``x_0`` drawn from the
   cluster, ``c`` its caption and ``v*`` the exact velocity (the FM loss is this plus the Bayes loss, so it is the
   part training can still remove), at a grid of t including both endpoints; averaged over clusters, and the
   monolith − expert difference paired by training.

Writes ``benchmarks/results/NAME.{json,md}`` (``--name``, ``gmm_ladder`` by default) with the command, machine,
load and date.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import RESULTS, machine, write_result
from benchmarks.ddpm_profile import caption_cond, draw_x0, load_eval_expert
from hddm_flower.budget import describe as describe_budget
from hddm_flower.config.io import config_from_dict
from hddm_flower.gmm.dataset import load_reference
from hddm_flower.gmm.exact import ExactNet
from hddm_flower.gmm.truth import interval
from hddm_flower.reproduce.training import training_root
from hddm_flower.stages.prepare import prepare_data

NAME = "gmm_ladder"
TIMES = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)
COMPARISONS = ("top2 − monolith", "top2 − top1", "top2 − full", "top2, trained − exact router")
METRICS = {"delta_log_density": ("Δ log p", ".1f", 1.0), "mmd2": ("MMD² ×10³", ".2f", 1e3)}


@torch.no_grad()
def cluster_draws(ref, k: int, samples: int, seed: int):
    """Per t of :data:`TIMES`: ``(i, t, x_t, tt, cond, comps, v_star)`` on cluster k — its components' x_t (samples,
    C, S, S), t per sample, their captions and components, and the exact velocity: the draws every excess loss of
    the ladder and the capacity pilot is taken on (seeded by ``seed``, k and t, so the same in every training)."""
    C, S, _ = ref.shape
    truth = ExactNet(ref, k, "fm")
    members = (ref.cluster_of == k).nonzero().squeeze(1)
    for i, t in enumerate(TIMES):
        g = torch.Generator().manual_seed(seed + 1000 * k + 17 * i)
        x0, comps = draw_x0(ref, members, samples, g)
        x_t = ((1 - t) * x0 + t * torch.randn(x0.shape, generator=g, dtype=torch.float64)).reshape(samples, C, S, S)
        tt = torch.full((samples,), t, dtype=torch.float64)
        cond = caption_cond(ref, comps, samples)
        yield i, t, x_t, tt, cond, comps, truth(x_t, 999.0 * tt, cond).double()


@torch.no_grad()
def excess_loss(cfg, ref, root: Path, samples: int, seed: int) -> dict[str, dict[str, list[float]]]:
    """Per FM cluster k and t: the excess loss per dimension of ``cluster-k-fm`` and of the monolith on cluster k's
    ``x_t`` and captions (the same draws for both, :func:`cluster_draws`)."""
    mono = load_eval_expert(root / "monolith", {})
    out: dict[str, dict[str, list[float]]] = {}
    for k in range(cfg.num_experts):
        folder = root / "experts" / f"cluster-{k}-fm"
        if not folder.is_dir():
            continue
        expert = load_eval_expert(folder, {})
        rows: dict[str, list[float]] = {"expert": [], "monolith": []}
        for _, _, x_t, tt, cond, _, v_star in cluster_draws(ref, k, samples, seed):
            for name, net in (("expert", expert), ("monolith", mono)):
                v = net.velocity(x_t.float(), tt.float(), cond).double()
                rows[name].append(float(((v - v_star) ** 2).flatten(1).mean(1).mean()))
        out[str(k)] = rows
    return out


def _mean_over_clusters(per_cluster: dict[str, dict[str, list[float]]], who: str) -> list[float]:
    """Per t, the mean over clusters of ``who``'s excess loss."""
    ks = list(per_cluster)
    return [sum(per_cluster[k][who][i] for k in ks) / len(ks) for i in range(len(TIMES))]


def rung(label: str, out: Path, samples: int, cache_dir: str | None) -> dict:
    """One rung's comparisons (from its manifest) and excess losses (from its networks, every training)."""
    manifest = json.loads((out / "manifest.json").read_text())
    cfg = config_from_dict(manifest["config"], str(out / "manifest.json"))
    trainings = cfg.evaluation.training_seeds
    paired = {}
    for e in manifest["paired"]:
        group, _, what = e["what"].partition(": ")
        if what in COMPARISONS:
            paired.setdefault(group, {})[what] = {m: e[m] for m in METRICS if m in e}
    ref = load_reference(prepare_data(cfg, cache_dir))
    excess = [excess_loss(cfg, ref, training_root(out, i), samples, seed=cfg.evaluation.seed) for i in range(trainings)]
    curves = {who: [_mean_over_clusters(e, who) for e in excess] for who in ("expert", "monolith")}
    by_t = {who: [interval([c[i] for c in curves[who]]) for i in range(len(TIMES))] for who in ("expert", "monolith")}
    gap = [  # monolith − expert, paired by training, per t
        interval([m[i] - x[i] for m, x in zip(curves["monolith"], curves["expert"])]) for i in range(len(TIMES))
    ]
    whole = {who: [sum(c) / len(c) for c in curves[who]] for who in curves}  # mean over the t grid, per training
    by_cluster = {  # per FM cluster, mean over the t grid: monolith − expert, paired by training
        k: interval([(sum(e[k]["monolith"]) - sum(e[k]["expert"])) / len(TIMES) for e in excess]) for k in excess[0]
    }
    return {
        "label": label,
        "out": str(out),
        "budget": manifest["budget"],
        "trainings": trainings,
        "sampling_seeds": cfg.evaluation.seeds,
        "data": manifest["dataset"],
        "expert_preset": cfg.expert.preset,
        "paired": paired,
        "excess": {"per_training": excess, "by_t": by_t, "monolith_minus_expert_by_t": gap},
        "excess_mean_over_t": {who: interval(v) for who, v in whole.items()}
        | {"monolith_minus_expert": interval([m - x for m, x in zip(whole["monolith"], whole["expert"])])},
        "monolith_minus_expert_by_cluster": by_cluster,
        "seconds": manifest["seconds"],
        "cpu_seconds": manifest["cpu_seconds"],
        "load_average": manifest["load_average"],
        "command": manifest["command"],
    }


def _iv(x: dict, spec: str, scale: float = 1.0) -> str:
    inner = f" [{x['inner_half'] * scale:{spec.lstrip('+')}}]" if "inner_half" in x else ""
    return f"{x['mean'] * scale:{spec}} ± {x['half'] * scale:{spec.lstrip('+')}}{inner}"


def markdown(r: dict) -> str:
    lines = [
        "# The budget ladder on the Gaussian mixture",
        "",
        f"`{r['command']}` — {r['machine']}; {r['date']}, {r['seconds']} s. Each rung is one `hddm reproduce` run "
        "(its command, wall and CPU time below); every interval is a 95 % Student-t interval **over independent "
        "trainings** (experts, router and monolith retrained with moved seeds), [inner] the mean half-width over "
        "sampling seeds within one training.",
        "",
        "| rung | budget | data | trainings × sampling seeds | `hddm reproduce` wall (CPU) | load start → end |",
        "|---|---|---|---|---|---|",
    ]
    for g in r["rungs"]:
        d = g["data"]
        lines.append(
            f"| {g['label']} | {describe_budget(g['budget'])} | {d['dataset']} | {g['trainings']} × "
            f"{g['sampling_seeds']} | {g['seconds'] / 60:.1f} min ({g['cpu_seconds'] / 60:.1f} CPU-min) | "
            f"{g['load_average']['start'][0]} → {g['load_average']['end'][0]} |"
        )
    lines += [
        "",
        "## Paired differences (row a − row b; Δ log p: higher is better, MMD²: lower is better)",
        "",
        "| rung | configuration | comparison | Δ log p [inner] | MMD² ×10³ [inner] |",
        "|---|---|---|---|---|",
    ]
    for g in r["rungs"]:
        for group, comps in g["paired"].items():
            for what in COMPARISONS:
                if what in comps:
                    c = comps[what]
                    lines.append(
                        f"| {g['label']} | {group} | {what} | {_iv(c['delta_log_density'], '+.1f')} | "
                        f"{_iv(c['mmd2'], '+.2f', 1e3)} |"
                    )
    lines += [
        "",
        "## Excess loss over Bayes on the expert's own cluster, per dimension (mean over FM clusters)",
        "",
        "E‖v̂ − v*‖² with x_0 from the cluster and its captions; ± over trainings. Monolith − expert is paired by "
        "training: positive means the expert, trained on its cluster alone, is closer to the exact velocity there.",
        "",
        "| rung | t | FM expert | monolith | monolith − expert |",
        "|---|---|---|---|---|",
    ]
    for g in r["rungs"]:
        e = g["excess"]
        for i, t in enumerate(r["times"]):
            lines.append(
                f"| {g['label']} | {t:g} | {_iv(e['by_t']['expert'][i], '.4f')} | "
                f"{_iv(e['by_t']['monolith'][i], '.4f')} | {_iv(e['monolith_minus_expert_by_t'][i], '+.4f')} |"
            )
        m = g["excess_mean_over_t"]
        lines.append(
            f"| {g['label']} | mean over t | {_iv(m['expert'], '.4f')} | {_iv(m['monolith'], '.4f')} | "
            f"{_iv(m['monolith_minus_expert'], '+.4f')} |"
        )
    lines += [
        "",
        "## Monolith − expert by cluster (excess loss per dimension, mean over the t grid; ± over trainings)",
        "",
        "| rung | " + " | ".join(f"cluster {k}" for k in _clusters(r)) + " | clusters where the monolith is worse |",
        "|---|" + "---|" * (len(_clusters(r)) + 1),
    ]
    for g in r["rungs"]:
        per = g.get("monolith_minus_expert_by_cluster")
        if per is None:
            continue
        worse = sum(x["lo"] > 0 for x in per.values())
        cells = [_iv(per[k], "+.4f") if k in per else "—" for k in _clusters(r)]
        lines.append(f"| {g['label']} | " + " | ".join(cells) + f" | {worse} of {len(per)} (interval above 0) |")
    return "\n".join(lines) + "\n"


def _clusters(r: dict) -> list[str]:
    """The FM clusters any rung has, in order."""
    ks = {k for g in r["rungs"] for k in g.get("monolith_minus_expert_by_cluster", {})}
    return sorted(ks, key=int)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", nargs="+", required=True, help="LABEL=OUT of finished hddm reproduce runs, in order")
    p.add_argument("--samples", type=int, default=256, help="x_t per cluster and t for the excess loss")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--name", default=NAME, help=f"result files benchmarks/results/NAME.{{json,md}} (default {NAME})")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    start, load0 = time.time(), os.getloadavg()
    runs = []
    for spec in args.runs:
        label, sep, path = spec.partition("=")
        if not sep or not (Path(path) / "manifest.json").is_file():
            sys.exit(f"--runs: {spec!r} is not LABEL=OUT of a finished hddm reproduce run (no OUT/manifest.json)")
        runs.append(rung(label, Path(path), args.samples, args.cache_dir))
    record = {
        "command": "python -m benchmarks.gmm_ladder " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine() + f", {args.threads} torch threads",
        "load_average": {"start": load0, "end": os.getloadavg()},
        "seconds": round(time.time() - start, 1),
        "times": list(TIMES),
        "samples": args.samples,
        "rungs": runs,
    }
    write_result(RESULTS / f"{args.name}.json", record)
    (RESULTS / f"{args.name}.md").write_text(markdown(record))
    print(markdown(record))


if __name__ == "__main__":
    main()
