"""docs/results.md's equal-compute bullet against the committed records (benchmarks/results/gmm_equal_compute.json):
its setting is the experts' entry's, its compute and parameter counts are the networks' counted by hand, its table is
the committed summary's, which is the records' (recomputed), and each number of its reading is the records'."""

import pytest

from benchmarks import gmm_trained_floor as floor
from benchmarks.gmm_equal_compute import below, render, summarise
from benchmarks.gmm_trained_floor import render as render_floor
from benchmarks.gmm_trained_floor import summarise as floor_summary

from . import doc_claims

START = "**Equal compute: one monolith as wide as the eight experts together, trained.**"
WIDER = "**Wider and with more compute.**"
END = "**Sixty-four units (8 clusters × rank 8)"
D, COMPONENTS, CLUSTERS, PER_CLUSTER = 192, 32, 8, 4  # the rank-8 nano mixture: 3 × 8 × 8, 8 clusters of 4
MAIN = {(128, t, s) for t in (0.1, 0.3, 0.5, 0.7, 0.9) for s in (2000, 8000)} | {(128, 0.1, 32000), (128, 0.5, 32000)}
WIDTHS = {64: 10774, 256: 5475, 512: 3307, 768: 2369}  # at t = 0.1, equal compute
LONGER = {256: (21508, 43016)}  # 3.93× and 7.86× the experts' compute, as the 128-unit monolith's 32,000 and 64,000
LATEST = "a870ef3"  # the commit the wider and longer records name
EVEN = ("ffb8193", 15311)  # the 256-unit monolith at 2.80×, as much as the 256-unit experts: its commit, steps
NEW = "79563b0"  # the commit of the records "Equal width at every compute" added (a 256-unit monolith's trainings)
HALF = "bfd91a2"  # the same paragraph's at t = 0.5 (the 256-unit monolith at 5,475 steps, trainings 1 and 2)
RATES = "9416cea"  # the records of "Both sides' learning rates" (the monolith at more rates)
LONG_HALF = "54bcc71"  # and its second half's: the 256-unit monolith at 7.86× and t = 0.5 (at 10⁻², in clu-r8-every)
LAST = "92fb75c"  # and the last: the 256-unit monolith at 7.86× and t = 0.5 at 10⁻³ and 5·10⁻³
LRS = {"3e-3": 3e-3, "3e-2": 3e-2, "1e-1": 1e-1}


def store() -> dict:
    return doc_claims.load("gmm_equal_compute.json")


def experts() -> dict:
    return doc_claims.load("gmm_trained_floor.json")["clu-r8-every"]


def text() -> str:
    return doc_claims.passage(START, WIDER)


def wider() -> str:
    return doc_claims.passage(WIDER, END)


def macs(n: int, captions: int) -> int:  # forward, both weight gradients, the output layer's input gradient
    return D * n + (D + captions + n) * D + D * n + (D + captions + n) * D + (D + captions + n) * D


def params(n: int, captions: int) -> int:  # R, q, β and W (over [x, one-hot caption, hidden])
    return D * n + captions * n + n + (D + captions + n) * D


