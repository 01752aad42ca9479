"""Capacity with trained features: the class floor's networks (:mod:`benchmarks.gmm_class_floor`) with every weight
trained, the monolith against an expert of the same size, at budgets that double, to see where each settles.

At one t the network is ``v̂(x, c) = A·x + b_c + W·relu(R·x̃ + q_c + β)`` with N hidden units, as in the class floor,
but R, q and β are trained with A, b and W: a two-layer network whose caption enters as a shift of its hidden units
(so a unit can be kept for some captions and switched off for others). Each network starts at the class floor's
least-squares optimum for its own random features (the fit of :func:`benchmarks.gmm_class_floor.fit`, the same
seeds) and is trained by Adam against the exact velocity on fresh draws of its components, the learning rate
decayed to 0 over the budget (cosine; float32). Every budget trains from that start, so the excess at 2S against S is
the change per doubling; the record also holds the start's excess. Scoring is the class floor's: the capacity pilot's
draws (:func:`benchmarks.gmm_ladder.cluster_draws`) at t, float64.

On the mixture whose clusters share nothing (``data.gmm_covariance=cluster``), given its caption the exact velocity
is affine in x_t with its component's gain. What one gain for every caption leaves of it is, for the monolith, mostly
each cluster's rank-r subspace (about K·r hidden units for K clusters hold it); for an expert it is the small
difference between its components' noise levels, full-rank, which N units barely reduce at small t. The closed form
is the width floor (:func:`hddm_flower.gmm.yardsticks.width_floor`): no network of this form with N hidden units goes
below it in expectation, however trained. The summary sets it beside each side's training loss over the last tenth of its steps
(fresh draws of its own components: the expectation the floor bounds, averaged over those iterates, in float32); the
held-out excess is on one fixed set of scoring draws, whose sampling error the ± over trainings
does not include; each held-out value keeps its standard error over those draws. With every cluster scored, the
summary also weighs the clusters by their shares of the mixture (the expectation the monolith's floor bounds) and
gives, per training, the monolith's floor over the experts' weighted excess, also with two standard errors added.

    python -m benchmarks.gmm_trained_floor --config configs/reproduce-gmm-nano.yaml \\
        --set "data.gmm_covariance=cluster data.gmm_rank=8" --clusters 0 3 --features 16 64 --times 0.1 \\
        --steps 2000 4000 8000 16000 --training 0 1 2 --lr 1e-2 --name clu-r8

appends one record per (training, N, t, budget) to ``benchmarks/results/gmm_trained_floor.json`` (a record already
there is kept unless ``--replace``) and writes ``gmm_trained_floor-NAME.{md,json}`` beside it, the summary over the
trainings present.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import shlex
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import RESULTS, add_record, results_file, stamp, write_result
from benchmarks.ddpm_profile import draw_x0
from benchmarks.gmm_class_floor import FIT_SEEDS, INNER, Fitted, component_velocity, fit
from benchmarks.gmm_ladder import cluster_draws
from hddm_flower.config.io import load_config, parse_overrides
from hddm_flower.gmm.dataset import GMMReference, load_reference
from hddm_flower.gmm.truth import interval
from hddm_flower.gmm.yardsticks import width_floor
from hddm_flower.stages.prepare import prepare_data

OUT = RESULTS / "gmm_trained_floor.json"
TRAIN_SEEDS = 2**41  # the training draws' generator seeds: apart from the fits' (2**40+) and the scoring draws'
f64 = torch.float64


def train(ref: GMMReference, members, t: float, n: int, seed: int, steps: int, args) -> tuple[Fitted, Fitted, float]:
    """The network of N = ``n`` units over ``members`` at time t: its start (the least-squares fit on random features)
    and the same network after ``steps`` Adam steps of ``args.batch`` fresh draws; and the training loss
    (excess per dimension) over its last tenth of steps."""
    start, _ = fit(ref, members, t, n, seed, args.draws_per_feature)
    f = start.features
    R, q, beta, W = (p.float().clone().requires_grad_() for p in (f.R, f.q, f.beta, start.W))
    shift, scale = f.shift.float(), f.scale
    opt = torch.optim.Adam([R, q, beta, W], lr=args.lr)
    decay = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 0.5 * (1 + math.cos(math.pi * min(i, steps) / steps)))
    g = torch.Generator().manual_seed(TRAIN_SEEDS + seed)
    velocity, tail, chunk = component_velocity(ref, t, members), [], max(args.batch, 8192 // args.batch * args.batch)
    for i in range(steps):
        if i % (chunk // args.batch) == 0:  # fresh draws, a chunk at a time
            x0, comps = draw_x0(ref, members, chunk, g)
            x = (1 - t) * x0 + t * torch.randn(x0.shape, generator=g, dtype=f64)
            rows = (x.float(), f.local[comps], velocity(x, comps).float())
        j = (i % (chunk // args.batch)) * args.batch
        xb, cb, vb = (r[j : j + args.batch] for r in rows)
        hidden = torch.relu((xb - shift) / scale @ R + q[cb] + beta)
        onehot = torch.nn.functional.one_hot(cb, len(f.members)).float()
        loss = ((torch.cat([xb, onehot, hidden], 1) @ W - vb) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        decay.step()
        if i >= steps - max(1, steps // 10):
            tail.append(loss.item())
    trained = copy.copy(f)  # the same captions and standardisation, the trained first layer
    trained.R, trained.q, trained.beta = R.detach().double(), q.detach().double(), beta.detach().double()
    return start, Fitted(trained, W.detach().double()), sum(tail) / len(tail)


def held_out(net, x, comps, v) -> tuple[float, float]:
    """A network's excess per dimension on scoring draws ``x`` (one row per draw) against their exact velocity
    ``v``: the mean over the draws and its standard error (the draws' sampling error, which the ± over trainings
    leaves out because every training is scored on the same draws)."""
    per_sample = ((net(x, comps) - v) ** 2).mean(1)
    return float(per_sample.mean()), float(per_sample.std() / math.sqrt(len(per_sample)))


def key_of(r: dict) -> tuple:
    """A record's key: (N, t, steps, training)."""
    return r["features"], r["t"], r["steps"], r["training"]


