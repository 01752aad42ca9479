"""Claims in docs/results.md checked against the committed results: the budget ladder's summary of the mixture whose
clusters share no structure ("**In short**, on the mixture whose clusters share no structure" … "Details below."),
every number of that paragraph and its table recomputed from ``benchmarks/results/`` and written as the doc writes it
(one decimal for Δ log p, two for MMD² ×10⁻³, three for the excess loss, the unicode minus), so a rerun that moves a
number, or an edit that moves the text away from the files, fails here."""

import ast
import json
import re
from functools import cache

import pytest

from hddm_flower.gmm.truth import interval

from . import doc_claims
from .doc_claims import RESULTS, ROOT, load, num

START = "**In short**, on the mixture whose clusters share no structure"
END = "Details below."

TOP2_MONOLITH = "8FM: top2 − monolith"
TOP2_TOP1 = "8FM: top2 − top1"
TOP2_FULL = "8FM: top2 − full"
GAP = "empty caption · full: gap, trained experts · trained router − exact · exact"
ROUTER_AT_EXACT = "empty caption · full: router share at exact experts (ET − EE)"  # the router exchanged first
ROUTER_AT_TRAINED = "empty caption · full: router share with trained experts (TT − TE)"  # the router exchanged second
EXPERTS_UNDER_TRAINED = "empty caption · full: experts share under the trained router (TT − ET)"
EXPERTS_UNDER_EXACT = "empty caption · full: experts share under the exact router (TE − EE)"

# The runs behind the paragraph: (router, protocol) → the `hddm reproduce` manifest of each rung (expert steps).
PROMPT_AWARE = {800: "800-text", 3200: "3200-text", 6400: "6400-text"}  # equal steps, router.conditioning: text
EQUAL_IMAGES = {
    800: "ei-800-text",
    3200: "ei-3200-text",
    6400: "ei-6400-text",
}  # equal images, router.conditioning: text
TEXT_FREE = {800: "800", 3200: "3200", 6400: "6400"}  # equal steps, the text-free router


@cache
def raw_paragraph() -> str:
    text = (ROOT / "docs" / "results.md").read_text()
    start = text.index(START)
    return text[start : text.index(END, start) + len(END)]


@cache
def paragraph() -> str:
    """The paragraph with its line breaks folded, so a number wrapped over two lines reads as one."""
    return re.sub(r"\s+", " ", raw_paragraph())


def manifest(run: str) -> dict:
    return load(f"reproduce-gmm-subspace-{run}-manifest.json")


def paired(run: str, what: str, metric: str = "delta_log_density") -> dict:
    """One paired difference of a run's manifest (Tables 3 and 4 of its tables.md): mean, half, inner_half, …"""
    (entry,) = [e for e in manifest(run)["paired"] if e["what"] == what]
    return entry[metric]


def ladder(name: str, label: str, comparison: str, metric: str = "delta_log_density") -> dict:
    """One paired difference of a ``benchmarks/gmm_ladder.py`` record (8FM), by rung label."""
    (rung,) = [g for g in load(f"{name}.json")["rungs"] if g["label"] == label]
    return rung["paired"]["8FM"][comparison][metric]


def excess(name: str, label: str) -> dict:
    """Monolith − expert excess loss over Bayes, mean over t (``gmm_ladder``'s ``excess_mean_over_t``)."""
    (rung,) = [g for g in load(f"{name}.json")["rungs"] if g["label"] == label]
    return rung["excess_mean_over_t"]["monolith_minus_expert"]


# The equal-steps rungs' ladder records by expert steps: 800 and 3,200 read together (their text-free runs), 6,400
# apart (its prompt-aware run; the experts and the monolith train alike under either router)
EQUAL_STEPS_LADDER = {
    800: ("gmm_ladder_subspace", "800"),
    3200: ("gmm_ladder_subspace", "3200"),
    6400: ("gmm_ladder_subspace_6400", "6400-text"),
}
EQUAL_IMAGES_LADDER = {
    800: ("gmm_ladder_subspace_equal_images", "ei-800"),
    3200: ("gmm_ladder_subspace_equal_images", "ei-3200"),
    6400: ("gmm_ladder_subspace_equal_images_6400", "ei-6400"),
}


def iv(x: dict, digits: int, scale: float = 1.0, inner: bool = False) -> str:
    """``mean ± half`` (``[inner_half]`` with ``inner``) of an interval, as the doc writes it."""
    s = f"{num(x['mean'] * scale, digits)} ± {num(x['half'] * scale, digits, sign=False)}"
    return s + (f" [{num(x['inner_half'] * scale, digits, sign=False)}]" if inner else "")


def table_rows() -> dict[str, list[str]]:
    """The paragraph's table, its cells by the first word pair of the protocol column."""
    rows = {}
    for line in raw_paragraph().splitlines():
        if line.startswith("| equal "):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[" ".join(cells[0].split()[:2])] = cells
    return rows


def top2_minus_monolith(protocol: str, steps: int) -> dict:
    """8FM top-2 − monolith, Δ log p, with the prompt-aware router: equal images from the ladder record, equal steps
    from the run's manifest (the ladder records read the text-free runs at 800 and 3,200)."""
    if protocol == "equal images":
        return ladder(*EQUAL_IMAGES_LADDER[steps], "top2 − monolith")
    return paired(PROMPT_AWARE[steps], TOP2_MONOLITH)


def test_the_paragraph_and_its_table_are_in_the_doc():
    assert paragraph().startswith(START) and paragraph().endswith(END)
    assert set(table_rows()) == {"equal images", "equal steps"}


@pytest.mark.parametrize("protocol", ["equal images", "equal steps"])
def test_each_table_row_is_its_runs_top2_minus_monolith_with_the_sign_word_and_excess_loss(protocol):
    cells = table_rows()[protocol]
    ladders = EQUAL_IMAGES_LADDER if protocol == "equal images" else EQUAL_STEPS_LADDER
    for column, steps in ((1, 800), (2, 3200), (3, 6400)):
        x = top2_minus_monolith(protocol, steps)
        word = "top-2 better" if x["mean"] > 0 else "the monolith better"
        assert cells[column] == f"**{iv(x, 1)}** ({word})"
        assert x["resolved"], "a bold cell is a resolved difference"
    assert cells[4] == " → ".join(iv(excess(*ladders[s]), 3) for s in sorted(ladders))


def test_the_sign_words_in_the_table_agree_with_the_signs_the_table_prints():
    words = {"+": "top-2 better", "−": "the monolith better"}
    cells = re.findall(
        r"\*\*([+−])[\d,.]+ ± [\d,.]+\*\* \(([^)]*)\)", "\n".join(map(" | ".join, table_rows().values()))
    )
    assert len(cells) == 6
    for sign, word in cells:
        assert word == words[sign]


def test_the_table_rows_are_the_budgets_and_routers_they_name():
    for steps in (800, 3200, 6400):
        for protocol, runs, monolith_steps, monolith_batch in (
            ("equal_images", EQUAL_IMAGES, 8 * steps, 32),  # "monolith 8× the steps at batch 32"
            ("equal_steps", PROMPT_AWARE, steps, 256),  # "monolith at batch 256"
        ):
            m = manifest(runs[steps])
            b = m["budget"]
            assert (b["protocol"], b["expert_steps"], b["monolith_steps"], b["monolith_batch"]) == (
                protocol,
                steps,
                monolith_steps,
                monolith_batch,
            )
            assert m["config"]["router"]["conditioning"] == "text"  # "a trained prompt-aware router"
            assert m["config"]["expert"]["preset"] == "nano"
            assert m["seeds"]["trainings"] == 3  # "paired over three trainings"
        assert manifest(TEXT_FREE[steps])["config"]["router"]["conditioning"] != "text"
    for name, labels in (
        ("gmm_ladder_subspace", ("800", "3200")),
        ("gmm_ladder_subspace_6400", ("6400-text",)),
        ("gmm_ladder_subspace_equal_images", ("ei-800",)),
        ("gmm_ladder_subspace_equal_images_6400", ("ei-6400",)),
    ):
        for label in labels:
            x = ladder(name, label, "top2 − monolith")
            assert (x["n"], x["covers"]) == (3, "trainings")


def test_the_equal_images_ladder_copies_its_runs_paired_differences():
    for steps, run in EQUAL_IMAGES.items():
        for comparison in ("top2 − monolith", "top2 − top1", "top2 − full"):
            for metric in ("delta_log_density", "mmd2"):
                assert ladder(*EQUAL_IMAGES_LADDER[steps], comparison, metric) == paired(
                    run, f"8FM: {comparison}", metric
                )


def test_the_prose_verdicts_follow_the_signs_of_the_table():
    ei = [top2_minus_monolith("equal images", s)["mean"] for s in (800, 3200, 6400)]
    es = [top2_minus_monolith("equal steps", s)["mean"] for s in (800, 3200, 6400)]
    ei_excess = [excess(*EQUAL_IMAGES_LADDER[s])["mean"] for s in (800, 3200, 6400)]
    assert ei[0] < 0 < ei[1], "under equal images top-k overtakes the monolith between 800 and 3,200"
    assert ei_excess[0] < 0 < ei_excess[1], "the experts' excess loss crosses the monolith's in the same interval"
    assert ei[2] > 0 and ei_excess[2] > 0 and top2_minus_monolith("equal images", 6400)["resolved"]
    assert "crosses the monolith's in the same interval, both still ahead at 6,400;" in paragraph()
    assert min(es) > 0, "under equal steps top-k is ahead at all three rungs tried"
    es_excess = [excess(*EQUAL_STEPS_LADDER[s])["mean"] for s in (3200, 6400)]
    assert es[2] > es[1] and es_excess[1] > es_excess[0], "from 3,200 to 6,400 both leads grow"
    # the changes between rungs, paired by training: top-2's lead from the runs' per-training differences, the
    # excess-loss lead from each training's mean over clusters and t
    gain = {s: paired(PROMPT_AWARE[s], TOP2_MONOLITH)["per_training"] for s in (800, 3200, 6400)}
    lead = {s: excess_per_training(*EQUAL_STEPS_LADDER[s]) for s in (800, 3200, 6400)}
    for s in (800, 3200, 6400):
        assert sum(lead[s]) / 3 == pytest.approx(excess(*EQUAL_STEPS_LADDER[s])["mean"])

    def change(x: dict, a: int, b: int) -> dict:
        return interval([v - u for u, v in zip(x[a], x[b], strict=True)])

    up_gain, up_lead = change(gain, 3200, 6400), change(lead, 3200, 6400)
    down_gain, down_lead = change(gain, 800, 3200), change(lead, 800, 3200)
    assert up_gain["lo"] > 0 and up_lead["lo"] > 0 and down_gain["hi"] < 0 and down_lead["lo"] < 0 < down_lead["hi"]
    assert (
        "under equal steps top-k is ahead at all three rungs tried, and from 3,200 to 6,400 steps both its lead and "
        f"the experts' lead in excess loss grow (paired by training {iv(up_gain, 1)} nats and {iv(up_lead, 3)}), "
        f"after top-2's lead shrank from 800 to 3,200 ({iv(down_gain, 1)}; the excess-loss lead's change then, "
        f"{iv(down_lead, 3)}, is a tie)."
    ) in paragraph()
    assert ladder("gmm_ladder_subspace_6400", "6400-text", "top2 − monolith") == paired(
        PROMPT_AWARE[6400], TOP2_MONOLITH
    )


