"""Capacity at convergence, where convergence can be computed: on the Gaussian mixture, one denoiser for every
caption against an expert of one cluster, each the optimum of the same class of a known size.

At each t the class is ``v̂(x, c) = A·x + b_c + W·relu(R·x̃ + q_c + β)``: an affine map whose gain A is shared by
every caption and whose shift b_c is the caption's own, plus N random ReLU features of the standardised ``x̃`` and the
caption (R, q, β drawn once from a seed and frozen: a two-layer network whose first layer is not trained). Only A,
b and W are fitted, by least squares against the exact velocity on fresh draws of the network's components (a caption
names one component; no caption dropout): a convex problem, so the fit is the class's optimum up to the finite
draws — its held-out excess lies above the optimum by about P/M, for P coefficients per output and M draws
(``--draws-per-feature`` sets M/P). With N = 0 the optimum is known in closed form — the pooled level of the
components fitted on (:func:`hddm_flower.gmm.yardsticks.affine_floor`) — which checks the fit; with N → ∞ the class
holds any velocity.

The monolith is fitted on all components, an expert on its cluster's, each with N features; both are scored on the
expert's cluster with the capacity pilot's scoring seeds and procedure (``benchmarks.gmm_ladder.cluster_draws``; at
its default ``--samples`` 256 the pilot's draws are not a subset of these 2,048), at the inner t (at t = 0 and 1 the
velocity is affine and every fit exact). Each network standardises x_t about its own components' draws. With equal
features an expert would be no worse on its cluster by construction (the monolith restricted to the cluster's
captions is then a member of the expert's class); what is measured is by how much, and whether a monolith with as many coefficients as all the experts
together (``--monolith-only N``: the monolith alone, at a larger N) comes down to them. A *training* draws the
features and the fitting draws from its own seed; the ± of the summary is over trainings.

    python -m benchmarks.gmm_class_floor --config configs/reproduce-gmm-nano.yaml \\
        --set "data.gmm_covariance=cluster data.gmm_rank=8" --clusters 0 3 4 --features 0 64 256 512 2048 \\
        --monolith-only 4096 --training 0 1 2 --name clu-r8

appends one record per (training, N) to ``benchmarks/results/gmm_class_floor.json`` (a record already there is
kept, unless ``--replace``; with neither ``--features`` nor ``--monolith-only`` nothing is fitted) and writes
``gmm_class_floor-NAME.{md,json}`` beside it (``--results`` moves both), the summary over the trainings present.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from pathlib import Path

import torch
from torch import Tensor

from benchmarks.common import RESULTS, stamp, write_result
from benchmarks.ddpm_profile import draw_x0
from benchmarks.gmm_ladder import TIMES, cluster_draws
from hddm_flower.config.io import load_config, parse_overrides
from hddm_flower.gmm.dataset import GMMReference, load_reference
from hddm_flower.gmm.truth import interval
from hddm_flower.gmm.yardsticks import affine_floor, velocity_gain
from hddm_flower.stages.prepare import prepare_data

OUT = RESULTS / "gmm_class_floor.json"
INNER = tuple(t for t in TIMES if 0 < t < 1)
f64 = torch.float64


def component_velocity(ref: GMMReference, t: float, members: Tensor):
    """The exact velocity under each member's caption at time t: ``v(x, j) = M_j (x − aμ_j) − μ_j``."""
    cov, mu = ref.mixture.covariance(), ref.mixture.means
    gains = {int(j): velocity_gain(cov[j], t) for j in members}

    def v(x: Tensor, comps: Tensor) -> Tensor:
        out = torch.empty_like(x)
        for j in comps.unique().tolist():
            rows = comps == j
            out[rows] = (x[rows] - (1 - t) * mu[j]) @ gains[j].T - mu[j]
        return out

    return v


class Features:
    """``[x, onehot(c), relu(R·(x − m)/s + q_c + β)]`` for the captions of ``members`` (their position in it)."""

    def __init__(self, members: Tensor, d: int, n: int, seed: int, shift: Tensor, scale: float):
        g = torch.Generator().manual_seed(seed)
        self.members, self.n, self.shift, self.scale = members, n, shift, scale
        self.R = torch.randn(d, n, generator=g, dtype=f64) / math.sqrt(d)
        self.q = torch.randn(len(members), n, generator=g, dtype=f64)
        self.beta = torch.randn(n, generator=g, dtype=f64)
        self.local = torch.full((int(members.max()) + 1,), -1, dtype=torch.long)
        self.local[members] = torch.arange(len(members))

    @property
    def size(self) -> int:
        return self.R.shape[0] + len(self.members) + self.n

    def __call__(self, x: Tensor, comps: Tensor) -> Tensor:
        c = self.local[comps.clamp(0, len(self.local) - 1)]
        if bool((c < 0).any() or (comps >= len(self.local)).any() or (comps < 0).any()):
            raise ValueError("a caption the network was not fitted on")
        onehot = torch.nn.functional.one_hot(c, len(self.members)).to(f64)
        hidden = torch.relu(((x - self.shift) / self.scale) @ self.R + self.q[c] + self.beta)
        return torch.cat([x, onehot, hidden], 1)


