"""Claims in docs/results.md checked against the committed results: the section "## A router that reads the prompt,
on the Gaussian mixture" with its subsection "### On the embedded data", up to, not including, the heading "## Trained
DDPM experts against the exact velocity".

That is: the run of ``benchmarks/gmm_prompt_router.py`` (``gmm_prompt_router.json``: its command, machine, load,
date and wall time, its protocol, the four rows of its table, the prose on them); the router of
``configs/reproduce-gmm.yaml`` it trains; the colour-caption run (``reproduce-gmm-colour-manifest.json``: the exact
and the trained experts under the exact prompt-aware and the exact text-free router, with their verdicts computed as
the project pairs them, by training and sampling seed); the prompt-aware router's cluster adherence on the budget
ladder's subspace rungs (``reproduce-gmm-subspace-{800,3200}{,-text}-manifest.json``); and the embedded-data summary
(``embedded_trainings.json``, ``configs/default.yaml``).

Every number is recomputed from ``benchmarks/results/`` and written as the doc writes it (prose: the unicode minus,
a thousands comma, the doc's decimals; the table copied from the benchmark's ``.md``: the writer's own format), then
looked up in the passage with its whitespace folded. A verdict word ("not resolved", "tie", "resolved", "neither
resolved") and a bold cell are checked against the intervals of the files."""

import math
import re
import statistics

import pytest

from hddm_flower.config.io import load_config
from hddm_flower.gmm.truth import interval

from .doc_claims import DOC as RESULTS_DOC
from .doc_claims import RESULTS, ROOT, iv, load, num, passage, raw_passage, resolved

DOC = RESULTS_DOC
START = "## A router that reads the prompt, on the Gaussian mixture"
END = "## Trained DDPM experts against the exact velocity"
EMBEDDED = "### On the embedded data"

PROMPT_ROUTER = "gmm_prompt_router.json"
EXACT = "exact FM experts · exact router · top2"
EXACT_TEXT = "exact FM experts · exact prompt-aware router · top2"
TRAINED_NONE = "exact FM experts · trained router (none) · top2"
TRAINED_TEXT = "exact FM experts · trained router (text) · top2"
COUNTERPART = {EXACT_TEXT: EXACT, TRAINED_TEXT: TRAINED_NONE}  # a prompt-aware row and its text-free one
TABLE_METRICS = (("cluster_adherence", 1, ".3f"), ("adherence", 1, ".3f"), ("mode_tv", 1, ".3f"), ("mmd2", 1e3, ".2f"))

COLOUR = "reproduce-gmm-colour-manifest.json"
COLOUR_EXACT_TEXT, COLOUR_EXACT = EXACT_TEXT, EXACT  # exact FM experts, over sampling seeds
COLOUR_TRAINED_TEXT, COLOUR_TRAINED = "8FM · top2 · exact prompt-aware router", "8FM · top2 · exact router"

LADDER_TEXT = {800: "subspace-800-text", 3200: "subspace-3200-text"}  # equal steps, router.conditioning: text
LADDER_FREE = {800: "subspace-800", 3200: "subspace-3200"}  # equal steps, the text-free router
EMBEDDED_ARM = "text · clamp"
WORDS = ("zero", "one", "two", "three", "four")


def text() -> str:
    return passage(START, END, DOC)


def raw() -> str:
    return raw_passage(START, END, DOC)


def record() -> dict:
    return load(PROMPT_ROUTER)


def metrics(name: str) -> dict:
    return record()["rows"][name]["metrics"]


def colour(name: str, metric: str) -> dict:
    """A colour-run row's metric: over trainings (``nested``) where it has trainings, else over sampling seeds."""
    r = load(COLOUR)["results"][name]
    return r.get("nested", r["metrics"])[metric]


def manifest(run: str) -> dict:
    return load(f"reproduce-gmm-{run}-manifest.json")


def level(x: float, digits: int) -> str:
    """A level (an adherence, a TV, an MMD²) without a sign, as the prose writes it."""
    return num(x, digits, sign=False)