def fit_seed(training: int, n: int, t: float) -> int:
    """The class floor's fit seed for a network of N = ``n`` units at t in one training (its expert of cluster k adds
    13·(k + 1))."""
    return FIT_SEEDS + 1_000_003 * training + 7919 * n + 101 * INNER.index(t)


def scored(ref, k: int, t: float, nets: dict[str, Fitted], args) -> dict[str, float]:
    """Each network's held-out excess (and its standard error) on cluster k's scoring draws at t, the class floor's."""
    for _, tt, x_t, _, _, comps, v_star in cluster_draws(ref, k, args.samples, args.eval_seed):
        if tt == t:
            x, v = x_t.reshape(len(comps), -1), v_star.reshape(len(comps), -1)
            out = {}
            for who, net in nets.items():
                out[who], out[f"{who}_se"] = held_out(net, x, comps, v)
            return out
    raise AssertionError(f"t = {t} is not among the scoring times")


def record(ref, clusters: list[int], n: int, t: float, steps: int, training: int, args) -> dict:
    """One training at N = ``n``, time t and budget ``steps``: per cluster the monolith's and the expert's excess
    at the start and trained, and each network's training loss over its last tenth."""
    every = torch.arange(len(ref.cluster_of))
    base = fit_seed(training, n, t)
    begin = time.perf_counter()
    start, mono, loss = train(ref, every, t, n, base, steps, args)
    per_cluster, losses = {}, {"monolith": loss}
    for k in clusters:
        members = (ref.cluster_of == k).nonzero().squeeze(1)
        e_start, expert, losses[str(k)] = train(ref, members, t, n, base + 13 * (k + 1), steps, args)
        nets = {"monolith": mono, "expert": expert, "monolith_start": start, "expert_start": e_start}
        per_cluster[str(k)] = scored(ref, k, t, nets, args)
    return {
        "features": n,
        "t": t,
        "steps": steps,
        "training": training,
        "per_cluster": per_cluster,
        "training_loss": losses,
        "seconds": round(time.perf_counter() - begin, 1),
    }