def test_the_text_free_router_gains_are_the_ladders_top2_minus_monolith():
    for label in ("800", "3200"):
        assert ladder("gmm_ladder_subspace", label, "top2 − monolith") == paired(TEXT_FREE[int(label)], TOP2_MONOLITH)
    gains = [paired(TEXT_FREE[s], TOP2_MONOLITH) for s in (800, 3200, 6400)]
    assert all(g["mean"] > 0 and g["resolved"] for g in gains)
    assert (
        f"(with the text-free router too: {iv(gains[0], 1)}, {iv(gains[1], 1)} and {iv(gains[2], 1)} at 800, 3,200 "
        "and 6,400)"
    ) in paragraph()


def test_mmd_top2_minus_monolith_is_each_runs_and_its_sign_says_who_is_closer():
    es_3200, es_800, es_6400 = (paired(PROMPT_AWARE[s], TOP2_MONOLITH, "mmd2") for s in (3200, 800, 6400))
    ei_3200, ei_800, ei_6400 = (ladder(*EQUAL_IMAGES_LADDER[s], "top2 − monolith", "mmd2") for s in (3200, 800, 6400))
    lower = (es_3200, es_6400, ei_3200, ei_6400, ei_800)  # MMD²: lower is closer
    assert min(x["mean"] for x in lower) > 0 > es_800["mean"] and all(x["resolved"] for x in lower)
    assert (
        f"the monolith is closer at 3,200 and 6,400 under both protocols ({iv(es_3200, 2, 1e3)} and "
        f"{iv(es_6400, 2, 1e3)} equal steps, {iv(ei_3200, 2, 1e3)} and {iv(ei_6400, 2, 1e3)} equal images) and at "
        f"800 under equal images ({iv(ei_800, 2, 1e3)}); "
        f"top-2 is closer at 800 under equal steps ({iv(es_800, 2, 1e3)})"
    ) in paragraph()


def test_top2_against_top1_and_full_with_the_prompt_aware_router_are_the_same_under_both_protocols():
    for runs in (PROMPT_AWARE, EQUAL_IMAGES):
        t1 = [paired(runs[s], TOP2_TOP1) for s in (800, 3200)]
        full = [paired(runs[s], TOP2_FULL) for s in (800, 3200)]
        assert (
            f"top-2 − top-1 {iv(t1[0], 1)} at 800 and {iv(t1[1], 1)} at 3,200, "
            f"top-2 − full {iv(full[0], 1)} and {iv(full[1], 2)} — ties, except full ahead by a resolved third of a "
            "nat at 3,200"
        ) in paragraph()
        assert not (t1[0]["resolved"] or t1[1]["resolved"] or full[0]["resolved"])
        assert full[1]["resolved"] and full[1]["mean"] < 0 and round(-1 / full[1]["mean"]) == 3
    t1, full = paired(PROMPT_AWARE[6400], TOP2_TOP1), paired(PROMPT_AWARE[6400], TOP2_FULL)
    assert t1["resolved"] and full["resolved"] and t1["mean"] > 0 > full["mean"]
    assert max(abs(t1["mean"]), abs(full["mean"])) < 0.2  # "their means under a fifth of a nat"
    assert (
        f"at 6,400 top-2 − top-1 {iv(t1, 2)} and top-2 − full {iv(full, 2)}, both resolved, their means "
        "under a fifth of a nat;"
    ) in paragraph()


def test_both_protocols_share_the_routing_modes_identical_at_800_and_within_0_006_nats_at_3200():
    def largest_difference(steps: int) -> float:  # over the modes' rows, every training × sampling seed
        a, b = manifest(PROMPT_AWARE[steps])["results"], manifest(EQUAL_IMAGES[steps])["results"]
        return max(
            abs(u["delta_log_density"] - v["delta_log_density"])
            for row in ("8FM · top1", "8FM · top2", "8FM · full")
            for ta, tb in zip(a[row]["per_training"], b[row]["per_training"])
            for u, v in zip(ta, tb)
        )

    assert largest_difference(800) == largest_difference(6400) == 0.0
    # at 6,400 the equal-images run copied the equal-steps run's rows (--reuse): the same numbers, not a repeat
    rows = manifest(EQUAL_IMAGES[6400])["results"]
    assert all(rows[row].get("reused_from") for row in ("8FM · top1", "8FM · top2", "8FM · full"))
    assert (
        f"identical at 800, within {largest_difference(3200):.3f} nats at 3,200, and at 6,400 copied from the "
        "equal-steps run)"
    ) in paragraph()


def test_the_text_free_router_modes_top2_beats_top1_and_full_at_800_and_full_edges_top2_at_3200():
    t1_800, full_800, full_3200 = (
        ladder("gmm_ladder_subspace", label, comparison)
        for label, comparison in (("800", "top2 − top1"), ("800", "top2 − full"), ("3200", "top2 − full"))
    )
    assert t1_800["resolved"] and full_800["resolved"] and full_3200["resolved"]
    assert t1_800["mean"] > 0 and full_800["mean"] > 0 > full_3200["mean"]
    assert (
        "with the text-free router (equal steps) top-2 beats top-1 and full at 800 and full edges top-2 at 3,200"
        in (paragraph())
    )


def verdict(x: dict) -> str:
    return "resolved" if x["resolved"] else "a tie"


def test_the_empty_caption_numbers_are_table_4_of_each_run():
    for run in (*PROMPT_AWARE.values(), *EQUAL_IMAGES.values(), *TEXT_FREE.values()):
        full = {e["table"] for e in manifest(run)["paired"] if e["what"].startswith("empty caption · full")}
        assert full == {"attribution"}


def test_the_prompt_aware_routers_cost_at_exact_experts_is_one_number_at_every_rung():
    # at exact experts the trained router does not depend on the experts' budget: one number for every run
    (pa,) = {iv(paired(run, ROUTER_AT_EXACT), 1) for run in (*PROMPT_AWARE.values(), *EQUAL_IMAGES.values())}
    assert paired(PROMPT_AWARE[800], ROUTER_AT_EXACT)["resolved"]
    assert f"at exact experts the trained router costs {pa} nats (prompt-aware) or " in paragraph()


def test_the_text_free_routers_cost_at_exact_experts_is_one_number_at_both_rungs_and_a_tie():
    tf = paired(TEXT_FREE[800], ROUTER_AT_EXACT)
    assert iv(paired(TEXT_FREE[3200], ROUTER_AT_EXACT), 1) == iv(tf, 1)
    assert not tf["resolved"]
    # at 6,400 the text-free router (its config and seed those of the other rungs) was trained again: a number apart
    later = paired(TEXT_FREE[6400], ROUTER_AT_EXACT)
    assert not later["resolved"] and iv(later, 1) != iv(tf, 1)
    assert manifest(TEXT_FREE[6400])["timings_s"]["router"] > 0
    assert manifest(TEXT_FREE[6400])["config"]["router"] == manifest(TEXT_FREE[800])["config"]["router"]
    assert (
        f"(prompt-aware) or {iv(tf, 1)} (text-free, {verdict(tf)}; {iv(later, 1)} at 6,400, where the same router was "
        "trained again)"
    ) in paragraph()


def test_the_routers_cost_at_trained_experts_is_table_4_of_each_run():
    pa_800, pa_3200, pa_6400 = (paired(PROMPT_AWARE[s], ROUTER_AT_TRAINED) for s in (800, 3200, 6400))
    tf_800, tf_3200, tf_6400 = (paired(TEXT_FREE[s], ROUTER_AT_TRAINED) for s in (800, 3200, 6400))
    assert pa_800["resolved"] and pa_3200["resolved"] and pa_6400["resolved"]
    assert (
        f"at trained experts {iv(pa_800, 1)} (800), {iv(pa_3200, 1)} (3,200) and {iv(pa_6400, 1)} (6,400) "
        "prompt-aware, all resolved, and "
        f"{iv(tf_800, 1)} ({verdict(tf_800)}), {iv(tf_3200, 1)} ({verdict(tf_3200)}) and {iv(tf_6400, 1)} "
        f"({verdict(tf_6400)}) text-free"
    ) in paragraph()


def test_the_whole_gap_on_the_empty_caption_is_table_4_of_each_run():
    pa = [iv(paired(PROMPT_AWARE[s], GAP), 1) for s in (800, 3200, 6400)]
    tf = [iv(paired(TEXT_FREE[s], GAP), 1) for s in (800, 3200, 6400)]
    assert (
        f"the whole gap is {pa[0]}, {pa[1]} and {pa[2]} (prompt-aware), {tf[0]}, {tf[1]} and {tf[2]} (text-free)"
    ) in paragraph()


def shares(runs: dict[int, str]) -> list[float]:
    """The router's share of the whole gap in per cent, both orders of exchange (the router first: at exact experts,
    ET − EE; the experts first: with trained experts, TT − TE), each rung."""
    out = []
    for run in runs.values():
        gap = paired(run, GAP)["mean"]
        for router, experts in ((ROUTER_AT_EXACT, EXPERTS_UNDER_TRAINED), (ROUTER_AT_TRAINED, EXPERTS_UNDER_EXACT)):
            r = paired(run, router)["mean"]
            assert r + paired(run, experts)["mean"] == pytest.approx(gap)  # the two parts add up to the gap
            out.append(100 * r / gap)
    return out


def test_the_routers_share_is_its_range_over_the_rungs_and_orders_for_each_router():
    pa, tf = shares(PROMPT_AWARE), shares(TEXT_FREE)
    assert (
        f"the router's share is {min(pa):.1f}–{max(pa):.1f} % of it with the prompt-aware router and "
        f"{min(tf):.1f}–{max(tf):.1f} % with the text-free one, depending on the order in which the parts are "
        "exchanged and on the budget"
    ) in paragraph()
    first, second = pa[0::2], pa[1::2]  # by rung (800, 3,200, 6,400): the router exchanged first, then second
    assert first[0] < first[1] < first[2] and second[0] < second[1] < second[2], "it rises with the budget"
    # exchanged first, the router's cost at exact experts is one number at every rung: only the gap moves
    (cost,) = {iv(paired(run, ROUTER_AT_EXACT), 1) for run in PROMPT_AWARE.values()}
    gaps = [paired(run, GAP)["mean"] for run in PROMPT_AWARE.values()]
    assert gaps[0] < gaps[1] < gaps[2] < 0, "the gap shrinks"

    def per_training_share(run: str) -> list[float]:
        r, g = paired(run, ROUTER_AT_TRAINED)["per_training"], paired(run, GAP)["per_training"]
        return [100 * a / b for a, b in zip(r, g, strict=True)]

    def rise(a: int, b: int) -> dict:
        return interval([y - x for x, y in zip(*(per_training_share(PROMPT_AWARE[s]) for s in (a, b)), strict=True)])

    assert not any(rise(a, b)["lo"] > 0 for a, b in ((800, 3200), (3200, 6400))), "only 800 → 6,400 is resolved"
    whole_rise = rise(800, 6400)
    assert whole_rise["lo"] > 0
    assert (
        f"({', '.join(f'{x:.1f}' for x in first)} % with the router exchanged first, the trained router put in place "
        "of the exact one beside exact experts, whose cost there is the same at every rung; "
        f"{', '.join(f'{x:.1f}' for x in second)} % with it exchanged second, beside the trained experts, where over "
        f"trainings only the rise from 800 to 6,400 is resolved: {iv(whole_rise, 1)} points, each training's share "
        "paired by training)"
    ) in paragraph()


