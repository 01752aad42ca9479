"""docs/results.md's "At the samples, each side at its own rate" against the committed runs: the 6,400-step subspace
rungs again with the experts at 8e-3 and the monolith at rates of its own (``reproduce.monolith_lr``; 1.6e-2 and
8e-3 under equal steps, 4e-3 and 8e-3 under equal images), its commands, its networks (the rate sweep's, bit for bit)
and routers (the shared-rate runs'), the table and every number and verdict of its readings recomputed from the
manifests and ``benchmarks/gmm_ladder.py``'s records, and the In-short bullet."""

import re

import pytest

from hddm_flower.gmm.truth import interval

from . import doc_claims
from .doc_claims import change, load, verdict

START = "**At the samples, each side at its own rate.**"
END = "**At 800 and 3,200 steps, each side at its own rate.**"

ES, EI = "equal steps", "equal images"
# (budget, the monolith's own rate; None: the shared-rate rung of In short, both sides at 2e-3) → the run's name
RUNS = {
    (ES, None): "6400-text",
    (ES, 1.6e-2): "6400-text-lr8e-3-mono1.6e-2",
    (ES, 8e-3): "6400-text-lr8e-3-mono8e-3",
    (EI, None): "ei-6400-text",
    (EI, 4e-3): "ei-6400-text-lr8e-3-mono4e-3",
    (EI, 8e-3): "ei-6400-text-lr8e-3-mono8e-3",
}
OWN = [key for key in RUNS if key[1] is not None]
LADDER = "gmm_ladder_subspace_6400_own_rates"
SHARED_LADDER = {
    ES: ("gmm_ladder_subspace_6400", "6400-text"),
    EI: ("gmm_ladder_subspace_equal_images_6400", "ei-6400"),
}
WRITTEN = {1.6e-2: "1.6e-2", 8e-3: "8e-3", 4e-3: "4e-3"}  # the rates as the commands write them
MINUTES = {(ES, 1.6e-2): 30.8, (ES, 8e-3): 10.1, (EI, 4e-3): 17.2}  # the wall times the doc names
TOP2_MONOLITH = "8FM: top2 − monolith"
GAP = "empty caption · full: gap, trained experts · trained router − exact · exact"
FIRST = "empty caption · full: router share at exact experts (ET − EE)"
SECOND = "empty caption · full: router share with trained experts (TT − TE)"
TOP2, MONOLITH = "8FM · top2", "monolith (equal compute)"
SWEEP = {"experts": "clu-r8-nano-lr8e-3", 1.6e-2: "clu-r8-nano-lr1.6e-2", 8e-3: "clu-r8-nano-lr8e-3"}
BASE = "hddm reproduce --config configs/reproduce-gmm-subspace.yaml --set expert.steps=6400 --set router.conditioning=text "
EQUAL_IMAGES = "--set reproduce.budget=equal_images --set expert.batch_size=32 "


def text() -> str:
    return doc_claims.passage(START, END)


def manifest(key: tuple) -> dict:
    return load(f"reproduce-gmm-subspace-{RUNS[key]}-manifest.json")


def paired(key: tuple, what: str, metric: str = "delta_log_density") -> dict:
    (entry,) = [e for e in manifest(key)["paired"] if e["what"] == what]
    return entry[metric]


def sweep_records() -> list[dict]:
    """The rate sweep's records (``benchmarks/gmm_capacity_pilot.py``)."""
    records = load("gmm_capacity_pilot.json")
    return records["records"] if isinstance(records, dict) else records


def row(key: tuple, name: str, metric: str = "delta_log_density") -> list[float]:
    """A trained row's metric per training (the mean over its sampling seeds)."""
    return [sum(s[metric] for s in t) / len(t) for t in manifest(key)["results"][name]["per_training"]]


def rung(key: tuple) -> dict:
    name, label = SHARED_LADDER[key[0]] if key[1] is None else (LADDER, RUNS[key])
    (g,) = [g for g in load(f"{name}.json")["rungs"] if g["label"] == label]
    return g


