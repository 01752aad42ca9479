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
``--equal-compute`` in place of ``--expert-steps`` compares each monolith budget with the experts' budget of the
same compute (to 0.1 %; a budget the experts' entry lacks is refused, naming the steps to train). A monolith is the
same network whichever experts it is set against, so with ``--equal-compute`` a record another entry trained in the
same setting (but for the experts) is adopted, not trained again; it names the entry it came from and keeps its own
stamp. Without it every record is trained by its own entry, so an entry can reproduce another's.
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
from benchmarks.common import RESULTS, add_record, results_file, stamp, write_result
from benchmarks.gmm_class_floor import INNER
from benchmarks.gmm_trained_floor import key_of
from hddm_flower.config.io import load_config, parse_overrides
from hddm_flower.gmm.dataset import load_reference
from hddm_flower.gmm.truth import interval
from hddm_flower.gmm.yardsticks import width_floor
from hddm_flower.stages.prepare import prepare_data

OUT = RESULTS / "gmm_equal_compute.json"
EQUAL = "equal compute"  # the experts' budget, per monolith budget, when it is not one for every row
EXPERTS_ONLY = ("experts", "expert_features", "expert_steps")  # the setting's keys no monolith record depends on


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


def equal_budget(ref, n: int, steps: int, expert_n: int, budgets) -> int | None:
    """Of the experts' ``budgets``, the one whose compute is the monolith's (N = ``n``, ``steps`` steps) to 0.1 %, the
    nearest if several are; None if none is."""
    near = {b: abs(compute_ratio(ref, n, steps, expert_n, b) - 1) for b in budgets}
    fits = sorted((gap, b) for b, gap in near.items() if gap < 1e-3)
    return fits[0][1] if fits else None


def adoptable(store: dict, setting: dict, key: tuple) -> tuple[str, dict] | None:
    """A record at ``key`` (N, t, steps, training) trained by another entry of ``store`` in the same setting but for
    the experts it was set against, with the entry's name; None if there is none."""
    mine = {k: v for k, v in setting.items() if k not in EXPERTS_ONLY}
    for name, other in store.items():
        if {k: v for k, v in other.get("setting", {}).items() if k not in EXPERTS_ONLY} != mine:
            continue
        for r in other["records"]:
            if key_of(r) == key and "adopted_from" not in r:
                return name, r
    return None


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
    exp_runs: dict[tuple[float, int], dict[int, tuple[float, float]]] = {}
    for r in experts["records"]:
        if r["features"] == setting["expert_features"]:
            exp_runs.setdefault((r["t"], r["steps"]), {})[r["training"]] = floor.weighted(
                r["per_cluster"], "expert", weights
            )
    runs: dict[tuple, dict[int, dict]] = {}
    for r in entry["records"]:
        runs.setdefault((r["features"], r["t"], r["steps"]), {})[r["training"]] = r
    rows, equal = [], setting["expert_steps"] == EQUAL
    for (n, t, s), by in sorted(runs.items()):
        budget = entry["expert_budget"][f"{n}@{s}"] if equal else setting["expert_steps"]
        if not (exp := exp_runs.get((t, budget))):
            continue
        mono = {i: floor.weighted(r["per_cluster"], "monolith", weights) for i, r in sorted(by.items())}
        pairs = [(m, e) for m in mono.values() for e in exp.values()]
        row = {"features": n, "t": t, "steps": s, "trainings": sorted(by), "expert_trainings": sorted(exp)}
        row |= {"expert_steps": budget} if equal else {}
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
    each = f"{setting['expert_steps']} steps" if setting["expert_steps"] != EQUAL else "the steps in brackets"
    lines = [
        f"# Experts against a monolith of equal compute, trained: {entry['name']}",
        "",
        f"Every record of this name, summarised by `{head['command']}` (the last command; it trains only the records "
        f"it does not find, and each record names its own commit) — {head['machine']}, commit {head['commit']}, "
        f"{head['date']}.",
        "",
        f"Experts: entry `{setting['experts']}` of gmm_trained_floor.json, {setting['expert_features']} hidden units, "
        f"{each} each, each scored on its own cluster. Excess over the exact velocity, "
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
        pair, steps = r["ratio_every_pair"], f" ({r['expert_steps']:,})" if "expert_steps" in r else ""
        lines.append(
            f"| {r['features']} | {r['t']} | {r['steps']:,} | {r['compute_ratio']:.2f} | {_cell(r['monolith'])} "
            f"| {_cell(r['experts'])}{steps} | {r['ratio_of_means']:.3g} ({pair['min']:.3g}–{pair['max']:.3g}) "
            f"| {r['below_in_every_pair_with_2se']} | {_cell(r['monolith_training_loss'])} "
            f"({1e3 * r['monolith_width_floor']:.3g}) |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--experts", required=True, help="the experts' entry in gmm_trained_floor.json (every cluster)")
    p.add_argument("--expert-features", type=int, required=True, help="the experts' hidden units")
    budget = p.add_mutually_exclusive_group(required=True)
    budget.add_argument("--expert-steps", type=int, help="the experts' budget: Adam steps each")
    budget.add_argument(
        "--equal-compute", action="store_true", help="each monolith budget against the experts' of the same compute"
    )
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
    have = {(r["t"], r["steps"]) for r in experts["records"] if r["features"] == args.expert_features}
    trained = experts["setting"]
    cfg = load_config(trained["config"], parse_overrides(trained["set"]))
    ref = load_reference(prepare_data(cfg))
    budgets = {}  # the experts' budget set against each monolith budget
    for n in args.features:
        for s in args.steps:
            b = equal_budget(ref, n, s, args.expert_features, {b for _, b in have}) if args.equal_compute else None
            if args.equal_compute and b is None:
                need = max(1, round(compute_ratio(ref, n, s, args.expert_features, 1)))  # the budget of ratio 1
                advice = (
                    f"train the experts for {need} steps"
                    if equal_budget(ref, n, s, args.expert_features, {need})
                    else "no whole number of the experts' steps is within 0.1 % of it; give the monolith other steps"
                )
                p.error(
                    f"--experts {args.experts}: no budget of N = {args.expert_features} of the compute of N = {n} "
                    f"at {s} steps; {advice}"
                )
            budgets[f"{n}@{s}"] = args.expert_steps if b is None else b
    for b in sorted(set(budgets.values())):
        if missing := sorted({t for t in args.times if (t, b) not in have}):
            p.error(f"--experts {args.experts}: no records at N = {args.expert_features}, {b} steps and t {missing}")
    args.lr = trained["lr"] if args.lr is None else args.lr
    args.batch, args.samples = trained["batch"], trained["samples"]
    args.draws_per_feature, args.eval_seed = trained["draws_per_feature"], cfg.evaluation.seed
    path = Path(args.results)
    store = json.loads(path.read_text()) if path.exists() else {}
    entry = store.get(args.name) or {"name": args.name, "records": []}
    same = {"experts": args.experts, "expert_features": args.expert_features}
    same |= {"expert_steps": EQUAL if args.equal_compute else args.expert_steps}
    same |= {k: v for k, v in trained.items() if k != "clusters"} | {"lr": args.lr}
    if entry.get("setting", same) != same:
        p.error(f"--name {args.name}: its records were trained with {entry['setting']}; use another name")
    entry["setting"] = same
    done = {key_of(r) for r in entry["records"]}
    for training in args.training:
        for n in args.features:
            for t in args.times:
                for steps in args.steps:
                    if (key := (n, t, steps, training)) in done:
                        continue
                    if args.equal_compute and (found := adoptable(store, same, key)):
                        new, said = found[1] | {"adopted_from": found[0]}, f"adopted from {found[0]}"
                    else:
                        new = record(ref, n, t, steps, training, args) | stamp()
                        said = f"{new['seconds']} s"
                    done.add(key)  # a value given twice trains once
                    try:  # after each record: an interrupted run keeps what it trained
                        store = add_record(path, args.name, same, new, key_of)  # and what processes beside it wrote
                        done |= {key_of(r) for r in store[args.name]["records"]}
                    except ValueError as e:  # a process beside this one, another setting
                        p.error(str(e))
                    print(f"N={n} t={t} steps={steps} training {training}: {said}", file=sys.stderr, flush=True)
    with results_file(path) as store:  # read again: the records of every process that wrote to it
        entry = store.setdefault(args.name, entry | {"setting": same})
        if entry["setting"] != same:
            p.error(f"--name {args.name}: its records were trained with {entry['setting']}")
        _close(entry, ref, budgets, {b for _, b in have}, args, argv)
        summary = summarise(entry, experts)  # under the lock: the last to take it summarises every record
        write_result(path.parent / f"gmm_equal_compute-{args.name}.json", summary)
        (path.parent / f"gmm_equal_compute-{args.name}.md").write_text(render(entry, summary))
    return summary


def _close(entry: dict, ref, budgets: dict, have: set, args, argv) -> None:
    """The entry's fields read from its records: the width floor, the compute ratio and the experts' budget of each
    (N, steps), and the command that made it. A budget this run was not given (an earlier run's, or a process's
    beside it) keeps the experts' budget the entry names, or else is set against one of ``have`` as this run's are."""
    every = torch.arange(len(ref.cluster_of))
    keys = sorted({(r["features"], r["t"], r["steps"]) for r in entry["records"]})
    entry["width_floor"] = {f"{n}@{t}": width_floor(ref.mixture, every, (t,), n)[0] for n, t, _ in keys}
    for n, _, s in keys:
        named = entry.get("expert_budget", {}).get(f"{n}@{s}")
        if named is None:
            named = equal_budget(ref, n, s, args.expert_features, have) if args.equal_compute else args.expert_steps
        budgets.setdefault(f"{n}@{s}", named)
    entry["compute_ratio"] = {
        f"{n}@{s}": compute_ratio(ref, n, s, args.expert_features, budgets[f"{n}@{s}"]) for n, _, s in keys
    }
    if args.equal_compute:
        entry["expert_budget"] = {f"{n}@{s}": budgets[f"{n}@{s}"] for n, _, s in keys}
    command = ["python", "-m", "benchmarks.gmm_equal_compute", *(sys.argv[1:] if argv is None else argv)]
    entry["meta"] = {"command": shlex.join(command)} | stamp()


if __name__ == "__main__":
    main()