class Fitted:
    """A network of the class fitted at one t: its features and readout (``features(x, c) @ W``)."""

    def __init__(self, features: Features, W: Tensor):
        self.features, self.W = features, W

    def __call__(self, x: Tensor, comps: Tensor) -> Tensor:
        return self.features(x, comps) @ self.W


def fit(
    ref: GMMReference,
    members: Tensor,
    t: float,
    n: int,
    seed: int,
    draws_per_feature: int,
    chunk: int = 4096,
    input_scale: float = 1.0,
):
    """The least-squares optimum of the class with ``n`` features over ``members`` at time t (fresh draws of them
    by their weights, seeded by ``seed``; M = ``draws_per_feature`` × P), and the fit's in-sample excess. The
    features see ``input_scale`` × the standardised x_t (1: unit spread about the draws' mean)."""
    g = torch.Generator().manual_seed(seed)
    velocity = component_velocity(ref, t, members)

    def rows(m: int) -> tuple[Tensor, Tensor, Tensor]:
        x0, comps = draw_x0(ref, members, m, g)
        x = (1 - t) * x0 + t * torch.randn(x0.shape, generator=g, dtype=f64)
        return x, comps, velocity(x, comps)

    x, comps, v = rows(chunk)
    shift = x.mean(0)
    features = Features(members, ref.mixture.dim, n, seed + 1, shift, float((x - shift).std()) / input_scale)
    total, P = draws_per_feature * features.size, features.size
    G, B, vv, seen = torch.zeros(P, P, dtype=f64), torch.zeros(P, v.shape[1], dtype=f64), 0.0, 0
    while True:
        phi = features(x, comps)
        G += phi.T @ phi
        B += phi.T @ v
        vv += float((v * v).sum())
        seen += len(x)
        if seen >= total:
            break
        x, comps, v = rows(min(chunk, total - seen))
    ridge = 1e-10 * float(torch.diagonal(G).mean())
    W = torch.linalg.solve(G + ridge * torch.eye(P, dtype=f64), B)
    in_sample = (vv - float((W * B).sum())) / (seen * v.shape[1])  # ‖Φw − v‖² = v·v − w·Φᵀv at the optimum
    return Fitted(features, W), in_sample


def excess(net: Fitted, ref: GMMReference, k: int, samples: int, seed: int) -> list[float]:
    """The excess per dimension of ``net`` on cluster k at each inner t, on draws made as the capacity pilot makes
    its own (:func:`benchmarks.gmm_ladder.cluster_draws`, the same seed; ``samples`` of them)."""
    out = []
    for _, t, x_t, _, _, comps, v_star in cluster_draws(ref, k, samples, seed):
        if t in INNER:
            x = x_t.reshape(samples, -1)
            out.append(float(((net[t](x, comps) - v_star.reshape(samples, -1)) ** 2).mean()))
    return out


FIT_SEEDS = 2**40  # the fits' generator seeds start here: far from the scoring draws' (evaluation.seed + small)


def coefficients(ref: GMMReference, n: int) -> dict[str, int]:
    """Fitted coefficients per output: the monolith's, and every cluster's expert's added up (each its own gain)."""
    d, counts = ref.mixture.dim, torch.bincount(ref.cluster_of).tolist()
    return {"monolith": d + len(ref.cluster_of) + n, "experts_together": sum(d + j + n for j in counts)}


