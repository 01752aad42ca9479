"""Capacity at convergence, where convergence can be computed: on the Gaussian mixture, one denoiser for every
caption against an expert of one cluster, each the global optimum of the same class of a known size.

At each t the class is ``v̂(x, c) = A·x + b_c + W·relu(R·x̃ + q_c + β)``: an affine map whose gain A is shared by
every caption and whose shift b_c is the caption's own, plus N random ReLU features of the standardised ``x̃`` and the
caption (R, q, β drawn once from a seed and frozen: a two-layer network whose first layer is not trained). Only A,
b and W are fitted, by least squares against the exact velocity on fresh draws of the network's components (a caption
names one component; no caption dropout): a convex problem, so the fit *is* the class's optimum, up to the finite
draws (about 1 + P/M on the held-out excess for P coefficients per output and M draws; ``--draws-per-feature``
sets M/P). With N = 0 the optimum is known in closed form — the pooled level of the components fitted on
(:func:`hddm_flower.gmm.yardsticks.affine_floor`) — which checks the fit; with N → ∞ the class holds any velocity.

The monolith is fitted on all components, an expert on its cluster's, each with N features; both are scored on the
expert's cluster with the draws the capacity pilot scores its networks on (``benchmarks.gmm_ladder.cluster_draws``),
at the inner t (at t = 0 and 1 the velocity is affine and every fit exact). A *training* draws the features and the
fitting draws from its own seed; the ± of the summary is over trainings.

    python -m benchmarks.gmm_class_floor --config configs/reproduce-gmm-nano.yaml \\
        --set "data.gmm_covariance=cluster data.gmm_rank=8" --clusters 0 3 4 --features 0 64 256 512 2048 \\
        --training 0 --name clu-r8

appends one record per (training, N) to ``benchmarks/results/gmm_class_floor.json`` (a record already there is
kept, unless ``--replace``) and writes ``gmm_class_floor-NAME.{md,json}``, the summary over the trainings present.
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

from benchmarks.common import RESULTS, commit, machine, write_result
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


def fit(ref: GMMReference, members: Tensor, t: float, n: int, seed: int, draws_per_feature: int, chunk: int = 4096):
    """The least-squares optimum of the class with ``n`` features over ``members`` at time t (fresh draws of them
    by their weights, seeded by ``seed``; M = ``draws_per_feature`` × P), and the fit's in-sample excess."""
    g = torch.Generator().manual_seed(seed)
    velocity = component_velocity(ref, t, members)

    def rows(m: int) -> tuple[Tensor, Tensor, Tensor]:
        x0, comps = draw_x0(ref, members, m, g)
        x = (1 - t) * x0 + t * torch.randn(x0.shape, generator=g, dtype=f64)
        return x, comps, velocity(x, comps)

    x, comps, v = rows(chunk)
    features = Features(members, ref.mixture.dim, n, seed + 1, x.mean(0), float(x.std()))
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
    """The excess per dimension of ``net`` on cluster k at each inner t (the capacity pilot's draws)."""
    out = []
    for _, t, x_t, _, _, comps, v_star in cluster_draws(ref, k, samples, seed):
        if t in INNER:
            x = x_t.reshape(samples, -1)
            out.append(float(((net[t](x, comps) - v_star.reshape(samples, -1)) ** 2).mean()))
    return out