def level_iv(x: dict, digits: int, scale: float = 1.0) -> str:
    return f"{level(x['mean'] * scale, digits)} ± {level(x['half'] * scale, digits)}"


def paired(a: str, b: str, metric: str, name: str = COLOUR) -> dict:
    """Row a − row b of a manifest, paired by training and sampling seed (``hddm_flower.gmm.compare.paired_summary``):
    over trainings of the per-training mean differences where the rows have trainings, else over sampling seeds."""
    ra, rb = load(name)["results"][a], load(name)["results"][b]
    if "per_training" in ra and "per_training" in rb:
        diffs = [
            statistics.fmean(x[metric] - y[metric] for x, y in zip(u, v, strict=True))
            for u, v in zip(ra["per_training"], rb["per_training"], strict=True)
        ]
    else:
        diffs = [x[metric] - y[metric] for x, y in zip(ra["per_seed"], rb["per_seed"], strict=True)]
    return interval(diffs)


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def slug(heading: str) -> str:
    """A markdown heading's anchor as GitHub writes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path) -> set[str]:
    return {slug(line.lstrip("#")) for line in path.read_text().splitlines() if line.startswith("#")}


# --- the section and its files


def test_the_section_runs_from_its_heading_to_the_trained_ddpm_heading_and_holds_the_embedded_subsection():
    assert text().startswith(START)
    assert END not in text()
    assert text().count(EMBEDDED) == 1
    assert text().index("(`benchmarks/results/gmm_prompt_router.md` and `.json`") < text().index(EMBEDDED)


def test_the_result_files_and_configs_the_section_names_are_committed():
    names = re.findall(r"`benchmarks/results/([^`]+)`", text())
    assert "gmm_prompt_router.md" in names and "reproduce-gmm-colour-tables.md" in names
    for name in names:
        assert (RESULTS / name).is_file(), name
    assert "`benchmarks/results/gmm_prompt_router.md` and `.json`" in text()
    assert (RESULTS / PROMPT_ROUTER).is_file()
    configs = re.findall(r"`(configs/[^`]+\.yaml)`", text())
    assert {"configs/reproduce-gmm.yaml", "configs/reproduce-gmm-colour.yaml", "configs/default.yaml"} <= set(configs)
    for config in configs:
        assert (ROOT / config).is_file(), config


def test_the_sections_links_point_at_existing_headings():
    own = anchors(DOC)
    links = re.findall(r"\]\((design\.md)?#([^)]+)\)", text())
    assert len(links) >= 4
    for page, anchor in links:
        assert anchor in (anchors(ROOT / "docs" / page) if page else own), (page, anchor)


# --- the run of benchmarks/gmm_prompt_router.py


def test_the_run_records_command_machine_load_date_and_wall_time_are_the_jsons():
    r = record()
    arch, cores, threads = re.fullmatch(r"(\S+), (\d+) CPUs, (\d+) torch thread\(s\)", r["machine"]).groups()
    start, end = r["load_average"]["start"][0], r["load_average"]["end"][0]
    assert start > int(cores) and end > int(cores)  # **shared**: the load is above the cores
    source = (ROOT / "benchmarks" / "gmm_prompt_router.py").read_text()
    (now,) = re.findall(r'"command": "(python -m benchmarks\.gmm_prompt_router) "', source)
    assert (
        f"| `{r['command']}` (now `{now} …`) | {cores}-core {arch}, {WORDS[int(threads)]} torch thread, **shared**: "
        f"load average {start:.1f} at the start, {end:.1f} at the end | {r['date'][:10]} | "
        f"{num(r['seconds'], 0, sign=False)} s |"
    ) in text()


def test_the_protocol_sentence_is_the_jsons_protocol():
    r, pr = record(), record()["protocol"]
    (per_prompt,) = re.findall(r"--samples-per-prompt (\d+)", r["command"])
    captions = pr["samples_per_seed"] // int(per_prompt)
    cfg = load_config(ROOT / "configs" / "reproduce-gmm.yaml")
    assert captions * int(per_prompt) == pr["samples_per_seed"]
    assert captions == cfg.num_experts * cfg.data.gmm_components  # every component's caption
    assert all(name.startswith("exact FM experts · ") and name.endswith(" · top2") for name in r["rows"])
    assert (
        f"top-2 routing, every component's caption × {per_prompt} samples = {pr['samples_per_seed']} samples per "
        f"seed, {pr['seeds']} seeds, {pr['num_steps']} Euler steps, scored against fresh true samples."
    ) in text()


def test_the_trained_routers_are_the_configs_and_each_is_trained_three_times():
    pr = record()["protocol"]["router"]
    cfg = load_config(ROOT / "configs" / "reproduce-gmm.yaml").router
    assert (pr["preset"], pr["steps"], pr["caption_dropout"]) == (cfg.preset, cfg.steps, cfg.caption_dropout)
    (trainings,) = {record()["rows"][n]["trainings"] for n in (TRAINED_NONE, TRAINED_TEXT)}
    for n in (TRAINED_NONE, TRAINED_TEXT):
        assert len(record()["rows"][n]["per_training"]) == len(record()["rows"][n]["final_loss"]) == trainings
    assert (
        f"The trained routers are the config's (`{pr['preset']}`, {pr['steps']} steps, {cfg.training}; caption "
        f"dropout {pr['caption_dropout']}), each trained {trainings} times (router seeds "
        f"{', '.join(str(i) for i in range(trainings))})"
    ) in text()


def test_the_trained_rows_are_the_mean_and_95_percent_student_t_interval_over_trainings_the_exact_over_seeds():
    seeds = record()["protocol"]["seeds"]
    for name in (TRAINED_NONE, TRAINED_TEXT):
        r = record()["rows"][name]
        for metric, x in r["metrics"].items():
            expected = interval([t[metric] for t in r["per_training"]])
            assert close(x["mean"], expected["mean"]) and close(x["half"], expected["half"]), (name, metric)
    for name in (EXACT, EXACT_TEXT):
        r = record()["rows"][name]
        assert r["trainings"] == 0 and "per_training" not in r
        assert {x["n"] for x in r["metrics"].values()} == {seeds}
    assert (
        "their rows are the mean over the trainings with a 95 % Student-t interval across trainings; the exact rows "
        f"(no training) have one over the {seeds} sampling seeds."
    ) in text()


def test_the_interval_helper_reproduces_the_colour_manifests_own_intervals_and_paired_differences():
    results = load(COLOUR)["results"]
    for name in (COLOUR_EXACT, COLOUR_EXACT_TEXT):
        for metric in ("cluster_tv", "mmd2"):
            x = interval([s[metric] for s in results[name]["per_seed"]])
            assert close(x["half"], results[name]["metrics"][metric]["half"])
    (entry,) = [e for e in load(COLOUR)["paired"] if e["what"] == "8FM: top2, trained − exact router"]
    for metric in ("cluster_tv", "mmd2"):
        mine, theirs = paired(entry["a"], entry["b"], metric), entry[metric]
        assert close(mine["mean"], theirs["mean"]) and close(mine["half"], theirs["half"])


def chance() -> float:
    """One cluster in all: a caption's cluster holds gmm_components of the mixture's captions."""
    pr = record()["protocol"]
    (per_prompt,) = re.findall(r"--samples-per-prompt (\d+)", record()["command"])
    captions = pr["samples_per_seed"] // int(per_prompt)
    return load_config(ROOT / "configs" / "reproduce-gmm.yaml").data.gmm_components / captions


def test_chance_cluster_adherence_is_one_cluster_in_all():
    assert f"most probable component lies in the prompted cluster (chance {level(chance(), 3)})." in text()
    assert f"(chance {100 * chance():.1f} %)" in text()


# --- the table


def md_cell(x: dict, scale: float, spec: str) -> str:
    """A cell as benchmarks/gmm_prompt_router.py writes its .md table (the doc copies that table)."""
    return f"{x['mean'] * scale:{spec}} ± {x['half'] * scale:{spec}}"


def above_text_free(name: str) -> bool:
    """A prompt-aware row's cluster adherence resolved above chance and above its text-free counterpart's: paired
    by training where both rows have trainings, else the two intervals apart."""
    x = metrics(name)["cluster_adherence"]
    if name not in COUNTERPART or x["lo"] <= chance():
        return False
    other = COUNTERPART[name]
    if "per_training" in record()["rows"][name]:
        a, b = (record()["rows"][n]["per_training"] for n in (name, other))
        return resolved(interval([u["cluster_adherence"] - v["cluster_adherence"] for u, v in zip(a, b)]))
    return x["lo"] > metrics(other)["cluster_adherence"]["hi"]


def doc_table() -> dict[str, list[str]]:
    lines = [line.strip() for line in raw().splitlines() if line.strip().startswith("|")]
    (header,) = [i for i, line in enumerate(lines) if line.startswith("| row |")]
    assert lines[header] == "| row | trainings | cluster adherence | adherence | mode TV | MMD² ×10³ |"
    assert lines[header + 1] == "|---|---|---|---|---|---|"
    rows = {}
    for line in lines[header + 2 : header + 2 + len(record()["rows"])]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


@pytest.mark.parametrize("name", [EXACT, EXACT_TEXT, TRAINED_NONE, TRAINED_TEXT])
def test_each_table_row_is_the_jsons_row_bold_where_the_prompt_aware_router_is_resolved_above_the_text_free(name):
    r = record()["rows"][name]
    cells = [str(r["trainings"] or "–")]
    for metric, scale, spec in TABLE_METRICS:
        cell = md_cell(r["metrics"][metric], scale, spec)
        cells.append(f"**{cell}**" if metric == "cluster_adherence" and above_text_free(name) else cell)
    assert doc_table()[re.sub(r"\((none|text)\)", r"(`\1`)", name)] == cells


def test_the_table_bolds_the_cluster_adherence_of_both_prompt_aware_rows_only():
    assert [n for n in record()["rows"] if above_text_free(n)] == [EXACT_TEXT, TRAINED_TEXT]
    for name in (EXACT, TRAINED_NONE):  # the text-free routers sit at chance
        x = metrics(name)["cluster_adherence"]
        assert x["lo"] <= chance() <= x["hi"]


# --- what it shows


def test_the_exact_prompt_aware_router_puts_its_share_in_the_prompted_cluster_against_the_text_free_routers():
    aware, free = (metrics(n)["cluster_adherence"]["mean"] for n in (EXACT_TEXT, EXACT))
    assert (
        f"the exact prompt-aware router `p(k | x_t, t, c)` puts {100 * aware:.1f} % of the samples in the prompted "
        f"cluster where the exact text-free router puts {100 * free:.1f} % (chance {100 * chance():.1f} %)"
    ) in text()


def test_by_mmd_the_exact_prompt_aware_routers_samples_match_the_true_ones_and_the_text_free_routers_do_not():
    aware, free = metrics(EXACT_TEXT)["mmd2"], metrics(EXACT)["mmd2"]
    assert aware["lo"] <= 0 or aware["hi"] <= 0  # not above the true-vs-true value
    assert free["lo"] > 0  # resolved above 0
    assert f"its samples match the true ones by MMD ({iv(aware, 2, scale=1e3)} ×10⁻³;" in text()
    assert f"where the text-free router's do not ({level_iv(free, 1, scale=1e3)})" in text()


def test_every_training_of_the_prompt_aware_router_gives_the_exact_routers_values_to_the_printed_digits():
    trainings = record()["rows"][TRAINED_TEXT]["per_training"]
    for t in trainings:
        for metric, scale, spec in TABLE_METRICS:
            assert f"{t[metric] * scale:{spec}}" == f"{metrics(EXACT_TEXT)[metric]['mean'] * scale:{spec}}", metric
    assert (
        f"The trained prompt-aware router reaches the same values as the exact one in all {WORDS[len(trainings)]} "
        "trainings (their samples agree to the printed digits:"
    ) in text()


def test_the_trained_text_free_router_reaches_the_exact_text_free_routers_values():
    for metric, _, _ in TABLE_METRICS:
        a, b = metrics(TRAINED_NONE)[metric], metrics(EXACT)[metric]
        assert a["lo"] <= b["hi"] and b["lo"] <= a["hi"], metric  # the intervals overlap
    assert "the trained text-free router those of the exact text-free one." in text()


# --- the colour captions


def test_the_colour_runs_config_seeds_and_trainings_are_its_manifests():
    m = load(COLOUR)
    (config,) = re.findall(r"--config (\S+)", m["command"])
    seeds = m["config"]["evaluation"]["seeds"]
    assert colour(COLOUR_EXACT, "cluster_tv")["n"] == seeds
    assert colour(COLOUR_TRAINED, "cluster_tv")["trainings"] == m["seeds"]["trainings"]
    assert (
        f"`{config}`; `benchmarks/results/reproduce-gmm-colour-tables.md`, {seeds} sampling seeds of exact parts, "
        f"{m['seeds']['trainings']} trainings of trained experts;"
    ) in text()


def test_with_exact_experts_the_exact_prompt_aware_router_gives_lower_point_estimates_on_the_colour_captions():
    tv = [colour(n, "cluster_tv") for n in (COLOUR_EXACT_TEXT, COLOUR_EXACT)]
    mmd = [colour(n, "mmd2") for n in (COLOUR_EXACT_TEXT, COLOUR_EXACT)]
    assert tv[0]["mean"] < tv[1]["mean"] and mmd[0]["mean"] < mmd[1]["mean"]
    assert {x["n"] for x in (*tv, *mmd)} == {load(COLOUR)["config"]["evaluation"]["seeds"]} == {2}
    assert (
        "gives lower point estimates of the samples' distance to p(k | c) than the exact text-free router (intervals "
        f"over the two sampling seeds: cluster TV {level_iv(tv[0], 3)} against {level_iv(tv[1], 3)}, paired by seed "
    ) in text()
    assert f"; MMD² {level_iv(mmd[0], 2, 1e3)} against {level_iv(mmd[1], 2, 1e3)} ×10⁻³, paired " in text()


def test_with_exact_experts_the_two_routers_intervals_over_seeds_overlap_on_the_colour_captions():
    for metric in ("cluster_tv", "mmd2"):
        a, b = colour(COLOUR_EXACT_TEXT, metric), colour(COLOUR_EXACT, metric)
        assert a["lo"] <= b["hi"] and b["lo"] <= a["hi"], metric


def verdict(x: dict) -> str:
    return "resolved" if resolved(x) else "not resolved"


def test_with_exact_experts_on_the_colour_captions_the_paired_differences_over_seeds_are_the_manifests():
    """Paired by sampling seed, the routers' unpaired intervals notwithstanding: TV a tie, MMD² resolved."""
    tv, mmd = (paired(COLOUR_EXACT_TEXT, COLOUR_EXACT, m) for m in ("cluster_tv", "mmd2"))
    assert tv["n"] == mmd["n"] == load(COLOUR)["config"]["evaluation"]["seeds"]
    assert (f"paired by seed {iv(tv, 3)}, {verdict(tv)}; MMD² ") in text()
    assert (f"×10⁻³, paired {iv(mmd, 2, scale=1e3)}, {verdict(mmd)}); with trained experts") in text()


