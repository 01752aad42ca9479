"""``hddm reproduce``'s tables: ``OUT/tables.md`` from the results, beside the paper's numbers (KID first, FID,
adherence and diversity per row; paired differences by training and seed in Table 3)."""

from __future__ import annotations

from typing import Any

from ..budget import describe as describe_budget
from ..budget import describe_rates

# The paper's numbers (arXiv 2603.06741): HDDM table 1 (DiT-XL/2 experts, LAION-Aesthetics 11M, top-2, CFG 7.5,
# 50 steps, FID-50K; LPIPS mean ± std), HDDM table 2 (DiT-B/2 experts, LAION-Art 3.9M, FID-50K) and DDM's
# ImageNet table 1 (8 experts, FID).
PAPER_HETERO = {"8FM": (12.45, "0.617 ± 0.074"), "2DDPM:6FM": (11.88, "0.631 ± 0.078")}


PAPER_ROUTING = {
    "monolith": (29.64, 12.81),
    "top1": (30.60, 9.84),
    "top2": (22.60, 10.31),
    "full": (47.89, 10.52),
    "threshold": (None, 10.46),
    "oracle": (None, 10.46),
}


FLOOR = "real (floor)"
"""The results' row of the real-vs-real floor (``evaluation.prompt_sampling: stratified``)."""


def row_summary(r: dict) -> dict:
    """A row's entry in the manifest: per mode its values (training 0, seed 0), per-seed values and intervals, and
    with several trainings the per-training values and the nested intervals."""
    out = {}
    for mode, x in r["modes"].items():
        entry = {k: x[k] for k in ("kid", "kid_std", "fid")} | {"adherence": x.get("adherence")}
        if "lpips" in x:
            entry |= {"diversity": x["lpips"]["mean"], "diversity_std": x["lpips"]["std"]}
        for key in ("per_seed", "intervals", "per_training", "nested"):
            if key in r:
                entry[key] = r[key][mode]
        out[mode] = entry
    return out


SHOWN = (("kid", ".4f"), ("fid", ".2f"), ("adherence", ".3f"), ("diversity", ".3f"))
"""The tables' metrics in their order (KID first) and formats."""


def _cells(r: dict, mode: str) -> list[str]:
    """KID, FID, adherence and diversity of one row's ``mode``: over trainings (``mean ± half [inner half]``) when
    there are several, else the mean over seeds ± its 95 % half-width when there are several seeds, else the one
    seed's value (KID ± its spread over subsets, diversity ± its spread over prompts). "–" where a row has none."""
    if "nested" in r or ("intervals" in r and r["intervals"][mode].get("kid", {}).get("n", 1) > 1):
        iv = r["nested"][mode] if "nested" in r else r["intervals"][mode]

        def cell(m: str, spec: str) -> str:
            if m not in iv:
                return "–"
            inner = f" [{iv[m]['inner_half']:{spec}}]" if "inner_half" in iv[m] else ""
            return f"{iv[m]['mean']:{spec}} ± {iv[m]['half']:{spec}}{inner}"

        return [cell(m, spec) for m, spec in SHOWN]
    x = r["modes"][mode]
    kid = "–" if x["kid"] is None else f"{x['kid']:.4f} ± {x['kid_std']:.4f}"
    div = f"{x['lpips']['mean']:.3f} ± {x['lpips']['std']:.3f}" if "lpips" in x else "–"
    return [kid, f"{x['fid']:.2f}", _f(x.get("adherence"), ".3f"), div]


def _f(x: float | None, spec: str = ".2f") -> str:
    return "–" if x is None else format(x, spec)


PAIRED_METRICS = ("kid", "fid", "adherence")


def _layout(r: dict, mode: str, metric: str, trainings: int) -> list[list[float]]:
    """``values[i][j]`` of a row's metric for training i and sampling seed j; a row that does not depend on a
    training (the floor) has the same values in every training."""
    per = r["per_training"][mode] if "per_training" in r else [r["per_seed"][mode]] * trainings
    return [[v[metric] for v in seeds] for seeds in per]


