"""Claims in docs/results.md checked against the committed results: the samples of the budget ladder's rungs on the
mixture whose clusters share no structure and what follows them, from the line "Samples, 8FM, paired over trainings
(Δ log p per sample against the whole mixture; …" up to, not including, the bullet "- **What the evidence set
costs**". That is: the subspace rungs' samples with the text-free and the prompt-aware router, under equal steps
(``reproduce-gmm-subspace-{800,3200}{,-text}-manifest.json``, ``gmm_ladder_subspace.json``) and equal images
(``reproduce-gmm-subspace-ei-{800,3200}-text-manifest.json``, ``gmm_ladder_subspace_equal_images.json``); the mini
rungs' routing modes and router share and the nano rung (``gmm_ladder.json``, ``reproduce-gmm-nano-manifest.json``);
and the colour variant (``reproduce-gmm-colour-manifest.json``).

Every number is recomputed from ``benchmarks/results/`` and written as the doc writes it (the unicode minus, a
thousands comma, the doc's decimals), then looked up in the passage with its whitespace folded; the run times, loads,
dates and commands are the manifests' and ladder records'; a sign word ("top-2 better", "(ties)", "resolved", "the
monolith wins"), a bold number (a resolved difference) and an ordering are checked against the paired intervals of
the files. So a rerun that moves a number, or an edit that moves the text away from the files, fails here."""

import math
import re
from functools import cache

import pytest

from .doc_claims import DOC, RESULTS, iv, load, num, resolved

START = "Samples, 8FM, paired over trainings (Δ log p per sample against the whole mixture; Δ log p(x | c) against the"
END = "- **What the evidence set costs**"

TOP2_MONOLITH = "8FM: top2 − monolith"
TOP2_TOP1 = "8FM: top2 − top1"
TOP2_FULL = "8FM: top2 − full"
TRAINED_MINUS_EXACT_ROUTER = "8FM: top2, trained − exact router"
GAP = "empty caption · full: gap, trained experts · trained router − exact · exact"
ROUTER_AT_EXACT = "empty caption · full: router share at exact experts (ET − EE)"
EXPERTS_UNDER_TRAINED = "empty caption · full: experts share under the trained router (TT − ET)"
TOP2_ROW, TOP1_ROW, FULL_ROW = "8FM · top2", "8FM · top1", "8FM · full"
MONOLITH_ROW = "monolith (equal compute)"
EXACT_PROMPT_AWARE_ROW = "8FM · top2 · exact prompt-aware router"

# The subspace runs: `hddm reproduce` manifests by router and protocol, keyed by expert steps.
TEXT_FREE = {800: "subspace-800", 3200: "subspace-3200"}  # equal steps, the text-free router
PROMPT_AWARE = {800: "subspace-800-text", 3200: "subspace-3200-text"}  # equal steps, router.conditioning: text
EQUAL_IMAGES = {800: "subspace-ei-800-text", 3200: "subspace-ei-3200-text"}  # equal images, router.conditioning: text
SUBSPACE_LADDER = "gmm_ladder_subspace"  # reads the text-free equal-steps runs, rungs "800" and "3200"
EI_LADDER = "gmm_ladder_subspace_equal_images"  # reads the equal-images runs, rungs "ei-800" and "ei-3200"
MINI_200, MINI_800, CAPACITY, NANO = (
    "equal-steps-200",
    "equal-steps-800",
    "capacity-equal-steps-800",
    "nano-equal-steps-800",
)


@cache
def raw_passage() -> str:
    text = DOC.read_text()
    start = text.index(START)
    return text[start : text.index(END, start)]


@cache
def passage() -> str:
    """The passage with its line breaks folded, so a number wrapped over two lines reads as one."""
    return re.sub(r"\s+", " ", raw_passage()).strip()


def manifest(run: str) -> dict:
    return load(f"reproduce-gmm-{run}-manifest.json")


def paired(run: str, what: str, metric: str = "delta_log_density") -> dict:
    """One paired difference of a run's manifest (Tables 3 and 4 of its tables.md): mean, half, resolved, …"""
    (entry,) = [e for e in manifest(run)["paired"] if e["what"] == what]
    return entry[metric]


def table_of(run: str, what: str) -> str:
    (entry,) = [e for e in manifest(run)["paired"] if e["what"] == what]
    return entry["table"]


def row(run: str, name: str, metric: str = "delta_log_density") -> dict:
    """A row's metric over trainings (``nested``) where it has several, else over sampling seeds (``metrics``)."""
    r = manifest(run)["results"][name]
    return r.get("nested", r["metrics"])[metric]


def rung(label: str, name: str = "gmm_ladder") -> dict:
    (g,) = [g for g in load(f"{name}.json")["rungs"] if g["label"] == label]
    return g


def ladder(
    label: str, comparison: str, metric: str = "delta_log_density", group: str = "8FM", name: str = "gmm_ladder"
):
    """One paired difference of a ``benchmarks/gmm_ladder.py`` record, by rung label and configuration."""
    return rung(label, name)["paired"][group][comparison][metric]


def level(x: float, digits: int) -> str:
    """A level without a sign (an adherence, a KL): ``0.876``."""
    return num(x, digits, sign=False)


def strong(s: str, x: dict) -> str:
    """A bold number: the doc bolds resolved differences only."""
    assert resolved(x), f"{s} is bold but its interval holds 0"
    return f"**{s}**"


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f}"


def day(m: dict) -> str:
    return m["created_at"][:10]


def out_free(command: str, out: str, placeholder: str = "OUT") -> str:
    return command.replace(out, placeholder)


def command_of(run: str) -> str:
    """A run's command with its output folder written OUT, as the doc writes it."""
    m = manifest(run)
    out = re.search(r"--out (\S+)", m["command"])[1]
    return out_free(m["command"], out)


def sets_of(command: str) -> list[str]:
    return re.findall(r"--set (\S+)", command)


def expand(pattern: str) -> list[str]:
    """A path with ``{a,b}`` alternatives, every combination."""
    m = re.search(r"\{([^}]*)\}", pattern)
    if m is None:
        return [pattern]
    return [p for alt in m[1].split(",") for p in expand(pattern[: m.start()] + alt + pattern[m.end() :])]


# --- the passage and its files


def test_the_passage_runs_from_the_samples_line_to_the_evidence_set_costs_bullet():
    assert passage().startswith(START)
    assert END not in passage()
    for bullet in (
        "- top-2 − monolith:",
        "- **with a trained prompt-aware router**",
        "- **under equal images**",
        "- **Top-2 against top-1 and full** (2DDPM:6FM)",
        "- **The nano rung, 8FM, against the monolith and by routing mode**",
        "- **The router's share of the gap**",
        "- **Captions that do not fix the cluster, and the router's share on the empty caption**",
    ):
        assert bullet in passage()