def test_with_trained_experts_the_two_exact_routers_rows_over_trainings_are_the_manifests():
    mmd = [colour(n, "mmd2") for n in (COLOUR_TRAINED_TEXT, COLOUR_TRAINED)]
    tv = [colour(n, "cluster_tv") for n in (COLOUR_TRAINED_TEXT, COLOUR_TRAINED)]
    assert {x["trainings"] for x in (*mmd, *tv)} == {load(COLOUR)["seeds"]["trainings"]}
    assert (
        f"(8FM top-2, over trainings: MMD² {level_iv(mmd[0], 2, 1e3)} against {level_iv(mmd[1], 2, 1e3)} ×10⁻³, "
    ) in text()
    assert f"; cluster TV {level_iv(tv[0], 3)} against {level_iv(tv[1], 3)}, paired " in text()


def test_with_trained_experts_on_the_colour_captions_the_two_exact_routers_tie_by_mmd_and_differ_by_tv():
    mmd, tv = (paired(COLOUR_TRAINED_TEXT, COLOUR_TRAINED, m) for m in ("mmd2", "cluster_tv"))
    assert mmd["n"] == tv["n"] == load(COLOUR)["seeds"]["trainings"]
    assert not resolved(mmd) and resolved(tv) and tv["mean"] < 0
    assert (
        "the exact prompt-aware router and the exact text-free router tie by MMD² and the prompt-aware one is closer "
        "by cluster TV (8FM top-2, over trainings: MMD² "
    ) in text()
    assert f"paired {iv(mmd, 2, scale=1e3)}, a tie; cluster TV" in text()
    assert f"paired {iv(tv, 3)}, resolved)" in text()


