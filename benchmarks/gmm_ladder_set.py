"""The Gaussian-mixture evidence set, end to end: the budget ladder on the mixture whose clusters share no structure
(``configs/reproduce-gmm-subspace.yaml``, a prompt-aware router; equal steps and equal images at 800 and 3,200
expert steps) and the mixture whose captions do not fix the cluster (``configs/reproduce-gmm-colour.yaml``), each a
``hddm reproduce`` run with 3 trainings, one after another; then :mod:`benchmarks.gmm_ladder_cost` on them, checked
row by row against the committed manifests of the same runs.

    python -m benchmarks.gmm_ladder_set --out DIR [--only LABEL ...] [--dry-run]

Each rung takes what it shares from the run before it (``--reuse``): an equal-images rung adopts the experts,
routers and every row but the monolith's of the equal-steps rung with the same expert steps, and trains and samples
only its three monoliths (one per training) — in three processes, so that the two cores finish them in 1.5
monolith-times instead of 2; the 3,200-step equal-steps rung adopts the routers and the rows that do not depend on
trained experts from the 800-step one. Writes ``DIR/LABEL/`` per run and
``benchmarks/results/gmm_ladder_cost.{json,md}``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks import gmm_ladder_cost
from benchmarks.common import RESULTS, ROOT

SUBSPACE = "configs/reproduce-gmm-subspace.yaml"
TEXT = ("router.conditioning=text",)
EQUAL_IMAGES = ("reproduce.budget=equal_images", "expert.batch_size=32")


@dataclass(frozen=True)
class Run:
    label: str
    config: str
    sets: tuple[str, ...]
    reuse: str | None  # the label of the run whose output this one reuses
    jobs: int
    committed: str  # benchmarks/results/NAME-manifest.json: the same run, committed


RUNS = (
    Run("es-800", SUBSPACE, TEXT, None, 2, "reproduce-gmm-subspace-800-text"),
    Run("ei-800", SUBSPACE, TEXT + EQUAL_IMAGES, "es-800", 3, "reproduce-gmm-subspace-ei-800-text"),
    Run("es-3200", SUBSPACE, ("expert.steps=3200", *TEXT), "es-800", 2, "reproduce-gmm-subspace-3200-text"),
    Run(
        "ei-3200",
        SUBSPACE,
        ("expert.steps=3200", *TEXT, *EQUAL_IMAGES),
        "es-3200",
        3,
        "reproduce-gmm-subspace-ei-3200-text",
    ),
    Run(
        "colour",
        "configs/reproduce-gmm-colour.yaml",
        ("reproduce.ddpm_counts=[0,2]", "evaluation.seeds=2", "evaluation.routing_modes=[top1,top2,full]"),
        None,
        2,
        "reproduce-gmm-colour",
    ),
)


def command(run: Run, out: Path) -> list[str]:
    """The ``hddm reproduce`` command line of ``run`` with its outputs under ``out``."""
    cmd = ["hddm", "reproduce", "--config", run.config]
    for s in run.sets:
        cmd += ["--set", s]
    if run.reuse:
        cmd += ["--reuse", str(out / run.reuse)]
    return cmd + ["--out", str(out / run.label), "--jobs", str(run.jobs)]


def main(argv: list[str] | None = None) -> list[list[str]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, type=Path, help="a folder for the runs (DIR/LABEL each)")
    labels = [r.label for r in RUNS]
    p.add_argument("--only", nargs="+", choices=labels, help="run these only (the others must be in DIR already)")
    p.add_argument("--dry-run", action="store_true", help="print the commands and stop")
    args = p.parse_args(argv)
    out = args.out.resolve()
    commands = [command(r, out) for r in RUNS]
    if args.dry_run:
        print("\n".join(" ".join(c) for c in commands))
        return commands
    if shutil.which("hddm") is None:
        sys.exit("gmm_ladder_set: no `hddm` command on PATH (pip install -e . first)")
    out.mkdir(parents=True, exist_ok=True)
    for run, cmd in zip(RUNS, commands):
        if args.only and run.label not in args.only:
            continue
        print(" ".join(cmd), flush=True)
        with open(out / f"{run.label}.log", "w") as log:
            done = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        if done.returncode:
            sys.exit(
                f"gmm_ladder_set: {run.label} failed (exit {done.returncode}); its log: {out / f'{run.label}.log'}"
            )
    os.chdir(ROOT)  # the committed manifests are named relative to the repository root
    gmm_ladder_cost.main(
        ["--runs", *(f"{r.label}={out / r.label}" for r in RUNS)]
        + ["--against", *(f"{r.label}={RESULTS.relative_to(ROOT) / f'{r.committed}-manifest.json'}" for r in RUNS)]
    )
    return commands


if __name__ == "__main__":
    main()
