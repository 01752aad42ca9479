"""The comparisons ``hddm reproduce`` makes on a Gaussian mixture, as differences paired by training and seed.

Every row of one sampling seed shares its prompts, noise and true samples, and every trained row of training i
uses that training's experts, monolith and router: the difference of two rows is taken per (training, seed), so
what moves every row together (the seed's prompts and noise, the draw of true samples) cancels. The comparisons:
per configuration, top-2 − each other routing mode of that configuration, top-2 − the monolith, and top-2 with
the trained router − top-2 with the exact router; across configurations, each pair at top-2; and every trained
row − the exact row of the same mode and steps (:func:`relative_to_exact`).

What an interval covers is part of the result: with several trainings (``evaluation.training_seeds``) it is the
Student-t interval over trainings of the per-training mean difference (:func:`~hddm_flower.training_seeds.
nested_interval`; a fresh training's difference), with the mean half-width over sampling seeds within one training
beside it; with one training it is over the sampling seeds of that one training only and says nothing about
another training of the same config.
"""

from __future__ import annotations

from typing import Any

from ..training_seeds import nested_interval, paired
from .truth import METRICS, interval

PAIRED_METRICS = tuple(m for m in METRICS if m not in ("log_density", "adherence"))
"""The metrics whose paired differences are reported: every truth metric but ``log_density`` (its paired difference
is that of ``delta_log_density``: both rows of a seed share their true samples) and ``adherence`` (the component
within the cluster; ``cluster_adherence`` and ``cluster_tv`` are the routing's)."""
TRAINED_GROUPS_EXCLUDED = ("exact", "monolith")


def row_values(results: dict[str, Any], name: str, metric: str, trainings: int) -> list[list[float]]:
    """``values[i][j]`` of one row's ``metric`` for training i and sampling seed j; a row that does not depend on a
    training (the exact ones) has the same values in every training."""
    r = results[name]
    per_training = r.get("per_training") or [r["per_seed"]] * trainings
    return [[s[metric] for s in seeds] for seeds in per_training]


