"""docs/results.md's trained-floor passage against the committed records (benchmarks/results/gmm_trained_floor.json)
and the closed form: its width-floor table is recomputed from the mixture, every cell of its training table from the
records, and its setting, machine and commits are the records'."""

import re

import pytest
import torch

from benchmarks.gmm_trained_floor import render, summarise
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
    assert f"{sum(r['seconds'] for r in e['records']) / 60:.0f} min summed over the records" in t


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    """The mixture both entries were trained on (the same config and overrides)."""
    from hddm_flower.config.io import load_config, parse_overrides
    from hddm_flower.gmm.dataset import load_reference
    from hddm_flower.stages.prepare import prepare_data

    e = entry()
    cfg = load_config(doc_claims.ROOT / e["setting"]["config"], parse_overrides(e["setting"]["set"]))
    return load_reference(prepare_data(cfg, tmp_path_factory.mktemp("gmm")))


def test_the_width_floors_are_the_closed_form_of_the_mixture(ref):
    e = entry()
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
    assert (
        f"average {weighted * SCALE:.2f} over all eight clusters, weighted as the mixture weighs them, so the monolith's floor is {mono / weighted:.0f}× theirs"
        in t
    )
    assert f"{weighted * SCALE:.2f} over all eight clusters weighted" in t
    from .test_results_claims import paragraph

    assert f"at no less than {mono / weighted:.0f}× the experts' floors at that width" in paragraph()
    f64 = {k: width_floor(ref.mixture, (ref.cluster_of == k).nonzero().squeeze(1), (0.1,), 64)[0] for k in range(8)}
    assert (
        f"{sum(float(mass[k]) * f64[k] for k in range(8)) / float(mass.sum()) * SCALE:.2f} over all eight, weighted"
        in t
    )
    assert width_floor(ref.mixture, every, (0.1,), 192)[0] == 0 and "at N ≥ 192, the dimension, it is 0" in t
    assert (
        f"at N = 128, as many units as eight experts of 16, is {width_floor(ref.mixture, every, (0.1,), 128)[0] * SCALE:.2f}"
        in t
    )
    assert width_floor(ref.mixture, every, (0.1,), 128)[0] < weighted  # "not held back by its width"


def test_every_row_of_the_training_table_is_the_records_summary():
    s = summarise(entry())
    cells = doc_claims.md_table(doc_claims.raw_passage(START, END), "| N | steps | trainings | expert |")
    assert cells[1:] == [row_cells(r) for r in s["rows"]]


def _pct(x: float) -> str:
    return f"{x:.1f}"


