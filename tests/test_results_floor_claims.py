"""docs/results.md's class-floor passage against the committed records (benchmarks/results/gmm_class_floor.json):
every cell of its table, its closed forms, its equal-coefficient comparisons and its setting are recomputed from the
records and found as the doc writes them."""

import pytest

from benchmarks.gmm_class_floor import summarise
from hddm_flower.gmm.truth import interval

from . import doc_claims

START = "**At convergence, where it can be computed: the class floor.**"
END = "Samples, 8FM, paired over trainings"
MIXTURES = {"clu-r8": "a subspace per cluster, rank 8", "base-r4": "shared structure, rank 4"}
SETS = {"clu-r8": "data.gmm_covariance=cluster data.gmm_rank=8", "base-r4": ""}
FEATURES = (0, 64, 256, 512, 2048)
MONOLITH_ONLY = {"clu-r8": (4096,), "base-r4": ()}
SCALE = 1e3  # the passage writes excess losses in 10⁻³ per dimension


def entry(name: str) -> dict:
    return doc_claims.load("gmm_class_floor.json")[name]


def summary(name: str) -> dict:
    return summarise(entry(name))


def level(x: dict) -> str:
    return f"{x['mean'] * SCALE:.2f} ± {x['half'] * SCALE:.2f}"


def diff(x: dict) -> str:
    s = doc_claims.iv(x, 2, scale=SCALE)
    return f"**{s}**" if doc_claims.resolved(x) else s


def text() -> str:
    return doc_claims.passage(START, END)


def test_the_records_are_three_trainings_at_each_n_of_the_setting_the_passage_names():
    t = text()
    for name in MIXTURES:
        e = entry(name)
        assert e["setting"] == {
            "config": "configs/reproduce-gmm-nano.yaml",
            "set": SETS[name],
            "clusters": [0, 3, 4],
            "samples": 2048,
            "draws_per_feature": 32,
        }
        keys = sorted((r["features"], r["experts"], r["training"]) for r in e["records"])
        want = [(n, True, i) for n in FEATURES for i in range(3)] + [
            (n, False, i) for n in MONOLITH_ONLY[name] for i in range(3)
        ]
        assert keys == sorted(want)
        assert {r["date"] for r in e["records"]} == {"2026-12-06"}
        assert all("AVX-512" in r["machine"] and "2 cores" in r["machine"] for r in e["records"])
        assert {r["commit"] for r in e["records"]} <= {"8cb7886", "84f0747"} and "8cb7886 and 84f0747" in t
        minutes = sum(r["seconds"] for r in e["records"]) / 60
        assert f"{minutes:.0f} min ({name})" in t, (name, minutes)
    assert "--features 0 64 256 512 2048" in t and "--monolith-only 4096" in t and "--training 0 1 2" in t


def test_the_table_is_the_summary_of_the_records():
    header, *body = doc_claims.md_table(doc_claims.raw_passage(START, END), "| mixture | network |")
    columns = (*FEATURES, 4096)
    assert header == ["mixture", "network", "N = 0", *(f"{n:,}" for n in columns[1:])]
    expected = []
    for name, label in MIXTURES.items():
        s = summary(name)
        rows, mono = s["rows"], s["monolith"]
        expected += [
            [label, "expert", *(level(rows[str(n)]["expert"]) if str(n) in rows else "—" for n in columns)],
            ["", "monolith", *(level(mono[str(n)]) if str(n) in mono else "—" for n in columns)],
            ["", "monolith − expert", *(diff(rows[str(n)]["gap"]) if str(n) in rows else "—" for n in columns)],
        ]
    assert body == expected


def test_the_summaries_committed_are_the_records():
    for name in MIXTURES:
        assert doc_claims.load(f"gmm_class_floor-{name}.json") == summary(name)


def test_at_n_0_the_fit_lies_above_the_closed_form_by_about_what_the_finite_draws_predict():
    t = text()
    above = []
    for name in MIXTURES:
        r = summary(name)["rows"]["0"]
        for who in ("expert", "monolith"):
            above.append(100 * (r[who]["mean"] / r["closed_form"][who] - 1))
        cf = r["closed_form"]
        assert f"{cf['expert'] * SCALE:.2f}" in t and f"{cf['monolith'] * SCALE:.2f}" in t
    assert all(0 < a < 8 for a in above), above
    assert f"{min(above):.0f} to {max(above):.0f} %" in t


