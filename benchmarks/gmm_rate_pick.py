"""A learning rate picked over several trainings: the labels of a rate sweep (``benchmarks.gmm_capacity_pilot``
records, one label per rate, in the order of the rates) compared at one budget, per network (the experts, the
monolith), each rate's excess loss over Bayes paired by training against the rate of lowest mean.

    python -m benchmarks.gmm_rate_pick --records benchmarks/results/gmm_capacity_pilot.json --steps 800 \
        --labels clu-r8-nano-lr4e-3 clu-r8-nano-lr8e-3 clu-r8-nano-lr1.6e-2 --who expert monolith --name N

The trainings read are those every label has at ``--steps`` (or ``--trainings``, each of which every label must
have). Per network of ``--who``: each label's excess loss (the mean over t and the record's clusters, as the sweep
scores it) per training and its mean; the best, the label of lowest mean; every other label − the best, paired by
training, as a 95 % Student-t interval over those trainings (``resolved``: it excludes 0; with one training there is
no interval); how many trainings each label is the lowest in; and whether the best is interior (a label on either
side of it in the order given). Writes ``benchmarks/results/gmm_rate_pick-NAME.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.common import RESULTS, stamp, write_result
from benchmarks.gmm_capacity_pilot import DEFAULTS, SAME, at_t, by_training, read_jsonl
from hddm_flower.gmm.truth import interval


def pick(records: list[dict], labels: list[str], steps: int, who: str, trainings: list[int] | None = None) -> dict:
    """The comparison of the module docstring for one network ``who`` (``expert`` or ``monolith``). Raises
    ValueError for a label named twice or without records, labels that differ in more than the learning rate, a
    training named twice, or a training some label lacks."""
    if len(set(labels)) != len(labels):
        raise ValueError(f"labels {' '.join(labels)}: each label once")
    if trainings is not None and len(set(trainings)) != len(trainings):
        raise ValueError(f"trainings {' '.join(map(str, trainings))}: each training once")
    runs = {label: by_training(records, label).get(steps, {}) for label in labels}
    if empty := [label for label, r in runs.items() if not r]:
        raise ValueError(f"label {empty[0]}: no record of {steps} steps")
    shapes = {label: _shape(next(iter(r.values()))) for label, r in runs.items()}
    if differ := [label for label in labels if shapes[label] != shapes[labels[0]]]:
        keys = [k for k in shapes[labels[0]] if shapes[differ[0]][k] != shapes[labels[0]][k]]
        raise ValueError(f"labels {labels[0]} and {differ[0]} differ in more than the learning rate: {keys}")
    common = sorted(set.intersection(*(set(r) for r in runs.values())))
    if trainings is None:
        trainings = common
    if missing := [(label, t) for label in labels for t in trainings if t not in runs[label]]:
        label, t = missing[0]
        raise ValueError(f"label {label}: no record of {steps} steps, training {t}")
    if not trainings:
        raise ValueError(f"labels {' '.join(labels)}: no training has a record of {steps} steps under every label")
    values = {label: [at_t(runs[label][t]["per_cluster"], who, None) for t in trainings] for label in labels}
    means = {label: sum(v) / len(v) for label, v in values.items()}
    best = min(labels, key=means.__getitem__)
    lowest = [min(labels, key=lambda label: values[label][i]) for i in range(len(trainings))]
    against = {}
    for label in labels:
        if label != best:
            d = interval([a - b for a, b in zip(values[label], values[best], strict=True)])
            against[label] = d | {"resolved": d["n"] > 1 and d["lo"] > 0}  # the best has the lowest mean
    i = labels.index(best)
    return {
        "who": who,
        "steps": steps,
        "trainings": trainings,
        "values": values,
        "means": means,
        "best": best,
        "interior": 0 < i < len(labels) - 1,
        "lowest_in": {label: lowest.count(label) for label in labels},
        "minus_best": against,
    }


def _shape(record: dict) -> dict:
    """What the labels of one sweep share: everything a record's label fixes but the learning rate."""
    rest = " ".join(x for x in record.get("set", "").split() if not x.startswith("expert.optim.lr="))
    return {k: record.get(k, DEFAULTS.get(k)) for k in SAME if k != "set"} | {
        "set without the rate": rest,
        "clusters": sorted(record["per_cluster"]),
        "budget": {k: v for k, v in record.get("budget", {}).items() if k != "lr"},
    }


def markdown(picks: list[dict], command: str, made: dict) -> str:
    lines = [
        f"# gmm_rate_pick: {', '.join(p['who'] for p in picks)} at {picks[0]['steps']:,} steps",
        "",
        f"`{command}` ({made['machine']}, {made['date']}, commit {made['commit']}). Excess loss over Bayes per "
        "dimension (the mean over t and the records' clusters), per training and its mean; each label − the best "
        "(lowest mean), paired by training: mean ± the half-width of the 95 % Student-t interval over the trainings "
        "(independent trainings of the same config, `--training`).",
    ]
    for p in picks:
        head = " | ".join(f"training {t}" for t in p["trainings"])
        lines += [
            "",
            f"**{p['who']}**: best `{p['best']}` ({'interior' if p['interior'] else 'at an end of the rates tried'})",
            "",
            f"| label | {head} | mean | − best | lowest in |",
            "|---|" + "---|" * (len(p["trainings"]) + 3),
        ]
        for label, v in p["values"].items():
            d = p["minus_best"].get(label)
            diff = "–" if d is None else f"{d['mean']:+.4f}" + (f" ± {d['half']:.4f}" if d["n"] > 1 else "")
            diff += " (resolved)" if d and d["resolved"] else ""
            cells = " | ".join(f"{x:.4f}" for x in v)
            lines.append(f"| {label} | {cells} | {p['means'][label]:.4f} | {diff} | {p['lowest_in'][label]} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", required=True, help="a JSON file with 'records' or a pilot.jsonl")
    p.add_argument("--steps", type=int, required=True, help="the budget (expert.steps) compared")
    p.add_argument("--labels", nargs="+", required=True, help="one label per rate, in the order of the rates")
    p.add_argument("--who", nargs="+", choices=("expert", "monolith"), default=["expert", "monolith"])
    p.add_argument("--trainings", type=int, nargs="+", help="the trainings read (default: those every label has)")
    p.add_argument("--name", required=True, help="writes benchmarks/results/gmm_rate_pick-NAME.{md,json}")
    args = p.parse_args()
    text = Path(args.records).read_text()
    records = json.loads(text)["records"] if args.records.endswith(".json") else read_jsonl(text)
    try:
        picks = [pick(records, args.labels, args.steps, who, args.trainings) for who in args.who]
    except ValueError as e:
        p.error(str(e))
    command = "python -m benchmarks.gmm_rate_pick " + " ".join(sys.argv[1:])
    made = stamp()
    write_result(RESULTS / f"gmm_rate_pick-{args.name}.json", {"command": command} | made | {"picks": picks})
    (RESULTS / f"gmm_rate_pick-{args.name}.md").write_text(md := markdown(picks, command, made))
    print(md)


if __name__ == "__main__":
    main()