def excess(key: tuple, side: str) -> list[float]:
    """Each training's excess loss over Bayes of one side (expert, monolith or their difference), mean over the 8
    clusters and the t grid, from the gmm_ladder record."""
    out = []
    for training in rung(key)["excess"]["per_training"]:
        sides = {s: [x for c in training.values() for x in c[s]] for s in ("expert", "monolith")}
        sides["gap"] = [m - e for m, e in zip(sides["monolith"], sides["expert"], strict=True)]
        out.append(sum(sides[side]) / len(sides[side]))
    return out


def iv(x: dict, digits: int, scale: float = 1.0) -> str:
    return doc_claims.iv(x, digits, scale=scale)


def test_the_runs_are_the_commands_named_at_the_rates_named():
    t = text()
    out = {}
    for key in OWN:
        m, (budget, rate) = manifest(key), key
        head = BASE if budget == ES else BASE.replace("--set router", EQUAL_IMAGES + "--set router")
        head += f"--set expert.optim.lr=8e-3 --set reproduce.monolith_lr={WRITTEN[rate]} "
        assert m["command"].startswith(head), key
        out[key] = m["command"].split("--out ")[1].split()[0]
        c = m["config"]
        assert (c["expert"]["optim"]["lr"], c["reproduce"]["monolith_lr"]) == (8e-3, rate)
        b = m["budget"]
        assert (b["protocol"], b["expert_steps"], b["expert_batch"]) == (budget.replace(" ", "_"), 6400, 32)
        assert b["monolith_batch"] == (256 if budget == ES else 32)
        assert b["monolith_steps"] == (6400 if budget == ES else 51200)
        assert (m["seeds"]["trainings"], c["evaluation"]["seeds"], c["router"]["conditioning"]) == (3, 2, "text")
        assert m["created_at"].startswith("2026-12-07")
        if key in MINUTES:
            assert round(m["seconds"] / 60, 1) == MINUTES[key]
    assert "--reuse" not in manifest(OWN[0])["command"]
    assert (
        "Each run after the first has `--reuse` of an earlier one (the second and third of the first, the fourth of "
        "the third), so it trains and samples only its monoliths."
    ) in t
    donors = {(ES, 8e-3): (ES, 1.6e-2), (EI, 4e-3): (ES, 1.6e-2), (EI, 8e-3): (EI, 4e-3)}
    for after, before in donors.items():  # each run after the first reuses an earlier one
        assert f"--reuse {out[before]} --out {out[after]}" in manifest(after)["command"]
        for training in manifest(after)["artefacts"]["trainings"]:
            assert all(e["reused"] for e in training["experts"].values()) and not training["monolith"]["reused"]
    minutes_d = round(manifest((EI, 8e-3))["seconds"] / 60, 1)
    assert (
        f"`{BASE}--set expert.optim.lr=8e-3 --set reproduce.monolith_lr=1.6e-2 --out OUT --jobs 2` (30.8 min), the "
        "same with `--set reproduce.monolith_lr=8e-3 --reuse OUT` (10.1 min); under equal images the same with "
        f"`{EQUAL_IMAGES}--jobs 3`, `reproduce.monolith_lr=4e-3` (17.2 min) and `8e-3` ({minutes_d} min)"
    ) in t
    loads = [
        x for key in OWN for x in (manifest(key)["load_average"]["start"][0], manifest(key)["load_average"]["end"][0])
    ]
    assert f"(load {min(loads):.1f}–{max(loads):.1f})" in t
    assert "(commit 645d8dd)" in t and "| 2026-12-07 |" in t
    assert "AVX-512" in load(f"{LADDER}.json")["machine"] and "| 2-core AMD EPYC (AVX-512), 24 GiB," in t
    assert "(the prompt-aware router, three trainings × 2 sampling seeds)" in t
    same = manifest((ES, 8e-3))["config"]
    assert same["reproduce"]["monolith_lr"] == same["expert"]["optim"]["lr"]
    assert "at 8×10⁻³ both sides share one rate again" in t
    assert "the monolith takes 51,200 steps at batch 32; no sweep was run for it" in t
    records = sweep_records()
    assert not any(r["budget"]["protocol"] == "equal_images" and r["steps"] == 6400 for r in records)