def test_the_subspace_mixtures_gap_is_resolved_at_every_n_and_shrinks_with_n():
    rows = summary("clu-r8")["rows"]
    gaps = [rows[str(n)]["gap"] for n in FEATURES]
    assert all(doc_claims.resolved(g) and g["mean"] > 0 for g in gaps)
    assert all(a["mean"] > b["mean"] for a, b in zip(gaps, gaps[1:]))  # "it shrinks as N grows"
    t = text()
    assert f"{gaps[0]['mean'] * SCALE:.1f} to {gaps[-1]['mean'] * SCALE:.1f} ×10⁻³" in t


def test_with_as_many_coefficients_as_the_experts_together_the_monolith_stays_above_them():
    pairs = summary("clu-r8")["equal_coefficients"]
    assert [(p["monolith_features"], p["expert_features"]) for p in pairs] == [(2048, 64), (4096, 256)]
    t = text()
    for p in pairs:
        assert p["monolith_coefficients"] >= p["experts_coefficients"] and p["trainings"] == [0, 1, 2]
        x = p["monolith_minus_expert"]
        assert doc_claims.resolved(x) and x["mean"] > 0
        written = (
            f"{p['monolith_features']:,} features ({p['monolith_coefficients']:,} coefficients per output) against "
            f"the experts at {p['expert_features']:,} ({p['experts_coefficients']:,} together): {diff(x)}"
        )
        assert written in t, written


def test_per_training_the_subspace_gap_is_positive_at_every_t_and_cluster():
    for rec in entry("clu-r8")["records"]:
        if rec["experts"]:
            for c in rec["per_cluster"].values():
                assert all(m > e for m, e in zip(c["monolith"], c["expert"])), (rec["features"], rec["training"])


@pytest.mark.parametrize("name", list(MIXTURES))
def test_the_interval_is_over_the_three_trainings(name):
    per = [
        sum(sum(c["monolith"]) / 5 for c in x["per_cluster"].values()) / 3
        for x in sorted(entry(name)["records"], key=lambda x: x["training"])
        if x["features"] == 2048
    ]
    assert len(per) == 3 and summary(name)["rows"]["2048"]["monolith"] == pytest.approx(interval(per))


def per_training(name: str, n: int, who: str) -> list[float]:
    """``who``'s excess at N = n, mean over the inner t and the clusters, training by training."""
    recs = sorted(
        (r for r in entry(name)["records"] if r["features"] == n and (who == "monolith" or r["experts"])),
        key=lambda r: r["training"],
    )
    return [sum(sum(c[who]) / len(c[who]) for c in r["per_cluster"].values()) / len(r["per_cluster"]) for r in recs]


def test_the_ratios_and_the_shared_structure_comparison_are_the_records():
    t = text()
    rows = summary("clu-r8")["rows"]
    assert f"the monolith is {rows['0']['monolith']['mean'] / rows['0']['expert']['mean']:.0f}× the expert" in t
    ratios = [
        interval(
            [m / e for m, e in zip(per_training("clu-r8", n_m, "monolith"), per_training("clu-r8", n_e, "expert"))]
        )
        for n_m, n_e in ((2048, 64), (4096, 256))
    ]
    assert (
        f"the monolith {ratios[0]['mean']:.1f} ± {ratios[0]['half']:.1f}× and {ratios[1]['mean']:.1f} ± {ratios[1]['half']:.1f}× the experts (paired by training)"
        in t
    )
    base = summary("base-r4")
    (pair,) = base["equal_coefficients"]
    assert (pair["monolith_features"], pair["expert_features"]) == (2048, 64)
    pct = interval(
        [
            100 * (m / e - 1)
            for m, e in zip(per_training("base-r4", 2048, "monolith"), per_training("base-r4", 64, "expert"))
        ]
    )
    assert (
        doc_claims.resolved(pct)
        and f"leaves the monolith {pct['mean']:.0f} ± {pct['half']:.0f} % above the experts, resolved" in t
    )
    assert f"within {pct['hi']:.0f} % of them (the interval's upper end)" in t
    written = (
        f"{pair['monolith_features']:,} features ({pair['monolith_coefficients']:,} coefficients per output) against "
        f"the experts at {pair['expert_features']:,} ({pair['experts_coefficients']:,} together): "
        f"{diff(pair['monolith_minus_expert'])}"
    )
    assert written in t
    assert f"{pct['mean']:.0f} ± {pct['half']:.0f} % above them on the shared-structure one" in doc_claims.passage(
        "**In short**, on the mixture whose clusters share no structure", "Details below."
    )


