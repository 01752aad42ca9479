"""docs/results.md's "Equal width at every compute" against the committed records: the 256-unit experts of every cluster
(gmm_trained_floor.json) against the 256-unit monolith (gmm_equal_compute.json) at four budgets of one and the same
compute, each budget counted by hand in multiply-adds, each monolith record the one its own entry trained, the table
the committed summaries', which are the records' (recomputed), and each number of the reading the records'."""

from benchmarks import gmm_trained_floor as floor
from benchmarks.gmm_equal_compute import EQUAL, below, render, summarise

from . import doc_claims
from .test_results_equal_compute_claims import CLUSTERS, COMPONENTS, PER_CLUSTER, macs, params

START = "**Equal width at every compute.**"
END = "**Both sides' learning rates.**"
BUDGETS = {5475: 715, 15311: 2000, 21508: 2809, 43016: 5619}  # the monolith's steps: the experts' of its compute
ENTRIES = {
    "clu-r8-every-256-equal": (1e-2, "clu-r8-every"),
    "clu-r8-every-256-equal-lr3e-2": (3e-2, "clu-r8-every-lr3e-2"),
}
NEW = "79563b0"  # the commit the records trained for this paragraph name
HALF, HALF_EXPERTS = "clu-r8-every-256-equal-t0.5-lr3e-2", "clu-r8-every-256-t0.5"  # t = 0.5: two budgets, one rate
HALF_COMMIT = "bfd91a2"  # the commit the t = 0.5 records name


def text() -> str:
    return doc_claims.passage(START, END)


def experts() -> dict:
    return doc_claims.load("gmm_trained_floor.json")["clu-r8-every-256"]


def test_each_monolith_budget_has_the_experts_budget_of_its_compute_counted_by_hand():
    for s, se in BUDGETS.items():
        ratio = s * macs(256, COMPONENTS) / (se * CLUSTERS * macs(256, PER_CLUSTER))
        assert abs(ratio - 1) < 3e-4, (s, se, ratio)
        for other in (se - 1, se + 1):  # the nearest integer budget
            assert abs(s * macs(256, COMPONENTS) / (other * CLUSTERS * macs(256, PER_CLUSTER)) - 1) > abs(ratio - 1)
    store = doc_claims.load("gmm_equal_compute.json")
    for name, (lr, _) in ENTRIES.items():
        e = store[name]
        assert e["setting"] == {"experts": "clu-r8-every-256", "expert_features": 256, "expert_steps": EQUAL} | {
            k: v for k, v in experts()["setting"].items() if k != "clusters"
        } | {"lr": lr}
        assert e["expert_budget"] == {f"256@{s}": se for s, se in BUDGETS.items()}
        assert all(abs(r - 1) < 3e-4 for r in e["compute_ratio"].values()) and len(e["compute_ratio"]) == 4
    gaps = [abs(r - 1) for name in ENTRIES for r in store[name]["compute_ratio"].values()]
    assert (
        f"each of the 256-unit monolith's four budgets has the experts' budget of the same compute (to "
        f"{100 * max(gaps):.2f} %)"
    ) in text()
    against16 = [s * macs(256, COMPONENTS) / (2000 * CLUSTERS * macs(16, PER_CLUSTER)) for s in sorted(BUDGETS)]
    listed = ", ".join(f"{r:.2f}" for r in against16[:-1]) + f" and {against16[-1]:.2f}× the 16-unit experts'"
    assert f"(to {100 * max(gaps):.2f} %), {listed} (`--features 256" in text()
    steps = [f"{se:,}" for se in sorted(BUDGETS.values()) if se != 2000]
    assert f"The 256-unit experts were then trained for {steps[0]}, {steps[1]} and {steps[2]} steps as well" in text()