def test_the_bullets_numbers_are_the_records_and_the_floors():
    from hddm_flower.gmm.truth import interval

    from .test_results_claims import paragraph

    t, e = text(), entry()
    rows = {(r["features"], r["steps"]): r for r in summarise(e)["rows"]}
    by = {(r["features"], r["steps"], r["training"]): r for r in e["records"]}
    f16, f64 = e["width_floor"]["16@0.1"], e["width_floor"]["64@0.1"]

    def experts(losses: dict, floor: dict | None = None) -> float:
        return (losses["0"] + losses["3"]) / 2 / (1 if floor is None else (floor["0"] + floor["3"]) / 2)

    # 16 units, 16,000 steps: each training's training loss above its floor
    mono = [100 * (by[16, 16000, i]["training_loss"]["monolith"] / f16["monolith"] - 1) for i in range(3)]
    exp = [100 * (experts(by[16, 16000, i]["training_loss"], f16) - 1) for i in range(3)]
    assert (
        f"lies {_pct(mono[0])}, {_pct(mono[1])} and {_pct(mono[2])} % above its floor in the three trainings ({doc_claims.iv(interval(mono), 1)[1:]} %)"
        in t
    )
    assert f"and {_pct(exp[2])} % above theirs ({doc_claims.iv(interval(exp), 1)[1:]} %)" in t
    assert f"clusters 0 and 3) {_pct(exp[0])}, {_pct(exp[1])}" in t
    assert (
        f"the trained monoliths lie {_pct(min(mono))}–{_pct(max(mono))} % above that floor and the experts of clusters 0 and 3 {_pct(min(exp))}–{_pct(max(exp))} % above theirs (three trainings)"
        in paragraph()
    )
    tl = [
        100 * (by[16, 16000, i]["training_loss"]["monolith"] / by[16, 8000, i]["training_loss"]["monolith"] - 1)
        for i in range(3)
    ]
    over = [
        100
        * (
            (by[16, 16000, i]["training_loss"]["monolith"] - f16["monolith"])
            / (by[16, 8000, i]["training_loss"]["monolith"] - f16["monolith"])
            - 1
        )
        for i in range(3)
    ]
    assert not doc_claims.resolved(interval(tl)) and not doc_claims.resolved(interval(over))
    assert f"training loss changes by {doc_claims.iv(interval(tl), 1)} %" in t
    assert f"but its excess over the floor by {doc_claims.iv(interval(over), 1)} %" in t
    ch = rows[16, 16000]["change_per_doubling_pct"]
    assert all(not doc_claims.resolved(x) for x in ch.values())
    assert f"the experts {change(ch['expert'])}, the monolith {change(ch['monolith'])}" in t
    assert f"the monolith is {ratio(rows[16, 16000]['ratio'])} the experts" in t
    c3 = [by[16, 16000, i]["per_cluster"]["3"]["monolith"] * SCALE for i in range(3)]
    assert max(c3) < f16["monolith"] * SCALE and f"on cluster 3, {min(c3):.1f}–{max(c3):.1f} held out" in t
    # 64 units
    assert f"is {f64['monolith'] * SCALE:.2f}, the experts' {(f64['0'] + f64['3']) / 2 * SCALE:.2f}" in t
    assert (
        f"the floors are {f64['monolith'] / ((f64['0'] + f64['3']) / 2):.1f}× apart" in t
        and "floors are 1.3× apart" in paragraph()
    )
    r64 = rows[64, 16000]
    assert (
        doc_claims.resolved(r64["change_per_doubling_pct"]["monolith"])
        and r64["change_per_doubling_pct"]["monolith"]["mean"] < 0
    )
    assert (
        f"({level(r64['monolith_training_loss'])} at 16,000 steps) and still falls ({change(r64['change_per_doubling_pct']['monolith'])} per doubling"
        in t
    )
    assert f"the experts change by {change(r64['change_per_doubling_pct']['expert'])}" in t
    above = [100 * (by[64, 16000, i]["training_loss"][k] / f64[k] - 1) for i in range(3) for k in ("0", "3")]
    mean_above = [100 * (experts(by[64, 16000, i]["training_loss"], f64) - 1) for i in range(3)]
    assert 13 < min(above) and max(mean_above) < 23 and 15 <= min(mean_above) and "lie 15–23 % above their floor" in t

    def held(n: int, s: int, i: int) -> float:
        c = by[n, s, i]["per_cluster"]
        return sum(x["monolith"] for x in c.values()) / sum(x["expert"] for x in c.values())

    drop = interval([held(64, 2000, i) - held(64, 16000, i) for i in range(3)])
    assert (
        doc_claims.resolved(drop)
        and f"to {ratio(r64['ratio'])} at 16,000 (by {doc_claims.iv(drop, 1)[1:]}, paired by training)" in t
    )
    assert f"falls from {ratio(rows[64, 2000]['ratio'])} at 2,000 steps" in t
    # 256 units
    r256 = rows[256, 8000]
    grow = interval([held(256, 8000, i) - held(256, 2000, i) for i in range(3)])
    assert doc_claims.resolved(grow)
    assert (
        f"from {ratio(rows[256, 2000]['ratio'])} at 2,000 steps to {ratio(r256['ratio'])} at 8,000 (by {doc_claims.iv(grow, 1)[1:]}, paired by"
        in t
    )
    ch = r256["change_per_doubling_pct"]
    assert f"({change(ch['expert'])} per doubling at the last doubling, the monolith {change(ch['monolith'])})" in t


# five t, all eight clusters (the bullet "Five t, all eight clusters"): 16 units at five t, 32 at three
EVERY_T = {16: (0.1, 0.3, 0.5, 0.7, 0.9), 32: (0.1, 0.5, 0.9)}


def every_entry() -> dict:
    return doc_claims.load("gmm_trained_floor.json")["clu-r8-every"]


def g3(x: float) -> str:
    return f"{x:,.0f}" if x >= 1000 else f"{x:.3g}"