def test_the_records_are_the_setting_commands_and_trainings_the_bullet_names():
    s, t = store(), text()
    main = s["clu-r8-every"]
    trained = experts()["setting"]
    same = {"experts": "clu-r8-every", "expert_features": 16, "expert_steps": 2000}
    assert main["setting"] == same | {k: v for k, v in trained.items() if k != "clusters"}
    for name, lr in LRS.items():
        assert s[f"clu-r8-every-lr{name}"]["setting"] == main["setting"] | {"lr": lr}
    keys = sorted((r["features"], r["t"], r["steps"], r["training"]) for r in main["records"])
    expected = MAIN | {(n, 0.1, steps) for n, steps in WIDTHS.items()} | {(256, 0.1, LONGER[256][1])}
    three = [(n, x, steps, i) for n, x, steps in expected for i in range(3)]
    three += [(256, 0.1, EVEN[1], i) for i in range(3)]
    half_long = [(256, 0.5, LONGER[256][1], i) for i in range(3)]  # "Both sides' learning rates"
    assert keys == sorted(three + [(256, 0.1, LONGER[256][0], i) for i in range(3)] + half_long)
    assert {
        r["commit"] for r in main["records"] if (r["features"], r["t"], r["steps"], r["training"]) in half_long
    } == {LONG_HALF}
    lr_keys = {
        name: sorted((r["features"], r["t"], r["steps"], r["training"]) for r in s[f"clu-r8-every-lr{name}"]["records"])
        for name in LRS
    }
    assert lr_keys["3e-3"] == [(128, 0.1, 8000, 0), (512, 0.1, 3307, 0)]
    assert lr_keys["1e-1"] == [(128, 0.1, 8000, 0), (256, 0.1, 5475, 0), (512, 0.1, 3307, 0)]
    quick = [(256, 0.1, steps, i) for steps in (5475, *LONGER[256]) for i in range(3)]
    assert lr_keys["3e-2"] == sorted(
        [(128, 0.1, steps, i) for steps in (8000, 32000, 64000) for i in range(3)]
        + [(128, 0.5, 8000, 0), (512, 0.1, 3307, 0), (256, 0.5, 5475, 0)]
        + quick
        + [(256, 0.5, LONGER[256][0], i) for i in range(3)]
        + [(256, 0.1, EVEN[1], i) for i in range(3)]
        + [(256, 0.5, 5475, i) for i in (1, 2)]
    )
    records = [r for e in s.values() for r in e["records"] if "adopted_from" not in r]  # each record once
    dated = {r["date"] for r in records if r["commit"] not in (EVEN[0], NEW, HALF, RATES, LONG_HALF, LAST)}
    assert dated == {"2026-12-06"} and all(r["torch_threads"] == 1 for r in records)
    assert {r["date"] for r in records if r["commit"] in (EVEN[0], NEW, HALF, RATES, LONG_HALF, LAST)} == {"2026-12-07"}
    assert all("AVX-512" in r["machine"] and "2 cores" in r["machine"] for r in records)
    late = [r for r in records if r["steps"] == 64000]  # made after the rest, at 440e0fe
    assert len(late) == 3 and all((r["commit"], r["uncommitted"]) == ("440e0fe", []) for r in late)
    assert "their records naming 440e0fe with nothing uncommitted" in t
    newest = [r for r in records if r["commit"] == LATEST]  # the wider and longer records, the next paragraph's
    others = [
        r
        for name, e in s.items()
        if name != "clu-r8-every-reproduced"
        for r in e["records"]
        if r not in late
        and r not in newest
        and r["commit"] not in (EVEN[0], NEW, HALF, RATES, LONG_HALF, LAST)
        and "adopted_from" not in r
    ]
    odd = [r for r in others if (r["commit"], r["uncommitted"]) != ("0828f98", [])]
    assert len(odd) < len(others) / 2 and "Most records name 0828f98 with nothing uncommitted" in t
    assert {(r["commit"], tuple(r["uncommitted"])) for r in odd} == {
        ("bac050a", ()),
        ("6bceda8", ()),
        ("6bceda8", ("benchmarks/gmm_equal_compute.py", "tests/test_gmm_equal_compute.py")),
    }
    assert {r["training"] for r in odd} <= {0, 1} and {r["steps"] for r in odd} <= {2000, 8000}
    assert "two list the benchmark and its test as differing from 6bceda8" in t
    # the retrained record: bit for bit
    (again,) = s["clu-r8-every-reproduced"]["records"]
    first = next(
        r for r in main["records"] if (r["features"], r["t"], r["steps"], r["training"]) == (128, 0.1, 2000, 0)
    )
    assert first["commit"] == "bac050a" and (again["commit"], again["uncommitted"]) == ("78a383f", [])
    assert again["per_cluster"] == first["per_cluster"] and again["training_loss"] == first["training_loss"]
    assert "retrained at 78a383f, came out bit for bit (entry `clu-r8-every-reproduced`)" in t
    lr_records = [
        r
        for name in LRS
        for r in s[f"clu-r8-every-lr{name}"]["records"]
        if r not in newest and r["commit"] not in (NEW, HALF)
    ]
    before = [r for r in main["records"] if r not in newest and r["commit"] not in (EVEN[0], NEW, LONG_HALF)]
    assert f"{sum(r['seconds'] for r in before) / 60:.0f} min summed over the records" in t
    assert f"{sum(r['seconds'] for r in lr_records) / 60:.0f} more for the learning rates" in t
    assert main["meta"]["command"] == (
        "python -m benchmarks.gmm_equal_compute --experts clu-r8-every --expert-features 16 --expert-steps 2000 "
        "--features 128 --times 0.1 0.3 0.5 0.7 0.9 --steps 2000 8000 --training 0 1 2 --name clu-r8-every"
    )
    assert main["meta"]["command"].removeprefix("python -m ") in t.replace("` ", "`")
    for n, steps in WIDTHS.items():
        assert f"`--features {n} --steps {steps}`" in t


def test_the_compute_and_parameters_are_the_networks_counted_by_hand():
    t, main = text(), store()["clu-r8-every"]
    expert, mono = macs(16, PER_CLUSTER), macs(128, COMPONENTS)
    assert (expert, CLUSTERS * expert, mono) == (128_256, 1_026_048, 251_904)
    assert (
        f"a 16-unit expert's step {expert:,}, the eight experts' {CLUSTERS * expert:,}, the 128-unit monolith's {mono:,}"
        in t
    )
    assert f"so {2000 * CLUSTERS * expert / mono:,.0f} monolith steps are the experts' compute" in t
    for key, ratio in main["compute_ratio"].items():
        n, steps = map(int, key.split("@"))
        assert ratio == pytest.approx(steps * macs(n, COMPONENTS) / (2000 * CLUSTERS * expert), rel=1e-12)
    for n, steps in WIDTHS.items():  # equal compute: the whole number of steps nearest the experts' compute
        assert steps == round(2000 * CLUSTERS * expert / macs(n, COMPONENTS)), n
    assert 0.24 < main["compute_ratio"]["128@2000"] < 0.26 and "2,000 steps are a quarter of it (equal steps)" in t
    for steps in (8000, 32000):
        assert f"{steps:,} are {main['compute_ratio'][f'128@{steps}']:.2f}×" in t
    experts_params, big = CLUSTERS * params(16, PER_CLUSTER), params(768, COMPONENTS)
    assert f"768 units: {big:,} parameters, about the eight experts' {experts_params:,} together" in t
    assert abs(big / experts_params - 1) < 0.05


def _weighted(r: dict, who: str) -> float:
    w = experts()["cluster_weights"]
    return sum(w[k] * r["per_cluster"][k][who] for k in w)


def _sides(entry: dict, n: int, x: float, steps: int) -> tuple[list[float], list[float]]:
    """The monolith's weighted excess per training and the experts' (16 units, 2,000 steps) at the same t."""
    mono = [_weighted(r, "monolith") for r in entry["records"] if (r["features"], r["t"], r["steps"]) == (n, x, steps)]
    exp = [_weighted(r, "expert") for r in experts()["records"] if (r["features"], r["t"], r["steps"]) == (16, x, 2000)]
    return mono, exp


def _ratio(entry: dict, n: int, x: float, steps: int) -> tuple[float, float, float]:
    """The ratio of the means and its least and greatest over every pair of trainings."""
    mono, exp = _sides(entry, n, x, steps)
    pairs = [m / e for m in mono for e in exp]
    return sum(mono) / len(mono) / (sum(exp) / len(exp)), min(pairs), max(pairs)


