"""Claims in docs/results.md checked against the committed results: the budget ladder's summary of the mixture whose
clusters share no structure ("**In short**, on the mixture whose clusters share no structure" … "Details below."),
every number of that paragraph and its table recomputed from ``benchmarks/results/`` and written as the doc writes it
(one decimal for Δ log p, two for MMD² ×10⁻³, three for the excess loss, the unicode minus), so a rerun that moves a
number, or an edit that moves the text away from the files, fails here."""

import json
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
RESULTS = ROOT / "benchmarks" / "results"
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
PROMPT_AWARE = {800: "800-text", 3200: "3200-text"}  # equal steps, router.conditioning: text
EQUAL_IMAGES = {800: "ei-800-text", 3200: "ei-3200-text"}  # equal images, router.conditioning: text
TEXT_FREE = {800: "800", 3200: "3200"}  # equal steps, the text-free router


@cache
def raw_paragraph() -> str:
    text = (ROOT / "docs" / "results.md").read_text()
    start = text.index(START)
    return text[start : text.index(END, start) + len(END)]


@cache
def paragraph() -> str:
    """The paragraph with its line breaks folded, so a number wrapped over two lines reads as one."""
    return re.sub(r"\s+", " ", raw_paragraph())


@cache
def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


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


def num(x: float, digits: int, sign: bool = True) -> str:
    """``x`` as the doc writes it: thousands with a comma, the sign always (unless ``sign`` is off), unicode minus."""
    return format(x, f"{'+' if sign else ''},.{digits}f").replace("-", "−")


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
    from the run's manifest (no ladder record reads the equal-steps prompt-aware runs)."""
    if protocol == "equal images":
        return ladder("gmm_ladder_subspace_equal_images", f"ei-{steps}", "top2 − monolith")
    return paired(PROMPT_AWARE[steps], TOP2_MONOLITH)


def test_the_paragraph_and_its_table_are_in_the_doc():
    assert paragraph().startswith(START) and paragraph().endswith(END)
    assert set(table_rows()) == {"equal images", "equal steps"}


@pytest.mark.parametrize("protocol", ["equal images", "equal steps"])
def test_each_table_row_is_its_runs_top2_minus_monolith_with_the_sign_word_and_excess_loss(protocol):
    cells = table_rows()[protocol]
    for column, steps in ((1, 800), (2, 3200)):
        x = top2_minus_monolith(protocol, steps)
        word = "top-2 better" if x["mean"] > 0 else "the monolith better"
        assert cells[column] == f"**{iv(x, 1)}** ({word})"
        assert x["resolved"], "a bold cell is a resolved difference"
    ladder_name = "gmm_ladder_subspace_equal_images" if protocol == "equal images" else "gmm_ladder_subspace"
    prefix = "ei-" if protocol == "equal images" else ""
    assert cells[3] == f"{iv(excess(ladder_name, prefix + '800'), 3)} → {iv(excess(ladder_name, prefix + '3200'), 3)}"


def test_the_sign_words_in_the_table_agree_with_the_signs_the_table_prints():
    words = {"+": "top-2 better", "−": "the monolith better"}
    cells = re.findall(
        r"\*\*([+−])[\d,.]+ ± [\d,.]+\*\* \(([^)]*)\)", "\n".join(map(" | ".join, table_rows().values()))
    )
    assert len(cells) == 4
    for sign, word in cells:
        assert word == words[sign]


def test_the_table_rows_are_the_budgets_and_routers_they_name():
    for steps in (800, 3200):
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
    for name, labels in (("gmm_ladder_subspace", ("800", "3200")), ("gmm_ladder_subspace_equal_images", ("ei-800",))):
        for label in labels:
            x = ladder(name, label, "top2 − monolith")
            assert (x["n"], x["covers"]) == (3, "trainings")


def test_the_equal_images_ladder_copies_its_runs_paired_differences():
    for steps, run in EQUAL_IMAGES.items():
        for comparison in ("top2 − monolith", "top2 − top1", "top2 − full"):
            for metric in ("delta_log_density", "mmd2"):
                assert ladder("gmm_ladder_subspace_equal_images", f"ei-{steps}", comparison, metric) == paired(
                    run, f"8FM: {comparison}", metric
                )