def test_the_networks_are_the_sweeps_and_the_routers_the_shared_runs():
    """Per training, the experts of clusters 0, 3 and 4 and the equal-steps monoliths have the tensor hashes of the
    rate sweep's records at these rates (so the rates were picked on these trainings), and the routers those of the
    shared-rate runs; the sweep compared every rate on training 0 and the best two of each side on 1 and 2."""
    records = sweep_records()

    def sweep(label: str, training: int) -> dict:
        (r,) = [r for r in records if (r["label"], r["steps"], r.get("training", 0)) == (label, 6400, training)]
        return r

    for key in OWN:
        for i, t in enumerate(manifest(key)["artefacts"]["trainings"]):
            experts = sweep(SWEEP["experts"], i)["tensor_sha256"]
            for k in (0, 3, 4):
                assert t["experts"][f"cluster-{k}-fm"]["tensor_sha256"] == experts[f"experts/cluster-{k}-fm"]
            if key[0] == ES:
                assert t["monolith"]["tensor_sha256"] == sweep(SWEEP[key[1]], i)["tensor_sha256"]["monolith"]
            shared = manifest((key[0], None))["artefacts"]["trainings"][i]["router"]
            assert t["router"]["tensor_sha256"] == shared["tensor_sha256"]
    trainings = {
        r["label"]: {x.get("training", 0) for x in records if x["label"] == r["label"] and x["steps"] == 6400}
        for r in records
        if r["label"].startswith("clu-r8-nano-lr")
    }
    assert trainings["clu-r8-nano-lr4e-3"] == {0} and trainings["clu-r8-nano-lr8e-3"] == {0, 1, 2}

    def mean_on(label: str, side: str) -> float:
        return sweep(label, 0)["mean_over_t_and_clusters"][side]

    swept = [f"clu-r8-nano{r}" for r in ("-lr1e-3", "", "-lr4e-3", "-lr8e-3", "-lr1.6e-2", "-lr3.2e-2")]
    assert min(swept, key=lambda label: mean_on(label, "expert")) == SWEEP["experts"]  # best on training 0
    assert min(swept, key=lambda label: mean_on(label, "monolith")) == SWEEP[1.6e-2]
    tie = "the monolith's two rates tie (−0.002 ± 0.005)"  # the sweep's own reading, paired over its trainings
    assert tie in doc_claims.passage("**The learning rate does not close the gap.**", START)
    assert "from 1.6×10⁻² over three trainings (−0.002 ± 0.005)" in text()
    assert (
        "the sweep's best for them on training 0" in text()
        and "1.6×10⁻², the sweep's best for it on training 0, and at 8×10⁻³, which the sweep does not tell apart"
        in text()
    )
    assert (
        "are, bit for bit, the sweep's networks at these rates (their tensor hashes), and the routers are those of "
        "the shared-rate runs. So the experts' rate and the equal-steps monolith's 1.6×10⁻² were picked on these same "
        "trainings (on training 0, by excess loss on clusters 0, 3 and 4, not by Δ log p or MMD²), and the intervals "
        "do not account for that choice."
    ) in text()


def table() -> list[list[str]]:
    return doc_claims.md_table(doc_claims.raw_passage(START, END), "| budget | learning rate, experts · monolith |")


def test_the_table_is_the_runs():
    rows = table()
    assert rows[0] == [
        "budget",
        "learning rate, experts · monolith",
        "8FM top-2 − monolith, Δ log p",
        "8FM top-2 − monolith, MMD² ×10³",
        "monolith − expert, excess loss over Bayes (8 clusters, mean over t)",
    ]

    def label(rate: float | None) -> str:
        names = {None: "2×10⁻³ · 2×10⁻³ (shared rate)", 1.6e-2: "8×10⁻³ · 1.6×10⁻²", 8e-3: "8×10⁻³ · 8×10⁻³"}
        return names.get(rate, "8×10⁻³ · 4×10⁻³")

    assert rows[1:] == [
        [
            key[0],
            label(key[1]),
            iv(paired(key, TOP2_MONOLITH), 1),
            iv(paired(key, TOP2_MONOLITH, "mmd2"), 2, 1e3),
            iv(rung(key)["excess_mean_over_t"]["monolith_minus_expert"], 3),
        ]
        for key in RUNS
    ]
    for key in RUNS:
        c = manifest(key)["config"]
        assert c["expert"]["optim"]["lr"] == (2e-3 if key[1] is None else 8e-3)
        assert c["reproduce"].get("monolith_lr", 0) in (0, key[1])
        assert sum(excess(key, "gap")) / 3 == pytest.approx(
            rung(key)["excess_mean_over_t"]["monolith_minus_expert"]["mean"]
        )
        if key[1] is not None:  # the ladder record reads the same runs: its paired difference is the manifest's
            assert rung(key)["paired"]["8FM"]["top2 − monolith"]["delta_log_density"] == paired(key, TOP2_MONOLITH)
    assert (
        "Each ± is over the three trainings, paired by training (and by sampling seed for Δ log p and MMD²)" in text()
    )