def test_the_table_and_its_reading_are_the_records():
    s, t, raw = store(), text(), doc_claims.raw_passage(START, WIDER)
    main = s["clu-r8-every"]
    for name, e in s.items():  # every committed summary is its records'
        summary = summarise(e, doc_claims.load("gmm_trained_floor.json")[e["setting"]["experts"]])
        assert doc_claims.load(f"gmm_equal_compute-{name}.json") == summary, name
        assert (doc_claims.RESULTS / f"gmm_equal_compute-{name}.md").read_text() == render(e, summary), name
    md = (doc_claims.RESULTS / "gmm_equal_compute-clu-r8-every.md").read_text()
    header = "| N | t | steps | compute / experts' |"
    assert doc_claims.md_table(raw, header) == doc_claims.md_table(md, header)  # the doc's table is the summary's
    verdicts = {
        (r["features"], r["t"], r["steps"]): r["below_in_every_pair_with_2se"]
        for r in summarise(main, experts())["rows"]
    }
    assert len(verdicts) == len(MAIN) + len(WIDTHS) + len(LONGER[256]) + 2  # 2.80× at t = 0.1, 7.86× at t = 0.5
    rest = {v for (n, x, steps), v in verdicts.items() if steps not in (*LONGER.get(n, ()), EVEN[1])}
    assert rest == {"experts below"}
    short, long = LONGER[256]
    assert (verdicts[256, 0.1, short], verdicts[256, 0.1, long]) == (
        "neither",
        "monolith below",
    )  # the next paragraph's
    assert "the 21,508-step row's trainings 1 and 2: **Equal width at every compute**, below)" in t
    assert (
        "at 10⁻², over three trainings at 43,016 steps and in training 0 at 21,508 (trainings 1 and 2 there are the "
        "next paragraph's;"
    ) in wider()
    assert (
        "138 min summed; its 15,311-step row and the 5,475-step row's trainings 1 and 2 at t = 0.5 are the next "
        "paragraph's)"
    ) in wider()
    assert {r["commit"] for r in main["records"] if (r["steps"], r["training"]) in ((short, 1), (short, 2))} == {NEW}
    # the reading, recomputed from the records without the summary
    at = {(n, x, steps): _ratio(main, n, x, steps) for n, x, steps in MAIN | {(n, 0.1, st) for n, st in WIDTHS.items()}}
    mean, lo, hi = at[128, 0.1, 8000]
    assert f"by {mean:.2f}× at t = 0.1 ({lo:.2f}–{hi:.2f} over the pairs)" in t
    rest = [at[128, x, 8000] for x in (0.3, 0.5, 0.7, 0.9)]
    low, high, worst = min(r[0] for r in rest), max(r[0] for r in rest), min(r[1] for r in rest)
    assert f"by {low:.3g}× to {high:.3g}× at the other t ({worst:.3g}× or more in every pair)" in t
    quarter = [at[128, x, 2000][0] for x in (0.1, 0.3, 0.5, 0.7, 0.9)]
    assert f"At a quarter of the compute (equal steps) by {min(quarter):.3g}× to {max(quarter):.3g}×" in t
    for x, words in ((0.1, "from 8,000 at t = 0.1"), (0.5, "at t = 0.5 (per")):
        before, after = _sides(main, 128, x, 8000)[0], _sides(main, 128, x, 32000)[0]
        falls = [100 * (1 - b / a) for a, b in zip(before, after)]  # the same training: the same start and draws
        assert f"by {min(falls):.0f}–{max(falls):.0f} % {words}" in t and min(falls) > 0
    (m1, lo1, hi1), (m5, _, _) = at[128, 0.1, 32000], at[128, 0.5, 32000]
    assert f"still {m1:.1f}× the experts at t = 0.1 ({lo1:.2f}–{hi1:.2f}) and {m5:.1f}× at t = 0.5" in t
    late = [r for r in main["records"] if (r["features"], r["t"], r["steps"]) == (128, 0.1, 32000)]
    loss = sum(r["training_loss"] for r in late) / len(late)
    assert f"its training loss is {loss / main['width_floor']['128@0.1']:.1f}× its width floor at t = 0.1" in t
    widths = {n: at[n, 0.1, st] for n, st in WIDTHS.items()} | {128: at[128, 0.1, 8000]}
    assert (
        f"{widths[64][0]:.3g}× the experts at 64 units, {widths[128][0]:.3g}× at 128, {widths[256][0]:.3g}× at 256 "
        f"({widths[256][1]:.2f}–{widths[256][2]:.2f}), {widths[512][0]:.3g}× at 512 and {widths[768][0]:.3g}× at 768"
    ) in t
    assert "(at 10⁻² here; 256 and 512 units at other learning rates below)" in t
    assert {r["features"] for r in main["records"] if r["features"] != 128} == set(WIDTHS)  # at the setting's lr
    assert (main["setting"]["lr"], main["setting"]["batch"]) == (1e-2, 512) and "Adam at 10⁻²" in t and "batch 512" in t
    own = {}  # the experts' weighted excess over their weighted width floor, by t
    for ours in floor_summary(experts())["rows"]:
        if ours["features"] == 16:
            own[ours["t"]] = ours["every_component"]["expert"]["mean"] / ours["width_floor"]["experts_weighted"]
    assert f"they lie {100 * (own[0.1] - 1):.1f} % above their own floor at t = 0.1" in t
    later = [own[x] for x in (0.5, 0.7, 0.9)]
    assert (
        f"from t = 0.3 on they lie further above it ({100 * (own[0.3] - 1):.0f} % at 0.3, {min(later):.1f}× to "
        f"{max(later):.0f}× at t ≥ 0.5, above)"
    ) in t
    # the In-short paragraph and the Not-shown item
    import re

    from .test_results_claims import paragraph

    p, more = paragraph(), main["compute_ratio"]["128@32000"]
    fast = store()["clu-r8-every-lr3e-2"]
    assert (
        f"At {main['compute_ratio']['128@8000']:.2f}× the experts' training compute (multiply-adds) and at their "
        "learning rate (10⁻²), the eight experts are below one trained monolith as wide as all eight together "
        "(128 units, 8,000 steps) at each of the five t, in every pair of three trainings each: the ratio of the "
        f"means is {mean:.2f}× at t = 0.1 and {low:.3g}× or more at the other t; at 3·10⁻², the best of four "
        f"learning rates tried at one point, it is {_ratio(fast, 128, 0.1, 8000)[0]:.3g}× at t = 0.1. At t = 0.1 "
        "they are also below monoliths of 64, 256, 512 and 768 units at equal compute (at 10⁻²)"
    ) in p
    assert (
        f"with {more:.2f}× the compute the 128-unit monolith is still {m1:.1f}× the experts at t = 0.1 "
        f"({_ratio(fast, 128, 0.1, 32000)[0]:.3g}× at 3·10⁻², and"
    ) in p
    folded = re.sub(r"\s+", " ", doc_claims.DOC.read_text())
    longest = fast["compute_ratio"]["128@64000"]
    assert (
        f"the 128-unit equal-compute monolith at convergence (at {more:.2f}× the experts' compute it still falls at 10⁻²; at "
        f"3·10⁻² it is no lower at {longest:.2f}× than at {more:.2f}×)"
    ) in folded
    assert f"at 3·10⁻², and {_ratio(fast, 128, 0.1, 64000)[0]:.3g}× with {longest:.2f}× the compute)" in p
    evaluation = re.sub(r"\s+", " ", (doc_claims.DOC.parent / "evaluation.md").read_text())
    assert "`2·d·N + 3·(d + C + N)·d` for a network of N units serving C captions" in evaluation
    assert all(macs(n, c) == 2 * D * n + 3 * (D + c + n) * D for n in (0, 16, 768) for c in (1, 4, 32))