def test_the_inner_half_width_example_is_the_equal_images_800_rungs_and_exceeds_the_outer_one():
    x = ladder("gmm_ladder_subspace_equal_images", "ei-800", "top2 − monolith")
    assert x["inner_half"] > x["half"]
    assert (
        f"where the inner half-width (over sampling seeds within a training, in brackets in the tables) is larger than the outer one, e.g. {iv(x, 1, inner=True)},"
        in paragraph()
    )
    assert (
        f"| {iv(x, 1, inner=True).replace('−', '-')} |" in (RESULTS / "gmm_ladder_subspace_equal_images.md").read_text()
    )


def test_the_nano_pilots_gap_from_400_to_3200_steps_is_its_one_trainings_records():
    records = [
        r
        for r in load("gmm_capacity_pilot.json")["records"]
        if r["label"] == "base-nano-cos-lr2.0e-3" and r.get("training", 0) == 0
    ]
    gap = {
        r["steps"]: r["mean_over_t_and_clusters"]["monolith"] - r["mean_over_t_and_clusters"]["expert"] for r in records
    }
    assert (
        f"the nano pilot's monolith − expert {num(gap[400], 3)} → {num(gap[3200], 3)} from 400 to 3,200 steps, one training"
        in paragraph()
    )


# The rest of the budget ladder: the five-rung table after the paragraph, its three bullets (the mixture of the
# ladder, the larger mixture, the `nano` rung and the capacity pilot's training 0) and the bullet on the mixture whose
# clusters share no structure up to its pilot ("| rung (budget, expert steps) |" … "The pilot (`benchmarks/…").
LADDER_START = "| rung (budget, expert steps) | 8FM top-2 − monolith"
LADDER_END = "The pilot (`benchmarks/gmm_capacity_pilot.py`"
PILOT_LABEL = "base-nano-cos-lr2.0e-3"  # the nano pilot: the nano rung's config (lr 2e-3, cosine) at other budgets
WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 8: "eight"}
RUNG_LABELS = (  # gmm_ladder.json's rungs, the rung table's rows in order
    "equal-images-200",
    "equal-steps-200",
    "equal-steps-800",
    "capacity-equal-steps-800",
    "nano-equal-steps-800",
)


def raw_ladder_text() -> str:
    return doc_claims.raw_passage(LADDER_START, LADDER_END)


def ladder_text() -> str:
    """The rung table, its bullets and the subspace table with its sentences, line breaks folded."""
    return doc_claims.passage(LADDER_START, LADDER_END)


def doc_table(header: str) -> list[list[str]]:
    """The cells of each body row of the section's table whose header line starts with ``header``."""
    lines = [line.strip() for line in raw_ladder_text().splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[start + 2 : end]]


def rungs(name: str = "gmm_ladder") -> list[dict]:
    return load(f"{name}.json")["rungs"]


def excess_per_training(name: str, label: str) -> list[float]:
    """Each training's monolith − expert excess loss, mean over the clusters and the t grid."""
    (g,) = [g for g in rungs(name) if g["label"] == label]
    out = []
    for training in g["excess"]["per_training"]:
        gaps = [m - e for c in training.values() for m, e in zip(c["monolith"], c["expert"], strict=True)]
        out.append(sum(gaps) / len(gaps))
    return out


def subspace_rungs() -> list[tuple[str, dict]]:
    """The equal-steps subspace rungs in the order of the doc's subspace table: (ladder record, rung)."""
    return [(name, g) for name in ("gmm_ladder_subspace", "gmm_ladder_subspace_6400") for g in rungs(name)]


def rung(label: str, name: str = "gmm_ladder") -> dict:
    (g,) = [g for g in rungs(name) if g["label"] == label]
    return g


def resolved(x: dict) -> bool:
    """A paired difference's own verdict, or (the excess-loss intervals carry none) its interval off 0."""
    return x["resolved"] if "resolved" in x else x["lo"] > 0 or x["hi"] < 0


def bold(s: str, x: dict) -> str:
    return f"**{s}**" if resolved(x) else s


def level(x: dict, digits: int = 3) -> str:
    """A level (no sign) with its half-width: ``0.116 ± 0.010``."""
    return f"{num(x['mean'], digits, sign=False)} ± {num(x['half'], digits, sign=False)}"


def whole(x: dict) -> str:
    """The rung table's Δ log p: whole nats, the integers without the thousands comma (as gmm_ladder.md writes them)."""
    return iv(x, 0).replace(",", "")


def by_t(name: str, label: str, t: float, who: str = "monolith_minus_expert") -> dict:
    """An excess-loss interval at one t of a ladder rung: ``who`` is expert, monolith or monolith_minus_expert."""
    e = rung(label, name)["excess"]
    i = load(f"{name}.json")["times"].index(t)
    return e["monolith_minus_expert_by_t"][i] if who == "monolith_minus_expert" else e["by_t"][who][i]


@cache
def patterns() -> tuple[str, ...]:
    """``hddm_flower.gmm.dataset.PATTERNS``, read from the source (cluster k is pattern k) without importing torch."""
    source = (ROOT / "hddm_flower" / "gmm" / "dataset.py").read_text()
    (node,) = [
        n for n in ast.parse(source).body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "PATTERNS"
    ]
    return ast.literal_eval(node.value)


def checkerboard() -> str:
    return str(patterns().index("checkerboard"))


def gmm_name(dataset: str) -> dict[str, int]:
    """The sizes a GMM dataset's name carries (``gmm-v1-3x12px-k8-j6-r12-…``): channels, size, k, j, r."""
    m = re.match(r"gmm-v\d+-(\d+)x(\d+)px-k(\d+)-j(\d+)-r(\d+)-", dataset)
    return dict(zip(("channels", "size", "k", "j", "r"), map(int, m.groups())))


def test_the_ladder_text_and_its_two_tables_are_in_the_doc():
    assert ladder_text().startswith(LADDER_START)
    assert tuple(g["label"] for g in rungs()) == RUNG_LABELS
    assert len(doc_table("| rung (budget, expert steps) |")) == len(rungs())
    assert len(doc_table("| rung | FM expert (mean over t) |")) == len(subspace_rungs()) == 3


def test_the_rung_tables_rows_are_the_ladder_records_rungs_in_order_named_by_their_budgets():
    nano = load("reproduce-gmm-nano-manifest.json")
    names = []
    for g in rungs():
        b = g["budget"]
        name = f"{b['protocol'].replace('_', ' ')}, {b['expert_steps']}"
        if b["expert_steps"] == min(r["budget"]["expert_steps"] for r in rungs()):  # the 200 rungs name the monolith
            name += f" (monolith {num(b['monolith_steps'], 0, sign=False)} steps × {b['monolith_batch']})"
        config = re.search(r"--config configs/(\S+)", g["command"])[1]
        if config == "reproduce-gmm-capacity.yaml":
            cap, ladder_mixture = gmm_name(g["data"]["dataset"]), gmm_name(rungs()[0]["data"]["dataset"])
            assert cap["channels"] * cap["size"] ** 2 > ladder_mixture["channels"] * ladder_mixture["size"] ** 2
            assert cap["k"] * cap["j"] > ladder_mixture["k"] * ladder_mixture["j"]  # "larger mixture"
            name = f"larger mixture (`{config}`), {name}"
        if g["expert_preset"] != "mini":  # the nano rung: its run's manifest names the schedule
            assert nano["command"] == g["command"] and nano["config"]["expert"]["preset"] == g["expert_preset"]
            name = f"`{g['expert_preset']}` networks, {name}, {nano['config']['expert']['optim']['schedule']}"
        names.append(name)
    assert [row[0] for row in doc_table("| rung (budget, expert steps) |")] == names


def rung_cells(label: str) -> tuple[dict, list[str]]:
    """A rung of ``gmm_ladder.json`` and its row of the rung table (the rows are the record's rungs in order)."""
    i = [g["label"] for g in rungs()].index(label)
    return rungs()[i], doc_table("| rung (budget, expert steps) |")[i]


@pytest.mark.parametrize(
    ("label", "group"), [(label, group) for label in RUNG_LABELS for group in ("8FM", "2DDPM:6FM")]
)
def test_each_rung_rows_top2_minus_monolith_cells_are_its_ladder_records_bold_where_resolved(label, group):
    g, cells = rung_cells(label)
    x = g["paired"].get(group, {}).get("top2 − monolith", {}).get("delta_log_density")
    assert cells[1 + ("8FM", "2DDPM:6FM").index(group)] == (bold(whole(x), x) if x else "—")  # nano: no DDPM expert


@pytest.mark.parametrize("label", RUNG_LABELS)
def test_each_rung_rows_excess_loss_cell_is_its_mean_over_t_with_the_sign_word_where_resolved(label):
    g, cells = rung_cells(label)
    x = g["excess_mean_over_t"]["monolith_minus_expert"]
    cell = bold(iv(x, 3), x)
    if resolved(x):
        cell += f" (the {'expert' if x['mean'] > 0 else 'monolith'} is closer"
        per = g["monolith_minus_expert_by_cluster"].values()
        if all(resolved(c) and (c["mean"] > 0) == (x["mean"] > 0) for c in per):
            cell += f", on each of the {len(per)} clusters"
        cell += ")"
    assert cells[3] == cell


def test_the_sign_words_of_the_ladder_text_agree_with_the_signs_they_follow():
    words = {"+": "the expert is closer", "−": "the monolith is closer"}
    found = re.findall(r"\*\*([+−])[\d.]+ ± [\d.]+\*\* \((the \w+ is closer)", ladder_text())
    assert len(found) == 3
    for sign, word in found:
        assert word == words[sign]


def test_under_equal_steps_top2_beats_the_monolith_at_the_smallest_budget_and_the_experts_are_closer():
    least = min(g["budget"]["expert_steps"] for g in rungs())
    (smallest,) = [
        g for g in rungs() if g["budget"]["protocol"] == "equal_steps" and g["budget"]["expert_steps"] == least
    ]
    x = smallest["paired"]["8FM"]["top2 − monolith"]["delta_log_density"]
    e = smallest["excess_mean_over_t"]["monolith_minus_expert"]
    assert x["resolved"] and x["mean"] > 0 and resolved(e) and e["mean"] > 0
    assert (
        "**Under DDM's equal-steps protocol the ensemble beats the monolith at the smallest budget**" in ladder_text()
    )
    assert (
        f"8FM top-2 gains {whole(x)} nats per sample over {WORDS[x['n']]} trainings, and the FM experts are closer to "
        f"the exact velocity on their own clusters than the monolith ({iv(e, 3)} per dimension, mean over clusters;"
    ) in ladder_text()


def test_at_the_smallest_equal_steps_rung_every_clusters_interval_is_above_0_but_the_checkerboards_a_tie():
    per = rung("equal-steps-200")["monolith_minus_expert_by_cluster"]
    above = [k for k, x in per.items() if x["lo"] > 0]
    (left,) = set(per) - set(above)
    assert left == checkerboard() and not resolved(per[left])
    assert (
        f"on {len(above)} of the {len(per)} clusters the interval is above 0, the {patterns()[int(left)]} ties at "
    ) in ladder_text()


def test_the_checkerboards_tie_at_the_smallest_equal_steps_rung_is_its_clusters_interval():
    x = rung("equal-steps-200")["monolith_minus_expert_by_cluster"][checkerboard()]
    assert f"the checkerboard ties at {iv(x, 3)})" in ladder_text()


def test_at_800_equal_steps_the_excess_losses_tie():
    e = excess("gmm_ladder", "equal-steps-800")
    assert not resolved(e)
    assert f"At 800 steps the monolith has caught up: the excess losses tie ({iv(e, 3)}) and so does Δ log p (" in (
        ladder_text()
    )