def test_the_prose_verdicts_follow_the_signs_of_the_table():
    ei = [top2_minus_monolith("equal images", s)["mean"] for s in (800, 3200)]
    es = [top2_minus_monolith("equal steps", s)["mean"] for s in (800, 3200)]
    ei_excess = [excess("gmm_ladder_subspace_equal_images", label)["mean"] for label in ("ei-800", "ei-3200")]
    assert ei[0] < 0 < ei[1], "under equal images top-k overtakes the monolith between 800 and 3,200"
    assert ei_excess[0] < 0 < ei_excess[1], "the experts' excess loss crosses the monolith's in the same interval"
    assert min(es) > 0, "under equal steps top-k is ahead at both rungs tried"


def test_the_text_free_router_gains_are_the_ladders_top2_minus_monolith():
    gains = [ladder("gmm_ladder_subspace", label, "top2 − monolith") for label in ("800", "3200")]
    for g, run in zip(gains, TEXT_FREE.values()):
        assert g == paired(run, TOP2_MONOLITH)
        assert g["mean"] > 0
    assert f"with the text-free router too, {iv(gains[0], 1)} and {iv(gains[1], 1)})" in paragraph()


def test_mmd_top2_minus_monolith_is_each_runs_and_its_sign_says_who_is_closer():
    es_3200, es_800 = (paired(PROMPT_AWARE[s], TOP2_MONOLITH, "mmd2") for s in (3200, 800))
    ei_3200, ei_800 = (
        ladder("gmm_ladder_subspace_equal_images", f"ei-{s}", "top2 − monolith", "mmd2") for s in (3200, 800)
    )
    assert min(es_3200["mean"], ei_3200["mean"], ei_800["mean"]) > 0 > es_800["mean"]  # MMD²: lower is closer
    assert (
        f"the monolith is closer at 3,200 under both protocols ({iv(es_3200, 2, 1e3)} equal steps, "
        f"{iv(ei_3200, 2, 1e3)} equal images) and at 800 under equal images ({iv(ei_800, 2, 1e3)}); "
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


def test_both_protocols_share_the_routing_modes_identical_at_800_and_within_0_006_nats_at_3200():
    def largest_difference(steps: int) -> float:  # over the modes' rows, every training × sampling seed
        a, b = manifest(PROMPT_AWARE[steps])["results"], manifest(EQUAL_IMAGES[steps])["results"]
        return max(
            abs(u["delta_log_density"] - v["delta_log_density"])
            for row in ("8FM · top1", "8FM · top2", "8FM · full")
            for ta, tb in zip(a[row]["per_training"], b[row]["per_training"])
            for u, v in zip(ta, tb)
        )

    assert largest_difference(800) == 0.0
    assert f"identical at 800, within {largest_difference(3200):.3f} nats at 3,200" in paragraph()


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
    assert f"(prompt-aware) or {iv(tf, 1)} (text-free, {verdict(tf)})" in paragraph()


def test_the_routers_cost_at_trained_experts_is_table_4_of_each_run():
    pa_800, pa_3200 = (paired(PROMPT_AWARE[s], ROUTER_AT_TRAINED) for s in (800, 3200))
    tf_800, tf_3200 = (paired(TEXT_FREE[s], ROUTER_AT_TRAINED) for s in (800, 3200))
    assert pa_800["resolved"] and pa_3200["resolved"]
    assert (
        f"at trained experts {iv(pa_800, 1)} (800) and {iv(pa_3200, 1)} (3,200) prompt-aware, both resolved, and "
        f"{iv(tf_800, 1)} ({verdict(tf_800)}) and {iv(tf_3200, 1)} ({verdict(tf_3200)}) text-free"
    ) in paragraph()


def test_the_whole_gap_on_the_empty_caption_is_table_4_of_each_run():
    pa = [iv(paired(PROMPT_AWARE[s], GAP), 1) for s in (800, 3200)]
    tf = [iv(paired(TEXT_FREE[s], GAP), 1) for s in (800, 3200)]
    assert f"the whole gap is {pa[0]} and {pa[1]} (prompt-aware), {tf[0]} and {tf[1]} (text-free)" in paragraph()


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


def test_the_routers_share_is_its_range_over_both_rungs_and_orders_for_each_router():
    pa, tf = shares(PROMPT_AWARE), shares(TEXT_FREE)
    assert (
        f"the router's share is {min(pa):.1f}–{max(pa):.1f} % of it with the prompt-aware router and "
        f"{min(tf):.1f}–{max(tf):.1f} % with the text-free one, depending on the order"
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