def test_the_learning_rates_are_the_records():
    s, t = store(), text()
    one = {  # training 0 at 128 units, t = 0.1, 8,000 steps, by learning rate
        lr: next(
            _weighted(r, "monolith")
            for r in s[name]["records"]
            if (r["features"], r["t"], r["steps"], r["training"]) == (128, 0.1, 8000, 0)
        )
        for lr, name in (
            ("3·10⁻³", "clu-r8-every-lr3e-3"),
            ("10⁻²", "clu-r8-every"),
            ("3·10⁻²", "clu-r8-every-lr3e-2"),
            ("10⁻¹", "clu-r8-every-lr1e-1"),
        )
    }
    listed = ", ".join(f"{1e3 * v:.3g} at {lr}" for lr, v in list(one.items())[:-1])
    assert f"×10⁻³, {listed} and {1e3 * one['10⁻¹']:.3g} at 10⁻¹" in t
    assert min(one, key=one.get) == "3·10⁻²" and "At 3·10⁻², the best of the four" in t
    fast = s["clu-r8-every-lr3e-2"]
    rows = {(r["t"], r["steps"]): r for r in summarise(fast, experts())["rows"] if r["features"] == 128}
    assert {r["below_in_every_pair_with_2se"] for r in rows.values()} == {"experts below"}
    for steps, words in ((8000, "over three trainings it is"), (32000, "(three trainings)")):
        r = rows[0.1, steps]
        mean, lo, hi = _ratio(fast, 128, 0.1, steps)
        cell = f"{1e3 * r['monolith']['mean']:.3g} ± {1e3 * r['monolith']['half']:.2g}"
        assert f"{words} {cell}, {mean:.3g}× the experts ({lo:.2f}–{hi:.2f}" in t, steps
        assert r["trainings"] == [0, 1, 2]
    (half,) = [r for r in fast["records"] if (r["features"], r["t"]) == (128, 0.5)]
    base = next(
        r
        for r in store()["clu-r8-every"]["records"]
        if (r["features"], r["t"], r["steps"], r["training"]) == (128, 0.5, 8000, 0)
    )
    mean, _, _ = _ratio({"records": [half]}, 128, 0.5, 8000)
    assert (
        f"at t = 0.5 (training 0) {1e3 * _weighted(half, 'monolith'):.3g} against "
        f"{1e3 * _weighted(base, 'monolith'):.3g} at 10⁻², still {mean:.3g}× the experts"
    ) in t
    r = rows[0.1, 64000]
    mean, lo, hi = _ratio(fast, 128, 0.1, 64000)
    assert (
        f"At 64,000 steps ({r['compute_ratio']:.2f}× the experts' compute; three trainings in three processes side "
        f"by side, their records naming 440e0fe with nothing uncommitted) it is no lower: {1e3 * r['monolith']['mean']:.3g} "
        f"± {1e3 * r['monolith']['half']:.2g}, {mean:.3g}× the experts ({lo:.2f}–{hi:.2f})"
    ) in t
    assert r["monolith"]["mean"] >= rows[0.1, 32000]["monolith"]["mean"] and r["trainings"] == [0, 1, 2]
    slow = _sides(store()["clu-r8-every"], 128, 0.1, 32000)[0]
    quick = _sides(fast, 128, 0.1, 32000)[0]
    assert abs(sum(quick) / sum(slow) - 1) < 0.05  # "about where 10⁻² is at 32,000 steps"


