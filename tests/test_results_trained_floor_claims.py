"""docs/results.md's trained-floor passage against the committed records (benchmarks/results/gmm_trained_floor.json)
and the closed form: its width-floor table is recomputed from the mixture, every cell of its training table from the
records, and its setting, machine and commits are the records'."""

import pytest
import torch

from benchmarks.gmm_trained_floor import summarise
from hddm_flower.gmm.yardsticks import width_floor

from . import doc_claims

START = "**With every weight trained: the width floor.**"
END = "Samples, 8FM, paired over trainings"
SCALE = 1e3  # the passage writes excess losses in 10⁻³ per dimension
FLOOR_N = (0, 16, 32, 48, 64, 128)
FLOOR_T = (0.1, 0.3, 0.5, 0.7, 0.9)
STEPS = {16: (2000, 4000, 8000, 16000), 64: (2000, 4000, 8000, 16000), 256: (2000, 4000, 8000)}
TRAININGS = {16: (0, 1, 2), 64: (0, 1, 2), 256: (0, 1, 2)}
COMMITS = ("b524cbe", "170173f", "ce3d1a7", "ed7b952", "87b460d", "b5cd4a3")


def entry() -> dict:
    return doc_claims.load("gmm_trained_floor.json")["clu-r8"]


def text() -> str:
    return doc_claims.passage(START, END)


def level(x: dict) -> str:
    return f"{x['mean'] * SCALE:.2f}" + (f" ± {x['half'] * SCALE:.2f}" if x["n"] > 1 else "")


def ratio(x: dict) -> str:
    return f"{x['mean']:.1f}" + (f" ± {x['half']:.1f}" if x["n"] > 1 else "") + "×"


def change(x: dict) -> str:
    return doc_claims.num(x["mean"], 1) + (f" ± {x['half']:.1f}" if x["n"] > 1 else "") + " %"


def row_cells(r: dict) -> list[str]:
    """A row of the passage's training table, as the doc writes it."""
    ch = r.get("change_per_doubling_pct")
    return [
        f"{r['features']:,}",
        f"{r['steps']:,}",
        str(len(r["trainings"])),
        level(r["expert"]),
        level(r["monolith"]),
        ratio(r["ratio"]),
        f"{change(ch['expert'])} / {change(ch['monolith'])}" if ch else "—",
        f"{level(r['expert_training_loss'])} ({r['width_floor']['expert'] * SCALE:.2f})",
        f"{level(r['monolith_training_loss'])} ({r['width_floor']['monolith'] * SCALE:.2f})",
    ]


def test_the_records_are_the_trainings_and_setting_the_passage_names():
    e, t = entry(), text()
    assert e["setting"] == {
        "config": "configs/reproduce-gmm-nano.yaml",
        "set": "data.gmm_covariance=cluster data.gmm_rank=8",
        "clusters": [0, 3],
        "samples": 2048,
        "lr": 0.01,
        "batch": 512,
        "draws_per_feature": 32,
    }
    keys = sorted((r["features"], r["t"], r["steps"], r["training"]) for r in e["records"])
    assert keys == sorted((n, 0.1, s, i) for n, steps in STEPS.items() for s in steps for i in TRAININGS[n])
    assert {r["date"] for r in e["records"]} == {"2026-12-06"}
    assert all("AVX-512" in r["machine"] and "2 cores" in r["machine"] for r in e["records"])
    assert {r["commit"] for r in e["records"]} == set(COMMITS) and ", ".join(COMMITS[:-1]) + " and " + COMMITS[-1] in t
    assert doc_claims.load("gmm_trained_floor-clu-r8.json") == summarise(e)  # the committed summary is the records'
    assert f"{sum(r['seconds'] for r in e['records']) / 60:.0f} min of training in all" in t