def paired_differences(results: dict) -> list[dict]:
    """The paper's comparisons as differences paired by training and seed (every row of a seed shares its prompts,
    noise and reference, and every row of training i that training's experts, router and monolith, so what moves
    every row of a seed together cancels): per configuration, top-2 − each other mode and top-2 − the monolith;
    across configurations, each pair at top-2; with a floor row, top-2 and the monolith − the floor. Each entry:
    ``what``, ``a``, ``b`` and per metric of :data:`PAIRED_METRICS` that both rows have
    :func:`~hddm_flower.gmm.compare.paired_summary` (over trainings with the inner half-width when there are
    several, else over the sampling seeds of the one training; ``covers`` says which; ``resolved`` = the interval
    excludes 0). Empty with one training and one seed."""
    from ..gmm.compare import paired_summary

    trainings = max(
        (len(next(iter(r["per_training"].values()))) for r in results.values() if "per_training" in r), default=1
    )
    if any("per_seed" not in r for r in results.values()):
        return []
    seeds = min(len(v) for r in results.values() for v in r["per_seed"].values())
    if trainings == 1 and seeds < 2:
        return []
    names = [n for n in results if n not in ("monolith", FLOOR) and "top2" in results[n]["per_seed"]]
    pairs = [((n, "top2"), (n, m)) for n in names for m in results[n]["per_seed"] if m != "top2"]
    pairs += [((n, "top2"), ("monolith", "top1")) for n in names if "monolith" in results]
    pairs += [((b, "top2"), (a, "top2")) for i, a in enumerate(names) for b in names[i + 1 :]]
    if FLOOR in results:
        pairs += [((n, "top2"), (FLOOR, "real")) for n in names]
        pairs += [(("monolith", "top1"), (FLOOR, "real"))] if "monolith" in results else []
    out = []
    for (na, ma), (nb, mb) in pairs:
        if na == nb:
            what = f"{na}: {ma} − {mb}"
        elif nb == FLOOR:
            what = f"{na if na == 'monolith' else na + ': ' + ma} − {FLOOR}"
        elif nb == "monolith":
            what = f"{na}: {ma} − monolith"
        else:
            what = f"{ma}: {na} − {nb}"
        entry: dict[str, Any] = {"what": what, "a": [na, ma], "b": [nb, mb]}
        ra, rb = results[na], results[nb]
        for m in PAIRED_METRICS:
            if all(v.get(m) is not None for r, mode in ((ra, ma), (rb, mb)) for v in r["per_seed"][mode]):
                entry[m] = paired_summary(_layout(ra, ma, m, trainings), _layout(rb, mb, m, trainings))
        out.append(entry)
    return out


def _covers(trainings: int, seeds: int) -> str:
    """What a cell's ± covers."""
    if trainings > 1:
        return (
            f"Trainings: {trainings} (`evaluation.training_seeds`: experts, router and monolith retrained with moved "
            f"seeds) × Seeds: {seeds} (`evaluation.seed` + 0 … {seeds - 1}: other prompts and noise, the same feature "
            "network and reference statistics); each cell is the mean over trainings ± the half-width of the 95 % "
            "Student-t interval over trainings of the per-training means over seeds [the mean half-width over seeds "
            "within one training]. The floor does not depend on a training: its ± is over the seeds."
        )
    if seeds > 1:
        return (
            f"Seeds: {seeds} (`evaluation.seed` + 0 … {seeds - 1}: other prompts and noise, the same feature network "
            "and reference statistics); each cell is the mean over seeds ± the half-width of its 95 % Student-t "
            "interval, over sampling seeds of **one** training: it says nothing about another training of the same "
            "config (`evaluation.training_seeds` > 1 for that)."
        )
    return (
        "One seed: KID ± its standard deviation over subsets, diversity ± its standard deviation over prompts; "
        "nothing here is an interval across seeds or trainings."
    )