def test_every_monolith_is_adopted_from_the_entry_that_trained_it_and_the_experts_are_three_trainings_each():
    store = doc_claims.load("gmm_equal_compute.json")
    for name, (_, source) in ENTRIES.items():
        records = store[name]["records"]
        assert sorted((r["features"], r["t"], r["steps"], r["training"]) for r in records) == [
            (256, 0.1, s, i) for s in sorted(BUDGETS) for i in range(3)
        ]
        for r in records:
            assert r["adopted_from"] == source
            (own,) = [
                x
                for x in store[source]["records"]
                if (x["features"], x["t"], x["steps"], x["training"]) == (256, 0.1, r["steps"], r["training"])
            ]
            assert {k: v for k, v in r.items() if k != "adopted_from"} == own
    keys = sorted((r["features"], r["t"], r["steps"], r["training"]) for r in experts()["records"])
    assert keys == [(256, 0.1, s, i) for s in sorted(BUDGETS.values()) for i in range(3)]


def test_the_summaries_are_the_records_and_the_doc_table_is_the_summaries():
    store, raw = doc_claims.load("gmm_equal_compute.json"), doc_claims.raw_passage(START, END)
    rows = {}
    for name in ENTRIES:
        e = store[name]
        summary = summarise(e, experts())
        assert doc_claims.load(f"gmm_equal_compute-{name}.json") == summary
        assert (doc_claims.RESULTS / f"gmm_equal_compute-{name}.md").read_text() == render(e, summary)
        assert [r["steps"] for r in summary["rows"]] == sorted(BUDGETS)
        rows[name] = {r["steps"]: r for r in summary["rows"]}

    def cell(iv: dict) -> str:
        return f"{1e3 * iv['mean']:.4g} ± {1e3 * iv['half']:.2g}"

    def ratio(r: dict) -> str:
        return f"{r['ratio_of_means']:.3g} ({r['ratio_every_pair']['min']:.3g}–{r['ratio_every_pair']['max']:.3g})"

    slow, fast = (rows[name] for name in ENTRIES)
    expected = [
        [
            "compute / 16-unit experts'",
            "experts' steps",
            "256-unit experts",
            "monolith's steps",
            "monolith at 10⁻²",
            "monolith / experts (every pair)",
            "below in every pair, 2 SE",
            "monolith at 3·10⁻²",
            "monolith / experts (every pair)",
            "below in every pair, 2 SE",
        ]
    ]
    for s, se in BUDGETS.items():
        a, b = slow[s], fast[s]
        assert a["experts"] == b["experts"] and a["expert_steps"] == b["expert_steps"] == se
        expected.append(
            [
                f"{s * macs(256, COMPONENTS) / (2000 * CLUSTERS * macs(16, PER_CLUSTER)):.2f}",
                f"{se:,}",
                cell(a["experts"]),
                f"{s:,}",
                cell(a["monolith"]),
                ratio(a),
                a["below_in_every_pair_with_2se"],
                cell(b["monolith"]),
                ratio(b),
                b["below_in_every_pair_with_2se"],
            ]
        )
    assert doc_claims.md_table(raw, "| compute / 16-unit experts' | experts' steps |") == expected