def test_on_the_budget_ladder_the_trained_prompt_aware_routers_cluster_adherence_is_each_rungs():
    def adherence(run: str) -> float:
        return manifest(run)["results"]["8FM · top2"]["nested"]["cluster_adherence"]["mean"]

    for steps in (800, 3200):
        for run, conditioning in ((LADDER_TEXT[steps], "text"), (LADDER_FREE[steps], "none")):
            m = manifest(run)
            assert m["config"]["router"]["conditioning"] == conditioning
            assert (m["budget"]["expert_steps"], m["config"]["router"]["training"]) == (steps, "central")
    (free,) = {level(adherence(LADDER_FREE[s]), 2) for s in (800, 3200)}
    assert (
        f"cluster adherence {level(adherence(LADDER_TEXT[800]), 3)} at 800 and {level(adherence(LADDER_TEXT[3200]), 3)} "
        f"at 3,200 expert steps, against {free} for the text-free router)"
    ) in text()


def test_no_committed_colour_run_has_a_prompt_aware_trained_router():
    runs = sorted(RESULTS.glob("reproduce-gmm-colour*-manifest.json"))
    assert runs and all(load(p.name)["config"]["router"]["conditioning"] != "text" for p in runs)
    assert "--set router.conditioning=text" in manifest(LADDER_TEXT[800])["command"]
    assert (
        "a trained prompt-aware router on the colour captions (`--set router.conditioning=text` on "
        "`configs/reproduce-gmm-colour.yaml`; not run)"
    ) in text()