def test_wider_and_with_more_compute_is_the_records():
    import re

    from .test_results_claims import paragraph

    s, t, raw = store(), wider(), doc_claims.raw_passage(WIDER, END)
    main, fast = s["clu-r8-every"], s["clu-r8-every-lr3e-2"]
    summary = doc_claims.load("gmm_equal_compute-clu-r8-every-lr3e-2.json")
    md = (doc_claims.RESULTS / "gmm_equal_compute-clu-r8-every-lr3e-2.md").read_text()
    header = "| N | t | steps | compute / experts' |"
    assert doc_claims.md_table(raw, header) == doc_claims.md_table(md, header)  # the doc's table is the summary's

    def first(name: str, n: int, steps: int) -> float:  # training 0 at t = 0.1, ×10⁻³
        (r,) = [
            r for r in s[name]["records"] if (r["features"], r["t"], r["steps"], r["training"]) == (n, 0.1, steps, 0)
        ]
        return 1e3 * _weighted(r, "monolith")

    names = {"3·10⁻³": "clu-r8-every-lr3e-3", "10⁻²": "clu-r8-every", "3·10⁻²": "clu-r8-every-lr3e-2"}
    names["10⁻¹"] = "clu-r8-every-lr1e-1"
    at256 = {lr: first(name, 256, WIDTHS[256]) for lr, name in names.items() if lr != "3·10⁻³"}
    at512 = {lr: first(name, 512, WIDTHS[512]) for lr, name in names.items()}
    assert min(at256, key=at256.get) == "3·10⁻²" and "at 3·10⁻², the best of three at equal compute (picked on" in t
    assert "training 0, reported over trainings 0–2, training 0 included)" in t
    listed = ", ".join(f"{v:.3g} at {lr}" for lr, v in list(at256.items())[:-1])
    assert f"the learning rate gives ×10⁻³ {listed} and {at256['10⁻¹']:.3g} at 10⁻¹" in t
    listed = ", ".join(f"{v:.3g} at {lr}" for lr, v in list(at512.items())[:-1])
    assert f"at 512 units (3,307 steps) {listed} and {at512['10⁻¹']:.3g} at 10⁻¹" in t
    # every monolith at equal compute (≤ 1.00×), every width and learning rate: the experts below
    sixteen = [e for e in s.values() if e["setting"]["experts"] == "clu-r8-every"]  # against the 16-unit experts
    level = [r for e in sixteen for r in summarise(e, experts())["rows"] if r["compute_ratio"] < 1.001]
    assert len(level) >= 15 and {r["below_in_every_pair_with_2se"] for r in level} == {"experts below"}
    assert "than their compute (every width and learning rate tried at equal compute leaves the experts below)" in raw
    # the budgets: as much compute as the 128-unit monolith's 32,000 and 64,000 steps
    short, long = LONGER[256]
    ratios = [f"{main['compute_ratio'][f'256@{steps}']:.2f}" for steps in LONGER[256]]
    for steps, longer in zip((32000, 64000), LONGER[256]):
        assert longer == round(steps * macs(128, COMPONENTS) / macs(256, COMPONENTS))
        assert fast["compute_ratio"][f"256@{longer}"] == main["compute_ratio"][f"256@{longer}"]
    assert ratios == ["3.93", "7.86"]
    assert (
        f"trained with {ratios[0]}× and {ratios[1]}× the experts' compute ({short:,} and {long:,} steps, as much as "
        "the 128-unit monolith's 32,000 and 64,000)"
    ) in t
    # the commands: every record of the paragraph is one a command it names trains
    assert (
        f"`--features 256 --times 0.1 --steps {WIDTHS[256]} {short} {long} --training 0 1 2 --lr 3e-2 --name "
        f"clu-r8-every-lr3e-2`, the same at `--times 0.5` with `--steps {short}` and with `--steps {WIDTHS[256]} "
        f"--training 0`, `--features 256 --times 0.1 --steps {long} --training 0 1 2 --name clu-r8-every` and the "
        f"same with `--steps {short} --training 0`"
    ) in t
    # provenance: every record of the paragraph names the same clean commit, one torch thread
    newest = [r for e in s.values() for r in e["records"] if r["commit"] == LATEST and "adopted_from" not in r]
    assert all(r["uncommitted"] == [] and r["torch_threads"] == 1 for r in newest)
    assert f"{len(newest)} records naming {LATEST} with nothing uncommitted" in t and "one torch thread each" in t
    assert f"{sum(r['seconds'] for r in newest) / 60:.0f} min summed" in t
    assert {(r["features"], r["steps"]) for r in newest} == {(256, 5475), (512, 3307), (256, short), (256, long)}
    # the reading, recomputed from the records
    rows = {(r["features"], r["t"], r["steps"]): r for r in summarise(fast, experts())["rows"]}
    assert summary["rows"] == list(rows.values())
    tie, worse = rows[256, 0.1, short], rows[256, 0.1, long]
    mean, lo, hi = _ratio(fast, 256, 0.1, short)
    assert tie["below_in_every_pair_with_2se"] == "neither" and lo < 1 < hi and tie["trainings"] == [0, 1, 2]
    assert f"not told apart from them with 3.93× their compute ({mean:.3g}×, {lo:.3g}–{hi:.3g} over the pairs," in t
    m28, lo28, hi28 = _ratio(fast, 256, 0.1, EVEN[1])
    assert rows[256, 0.1, EVEN[1]]["below_in_every_pair_with_2se"] == "neither" and lo28 < 1 and m28 < 1
    assert f"neither side below in every pair; with 2.80×, {m28:.3g}×, {lo28:.3g}–{hi28:.3g}, neither either)" in t
    assert worse["below_in_every_pair_with_2se"] == "experts below" and worse["ratio_of_means"] > tie["ratio_of_means"]
    assert f"above them again with 7.86× ({_ratio(fast, 256, 0.1, long)[0]:.3g}×" in t
    by = {
        (r["steps"], r["training"]): _weighted(r, "monolith")
        for r in fast["records"]
        if (r["features"], r["t"]) == (256, 0.1)
    }
    assert all(by[long, i] > by[short, i] for i in range(3))  # paired by training
    assert "ends higher, in each of the three trainings" in t
    narrow = _sides(fast, 128, 0.1, 64000)[0], _sides(fast, 128, 0.1, 32000)[0]
    assert sum(narrow[0]) >= sum(narrow[1]) and "at 128 units it ends no lower" in t
    slow = {(r["features"], r["t"], r["steps"]): r for r in summarise(main, experts())["rows"]}
    assert slow[256, 0.1, short]["trainings"] == slow[256, 0.1, long]["trainings"] == [0, 1, 2]
    one, one_lo, one_hi = _ratio(main, 256, 0.1, short)
    m, lo, hi = _ratio(main, 256, 0.1, long)
    cell = (
        f"{1e3 * slow[256, 0.1, long]['monolith']['mean']:.4g} ± {1e3 * slow[256, 0.1, long]['monolith']['half']:.2g}"
    )
    assert (
        f"At 10⁻² it is below them with 7.86× their compute in every pair of three trainings ({cell}, {m:.3g}×, {lo:.3g}–{hi:.3g})"
        in t
    )
    assert slow[256, 0.1, long]["below_in_every_pair_with_2se"] == "monolith below" and one < 1
    assert slow[256, 0.1, short]["below_in_every_pair_with_2se"] == "neither"
    assert (
        f"with 3.93× at 10⁻² it is {one:.3g}× them over three trainings ({one_lo:.3g}–{one_hi:.3g} over the pairs), not "
        "below them in every pair with two standard errors"
    ) in t
    assert "and no more than 7.86× of it" in t
    own = {r["features"]: r for r in floor_summary(experts())["rows"] if r["t"] == 0.1}
    floor16 = own[16]["width_floor"]["experts_weighted"]
    worst = max(_sides(main, 256, 0.1, long)[0])
    assert (
        worst < floor16
        and f"below even the 16-unit experts' width floor ({1e3 * floor16:.4g}), which eight 16-unit" in t
    )

    # the better rate at 256 units by budget, paired by training (a training index seeds both rates' start and draws)
    def lower(steps: int) -> set:  # which rate is lower, per training
        by_rate = {rate: _sides(e, 256, 0.1, steps)[0] for rate, e in (("10⁻²", main), ("3·10⁻²", fast))}
        return {min(by_rate, key=lambda rate: by_rate[rate][i]) for i in range(3)}

    assert [lower(steps) for steps in (WIDTHS[256], EVEN[1], short, long)] == [
        {"3·10⁻²"},
        {"3·10⁻²"},
        {"10⁻²", "3·10⁻²"},
        {"10⁻²"},
    ]
    assert (
        "which of the two rates is the better with more compute depends on the budget: 3·10⁻², the better at equal "
        "compute, at 2.80× too, 10⁻² at 7.86× (each in each of three trainings), and neither in every training at 3.93×"
    ) in t
    half = rows[256, 0.5, short]
    mean5, lo5, hi5 = _ratio(fast, 256, 0.5, short)
    assert half["below_in_every_pair_with_2se"] == "experts below" and half["trainings"] == [0, 1, 2]
    slow5 = _ratio(s["clu-r8-every-256-equal-t0.5"], 256, 0.5, short)  # the same monolith at 10⁻², run later
    mono5 = [
        floor.weighted(r["per_cluster"], "monolith", experts()["cluster_weights"])
        for r in s["clu-r8-every-256-equal-t0.5"]["records"]
        if (r["t"], r["steps"]) == (0.5, short)
    ]
    exp5 = [
        floor.weighted(r["per_cluster"], "expert", experts()["cluster_weights"])
        for r in experts()["records"]
        if (r["features"], r["t"], r["steps"]) == (16, 0.5, 2000)
    ]
    assert len(mono5) == len(exp5) == 3 and below(mono5, exp5) == "monolith below"  # recomputed, 2 SE
    assert (
        f"At t = 0.5 the 256-unit monolith with 3.93× their compute is {mean5:.3g}× the experts at 3·10⁻² "
        f"({lo5:.3g}–{hi5:.3g} over the pairs), but at 10⁻², run later (**Both sides' learning rates**, below), it is "
        f"below them, {slow5[0]:.3g}× ({slow5[1]:.3g}–{slow5[2]:.3g} over the pairs), in every pair with two standard "
        "errors: at t = 0.5 it needs no more than 3.93× their compute"
    ) in t
    at_half = [n for n in names.values() if any((q["features"], q["t"]) == (256, 0.5) for q in s[n]["records"])]
    assert {s[n]["setting"]["lr"] for n in at_half} == {1e-2, 3e-2}  # 10⁻² at 7.86× only: the next sentence
    long5 = _ratio(main, 256, 0.5, LONGER[256][1])
    low = s["clu-r8-every-256-t0.5-lr3e-3-equal-lr3e-3"]  # the same budget at 3·10⁻³
    slow3 = _ratio(low, 256, 0.5, LONGER[256][1])
    mono3 = [
        floor.weighted(r["per_cluster"], "monolith", experts()["cluster_weights"])
        for r in low["records"]
        if (r["t"], r["steps"]) == (0.5, LONGER[256][1])
    ]
    assert len(mono3) == 3 and below(mono3, exp5) == "monolith below"  # against the 16-unit experts, 2 SE
    mains = {(r["features"], r["t"], r["steps"]): r for r in summarise(main, experts())["rows"]}
    assert mains[256, 0.5, LONGER[256][1]]["below_in_every_pair_with_2se"] == "neither"
    other = {lr: s[f"clu-r8-every-256-t0.5-lr3e-3-equal-lr{lr}"] for lr in ("1e-3", "5e-3")}  # the same budget
    verdict = {
        lr: below(
            [
                floor.weighted(r["per_cluster"], "monolith", experts()["cluster_weights"])
                for r in e["records"]
                if (r["t"], r["steps"]) == (0.5, LONGER[256][1])
            ],
            exp5,
        )
        for lr, e in other.items()
    }
    assert verdict == {"1e-3": "experts below", "5e-3": "monolith below"}
    at1, at5 = (_ratio(other[lr], 256, 0.5, LONGER[256][1]) for lr in ("1e-3", "5e-3"))
    assert (
        f"With 7.86× it is below them at 3·10⁻³ and 5·10⁻³, {slow3[0]:.3g}× ({slow3[1]:.3g}–{slow3[2]:.3g} over the "
        f"pairs) and {at5[0]:.3g}× ({at5[1]:.3g}–{at5[2]:.3g}), in every pair with two standard errors; at 10⁻² it is "
        f"{long5[0]:.3g}× them ({long5[1]:.3g}–{long5[2]:.3g}), neither below the other in every pair; and at 10⁻³ it is "
        f"above them, {at1[0]:.3g}× ({at1[1]:.3g}–{at1[2]:.3g}), in every pair with two standard errors (**Both sides' "
        "learning rates**, below)."
    ) in t
    # wider experts on every cluster: 16 and 32 units (the five-t entry), 64 and 256 units (their own entries)
    floors = doc_claims.load("gmm_trained_floor.json")
    wide = floors["clu-r8-every-64"]
    own_entries = {16: experts(), 32: experts(), 64: wide, 256: floors["clu-r8-every-256"]}
    for n in (64, 256):
        e = own_entries[n]
        assert e["setting"] == experts()["setting"] and e["cluster_weights"] == experts()["cluster_weights"]
        assert sorted(
            (r["features"], r["t"], r["steps"], r["training"]) for r in e["records"] if r["steps"] == 2000
        ) == [
            (n, 0.1, 2000, i) for i in range(3)
        ]  # the 256-unit entry's other budgets: the next paragraph's (tests/test_results_equal_width_claims.py)
        assert e["meta"]["command"].endswith(
            f"--features {n} --times 0.1 --steps {'2000' if n == 64 else '715 2000 2809 5619'} --training 0 1 2 "
            f"--lr 1e-2 --name clu-r8-every-{n}"
        )
        assert doc_claims.load(f"gmm_trained_floor-clu-r8-every-{n}.json") == floor_summary(e)
        assert (doc_claims.RESULTS / f"gmm_trained_floor-clu-r8-every-{n}.md").read_text() == render_floor(
            e, floor_summary(e)
        )
        assert f"`--features {n} --name clu-r8-every-{n}`" in t
    stamps = {
        n: {
            (r["commit"], tuple(r["uncommitted"]), r["torch_threads"])
            for r in own_entries[n]["records"]
            if r["steps"] == 2000
        }
        for n in (64, 256)
    }
    assert stamps == {64: {("9ecba8f", (), 1)}, 256: {("ee975fa", (), 1)}}
    minutes = [
        f"{sum(r['seconds'] for r in own_entries[n]['records'] if r['steps'] == 2000) / 60:.0f}" for n in (64, 256)
    ]
    assert (
        f"{minutes[0]} and {minutes[1]} min summed, their records naming 9ecba8f and ee975fa with nothing uncommitted"
        in t
    )
    table = [
        ["experts", "compute / 16-unit experts'", "weighted excess, three trainings", "their width floor, weighted"]
    ]
    values = {}
    for n in (16, 32, 64, 256):
        (row,) = [
            r
            for r in floor_summary(own_entries[n])["rows"]
            if (r["features"], r["t"], r["steps"]) == (n, 0.1, 2000) and "every_component" in r
        ]
        x, f = row["every_component"]["expert"], row["width_floor"]["experts_weighted"]
        assert x["n"] == 3
        values[n] = [
            floor.weighted(r["per_cluster"], "expert", wide["cluster_weights"])
            for r in own_entries[n]["records"]
            if (r["features"], r["t"], r["steps"]) == (n, 0.1, 2000)
        ]
        table.append(
            [
                f"{n} units",
                f"{macs(n, PER_CLUSTER) / macs(16, PER_CLUSTER):.2f}",
                f"{1e3 * x['mean']:.4g} ± {1e3 * x['half']:.2g}",
                f"{1e3 * f:.4g}",
            ]
        )
    assert doc_claims.md_table(raw, "| experts | compute / 16-unit experts' |") == table
    e64, e256 = values[64], values[256]

    def apart(ours: list, mono: list, sign: int) -> bool:  # experts below (sign 1) or above (-1) in every pair, 2 SE
        return below(mono, ours) == ("experts below" if sign > 0 else "monolith below")

    def mono(entry: dict, steps: int) -> list:
        return [
            floor.weighted(r["per_cluster"], "monolith", wide["cluster_weights"])
            for r in entry["records"]
            if (r["features"], r["t"], r["steps"]) == (256, 0.1, steps)
        ]

    assert apart(e64, mono(fast, short), 1) and apart(e64, mono(main, long), -1)
    assert below(mono(main, short), e64) == "neither"  # at 10⁻² and 3.93×, over three trainings
    assert apart(e64, mono(fast, long), 1)  # at 3·10⁻² the 7.86× monolith stays above them
    fast_short = (
        f"{1e3 * rows[256, 0.1, short]['monolith']['mean']:.4g} ± {1e3 * rows[256, 0.1, short]['monolith']['half']:.2g}"
    )
    fast_long = f"{1e3 * worse['monolith']['mean']:.4g} ± {1e3 * worse['monolith']['half']:.2g}"
    slow_short = (
        f"{1e3 * slow[256, 0.1, short]['monolith']['mean']:.4g} ± {1e3 * slow[256, 0.1, short]['monolith']['half']:.2g}"
    )
    assert (
        "The 64-unit experts are below the 256-unit monolith with 3.93× the 16-unit experts' compute at 3·10⁻² "
        f"({fast_short}) and, at 10⁻², above it with 7.86× ({cell}; at 3·10⁻² the 7.86× monolith stays above them, "
        f"{fast_long})."
    ) in t
    assert (f"at 3.93× and 10⁻² ({slow_short}) the 64-unit experts and the monolith are not told apart.") in t
    every = [  # every monolith at t = 0.1, any width, rate and compute
        floor.weighted(r["per_cluster"], "monolith", wide["cluster_weights"])
        for name, e in s.items()
        for r in e["records"]
        if r["t"] == 0.1 and "adopted_from" not in r  # each record once
    ]
    assert len(every) >= 50 and apart(e256, every, 1)
    ratio256 = (
        slow[256, 0.1, long]["monolith"]["mean"]
        / next(r for r in floor_summary(own_entries[256])["rows"] if r["steps"] == 2000)["every_component"]["expert"][
            "mean"
        ]
    )
    assert (
        f"The 256-unit experts, with {macs(256, PER_CLUSTER) / macs(16, PER_CLUSTER):.2f}× the compute, are below every "
        f"monolith measured at t = 0.1, at any compute: below the 7.86× one at 10⁻² by {ratio256:.2f}×. Each of these comparisons "
        "holds in every pair of trainings even with two standard errors moved towards the other;"
    ) in t
    even = mono(main, EVEN[1])
    records = [r for r in main["records"] if (r["features"], r["t"], r["steps"]) == (256, 0.1, EVEN[1])]
    assert len(even) == 3 and {(r["commit"], tuple(r["uncommitted"]), r["torch_threads"]) for r in records} == {
        (EVEN[0], (), 1)
    }
    assert (
        f"{main['compute_ratio'][f'256@{EVEN[1]}']:.2f}"
        == f"{macs(256, PER_CLUSTER) / macs(16, PER_CLUSTER):.2f}"
        == "2.80"
    )
    assert apart(e256, even, 1)
    pairs = [m / e for m, _ in even for e, _ in e256]
    m280 = slow[256, 0.1, EVEN[1]]["monolith"]
    r280 = m280["mean"] / (sum(e for e, _ in e256) / 3)
    assert (
        f"At one and the same compute, 2.80×, the 256-unit monolith at 10⁻² ({EVEN[1]:,} steps, three trainings: "
        f"`--features 256 --times 0.1 --steps {EVEN[1]} --training 0 1 2 --name clu-r8-every`, its records naming "
        f"{EVEN[0]} with nothing uncommitted, made 2026-12-07, in the table above) is at {1e3 * m280['mean']:.4g} ± {1e3 * m280['half']:.2g}, "
        f"the 256-unit experts below it by {r280:.3g}× ({min(pairs):.2f}–{max(pairs):.2f} over the pairs), in every pair "
        "with two standard errors."
    ) in t
    assert (
        "So at t = 0.1 past equal compute the outcome depends on the experts' width: at 10⁻² the monolith passes the "
        "16- and 64-unit experts with 7.86× their compute, and not the 256-unit ones, which have 2.80×; at 2.80× each, "
        "the 256-unit experts are below the 256-unit monolith."
    ) in t
    assert apart(values[16], mono(main, long), -1) and not apart(e256, mono(main, long), -1)
    # the In-short sentences and the Not-shown item
    p = paragraph()
    assert (
        f"with 7.86× (at 10⁻²) it is {m:.3g}× the experts, below them in every pair of three trainings and below even "
        f"their width floor, and with 3.93× (at 3·10⁻²) neither side is below in every pair ({_ratio(fast, 256, 0.1, short)[0]:.3g}×); "
        "so there the monolith needs more than these experts' compute to reach them (at every width and learning rate "
        "tried) but no more than 7.86× of it."
    ) in p
    assert (
        f"At t = 0.5, with 3.93× the compute, it is {mean5:.3g}× the experts at 3·10⁻² but below them at 10⁻² "
        f"({slow5[0]:.3g}×, in every pair of three trainings)." in p
    )
    assert (
        f"Wider experts move down too (at t = 0.1): the 64-unit experts of every cluster ({macs(64, PER_CLUSTER) / macs(16, PER_CLUSTER):.2f}× "
        "the 16-unit ones' compute) are below the 3.93× monolith at 3·10⁻² (not told apart from it at 10⁻²) but above "
        "the 7.86× one at 10⁻², and the 256-unit "
        f"experts of every cluster ({macs(256, PER_CLUSTER) / macs(16, PER_CLUSTER):.2f}×) are below every monolith "
        f"measured, the 7.86× one by {ratio256:.2f}×."
    ) in p
    folded = re.sub(r"\s+", " ", doc_claims.DOC.read_text())
    assert (
        "three or four rates at each of the four equal-width budgets at t = 0.1 and the three at t = 0.5 (half decades, "
        "and 5·10⁻³ at t = 0.5), **Both sides' learning rates** above), "
        "and the experts of every cluster at a tuned learning rate but at 256 units (with a rate tried on either side "
        "of the best at 1.00×, t = 0.1 and 0.5, and at 3.93×, t = 0.5; at the other budgets the best is at the end of "
        "the rates tried, the smallest at t = 0.1 and the largest at 7.86× and t = 0.5, **Both sides' learning rates** "
        "above) or, but at "
        f"256 units, with more than {macs(256, PER_CLUSTER) / macs(16, PER_CLUSTER):.2f}× the 16-unit experts' compute, "
        "and the two sides at one and the same compute above 1× but at 256 units (t = 0.1, and t = 0.5 at 3.93× and "
        f"7.86×; at t = 0.1 and 10⁻² the 256-unit monolith with {ratios[1]}× the 16-unit experts' compute passes the 16- "
        "and 64-unit experts, and the 256-unit experts, with as much, are below it)"
    ) in folded
    assert (
        f"at 256 beyond 8,000 steps (the equal-compute bullet's 256-unit monolith runs to {long:,} steps at t = 0.1"
        in folded
    )
    tuned = {  # the points (N, steps; t = 0.1, training 0) where more than one learning rate was run
        point
        for point in {(r["features"], r["steps"]) for e in s.values() for r in e["records"]}
        if len(
            {
                e["setting"]["lr"]
                for e in s.values()
                if any((r["features"], r["steps"], r["t"], r["training"]) == (*point, 0.1, 0) for r in e["records"])
            }
        )
        > 1
    }
    assert tuned == {
        (128, 8000),
        (256, WIDTHS[256]),
        (512, WIDTHS[512]),
        (128, 32000),
        (256, EVEN[1]),
        (256, short),
        (256, long),
    }
    assert (
        "at a learning rate tuned at any point but three in training 0 and six over three trainings (128 units at "
        "8,000 steps, 256 and 512 units at equal compute; t = 0.1, training 0; two rates compared with more compute at "
        "128 units with 3.93×; at 256 units the monolith on a grid of three or four rates at each of the four "
        "equal-width budgets at t = 0.1 and the three at t = 0.5 (half decades, and 5·10⁻³ at t = 0.5), **Both sides' "
        "learning rates** above)"
    ) in folded
    assert (
        f"(the 256-unit rows at {EVEN[1]:,}, {short:,} and {long:,} steps: **Wider and with more compute**, below;"
        in (doc_claims.passage(START, WIDER))
    )
    assert "a monolith twice as wide does with more compute: below" in doc_claims.passage(START, WIDER)