def _feature_line(manifest: dict, r: dict) -> str:
    """The feature network of every FID/KID, KID and adherence value, with its fingerprints."""
    fn = manifest["artefacts"]["feature_net"]
    return (
        f"FID/KID features and adherence classifier: **{r['feature_network']}**, weights state fingerprint "
        f"`{fn['state_fingerprint']}`, tensor sha256 `{fn['tensor_sha256']}`; reference statistics cache key "
        f"`{r.get('reference_key', '–')}`. Diversity: {r['diversity_distance']}."
    )


def _floor_line(results: dict) -> list[str]:
    if FLOOR not in results:
        return [
            "No real-vs-real floor (`evaluation.prompt_sampling: random`): the prompts' cluster mix changes with the "
            "seed and the reference is every image."
        ]
    f = results[FLOOR]["modes"]["real"]
    return [
        f"Prompts: `evaluation.prompt_sampling: stratified`, {results[FLOOR]['protocol']['prompt_source']}; every "
        "row of a seed is scored against one reference of the same cluster mix. "
        f"**{FLOOR}**: {f['num_samples']} real images ({f['per_cluster']} per cluster, the samples' count), drawn "
        "per seed out of that reference and scored against it with the same features: what a sampler that drew "
        "real images would score at this count (the yardstick of the KID/FID values above it)."
    ]