def comparisons(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(what, a, b)``: the paired differences row ``a`` − row ``b`` the tables report (module docstring)."""
    rows = {n: r["row"] for n, r in results.items() if r["row"].get("prompts", "captions") == "captions"}
    groups = list(dict.fromkeys(r["group"] for r in rows.values() if r["group"] not in TRAINED_GROUPS_EXCLUDED))
    monolith = next((n for n, r in rows.items() if r["group"] == "monolith"), None)

    def find(group: str, mode: str, router: str = "trained") -> str | None:
        return next(
            (
                n
                for n, r in rows.items()
                if r["group"] == group and r["mode"] == mode and r["router"] == router and r["experts"] == "trained"
            ),
            None,
        )

    out = []
    for g in groups:
        top2 = find(g, "top2")
        if top2 is None:
            continue
        for n, r in rows.items():
            if r["group"] == g and r["router"] == "trained" and r["experts"] == "trained" and n != top2:
                out.append((f"{g}: top2 − {r['mode']}", top2, n))
        if monolith:
            out.append((f"{g}: top2 − monolith", top2, monolith))
        exact_router = find(g, "top2", "exact")
        if exact_router:
            out.append((f"{g}: top2, trained − exact router", top2, exact_router))
    tops = [(g, find(g, "top2")) for g in groups if find(g, "top2")]
    out += [(f"top2: {b} − {a}", nb, na) for i, (a, na) in enumerate(tops) for b, nb in tops[i + 1 :]]
    out += relative_to_exact(results)
    return out


def attribution(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The attribution factorial on the empty caption (:func:`hddm_flower.gmm.evaluate.attribution_rows`), per routing
    mode, as paired differences of the rows EE (exact experts, exact router), ET (exact experts, trained router), TE
    and TT: the gap TT − EE, split two ways into the router's share and the experts' share,
    ``TT − EE = (ET − EE) + (TT − ET) = (TE − EE) + (TT − TE)`` (router at exact experts + experts under the trained
    router; experts under the exact router + router with trained experts: the two orders differ by the interaction),
    and the routing's own cost with exact parts, EE(mode) − EE(full) (EE full is the truth up to Euler error)."""
    cells: dict[tuple[str, str, str], str] = {}
    for n, r in results.items():
        row = r["row"]
        if (
            row.get("prompts") == "empty"
            and row["experts"] in ("exact-fm", "trained")
            and row["router"] != "exact-text"
        ):
            cells[
                ("E" if row["experts"] == "exact-fm" else "T") + ("E" if row["router"] == "exact" else "T"),
                row["mode"],
                row["group"],
            ] = n
    by_mode: dict[str, dict[str, str]] = {}
    for (cell, mode, _), n in cells.items():
        by_mode.setdefault(mode, {})[cell] = n
    out = []
    for mode, c in by_mode.items():
        if set(c) != {"EE", "ET", "TE", "TT"}:
            continue
        out += [
            (f"empty caption · {mode}: gap, trained experts · trained router − exact · exact", c["TT"], c["EE"]),
            (f"empty caption · {mode}: router share at exact experts (ET − EE)", c["ET"], c["EE"]),
            (f"empty caption · {mode}: experts share under the trained router (TT − ET)", c["TT"], c["ET"]),
            (f"empty caption · {mode}: experts share under the exact router (TE − EE)", c["TE"], c["EE"]),
            (f"empty caption · {mode}: router share with trained experts (TT − TE)", c["TT"], c["TE"]),
        ]
        if mode != "full" and "EE" in by_mode.get("full", {}):
            out.append((f"empty caption · exact · exact: {mode} − full", c["EE"], by_mode["full"]["EE"]))
    return out


def relative_to_exact(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Each trained row − the exact row of the same routing mode and Euler steps (exact FM experts, exact text-free
    router, the captions): what the trained parts cost beyond the sampler's own discretisation error (the exact
    rows sit at Δ log p ≈ +33 at 25 steps). The monolith, a caption-conditional sampler, against the exact oracle
    row (the exact conditional velocity)."""
    rows = {n: r["row"] for n, r in results.items() if r["row"].get("prompts", "captions") == "captions"}
    exact = {
        r["mode"]: n
        for n, r in rows.items()
        if r["group"] == "exact"
        and r["experts"] == "exact-fm"
        and r["router"] == "exact"
        and r["prompts"] == "captions"
        and r["steps_factor"] == 1
    }
    out = []
    for n, r in rows.items():
        if r["group"] == "exact":
            continue
        mode = "oracle" if r["group"] == "monolith" else r["mode"]
        if mode in exact and r.get("steps_factor", 1) == 1:
            out.append((f"{n} − exact ({mode})", n, exact[mode]))
    return out


def trainings_of(results: dict[str, Any]) -> int:
    """The number of trainings behind the trained rows (1 when none has ``per_training``)."""
    return max((len(r["per_training"]) for r in results.values() if "per_training" in r), default=1)


TRAINING_0_ONLY = ("router_steps", "per_sample_file", "sampling_seconds", "reused_from")
"""A trained row's fields that are training 0's alone (its per-step router record, its samples' file, its sampling
time, where its row was adopted from)."""


def nested_by_metric(per_training: list[list[dict]], keys) -> dict[str, dict]:
    """Per metric of ``keys``, :func:`~hddm_flower.training_seeds.nested_interval` of ``[training][seed]`` values."""
    return {k: nested_interval([[m[k] for m in seeds] for seeds in per_training]) for k in keys}


def over_trainings(results: dict[str, Any], keep: list[int]) -> dict[str, Any]:
    """``results`` read over the trainings ``keep`` only (e.g. leaving out one a learning rate was picked on): each
    trained row's ``per_training`` keeps those trainings in that order, its ``per_seed`` and ``metrics`` (the metrics
    the run summarised) become the first kept training's, its ``nested`` intervals are over the kept trainings (for
    one, none: its intervals are over sampling seeds), and its fields of :data:`TRAINING_0_ONLY` stay only when
    training 0 is the first kept. The exact rows do not depend on a training and stay. Raises ValueError for an index
    the rows do not have, a repeated one, or none."""
    n = trainings_of(results)
    if not keep:
        raise ValueError("no training to read over: name at least one")
    if bad := [i for i in keep if not 0 <= i < n]:
        raise ValueError(f"training {bad[0]}: these results hold trainings 0–{n - 1}")
    if len(set(keep)) != len(keep):
        raise ValueError(f"trainings {' '.join(map(str, keep))}: each training once")
    out = {}
    for name, r in results.items():
        if "per_training" not in r:
            out[name] = r
            continue
        per_training = [r["per_training"][i] for i in keep]
        first, keys = per_training[0], list(r["metrics"])
        dropped = ("per_training", "nested", *(TRAINING_0_ONLY if keep[0] != 0 else ()))
        row = {k: v for k, v in r.items() if k not in dropped}
        row |= {"per_seed": first, "metrics": {k: interval([m[k] for m in first]) for k in keys}}
        if len(keep) > 1:
            row |= {"per_training": per_training, "nested": nested_by_metric(per_training, keys)}
        out[name] = row
    return out


def paired_summary(a: list[list[float]], b: list[list[float]]) -> dict[str, Any]:
    """The paired difference ``a − b`` (``[training][seed]``): over trainings (outer) with the inner half-width
    when there are several, else over the one training's sampling seeds; ``covers`` says which, ``resolved``
    whether the interval excludes 0."""
    d = paired(a, b)
    if len(d) > 1:
        iv = nested_interval(d) | {"covers": "trainings"}
    else:
        iv = interval(d[0]) | {"covers": "sampling seeds of one training", "per_seed": d[0]}
    return iv | {"resolved": iv["n"] > 1 and not iv["lo"] <= 0 <= iv["hi"]}  # one value has no interval


def paired_truth(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every comparison of :func:`comparisons` with, per metric of :data:`PAIRED_METRICS` that both rows have, its
    :func:`paired_summary`."""
    n = trainings_of(results)
    out = []
    listed = [(c, "paired") for c in comparisons(results)] + [(c, "attribution") for c in attribution(results)]
    for (what, a, b), table in listed:
        entry: dict[str, Any] = {"what": what, "a": a, "b": b, "table": table}
        for m in PAIRED_METRICS:
            if m in results[a]["per_seed"][0] and m in results[b]["per_seed"][0]:
                entry[m] = paired_summary(row_values(results, a, m, n), row_values(results, b, m, n))
        out.append(entry)
    return out