def test_at_800_equal_steps_top2_ties_the_monolith_by_delta_log_p():
    x = ladder("gmm_ladder", "equal-steps-800", "top2 − monolith")
    assert not x["resolved"]
    assert f"and so does Δ log p ({whole(x)})" in ladder_text()


def test_under_equal_images_the_monolith_takes_8x_the_steps_is_closer_and_top2_ties_it():
    g = rung("equal-images-200")
    ratio = g["budget"]["monolith_steps"] / g["budget"]["expert_steps"]
    e = g["excess_mean_over_t"]["monolith_minus_expert"]
    x = g["paired"]["8FM"]["top2 − monolith"]["delta_log_density"]
    assert resolved(e) and e["mean"] < 0 and not x["resolved"]
    assert (
        f"Under equal images (the monolith takes {ratio:g}× an expert's optimiser steps) the monolith is closer to "
        f"the exact velocity ({iv(e, 3)}) and top-2 ties with it"
    ) in ladder_text()


def test_on_the_larger_mixture_mini_monoliths_excess_loss_ties_the_experts_at_800_steps():
    g = rung("capacity-equal-steps-800")
    e = g["excess_mean_over_t"]["monolith_minus_expert"]
    assert not resolved(e) and g["expert_preset"] == "mini" and g["budget"]["expert_steps"] == 800
    assert (
        f"**The larger mixture is not capacity-limited for `{g['expert_preset']}`**: at {g['budget']['expert_steps']} "
        f"steps the monolith's excess loss on each expert's cluster ties the expert's ({iv(e, 3)})"
    ) in ladder_text()


def test_the_larger_mixtures_field_and_shared_structure_follow_from_its_dataset_and_the_generator():
    size = gmm_name(rung("capacity-equal-steps-800")["data"]["dataset"])
    assert "-cov-" not in rung("capacity-equal-steps-800")["data"]["dataset"]  # directions by pattern, not by cluster
    c, d, r, components = size["channels"], size["channels"] * size["size"] ** 2, size["r"], size["k"] * size["j"]
    numbers = components * (d * (r + 1) + 1)  # per component: the mean, r directions and the diagonal's one value
    assert f"{components} × ({d} × {r + 1} + 1) ≈ {round(numbers, -4) // 1000}k numbers" in ladder_text()
    source = (ROOT / "hddm_flower" / "gmm" / "dataset.py").read_text()
    assert "rng.standard_normal((C, 3, 3))" in source  # the smooth directions: block-constant on a 3×3 grid
    fixed = 1 + c  # the pattern's contrast and one brightness per channel
    assert (
        f"every mean is one of {size['k']} patterns times one of {size['j']} colours, {fixed} of each component's "
        f"{r} directions are the pattern's contrast and the {WORDS[c]} channel brightnesses, and the other {r - fixed} "
        f"are block-constant on a 3×3 grid per channel — one {c * 3 * 3}-dimensional subspace for all {components} "
        "components"
    ) in ladder_text()


def misses(x: float) -> bool:
    """The checkerboard expert "misses the mean": an excess over half the ≈ 0.2 per dimension the doc quotes (a
    network that fits it stays below 0.1 at every t ≥ 0.5 on these rungs)."""
    return x > 0.1


def test_on_both_800_step_mini_rungs_the_checkerboard_expert_misses_the_mean_at_high_noise_the_monolith_in_one_training():
    both = [g["label"] for g in rungs() if g["budget"]["expert_steps"] == 800 and g["expert_preset"] == "mini"]
    assert both == ["equal-steps-800", "capacity-equal-steps-800"]
    times = load("gmm_ladder.json")["times"]
    start, level, monolith, trainings = {}, [], set(), set()
    for label in both:
        per = [e[checkerboard()] for e in rung(label)["excess"]["per_training"]]
        # the smallest t from which the expert misses the mean at every t, in every training
        start[label] = min(t for i, t in enumerate(times) if all(misses(x) for p in per for x in p["expert"][i:]))
        i = times.index(start[label])
        lost = [x for p in per for x in p["expert"][i:]]
        level.append(f"{sum(lost) / len(lost):.1f}")
        monolith.add(sum(all(misses(x) for x in p["monolith"][i:]) for p in per))
        trainings.add(len(per))
    (n,), (m,), (lvl,) = trainings, monolith, set(level)  # one count and one level for both rungs, as the doc says
    assert (
        f"on the checkerboard cluster the expert misses the mean at t ≥ {start['equal-steps-800']:g} on the "
        f"equal-steps rung and at t ≥ {start['capacity-equal-steps-800']:g} on the larger mixture's (excess ≈ {lvl} "
        f"per dimension) in all {WORDS[n]} trainings of both 800-step rungs, the monolith in {WORDS[m]} of {WORDS[n]} "
        "(per cluster and t in `gmm_ladder.json`)"
    ) in ladder_text()


def test_the_nano_rung_is_the_ladders_mixture_with_the_pilots_64k_parameter_networks():
    g = rung("nano-equal-steps-800")
    parameters = {
        r["train_seconds"]["parameters"] for r in load("gmm_capacity_pilot.json")["records"] if r["preset"] == "nano"
    }
    (p,) = parameters
    assert g["data"] == rung("equal-steps-800")["data"]  # "the ladder's mixture"
    e = g["excess_mean_over_t"]["monolith_minus_expert"]
    assert resolved(e) and e["mean"] > 0  # "the monolith is behind"
    assert (
        f"**With `nano` networks ({round(p / 1000)}k parameters, the ladder's mixture) the monolith is behind at "
        f"{g['budget']['expert_steps']} steps**"
    ) in ladder_text()


def test_the_nano_rungs_excess_losses_are_its_mean_over_t_positive_from_t_01_and_on_each_cluster_tied_at_t_0():
    g = rung("nano-equal-steps-800")
    m, times = g["excess_mean_over_t"], load("gmm_ladder.json")["times"]
    gap = g["excess"]["monolith_minus_expert_by_t"]
    positive = [t for t, x in zip(times, gap) if x["lo"] > 0]
    per = g["monolith_minus_expert_by_cluster"].values()
    assert positive == times[1:] and all(x["lo"] > 0 for x in per) and not resolved(gap[0])
    assert (
        f"its excess loss over Bayes on each expert's cluster is {level(m['monolith'])} per dimension against the "
        f"experts' {level(m['expert'])}, monolith − expert {bold(iv(m['monolith_minus_expert'], 3), m['monolith_minus_expert'])} "
        f"over {WORDS[g['trainings']]} trainings, positive at every t from {times[1]:g} to {times[-1]:g} and on each of "
        f"the {len(per)} clusters (interval above 0 on all {len(per)}; `gmm_ladder.md`); at t = {times[0]:g} the two "
        f"tie ({iv(gap[0], 3)})"
    ) in ladder_text()
    row = [
        line for line in (RESULTS / "gmm_ladder.md").read_text().splitlines() if line.startswith(f"| {g['label']} |")
    ]
    assert row[-1].endswith(f"| {len(per)} of {len(per)} (interval above 0) |")


def test_the_nano_pilots_training_0_runs_the_nano_rungs_config_on_clusters_0_3_and_4():
    records = [r for r in load("gmm_capacity_pilot.json")["records"] if r["label"] == PILOT_LABEL]
    optim = load("reproduce-gmm-nano-manifest.json")["config"]["expert"]["optim"]
    for r in records:
        assert r.get("training", 0) == 0 and r["dataset"] == rung("nano-equal-steps-800")["data"]["dataset"]
        sets = dict(s.split("=") for s in r["set"].split())
        assert (sets["expert.preset"], float(sets["expert.optim.lr"]), sets["expert.optim.schedule"]) == (
            "nano",
            optim["lr"],
            optim["schedule"],
        )
        assert r["budget"]["protocol"] == "equal_steps"
    (clusters,) = {tuple(r["per_cluster"]) for r in records}
    assert (
        "one training of the same config at other budgets (`benchmarks/gmm_capacity_pilot.py`, experts of clusters "
        f"{', '.join(clusters[:-1])} and {clusters[-1]}; `benchmarks/results/gmm_capacity_pilot.json`)"
    ) in ladder_text()


def pilot_curve() -> dict[int, dict[str, float]]:
    """Expert and monolith excess loss (mean over t and the pilot's clusters) by steps: the pilot's training 0 records
    and, at 800, the nano rung's training 0 on the same clusters."""
    records = [r for r in load("gmm_capacity_pilot.json")["records"] if r["label"] == PILOT_LABEL]
    curve = {r["steps"]: r["mean_over_t_and_clusters"] for r in records}
    for r in records:  # the records' mean is over the t grid and their clusters
        for who in ("expert", "monolith"):
            values = [x for c in r["per_cluster"].values() for x in c[who]]
            assert sum(values) / len(values) == pytest.approx(r["mean_over_t_and_clusters"][who])
    run = rung("nano-equal-steps-800")["excess"]["per_training"][0]
    clusters = list(records[0]["per_cluster"])
    curve[800] = {
        who: sum(x for k in clusters for x in run[k][who]) / sum(len(run[k][who]) for k in clusters)
        for who in ("expert", "monolith")
    }
    return dict(sorted(curve.items()))


def test_the_nano_pilots_gap_at_each_budget_is_its_records_and_the_nano_runs_training_0_at_800():
    curve = pilot_curve()
    assert list(curve) == [400, 800, 1600, 3200]
    gap = {s: c["monolith"] - c["expert"] for s, c in curve.items()}
    s0, s1, s2, s3 = (num(s, 0, sign=False) for s in curve)
    (last,) = [
        r for r in load("gmm_capacity_pilot.json")["records"] if r["label"] == PILOT_LABEL and r["steps"] == 3200
    ]
    cb = last["per_cluster"][checkerboard()]
    ahead = (sum(cb["monolith"]) - sum(cb["expert"])) / len(cb["expert"])  # monolith − expert, mean over t
    assert ahead < 0 and rung("nano-equal-steps-800")["budget"]["expert_steps"] == 800
    lo, hi = curve[400], curve[3200]
    assert (
        f"monolith − expert {num(gap[400], 3)} at {s0} steps, {num(gap[800], 3)} at {s1} (the run's training 0), "
        f"{num(gap[1600], 3)} at {s2} and {num(gap[3200], 3)} at {s3} (expert {num(lo['expert'], 3, False)} → "
        f"{num(hi['expert'], 3, False)}, monolith {num(lo['monolith'], 3, False)} → "
        f"{num(hi['monolith'], 3, False)}; at {s3} the monolith is ahead on the checkerboard cluster, "
        f"{num(ahead, 3)})"
    ) in ladder_text()


def test_the_nano_pilots_excess_losses_fall_and_its_gap_shrinks_at_every_doubling():
    curve = pilot_curve()
    steps = list(curve)
    assert all(b == 2 * a for a, b in zip(steps, steps[1:]))
    for who in ("expert", "monolith"):
        assert all(curve[b][who] < curve[a][who] for a, b in zip(steps, steps[1:]))  # "still falling"
    gap = [curve[s]["monolith"] - curve[s]["expert"] for s in steps]
    assert all(0 < b < a for a, b in zip(gap, gap[1:]))
    assert "has both excess losses still falling and the gap closing" in ladder_text()
    assert "the gap shrinks at every doubling of the budget" in ladder_text()