def test_the_pooled_caption_reaches_the_exact_prompt_aware_routers_adherence():
    trained, exact = (metrics(n)["cluster_adherence"] for n in (TRAINED_TEXT, EXACT_TEXT))
    assert level(trained["mean"], 3) == level(exact["mean"], 3)
    claim = f"the pooled caption already reaches the exact prompt-aware router's adherence, {level(exact['mean'], 3)})"
    assert claim in text()


# --- on the embedded data


def embedded(metric: str) -> dict:
    return load("embedded_trainings.json")["summary"][EMBEDDED_ARM][metric]["minus_baseline"]


def test_the_embedded_data_is_measured_over_three_trainings_with_the_shared_classifier():
    e = load("embedded_trainings.json")
    (trainings,) = {embedded(m)["trainings"] for m in ("adherence_rows", "adherence", "fid")}
    assert "shared by every arm" in e["feature_network"]
    assert f"Measured over {WORDS[trainings]} trainings with the shared-classifier protocol" in text()


def test_on_the_embedded_data_grid_rows_are_resolved_held_out_adherence_and_fid_are_not():
    rows, held_out, fid = embedded("adherence_rows"), embedded("adherence"), embedded("fid")
    assert resolved(rows) and not resolved(held_out) and not resolved(fid)
    assert (
        f"grid-row adherence {iv(rows, 3)} (resolved), held-out-prompt adherence {iv(held_out, 3)} and FID "
        f"{iv(fid, 1)} (neither resolved)"
    ) in text()


def test_the_default_config_keeps_the_text_free_router():
    e = load("embedded_trainings.json")
    default = load_config(ROOT / e["config"]).router.conditioning
    assert e["arms"][e["baseline"]]["router_conditioning"] == default == "none"
    assert e["arms"][EMBEDDED_ARM]["router_conditioning"] == "text"
    assert f"(neither resolved), so `{e['config']}` keeps `conditioning: {default}`." in text()
