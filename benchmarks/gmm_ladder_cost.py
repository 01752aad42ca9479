"""What a set of ``hddm reproduce`` runs on the Gaussian mixture cost, and what each took from the others
(``--reuse``), read from their manifests; optionally checked row by row against committed manifests of the same
rungs computed without reuse.

    python -m benchmarks.gmm_ladder_cost --runs es-800=OUT1 ei-800=OUT2 ... \
        [--against ei-800=benchmarks/results/reproduce-gmm-subspace-ei-800-text-manifest.json ...] [--name N]

Per run: its command, wall and CPU seconds, the split into training, router and evaluation, the load at its start
and end, how many experts, monoliths and routers it adopted and how many rows it took from a stored result. With
``--against``: the largest absolute difference, over every row, training, sampling seed and metric, between the
run's per-training values and the committed manifest's, and the same for Δ log p alone (0 where the rung's
trained networks and rows are bit-identical to the committed ones). Writes
``benchmarks/results/NAME.{json,md}`` (``gmm_ladder_cost`` by default).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from benchmarks.common import RESULTS, machine, write_result


def _values(row: dict) -> list[list[dict]]:
    """A row's metric dicts as ``[training][seed]`` (an exact row: one training)."""
    return row.get("per_training") or [row["per_seed"]]


def largest_difference(mine: dict, theirs: dict, metric: str | None = None) -> tuple[float, str]:
    """The largest |difference| of ``metric`` (default: any numeric metric) of any row, training and seed, and
    where it is."""
    worst, where = 0.0, ""
    missing = sorted(set(theirs["results"]) ^ set(mine["results"]))
    if missing:
        return math.inf, f"rows not in both: {missing}"
    for name, row in mine["results"].items():
        for i, (a_seeds, b_seeds) in enumerate(zip(_values(row), _values(theirs["results"][name]), strict=True)):
            for s, (a, b) in enumerate(zip(a_seeds, b_seeds, strict=True)):
                for k, v in a.items():
                    if metric not in (None, k):
                        continue
                    if isinstance(v, (int, float)) and isinstance(b.get(k), (int, float)):
                        d = abs(v - b[k])
                        if d > worst:
                            worst, where = d, f"{name}, training {i}, seed {s}, {k}"
    return worst, where


def summary(label: str, out: Path) -> dict:
    m = json.loads((out / "manifest.json").read_text())
    trainings = m["artefacts"].get("trainings") or [m["artefacts"]]
    parts = [(t["monolith"], "monolith") for t in trainings] + [
        (e, "expert") for t in trainings for e in t["experts"].values()
    ]
    return {
        "label": label,
        "command": m["command"],
        "created_at": m["created_at"],
        "seconds": m["seconds"],
        "cpu_seconds": m["cpu_seconds"],
        "timings_s": m["timings_s"],
        "load_average": m["load_average"],
        "budget": m["budget"],
        "trainings": len(trainings),
        "experts_adopted": sum("reused_from" in e for e, kind in parts if kind == "expert"),
        "experts": sum(kind == "expert" for _, kind in parts),
        "monoliths_adopted": sum("reused_from" in e for e, kind in parts if kind == "monolith"),
        "routers_adopted": sum("reused_from" in t["router"] for t in trainings),
        "rows_reused": sum("reused_from" in r for r in m["results"].values()),
        "rows": len(m["results"]),
    }


def markdown(r: dict) -> str:
    lines = [
        f"# {r['name']}",
        "",
        f"`{r['command']}` — {r['machine']}; {r['date']}. Each run is one `hddm reproduce` (its command below); "
        f"together **{r['total_seconds'] / 60:.1f} min** wall, {r['total_cpu_seconds'] / 60:.1f} CPU-min.",
        "",
        "| run | budget | wall (CPU) s | training / router / evaluation s | load start → end | adopted: experts, "
        "monoliths, routers | rows taken from a stored result | largest difference from the committed run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in r["runs"]:
        b, t, load = s["budget"], s["timings_s"], s["load_average"]
        against = s.get("against")
        diff = (
            "–"
            if against is None
            else f"{against['largest_difference']:.3g}; Δ log p {against['largest_delta_log_density_difference']:.3g} "
            f"(`{Path(against['file']).name}`)"
        )
        lines.append(
            f"| {s['label']} | {b['protocol']}, {b['expert_steps']} × {b['expert_batch']} (monolith "
            f"{b['monolith_steps']} × {b['monolith_batch']}) | {s['seconds']:.0f} ({s['cpu_seconds']:.0f}) | "
            f"{t['training']:.0f} / {t['router']:.0f} / {t['evaluation']:.0f} | {load['start'][0]:.2f} → "
            f"{load['end'][0]:.2f} | {s['experts_adopted']}/{s['experts']}, {s['monoliths_adopted']}/{s['trainings']}, "
            f"{s['routers_adopted']}/{s['trainings']} | {s['rows_reused']}/{s['rows']} | {diff} |"
        )
    lines += ["", "Commands:", ""] + [f"- {s['label']}: `{s['command']}`" for s in r["runs"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", nargs="+", required=True, help="LABEL=OUT of finished hddm reproduce runs, in order")
    p.add_argument("--against", nargs="*", default=[], help="LABEL=MANIFEST: a committed run of the same rung")
    p.add_argument("--name", default="gmm_ladder_cost")
    args = p.parse_args(argv)
    against = dict(spec.split("=", 1) for spec in args.against)
    runs = []
    for spec in args.runs:
        label, _, out = spec.partition("=")
        if not (Path(out) / "manifest.json").is_file():
            sys.exit(f"--runs: {spec!r} is not LABEL=OUT of a finished hddm reproduce run (no OUT/manifest.json)")
        s = summary(label, Path(out))
        if label in against:
            mine, theirs = (
                json.loads((Path(out) / "manifest.json").read_text()),
                json.loads(Path(against[label]).read_text()),
            )
            worst, where = largest_difference(mine, theirs)
            dlp, dlp_where = largest_difference(mine, theirs, "delta_log_density")
            s["against"] = {
                "file": against[label],
                "largest_difference": worst,
                "where": where,
                "largest_delta_log_density_difference": dlp,
                "where_delta_log_density": dlp_where,
            }
        runs.append(s)
    unknown = sorted(set(against) - {s["label"] for s in runs})
    if unknown:
        sys.exit(f"--against: no run labelled {unknown}")
    r = {
        "name": args.name,
        "command": "python -m benchmarks.gmm_ladder_cost " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "total_seconds": round(sum(s["seconds"] for s in runs), 1),
        "total_cpu_seconds": round(sum(s["cpu_seconds"] for s in runs), 1),
        "runs": runs,
    }
    write_result(RESULTS / f"{args.name}.json", r)
    (RESULTS / f"{args.name}.md").write_text(markdown(r))
    print(markdown(r))


if __name__ == "__main__":
    main()