def lead_change(key: tuple) -> dict:
    return change(paired((key[0], None), TOP2_MONOLITH)["per_training"], paired(key, TOP2_MONOLITH)["per_training"])


def row_change(key: tuple, name: str, metric: str = "delta_log_density") -> dict:
    return change(row((key[0], None), name, metric), row(key, name, metric))


def test_under_equal_steps_the_lead_holds():
    t = text()
    moves = [lead_change((ES, r)) for r in (1.6e-2, 8e-3)]
    assert all(verdict(m) == "a tie" for m in moves)
    assert (
        f"**Under equal steps top-2's lead holds.** Against the shared rate it changes by {iv(moves[0], 1)} nats (the "
        f"monolith at 1.6×10⁻²) and {iv(moves[1], 1)} (at 8×10⁻³): ties."
    ) in t
    top2 = row_change((ES, 1.6e-2), TOP2)
    assert row((ES, 1.6e-2), TOP2) == row((ES, 8e-3), TOP2) == row((EI, 4e-3), TOP2)  # the same experts and router
    mono = [row_change((ES, r), MONOLITH) for r in (1.6e-2, 8e-3)]
    between = change(row((ES, 1.6e-2), MONOLITH), row((ES, 8e-3), MONOLITH))
    assert top2["lo"] > 0 and all(m["lo"] > 0 for m in mono) and verdict(between) == "a tie"
    assert max(m["mean"] for m in mono) / top2["mean"] > 0.85
    assert (
        f"Both sides gain about as much: the top-2 row by {iv(top2, 1)} nats, the monolith's by {iv(mono[0], 1)} and "
        f"{iv(mono[1], 1)}; its two rates tie ({iv(between, 1)})."
    ) in t


def test_under_equal_images_the_lead_grows():
    t = text()
    moves = [lead_change((EI, r)) for r in (4e-3, 8e-3)]
    mono = [row_change((EI, r), MONOLITH) for r in (4e-3, 8e-3)]
    between = change(row((EI, 4e-3), MONOLITH), row((EI, 8e-3), MONOLITH))
    assert all(m["lo"] > 0 for m in moves)
    assert (
        f"**Under equal images it grows**, by {iv(moves[0], 1)} and {iv(moves[1], 1)} nats (the monolith at 4×10⁻³ "
        f"and 8×10⁻³): the experts' gain is the same as above, the monolith's {iv(mono[0], 1)} and {iv(mono[1], 1)}"
    ) in t
    scores = ", the other two ".join([f"{row((EI, 8e-3), MONOLITH)[1]:.1f}".replace("-", "−"), ""])
    others = [f"{x:.1f}".replace("-", "−") for x in row((EI, 8e-3), MONOLITH)[::2]]
    assert min(row((EI, 8e-3), MONOLITH)) == row((EI, 8e-3), MONOLITH)[1]
    assert (
        f"(8×10⁻³ against 4×10⁻³: {iv(between, 1)}, {verdict(between)}; at 8×10⁻³ one training's monolith scores "
        f"{scores}{others[0]} and {others[1]})."
    ) in t
    means = {r: sum(row((EI, r), MONOLITH)) / 3 for r in (None, 4e-3, 8e-3)}
    assert max(means, key=means.get) == 4e-3
    low = row_change((EI, 4e-3), MONOLITH)  # 4e-3 against the shared 2e-3
    assert low["lo"] > 0 and verdict(between) == "a tie"
    assert (
        "Of the three rates tried for this monolith, 4×10⁻³ has the highest mean; the other two are lower, 2×10⁻³ by a "
        f"resolved {iv(low, 1)[1:]} nats and 8×10⁻³ by a tie."
    ) in t
    assert row((EI, None), TOP2) == row((ES, None), TOP2)  # "the experts' gain is the same as above"