def test_the_subspace_runs_are_the_nano_rungs_mixture_with_one_rank_8_subspace_per_cluster():
    nano = gmm_name(rung("nano-equal-steps-800")["data"]["dataset"])
    for _, g in subspace_rungs():
        data = manifest(g["label"])["config"]["data"]
        size = gmm_name(g["data"]["dataset"])
        assert {k: v for k, v in size.items() if k != "r"} == {k: v for k, v in nano.items() if k != "r"}
        assert g["expert_preset"] == rung("nano-equal-steps-800")["expert_preset"]
        assert g["budget"]["protocol"] == "equal_steps" and g["data"]["dataset"].endswith("-cov-cluster")
        assert (
            f"(`configs/reproduce-gmm-subspace.yaml`: `data.gmm_covariance: {data['gmm_covariance']}`, each cluster "
            f"its own random rank-{data['gmm_rank']} subspace shared by its {WORDS[data['gmm_components']]} components "
            f"and by no other cluster; the same means, captions and `{g['expert_preset']}` networks as the nano rung; "
            f"equal steps; {g['trainings']} trainings × {g['sampling_seeds']} sampling seeds;"
        ) in ladder_text()


def test_the_subspace_runs_commands_times_loads_and_date_are_their_records():
    record, (low, high) = load("gmm_ladder_subspace.json"), rungs("gmm_ladder_subspace")
    first = low["command"].replace(low["out"], "OUT")
    base, _, tail = first.partition(" --out ")
    extra, _, high_tail = high["command"].replace(high["out"], "OUT").removeprefix(base).partition(" --out ")
    assert high_tail == tail  # the second rung: the first's command with one more --set
    ladder_command = record["command"]
    for g in (low, high):
        ladder_command = ladder_command.replace(g["out"], f"OUT_{g['label']}")
    ladder_command = re.sub(r" --threads \d+$", "", ladder_command)
    loads = [g["load_average"][when][0] for g in (low, high) for when in ("start", "end")]
    (day,) = {record["date"][:10]} | {manifest(g["label"])["created_at"][:10] for g in (low, high)}
    assert (
        f"`{first}`, and `{extra.strip()}` for the second rung; then "
        f"`{ladder_command}`; same machine, shared with other test runs (load {min(loads):.1f}–{max(loads):.1f}), "
        f"{low['seconds'] / 60:.1f} and {high['seconds'] / 60:.1f} min; {day};"
    ) in ladder_text()


def test_each_subspace_table_row_is_its_rungs_excess_losses_and_clusters_where_the_monolith_is_worse():
    rows = doc_table("| rung | FM expert (mean over t) |")
    for (name, g), cells in zip(subspace_rungs(), rows, strict=True):
        m, label = g["excess_mean_over_t"], g["label"]
        gap = m["monolith_minus_expert"]
        expert, monolith = (by_t(name, label, 0.1, who) for who in ("expert", "monolith"))
        at = by_t(name, label, 0.1)
        per = g["monolith_minus_expert_by_cluster"].values()
        assert cells == [
            f"{num(g['budget']['expert_steps'], 0, sign=False)} steps",
            level(m["expert"]),
            level(m["monolith"]),
            bold(iv(gap, 3), gap),
            f"{num(expert['mean'], 3, False)} / {num(monolith['mean'], 3, False)} ({iv(at, 3)})",
            f"{sum(x['lo'] > 0 for x in per)} of {len(per)}",
        ]


def test_between_the_subspace_rungs_the_excess_at_t_01_falls_by_38_and_6_percent_then_48_and_6():
    def fall(who: str, a: tuple[str, str], b: tuple[str, str]) -> float:
        return 100 * (1 - by_t(*b, 0.1, who)["mean"] / by_t(*a, 0.1, who)["mean"])

    first = {who: fall(who, EQUAL_STEPS_LADDER[800], EQUAL_STEPS_LADDER[3200]) for who in ("expert", "monolith")}
    then = {who: fall(who, EQUAL_STEPS_LADDER[3200], EQUAL_STEPS_LADDER[6400]) for who in ("expert", "monolith")}
    assert first["expert"] > first["monolith"] > 0 and then["expert"] > then["monolith"] > 0
    assert (
        f"Between the rungs the experts' excess at t = 0.1 falls by {first['expert']:.0f} % and the monolith's by "
        f"{first['monolith']:.0f} % (from 3,200 to 6,400 steps by {then['expert']:.0f} % and {then['monolith']:.0f} %):"
    ) in ladder_text()


def test_the_6400_subspace_runs_command_time_load_and_date_are_its_records():
    record, (g,) = load("gmm_ladder_subspace_6400.json"), rungs("gmm_ladder_subspace_6400")
    m = manifest(g["label"])
    assert m["command"] == g["command"] and m["budget"]["expert_steps"] == 6400
    command = g["command"].replace(g["out"], "OUT")
    ladder_command = re.sub(r" --threads \d+$", "", record["command"].replace(g["out"], "OUT"))
    loads = [m["load_average"][when][0] for when in ("start", "end")]
    assert "AVX-512" in record["machine"] and record["date"][:10] == m["created_at"][:10]
    assert (
        f"`{command}`, then `{ladder_command}`; AMD EPYC (AVX-512), 2 cores, a few short test runs beside it "
        f"(load {min(loads):.1f}–{max(loads):.1f} at its start and end), {m['seconds'] / 60:.1f} min, "
        f"{m['created_at'][:10]};"
    ) in ladder_text()
    # the text-free router at that rung: the same command without the prompt-aware router, reusing that run
    tf = manifest(TEXT_FREE[6400])
    assert tf["command"].startswith(m["command"].replace(" --set router.conditioning=text", "").split(" --out ")[0])
    assert f"--reuse {g['out']}" in tf["command"] and tf["timings_s"]["training"] < 1 and tf["timings_s"]["router"] > 0
    assert tf["config"]["router"]["conditioning"] != "text"
    assert (
        "the text-free router at that rung: the same command without `--set router.conditioning=text`, with "
        f"`--reuse` of that run (only the router trains), {tf['seconds'] / 60:.1f} min, {tf['created_at'][:10]},"
    ) in ladder_text()


def test_at_high_noise_the_3200_subspace_gap_is_resolved_at_07_only_and_ties_at_09_and_1():
    g = rungs("gmm_ladder_subspace")[-1]
    all_times = load("gmm_ladder_subspace.json")["times"]
    # "nearly closes": the t from which the gap stays under 0.01 per dimension (it is 0.021 at t = 0.5)
    start = min(
        t
        for t in all_times
        if all(abs(by_t("gmm_ladder_subspace", g["label"], u)["mean"]) < 0.01 for u in all_times if u >= t)
    )
    times = [t for t in all_times if t >= start]
    gaps = {t: by_t("gmm_ladder_subspace", g["label"], t) for t in times}
    ties = [t for t, x in gaps.items() if not resolved(x)]
    (res,) = [t for t, x in gaps.items() if resolved(x)]
    assert gaps[res]["mean"] > 0
    assert (
        f"(t ≥ {start:g}, the means) both reach nearly the same level by {num(g['budget']['expert_steps'], 0, False)} "
        "steps and the gap nearly closes there "
        f"({iv(gaps[res], 3)} at {res:g}, resolved; ties at {' and '.join(f'{t:g}' for t in ties)})"
    ) in ladder_text()


def test_the_6400_step_rungs_bullet_is_its_two_runs_and_ladder_records():
    """The sub-bullet "the 6,400-step rungs": the equal-images run reuses the equal-steps run (only its monolith
    trains), its command, minutes and date, and every number, equal steps in brackets."""
    text = doc_claims.passage("  - **the 6,400-step rungs**", "  - with the text-free router (equal steps): top-2")
    es, ei = manifest(PROMPT_AWARE[6400]), manifest(EQUAL_IMAGES[6400])
    assert ei["budget"]["monolith_steps"] == 51200 and ei["budget"]["monolith_batch"] == 32
    assert ei["timings_s"]["router"] == 0.0 and ei["timings_s"]["training"] > 0.9 * ei["seconds"]  # the monolith
    # "copies in the equal-steps run's experts, routers and their rows, so only the monolith trains"
    mine, theirs = ei["artefacts"], es["artefacts"]
    assert all(
        x["reused"] and x["tensor_sha256"] == theirs["experts"][k]["tensor_sha256"] for k, x in mine["experts"].items()
    )
    assert mine["router"]["reused_from"] and mine["router"]["tensor_sha256"] == theirs["router"]["tensor_sha256"]
    assert not mine["monolith"]["reused"]
    assert all(r.get("reused_from") for name, r in ei["results"].items() if not name.startswith("monolith"))
    assert "which copies in the equal-steps run's experts, routers and their rows, so only the monolith" in text
    assert f"equal steps {es['created_at'][:10]}, equal images {ei['created_at'][:10]}): " in text
    command = ei["command"].replace(ei["command"].split(" --out ")[1].split()[0], "OUT")
    command = command.replace(command.split(" --reuse ")[1], "OUT_ES")
    assert f"equal images `{command}`" in text
    assert f"as in the ladder above ({es['seconds'] / 60:.1f} min); " in text
    assert f"so only the monolith (51,200 × 32) trains ({ei['seconds'] / 60:.1f} min)" in text
    gain = {p: top2_minus_monolith(p, 6400) for p in ("equal images", "equal steps")}
    mmd = {
        p: ladder(*L[6400], "top2 − monolith", "mmd2")
        for p, L in (("equal images", EQUAL_IMAGES_LADDER), ("equal steps", EQUAL_STEPS_LADDER))
    }
    gap = {p: excess(*L[6400]) for p, L in (("equal images", EQUAL_IMAGES_LADDER), ("equal steps", EQUAL_STEPS_LADDER))}
    assert all(x["resolved"] and x["mean"] > 0 for x in (*gain.values(), *mmd.values()))
    assert all(x["lo"] > 0 for x in gap.values())
    assert (
        f"8FM top-2 − monolith **{iv(gain['equal images'], 1)}** nats (**{iv(gain['equal steps'], 1)}**); MMD² "
        f"{iv(mmd['equal images'], 2, 1e3)} ×10⁻³ ({iv(mmd['equal steps'], 2, 1e3)}), the monolith closer by that "
        f"measure under both; monolith − expert excess loss **{iv(gap['equal images'], 3)}** "
        f"(**{iv(gap['equal steps'], 3)}**)"
    ) in text
    clusters = {
        p: [x["lo"] > 0 for x in rung(L[6400][1], L[6400][0])["monolith_minus_expert_by_cluster"].values()]
        for p, L in (("equal images", EQUAL_IMAGES_LADDER), ("equal steps", EQUAL_STEPS_LADDER))
    }
    assert all(sum(c) == len(c) == 8 for c in clusters.values())
    assert "above 0 on 8 of 8 clusters under both" in text

    def monolith(run: str) -> str:
        r = manifest(run)["results"]["monolith (equal compute)"]
        b = manifest(run)["budget"]
        return f"{iv(r.get('nested', r['metrics'])['delta_log_density'], 0)} at {num(b['monolith_steps'], 0, sign=False)} × {b['monolith_batch']}"

    levels = [monolith(run) for run in (EQUAL_IMAGES[6400], EQUAL_IMAGES[3200], PROMPT_AWARE[6400], TEXT_FREE[3200])]
    assert (
        f"still improves with its steps: {levels[0]} against {levels[1]}, and {levels[2]} against {levels[3]}."
    ) in text