def test_the_new_records_and_the_commands_are_the_ones_named():
    store, t = doc_claims.load("gmm_equal_compute.json"), text()
    new = [r for r in experts()["records"] if r["steps"] != 2000]
    new += [r for e in store.values() for r in e["records"] if r["commit"] == NEW and "adopted_from" not in r]
    assert len(new) == 9 + 5
    assert {(r["commit"], tuple(r["uncommitted"]), r["torch_threads"], r["date"]) for r in new} == {
        (NEW, (), 1, "2026-12-07")
    }
    assert (
        f"{len(new)} records naming {NEW} with nothing uncommitted, {sum(r['seconds'] for r in new) / 60:.0f} min "
        "summed, made 2026-12-07, at most two processes side by side with one torch thread each."
    ) in t
    assert (
        "`--features 256 --times 0.1 --steps 715 2000 2809 5619 --training 0 1 2 --lr 1e-2 --name clu-r8-every-256`: "
        "the experts at 10⁻², not tuned, the monolith at two rates)"
    ) in t
    assert experts()["setting"]["lr"] == 1e-2
    assert (
        "(`--features 256 --times 0.1 --steps 21508 --training 1 2 --name clu-r8-every` and `--features 256 --times "
        "0.1 --steps 15311 --training 0 1 2 --lr 3e-2 --name clu-r8-every-lr3e-2`, the first command's other options)"
    ) in t
    assert store["clu-r8-every"]["setting"]["lr"] == 1e-2 and store["clu-r8-every-lr3e-2"]["setting"]["lr"] == 3e-2
    assert (
        "its compute; it trains nothing, adopting each monolith record from the entry that trained it (summaries "
        "`gmm_equal_compute-clu-r8-every-256-equal.{md,json}` and "
        "`gmm_equal_compute-clu-r8-every-256-equal-lr3e-2.{md,json}`). "
        't = 0.1, ×10⁻³ per dimension, three trainings on each side, ± and "below" as above:'
    ) in t
    assert sorted(
        (name, r["steps"], r["training"])
        for name, e in store.items()
        for r in e["records"]
        if r["commit"] == NEW and "adopted_from" not in r
    ) == sorted(
        [("clu-r8-every", 21508, 1), ("clu-r8-every", 21508, 2)] + [("clu-r8-every-lr3e-2", 15311, i) for i in range(3)]
    )
    assert experts()["meta"]["command"].endswith(
        "--features 256 --times 0.1 --steps 715 2000 2809 5619 --training 0 1 2 --lr 1e-2 --name clu-r8-every-256"
    )
    for name, (lr, _) in ENTRIES.items():
        rate = "" if lr == 1e-2 else " --lr 3e-2"
        assert store[name]["meta"]["command"] == (
            "python -m benchmarks.gmm_equal_compute --experts clu-r8-every-256 --expert-features 256 --equal-compute "
            f"--features 256 --times 0.1 --steps 5475 15311 21508 43016 --training 0 1 2{rate} --name {name}"
        )
    assert (
        "`python -m benchmarks.gmm_equal_compute --experts clu-r8-every-256 --expert-features 256 --equal-compute "
        "--features 256 --times 0.1 --steps 5475 15311 21508 43016 --training 0 1 2 --name clu-r8-every-256-equal` "
        "(and the same with `--lr 3e-2 --name clu-r8-every-256-equal-lr3e-2`)"
    ) in t