def test_the_optimas_gap_at_n_0_is_smaller_than_the_fits_in_the_monoliths_favour():
    rows = summary("clu-r8")["rows"]
    cf = rows["0"]["closed_form"]
    optimum, fitted = (cf["monolith"] - cf["expert"]) * SCALE, rows["0"]["gap"]["mean"] * SCALE
    assert optimum < fitted and f"{optimum:.2f} against the fits' {fitted:.2f}" in text()


def test_features_bring_the_monolith_down_at_every_step_of_n():
    mono = summary("clu-r8")["monolith"]
    means = [mono[str(n)]["mean"] for n in (*FEATURES, 4096)]
    assert all(a > b for a, b in zip(means, means[1:]))
    assert f"({means[0] * SCALE:.2f} at N = 0 to {means[-1] * SCALE:.2f} at 4,096)" in text()


def test_the_transformer_monolith_against_the_classs_n_0_optimum_is_the_pilots_records():
    from .test_results_claims import inner, inner_level

    records = doc_claims.load("gmm_capacity_pilot.json")["records"]
    shared = [r for r in records if r["label"] == "base-nano-cos-lr2.0e-3" and r["steps"] == 3200]
    assert len(shared) == 1 and inner(shared[0], "monolith") < inner_level("pattern-r4", "pooled")  # one training
    rank8 = [r for r in records if r["label"] == "clu-r8-nano"]
    assert {r["steps"] for r in rank8} >= {400, 1600, 3200, 6400, 12800, 25600, 51200}
    assert all(inner(r, "monolith") > inner_level("clu-r8", "pooled") for r in rank8)  # "at every budget measured"
    assert "(one training)" in text() and "stays above it at every budget measured" in text()


def test_the_summary_of_the_section_names_the_class_floor_and_what_it_does_not_show():
    from .test_results_claims import paragraph

    p = paragraph()
    assert "one network for every caption stays above the experts on the mixture whose clusters share nothing" in p
    assert "at the two sizes measured, with as many coefficients as all eight together" in p
    assert "For the transformers a limit at convergence is not shown" in p


def test_the_features_scale_moves_the_gap_by_what_the_passage_says():
    parts = []
    for scale in ("0.3", "3"):
        e = entry(f"clu-r8-input{scale}")
        assert e["setting"]["input_scale"] == float(scale) and e["setting"]["set"] == SETS["clu-r8"]
        assert sorted((r["features"], r["training"]) for r in e["records"]) == [
            (n, i) for n in (256, 512) for i in range(3)
        ]
        assert {r["date"] for r in e["records"]} == {"2026-12-06"} and all(
            "AVX-512" in r["machine"] for r in e["records"]
        )
        assert doc_claims.load(f"gmm_class_floor-clu-r8-input{scale}.json") == summarise(e)
        cells = []
        for n in (256, 512):

            def gap(name: str) -> list[float]:
                return [m - x for m, x in zip(per_training(name, n, "monolith"), per_training(name, n, "expert"))]

            pct = interval([100 * (a / b - 1) for a, b in zip(gap(f"clu-r8-input{scale}"), gap("clu-r8"))])
            assert abs(pct["mean"]) + pct["half"] < 6  # "a few per cent"
            cells.append(f"{doc_claims.num(pct['mean'], 1)} ± {pct['half']:.1f}")
        parts.append(f"{cells[0]} and {cells[1]} % ({scale}×)")
    assert f"by {parts[0]} and {parts[1]} at N = 256 and 512" in text()