# The learning-rate sweep at 6,400 steps (after the pilot's table): "**The learning rate does not close the gap.**" …
# "the experts more so."
LR_START = "**The learning rate does not close the gap.**"
LR_END = "the experts more so."
LR_LABELS = {  # the sweep's rates as the doc's table writes them → the pilot's labels (2e-3: the configs' own)
    "1×10⁻³": "clu-r8-nano-lr1e-3",
    "2×10⁻³": "clu-r8-nano",
    "4×10⁻³": "clu-r8-nano-lr4e-3",
    "8×10⁻³": "clu-r8-nano-lr8e-3",
    "1.6×10⁻²": "clu-r8-nano-lr1.6e-2",
    "3.2×10⁻²": "clu-r8-nano-lr3.2e-2",
}


def lr_record(label: str, training: int) -> dict:
    (r,) = [
        r
        for r in load("gmm_capacity_pilot.json")["records"]
        if r["label"] == label and r["steps"] == 6400 and r.get("training", 0) == training
    ]
    return r["mean_over_t_and_clusters"]


def test_the_learning_rate_sweeps_table_is_training_0_and_each_sides_best_lies_inside_it():
    text = doc_claims.raw_passage(LR_START, LR_END)
    header, *rows = doc_claims.md_table(text, "| learning rate |")
    assert header[1:] == list(LR_LABELS)
    for row in rows:
        who = row[0]
        values = [lr_record(label, 0)[who] for label in LR_LABELS.values()]
        assert row[1:] == [f"{v:.3f}" for v in values], who
        best = min(range(len(values)), key=values.__getitem__)
        assert 0 < best < len(values) - 1  # inside the sweep
        assert list(LR_LABELS)[best] == {"expert": "8×10⁻³", "monolith": "1.6×10⁻²"}[who]
        assert f"{list(LR_LABELS)[best]} for the {'experts' if who == 'expert' else 'monolith'}" in " ".join(
            text.split()
        )
    # every label of the sweep: the --set it names, the rate it trained with
    for rate, label in LR_LABELS.items():
        sets = {r["set"] for r in load("gmm_capacity_pilot.json")["records"] if r["label"] == label}
        lr = float(rate.replace("×10⁻", "e-").replace("³", "3").replace("²", "2"))
        assert sets == {
            "data.gmm_covariance=cluster data.gmm_rank=8" + (f" expert.optim.lr={label[14:]}" if "lr" in label else "")
        }
        assert "lr" not in label or float(label[14:]) == lr


def test_the_learning_rate_sweeps_paired_verdicts_are_its_three_trainings():
    text = doc_claims.passage(LR_START, LR_END)
    trainings = (0, 1, 2)
    e8, m16 = LR_LABELS["8×10⁻³"], LR_LABELS["1.6×10⁻²"]
    default = LR_LABELS["2×10⁻³"]
    experts = interval([lr_record(m16, t)["expert"] - lr_record(e8, t)["expert"] for t in trainings])
    monolith = interval([lr_record(m16, t)["monolith"] - lr_record(e8, t)["monolith"] for t in trainings])
    assert doc_claims.resolved(experts) and experts["mean"] > 0 and not doc_claims.resolved(monolith)
    assert f"worse than at 8×10⁻³ ({doc_claims.iv(experts, 3)})" in text
    assert f"two rates tie ({doc_claims.iv(monolith, 3)})" in text
    gain_e = interval([lr_record(e8, t)["expert"] / lr_record(default, t)["expert"] - 1 for t in trainings])
    gain_m = interval([lr_record(m16, t)["monolith"] / lr_record(default, t)["monolith"] - 1 for t in trainings])
    assert f"by {-gain_e['mean'] * 100:.1f} ± {gain_e['half'] * 100:.1f} %" in text
    assert f"monolith's by {-gain_m['mean'] * 100:.1f} ± {gain_m['half'] * 100:.1f} %" in text
    # where each column ran: the new rates on the AVX-512 machine, 2×10⁻³ the pilot's own earlier records
    for rate, label in LR_LABELS.items():
        for t in trainings if label in (e8, m16, default) else (0,):
            (r,) = [
                r
                for r in load("gmm_capacity_pilot.json")["records"]
                if r["label"] == label and r["steps"] == 6400 and r.get("training", 0) == t
            ]
            if label == default:
                assert r["date"].startswith({0: "2026-12-02", 1: "2026-12-04", 2: "2026-12-04"}[t])
                assert t == 0 or "AVX2" in r["machine"]
            else:
                assert r["date"].startswith("2026-12-06") and "AVX-512" in r["machine"], (rate, t)
    assert "training 0 of 2026-12-02, trainings 1 and 2 on the AVX2 machine of 2026-12-04" in text
    from hddm_flower.config.io import load_config

    (config,) = {r["config"] for r in load("gmm_capacity_pilot.json")["records"] if r["label"] == default}
    assert load_config(ROOT / config).expert.optim.lr == 2e-3  # the 2×10⁻³ column is the config's own rate
    best = [lr_record(m16, t)["monolith"] - lr_record(e8, t)["expert"] for t in trainings]
    shared = [lr_record(default, t)["monolith"] - lr_record(default, t)["expert"] for t in trainings]
    change = interval([a - b for a, b in zip(best, shared)])
    assert f"**{doc_claims.iv(interval(best), 3)}**, against {doc_claims.iv(interval(shared), 3)} at 2×10⁻³" in text
    assert f"the change is {doc_claims.iv(change, 3)}, a tie" in text and not doc_claims.resolved(change)
    # the committed side-by-side file is what the records give
    from benchmarks.gmm_capacity_pilot import summarise

    committed = load("gmm_capacity_pilot-lr-sweep-6400.json")
    records = [r for r in load("gmm_capacity_pilot.json")["records"] if r["steps"] == 6400]
    assert committed["labels"] == list(LR_LABELS.values()) and committed["steps"] == [6400]
    for label in LR_LABELS.values():
        assert committed["summaries"][label] == json.loads(json.dumps(summarise(records, label)))
    assert [int(k) for k in committed["summaries"][e8]["6400"]["trainings"]] == [0, 1, 2]


def test_the_tuned_rate_carried_to_25600_steps_is_training_0s_records():
    from benchmarks.gmm_capacity_pilot import summarise

    text = doc_claims.passage(LR_START, LR_END)
    records = load("gmm_capacity_pilot.json")["records"]
    s = summarise(records, LR_LABELS["8×10⁻³"])
    assert load("gmm_capacity_pilot-clu-r8-nano-lr8e-3.json")["summary"] == json.loads(json.dumps(s))
    assert s[12800]["trainings"] == [0] and s[25600]["trainings"] == [0]
    falls = [-s[k]["mean_over_t"]["monolith_change_per_doubling"]["mean"] * 100 for k in (12800, 25600)]
    assert all(f > 0 for f in falls)
    assert f"falls {falls[0]:.0f} and {falls[1]:.0f} % per doubling" in text
    gaps = [num(s[k]["mean_over_t"]["gap"]["mean"], 3) for k in (12800, 25600)]
    assert f"the gap holds ({gaps[0]}, {gaps[1]})" in text
    pilot = summarise(records, "clu-r8-nano")
    same, next_ = (pilot[k]["mean_over_t"]["monolith"] for k in (25600, 51200))
    tuned = s[25600]["mean_over_t"]["monolith"]["mean"]
    assert abs(tuned - next_["mean"]) < abs(tuned - same["mean"]) / 3  # "about one doubling": near the next budget's
    assert (
        f"({tuned:.3f} at 25,600 steps, where the shared rate gives {same['mean']:.3f} ± {same['half']:.3f} at 25,600 "
        f"and {next_['mean']:.3f} ± {next_['half']:.3f} at 51,200)" in text
    )


LEVEL_START = "**Where the monolith waits: the mean-only level.**"
LEVEL_END = "a stall at the mean-only level cannot show it."
LEVEL_ROWS = {  # the table's mixtures → the levels' entry and the pilot's nano label
    "shared structure, rank 4": ("pattern-r4", "base-nano-cos-lr2.0e-3"),
    "a subspace per cluster, rank 8": ("clu-r8", "clu-r8-nano"),
    "rank 16": ("clu-r16", "clu-r16-nano"),
    "rank 32": ("clu-r32", "clu-r32-nano"),
    "rank 64": ("clu-r64", "clu-r64-nano"),
}
WIDTHS = ("femto", "pico", "nano", "mini")


def cell(values: list[float], digits: int = 3, sign: bool = False) -> str:
    """One training's value, or the interval over several, as the doc writes it."""
    x = interval(values)
    if x["n"] == 1:
        return num(x["mean"], digits, sign=sign)
    return doc_claims.iv(x, digits) if sign else level(x, digits)


def test_the_mean_only_levels_are_what_the_yardstick_computes_for_the_pilots_mixture(tmp_path):
    from benchmarks.gmm_levels import levels_of
    from hddm_flower.config.io import load_config, parse_overrides
    from hddm_flower.gmm.dataset import load_reference
    from hddm_flower.stages.prepare import prepare_data

    entries = load("gmm_levels.json")["entries"]
    e = entries["clu-r8"]
    cfg = load_config(ROOT / e["config"], parse_overrides(e["set"]))
    ref = load_reference(prepare_data(cfg, tmp_path))
    out = levels_of(ref, [int(k) for k in e["per_cluster"]], e["samples"], cfg.evaluation.seed)

    # the same numbers up to the arithmetic's last bits (BLAS differs by thread count; t = 0 is 0 to 1e-20)
    def leaves(x, path=()):  # (path, number) of a nested dict/list
        if isinstance(x, dict):
            return [leaf for k in sorted(x) for leaf in leaves(x[k], (*path, k))]
        if isinstance(x, list):
            return [leaf for i, v in enumerate(x) for leaf in leaves(v, (*path, i))]
        return [(path, x)]

    mine, committed = leaves(json.loads(json.dumps(out))), leaves({k: e[k] for k in out})
    assert [p for p, _ in mine] == [p for p, _ in committed]
    assert [v for _, v in mine] == pytest.approx([v for _, v in committed], rel=1e-9, abs=1e-15)
    # every entry is the mixture of its pilot label (the same data section), on its clusters and its number of draws
    for name, label in LEVEL_ROWS.values():
        records = [r for r in load("gmm_capacity_pilot.json")["records"] if r["label"] == label]
        assert records and {tuple(r["per_cluster"]) for r in records} == {tuple(entries[name]["per_cluster"])}
        assert {r.get("samples", 256) for r in records} == {entries[name]["samples"]}
        ((config, sets),) = {(r["config"], r["set"]) for r in records}
        mine = load_config(ROOT / entries[name]["config"], parse_overrides(entries[name]["set"])).data
        assert mine == load_config(ROOT / config, parse_overrides(sets)).data, name


def inner(record: dict, who: str) -> float:
    """``who``'s excess loss over the inner t (0 < t < 1) and the record's clusters."""
    from benchmarks.gmm_ladder import TIMES

    idx = [i for i, t in enumerate(TIMES) if 0 < t < 1]
    per = record["per_cluster"].values()
    return sum(sum(v[who][i] for i in idx) / len(idx) for v in per) / len(per)


def pilot_records(label: str, steps: int) -> list[dict]:
    """The records of ``label`` at ``steps``, by training."""
    runs = {
        r.get("training", 0): r
        for r in load("gmm_capacity_pilot.json")["records"]
        if r["label"] == label and r["steps"] == steps
    }
    return [runs[k] for k in sorted(runs)]


def inner_level(name: str, which: str = "isotropic_on_the_draws") -> float:
    return load("gmm_levels.json")["entries"][name]["mean_over_inner_t_and_clusters"][which]


def below(name: str, label: str, steps: int, who: str) -> dict:
    """1 − network / isotropic level, in %, over the inner t: an interval over the trainings present."""
    return interval([100 * (1 - inner(r, who) / inner_level(name)) for r in pilot_records(label, steps)])