def test_the_reading_is_the_records():
    store, t = doc_claims.load("gmm_equal_compute.json"), text()
    weights = experts()["cluster_weights"]
    rows = {name: {r["steps"]: r for r in summarise(store[name], experts())["rows"]} for name in ENTRIES}
    every = [r for by in rows.values() for r in by.values()]
    assert len(every) == 8 and {r["below_in_every_pair_with_2se"] for r in every} == {"experts below"}
    for name in ENTRIES:  # the verdict recomputed from the records, not read from the summary
        for s in BUDGETS:
            mono = [
                floor.weighted(x["per_cluster"], "monolith", weights) for x in store[name]["records"] if x["steps"] == s
            ]
            own = [
                floor.weighted(x["per_cluster"], "expert", weights)
                for x in experts()["records"]
                if x["steps"] == BUDGETS[s]
            ]
            assert below(mono, own) == "experts below" and len(mono) == len(own) == 3
    means = [r["ratio_of_means"] for r in every]
    least = min(r["ratio_every_pair"]["min"] for r in every)
    assert (
        "At equal width and one and the same compute the experts are below the monolith at every budget and at both of "
        f"its rates, in every pair of trainings with two standard errors: by {min(means):.3g}× to {max(means):.3g}× "
        f"({least:.3g}× or more in every pair);"
    ) in t
    better = [min(by[s]["ratio_of_means"] for by in rows.values()) for s in sorted(BUDGETS)]
    listed = ", ".join(f"{r:.3g}×" for r in better[:-1]) + f" and {better[-1]:.3g}×"
    assert f"against the better of the two rates at each budget by {listed}." in t
    slow, fast = ([by[s]["ratio_of_means"] for s in sorted(BUDGETS)] for by in rows.values())
    assert slow == sorted(slow) and fast == sorted(fast)  # growing with the compute at each rate
    assert (
        f"The ratio grows with the compute at each rate, from {slow[0]:.3g}× to {slow[-1]:.3g}× at 10⁻² and from "
        f"{fast[0]:.3g}× to {fast[-1]:.3g}× at 3·10⁻²"
    ) in t
    first, last = min(BUDGETS), max(BUDGETS)
    a, b = rows["clu-r8-every-256-equal"], rows["clu-r8-every-256-equal-lr3e-2"]
    fall = [
        x[first][who]["mean"] / x[last][who]["mean"] for x, who in ((a, "experts"), (a, "monolith"), (b, "monolith"))
    ]
    assert f"the experts' excess falls {fall[0]:.2f}× and the monolith's {fall[1]:.2f}× at 10⁻²;" in t
    at_fast = [b[s]["monolith"]["mean"] for s in sorted(BUDGETS)]
    assert min(at_fast) == at_fast[1] and at_fast[1] < at_fast[2] < at_fast[3]  # lowest at 2.80×, rising after
    two, eight = b[15311], b[43016]  # 2.80× and 7.86× at 3·10⁻²: the ratio's growth, the experts' and monolith's part
    grow = eight["ratio_of_means"] / two["ratio_of_means"]
    ours = two["experts"]["mean"] / eight["experts"]["mean"]
    theirs = eight["monolith"]["mean"] / two["monolith"]["mean"]
    assert abs(grow - ours * theirs) < 1e-12 and theirs > 1
    assert (
        f"at 3·10⁻² the monolith is lowest at 2.80× and rises after it ({fall[2]:.2f}× below its 1.00× value at 7.86×): "
        f"from 2.80× to 7.86× that rate's ratio grows {grow:.2f}×, {ours:.2f}× from the experts' fall and {theirs:.2f}× "
        "from the monolith's rise."
    ) in t
    # the 256-unit experts at 715 steps against the 16-unit experts at 2,000: the same compute
    assert abs(715 * CLUSTERS * macs(256, PER_CLUSTER) / (2000 * CLUSTERS * macs(16, PER_CLUSTER)) - 1) < 1e-3
    sixteen = [
        floor.weighted(r["per_cluster"], "expert", weights)
        for r in doc_claims.load("gmm_trained_floor.json")["clu-r8-every"]["records"]
        if (r["features"], r["t"], r["steps"]) == (16, 0.1, 2000)
    ]
    wide = [floor.weighted(r["per_cluster"], "expert", weights) for r in experts()["records"] if r["steps"] == 715]
    assert len(sixteen) == len(wide) == 3 and below(sixteen, wide) == "experts below"  # the wide ones, 2 SE
    cell, theirs = a[first]["experts"], doc_claims.load("gmm_equal_compute-clu-r8-every.json")["rows"][0]["experts"]
    assert abs(theirs["mean"] - sum(v for v, _ in sixteen) / 3) < 1e-15  # the 16-unit experts' interval
    assert (
        f"experts at 715 steps, with the compute of the 16-unit experts at 2,000, are below those too "
        f"({1e3 * cell['mean']:.4g} ± {1e3 * cell['half']:.2g} against {1e3 * theirs['mean']:.4g} ± "
        f"{1e3 * theirs['half']:.2g}, in every pair with two standard errors): at that compute, wider experts trained "
        "for fewer steps do better."
    ) in t
    assert (
        "Shown for one width (256 units), at t = 0.1 (four budgets) and t = 0.5 (two budgets); both sides' learning "
        "rates in the next paragraph."
    ) in t
    together = CLUSTERS * params(256, PER_CLUSTER) / params(256, COMPONENTS)
    assert f"each expert the monolith's network (the eight together {together:.2f}× its parameters)" in t
    # the In-short paragraph: its numbers are the next paragraph's (tests/test_results_rates_claims.py)
    from .test_results_claims import paragraph

    assert "at both of its rates, by" not in paragraph() and "the only rate run there" not in paragraph()