def summarise(entry: dict) -> dict:
    """Per (N, t, budget), over the trainings present: the expert's, the monolith's, monolith − expert and monolith /
    expert (mean over the clusters; and each side at the start); the monolith's training loss over its last tenth
    (fresh draws of every component), the experts' mean of theirs and, where the entry holds them, the width floors (the monolith's over every
    component, the experts' mean over the clusters); per (N, t) and doubling, each side's change in per cent, paired by training."""
    runs: dict[tuple, dict[int, dict]] = {}
    for r in entry["records"]:
        runs.setdefault((r["features"], r["t"], r["steps"]), {})[r["training"]] = r

    def side(r: dict, who: str) -> float:
        return sum(c[who] for c in r["per_cluster"].values()) / len(r["per_cluster"])

    rows = []
    for (n, t, s), by in sorted(runs.items()):
        tr = sorted(by)
        row = {"features": n, "t": t, "steps": s, "trainings": tr}
        for who in ("expert", "monolith", "expert_start", "monolith_start"):
            row[who] = interval([side(by[i], who) for i in tr])
        row["gap"] = interval([side(by[i], "monolith") - side(by[i], "expert") for i in tr])
        row["ratio"] = interval([side(by[i], "monolith") / side(by[i], "expert") for i in tr])
        row["monolith_training_loss"] = interval([by[i]["training_loss"]["monolith"] for i in tr])
        row["expert_training_loss"] = interval([_mean_experts(by[i]["training_loss"]) for i in tr])
        floor = entry.get("width_floor", {}).get(f"{n}@{t}")
        if floor:
            clusters = by[tr[0]]["per_cluster"]
            row["width_floor"] = {
                "monolith": floor["monolith"],
                "expert": sum(floor[k] for k in clusters) / len(clusters),
            }
        weights = entry.get("cluster_weights", {})
        if weights and all(set(by[i]["per_cluster"]) == set(weights) for i in tr):  # every cluster, every training
            row["every_component"] = _every_component({i: by[i] for i in tr}, weights, floor)
            if floor:
                row["width_floor"]["experts_weighted"] = sum(w * floor[k] for k, w in weights.items())
        before = runs.get((n, t, s // 2))
        both = sorted(set(tr) & set(before or {}))
        if s % 2 == 0 and both:
            row["change_per_doubling_pct"] = {
                who: interval([100 * (side(by[i], who) / side(before[i], who) - 1) for i in both])
                for who in ("expert", "monolith")
            }
        rows.append(row)
    return {"name": entry["name"], "rows": rows}


def weighted(per_cluster: dict, who: str, weights: dict[str, float]) -> tuple[float, float | None]:
    """One side's excess over the clusters of a record, each weighted by its share of the mixture, and its standard
    error over the scoring draws (the clusters' draws are independent: in quadrature); None for records made before
    the standard errors were kept."""
    value = sum(w * per_cluster[k][who] for k, w in weights.items())
    if any(f"{who}_se" not in per_cluster[k] for k in weights):
        return value, None
    return value, math.sqrt(sum((w * per_cluster[k][f"{who}_se"]) ** 2 for k, w in weights.items()))


def _every_component(records: dict[int, dict], weights: dict[str, float], floor: dict | None) -> dict:
    """Over the trainings (``records`` by training), each cluster's value weighted by its share π_k of the mixture —
    the expectation over every component, which is what the monolith's width floor bounds: the experts' (each on its
    own cluster, as oracle routing uses them), the monolith's, their ratio and the monolith's width floor over the
    experts'; and per training the weighted values with their standard errors over the scoring draws (the clusters'
    draws are independent: in quadrature), and the floor over the experts' excess with two standard errors added."""

    def value(r: dict, who: str) -> float:
        return weighted(r["per_cluster"], who, weights)[0]

    def se(r: dict, who: str) -> float | None:
        return weighted(r["per_cluster"], who, weights)[1]

    runs = records.values()
    out = {who: interval([value(r, who) for r in runs]) for who in ("expert", "monolith")}
    out["ratio"] = interval([value(r, "monolith") / value(r, "expert") for r in runs])
    if floor:
        out["monolith_floor_over_expert"] = interval([floor["monolith"] / value(r, "expert") for r in runs])
    out["per_training"] = {}
    for i, r in records.items():
        one = {who: value(r, who) for who in ("expert", "monolith")} | {
            f"{who}_se": se(r, who) for who in ("expert", "monolith")
        }
        if floor:
            one["floor_over_expert"] = floor["monolith"] / one["expert"]
            if one["expert_se"] is not None:
                one["floor_over_expert_plus_2se"] = floor["monolith"] / (one["expert"] + 2 * one["expert_se"])
        out["per_training"][str(i)] = one
    return out


def _mean_experts(losses: dict[str, float]) -> float:
    """The experts' mean of a record's training losses (every key but the monolith's)."""
    experts = [v for k, v in losses.items() if k != "monolith"]
    return sum(experts) / len(experts)


def _cell(iv: dict, fmt: str = ".4g") -> str:
    return f"{iv['mean']:{fmt}}" + (f" ± {iv['half']:.2g}" if iv["n"] > 1 else "")


_PER_TRAINING = ("floor_over_expert", "floor_over_expert_plus_2se", "largest_relative_se")


def _per_training(runs: dict[str, dict], key: str) -> str:
    """A cell of the weighted table: a value per training, or the largest relative standard error of any."""
    if key == "largest_relative_se":
        rel = [r[f"{who}_se"] / r[who] for r in runs.values() for who in ("expert", "monolith") if r[f"{who}_se"]]
        return f"{100 * max(rel):.2g}" if rel else ""
    return ", ".join(f"{r[key]:.3g}" for r in runs.values() if key in r)


def render(entry: dict, summary: dict) -> str:
    head = entry["meta"]
    lines = [
        f"# gmm_trained_floor: {entry['name']}",
        "",
        f"`{head['command']}` (the last command; each record names its own commit, machine and date); "
        f"{head['machine']}; commit {head['commit']}; {head['date']}.",
        "",
        "Excess loss over Bayes per dimension, held out, mean over the clusters scored; start: the least-squares fit "
        "on the network's random features, before training. ± : 95 % Student-t half-width over trainings (feature, "
        "fit and training seeds; the scoring draws are the same in every training); change per doubling: against the "
        "budget half as large, paired by training.",
        "",
        "| N | t | steps | trainings | expert (start) | monolith (start) | monolith − expert | monolith / expert | "
        "change per doubling: expert / monolith (%) | training loss (width floor): experts | monolith, every component |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary["rows"]:
        ch = r.get("change_per_doubling_pct")
        change = f"{_cell(ch['expert'], '+.1f')} / {_cell(ch['monolith'], '+.1f')}" if ch else ""
        lines.append(
            f"| {r['features']} | {r['t']} | {r['steps']} | {len(r['trainings'])} | {_cell(r['expert'])} "
            f"({r['expert_start']['mean']:.4g}) | {_cell(r['monolith'])} ({r['monolith_start']['mean']:.4g}) | "
            f"{_cell(r['gap'], '+.4g')} | {_cell(r['ratio'], '.3g')} | {change} | "
            + " | ".join(
                _cell(r[f"{who}_training_loss"]) + (f" ({r['width_floor'][who]:.4g})" if "width_floor" in r else "")
                for who in ("expert", "monolith")
            )
            + " |"
        )
    weighted = [r for r in summary["rows"] if "every_component" in r]
    if weighted:
        lines += [
            "",
            "Every cluster scored: each value weighted by its cluster's share of the mixture (the expectation over "
            "every component, which the monolith's width floor bounds; the experts each on their own cluster).",
            "",
            "| N | t | steps | trainings | experts (their width floor) | monolith (its width floor) | "
            "monolith / experts | monolith's width floor / experts, per training | the same, two standard errors "
            "added to the experts | largest standard error, % of its value |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in weighted:
            e, fl = r["every_component"], r.get("width_floor")
            lines.append(
                f"| {r['features']} | {r['t']} | {r['steps']} | {len(r['trainings'])} | {_cell(e['expert'])}"
                + (f" ({fl['experts_weighted']:.4g})" if fl else "")
                + f" | {_cell(e['monolith'])}"
                + (f" ({fl['monolith']:.4g})" if fl else "")
                + f" | {_cell(e['ratio'], '.3g')} | "
                + " | ".join(_per_training(e["per_training"], key) for key in _PER_TRAINING)
                + " |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True)
    p.add_argument("--set", default="", help='overrides, as the capacity pilot\'s --set: "data.gmm_rank=8 …"')
    p.add_argument("--clusters", type=int, nargs="+", required=True)
    p.add_argument("--features", type=int, nargs="+", required=True, help="N: the hidden units of each network")
    p.add_argument("--times", type=float, nargs="+", required=True, help=f"t, of the inner ones {INNER}")
    p.add_argument("--steps", type=int, nargs="+", required=True, help="budgets: Adam steps per network")
    p.add_argument("--training", type=int, nargs="+", default=[0])
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--draws-per-feature", type=int, default=32, help="the start's fit: M / P, as the class floor's")
    p.add_argument("--samples", type=int, default=2048, help="scoring x_t per cluster and t")
    p.add_argument("--name", required=True)
    p.add_argument("--replace", action="store_true", help="retrain records already in the results file")
    p.add_argument("--results", default=str(OUT), help="the records' file; the summaries are written beside it")
    args = p.parse_args(argv)
    if bad := [t for t in args.times if t not in INNER]:
        p.error(f"--times {bad}: t must be one of the inner times {INNER}")
    if min(args.features) < 1 or min(args.steps) < 1 or args.batch < 1 or not args.lr > 0 or args.samples < 2:
        p.error("--features, --steps and --batch must be ≥ 1, --samples ≥ 2 (a standard error) and --lr > 0")
    cfg = load_config(args.config, parse_overrides(args.set))
    if cfg.data.name != "gmm" or cfg.data.gmm_captions != "pattern":
        p.error(f"{args.config}: needs the Gaussian mixture (data.name gmm) with one caption per component (pattern)")
    ref = load_reference(prepare_data(cfg))
    if bad := [k for k in args.clusters if not 0 <= k < ref.num_clusters]:
        p.error(f"--clusters {bad}: the mixture has clusters 0–{ref.num_clusters - 1}")
    args.eval_seed = cfg.evaluation.seed
    path = Path(args.results)
    store = json.loads(path.read_text()) if path.exists() else {}
    entry = store.get(args.name) or {"name": args.name, "records": []}
    same = {"config": args.config, "set": args.set, "clusters": args.clusters, "samples": args.samples}
    same |= {"lr": args.lr, "batch": args.batch, "draws_per_feature": args.draws_per_feature}
    if entry.get("setting", same) != same:
        p.error(f"--name {args.name}: its records were trained with {entry['setting']}; use another name")
    entry["setting"] = same
    for training in args.training:
        for n in args.features:
            for t in args.times:
                for steps in args.steps:
                    if not args.replace and any(key_of(r) == (n, t, steps, training) for r in entry["records"]):
                        continue
                    r = record(ref, args.clusters, n, t, steps, training, args) | stamp()
                    try:  # after each record: an interrupted run keeps what it trained, and sees what others did
                        entry = add_record(path, args.name, same, r, key_of)[args.name]
                    except ValueError as e:  # a process beside this one, another setting
                        p.error(str(e))
                    print(
                        f"N={n} t={t} steps={steps} training {training}: {r['seconds']} s", file=sys.stderr, flush=True
                    )
    with results_file(path) as store:  # read again: the records of every process that wrote to it
        entry = store.setdefault(args.name, entry | {"setting": same})
        if entry["setting"] != same:
            p.error(f"--name {args.name}: its records were trained with {entry['setting']}")
        _close(entry, ref, args, argv)
        summary = summarise(entry)  # under the lock: the last to take it summarises every record
        write_result(path.parent / f"gmm_trained_floor-{args.name}.json", summary)
        (path.parent / f"gmm_trained_floor-{args.name}.md").write_text(render(entry, summary))
    return summary


def _close(entry: dict, ref, args, argv) -> None:
    """The entry's fields read from its records: the clusters' weights, the width floor of each (N, t), and the
    command that made it."""
    every = torch.arange(len(ref.cluster_of))
    if len(set(args.clusters)) == ref.num_clusters:  # every cluster scored: the summary weighs them
        entry["cluster_weights"] = {
            str(k): float(ref.mixture.weights[ref.cluster_of == k].sum()) for k in range(ref.num_clusters)
        }
    entry["width_floor"] = {  # what no network of N hidden units can go below (closed form, per N and t)
        f"{n}@{t}": {"monolith": width_floor(ref.mixture, every, (t,), n)[0]}
        | {
            str(k): width_floor(ref.mixture, (ref.cluster_of == k).nonzero().squeeze(1), (t,), n)[0]
            for k in args.clusters
        }
        for n, t in sorted({(r["features"], r["t"]) for r in entry["records"]})
    }
    command = ["python", "-m", "benchmarks.gmm_trained_floor", *(sys.argv[1:] if argv is None else argv)]
    entry["meta"] = {"command": shlex.join(command)} | stamp()


if __name__ == "__main__":
    main()
