"""A finished ``hddm reproduce`` run on a Gaussian mixture read again from its manifest over some of its trainings
(``hddm tables``), for instance leaving out the training a learning rate was picked on: its tables and its paired
differences (Tables 3 and 4) recomputed over those trainings from the per-training values the manifest holds."""

from __future__ import annotations

from typing import Any

from .compare import over_trainings, paired_truth, trainings_of
from .evaluate import render_truth_tables


def read_over_trainings(manifest: Any, keep: list[int] | None, name: str, command: str) -> tuple[str, dict]:
    """``(tables, record)`` of the manifest ``name`` (its path, as the tables cite it) read over the trainings
    ``keep`` (None: all): the markdown tables, headed by what they cover, and ``{"command", "manifest",
    "trainings", "of", "paired"}``. Raises ValueError naming ``name`` for anything but a Gaussian-mixture run's
    manifest (an older one that lacks a field included), and for trainings it does not hold."""
    results = manifest.get("results") if isinstance(manifest, dict) else None
    if (
        not isinstance(results, dict)
        or not results
        or not all(isinstance(r, dict) and "row" in r for r in results.values())
    ):
        raise ValueError(f"{name}: not the manifest of an `hddm reproduce` run on a Gaussian mixture")
    try:
        n = trainings_of(results)
        keep = list(range(n)) if keep is None else list(keep)
        rows = over_trainings(results, keep)
        paired = paired_truth(rows)
        tables = render_truth_tables(manifest, rows)
    except (KeyError, TypeError, AttributeError, IndexError) as e:
        raise ValueError(f"{name}: a manifest this version cannot read ({type(e).__name__}: {e})") from None
    which = ", ".join(map(str, keep))
    covers = (
        f"trainings {which} of the {n} in `{name}`, so every interval over trainings below is over these {len(keep)}"
        if len(keep) > 1
        else f"training {which} of the {n} in `{name}` alone, so every interval below is over its sampling seeds"
    )
    head = (
        f"Read by `{command}`: {covers}. The line after this one is the run's own (its command, minutes and load are "
        "the whole run's)."
    )
    record = {"command": command, "manifest": name, "trainings": keep, "of": n, "paired": paired}
    return f"{head}\n\n{tables}", record