def by_cluster(key: tuple, side: str = "gap") -> dict[str, list[float]]:
    """Each cluster's excess loss per training (a side, or the monolith − expert gap), mean over the t grid."""
    out: dict[str, list[float]] = {}
    for training in rung(key)["excess"]["per_training"]:
        for c, v in training.items():
            values = v[side] if side != "gap" else [m - e for m, e in zip(v["monolith"], v["expert"], strict=True)]
            out.setdefault(c, []).append(sum(values) / len(values))
    return out


def test_the_excess_loss_gap_grows_under_equal_steps():
    t = text()
    gaps = [change(excess((ES, None), "gap"), excess((ES, r), "gap")) for r in (1.6e-2, 8e-3)]
    assert all(g["lo"] > 0 for g in gaps)

    def fall(key: tuple, side: str) -> dict:
        before, after = excess((key[0], None), side), excess(key, side)
        return interval([100 * (b / a - 1) for a, b in zip(before, after, strict=True)])

    falls = [fall((ES, 1.6e-2), "expert"), fall((ES, 1.6e-2), "monolith"), fall((ES, 8e-3), "monolith")]
    assert fall((ES, 8e-3), "expert") == falls[0] and all(f["hi"] < 0 for f in falls)
    assert (
        f"**The excess-loss gap grows under equal steps** by {iv(gaps[0], 3)} and {iv(gaps[1], 3)}, the mean over the "
        f"8 clusters paired by training: the experts' excess falls {iv(falls[0], 1)[1:]} %, the monolith's "
        f"{iv(falls[1], 1)[1:]} % and {iv(falls[2], 1)[1:]} %."
    ) in t
    before = by_cluster((ES, None))
    by = {r: {c: change(v, by_cluster((ES, r))[c]) for c, v in before.items()} for r in (1.6e-2, 8e-3)}
    grows = [sum(x["lo"] > 0 for x in by[r].values()) for r in (1.6e-2, 8e-3)]
    ties = [sum(verdict(x) == "a tie" for x in by[r].values()) for r in (1.6e-2, 8e-3)]
    assert [[c for c, x in by[r].items() if x["hi"] < 0] for r in (1.6e-2, 8e-3)] == [["3"], ["3"]]
    mono_before, mono_after = by_cluster((ES, None), "monolith"), by_cluster((ES, 1.6e-2), "monolith")
    gain = {c: sum(mono_before[c]) - sum(mono_after[c]) for c in mono_before}
    assert max(gain, key=gain.get) == "3"  # where the monolith gains most
    assert (
        f"By cluster it grows on {grows[0]} and {grows[1]} of the 8, ties on {ties[0]} and {ties[1]}, and shrinks on "
        f"cluster 3 ({iv(by[1.6e-2]['3'], 3)} and {iv(by[8e-3]['3'], 3)}), where the monolith gains most; that "
        "cluster is one of the three the sweep measured, where it found the gap's change a tie. The gap stays above "
        "zero on each cluster."
    ) in t
    for key in [k for k in OWN if k[0] == ES]:
        assert all(c["lo"] > 0 for c in rung(key)["monolith_minus_expert_by_cluster"].values()), key
    ei = change(excess((EI, None), "gap"), excess((EI, 4e-3), "gap"))
    ei_by = [change(v, by_cluster((EI, 4e-3))[c]) for c, v in by_cluster((EI, None)).items()]
    still = fall((EI, 4e-3), "monolith")
    assert ei["lo"] > 0 and all(x["lo"] > 0 for x in ei_by) and verdict(still) == "a tie"
    assert (
        f"Under equal images it grows by {iv(ei, 3)} at 4×10⁻³, on every cluster, and the monolith's excess does not "
        f"move ({iv(still, 1)} %)."
    ) in t