TABLE_3 = "**Table 3 — paired differences (row a − row b, by training and sampling seed).**"
TABLE_4 = (
    "**Table 4 — attribution on the empty caption (row a − row b, by training and sampling seed).** The target is "
    "the whole mixture, where full routing of exact experts by the exact router is the truth (up to Euler error): "
    "the gap of trained experts with the trained router to that, and its router's and experts' shares, both orders "
    "(E = exact, T = trained; experts first, router second)."
)


def render_paired(paired_rows: list[dict[str, Any]], trainings: int, seeds: int, title: str = TABLE_3) -> list[str]:
    """A table of paired differences (markdown lines; Table 3 by default), with what their intervals cover."""
    if trainings > 1:
        covers = (
            f"mean over {trainings} trainings ± the half-width of the 95 % Student-t interval over trainings (outer; "
            f"each training's value is its mean over {seeds} sampling seeds) [the mean half-width over sampling "
            "seeds within one training, inner]"
        )
    else:
        covers = (
            f"mean ± the half-width of the 95 % Student-t interval over {seeds} sampling seeds of **one** training: "
            "it says nothing about another training of the same config (`evaluation.training_seeds` > 1 for that)"
        )
    lines = [
        f"{title} Each cell: {covers}; resolved = the interval excludes 0.",
        "",
        "| comparison | Δ log p (mean) | Δ log p (median) | deficit p90 | Δ log p(x \\| c) "
        "| MMD² ×10³ at 0.25× / 1× / 4× bandwidth | mode TV | cluster TV | cluster adherence | resolved |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(iv: dict | None, spec: str, scale: float = 1.0) -> str:
        if iv is None:
            return "–"
        inner = f" [{iv['inner_half'] * scale:{spec}}]" if "inner_half" in iv else ""
        return f"{iv['mean'] * scale:+{spec}} ± {iv['half'] * scale:{spec}}{inner}"

    for e in paired_rows:
        res = [m for m in PAIRED_METRICS if e.get(m) and e[m]["resolved"]]
        lines.append(
            f"| {e['what']} | {cell(e.get('delta_log_density'), '.2f')} | "
            f"{cell(e.get('delta_log_density_median'), '.2f')} | {cell(e.get('log_deficit_p90'), '.2f')} | "
            f"{cell(e.get('delta_log_density_cond'), '.2f')} | "
            + " / ".join(cell(e.get(m), ".2f", 1e3) for m in ("mmd2_bw0.25", "mmd2", "mmd2_bw4"))
            + f" | {cell(e.get('mode_tv'), '.3f')} | {cell(e.get('cluster_tv'), '.3f')} | "
            f"{cell(e.get('cluster_adherence'), '.3f')} | "
            f"{', '.join(res) or 'no'} |"
        )
    return lines