def test_at_half_the_noise_the_experts_are_below_too_at_3e_2():
    store, t = doc_claims.load("gmm_equal_compute.json"), text()
    own = doc_claims.load("gmm_trained_floor.json")[HALF_EXPERTS]
    assert own["setting"] == experts()["setting"]
    assert sorted((r["features"], r["t"], r["steps"], r["training"]) for r in own["records"]) == [
        (256, 0.5, se, i) for se in (715, 2809) for i in range(3)
    ]
    e = store[HALF]
    assert e["setting"] == {"experts": HALF_EXPERTS, "expert_features": 256, "expert_steps": EQUAL} | {
        k: v for k, v in experts()["setting"].items() if k != "clusters"
    } | {"lr": 3e-2}
    assert e["expert_budget"] == {"256@5475": 715, "256@21508": 2809}
    for r in e["records"]:
        assert r["adopted_from"] == "clu-r8-every-lr3e-2" and r["t"] == 0.5
    assert sorted((r["steps"], r["training"]) for r in e["records"]) == [
        (s, i) for s in (5475, 21508) for i in range(3)
    ]
    summary = summarise(e, own)
    assert doc_claims.load(f"gmm_equal_compute-{HALF}.json") == summary
    assert (doc_claims.RESULTS / f"gmm_equal_compute-{HALF}.md").read_text() == render(e, summary)
    weights = experts()["cluster_weights"]
    rows = {r["steps"]: r for r in summary["rows"]}
    for s, se in ((5475, 715), (21508, 2809)):
        mono = [floor.weighted(x["per_cluster"], "monolith", weights) for x in e["records"] if x["steps"] == s]
        ours = [floor.weighted(x["per_cluster"], "expert", weights) for x in own["records"] if x["steps"] == se]
        assert len(mono) == len(ours) == 3 and below(mono, ours) == "experts below"
    lo, hi = rows[5475], rows[21508]

    def ratio(r: dict) -> str:
        return f"{r['ratio_of_means']:.3g}× ({r['ratio_every_pair']['min']:.3g}–{r['ratio_every_pair']['max']:.3g})"

    assert [round(r["compute_ratio"], 3) for r in summary["rows"]] == [1.0, 1.0]
    assert {s: round(x, 2) for s, x in zip((5475, 21508), e["compute_ratio"].values())} == {5475: 1.0, 21508: 1.0}
    assert (
        "At t = 0.5, at 3·10⁻² (its other rates there: the next paragraph, where 10⁻² is the better by far at 3.93×), "
        f"the experts are below it at 1.00× by {ratio(lo)} and at 3.93× by {ratio(hi)}, in every pair with two "
        "standard errors"
    ) in t
    new = [r for r in own["records"]] + [
        r
        for r in store["clu-r8-every-lr3e-2"]["records"]
        if (r["t"], r["steps"], r["training"]) in ((0.5, 5475, 1), (0.5, 5475, 2))
    ]
    assert len(new) == 8 and {(r["commit"], tuple(r["uncommitted"]), r["torch_threads"]) for r in new} == {
        (HALF_COMMIT, (), 1)
    }
    assert (
        "the monolith's trainings 1 and 2 at 5,475 steps `--features 256 --times 0.5 --steps 5475 --training 1 2 --lr "
        f"3e-2 --name clu-r8-every-lr3e-2`; 8 records naming {HALF_COMMIT} with nothing uncommitted, "
        f"{sum(r['seconds'] for r in new) / 60:.0f} min summed"
    ) in t
    assert {r["date"] for r in new} == {"2026-12-07"}
    assert own["meta"]["command"].endswith(
        f"--features 256 --times 0.5 --steps 715 2809 --training 0 1 2 --lr 1e-2 --name {HALF_EXPERTS}"
    )
    assert store[HALF]["meta"]["command"] == (
        f"python -m benchmarks.gmm_equal_compute --experts {HALF_EXPERTS} --expert-features 256 --equal-compute "
        f"--features 256 --times 0.5 --steps 5475 21508 --training 0 1 2 --lr 3e-2 --name {HALF}"
    )
    assert f"`--features 256 --times 0.5 --steps 715 2809 --training 0 1 2 --lr 1e-2 --name {HALF_EXPERTS}`" in t
    assert (
        f"`--experts {HALF_EXPERTS} --expert-features 256 --equal-compute --features 256 --times 0.5 --steps 5475 21508 --training 0 1 2 --lr 3e-2 --name {HALF}`"
        in t
    )