def pct(x: dict) -> str:
    return level(x, 0) if x["n"] > 1 else num(x["mean"], 0, sign=False)


def test_the_mean_only_table_is_the_levels_and_the_pilots_3200_step_records():
    text = doc_claims.raw_passage(LEVEL_START, LEVEL_END)
    header, *rows = doc_claims.md_table(text, "| mixture | isotropic level |")
    assert [r[0] for r in rows] == list(LEVEL_ROWS)
    for row in rows:
        name, label = LEVEL_ROWS[row[0]]
        records = pilot_records(label, 3200)
        assert row[1:3] == [f"{inner_level(name, w):.3f}" for w in ("isotropic", "pooled")]
        assert row[3:] == [cell([inner(r, who) for r in records]) for who in ("monolith", "expert")], row[0]
    assert len(pilot_records("clu-r8-nano", 3200)) == 3
    # where and when they ran, as the passage says
    records = load("gmm_capacity_pilot.json")["records"]
    for label in ("clu-r32-nano", "clu-r64-nano", "clu-r8-femto", "clu-r8-pico", "clu-r8-mini"):
        mine = [r for r in records if r["label"] == label]
        assert mine and all(r["date"].startswith("2026-12-06") and "AVX-512" in r["machine"] for r in mine), label
    for label in ("clu-r16-nano", "base-nano-cos-lr2.0e-3"):
        assert {r["date"][:10] for r in records if r["label"] == label} == {"2026-12-02"}, label
    folded = doc_claims.passage(LEVEL_START, LEVEL_END)
    assert "machine on 2026-12-06 (rank 16 on 2026-12-02; the shared-structure row is the label" in folded


def test_the_monolith_is_near_the_isotropic_level_then_leaves_it_later_the_more_directions_a_cluster_has():
    text = doc_claims.passage(LEVEL_START, LEVEL_END)
    rows = list(LEVEL_ROWS.values())
    m3 = {name: below(name, label, 3200, "monolith") for name, label in rows[1:]}
    e3 = {name: below(name, label, 3200, "expert") for name, label in rows[1:]}
    assert m3["clu-r8"]["n"] == 3 and doc_claims.resolved(m3["clu-r8"]) and m3["clu-r8"]["mean"] < 5
    assert all(abs(m3[n]["mean"]) < 2 for n in ("clu-r16", "clu-r32", "clu-r64"))
    assert (
        f"{pct(m3['clu-r8'])} % below it at rank 8 (three trainings) and within 2 % of it at ranks 16, 32 and 64"
        in text
    )
    assert (
        f"the experts are {pct(e3['clu-r8'])} %, {pct(e3['clu-r16'])}, {pct(e3['clu-r32'])} and {pct(e3['clu-r64'])} % below"
        in text
    )
    # the shared-structure mixture: the pooled level and the monolith below it
    (shared,) = pilot_records("base-nano-cos-lr2.0e-3", 3200)
    assert inner(shared, "monolith") < inner_level("pattern-r4", "pooled")
    assert (
        f"within {inner_level('pattern-r4', 'pooled'):.3f} of Bayes (against {inner_level('pattern-r4', 'isotropic'):.3f} "
        "for the isotropic level) and the monolith is below even that" in text
    )
    # rank 8 over four trainings
    r8 = {s: {w: below("clu-r8", "clu-r8-nano", s, w) for w in ("monolith", "expert")} for s in (6400, 51200)}
    assert all(x["n"] == 4 for v in r8.values() for x in v.values())
    assert (
        f"the monolith is {pct(r8[6400]['monolith'])} % below it at 6,400 steps and {pct(r8[51200]['monolith'])} % "
        f"at 51,200, the experts {pct(r8[6400]['expert'])} % and {pct(r8[51200]['expert'])} %" in text
    )
    m51 = interval([inner(r, "monolith") for r in pilot_records("clu-r8-nano", 51200)])
    assert m51["mean"] - m51["half"] > inner_level("clu-r8", "pooled")
    assert f"({level(m51)} against {inner_level('clu-r8', 'pooled'):.3f})" in text
    # rank 32 over its trainings at 6,400 and 12,800 steps
    r32 = {s: pilot_records("clu-r32-nano", s) for s in (6400, 12800)}
    (trainings,) = {tuple(r.get("training", 0) for r in v) for v in r32.values()}
    assert len(trainings) == 3 and "At rank 32, over three trainings" in text
    b32 = {s: {w: below("clu-r32", "clu-r32-nano", s, w) for w in ("monolith", "expert")} for s in (6400, 12800)}
    assert (
        f"the monolith is {pct(b32[6400]['monolith'])} % below it at 6,400 steps and {pct(b32[12800]['monolith'])} % "
        f"at 12,800, the experts {pct(b32[6400]['expert'])} % and {pct(b32[12800]['expert'])} %" in text
    )
    gaps = [interval([inner(r, "monolith") - inner(r, "expert") for r in r32[s]]) for s in (6400, 12800)]
    growth = interval(
        [
            (inner(b, "monolith") - inner(b, "expert")) - (inner(a, "monolith") - inner(a, "expert"))
            for a, b in zip(r32[6400], r32[12800], strict=True)
        ]
    )
    assert doc_claims.resolved(growth) and growth["mean"] > 0
    assert f"the gap grows from {doc_claims.iv(gaps[0], 3)} to {doc_claims.iv(gaps[1], 3)}" in text
    r64 = {w: below("clu-r64", "clu-r64-nano", 6400, w) for w in ("monolith", "expert")}
    assert r64["monolith"]["n"] == r64["expert"]["n"] == 3
    assert (
        f"At rank 64, over three trainings at 6,400 steps, the monolith is {pct(r64['monolith'])} % and the experts "
        f"{pct(r64['expert'])} % below it" in text
    )
    # "both sides leave it less the more directions each cluster has", at 6,400 steps: rank 8 > 32 > 64 on each
    # side, each step resolved over trainings 0-2 (paired by training: the same seeds)
    for who in ("monolith", "expert"):
        shares = [
            [100 * (1 - inner(r, who) / inner_level(name)) for r in pilot_records(label, 6400)[:3]]
            for name, label in (("clu-r8", "clu-r8-nano"), ("clu-r32", "clu-r32-nano"), ("clu-r64", "clu-r64-nano"))
        ]
        for more, fewer in zip(shares, shares[1:]):
            step = interval([a - b for a, b in zip(more, fewer, strict=True)])
            assert doc_claims.resolved(step) and step["mean"] > 0, who
    assert (
        f"(the monolith {pct(r8[6400]['monolith'])} %, {pct(b32[6400]['monolith'])} % and {pct(r64['monolith'])} % "
        f"below it at ranks 8, 32 and 64, the experts {pct(r8[6400]['expert'])} %, {pct(b32[6400]['expert'])} % and "
        f"{pct(r64['expert'])} %; each step from one rank to the next resolved over three trainings)" in text
    )


def test_the_width_table_is_the_pilots_6400_step_records_of_each_preset():
    text = doc_claims.raw_passage(LEVEL_START, LEVEL_END)
    header, *rows = doc_claims.md_table(text, "| preset (parameters) |")
    records = load("gmm_capacity_pilot.json")["records"]
    params = {p: {r["train_seconds"]["parameters"] for r in records if r["label"] == f"clu-r8-{p}"} for p in WIDTHS}
    assert all(len(v) == 1 for v in params.values())
    params = {p: v.pop() for p, v in params.items()}
    for preset, head in zip(WIDTHS, header[1:], strict=True):
        label = f"clu-r8-{preset}"
        assert head == f"{preset} ({params[preset] / 1000:.0f}k)"
        ours = [r for r in records if r["label"] == label]
        if preset != "nano":
            assert {r["set"] for r in ours} == {f"data.gmm_covariance=cluster data.gmm_rank=8 expert.preset={preset}"}
        assert {r["preset"] for r in ours} == {preset}
        runs = pilot_records(label, 6400)
        values = {
            "expert": cell([r["mean_over_t_and_clusters"]["expert"] for r in runs]),
            "monolith": cell([r["mean_over_t_and_clusters"]["monolith"] for r in runs]),
            "monolith − expert": cell(
                [r["mean_over_t_and_clusters"]["monolith"] - r["mean_over_t_and_clusters"]["expert"] for r in runs],
                sign=True,
            ),
        }
        for row in rows:
            assert row[1 + WIDTHS.index(preset)] == values[row[0]], (preset, row[0])
    folded = doc_claims.passage(LEVEL_START, LEVEL_END)
    iso = inner_level("clu-r8")
    narrow = {p: pilot_records(f"clu-r8-{p}", 6400)[0] for p in ("femto", "pico")}
    assert all(inner(r, w) > iso for r in narrow.values() for w in ("expert", "monolith"))
    assert (
        f"(over the inner t, {inner_level('clu-r8', 'isotropic'):.3f}: femto {inner(narrow['femto'], 'expert'):.3f} and "
        f"{inner(narrow['femto'], 'monolith'):.3f}, pico {inner(narrow['pico'], 'expert'):.3f} and "
        f"{inner(narrow['pico'], 'monolith'):.3f}, expert and monolith)" in folded
    )
    gaps = [pilot_records("clu-r8-pico", s)[0]["mean_over_t_and_clusters"] for s in (1600, 6400, 12800, 25600)]
    written = [num(g["monolith"] - g["expert"], 3) for g in gaps]
    assert (
        f"(+{written[0][1:]}, {written[1]}, {written[2]} and {written[3]} at 1,600, 6,400, 12,800 and 25,600" in folded
    )
    assert max(g["monolith"] - g["expert"] for g in gaps[1:]) < gaps[0]["monolith"] - gaps[0]["expert"]
    mini = pilot_records("clu-r8-mini", 6400)[0]["mean_over_t_and_clusters"]
    nano = interval([r["mean_over_t_and_clusters"]["expert"] for r in pilot_records("clu-r8-nano", 6400)])
    assert mini["monolith"] > nano["mean"] + nano["half"]
    assert f"with {params['mini'] / params['nano']:.1f}× nano's parameters" in folded
    assert f"({mini['monolith']:.3f} against {level(nano)})" in folded


def test_the_rank_and_width_comparisons_committed_are_the_records_summaries():
    from benchmarks.gmm_capacity_pilot import summarise

    records = load("gmm_capacity_pilot.json")["records"]
    for name, labels, steps in (
        ("rank", ["clu-r8-nano", "clu-r16-nano", "clu-r32-nano", "clu-r64-nano"], [3200, 6400, 12800]),
        ("width-6400", [f"clu-r8-{p}" for p in WIDTHS], [6400]),
    ):
        committed = load(f"gmm_capacity_pilot-{name}.json")
        assert committed["labels"] == labels and committed["steps"] == steps
        kept = [r for r in records if r["steps"] in steps]
        for label in labels:
            assert committed["summaries"][label] == json.loads(json.dumps(summarise(kept, label))), (name, label)
    assert "--name rank" in (RESULTS / "gmm_capacity_pilot-rank.md").read_text()


PROBE_START = "**Not the target's noise: the exact-velocity probe.**"
PROBE_END = "so at these budgets the probe cannot tell learning speed from room."
PROBE = "exact-clu-r8-nano"  # the probe's label; its networks are clu-r8-nano's, trained on the exact velocity
PROBE_STEPS = (6400, 12800)