def test_the_result_files_the_passage_names_are_committed():
    names = re.findall(r"`benchmarks/results/([^`]+)`", passage())
    assert len(names) >= 5
    for name in names:
        for path in expand(name):
            assert (RESULTS / path).is_file(), path


def test_the_samples_are_paired_over_the_runs_three_trainings_and_two_sampling_seeds():
    for run in (*TEXT_FREE.values(), *PROMPT_AWARE.values(), *EQUAL_IMAGES.values(), "nano", "colour"):
        m = manifest(run)
        x = paired(run, TOP2_MONOLITH)
        assert (x["n"], x["trainings"], x["covers"]) == (m["seeds"]["trainings"], 3, "trainings")
        assert x["seeds"] == m["config"]["evaluation"]["seeds"] == 2
    ladders = [(label, SUBSPACE_LADDER) for label in ("800", "3200")] + [(f"ei-{s}", EI_LADDER) for s in (800, 3200)]
    for label, name in (*ladders, (NANO, "gmm_ladder")):
        assert (rung(label, name)["trainings"], rung(label, name)["sampling_seeds"]) == (3, 2)
    assert "(three trainings, paired)" in passage() and "Paired over the three trainings:" in passage()


# --- the text-free router under equal steps: top-2 − monolith


def test_the_subspace_ladder_copies_the_text_free_runs_paired_differences():
    for steps, run in TEXT_FREE.items():
        for comparison in ("top2 − monolith", "top2 − top1", "top2 − full", "top2, trained − exact router"):
            for metric in ("delta_log_density", "mmd2"):
                assert ladder(str(steps), comparison, metric, name=SUBSPACE_LADDER) == paired(
                    run, f"8FM: {comparison}", metric
                )
        assert manifest(run)["config"]["router"]["conditioning"] != "text"


def test_with_the_text_free_router_top2_is_closer_to_the_mixture_than_the_monolith_at_both_rungs():
    x800, x3200 = (ladder(label, "top2 − monolith", name=SUBSPACE_LADDER) for label in ("800", "3200"))
    assert x800["mean"] > 0 and x3200["mean"] > 0
    assert (
        f"- top-2 − monolith: {strong(iv(x800, 0), x800)} nats at 800 steps, {strong(iv(x3200, 0), x3200)} at 3,200 — "
        "the ensemble's samples are closer to the mixture at both rungs;"
    ) in passage()


def test_with_the_text_free_router_mmd_ties_at_800_and_the_monolith_is_closer_at_3200_resolved():
    x800, x3200 = (ladder(label, "top2 − monolith", "mmd2", name=SUBSPACE_LADDER) for label in ("800", "3200"))
    assert not x800["resolved"] and x3200["resolved"] and x3200["mean"] > 0  # MMD²: lower is closer
    assert (
        f"by MMD² they tie at 800 ({iv(x800, 0, scale=1e3)} ×10⁻³) and the monolith is closer at 3,200 "
        f"({iv(x3200, 0, scale=1e3)} ×10⁻³, resolved)"
    ) in passage()


def test_the_text_free_routers_cluster_adherence_is_one_in_eight_and_the_monoliths_follows_the_caption():
    top2 = {s: row(run, TOP2_ROW, "cluster_adherence") for s, run in TEXT_FREE.items()}
    mono = {s: row(run, MONOLITH_ROW, "cluster_adherence") for s, run in TEXT_FREE.items()}
    (adherence,) = {level(x["mean"], 2) for x in top2.values()}  # "at both rungs": one number
    k = manifest(TEXT_FREE[800])["config"]["num_experts"]
    assert f"1/{k}" == "1/8"
    for x in top2.values():  # chance: the caption does not reach the router
        assert x["mean"] - x["half"] <= 1 / k <= x["mean"] + x["half"]
    assert (
        f"its cluster adherence is {adherence} at both rungs (1/{k}: the captions name the cluster, the router does "
        f"not read them), the monolith's {level(mono[800]['mean'], 2)} at 800 and {level(mono[3200]['mean'], 2)} at "
        "3,200"
    ) in passage()


CONDITIONAL = re.compile(
    r"by Δ log p\(x \| c\) the monolith (\w+) at 3,200 \(top-2 − monolith ([^)]*)\) and (\w+) at 800 \(([^)]*)\)"
)


def conditional_claims() -> dict[int, tuple[str, str]]:
    """The doc's verdict word and number, by rung, for the text-free router's top-2 − monolith by Δ log p(x | c)."""
    m = CONDITIONAL.search(passage())
    assert m, "the sentence on Δ log p(x | c) with the text-free router"
    return {3200: (m[1], m[2]), 800: (m[3], m[4])}


def conditional_verdict(x: dict) -> str:
    """Top-2 − the monolith by Δ log p(x | c), in the doc's words."""
    if not x["resolved"]:
        return "ties"
    return "wins" if x["mean"] < 0 else "loses"


def test_with_the_text_free_router_top2_minus_monolith_by_the_captions_density_is_each_runs():
    for steps, (_, number) in conditional_claims().items():
        assert number == iv(paired(TEXT_FREE[steps], TOP2_MONOLITH, "delta_log_density_cond"), 0)


@pytest.mark.parametrize(
    "steps",
    [
        3200,
        800,
    ],
)
def test_the_text_free_routers_verdict_by_the_captions_density_is_the_intervals(steps):
    word, _ = conditional_claims()[steps]
    assert word == conditional_verdict(paired(TEXT_FREE[steps], TOP2_MONOLITH, "delta_log_density_cond"))


def test_exact_experts_under_the_exact_text_free_router_have_the_same_chance_adherence():
    name = "exact FM experts · exact router · top2"
    (adherence,) = {level(row(run, name, "cluster_adherence")["mean"], 2) for run in TEXT_FREE.values()}
    assert abs(row(TEXT_FREE[800], name, "cluster_adherence")["mean"] - 1 / 8) < 0.02
    assert (
        f"Exact experts of the same mixture lose the same way under the exact text-free router (cluster adherence "
        f"{adherence})"
    ) in passage()


def test_at_3200_the_exact_prompt_aware_router_with_trained_experts_and_the_monolith_are_their_rows():
    run = TEXT_FREE[3200]
    assert row(run, EXACT_PROMPT_AWARE_ROW)["mean"] > row(run, MONOLITH_ROW)["mean"]
    assert (
        f"the exact prompt-aware router with the trained experts reaches adherence "
        f"{level(row(run, EXACT_PROMPT_AWARE_ROW, 'cluster_adherence')['mean'], 3)} and Δ log p "
        f"{iv(row(run, EXACT_PROMPT_AWARE_ROW), 0)} against the monolith's {iv(row(run, MONOLITH_ROW), 0)} at 3,200"
    ) in passage()