def record(ref, clusters: list[int], n: int, training: int, args) -> dict:
    """One training at N = ``n``: per cluster the expert's and the monolith's excess by inner t, and the fits'
    in-sample excess; at N = 0 the closed forms beside them."""
    every = torch.arange(len(ref.cluster_of))
    base = 1_000_003 * training + 7919 * n
    start = time.perf_counter()
    mono, in_sample = {}, {"monolith": [], **{str(k): [] for k in clusters}}
    for i, t in enumerate(INNER):
        mono[t], e = fit(ref, every, t, n, base + 101 * i, args.draws_per_feature)
        in_sample["monolith"].append(e)
    per_cluster = {}
    for k in clusters:
        members = (ref.cluster_of == k).nonzero().squeeze(1)
        expert = {}
        for i, t in enumerate(INNER):
            expert[t], e = fit(ref, members, t, n, base + 101 * i + 13 * (k + 1), args.draws_per_feature)
            in_sample[str(k)].append(e)
        per_cluster[str(k)] = {
            "expert": excess(expert, ref, k, args.samples, args.eval_seed),
            "monolith": excess(mono, ref, k, args.samples, args.eval_seed),
        }
        if n == 0:
            per_cluster[str(k)] |= {
                "expert_closed_form": affine_floor(ref.mixture, members, members, INNER),
                "monolith_closed_form": affine_floor(ref.mixture, every, members, INNER),
            }
    return {
        "features": n,
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
    """Per N, over the trainings present: expert, monolith and monolith − expert (mean over inner t and clusters),
    the monolith at 8N against the experts at N (equal parameters in all) where both were fitted, per-t gaps."""
    by_n: dict[int, dict[int, dict]] = {}
    for r in entry["records"]:
        by_n.setdefault(r["features"], {})[r["training"]] = r

    def side(r: dict, who: str, i: int | None = None) -> float:
        cl = r["per_cluster"].values()
        return _mean([c[who][i] if i is not None else _mean(c[who]) for c in cl])

    rows = {}
    for n, runs in sorted(by_n.items()):
        trainings = sorted(runs)
        row = {"trainings": trainings}
        for who in ("expert", "monolith"):
            row[who] = interval([side(runs[i], who) for i in trainings])
        row["gap"] = interval([side(runs[i], "monolith") - side(runs[i], "expert") for i in trainings])
        row["gap_by_t"] = [
            interval([side(runs[i], "monolith", j) - side(runs[i], "expert", j) for i in trainings])
            for j in range(len(INNER))
        ]
        row["clusters_monolith_worse"] = [
            sum(_mean(c["monolith"]) > _mean(c["expert"]) for c in runs[i]["per_cluster"].values()) for i in trainings
        ]
        if n and 8 * n in by_n and set(trainings) <= set(by_n[8 * n]):
            big = by_n[8 * n]
            row["monolith_8n_minus_expert"] = interval(
                [side(big[i], "monolith") - side(runs[i], "expert") for i in trainings]
            )
        if n == 0:
            r = runs[trainings[0]]
            row["closed_form"] = {w: side(r, f"{w}_closed_form") for w in ("expert", "monolith")}
        rows[str(n)] = row
    return {"name": entry["name"], "rows": rows}


def _cell(iv: dict, sign: str = "") -> str:
    return f"{iv['mean']:{sign}.4g}" + (f" ± {iv['half']:.2g}" if iv["n"] > 1 else "")


def render(entry: dict, summary: dict) -> str:
    head = entry["meta"]
    lines = [
        f"# gmm_class_floor: {entry['name']}",
        "",
        f"`{head['command']}`; {head['machine']}; commit {head['commit']}; {head['date']}.",
        "",
        "Excess loss over Bayes per dimension at the class's optimum (least squares on fresh exact-velocity draws), "
        "mean over the inner t and the clusters; ± : 95 % Student-t half-width over trainings (feature and draw "
        "seeds). `monolith(8N) − expert(N)`: the monolith with 8× the features, as many as the 8 experts together.",
        "",
        "| N features | trainings | expert | monolith | monolith − expert | by t ("
        + ", ".join(map(str, INNER))
        + ") | clusters where the monolith is worse | monolith(8N) − expert(N) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, row in summary["rows"].items():
        eq = _cell(row["monolith_8n_minus_expert"], "+") if "monolith_8n_minus_expert" in row else ""
        by_t = " / ".join(f"{g['mean']:+.4g}" for g in row["gap_by_t"])
        lines.append(
            f"| {n} | {len(row['trainings'])} | {_cell(row['expert'])} | {_cell(row['monolith'])} | "
            f"{_cell(row['gap'], '+')} | {by_t} | "
            f"{', '.join(map(str, row['clusters_monolith_worse']))} of {len(entry['clusters'])} | {eq} |"
        )
    if "0" in summary["rows"]:
        cf = summary["rows"]["0"]["closed_form"]
        lines += [
            "",
            f"Closed form at N = 0 (the pooled levels): expert {cf['expert']:.4f}, monolith {cf['monolith']:.4f}.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True)
    p.add_argument("--set", default="", help='overrides, as the capacity pilot\'s --set: "data.gmm_rank=8 …"')
    p.add_argument("--clusters", type=int, nargs="+", required=True)
    p.add_argument("--features", type=int, nargs="+", required=True, help="N: the random features of each network")
    p.add_argument("--training", type=int, nargs="+", default=[0])
    p.add_argument("--draws-per-feature", type=int, default=32, help="M / P: fitting draws per coefficient")
    p.add_argument("--samples", type=int, default=2048, help="scoring x_t per cluster and t")
    p.add_argument("--name", required=True)
    p.add_argument("--replace", action="store_true", help="refit records already in the results file")
    p.add_argument("--results", default=str(OUT))
    args = p.parse_args(argv)
    if min(args.features) < 0 or args.draws_per_feature < 2:
        p.error("--features must be ≥ 0 and --draws-per-feature ≥ 2")
    cfg = load_config(args.config, parse_overrides(args.set))
    if cfg.data.name != "gmm":
        p.error(f"{args.config}: data.name is {cfg.data.name!r}; the class floor needs the Gaussian mixture (gmm)")
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
    }
    if entry.get("setting", same) != same:
        p.error(f"--name {args.name}: its records were fitted with {entry['setting']}; use another name")
    entry["setting"] = same
    done = {(r["features"], r["training"]) for r in entry["records"]}
    for training in args.training:
        for n in args.features:
            if (n, training) in done and not args.replace:
                continue
            r = record(ref, args.clusters, n, training, args)
            r |= {"machine": machine(), "commit": commit(), "date": time.strftime("%Y-%m-%d")}
            entry["records"] = [x for x in entry["records"] if (x["features"], x["training"]) != (n, training)] + [r]
            store[args.name] = entry
            write_result(path, store)  # after each record: an interrupted run keeps what it fitted
            print(f"N={n} training {training}: {r['seconds']} s", file=sys.stderr, flush=True)
    entry["meta"] = {
        "command": shlex.join(
            ["python", "-m", "benchmarks.gmm_class_floor", *(sys.argv[1:] if argv is None else argv)]
        ),
        "machine": machine(),
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d"),
    }
    store[args.name] = entry
    write_result(path, store)
    summary = summarise(entry)
    write_result(RESULTS / f"gmm_class_floor-{args.name}.json", summary)
    (RESULTS / f"gmm_class_floor-{args.name}.md").write_text(render(entry, summary))
    return summary


if __name__ == "__main__":
    main()