def test_the_width_floors_are_the_closed_form_of_the_mixture(tmp_path):
    from hddm_flower.config.io import load_config, parse_overrides
    from hddm_flower.gmm.dataset import load_reference
    from hddm_flower.stages.prepare import prepare_data

    e = entry()
    cfg = load_config(doc_claims.ROOT / e["setting"]["config"], parse_overrides(e["setting"]["set"]))
    ref = load_reference(prepare_data(cfg, tmp_path))
    every = torch.arange(len(ref.cluster_of))
    for key, floors in e["width_floor"].items():
        n, t = int(key.split("@")[0]), float(key.split("@")[1])
        assert floors["monolith"] == pytest.approx(width_floor(ref.mixture, every, (t,), n)[0], rel=1e-9)
        for k in e["setting"]["clusters"]:
            members = (ref.cluster_of == k).nonzero().squeeze(1)
            assert floors[str(k)] == pytest.approx(width_floor(ref.mixture, members, (t,), n)[0], rel=1e-9)
    # the passage's table of the floor by N and t (the monolith over every component)
    cells = doc_claims.md_table(doc_claims.raw_passage(START, END), "| width floor ×10⁻³, N hidden units |")
    assert cells[0][1:] == [f"t = {t}" for t in FLOOR_T]
    assert [row[0] for row in cells[1:]] == [f"{n:,}" for n in FLOOR_N]
    for n, row in zip(FLOOR_N, cells[1:]):
        assert row[1:] == [f"{x * SCALE:.2f}" for x in width_floor(ref.mixture, every, FLOOR_T, n)], n
    # the experts' floors at 16 units: clusters 0 and 3, and all eight weighted as the mixture weighs them
    t = text()
    floor = {k: width_floor(ref.mixture, (ref.cluster_of == k).nonzero().squeeze(1), (0.1,), 16)[0] for k in range(8)}
    mass = torch.zeros(8, dtype=torch.float64).index_add_(0, ref.cluster_of, ref.mixture.weights)
    weighted = sum(float(mass[k]) * floor[k] for k in range(8)) / float(mass.sum())
    mono = width_floor(ref.mixture, every, (0.1,), 16)[0]
    assert f"are {floor[0] * SCALE:.2f} (cluster 0) and {floor[3] * SCALE:.2f} (cluster 3)" in t
    assert f"weigh {weighted * SCALE:.2f} over all eight clusters, {mono / weighted:.0f}× less" in t
    assert f"{weighted * SCALE:.2f} over all eight clusters weighted" in t
    from .test_results_claims import paragraph

    assert f"at {mono / weighted:.0f}× the experts' floors at that width" in paragraph()
    assert (
        f"at N = 128, as many units as eight experts of 16, is {width_floor(ref.mixture, every, (0.1,), 128)[0] * SCALE:.2f}"
        in t
    )
    assert width_floor(ref.mixture, every, (0.1,), 128)[0] < weighted  # "not held back by its width"


def test_every_row_of_the_training_table_is_the_records_summary():
    s = summarise(entry())
    cells = doc_claims.md_table(doc_claims.raw_passage(START, END), "| N | steps | trainings | expert |")
    assert [c for c in cells[1:]] == [row_cells(r) for r in s["rows"]]


def test_the_bullets_numbers_are_the_summarys_and_the_floors():
    t = text()
    rows = {(r["features"], r["steps"]): r for r in summarise(entry())["rows"]}
    last, floors = rows[16, 16000], entry()["width_floor"]
    mono, exp = last["monolith_training_loss"], last["expert_training_loss"]
    assert (
        f"comes to {level(mono)} against that floor ({100 * (mono['mean'] / floors['16@0.1']['monolith'] - 1):.1f} % above it)"
        in t
    )
    assert f"the experts' to {level(exp)} against theirs, {last['width_floor']['expert'] * SCALE:.2f}" in t
    ch = last["change_per_doubling_pct"]
    for x in ch.values():  # "neither changes by a resolved amount"
        assert not doc_claims.resolved(x)
    assert f"the experts {change(ch['expert'])}, the monolith {change(ch['monolith'])}" in t
    assert f"the monolith stays {ratio(last['ratio'])} the experts" in t
    assert f"below {floors['16@0.1']['monolith'] * SCALE:.2f} over every component" in t
    # the In-short sentence's "within 6 %" and "within 3 %"
    assert 100 * (mono["mean"] / floors["16@0.1"]["monolith"] - 1) < 6
    assert 100 * (exp["mean"] / last["width_floor"]["expert"] - 1) < 3
    from .test_results_claims import paragraph

    assert (
        "the monolith to within 6 % of its floor and the experts to within 3 % of theirs (three trainings)"
        in paragraph()
    )
    r64 = rows[64, 16000]
    assert (
        doc_claims.resolved(r64["change_per_doubling_pct"]["monolith"])
        and r64["change_per_doubling_pct"]["monolith"]["mean"] < 0
    )
    assert f"still falls ({change(r64['change_per_doubling_pct']['monolith'])} per doubling at the last doubling)" in t
    assert f"falls from {ratio(rows[64, 2000]['ratio'])} at 2,000 steps to {ratio(r64['ratio'])} at 16,000" in t
    assert f"({level(r64['monolith_training_loss'])} at 16,000 steps)" in t
    r256 = rows[256, 8000]
    assert f"from {ratio(rows[256, 2000]['ratio'])} at 2,000 steps to {ratio(r256['ratio'])} at 8,000" in t
    ch = r256["change_per_doubling_pct"]
    assert f"({change(ch['expert'])} per doubling at the last doubling, the monolith {change(ch['monolith'])})" in t