# --- the prompt-aware router under equal steps


def test_the_prompt_aware_3200_run_reuses_the_text_free_runs_experts_and_monolith_and_retrains_its_routers():
    text, free = manifest(PROMPT_AWARE[3200]), manifest(TEXT_FREE[3200])
    assert sets_of(text["command"]) == [*sets_of(free["command"]), "router.conditioning=text"]
    assert text["config"]["router"]["conditioning"] == "text"
    for mine, theirs in zip(text["artefacts"]["trainings"], free["artefacts"]["trainings"], strict=True):
        assert mine["monolith"]["reused"] and mine["monolith"]["tensor_sha256"] == theirs["monolith"]["tensor_sha256"]
        for k, e in mine["experts"].items():
            assert e["reused"] and e["tensor_sha256"] == theirs["experts"][k]["tensor_sha256"]
        assert mine["router"]["tensor_sha256"] != theirs["router"]["tensor_sha256"]
    assert (
        "(`--set router.conditioning=text`, the 3,200-step rung's experts and monolith reused, routers retrained; "
        f"{minutes(text['seconds'])} min on the shared machine; "
        "`benchmarks/results/reproduce-gmm-subspace-3200-text-{tables.md,manifest.json}`)"
    ) in passage()


@pytest.mark.parametrize(
    ("metric", "against"),
    [
        pytest.param("delta_log_density", "nats against the mixture", id="against the mixture"),
        pytest.param(
            "delta_log_density_cond",
            "against each caption's own density",
            id="against the captions density",
        ),
    ],
)
def test_with_the_prompt_aware_router_at_3200_top2_beats_the_monolith_by_both_densities(metric, against):
    x = paired(PROMPT_AWARE[3200], TOP2_MONOLITH, metric)
    assert x["mean"] > 0
    assert f"{strong(iv(x, 1), x)} {against}" in passage()


def test_with_the_prompt_aware_router_at_3200_adherence_and_mmd_are_the_runs_and_the_ensemble_beats_the_monolith():
    run = PROMPT_AWARE[3200]
    mmd = paired(run, TOP2_MONOLITH, "mmd2")
    x = paired(run, TOP2_MONOLITH)
    assert mmd["resolved"] and mmd["mean"] > 0  # "the monolith marginally closer by that measure"
    assert mmd["mean"] * 1e3 < 1 and x["resolved"] and x["mean"] > 0
    assert (
        f"cluster adherence {level(row(run, TOP2_ROW, 'cluster_adherence')['mean'], 3)} (monolith "
        f"{level(row(run, MONOLITH_ROW, 'cluster_adherence')['mean'], 3)}); MMD² {iv(mmd, 2, scale=1e3)} ×10⁻³ (the "
        "monolith marginally closer by that measure). So at 3,200 steps under equal steps **the ensemble beats the "
        "equal-compute monolith on this mixture once its router reads the prompt**"
    ) in passage()


def test_the_trained_prompt_aware_router_matches_the_exact_one_at_3200():
    run = PROMPT_AWARE[3200]
    trained, exact = row(run, TOP2_ROW), row(run, EXACT_PROMPT_AWARE_ROW)
    assert abs(trained["mean"] - exact["mean"]) < min(trained["half"], exact["half"])
    assert (
        f"the trained prompt-aware router matches the exact one (top-2 rows {iv(trained, 1)} and {iv(exact, 1)})"
    ) in passage()


def test_the_prompt_aware_800_runs_command_time_date_and_files():
    m = manifest(PROMPT_AWARE[800])
    assert m["budget"]["protocol"] == "equal_steps" and m["budget"]["expert_steps"] == 800
    assert (
        f"**At 800 steps under equal steps** (`{command_of(PROMPT_AWARE[800])}`; {minutes(m['seconds'])} min on the "
        f"idle machine, {day(m)}; `benchmarks/results/reproduce-gmm-subspace-800-text-{{tables.md,manifest.json}}`) "
        "the ensemble is ahead too"
    ) in passage()


def test_with_the_prompt_aware_router_at_800_top2_beats_the_monolith_and_ties_the_other_modes():
    run = PROMPT_AWARE[800]
    x, cond = paired(run, TOP2_MONOLITH), paired(run, TOP2_MONOLITH, "delta_log_density_cond")
    adherence = paired(run, TOP2_MONOLITH, "cluster_adherence")
    t1, full, router = paired(run, TOP2_TOP1), paired(run, TOP2_FULL), paired(run, TRAINED_MINUS_EXACT_ROUTER)
    assert x["mean"] > 0 and cond["mean"] > 0 and not (t1["resolved"] or full["resolved"])
    assert (
        f"8FM top-2 − monolith {strong(iv(x, 1), x)} nats against the mixture and {strong(iv(cond, 1), cond)} "
        f"against each caption's own density, cluster adherence "
        f"{level(row(run, TOP2_ROW, 'cluster_adherence')['mean'], 3)} against the monolith's "
        f"{level(row(run, MONOLITH_ROW, 'cluster_adherence')['mean'], 3)} ({iv(adherence, 3)}); top-2 − top-1 "
        f"{iv(t1, 1)} and top-2 − full {iv(full, 1)} (ties); the trained router against the exact text-free one "
        f"{iv(router, 1)} by Δ log p."
    ) in passage()


# --- the prompt-aware router under equal images