def record(ref, clusters: list[int], n: int, training: int, args, experts: bool = True) -> dict:
    """One training at N = ``n``: per cluster the monolith's and (where ``experts``) the expert's excess by inner t,
    and the fits' in-sample excess (the monolith's over all its components); at N = 0 the closed forms beside them."""
    every = torch.arange(len(ref.cluster_of))
    base = FIT_SEEDS + 1_000_003 * training + 7919 * n
    start = time.perf_counter()
    mono, in_sample = {}, {"monolith": []}
    for i, t in enumerate(INNER):
        mono[t], e = fit(ref, every, t, n, base + 101 * i, args.draws_per_feature, input_scale=args.input_scale)
        in_sample["monolith"].append(e)
    per_cluster = {}
    for k in clusters:
        members = (ref.cluster_of == k).nonzero().squeeze(1)
        per_cluster[str(k)] = {"monolith": excess(mono, ref, k, args.samples, args.eval_seed)}
        if not experts:
            continue
        expert, in_sample[str(k)] = {}, []
        for i, t in enumerate(INNER):
            seed = base + 101 * i + 13 * (k + 1)
            expert[t], e = fit(ref, members, t, n, seed, args.draws_per_feature, input_scale=args.input_scale)
            in_sample[str(k)].append(e)
        per_cluster[str(k)]["expert"] = excess(expert, ref, k, args.samples, args.eval_seed)
        if n == 0:
            per_cluster[str(k)] |= {
                "expert_closed_form": affine_floor(ref.mixture, members, members, INNER),
                "monolith_closed_form": affine_floor(ref.mixture, every, members, INNER),
            }
    return {
        "features": n,
        "experts": experts,
        "coefficients": coefficients(ref, n),
        "training": training,
        "times": list(INNER),
        "per_cluster": per_cluster,
        "in_sample": in_sample,
        "draws_per_feature": args.draws_per_feature,
        "samples": args.samples,
        "seconds": round(time.perf_counter() - start, 1),
    }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def summarise(entry: dict) -> dict:
    """Over the trainings present, paired by training: per N with experts, the expert, the monolith and
    monolith − expert (mean over inner t and clusters; and by t); per N the monolith alone; and each monolith against
    the experts of the largest N whose coefficients all together are no more than its own (``equal_coefficients``)."""
    full: dict[int, dict[int, dict]] = {}
    mono: dict[int, dict[int, dict]] = {}
    for r in entry["records"]:
        if r.get("experts", True):
            full.setdefault(r["features"], {})[r["training"]] = r
        mono.setdefault(r["features"], {})[r["training"]] = r

    def side(r: dict, who: str, i: int | None = None) -> float:
        cl = r["per_cluster"].values()
        return _mean([c[who][i] if i is not None else _mean(c[who]) for c in cl])

    rows = {}
    for n, runs in sorted(full.items()):
        trainings = sorted(runs)
        row = {"trainings": trainings}
        for who in ("expert", "monolith"):
            row[who] = interval([side(runs[i], who) for i in trainings])
        row["gap"] = interval([side(runs[i], "monolith") - side(runs[i], "expert") for i in trainings])
        row["gap_by_t"] = [
            interval([side(runs[i], "monolith", j) - side(runs[i], "expert", j) for i in trainings])
            for j in range(len(INNER))
        ]
        if n == 0:
            r = runs[trainings[0]]
            row["closed_form"] = {w: side(r, f"{w}_closed_form") for w in ("expert", "monolith")}
        rows[str(n)] = row
    monolith = {str(n): interval([side(runs[i], "monolith") for i in sorted(runs)]) for n, runs in sorted(mono.items())}
    equal = []
    for n_m, runs in sorted(mono.items()):
        own = next(iter(runs.values()))["coefficients"]["monolith"]
        fewer = [n for n, r in full.items() if next(iter(r.values()))["coefficients"]["experts_together"] <= own]
        if not fewer:
            continue
        n_e = max(fewer)
        trainings = sorted(set(runs) & set(full[n_e]))
        equal.append(
            {
                "monolith_features": n_m,
                "expert_features": n_e,
                "monolith_coefficients": own,
                "experts_coefficients": next(iter(full[n_e].values()))["coefficients"]["experts_together"],
                "trainings": trainings,
                "monolith_minus_expert": interval(
                    [side(runs[i], "monolith") - side(full[n_e][i], "expert") for i in trainings]
                ),
            }
        )
    return {"name": entry["name"], "rows": rows, "monolith": monolith, "equal_coefficients": equal}


def _cell(iv: dict, sign: str = "") -> str:
    return f"{iv['mean']:{sign}.4g}" + (f" ± {iv['half']:.2g}" if iv["n"] > 1 else "")


