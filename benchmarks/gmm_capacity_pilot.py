"""A cheap pilot for a capacity-limited Gaussian mixture: one training of a few FM experts and of the monolith
under the config's budget, at several budgets, and the excess loss over Bayes of each on the experts' own clusters.

    python -m benchmarks.gmm_capacity_pilot --config configs/reproduce-gmm-capacity.yaml \
        --set "expert.preset=nano" --steps 400 1600 --clusters 0 4 --label nano --work /tmp/pilot

For every budget S of ``--steps`` the config is loaded with ``expert.steps=S`` and ``--set``; FM experts for
``--clusters`` (the expert's own steps and batch under ``reproduce.budget``, :func:`hddm_flower.budget.expert_config`)
and the monolith (:func:`hddm_flower.reproduce.training.train_monolith`) are trained exactly as ``hddm reproduce``
trains them, with the seeds of one training (``--training i``, 0 unless given: the seeds
:func:`hddm_flower.training_seeds.training_config` gives training i of ``evaluation.training_seeds``), and scored by
:func:`benchmarks.gmm_ladder.excess_loss`. One training per call, so no interval: a pilot says where to look, and
its reruns with ``--training 1``, ``2`` give independent trainings. Appends one JSON record per budget (naming the
commit: :func:`hddm_flower.provenance.source`) to ``WORK/pilot.jsonl`` and prints it. ``--train-only experts`` and
``--train-only monolith`` in two processes train one budget's networks; a call without it then reuses them and scores.
``--summarise RECORDS`` trains nothing: it puts the records of ``--label`` side by side over their trainings
(intervals over the trainings present, :func:`summarise`) in ``benchmarks/results/gmm_capacity_pilot-LABEL.{md,json}``;
with several labels and ``--name N`` (and ``--steps`` to keep only those budgets) it puts the labels side by side
(:func:`render_comparison`, e.g. a learning-rate sweep) in ``gmm_capacity_pilot-N.{md,json}``.
``--target exact`` trains every network on the exact velocity instead of the data (a capacity probe:
:mod:`benchmarks.gmm_exact_target`); its labels' records say so (``target``) and are never summarised with the
data's. ``--device cuda`` trains on a GPU (scoring stays on the CPU); on an H200 a `nano` expert's step is no faster than
one CPU core's, the monolith's about 3.5× (docs/performance.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import RESULTS, machine
from benchmarks.gmm_exact_target import train_network
from benchmarks.gmm_ladder import TIMES, excess_loss
from hddm_flower.budget import budget_of
from hddm_flower.budget import expert_config as budget_expert_config
from hddm_flower.checkpoints import META, WEIGHTS, save_expert
from hddm_flower.config.io import load_config, parse_overrides
from hddm_flower.gmm.dataset import load_reference
from hddm_flower.gmm.truth import interval
from hddm_flower.provenance import source, source_since
from hddm_flower.reproduce.training import tensor_sha256, train_monolith
from hddm_flower.stages.expert import train_one_expert
from hddm_flower.stages.prepare import prepare_data
from hddm_flower.training_seeds import training_config

SECONDS = "pilot_seconds.json"  # beside each network: its training time, read back when a later call reuses it


def train(
    cfg, dataset, root: Path, clusters: list[int], only: str | None = None, device: str = "cpu", target: str = "data"
) -> dict:
    """Train (or reuse from ``root``) the FM experts of ``clusters`` and the monolith (``only``: just the
    ``experts`` or just the ``monolith``) on ``device``; returns each network's training seconds, the parameter
    count and what trained them (``trained_on``: the device and torch of each network). ``target="exact"``: each
    network is trained on the exact velocity instead of the data (:mod:`benchmarks.gmm_exact_target`, on the CPU)."""
    seconds, trained_on = {}, {}
    cfg = dataclasses.replace(cfg, coordinator=dataclasses.replace(cfg.coordinator, device=device))  # the monolith's
    jobs = [(f"experts/cluster-{k}-fm", k) for k in clusters] + [("monolith", None)]
    for name, k in jobs:
        if only and (only == "monolith") != (k is None):
            continue
        folder = root / name
        if (folder / META).exists():  # reused: only if the same target trained it
            if (found := json.loads((folder / META).read_text()).get("target", "data")) != target:
                raise ValueError(f"{folder}: trained on the {found} target, not the {target} one: use another label")
        else:
            t0 = time.perf_counter()
            if target == "exact":
                state, model_config, meta = train_network(cfg, dataset, k)
            elif k is None:
                state, model_config, meta = train_monolith(cfg, dataset)
            else:
                state, model_config, meta = train_one_expert(budget_expert_config(cfg), dataset, k, "fm", device=device)
            save_expert(folder, state, model_config, meta)
            took = {
                "seconds": round(time.perf_counter() - t0, 1),
                "parameters": sum(v.numel() for v in state.values()),
                "device": torch.cuda.get_device_name(device) if device.startswith("cuda") else device,
                "torch": torch.__version__,
            }
            (folder / SECONDS).write_text(json.dumps(took))
        if (folder / SECONDS).exists():  # (networks of an older pilot have no record)
            took = json.loads((folder / SECONDS).read_text())
            seconds[name], seconds["parameters"] = took["seconds"], took["parameters"]
            trained_on[name] = f"{took.get('device', 'device not recorded')}, torch {took.get('torch', 'not recorded')}"
    return seconds | ({"trained_on": trained_on} if trained_on else {})


def network_hashes(root: Path) -> dict[str, str]:
    """The :func:`~hddm_flower.reproduce.training.tensor_sha256` of each network in ``root`` (``monolith``,
    ``experts/cluster-k-fm``), as a manifest of ``hddm reproduce`` records them."""
    folders = [root / "monolith", *sorted((root / "experts").glob("cluster-*"))]
    return {f.relative_to(root).as_posix(): tensor_sha256(f / WEIGHTS) for f in folders if (f / WEIGHTS).exists()}


def pilot(
    cfg, dataset, root: Path, clusters: list[int], samples: int, device: str = "cpu", target: str = "data"
) -> dict:
    """Train (or reuse from ``root``) the experts of ``clusters`` and the monolith; their excess losses and hashes."""
    seconds = train(cfg, dataset, root, clusters, device=device, target=target)
    ref = load_reference(dataset)
    per_cluster = excess_loss(cfg, ref, root, samples, seed=cfg.evaluation.seed)
    mean = {who: at_t(per_cluster, who, None) for who in ("expert", "monolith")}
    return {
        "per_cluster": per_cluster,
        "mean_over_t_and_clusters": mean,
        "train_seconds": seconds,
        "tensor_sha256": network_hashes(root),
    }


SAME = ("config", "set", "preset", "samples", "target")  # what every record of one label shares (and its clusters)
DEFAULTS = {"samples": 256, "target": "data"}  # what a record without the key had


def by_training(records: list[dict], label: str) -> dict[int, dict[int, dict]]:
    """``{steps: {training: record}}`` of ``label`` (a record without ``training`` is training 0, without
    ``samples`` one of the default 256, without ``target`` one trained on the data). Raises when the label's
    records differ in :data:`SAME` or in their clusters, or when one budget and training has two records with
    different scores (the same scores twice: one)."""
    out: dict[int, dict[int, dict]] = {}
    first = None
    for r in records:
        if r["label"] != label:
            continue
        shape = {k: r.get(k, DEFAULTS.get(k)) for k in SAME} | {"clusters": sorted(r["per_cluster"])}
        first = first or (shape, r)
        if shape != first[0]:
            diff = [k for k in shape if shape[k] != first[0][k]]
            raise ValueError(
                f"label {label}: the record of {r['steps']} steps ({r.get('date')}) differs from the one of "
                f"{first[1]['steps']} steps in {diff}: they cannot be summarised together"
            )
        t = r.get("training", 0)
        seen = out.setdefault(r["steps"], {}).get(t)
        if seen is not None and seen["per_cluster"] != r["per_cluster"]:
            raise ValueError(f"label {label}: two different records of {r['steps']} steps, training {t}")
        out[r["steps"]][t] = r
    return dict(sorted(out.items()))


def at_t(per_cluster: dict, who: str, i: int | None) -> float:
    """``who``'s excess loss at ``TIMES[i]`` (``None``: the mean over t), averaged over the clusters of a record's
    ``per_cluster``."""
    per = per_cluster.values()
    return sum(sum(v[who]) / len(TIMES) if i is None else v[who][i] for v in per) / len(per)


def summarise(records: list[dict], label: str) -> dict:
    """Per budget: the expert's and the monolith's excess loss over Bayes and their paired difference (mean over the
    record's clusters; over t, and at each t of ``TIMES``) as 95 % Student-t intervals over the independent trainings
    present (``n``: how many; one training gives a half-width of 0), and each one's change per doubling of the
    budget since the budget before, paired by training (``(m₂ / m₁)^(1 / log₂(S₂ / S₁)) − 1`` over the trainings
    present at both)."""
    rungs = by_training(records, label)
    out, before = {}, None
    for steps, runs in rungs.items():
        row = {"trainings": sorted(runs), "record_dates": [runs[k].get("date") for k in sorted(runs)]}
        for key, i in [("mean_over_t", None), *((f"t={t}", j) for j, t in enumerate(TIMES))]:
            e = [at_t(r["per_cluster"], "expert", i) for r in runs.values()]
            m = [at_t(r["per_cluster"], "monolith", i) for r in runs.values()]
            cell = {"expert": interval(e), "monolith": interval(m), "gap": interval([b - a for a, b in zip(e, m)])}
            if before is not None and (both := sorted(set(runs) & set(rungs[before]))):
                doublings = math.log2(steps / before)
                for who in ("expert", "monolith"):
                    change = [
                        (at_t(runs[k]["per_cluster"], who, i) / at_t(rungs[before][k]["per_cluster"], who, i))
                        ** (1 / doublings)
                        - 1
                        for k in both
                    ]
                    cell[f"{who}_change_per_doubling"] = interval(change) | {"since": before}
            row[key] = cell
        out[steps], before = row, steps
    return out


def render_summary(summary: dict, label: str, source: str) -> str:
    """Markdown: one row per budget and t (the mean over t first), from the records in ``source``."""

    def c(x: dict, spec: str = ".3f", scale: float = 1.0) -> str:
        half = f" ± {x['half'] * scale:{spec.lstrip('+')}}" if x["n"] > 1 else ""
        return f"{x['mean'] * scale:{spec}}{half}"

    lines = [
        f"# gmm_capacity_pilot, label `{label}`",
        "",
        f"`python -m benchmarks.gmm_capacity_pilot --summarise {source} --label {label}` on "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}: a summary of the records of `{source}`, each of which names the "
        "command, machine and date that produced it, and its training (none named: training 0).",
        "",
        "Excess loss over Bayes per dimension on the experts' own clusters (mean over the record's clusters), "
        "mean ± the half-width of the 95 % Student-t interval over the independent trainings (`--training`) "
        "present; `monolith − expert` paired by training; the change per doubling of the budget since the budget "
        "before it, (m₂ / m₁)^(1 / doublings) − 1, paired by training (the trainings present at both).",
        "",
        "| steps | trainings | t | expert | monolith | monolith − expert | change per doubling: expert / monolith |",
        "|---|---|---|---|---|---|---|",
    ]
    for steps, row in summary.items():
        for key in ["mean_over_t", *(f"t={t}" for t in TIMES)]:
            x = row[key]
            ch = [x.get(f"{who}_change_per_doubling") for who in ("expert", "monolith")]
            change = f"{c(ch[0], '+.0f', 100)} % / {c(ch[1], '+.0f', 100)} %" if ch[0] else "–"
            if ch[0] and ch[0]["n"] != len(row["trainings"]):
                change += f" ({ch[0]['n']} training{'s' if ch[0]['n'] > 1 else ''})"
            lines.append(
                f"| {steps:,} | {len(row['trainings'])} | {key.removeprefix('t=') if key != 'mean_over_t' else 'mean'} "
                f"| {c(x['expert'])} | {c(x['monolith'])} | {c(x['gap'], '+.3f')} | {change} |"
            )
    return "\n".join(lines) + "\n"


def render_comparison(
    summaries: dict[str, dict],
    sets: dict[str, str],
    name: str,
    source: str,
    steps: list[int] | None = None,
    targets: dict[str, str] | None = None,
) -> str:
    """Markdown: the labels of ``summaries`` (each a :func:`summarise`; ``sets``: each label's ``--set``;
    ``targets``: each label's target, named beside a label of the exact one) side by side, one row per label and
    budget:
    the mean over t and the values at t = 0.1 and 0.7, each a mean over the trainings present (± when more than one),
    the difference paired by training."""

    def c(x: dict, spec: str = ".3f") -> str:
        return f"{x['mean']:{spec}}" + (f" ± {x['half']:{spec.lstrip('+')}}" if x["n"] > 1 else "")

    labels = " ".join(summaries)
    steps = f" --steps {' '.join(map(str, steps))}" if steps else ""
    lines = [
        f"# gmm_capacity_pilot, `{name}`: {', '.join(f'`{k}`' for k in summaries)}",
        "",
        f"`python -m benchmarks.gmm_capacity_pilot --summarise {source} --label {labels} --name {name}{steps}` on "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}: the records of `{source}` (each names the command, machine and "
        "date that produced it) of each label, side by side.",
        "",
        "Excess loss over Bayes per dimension on the experts' own clusters (mean over the record's clusters), "
        "mean ± the half-width of the 95 % Student-t interval over the independent trainings (`--training`) "
        "present (none: one training); `monolith − expert` paired by training.",
        "",
        "| label | `--set` | steps | trainings | expert, mean over t | monolith | monolith − expert "
        "| t = 0.1: expert / monolith | t = 0.7: expert / monolith |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, summary in summaries.items():
        for steps, row in summary.items():
            x, lo, hi = row["mean_over_t"], row["t=0.1"], row["t=0.7"]
            exact = " (exact target)" if (targets or {}).get(label) == "exact" else ""
            lines.append(
                f"| {label}{exact} | `{sets[label]}` | {steps:,} | {len(row['trainings'])} | {c(x['expert'])} "
                f"| {c(x['monolith'])} | {c(x['gap'], '+.3f')} | {c(lo['expert'])} / {c(lo['monolith'])} "
                f"| {c(hi['expert'])} / {c(hi['monolith'])} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config")
    p.add_argument(
        "--summarise",
        metavar="RECORDS",
        help="instead of training: the records of --label in RECORDS (a JSON file with 'records', or a pilot.jsonl) "
        "over their trainings, written to benchmarks/results/gmm_capacity_pilot-LABEL.{md,json} (several labels: "
        "side by side in gmm_capacity_pilot-NAME.{md,json}; --steps: only these budgets)",
    )
    p.add_argument("--set", default="", help='overrides, e.g. "expert.preset=nano data.gmm_rank=12"')
    p.add_argument("--steps", type=int, nargs="+", help="the budgets S (expert.steps)")
    p.add_argument("--clusters", type=int, nargs="+", default=[0])
    p.add_argument("--samples", type=int, default=256, help="x_t per cluster and t for the excess loss")
    p.add_argument(
        "--label", required=True, nargs="+", help="the records' label; with --summarise, several side by side (--name)"
    )
    p.add_argument("--name", help="with --summarise and several labels: the comparison's file name")
    p.add_argument("--work", help="where the pilot's networks and pilot.jsonl go")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--training",
        type=int,
        default=0,
        help="the independent training whose seeds train the networks (0: the config's own; i: its seeds moved as "
        "hddm reproduce moves training i's); i > 0 goes to WORK/LABEL/steps-S-training-i",
    )
    p.add_argument("--device", default="cpu", help="where the networks train (cpu, cuda, cuda:N); scoring is on cpu")
    p.add_argument(
        "--target",
        choices=("data", "exact"),
        default="data",
        help="what the networks regress: the data's FM target (data, as hddm reproduce trains them) or the exact "
        "velocity on fresh draws of the mixture (exact: the capacity probe of benchmarks.gmm_exact_target, on cpu)",
    )
    p.add_argument(
        "--train-only",
        choices=("experts", "monolith"),
        help="train just these networks into WORK and stop (a later call without it reuses them and scores): the "
        "experts and the monolith of one budget in two processes",
    )
    args = p.parse_args()
    if args.target == "exact" and args.device != "cpu":
        p.error(f"--target exact --device {args.device}: the exact target trains on the cpu")
    if args.summarise:
        text = Path(args.summarise).read_text()
        records = json.loads(text)["records"] if args.summarise.endswith(".json") else read_jsonl(text)
        if args.steps:  # only these budgets, in a comparison of its own (a label's summary holds every budget)
            if not args.name:
                p.error("--summarise with --steps: name the comparison (--name) so the label's full summary stays")
            records = [r for r in records if r["steps"] in args.steps]
        if len(args.label) > 1 or args.name:
            if not args.name:
                p.error(f"--label {' '.join(args.label)}: several labels are compared under a --name")
            summaries = {label: summarise(records, label) for label in args.label}
            if empty := [label for label, s in summaries.items() if not s]:
                p.error(f"--label {' '.join(empty)}: no record of {args.summarise} has this label")
            # one --set per label (summarise refuses a label whose records differ in it, or in the target)
            first = {label: next(r for r in records if r["label"] == label) for label in args.label}
            sets = {label: r.get("set", "") for label, r in first.items()}
            targets = {label: r.get("target", "data") for label, r in first.items()}
            md = render_comparison(summaries, sets, args.name, args.summarise, args.steps, targets)
            out = {"labels": args.label, "sets": sets, "records": args.summarise, "steps": args.steps}
            out |= {"targets": targets} if "exact" in targets.values() else {}
            out["summaries"] = summaries
            (RESULTS / f"gmm_capacity_pilot-{args.name}.json").write_text(json.dumps(out, indent=1))
            (RESULTS / f"gmm_capacity_pilot-{args.name}.md").write_text(md)
            print(md)
            return
        args.label = args.label[0]
        summary = summarise(records, args.label)
        (RESULTS / f"gmm_capacity_pilot-{args.label}.json").write_text(
            json.dumps({"label": args.label, "records": args.summarise, "summary": summary}, indent=1)
        )
        (RESULTS / f"gmm_capacity_pilot-{args.label}.md").write_text(
            md := render_summary(summary, args.label, args.summarise)
        )
        print(md)
        return
    if args.training < 0:
        p.error(f"--training {args.training}: a training index is 0 or more")
    if not (args.config and args.steps and args.work):
        p.error("--config, --steps and --work are required to train (or --summarise RECORDS)")
    if len(args.label) > 1:
        p.error(f"--label {' '.join(args.label)}: one label to train under")
    args.label = args.label[0]
    torch.set_num_threads(args.threads)
    work = Path(args.work)
    for steps in args.steps:
        start, load0, at_start = time.time(), os.getloadavg(), source()
        cfg = load_config(args.config, parse_overrides(args.set) | {"expert.steps": steps})
        dataset = prepare_data(cfg, args.cache_dir)
        cfg = training_config(cfg, args.training)
        root = work / args.label / (f"steps-{steps}" + (f"-training-{args.training}" if args.training else ""))
        if args.train_only:
            print(train(cfg, dataset, root, args.clusters, args.train_only, args.device, args.target), flush=True)
            continue
        result = pilot(cfg, dataset, root, args.clusters, args.samples, args.device, args.target)
        record = {
            "label": args.label,
            "command": "python -m benchmarks.gmm_capacity_pilot " + " ".join(sys.argv[1:]),
            "config": args.config,
            "set": args.set,
            "steps": steps,
            "training": args.training,
            "samples": args.samples,
            "target": args.target,
            "budget": dataclasses.asdict(budget_of(cfg)),
            "preset": cfg.expert.preset,
            "dataset": dataset.root.name,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": machine() + f", {args.threads} torch threads",
            "load_average": {"start": load0, "end": os.getloadavg()},
            "seconds": round(time.time() - start, 1),
            "source": source_since(at_start),
        } | result
        with open(work / "pilot.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        m = result["mean_over_t_and_clusters"]
        print(
            f"{args.label} S={steps}: expert {m['expert']:.4f} monolith {m['monolith']:.4f} "
            f"monolith − expert {m['monolith'] - m['expert']:+.4f} ({record['seconds']} s)",
            flush=True,
        )


def read_jsonl(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


if __name__ == "__main__":
    main()