def test_the_equal_images_runs_commands_budgets_seeds_times_load_and_date_are_their_records():
    record = load(f"{EI_LADDER}.json")
    low, high = (manifest(EQUAL_IMAGES[s]) for s in (800, 3200))
    base = sets_of(low["command"])
    assert set(sets_of(high["command"])) == {*base, "expert.steps=3200"}
    for s, m in ((800, low), (3200, high)):
        b = m["budget"]
        es = manifest(TEXT_FREE[s])["budget"]
        assert (b["protocol"], b["expert_steps"], b["expert_batch"]) == ("equal_images", s, es["expert_batch"])
        assert b["monolith_steps"] == b["num_experts"] * b["expert_steps"] and b["monolith_batch"] == b["expert_batch"]
    steps = " and ".join(num(m["budget"]["monolith_steps"], 0, sign=False) for m in (low, high))
    (batch,) = {m["budget"]["monolith_batch"] for m in (low, high)}
    (ratio,) = {m["budget"]["monolith_steps"] // m["budget"]["expert_steps"] for m in (low, high)}
    (trainings,) = {rung(g["label"], EI_LADDER)["trainings"] for g in record["rungs"]}
    (seeds,) = {rung(g["label"], EI_LADDER)["sampling_seeds"] for g in record["rungs"]}
    loads = [m["load_average"][when][0] for m in (low, high) for when in ("start", "end")]
    (date,) = {day(low), day(high), record["date"][:10]}
    command = record["command"]
    for g in record["rungs"]:
        command = command.replace(g["out"], f"OUT_{g['budget']['expert_steps']}")
    command = re.sub(r" --threads \d+$", "", command)
    assert (
        f"(`{' '.join(f'--set {s}' for s in base)}`, and `--set expert.steps=3200` for the second rung; each expert "
        f"at batch {low['budget']['expert_batch']} as under equal steps, the monolith {ratio}× an expert's steps at "
        f"the same batch: {steps} steps × {batch}; {trainings} trainings × {seeds} sampling seeds; "
        f"{minutes(low['seconds'])} and {minutes(high['seconds'])} min on the same machine, shared with the test suite "
        f"(load {min(loads):.1f}–{max(loads):.1f}); {date}; `{command}`;"
    ) in passage()


def exact_router_rows(run: str) -> list[str]:
    """The rows of trained experts under an exact router (text-free or prompt-aware), on the captions or empty."""
    return [
        n
        for n, r in manifest(run)["results"].items()
        if r["row"]["experts"] == "trained" and r["row"]["router"] in ("exact", "exact-text")
    ]


def largest_differences(a: str, b: str) -> tuple[float, float]:
    """The exact-router rows of two runs apart: the largest difference of row means (over trainings) and of single
    training × seed values, Δ log p."""
    ra, rb = manifest(a)["results"], manifest(b)["results"]
    rows = exact_router_rows(a)
    assert rows == exact_router_rows(b) and len(rows) >= 5
    means = max(abs(row(a, n)["mean"] - row(b, n)["mean"]) for n in rows)
    single = max(
        abs(u["delta_log_density"] - v["delta_log_density"])
        for n in rows
        for ta, tb in zip(ra[n]["per_training"], rb[n]["per_training"], strict=True)
        for u, v in zip(ta, tb, strict=True)
    )
    return means, single


def test_the_equal_images_experts_are_the_equal_steps_rungs_retrained_and_their_exact_router_rows_repeat():
    for s in (800, 3200):
        ei, es = manifest(EQUAL_IMAGES[s]), manifest(TEXT_FREE[s])
        assert ei["seeds"] == es["seeds"]
        assert (ei["budget"]["expert_steps"], ei["budget"]["expert_batch"]) == (
            es["budget"]["expert_steps"],
            es["budget"]["expert_batch"],
        )
        for mine, theirs in zip(ei["artefacts"]["trainings"], es["artefacts"]["trainings"], strict=True):
            for k, e in mine["experts"].items():  # retrained: not adopted, and not the same bits
                assert not e["reused"] and e["tensor_sha256"] != theirs["experts"][k]["tensor_sha256"]
    low = largest_differences(EQUAL_IMAGES[800], TEXT_FREE[800])
    high_means, high_single = largest_differences(EQUAL_IMAGES[3200], TEXT_FREE[3200])
    assert 0 < max(low) < 0.01  # "to 0.01 nats": every value of the 800 rung within it
    assert (
        "their exact-router rows repeat the equal-steps 800 rung's to 0.01 nats and, as row means, the 3,200 rung's to "
        f"{high_means:.1f} nats (single training × seed values to {high_single:.1f} nats)"
    ) in passage()


def ei_rows() -> dict[int, list[str]]:
    """The equal-images table's body rows, their cells by expert steps."""
    lines = [line.strip() for line in raw_passage().splitlines() if line.strip().startswith("|")]
    assert lines[0].startswith("| rung (expert steps; monolith) |") and lines[1].startswith("|---")
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[int(cells[0].split(";")[0].replace(",", ""))] = cells
    return rows


def by_t(label: str, t: float, name: str = EI_LADDER) -> dict:
    """Monolith − expert excess loss at one t of a ladder rung."""
    i = load(f"{name}.json")["times"].index(t)
    return rung(label, name)["excess"]["monolith_minus_expert_by_t"][i]


def test_the_equal_images_ladder_copies_its_runs_paired_differences():
    for s, run in EQUAL_IMAGES.items():
        for comparison in ("top2 − monolith", "top2 − top1", "top2 − full", "top2, trained − exact router"):
            for metric in ("delta_log_density", "mmd2"):
                assert ladder(f"ei-{s}", comparison, metric, name=EI_LADDER) == paired(
                    run, f"8FM: {comparison}", metric
                )


@pytest.mark.parametrize("steps", [800, 3200])
def test_each_equal_images_table_row_is_its_rungs_paired_differences_excess_losses_and_clusters(steps):
    g = rung(f"ei-{steps}", EI_LADDER)
    b = g["budget"]
    x = ladder(f"ei-{steps}", "top2 − monolith", name=EI_LADDER)
    cond = paired(EQUAL_IMAGES[steps], TOP2_MONOLITH, "delta_log_density_cond")
    excess = g["excess_mean_over_t"]["monolith_minus_expert"]
    per = g["monolith_minus_expert_by_cluster"].values()
    who = "the ensemble better" if x["mean"] > 0 else "the monolith better"
    closer = "the expert closer" if excess["mean"] > 0 else "the monolith closer"
    assert ei_rows()[steps] == [
        f"{num(b['expert_steps'], 0, sign=False)}; {num(b['monolith_steps'], 0, sign=False)} × {b['monolith_batch']}",
        f"{strong(iv(x, 1), x)} ({who})",
        strong(iv(cond, 1), cond),
        f"{strong(iv(excess, 3), excess)} ({closer})",
        iv(by_t(f"ei-{steps}", 0.1), 4 if steps == 800 else 3),
        f"{sum(c['lo'] > 0 for c in per)} of {len(per)}",
    ]


def test_under_equal_images_the_ensemble_overtakes_the_monolith_and_the_excess_losses_cross_between_the_rungs():
    x = [ladder(f"ei-{s}", "top2 − monolith", name=EI_LADDER) for s in (800, 3200)]
    cond = [paired(EQUAL_IMAGES[s], TOP2_MONOLITH, "delta_log_density_cond") for s in (800, 3200)]
    excess = [rung(f"ei-{s}", EI_LADDER)["excess_mean_over_t"]["monolith_minus_expert"] for s in (800, 3200)]
    for pair in (x, cond, excess):
        assert resolved(pair[0]) and resolved(pair[1]) and pair[0]["mean"] < 0 < pair[1]["mean"]
    assert (
        "So under equal images the ensemble overtakes the equal-compute monolith between 800 and 3,200 expert steps, "
        "by both densities, and the experts' excess loss crosses the monolith's in the same interval"
    ) in passage()


def closer_at(label: str) -> dict[str, list[float]]:
    """The t grid split by who is closer to the exact velocity there (monolith − expert excess loss)."""
    out = {"expert": [], "monolith": [], "tie": []}
    for t in load(f"{EI_LADDER}.json")["times"]:
        x = by_t(label, t)
        out["tie" if not resolved(x) else "expert" if x["mean"] > 0 else "monolith"].append(t)
    return out


def test_under_equal_images_who_is_closer_at_each_t_is_the_excess_loss_by_t():
    times = load(f"{EI_LADDER}.json")["times"]
    low, high = closer_at("ei-800"), closer_at("ei-3200")
    assert low["monolith"] == [0.0, *[t for t in times if t >= 0.5]] and low["expert"] == [0.1, 0.3] and not low["tie"]
    assert high["expert"] == [t for t in times if 0.1 <= t <= 0.5] and high["tie"] == [0.7]
    assert high["monolith"] == [0.0, 0.9, 1.0]
    low_01 = by_t("ei-800", 0.1)
    assert 0 < low_01["lo"] < 0.05 * low_01["mean"]  # "barely resolved"
    assert max(times, key=lambda t: by_t("ei-3200", t)["mean"]) == 0.1  # "most at 0.1"
    m0, m9, m1 = (by_t("ei-3200", t) for t in (0.0, 0.9, 1.0))
    assert (
        f"at 800 the monolith with 8× the steps is closer at t = 0 and t ≥ 0.5, the expert at t = 0.1 "
        f"({iv(low_01, 4)}, barely resolved) and 0.3 ({iv(by_t('ei-800', 0.3), 3)}); at 3,200 the expert is closer at "
        f"0.1 ≤ t ≤ 0.5, most at 0.1 ({iv(by_t('ei-3200', 0.1), 3)}, the low noise where the caption's own subspace "
        f"decides), they tie at 0.7, and the monolith is closer at t = 0, 0.9 and 1 ({iv(m0, 3)}, {iv(m9, 4)}, "
        f"{iv(m1, 4)})"
    ) in passage()


def test_under_equal_images_the_cluster_adherence_of_top2_and_the_monolith_is_each_runs():
    top2 = [level(row(EQUAL_IMAGES[s], TOP2_ROW, "cluster_adherence")["mean"], 3) for s in (800, 3200)]
    mono = [level(row(EQUAL_IMAGES[s], MONOLITH_ROW, "cluster_adherence")["mean"], 3) for s in (800, 3200)]
    assert f"Cluster adherence: top-2 {top2[0]} and {top2[1]}, the monolith {mono[0]} and {mono[1]}." in passage()


def test_the_monoliths_delta_log_p_by_budget_is_each_runs_and_still_improves_with_4x_the_steps():
    runs = (TEXT_FREE[800], TEXT_FREE[3200], EQUAL_IMAGES[800], EQUAL_IMAGES[3200])
    cells = []
    for run in runs:
        b = manifest(run)["budget"]
        cells.append(
            f"{iv(row(run, MONOLITH_ROW), 0)} ({num(b['monolith_steps'], 0, sign=False)} × {b['monolith_batch']}"
        )
    cells[0] += ", the equal-steps 800 rung"
    low, high = row(EQUAL_IMAGES[800], MONOLITH_ROW), row(EQUAL_IMAGES[3200], MONOLITH_ROW)
    steps = [manifest(EQUAL_IMAGES[s])["budget"]["monolith_steps"] for s in (800, 3200)]
    assert steps[1] == 4 * steps[0] and low["mean"] + low["half"] < high["mean"] - high["half"]
    assert f"The monolith's Δ log p, by budget: {'), '.join(cells)}): it still improves with 4× the steps" in passage()


def test_at_819200_images_the_monolith_stays_behind_the_experts_under_either_protocol():
    es, ei = paired(PROMPT_AWARE[3200], TOP2_MONOLITH), ladder("ei-3200", "top2 − monolith", name=EI_LADDER)
    images = set()
    for run in (PROMPT_AWARE[3200], EQUAL_IMAGES[3200]):
        b = manifest(run)["budget"]
        images |= {b["monolith_steps"] * b["monolith_batch"], b["num_experts"] * b["expert_steps"] * b["expert_batch"]}
    (n,) = images
    assert es["resolved"] and ei["resolved"] and min(es["mean"], ei["mean"]) > 0
    assert (
        f"at {num(n, 0, sign=False)} images it stays behind the experts under either protocol (equal steps "
        f"{iv(es, 1)}, equal images {iv(ei, 1)})"
    ) in passage()


def test_under_equal_images_mmd_top2_minus_monolith_puts_the_monolith_closer_at_both_rungs():
    low, high = (ladder(f"ei-{s}", "top2 − monolith", "mmd2", name=EI_LADDER) for s in (800, 3200))
    assert low["resolved"] and high["resolved"] and min(low["mean"], high["mean"]) > 0
    assert low["mean"] > 10 * high["mean"]  # "clearly at 800, marginally at 3,200"
    assert (
        f"MMD² (1× the median bandwidth), top-2 − monolith: {iv(low, 2, scale=1e3)} ×10⁻³ at 800 and "
        f"{iv(high, 2, scale=1e3)} ×10⁻³ at 3,200 (the monolith closer by that measure, clearly at 800, marginally at "
        "3,200)"
    ) in passage()


def mode_word(x: dict, other: str) -> str:
    """Top-2 − another mode, in the doc's words: a tie, or which is better."""
    if not x["resolved"]:
        return "tie"
    return "top-2 better" if x["mean"] > 0 else f"{other} better"


def test_under_equal_images_top2_against_top1_and_full_ties_at_800_and_full_edges_top2_at_3200():
    t1 = [ladder(f"ei-{s}", "top2 − top1", name=EI_LADDER) for s in (800, 3200)]
    full = [ladder(f"ei-{s}", "top2 − full", name=EI_LADDER) for s in (800, 3200)]
    assert not (t1[0]["resolved"] or full[0]["resolved"])
    for s in (800, 3200):  # the router puts ≈ all weight on the caption's expert: every mode follows the caption
        adherence = [row(EQUAL_IMAGES[s], n, "cluster_adherence")["mean"] for n in (TOP1_ROW, TOP2_ROW, FULL_ROW)]
        assert max(adherence) - min(adherence) < 0.001
    assert {level(row(EQUAL_IMAGES[3200], n, "cluster_adherence")["mean"], 3) for n in (TOP1_ROW, FULL_ROW)} == {
        "1.000"
    }
    assert (
        f"Top-2 − top-1 and top-2 − full: ties at 800 ({iv(t1[0], 1)}, {iv(full[0], 1)}); at 3,200 {iv(t1[1], 1)} "
        f"({mode_word(t1[1], 'top-1')}) and {iv(full[1], 2)} ({mode_word(full[1], 'full')}): with a prompt-aware "
        "router the three modes coincide"
    ) in passage()


def test_under_equal_images_the_routers_share_on_the_empty_caption_is_table_4_and_the_gap_is_the_experts():
    router = {s: paired(EQUAL_IMAGES[s], ROUTER_AT_EXACT) for s in (800, 3200)}
    experts = {s: paired(EQUAL_IMAGES[s], EXPERTS_UNDER_TRAINED) for s in (800, 3200)}
    (share,) = {iv(x, 1) for x in router.values()}  # at exact experts the router does not depend on the rung
    for s in (800, 3200):
        assert table_of(EQUAL_IMAGES[s], ROUTER_AT_EXACT) == table_of(EQUAL_IMAGES[s], EXPERTS_UNDER_TRAINED)
        assert table_of(EQUAL_IMAGES[s], ROUTER_AT_EXACT) == "attribution"
        assert experts[s]["resolved"] and abs(experts[s]["mean"]) > 20 * abs(router[s]["mean"])
    assert (
        f"The router's share on the empty caption (full routing, Table 4): {share} nats at exact experts against the "
        f"experts' {iv(experts[800], 1)} (800) and {iv(experts[3200], 1)} (3,200) under the trained router: **the gap "
        "is the experts'**."
    ) in passage()


# --- the text-free router under equal steps: routing modes and the router's share


def test_with_the_text_free_router_top2_is_the_best_mode_at_800_and_full_at_3200_within_25_nats():
    t1 = {s: ladder(str(s), "top2 − top1", name=SUBSPACE_LADDER) for s in (800, 3200)}
    full = {s: ladder(str(s), "top2 − full", name=SUBSPACE_LADDER) for s in (800, 3200)}
    assert (
        f"- with the text-free router (equal steps): top-2 − top-1: {iv(t1[800], 1)} at 800 "
        f"({mode_word(t1[800], 'top-1')}), {iv(t1[3200], 1)} at 3,200 ({mode_word(t1[3200], 'top-1')}); top-2 − full: "
        f"{strong(iv(full[800], 1), full[800])} at 800 ({mode_word(full[800], 'full')}), "
        f"{strong(iv(full[3200], 1), full[3200])} at 3,200 ({mode_word(full[3200], 'full')})."
    ) in passage()
    # top-2 ahead of both at 800; full ahead of top-2 (and, by the means, of top-1) at 3,200
    assert t1[800]["mean"] > 0 and full[800]["mean"] > 0
    assert full[3200]["mean"] < 0 and t1[3200]["mean"] - full[3200]["mean"] > 0
    assert max(abs(full[s]["mean"]) for s in full) < 25
    assert (
        "So top-2 is the best mode at the smaller budget and full routing at the larger; the two are within 25 nats "
        "of each other at both."
    ) in passage()


def test_with_the_text_free_router_the_gap_on_the_empty_caption_is_the_experts():
    gap = {s: paired(TEXT_FREE[s], GAP) for s in (800, 3200)}
    router = {s: paired(TEXT_FREE[s], ROUTER_AT_EXACT) for s in (800, 3200)}
    experts = {s: paired(TEXT_FREE[s], EXPERTS_UNDER_TRAINED) for s in (800, 3200)}
    (share,) = {iv(x, 1) for x in router.values()}
    for s in (800, 3200):
        assert {table_of(TEXT_FREE[s], w) for w in (GAP, ROUTER_AT_EXACT, EXPERTS_UNDER_TRAINED)} == {"attribution"}
        assert not router[s]["resolved"] and experts[s]["resolved"] and gap[s]["resolved"]
    assert (
        f"the gap of trained experts and router to exact ones is {iv(gap[800], 0)} (800) and {iv(gap[3200], 0)} "
        f"(3,200); exchanging the exact router for the trained one at exact experts costs {share} (a tie; the router "
        "is the same network at both rungs: it does not depend on the experts' budget), the trained experts under the "
        f"trained router {iv(experts[800], 0)} and {iv(experts[3200], 0)}. **The gap is the experts'**"
    ) in passage()


def test_the_text_free_router_is_the_same_network_at_both_rungs():
    routers = [
        [t["router"]["tensor_sha256"] for t in manifest(TEXT_FREE[s])["artefacts"]["trainings"]] for s in (800, 3200)
    ]
    assert routers[0] == routers[1] and len(set(routers[0])) == 3
    assert paired(TEXT_FREE[800], ROUTER_AT_EXACT) == paired(TEXT_FREE[3200], ROUTER_AT_EXACT)


def test_with_the_text_free_router_trained_minus_exact_router_at_top2_ties_at_both_rungs():
    x = [ladder(str(s), "top2, trained − exact router", name=SUBSPACE_LADDER) for s in (800, 3200)]
    assert not (x[0]["resolved"] or x[1]["resolved"])
    assert f"Trained − exact router at top-2 on the captions: {iv(x[0], 1)} and {iv(x[1], 1)} (ties)." in passage()


# --- the mini rungs: 2DDPM:6FM by routing mode


def mini(label: str, comparison: str, metric: str = "delta_log_density") -> dict:
    return ladder(label, comparison, metric, group="2DDPM:6FM")


def test_the_two_200_step_mini_rungs_share_their_experts_and_router_so_their_routing_differences_are_one():
    for comparison in ("top2 − top1", "top2 − full", "top2, trained − exact router"):
        for group in ("8FM", "2DDPM:6FM"):
            if comparison in rung(MINI_200)["paired"][group]:
                assert (
                    rung(MINI_200)["paired"][group][comparison] == rung("equal-images-200")["paired"][group][comparison]
                )


def test_2ddpm_6fm_top2_beats_top1_by_delta_log_p_at_200_and_800_steps_with_a_lower_mmd():
    x = [mini(label, "top2 − top1") for label in (MINI_200, MINI_800)]
    mmd = [mini(label, "top2 − top1", "mmd2") for label in (MINI_200, MINI_800)]
    assert [rung(label)["budget"]["expert_steps"] for label in (MINI_200, MINI_800)] == [200, 800]
    for d, m in zip(x, mmd):
        assert d["resolved"] and d["mean"] > 0 and m["resolved"] and m["mean"] < 0
    assert (
        f"top-2 beats top-1 in Δ log p at 200 and 800 steps ({iv(x[0], 0)}, {iv(x[1], 0)}) while its MMD² is lower, "
        "i.e. better ("
    ) in passage()


@pytest.mark.parametrize(
    ("label", "context"),
    [
        pytest.param(
            MINI_200,
            "i.e. better ({} and ",
            id=MINI_200,
        ),
        pytest.param(
            MINI_800,
            " and {} ×10⁻³); full routing",
            id=MINI_800,
        ),
    ],
)
def test_2ddpm_6fm_top2_minus_top1_mmd_at_each_budget_is_the_ladders(label, context):
    x = mini(label, "top2 − top1", "mmd2")
    assert context.format(iv(x, 1, scale=1e3)) in passage()


def test_2ddpm_6fm_full_beats_top2_by_mmd_at_200_steps_and_ties_it_by_delta_log_p_at_both_budgets():
    mmd = mini(MINI_200, "top2 − full", "mmd2")
    assert mmd["resolved"] and mmd["mean"] > 0
    assert not any(mini(label, "top2 − full")["resolved"] for label in (MINI_200, MINI_800))
    assert (
        f"full routing beats top-2 by MMD² at 200 steps ({iv(mmd, 1, scale=1e3)} ×10⁻³ for top-2 − full) and ties it "
        "in Δ log p at both budgets."
    ) in passage()


def test_on_the_larger_mixture_every_2ddpm_6fm_routing_difference_is_within_its_interval():
    for comparison in ("top2 − top1", "top2 − full"):
        for metric in ("delta_log_density", "mmd2"):
            assert not mini(CAPACITY, comparison, metric)["resolved"]
    assert "On the larger mixture every routing difference is within its interval." in passage()


# --- the nano rung


def test_the_nano_rungs_ladder_record_copies_its_runs_paired_differences():
    for comparison in ("top2 − monolith", "top2 − top1", "top2 − full", "top2, trained − exact router"):
        for metric in ("delta_log_density", "mmd2"):
            assert ladder(NANO, comparison, metric) == paired("nano", f"8FM: {comparison}", metric)
    assert rung(NANO)["command"] == manifest("nano")["command"] and rung(NANO)["trainings"] == 3


def test_the_nano_rungs_top2_beats_the_monolith_in_every_training_and_ties_it_by_mmd():
    x, mmd = ladder(NANO, "top2 − monolith"), ladder(NANO, "top2 − monolith", "mmd2")
    per = x["per_training"]
    assert len(per) == x["n"] == 3 and min(per) > 0 and not mmd["resolved"]
    low, high = math.floor(min(per)), math.ceil(max(per))  # the whole-nat bounds that hold every training
    assert (
        f"top-2 − monolith {strong(iv(x, 0), x)} nats per sample (every training between {num(low, 0)} and "
        f"{num(high, 0)}), MMD² a tie ({iv(mmd, 1, scale=1e3)} ×10⁻³)"
    ) in passage()


def test_the_nano_rungs_top2_against_top1_and_full():
    t1, full = ladder(NANO, "top2 − top1"), ladder(NANO, "top2 − full")
    t1_mmd, full_mmd = ladder(NANO, "top2 − top1", "mmd2"), ladder(NANO, "top2 − full", "mmd2")
    assert t1["mean"] > 0 > full["mean"] and not (t1_mmd["resolved"] or full_mmd["resolved"])
    assert (
        f"top-2 − top-1 {strong(iv(t1, 1), t1)}, top-2 − full {strong(iv(full, 1), full)} "
        f"({mode_word(full, 'full')}), both ties by MMD² ({iv(t1_mmd, 1, scale=1e3)} and "
        f"{iv(full_mmd, 1, scale=1e3)} ×10⁻³)"
    ) in passage()


def test_the_nano_rungs_rows_relative_to_the_exact_row_of_the_same_mode_and_steps():
    m = manifest("nano")
    steps = m["config"]["evaluation"]["num_steps"]
    rel = {}
    for mode, what in (("top2", "8FM · top2 − exact (top2)"), ("full", "8FM · full − exact (full)")):
        (entry,) = [e for e in m["paired"] if e["what"] == what]
        exact = m["results"][entry["b"]]["row"]  # exact experts and router, this mode, the trained rows' steps
        assert (exact["experts"], exact["router"], exact["mode"], exact["steps_factor"]) == (
            "exact-fm",
            "exact",
            mode,
            1,
        )
        rel[mode] = entry["delta_log_density"]
    (above,) = {num(row("nano", f"exact FM experts · exact router · {mode}")["mean"], 0, sign=False) for mode in rel}
    monolith = paired("nano", "monolith (equal compute) − exact (oracle)")
    assert (
        f"Relative to the exact row of the same mode (exact experts and router, the same {steps} Euler steps, which "
        f"sits {above} nats above the true samples): top-2 {iv(rel['top2'], 1)}, full {iv(rel['full'], 1)}, and the "
        f"monolith {iv(monolith, 1)} below the exact oracle row."
    ) in passage()


def test_the_nano_rungs_order_by_delta_log_p_is_full_top2_top1_monolith_and_no_mmd_difference_is_resolved():
    t1, full = ladder(NANO, "top2 − top1"), ladder(NANO, "top2 − full")
    assert full["resolved"] and full["mean"] < 0 and t1["resolved"] and t1["mean"] > 0
    results = manifest("nano")["results"]

    def per_training(name: str) -> list[float]:
        return [sum(s["delta_log_density"] for s in seeds) / len(seeds) for seeds in results[name]["per_training"]]

    # top-1 above the monolith in every training (the paired tables hold no top-1 − monolith)
    assert all(a > b for a, b in zip(per_training(TOP1_ROW), per_training(MONOLITH_ROW), strict=True))
    assert not any(ladder(NANO, c, "mmd2")["resolved"] for c in ("top2 − monolith", "top2 − top1", "top2 − full"))
    assert "So at 800 steps full > top-2 > top-1 > monolith by Δ log p, and by MMD² nothing is resolved." in passage()
    assert rung(NANO)["budget"]["expert_steps"] == 800


def test_the_nano_rungs_gap_on_the_empty_caption_is_table_4_and_the_experts():
    gap, router, experts = (paired("nano", w) for w in (GAP, ROUTER_AT_EXACT, EXPERTS_UNDER_TRAINED))
    assert {table_of("nano", w) for w in (GAP, ROUTER_AT_EXACT, EXPERTS_UNDER_TRAINED)} == {"attribution"}
    assert not router["resolved"] and experts["resolved"] and gap["resolved"]
    assert (
        f"On the empty caption (full routing, Table 4 of the run's tables) the gap of trained experts and router to "
        f"exact ones is {iv(gap, 1)} nats, the router's share at exact experts {iv(router, 1)} (a tie) and the "
        f"experts' under the trained router {iv(experts, 1)}: the gap is the experts'."
    ) in passage()


# --- the router's share of the gap over the mini and nano rungs

ROUTER_SHARE = "top2, trained − exact router"
ROUTER_SHARE_CELLS = [  # (rung, configuration, decimals of the mean, of the half-width, the words around it)
    (MINI_200, "8FM", 1, 1, "Δ log p: 8FM {} at 200 steps"),
    (MINI_800, "8FM", 1, 1, "and {} at 800, the one resolved difference"),
    (MINI_200, "2DDPM:6FM", 1, 0, "2DDPM:6FM {} and "),
    (MINI_800, "2DDPM:6FM", 1, 0, " and {}; capacity variant"),
    (CAPACITY, "8FM", 1, 0, "capacity variant {} and "),
    (CAPACITY, "2DDPM:6FM", 0, 0, " and {}; nano 8FM"),
    (NANO, "8FM", 1, 1, "nano 8FM {}), so on these captions"),
]


@pytest.mark.parametrize(
    ("label", "group", "digits", "half_digits", "context"),
    [
        pytest.param(
            *cell,
            id=f"{cell[0]}-{cell[1]}",
        )
        for cell in ROUTER_SHARE_CELLS
    ],
)
def test_the_router_share_of_each_rung_is_its_trained_minus_exact_router_at_top2(
    label, group, digits, half_digits, context
):
    x = ladder(label, ROUTER_SHARE, group=group)
    assert context.format(iv(x, digits, half_digits)) in passage()


def test_the_trained_router_is_no_worse_than_the_exact_one_in_any_rung_and_resolved_once_in_its_favour():
    cells = [ladder(label, ROUTER_SHARE, group=group) for label, group, *_ in ROUTER_SHARE_CELLS]
    assert [label for label, *_ in ROUTER_SHARE_CELLS].count(MINI_200) == 2  # equal images at 200: the same cells
    everything = [
        x[ROUTER_SHARE]["delta_log_density"]
        for g in load("gmm_ladder.json")["rungs"]
        for x in g["paired"].values()
        if ROUTER_SHARE in x
    ]
    assert not any(x["resolved"] and x["mean"] < 0 for x in everything)  # "no worse … in any rung"
    (only,) = [x for x in cells if x["resolved"]]
    assert only is ladder(MINI_800, ROUTER_SHARE) and only["mean"] > 0
    assert sum(x["resolved"] for x in everything) == 1
    assert (
        "**The router's share of the gap**: the trained router is no worse than the exact text-free one at top-2 in "
        "any rung (trained − exact router, Δ log p:"
    ) in passage()
    assert "the one resolved difference, in the trained router's favour;" in passage()


def test_the_mini_rungs_attribution_factorial_on_the_empty_caption_is_not_committed():
    committed = {
        load(p.name)["command"] for p in RESULTS.glob("reproduce-gmm-*-manifest.json") if "command" in load(p.name)
    }
    for g in load("gmm_ladder.json")["rungs"]:
        if g["expert_preset"] == "mini":
            assert not any(group.startswith("empty caption") for group in g["paired"])
            assert g["command"] not in committed
    assert "The full attribution factorial on the empty caption is not shown." in passage()


# --- the colour variant


def test_the_colour_runs_command_budget_load_time_and_date_are_its_manifests():
    m = manifest("colour")
    b = m["budget"]
    assert m["config"]["data"]["gmm_captions"] == "colour"  # "colour words shared by every cluster"
    assert b["protocol"] == "equal_steps"
    start, end = (m["load_average"][when][0] for when in ("start", "end"))
    assert (
        f"`{command_of('colour')}` (colour words shared by every cluster, {b['protocol'].replace('_', ' ')}, "
        f"{b['expert_steps']} steps, {m['seeds']['trainings']} trainings; same machine, nearly idle (load {start:.1f} "
        f"at the start, {end:.1f} at the end), {minutes(m['seconds'])} min; {day(m)}; "
        "`benchmarks/results/reproduce-gmm-colour-{tables.md,manifest.json}`)"
    ) in passage()


def test_on_colour_captions_top2_beats_the_monolith_by_both_densities():
    x, cond = paired("colour", TOP2_MONOLITH), paired("colour", TOP2_MONOLITH, "delta_log_density_cond")
    assert x["resolved"] and cond["resolved"] and min(x["mean"], cond["mean"]) > 0
    assert (
        f"8FM top-2 beats the monolith by {iv(x, 0)} nats per sample over trainings (its Δ log p(x | c), each sample "
        f"under its caption's own target: {iv(cond, 0)})"
    ) in passage()


def test_on_colour_captions_the_gap_on_the_empty_caption_is_the_experts_at_every_routing_mode():
    gap, router, experts = (paired("colour", w) for w in (GAP, ROUTER_AT_EXACT, EXPERTS_UNDER_TRAINED))
    assert {table_of("colour", w) for w in (GAP, ROUTER_AT_EXACT, EXPERTS_UNDER_TRAINED)} == {"attribution"}
    for mode in ("full", "top1", "top2"):
        r = paired("colour", ROUTER_AT_EXACT.replace("full", mode))
        e = paired("colour", EXPERTS_UNDER_TRAINED.replace("full", mode))
        g = paired("colour", GAP.replace("full", mode))
        assert not r["resolved"] and e["resolved"] and g["resolved"] and abs(e["mean"]) > 0.9 * abs(g["mean"])
    assert (
        f"Attribution on the empty caption, full routing (Table 4 there): the gap of trained experts and router to "
        f"exact ones is {iv(gap, 0)} nats; replacing the exact router by the trained one with exact experts costs "
        f"{iv(router, 1)} (a tie), the trained experts under the trained router {iv(experts, 0)}: **the gap is the "
        "experts', not the router's**, and the same holds at top-1 and top-2."
    ) in passage()


def test_on_colour_captions_the_trained_router_on_its_own_trajectories_is_the_top2_rows_probe():
    kl = [row("colour", f"{g} · top2", "router_kl") for g in ("8FM", "2DDPM:6FM")]
    agree = [row("colour", f"{g} · top2", "router_top1_agreement")["mean"] for g in ("8FM", "2DDPM:6FM")]
    assert (
        f"The trained router on the ensemble's own trajectories: KL to the exact posterior "
        f"{level(kl[0]['mean'], 2)} ± {level(kl[0]['half'], 2)} (8FM) and {level(kl[1]['mean'], 2)} ± "
        f"{level(kl[1]['half'], 2)} (2DDPM:6FM), top-1 agreement {level(agree[0], 2)} and {level(agree[1], 2)}."
    ) in passage()