def test_by_mmd_the_monoliths_edge_is_gone_and_not_because_it_improved():
    t = text()
    moves = [
        change(
            paired((ES, None), TOP2_MONOLITH, "mmd2")["per_training"],
            paired((ES, r), TOP2_MONOLITH, "mmd2")["per_training"],
        )
        for r in (1.6e-2, 8e-3)
    ]
    assert paired((ES, None), TOP2_MONOLITH, "mmd2")["resolved"] and all(m["hi"] < 0 for m in moves)
    assert not any(paired((ES, r), TOP2_MONOLITH, "mmd2")["resolved"] for r in (1.6e-2, 8e-3))
    top2 = row_change((ES, 1.6e-2), TOP2, "mmd2")
    mono = [row_change((ES, r), MONOLITH, "mmd2") for r in (1.6e-2, 8e-3)]
    assert top2["hi"] < 0 and all(m["lo"] > 0 for m in mono)
    truth = manifest((ES, 1.6e-2))["results"]["true samples (fresh draws)"]["metrics"]["mmd2"]
    assert (
        "**By MMD² the equal-steps monolith's edge is gone: top-2's samples come closer and the monolith's move "
        "away.** "
        f"Top-2 − monolith moves by {iv(moves[0], 2, 1e3)} and {iv(moves[1], 2, 1e3)} (×10⁻³) to a tie at either "
        f"rate: the top-2 row's MMD² falls by {iv(top2, 2, 1e3)[1:]} while the monolith's rises by "
        f"{iv(mono[0], 2, 1e3)[1:]} and {iv(mono[1], 2, 1e3)[1:]}."
    ) in t
    assert truth["n"] == 2 and max(m["half"] for m in moves) < truth["half"]
    assert "So the rate picked by excess loss leaves the monolith's samples farther from the truth by MMD²" in t
    assert (
        "These differences are of the size of the estimator's own scatter: on these draws the true samples themselves "
        f"score {iv(truth, 2, 1e3)} (over the 2 sampling seeds of one run)."
    ) in t


def test_the_routing_modes_come_closer():
    t = text()
    own, shared = (ES, 1.6e-2), (ES, None)
    top1, full = paired(own, "8FM: top2 − top1"), paired(own, "8FM: top2 − full")
    was1, was_full = paired(shared, "8FM: top2 − top1"), paired(shared, "8FM: top2 − full")
    c1 = change(was1["per_training"], top1["per_training"])
    c2 = change(was_full["per_training"], full["per_training"])
    assert not top1["resolved"] and full["resolved"] and full["hi"] < 0 and was1["resolved"] and was_full["resolved"]
    assert c1["hi"] < 0 < c2["lo"]
    assert max(abs(x["mean"]) for x in (top1, full, was1, was_full)) < 0.2
    assert (
        f"**The routing modes come closer**: top-2 − top-1 {iv(top1, 2)} (a tie; {iv(was1, 2)} at the shared rate), "
        f"top-2 − full {iv(full, 2)} (full ahead, resolved; {iv(was_full, 2)}), changes of {iv(c1, 2)} and "
        f"{iv(c2, 2)} paired; all within a fifth of a nat."
    ) in t
    for what in ("8FM: top2 − top1", "8FM: top2 − full", GAP, FIRST, SECOND):  # the monolith plays no part
        assert paired(own, what) == paired((ES, 8e-3), what) == paired((EI, 4e-3), what)