def test_the_every_cluster_records_are_the_setting_and_trainings_the_bullet_names(ref):
    e, t = every_entry(), text()
    assert e["setting"] == entry()["setting"] | {"clusters": list(range(8))}
    keys = sorted((r["features"], r["t"], r["steps"], r["training"]) for r in e["records"])
    assert keys == sorted((n, x, 2000, i) for n, times in EVERY_T.items() for x in times for i in range(3))
    assert {r["date"] for r in e["records"]} == {"2026-12-06"}
    assert all("AVX-512" in r["machine"] and "2 cores" in r["machine"] for r in e["records"])
    commits = {n: {r["commit"] for r in e["records"] if r["features"] == n} for n in EVERY_T}
    assert commits[16] == {"597f5a0", "ed4b70a"} and "name commits 597f5a0 and ed4b70a" in t
    sixteen = [r for r in e["records"] if r["features"] == 16]
    assert all("uncommitted" not in r for r in sixteen)  # stamped before the stamp listed them
    thirty_two = [r for r in e["records"] if r["features"] == 32]
    assert commits[32] == {"85666aa"} and all(r["uncommitted"] == [] and r["torch_threads"] == 1 for r in thirty_two)
    assert "its records name 85666aa with nothing uncommitted" in t
    for records in (sixteen, thirty_two):
        assert f"{sum(r['seconds'] for r in records) / 60:.0f} min summed" in t
    assert "--clusters 0 1 2 3 4 5 6 7 --features 16 --times 0.1 0.3 0.5 0.7 0.9 --steps 2000 --training 0 1 2" in t
    assert "(`--features 32 --times 0.1 0.5 0.9`, otherwise the same command" in t
    assert e["meta"]["command"].endswith(
        "--clusters 0 1 2 3 4 5 6 7 --features 32 --times 0.1 0.5 0.9 --steps 2000 --training 0 1 2 "
        "--lr 1e-2 --name clu-r8-every"
    )
    assert doc_claims.load("gmm_trained_floor-clu-r8-every.json") == summarise(e)
    md = (doc_claims.RESULTS / "gmm_trained_floor-clu-r8-every.md").read_text()
    assert md == render(e, summarise(e))  # the committed table is the records' (the last command's stamp)
    assert "From 05e7b85 on a record also lists the tracked files that differed from its commit" in t
    # the weights are the clusters' shares of the mixture, the floors its closed form
    for k, w in e["cluster_weights"].items():
        assert w == pytest.approx(float(ref.mixture.weights[ref.cluster_of == int(k)].sum()), rel=1e-12)
    every = torch.arange(len(ref.cluster_of))
    for n, times in EVERY_T.items():
        for x in times:
            floors = e["width_floor"][f"{n}@{x}"]
            assert floors["monolith"] == pytest.approx(width_floor(ref.mixture, every, (x,), n)[0], rel=1e-9)
            for k in range(8):
                members = (ref.cluster_of == k).nonzero().squeeze(1)
                assert floors[str(k)] == pytest.approx(width_floor(ref.mixture, members, (x,), n)[0], rel=1e-9)


def _weighted(r: dict, w: dict, who: str = "expert") -> float:
    return sum(w[k] * r["per_cluster"][k][who] for k in w)


