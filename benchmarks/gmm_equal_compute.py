"""Experts against a monolith of equal compute, trained: one network of any width (as wide as the experts together,
say) against the trained experts of :mod:`benchmarks.gmm_trained_floor`, on every cluster, its budgets counted in
the experts' training compute.

The monolith is the trained floor's (:func:`benchmarks.gmm_trained_floor.train`: the class floor's two-layer network
of N hidden units, every weight trained from its least-squares start by Adam with a cosine decay, fresh draws of every
component), with the seeds and the setting of the experts' entry: config, overrides, learning rate, batch, the start's
fit and the scoring draws are read from it, so the two sides cannot differ in them, except that ``--lr`` can give the
monolith a learning rate of its own (its entry's setting names it). At the experts' learning rate the record at N and
budget S is the monolith that ``gmm_trained_floor`` trains at N and S. It is scored on every cluster's scoring draws,
the clusters weighted by their shares of the mixture as the experts' entry weighs its experts (each on its own
cluster).

Compute is counted in multiply-adds of a training step on one draw (:func:`training_macs`; the batch is the same on
both sides, and the exact velocities the draws are scored against are the data, not counted), so the monolith's budget
over the experts' together is ``S·macs(monolith) / (S_e·Σ_k macs(expert k))``. The two sides are independent trainings
(a training index seeds each side's own features and draws), so their intervals are separate and the ratio is given
over every pair of trainings.

    python -m benchmarks.gmm_equal_compute --experts clu-r8-every --expert-features 16 --expert-steps 2000 \\
        --features 128 --times 0.1 0.5 0.9 --steps 2000 8000 --training 0 1 2 --name clu-r8-128

appends one record per (training, N, t, budget) to ``benchmarks/results/gmm_equal_compute.json`` (a record already
there is kept) and writes ``gmm_equal_compute-NAME.{md,json}`` beside it, the summary over the trainings present.
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

from benchmarks import gmm_trained_floor as floor
from benchmarks.common import RESULTS, stamp, write_result
from benchmarks.gmm_class_floor import INNER
from hddm_flower.config.io import load_config, parse_overrides
from hddm_flower.gmm.dataset import load_reference
from hddm_flower.gmm.truth import interval
from hddm_flower.gmm.yardsticks import width_floor
from hddm_flower.stages.prepare import prepare_data

OUT = RESULTS / "gmm_equal_compute.json"


def training_macs(d: int, n: int, captions: int) -> int:
    """Multiply-adds of one training step of the trained floor's network on one draw of dimension d, as autograd
    computes it: forward through the first layer (d × n) and the output layer over [x, the caption's one-hot, the
    hidden units] ((d + captions + n) × d); backward, each layer's weight gradient (the same again) and the output
    layer's input gradient (once more the output layer's; the input x needs none)."""
    return 2 * d * n + 3 * (d + captions + n) * d


def compute_ratio(ref, n: int, steps: int, expert_n: int, expert_steps: int) -> float:
    """The monolith's training compute (N = ``n`` over every component, ``steps`` steps) over that of the experts of
    every cluster together (``expert_n`` units over their cluster's components, ``expert_steps`` steps each)."""
    d = int(math.prod(ref.shape))
    experts = sum(training_macs(d, expert_n, int((ref.cluster_of == k).sum())) for k in range(ref.num_clusters))
    return steps * training_macs(d, n, len(ref.cluster_of)) / (expert_steps * experts)


def record(ref, n: int, t: float, steps: int, training: int, args) -> dict:
    """One monolith of N = ``n`` at t and budget ``steps``, scored on every cluster (trained and at its start), with
    its training loss over its last tenth."""
    begin = time.perf_counter()
    start, mono, loss = floor.train(
        ref, torch.arange(len(ref.cluster_of)), t, n, floor.fit_seed(training, n, t), steps, args
    )
    nets = {"monolith": mono, "monolith_start": start}
    per_cluster = {str(k): floor.scored(ref, k, t, nets, args) for k in range(ref.num_clusters)}
    return {
        "features": n,
        "t": t,
        "steps": steps,
        "training": training,
        "per_cluster": per_cluster,
        "training_loss": loss,
        "seconds": round(time.perf_counter() - begin, 1),
    }


def below(mono: list[tuple[float, float]], experts: list[tuple[float, float]]) -> str:
    """Which side is below the other in every pair of trainings even with two standard errors of each (value, standard
    error) moved towards the other: "experts below", "monolith below" or "neither"."""
    pairs = [(m, e) for m in mono for e in experts]
    if all(m - 2 * ms > e + 2 * es for (m, ms), (e, es) in pairs):
        return "experts below"
    if all(m + 2 * ms < e - 2 * es for (m, ms), (e, es) in pairs):
        return "monolith below"
    return "neither"


def summarise(entry: dict, experts: dict) -> dict:
    """Per (N, t, budget): the monolith's weighted held-out excess over its trainings, the experts' at the same t over
    theirs, the ratio of the means and its range over every pair of trainings, which side is below in every pair
    even with two standard errors of each moved towards the other, the monolith's training loss beside its width
    floor, and the compute ratio."""
    weights, setting = experts["cluster_weights"], entry["setting"]
    exp_runs: dict[float, dict[int, tuple[float, float]]] = {}
    for r in experts["records"]:
        if (r["features"], r["steps"]) == (setting["expert_features"], setting["expert_steps"]):
            exp_runs.setdefault(r["t"], {})[r["training"]] = floor.weighted(r["per_cluster"], "expert", weights)
    runs: dict[tuple, dict[int, dict]] = {}
    for r in entry["records"]:
        runs.setdefault((r["features"], r["t"], r["steps"]), {})[r["training"]] = r
    rows = []
    for (n, t, s), by in sorted(runs.items()):
        if not (exp := exp_runs.get(t)):
            continue
        mono = {i: floor.weighted(r["per_cluster"], "monolith", weights) for i, r in sorted(by.items())}
        pairs = [(m, e) for m in mono.values() for e in exp.values()]
        row = {"features": n, "t": t, "steps": s, "trainings": sorted(by), "expert_trainings": sorted(exp)}
        row["compute_ratio"] = entry["compute_ratio"][f"{n}@{s}"]
        row["monolith"] = interval([m for m, _ in mono.values()])
        row["experts"] = interval([e for e, _ in exp.values()])
        row["ratio_of_means"] = row["monolith"]["mean"] / row["experts"]["mean"]
        row["ratio_every_pair"] = {
            "min": min(m / e for (m, _), (e, _) in pairs),
            "max": max(m / e for (m, _), (e, _) in pairs),
        }
        row["below_in_every_pair_with_2se"] = below(list(mono.values()), list(exp.values()))
        row["per_training"] = {str(i): {"monolith": m, "monolith_se": se} for i, (m, se) in mono.items()}
        row["experts_per_training"] = {str(i): {"experts": e, "experts_se": se} for i, (e, se) in exp.items()}
        row["monolith_training_loss"] = interval([r["training_loss"] for r in by.values()])
        row["monolith_width_floor"] = entry["width_floor"][f"{n}@{t}"]
        rows.append(row)
    return {"name": entry["name"], "experts": setting["experts"], "rows": rows}


def _cell(iv: dict) -> str:
    return f"{1e3 * iv['mean']:.4g}" + (f" ± {1e3 * iv['half']:.2g}" if iv["n"] > 1 else "")


def render(entry: dict, summary: dict) -> str:
    head, setting = entry["meta"], entry["setting"]
    lines = [
        f"# Experts against a monolith of equal compute, trained: {entry['name']}",
        "",
        f"Every record of this name, summarised by `{head['command']}` (the last command; it trains only the records "
        f"it does not find, and each record names its own commit) — {head['machine']}, commit {head['commit']}, "
        f"{head['date']}.",
        "",
        f"Experts: entry `{setting['experts']}` of gmm_trained_floor.json, {setting['expert_features']} hidden units, "
        f"{setting['expert_steps']} steps each, each scored on its own cluster. Excess over the exact velocity, "
        "×10⁻³ per dimension, held out on every cluster's scoring draws, weighted by the clusters' shares of the "
        "mixture; ± is the 95 % Student-t half-width over each side's own trainings (independent of the other "
        "side's); the ratio is given over every pair of trainings. Compute: the monolith's training multiply-adds "
        "over the experts' together.",
        "",
        "| N | t | steps | compute / experts' | monolith | experts | monolith / experts (every pair) "
        "| below in every pair, 2 SE | monolith's training loss (width floor) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary["rows"]:
        pair = r["ratio_every_pair"]
        lines.append(
            f"| {r['features']} | {r['t']} | {r['steps']:,} | {r['compute_ratio']:.2f} | {_cell(r['monolith'])} "
            f"| {_cell(r['experts'])} | {r['ratio_of_means']:.3g} ({pair['min']:.3g}–{pair['max']:.3g}) "
            f"| {r['below_in_every_pair_with_2se']} | {_cell(r['monolith_training_loss'])} "
            f"({1e3 * r['monolith_width_floor']:.3g}) |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--experts", required=True, help="the experts' entry in gmm_trained_floor.json (every cluster)")
    p.add_argument("--expert-features", type=int, required=True, help="the experts' hidden units")
    p.add_argument("--expert-steps", type=int, required=True, help="the experts' budget: Adam steps each")
    p.add_argument("--features", type=int, nargs="+", required=True, help="N: the monolith's hidden units")
    p.add_argument("--times", type=float, nargs="+", required=True, help=f"t, of the inner ones {INNER}")
    p.add_argument("--steps", type=int, nargs="+", required=True, help="the monolith's budgets: Adam steps")
    p.add_argument("--training", type=int, nargs="+", default=[0])
    p.add_argument("--lr", type=float, help="the monolith's Adam learning rate (default: the experts')")
    p.add_argument("--name", required=True)
    p.add_argument("--experts-file", default=str(floor.OUT), help="gmm_trained_floor's records")
    p.add_argument("--results", default=str(OUT), help="the records' file; the summaries are written beside it")
    args = p.parse_args(argv)
    if bad := [t for t in args.times if t not in INNER]:
        p.error(f"--times {bad}: t must be one of the inner times {INNER}")
    if min(args.features) < 1 or min(args.steps) < 1:
        p.error("--features and --steps must be ≥ 1")
    if args.lr is not None and not args.lr > 0:
        p.error(f"--lr {args.lr}: must be > 0")
    experts_file = Path(args.experts_file)
    if not experts_file.exists():
        p.error(f"--experts-file {experts_file}: no such file")
    experts = json.loads(experts_file.read_text()).get(args.experts)
    if experts is None:
        p.error(f"--experts {args.experts}: no such entry in {experts_file}")
    if "cluster_weights" not in experts:
        p.error(f"--experts {args.experts}: its records do not score every cluster")
    have = {
        (r["t"], r["training"])
        for r in experts["records"]
        if (r["features"], r["steps"]) == (args.expert_features, args.expert_steps)
    }
    if missing := sorted({t for t in args.times if not any(tt == t for tt, _ in have)}):
        p.error(
            f"--experts {args.experts}: no records at N = {args.expert_features}, {args.expert_steps} steps and t {missing}"
        )
    trained = experts["setting"]
    cfg = load_config(trained["config"], parse_overrides(trained["set"]))
    ref = load_reference(prepare_data(cfg))
    args.lr = trained["lr"] if args.lr is None else args.lr
    args.batch, args.samples = trained["batch"], trained["samples"]
    args.draws_per_feature, args.eval_seed = trained["draws_per_feature"], cfg.evaluation.seed
    path = Path(args.results)
    store = json.loads(path.read_text()) if path.exists() else {}
    entry = store.get(args.name) or {"name": args.name, "records": []}
    same = {"experts": args.experts, "expert_features": args.expert_features, "expert_steps": args.expert_steps}
    same |= {k: v for k, v in trained.items() if k != "clusters"} | {"lr": args.lr}
    if entry.get("setting", same) != same:
        p.error(f"--name {args.name}: its records were trained with {entry['setting']}; use another name")
    entry["setting"] = same
    done = {(r["features"], r["t"], r["steps"], r["training"]) for r in entry["records"]}
    for training in args.training:
        for n in args.features:
            for t in args.times:
                for steps in args.steps:
                    if (n, t, steps, training) in done:
                        continue
                    entry["records"].append(record(ref, n, t, steps, training, args) | stamp())
                    done.add((n, t, steps, training))  # a value given twice trains once
                    store[args.name] = entry
                    write_result(path, store)  # after each record: an interrupted run keeps what it trained
                    print(
                        f"N={n} t={t} steps={steps} training {training}: {entry['records'][-1]['seconds']} s",
                        file=sys.stderr,
                        flush=True,
                    )
    every = torch.arange(len(ref.cluster_of))
    keys = sorted({(r["features"], r["t"], r["steps"]) for r in entry["records"]})
    entry["width_floor"] = {f"{n}@{t}": width_floor(ref.mixture, every, (t,), n)[0] for n, t, _ in keys}
    entry["compute_ratio"] = {
        f"{n}@{s}": compute_ratio(ref, n, s, args.expert_features, args.expert_steps) for n, _, s in keys
    }
    command = ["python", "-m", "benchmarks.gmm_equal_compute", *(sys.argv[1:] if argv is None else argv)]
    entry["meta"] = {"command": shlex.join(command)} | stamp()
    store[args.name] = entry
    write_result(path, store)
    summary = summarise(entry, experts)
    write_result(path.parent / f"gmm_equal_compute-{args.name}.json", summary)
    (path.parent / f"gmm_equal_compute-{args.name}.md").write_text(render(entry, summary))
    return summary


if __name__ == "__main__":
    main()