def test_the_routers_share_grows_because_the_experts_part_shrinks():
    t = text()
    own, shared = (ES, 1.6e-2), (ES, None)
    gap = {k: paired(k, GAP) for k in (shared, own)}
    closed = change(gap[shared]["per_training"], gap[own]["per_training"])
    assert closed["lo"] > 0 and 0.4 < gap[own]["mean"] / gap[shared]["mean"] < 0.5
    assert "**The router's share of the gap grows because the experts' part shrinks.** On the empty caption" in t
    assert f"halves, from {iv(gap[shared], 1)} to {iv(gap[own], 1)} nats ({iv(closed, 1)} paired)" in t
    assert paired(shared, FIRST) == paired(own, FIRST)  # the same router at exact experts
    cost = change(paired(shared, SECOND)["per_training"], paired(own, SECOND)["per_training"])
    assert verdict(cost) == "a tie"
    assert (
        f"costs {iv(paired(own, FIRST), 1)} with exact experts (the trained router exchanged first, in place of the "
        f"exact one beside exact experts) and, with the trained experts (exchanged second), "
        f"{iv(paired(own, SECOND), 1)} against {iv(paired(shared, SECOND), 1)} at the shared rate: a change of "
        f"{iv(cost, 1)}, a tie."
    ) in t
    share = {(k, w): 100 * paired(k, w)["mean"] / gap[k]["mean"] for k in (shared, own) for w in (FIRST, SECOND)}

    def per_training(k: tuple, w: str) -> list[float]:
        return [100 * a / b for a, b in zip(paired(k, w)["per_training"], gap[k]["per_training"], strict=True)]

    rises = [change(per_training(shared, w), per_training(own, w)) for w in (FIRST, SECOND)]
    assert all(x["lo"] > 0 for x in rises)
    assert (
        f"ratios of the means: from {share[shared, FIRST]:.1f} % to {share[own, FIRST]:.1f} % with the router "
        f"exchanged first, from {share[shared, SECOND]:.1f} % to {share[own, SECOND]:.1f} % exchanged second; each "
        f"training's share rises by {iv(rises[0], 1)} and {iv(rises[1], 1)} points) because the experts' part "
        "shrinks, not because the router costs more."
    ) in t
    held = [held_out_share(w) for w in (FIRST, SECOND)]
    swept = {r.get("training", 0) for r in load("gmm_capacity_pilot.json")["records"] if r["steps"] == 6400}
    assert swept & {3, 4, 5} == {3} and all(  # training 3 ran at 6,400 steps only in the shared-rate pilot
        r["label"] == "clu-r8-nano"
        for r in load("gmm_capacity_pilot.json")["records"]
        if r["steps"] == 6400 and r.get("training", 0) == 3
    )
    six_sweep = {
        r.get("training", 0)
        for r in load("gmm_capacity_pilot.json")["records"]
        if r["steps"] == 6400 and r["label"] in ("clu-r8-nano-lr8e-3", "clu-r8-nano-lr1.6e-2")
    }
    assert six_sweep == {0, 1, 2}  # the 6,400-step sweep's two best rates, on trainings 0-2
    assert held[1] < share[own, SECOND] and held[0] > share[shared, FIRST] and held[1] > share[shared, SECOND]
    assert (
        "These are trainings 0–2, on which the rates were picked (training 0) and the two best swept (1 and 2): on "
        "trainings 3–5 of the six-training run at "
        f"the same rates the share is {held[0]:.1f} % and {held[1]:.1f} % (`hddm tables MANIFEST --trainings 3 4 5`: "
        f"`…-6-trainings-read-3-5.{{md,json}}`), against the shared rate's {share[shared, FIRST]:.1f} % and "
        f"{share[shared, SECOND]:.1f} % on trainings 0–2; the shared rate has no run of trainings 3–5 to pair them "
        f"with, so how much of the rise to {share[own, SECOND]:.1f} % is these three trainings' own is not shown."
    ) in t


def held_out_share(what: str) -> float:
    """The router's share (%, the ratio of the means) on trainings 3-5 of the six-training 6,400-step run, read by
    ``hddm tables`` (the rates were picked on training 0)."""
    read = load("reproduce-gmm-subspace-6400-text-lr8e-3-mono1.6e-2-6-trainings-read-3-5.json")
    assert read["trainings"] == [3, 4, 5] and read["of"] == 6
    (gap,) = [e["delta_log_density"]["mean"] for e in read["paired"] if e["what"] == GAP]
    (part,) = [e["delta_log_density"]["mean"] for e in read["paired"] if e["what"] == what]
    return 100 * part / gap