def probe_pairs(steps: int) -> tuple[list[dict], list[dict]]:
    """The probe's records at ``steps`` and the data pilot's records of the same trainings, in training order."""
    probe = pilot_records(PROBE, steps)
    data = {r.get("training", 0): r for r in pilot_records("clu-r8-nano", steps)}
    return probe, [data[r["training"]] for r in probe]


def over_t(r: dict, who: str) -> float:
    return r["mean_over_t_and_clusters"][who]


def test_the_probe_trains_the_data_pilots_networks_on_the_exact_velocity_three_times_at_each_budget():
    records = load("gmm_capacity_pilot.json")["records"]
    probe = [r for r in records if r["label"] == PROBE]
    data = [r for r in records if r["label"] == "clu-r8-nano"]
    assert {r["target"] for r in probe} == {"exact"} and {r.get("target", "data") for r in data} == {"data"}

    def shape(r):
        return r["config"], r["set"], r["preset"], r.get("samples", 256), tuple(sorted(r["per_cluster"]))

    assert {shape(r) for r in probe} == {shape(r) for r in data}  # the same mixture, networks, clusters and draws
    assert sorted((r["steps"], r["training"]) for r in probe) == [(s, i) for s in PROBE_STEPS for i in range(3)]
    assert all(r["date"].startswith("2026-12-06") and "AVX-512" in r["machine"] for r in probe)
    for steps in PROBE_STEPS:  # the budget of each side, as hddm reproduce gives it
        p, d = probe_pairs(steps)
        assert all(a["budget"] == b["budget"] for a, b in zip(p, d, strict=True))
    assert "--target exact" in probe[0]["command"] and f"--label {PROBE}" in probe[0]["command"]


def test_the_probes_table_is_its_records_paired_by_training_with_the_datas():
    text = doc_claims.raw_passage(PROBE_START, PROBE_END)
    header, *rows = doc_claims.md_table(text, "| steps | trainings |")
    assert [r[0] for r in rows] == [f"{s:,}" for s in PROBE_STEPS]
    for row, steps in zip(rows, PROBE_STEPS, strict=True):
        p, d = probe_pairs(steps)
        cells = [f"{steps:,}", str(len(p))]
        for who in ("expert", "monolith"):
            exact, data = [over_t(r, who) for r in p], [over_t(r, who) for r in d]
            diff = interval([a - b for a, b in zip(exact, data, strict=True)])
            cells += [level(interval(exact)), level(interval(data)), sign_word(diff, doc_claims.iv(diff, 3))]
        for rs in (p, d):
            cells.append(doc_claims.iv(interval([over_t(r, "monolith") - over_t(r, "expert") for r in rs]), 3))
        assert row == cells, steps


def sign_word(x: dict, written: str) -> str:
    return f"**{written}**" if doc_claims.resolved(x) else written


def test_without_the_noise_the_experts_come_closer_the_monolith_does_not_and_it_still_falls():
    from benchmarks.gmm_ladder import TIMES

    text = doc_claims.passage(PROBE_START, PROBE_END)
    closer, growth = {}, {}
    for steps in PROBE_STEPS:
        p, d = probe_pairs(steps)
        for who in ("expert", "monolith"):
            closer[steps, who] = interval([100 * (1 - over_t(a, who) / over_t(b, who)) for a, b in zip(p, d)])
        growth[steps] = interval(
            [
                (over_t(a, "monolith") - over_t(a, "expert")) - (over_t(b, "monolith") - over_t(b, "expert"))
                for a, b in zip(p, d)
            ]
        )
        e, m = closer[steps, "expert"], closer[steps, "monolith"]
        assert doc_claims.resolved(e) and not doc_claims.resolved(m)  # "(ties)"
        assert all(over_t(a, "monolith") < over_t(b, "monolith") for a, b in zip(p, d))  # "lower in each of the six"
    assert doc_claims.resolved(growth[6400]) and not doc_claims.resolved(growth[12800])
    top = [closer[s, "monolith"]["mean"] + closer[s, "monolith"]["half"] for s in PROBE_STEPS]
    assert (
        f"the experts come {pct(closer[6400, 'expert'])} and {pct(closer[12800, 'expert'])} % closer to the exact "
        f"velocity at 6,400 and 12,800 steps; the monolith comes {pct(closer[6400, 'monolith'])} and "
        f"{pct(closer[12800, 'monolith'])} % closer (ties, though lower in each of the six pairs: at most {top[0]:.0f} "
        f"and {top[1]:.0f} %, the intervals' upper ends, less than one doubling of its training at the rate below), "
        f"and the gap grows by {doc_claims.iv(growth[6400], 3)} at 6,400 steps and by "
        f"{doc_claims.iv(growth[12800], 3)} (a tie) at 12,800" in text
    )
    # at t = 0.1, where the probe's gap is largest (12,800 steps), paired by training
    p, d = probe_pairs(12800)

    def at(r, who, k):
        return sum(v[who][k] for v in r["per_cluster"].values()) / len(r["per_cluster"])

    gap = [interval([at(r, "monolith", k) - at(r, "expert", k) for r in p])["mean"] for k in range(len(TIMES))]
    assert TIMES[1] == 0.1 and max(range(len(TIMES)), key=gap.__getitem__) == 1
    paired = {w: interval([at(a, w, 1) - at(b, w, 1) for a, b in zip(p, d)]) for w in ("monolith", "expert")}
    assert not doc_claims.resolved(paired["monolith"]) and doc_claims.resolved(paired["expert"])
    assert (
        f"exact − data paired by training is {doc_claims.iv(paired['monolith'], 3)} for the monolith (a tie) and "
        f"{doc_claims.iv(paired['expert'], 3)} for the experts at 12,800 steps" in text
    )
    # "a quarter to a third of their excess"
    assert 20 < closer[6400, "expert"]["mean"] < 34 and 20 < closer[12800, "expert"]["mean"] < 34

    def change(label, who):  # per doubling from 6,400 to 12,800 steps, paired by training (trainings 0-2)
        a, b = ({r.get("training", 0): r for r in pilot_records(label, s)} for s in PROBE_STEPS)
        return pct(interval([100 * (over_t(b[k], who) / over_t(a[k], who) - 1) for k in (0, 1, 2)]))

    assert (
        f"still changes by {change(PROBE, 'monolith')} % per doubling from 6,400 to 12,800 steps (the experts' by "
        f"{change(PROBE, 'expert')} %; on the data {change('clu-r8-nano', 'monolith')} and "
        f"{change('clu-r8-nano', 'expert')} %, the same three trainings)" in text
    )


def test_the_probes_setting_and_the_data_training_left_out_are_what_the_passage_says():
    from hddm_flower.config.io import load_config, parse_overrides

    text = doc_claims.passage(PROBE_START, PROBE_END)
    ((config, sets),) = {(r["config"], r["set"]) for s in PROBE_STEPS for r in pilot_records(PROBE, s)}
    data = load_config(ROOT / config, parse_overrides(sets)).data
    assert data.gmm_samples == 8000 and round(data.gmm_samples * (1 - data.val_fraction)) == 7600
    assert "about 7,600 images (the 8,000 draws less the 5 % held out)" in text
    assert "on the AVX-512 machine on 2026-12-06" in text and "trainings 0, 1 and 2 at 6,400 and 12,800 steps" in text
    for r in (r for s in PROBE_STEPS for r in pilot_records(PROBE, s)):
        assert "--target exact" in r["command"] and "--threads 1" in r["command"]
    # the data's partners: training 0 at 6,400 steps of 2026-12-02, the others on the AVX2 machine of 2026-12-04
    for steps in PROBE_STEPS:
        _, d = probe_pairs(steps)
        for r in d:
            if (steps, r.get("training", 0)) == (6400, 0):
                assert r["date"].startswith("2026-12-02")
            else:
                assert r["date"].startswith("2026-12-04") and "AVX2" in r["machine"]
    # training 3, left out: its values and their distance from the others' range
    third = {s: {r.get("training", 0): r for r in pilot_records("clu-r8-nano", s)}[3] for s in PROBE_STEPS}
    assert all("AVX-512" in r["machine"] for r in third.values())
    worst = 0.0
    for steps, r in third.items():
        _, d = probe_pairs(steps)
        for who in ("expert", "monolith"):
            lo, hi = min(over_t(x, who) for x in d), max(over_t(x, who) for x in d)
            worst = max(worst, lo - over_t(r, who), over_t(r, who) - hi)
    assert worst < 0.003
    e, m = ([over_t(third[s], w) for s in PROBE_STEPS] for w in ("expert", "monolith"))
    assert f"expert {e[0]:.3f} and {e[1]:.3f}, monolith {m[0]:.3f} and {m[1]:.3f})" in text


def test_the_probes_summaries_committed_are_its_records():
    from benchmarks.gmm_capacity_pilot import summarise

    records = load("gmm_capacity_pilot.json")["records"]
    mine = load(f"gmm_capacity_pilot-{PROBE}.json")
    assert mine["label"] == PROBE and mine["summary"] == json.loads(json.dumps(summarise(records, PROBE)))
    both = load("gmm_capacity_pilot-exact-target.json")
    assert both["labels"] == ["clu-r8-nano", PROBE] and both["targets"] == {"clu-r8-nano": "data", PROBE: "exact"}
    kept = [r for r in records if r["steps"] in PROBE_STEPS]
    for label in both["labels"]:
        assert both["summaries"][label] == json.loads(json.dumps(summarise(kept, label)))


def test_pico_at_a_higher_rate_halves_its_gap_at_6400_steps_and_is_lower_on_both_sides_at_51200():
    folded = doc_claims.passage(LEVEL_START, LEVEL_END)
    (other,) = pilot_records("clu-r8-pico-lr3.2e-2", 6400)
    (a,), (b,) = (pilot_records("clu-r8-pico-lr8e-3", s) for s in (6400, 51200))
    for r, lr in ((a, "8e-3"), (b, "8e-3"), (other, "3.2e-2")):
        assert r["set"] == f"data.gmm_covariance=cluster data.gmm_rank=8 expert.preset=pico expert.optim.lr={lr}"
        assert r["training"] == 0 and r.get("target", "data") == "data"
    m = {r["steps"]: r["mean_over_t_and_clusters"] for r in (a, b)}
    o = other["mean_over_t_and_clusters"]
    change = {w: 100 * ((m[51200][w] / m[6400][w]) ** (1 / 3) - 1) for w in ("expert", "monolith")}
    assert all(c < -5 for c in change.values())  # still falling, on both sides
    (lr2e3,) = pilot_records("clu-r8-pico", 6400)  # the width table's pico column
    before = lr2e3["mean_over_t_and_clusters"]["monolith"] - lr2e3["mean_over_t_and_clusters"]["expert"]
    after = m[6400]["monolith"] - m[6400]["expert"]
    assert 0.4 < after / before < 0.6  # "half the gap above"
    assert (
        f"(label `clu-r8-pico-lr8e-3`, training 0 alone; 3.2×10⁻² gives {o['expert']:.3f} and {o['monolith']:.3f} at "
        f"6,400 steps) it is {m[6400]['expert']:.3f} and {m[6400]['monolith']:.3f} at 6,400 steps (expert and "
        f"monolith; {num(after, 3)}, half the gap above) and {m[51200]['expert']:.3f} and "
        f"{m[51200]['monolith']:.3f} at 51,200 ({num(m[51200]['monolith'] - m[51200]['expert'], 3)}), "
        f"{-change['expert']:.0f} and {-change['monolith']:.0f} % lower per doubling on average over the three "
        "doublings" in folded
    )
    assert {r["steps"] for r in load("gmm_capacity_pilot.json")["records"] if r["label"] == a["label"]} == {6400, 51200}