def test_the_five_t_table_and_its_bullet_are_the_records(ref):
    import math

    from .test_results_claims import paragraph

    e, t = every_entry(), text()
    w, rows = e["cluster_weights"], {(r["features"], r["t"]): r for r in summarise(e)["rows"]}
    by = {(r["features"], r["t"], r["training"]): r for r in e["records"]}

    def cell(x: dict) -> str:
        return f"{x['mean'] * SCALE:.3g} ± {x['half'] * SCALE:.2g}"

    expected, factors, above, plus_2se, rel_se, over_own, widest = [], {}, {}, {}, {}, [], {}
    every = torch.arange(len(ref.cluster_of))
    for n, times in EVERY_T.items():
        for x in times:
            r, floor = rows[n, x], rows[n, x]["width_floor"]
            runs = [by[n, x, i] for i in range(3)]
            above[n, x] = [100 * (q["training_loss"]["monolith"] / floor["monolith"] - 1) for q in runs]
            factors[n, x] = [floor["monolith"] / _weighted(q, w) for q in runs]
            ses = [math.sqrt(sum((w[k] * q["per_cluster"][k]["expert_se"]) ** 2 for k in w)) for q in runs]
            mono_ses = [math.sqrt(sum((w[k] * q["per_cluster"][k]["monolith_se"]) ** 2 for k in w)) for q in runs]
            rel_se[n, x] = [s / _weighted(q, w) for s, q in zip(ses, runs)]
            rel_se[n, x] += [s / _weighted(q, w, "monolith") for s, q in zip(mono_ses, runs)]
            plus_2se[n, x] = [floor["monolith"] / (_weighted(q, w) + 2 * s) for s, q in zip(ses, runs)]
            per = r["every_component"]["per_training"]  # the summary's per-training values: the same, computed apart
            assert [per[str(i)]["floor_over_expert"] for i in range(3)] == pytest.approx(factors[n, x], rel=1e-12)
            assert [per[str(i)]["floor_over_expert_plus_2se"] for i in range(3)] == pytest.approx(
                plus_2se[n, x], rel=1e-12
            )
            assert [per[str(i)]["expert_se"] for i in range(3)] == pytest.approx(ses, rel=1e-12)
            if n == 16 and x >= 0.5:
                over_own.append(r["every_component"]["expert"]["mean"] / floor["experts_weighted"])
            expected.append(
                [
                    str(n),
                    str(x),
                    g3(floor["monolith"] * SCALE),
                    f"{cell(r['monolith_training_loss'])} ({', '.join(f'{a:.1f}' for a in above[n, x])} %)",
                    f"{cell(r['every_component']['expert'])} ({g3(floor['experts_weighted'] * SCALE)})",
                    ", ".join(g3(f) for f in factors[n, x]),
                ]
            )
            # the widest monolith the bound still holds above every training's experts (it never increases with N)
            worst = max(_weighted(q, w) for q in runs)
            lo, hi = 16, 192
            assert width_floor(ref.mixture, every, (x,), lo)[0] > worst >= width_floor(ref.mixture, every, (x,), hi)[0]
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if width_floor(ref.mixture, every, (x,), mid)[0] > worst else (lo, mid)
            widest[n, x] = lo
    cells = doc_claims.md_table(doc_claims.raw_passage(START, END), "| N | t | monolith's width floor |")
    assert cells[1:] == expected
    # 16 units
    t16 = EVERY_T[16]
    assert {f"{f:.0f}" for f in factors[16, 0.1]} == {"30"} and "by 30× at t = 0.1" in t
    rest = min(f for x in t16[1:] for f in factors[16, x])
    assert f"and by {rest:.1f}× or more at the other times" in t
    assert f"at most {100 * max(v for x in t16 for v in rel_se[16, x]):.1f} % of them" in t
    assert f"still {min(v for x in t16 for v in plus_2se[16, x]):.1f} or more" in t
    assert f"they lie {min(over_own):.1f}× to {max(over_own):.0f}× above their own floors" in t
    a16 = [a for x in t16 for a in above[16, x]]
    assert f"lies {min(a16):.1f}–{max(a16):.1f} % above its floor by training loss" in t
    assert all(9 < a < 12 for x in (0.1, 0.3) for a in above[16, x])  # "about a tenth at t ≤ 0.3"
    assert all(32 < a < 34 for a in above[16, 0.9])  # "a third at t = 0.9"
    assert {widest[16, x] for x in t16[:-1]} == {63} and widest[16, 0.9] == 60
    assert "weighted expert excess is 63 at t ≤ 0.7 and 60 at t = 0.9 against the 16-unit experts" in t
    # 32 units
    t32 = EVERY_T[32]
    assert f"by {min(factors[32, 0.1]):.1f}× or more at t = 0.1" in t
    assert f"and {min(f for x in t32[1:] for f in factors[32, x]):.0f}× or more at 0.5 and 0.9" in t
    assert f"still {min(v for x in t32 for v in plus_2se[32, x]):.1f}× or more with two standard errors" in t
    assert f"(the largest {100 * max(v for x in t32 for v in rel_se[32, x]):.1f} % of its value)" in t
    a32 = [a for x in t32 for a in above[32, x]]
    assert f"the 32-unit monolith lies {min(a32):.1f}–{max(a32):.1f} % above its floor" in t
    assert all(min(above[32, x]) > max(above[16, x]) for x in t32) and "at each of the three t after the same" in t
    assert {widest[32, x] for x in t32} == {63} and "(63 at all three t against the 32-unit ones)" in t
    # the In-short sentence and the Not-shown item (16 units)
    p = paragraph()
    assert f"by 30× at t = 0.1 and by {rest:.1f}× or more at the other times, in each of three trainings" in p
    w16 = [widest[16, x] for x in t16]
    assert (
        f"a monolith of about {min(w16) + 1}–{max(w16) + 1} units or more is no longer held above them by the bound"
        in p
    )
    assert f"(at 16 units, 2,000 steps, {min(a16):.1f}–{max(a16):.1f} % above its floor;" in re.sub(
        r"\s+", " ", doc_claims.DOC.read_text()
    )