def test_in_short_names_the_own_rates():
    bullet = doc_claims.passage("- **Each side at its own rate**", "- **Shared structure.**")
    lead = {k: paired(k, TOP2_MONOLITH) for k in RUNS}
    own, shared = (ES, 1.6e-2), (ES, None)
    gap = {k: paired(k, GAP) for k in (shared, own)}
    share = [100 * paired(k, SECOND)["mean"] / gap[k]["mean"] for k in (shared, own)]
    ei = [lead_change((EI, r)) for r in (4e-3, 8e-3)]
    assert (
        "(6,400 expert steps; the experts at 8×10⁻³ and the equal-steps monolith at 1.6×10⁻², the sweep's best by "
        "excess loss on training 0 of these same trainings; the equal-steps monolith also at 8×10⁻³ and the "
        "equal-images one, unswept, at 4×10⁻³ and 8×10⁻³"
    ) in bullet
    assert (
        f"top-2's lead holds under equal steps ({iv(lead[ES, 1.6e-2], 1)} and {iv(lead[ES, 8e-3], 1)} nats; its "
        f"change from the shared rate {iv(lead_change(own), 1)}, a tie) and grows under equal images "
        f"({iv(lead[EI, 4e-3], 1)} and {iv(lead[EI, 8e-3], 1)}; changes from the shared rate {iv(ei[0], 1)} and "
        f"{iv(ei[1], 1)})."
    ) in bullet
    assert "By MMD² the equal-steps monolith's edge becomes a tie, its own MMD² worse at the rate picked." in bullet
    assert (
        f"On the empty caption the gap of trained experts and router to exact ones halves ({iv(gap[shared], 1)} → "
        f"{iv(gap[own], 1)}) while the router's cost does not change resolvably, so the router's share rises from "
        f"{share[0]:.1f} % to {share[1]:.1f} % (exchanged second; trainings 0–2, on which the rates were picked and "
        f"swept; on trainings 3–5 of the six-training run, where the sweep tried neither of its two best rates, it is "
        f"{held_out_share(SECOND):.1f} %, and the shared rate has no run of those, so the rise is shown on trainings "
        "0–2 only)."
    ) in bullet
    assert re.search(
        r"\*\*The router\.\*\*.*\*\*Each side at its own rate\*\*",
        doc_claims.passage("**In short**, on the mixture whose clusters share no structure", "Details below."),
    )


@pytest.mark.parametrize("key", OWN)
def test_the_committed_tables_are_their_manifests_rendered(key):
    """Each run's tables.md is its manifest as ``hddm reproduce`` renders it now, the rates named."""
    from hddm_flower.gmm.evaluate import render_truth_tables

    from .doc_claims import RESULTS

    m = manifest(key)
    committed = (RESULTS / f"reproduce-gmm-subspace-{RUNS[key]}-tables.md").read_text()
    assert committed.strip() == render_truth_tables(m, m["results"]).strip()
    assert "learning rate 0.008" + (f" (the monolith {key[1]:g})" if key[1] != 8e-3 else ";") in committed


HELD_OUT = "6400-text-lr8e-3-mono1.6e-2-6-trainings"  # the first own-rate run with trainings 3-5 added


def test_on_trainings_the_sweep_never_saw_the_lead_holds():
    """Trainings 3-5 were never run by the rate sweep (it ran trainings 0-2 at these rates), so on them the rates
    were not picked: top-2 − monolith there, and over all six."""
    m = load(f"reproduce-gmm-subspace-{HELD_OUT}-manifest.json")
    first = manifest((ES, 1.6e-2))
    assert m["command"].startswith(
        BASE + "--set expert.optim.lr=8e-3 --set reproduce.monolith_lr=1.6e-2 --set evaluation.training_seeds=6 "
        f"--reuse {first['command'].split('--out ')[1].split()[0]} --out "
    )
    assert m["seeds"]["trainings"] == 6
    (lead,) = [e["delta_log_density"] for e in m["paired"] if e["what"] == TOP2_MONOLITH]
    assert lead["per_training"][:3] == paired((ES, 1.6e-2), TOP2_MONOLITH)["per_training"]  # trainings 0-2 reused
    records = sweep_records()
    assert max(r.get("training", 0) for r in records if r["label"] in SWEEP.values() and r["steps"] == 6400) == 2
    held_out = interval(lead["per_training"][3:])
    assert held_out["lo"] > 0 and lead["lo"] > 0 and lead["trainings"] == 6
    assert (
        f"on them alone top-2 − monolith is {iv(held_out, 1)} nats (three trainings), against "
        f"{iv(paired((ES, 1.6e-2), TOP2_MONOLITH), 1)} on trainings 0–2, and {iv(lead, 1)} over all six"
    ) in text()
    assert f"({round(m['seconds'] / 60, 1)} min)" in text()