def render(entry: dict, summary: dict) -> str:
    head = entry["meta"]
    lines = [
        f"# gmm_class_floor: {entry['name']}",
        "",
        f"`{head['command']}` (the last command; each record names its own commit, machine and date); "
        f"{head['machine']}; commit {head['commit']}; {head['date']}.",
        "",
        "Excess loss over Bayes per dimension of the class's least-squares fit on fresh exact-velocity draws, held "
        "out: above the class's optimum by about P/M (P coefficients per output, M draws), which the intervals do "
        "not include. Mean over the inner t and the clusters; ± : 95 % Student-t half-width over trainings (feature "
        "and draw seeds; the scoring draws are the same in every training).",
        "",
        "| N features | trainings | expert | monolith | monolith − expert | by t ("
        + ", ".join(map(str, INNER))
        + ") |",
        "|---|---|---|---|---|---|",
    ]
    for n, row in summary["rows"].items():
        by_t = " / ".join(f"{g['mean']:+.4g}" for g in row["gap_by_t"])
        lines.append(
            f"| {n} | {len(row['trainings'])} | {_cell(row['expert'])} | {_cell(row['monolith'])} | "
            f"{_cell(row['gap'], '+')} | {by_t} |"
        )
    lines += ["", "The monolith alone, by N: " + ", ".join(f"{n}: {_cell(v)}" for n, v in summary["monolith"].items())]
    for e in summary["equal_coefficients"]:
        lines.append(
            f"- the monolith at N = {e['monolith_features']} ({e['monolith_coefficients']} coefficients per output) − "
            f"the experts at N = {e['expert_features']} ({e['experts_coefficients']} together): "
            f"{_cell(e['monolith_minus_expert'], '+')}"
        )
    if "0" in summary["rows"]:
        cf = summary["rows"]["0"]["closed_form"]
        lines += ["", f"Closed form at N = 0: expert {cf['expert']:.4g}, monolith {cf['monolith']:.4g}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True)
    p.add_argument("--set", default="", help='overrides, as the capacity pilot\'s --set: "data.gmm_rank=8 …"')
    p.add_argument("--clusters", type=int, nargs="+", required=True)
    p.add_argument("--features", type=int, nargs="*", default=[], help="N: the random features of each network")
    p.add_argument("--monolith-only", type=int, nargs="*", default=[], help="N at which only the monolith is fitted")
    p.add_argument("--training", type=int, nargs="+", default=[0])
    p.add_argument("--draws-per-feature", type=int, default=32, help="M / P: fitting draws per coefficient")
    p.add_argument("--samples", type=int, default=2048, help="scoring x_t per cluster and t")
    p.add_argument("--input-scale", type=float, default=1.0, help="× the standardised x_t the features see")
    p.add_argument("--name", required=True)
    p.add_argument("--replace", action="store_true", help="refit records already in the results file")
    p.add_argument("--results", default=str(OUT), help="the records' file; the summaries are written beside it")
    args = p.parse_args(argv)
    if not args.input_scale > 0:
        p.error(f"--input-scale {args.input_scale}: must be > 0")
    if min(args.features + args.monolith_only, default=0) < 0 or args.draws_per_feature < 2:
        p.error("--features and --monolith-only must be ≥ 0 and --draws-per-feature ≥ 2")
    cfg = load_config(args.config, parse_overrides(args.set))
    if cfg.data.name != "gmm":
        p.error(f"{args.config}: data.name is {cfg.data.name!r}; the class floor needs the Gaussian mixture (gmm)")
    if cfg.data.gmm_captions != "pattern":  # a colour caption names a component of every cluster, not one
        p.error(f"data.gmm_captions is {cfg.data.gmm_captions!r}; the class floor needs one caption per component")
    ref = load_reference(prepare_data(cfg))
    if bad := [k for k in args.clusters if not 0 <= k < ref.num_clusters]:
        p.error(f"--clusters {bad}: the mixture has clusters 0–{ref.num_clusters - 1}")
    args.eval_seed = cfg.evaluation.seed
    path = Path(args.results)
    store = json.loads(path.read_text()) if path.exists() else {}
    entry = store.get(args.name) or {"name": args.name, "clusters": args.clusters, "records": []}
    same = {
        "config": args.config,
        "set": args.set,
        "clusters": args.clusters,
        "samples": args.samples,
        "draws_per_feature": args.draws_per_feature,
    } | ({"input_scale": args.input_scale} if args.input_scale != 1.0 else {})
    if entry.get("setting", same) != same:
        p.error(f"--name {args.name}: its records were fitted with {entry['setting']}; use another name")
    entry["setting"] = same
    done = {(r["features"], r["training"]): r.get("experts", True) for r in entry["records"]}
    todo = [(n, True) for n in args.features] + [(n, False) for n in args.monolith_only if n not in args.features]
    for training in args.training:
        for n, experts in todo:
            if (n, training) in done and (done[n, training] or not experts) and not args.replace:
                continue  # a record with experts holds the monolith too
            r = record(ref, args.clusters, n, training, args, experts)
            r |= stamp()
            entry["records"] = [x for x in entry["records"] if (x["features"], x["training"]) != (n, training)] + [r]
            store[args.name] = entry
            write_result(path, store)  # after each record: an interrupted run keeps what it fitted
            print(f"N={n} training {training}: {r['seconds']} s", file=sys.stderr, flush=True)
    command = ["python", "-m", "benchmarks.gmm_class_floor", *(sys.argv[1:] if argv is None else argv)]
    entry["meta"] = {"command": shlex.join(command)} | stamp()
    store[args.name] = entry
    write_result(path, store)
    summary = summarise(entry)
    write_result(path.parent / f"gmm_class_floor-{args.name}.json", summary)  # beside the records they summarise
    (path.parent / f"gmm_class_floor-{args.name}.md").write_text(render(entry, summary))
    return summary


if __name__ == "__main__":
    main()