def render_tables(manifest: dict, results: dict) -> str:
    """The two tables (markdown), each beside the paper's numbers, and the paired differences (Table 3), with how
    they were produced: KID first (unbiased at these sample counts; FID is biased upwards by ~1/N), FID beside it,
    adherence (the feature classifier puts a sample in its prompt's cluster) and diversity per row, the real-vs-real
    floor when the prompts are stratified."""
    cfg = manifest["config"]
    anyr = results["monolith"]
    p = anyr["protocol"]
    names = [n for n in results if n not in ("monolith", FLOOR)]
    seeds = len(next(iter(anyr["per_seed"].values()))) if "per_seed" in anyr else 1
    trainings = manifest["seeds"]["trainings"]
    floor = FLOOR in results
    lines = [
        f"Produced by `{manifest['command'] or 'hddm reproduce'}` on {manifest['created_at']} in "
        f"{manifest['seconds'] / 60:.1f} min wall, {manifest['cpu_seconds'] / 60:.1f} min CPU ({manifest['device']}, "
        f"{manifest['torch_threads']} torch threads, load average {manifest['load_average']['start'][0]} at the "
        f"start, {manifest['load_average']['end'][0]} at the end; training {manifest['timings_s']['training']:.0f} "
        f"s in {manifest['training_processes']} process(es), router {manifest['timings_s']['router']:.0f} s, "
        f"evaluation {manifest['timings_s']['evaluation']:.0f} s).",
        f"Scale: {cfg['num_experts']} experts `{cfg['expert']['preset']}` on {manifest['dataset']['dataset']}; "
        f"monolith: the same network on all clusters; {describe_budget(manifest['budget'])}, {describe_rates(cfg)}. Router "
        f"`{cfg['router']['preset']}` × {cfg['router']['steps']} steps.",
        f"Aligned inference: {p['prompts']} prompts × {p['samples_per_prompt']} samples, the same noise for every "
        f"row, {p['sampler']}, {p['num_steps']} steps, CFG {p['cfg_scale']}, threshold {p['threshold']}; "
        f"reference: {p['reference']}.",
        *_floor_line(results),
        _feature_line(manifest, anyr),
        _covers(trainings, seeds),
        "",
        "**Table 1 — heterogeneous vs homogeneous (top-2 routing).** KID is the primary metric at these counts.",
        "",
        "| configuration | KID ↓ | FID ↓ | adherence ↑ | intra-prompt diversity ↑ | paper FID-50K "
        "| paper intra-prompt LPIPS |",
        "|---|---|---|---|---|---|---|",
    ]
    for n in names:
        if "top2" not in results[n]["modes"]:
            continue
        paper = PAPER_HETERO.get(n, (None, "–"))
        lines.append(f"| {n} | " + " | ".join(_cells(results[n], "top2")) + f" | {_f(paper[0])} | {paper[1]} |")
    lines.append("| monolith (equal compute) | " + " | ".join(_cells(results["monolith"], "top1")) + " | – | – |")
    if floor:
        lines.append(f"| {FLOOR} | " + " | ".join(_cells(results[FLOOR], "real")) + " | – | – |")
    lines += [
        "",
        "**Table 2 — routing vs a monolith of equal compute (KID ↓; FID in brackets; adherence ↑ after the slash).**",
        "",
        "| inference | " + " | ".join(names) + " | paper HDDM (DiT-B/2, FID-50K) | paper DDM (ImageNet, FID) |",
        "|---" * (len(names) + 3) + "|",
    ]

    def kfa(r: dict, mode: str) -> str:
        if mode not in r["modes"]:
            return "–"
        kid, fid, adh, _ = _cells(r, mode)
        return f"{kid} ({fid}) / {adh}"

    paper = PAPER_ROUTING["monolith"]
    mono_cell = kfa(results["monolith"], "top1")
    lines.append("| monolith | " + " | ".join(mono_cell for _ in names) + f" | {_f(paper[0])} | {_f(paper[1])} |")
    for mode in results[names[0]]["modes"]:
        paper = PAPER_ROUTING.get(mode, (None, None))
        cells = [kfa(results[n], mode) for n in names]
        lines.append(f"| {mode} | " + " | ".join(cells) + f" | {_f(paper[0])} | {_f(paper[1])} |")
    if floor:
        floor_cell = kfa(results[FLOOR], "real")
        lines.append(f"| {FLOOR} | " + " | ".join(floor_cell for _ in names) + " | – | – |")
    paired = paired_differences(results)
    if paired:
        covers = next(iter(e[m]["covers"] for e in paired for m in PAIRED_METRICS if m in e))
        lines += [
            "",
            f"**Table 3 — paired differences (row a − row b by training and seed; every row of a seed shares its "
            f"prompts, noise and reference).** Each cell: mean ± 95 % half-width over {covers}"
            + (" [the mean half-width over seeds within one training]" if trainings > 1 else "")
            + "; resolved = the interval excludes 0. KID first.",
            "",
            "| comparison | KID difference | FID difference | adherence difference | resolved |",
            "|---|---|---|---|---|",
        ]

        def cell(iv: dict | None, spec: str) -> str:
            if iv is None:
                return "–"
            inner = f" [{iv['inner_half']:{spec}}]" if "inner_half" in iv else ""
            return f"{iv['mean']:+{spec}} ± {iv['half']:{spec}}{inner}"

        for e in paired:
            res = [m.upper() if m != "adherence" else m for m in PAIRED_METRICS if e.get(m) and e[m]["resolved"]]
            lines.append(
                f"| {e['what']} | {cell(e.get('kid'), '.4f')} | {cell(e.get('fid'), '.2f')} | "
                f"{cell(e.get('adherence'), '.3f')} | {', '.join(res) or 'no'} |"
            )
    acc = results[names[0]]["router_top1_accuracy"]
    lines += [
        "",
        "Paper columns: HDDM's routing table has no threshold/oracle rows (its threshold ablation, at "
        "another scale, gives FID 38.28 at 0.2); DDM's threshold row is Threshold-0.01. The paper's numbers "
        "come from 50K samples of 256² LAION/ImageNet images with Inception features: compare orderings, "
        "not values.",
        "",
        "Router top-1 accuracy against the cluster labels by t (held-out images; the router is shared by "
        "all configurations"
        + ("; training 0's" if trainings > 1 else "")
        + "): "
        + ", ".join(f"t={t}: {a:.2f}" for t, a in acc.items()),
        "",
    ]
    return "\n".join(lines)
