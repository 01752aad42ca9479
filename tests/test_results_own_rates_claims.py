"""docs/results.md's "At the samples, each side at its own rate" against the committed runs: the 6,400-step subspace
rung again with the experts at 8e-3 and the monolith at 1.6e-2 and 8e-3 (``reproduce.monolith_lr``), its commands,
its networks (the rate sweep's, bit for bit) and routers (the shared-rate run's), the table and every number of its
readings recomputed from the manifests and ``benchmarks/gmm_ladder.py``'s record."""

import pytest

from hddm_flower.gmm.truth import interval

from . import doc_claims
from .doc_claims import load, num

START = "**At the samples, each side at its own rate.**"
END = "**Where the monolith waits: the mean-only level.**"

SHARED = "reproduce-gmm-subspace-6400-text-manifest.json"  # the rung of In short, both sides at 2e-3
OWN = {1.6e-2: "6400-text-lr8e-3-mono1.6e-2", 8e-3: "6400-text-lr8e-3-mono8e-3"}  # by the monolith's rate
LADDER = "gmm_ladder_subspace_6400_own_rates.json"
TOP2_MONOLITH = "8FM: top2 − monolith"
GAP = "empty caption · full: gap, trained experts · trained router − exact · exact"
FIRST = "empty caption · full: router share at exact experts (ET − EE)"
SECOND = "empty caption · full: router share with trained experts (TT − TE)"
SWEEP = {"experts": "clu-r8-nano-lr8e-3", 1.6e-2: "clu-r8-nano-lr1.6e-2", 8e-3: "clu-r8-nano-lr8e-3"}


def text() -> str:
    return doc_claims.passage(START, END)


def manifest(rate: float | None) -> dict:
    return load(SHARED if rate is None else f"reproduce-gmm-subspace-{OWN[rate]}-manifest.json")


def paired(rate: float | None, what: str, metric: str = "delta_log_density") -> dict:
    (entry,) = [e for e in manifest(rate)["paired"] if e["what"] == what]
    return entry[metric]


def change(before: list[float], after: list[float]) -> dict:
    """A change paired by training."""
    return interval([b - a for a, b in zip(before, after, strict=True)])


def row(rate: float | None, name: str) -> list[float]:
    """A trained row's Δ log p per training (the mean over its sampling seeds)."""
    return [sum(s["delta_log_density"] for s in t) / len(t) for t in manifest(rate)["results"][name]["per_training"]]


def ladder_excess(rate: float | None) -> dict:
    """Monolith − expert excess loss over Bayes on all 8 clusters, mean over t, from the gmm_ladder record."""
    name, label = ("gmm_ladder_subspace_6400.json", "6400-text") if rate is None else (LADDER, OWN[rate])
    (rung,) = [g for g in load(name)["rungs"] if g["label"] == label]
    return rung["excess_mean_over_t"]["monolith_minus_expert"]


def iv(x: dict, digits: int, scale: float = 1.0) -> str:
    return doc_claims.iv(x, digits, scale=scale)


def test_the_runs_are_the_commands_named_at_the_rates_named():
    first, second = manifest(1.6e-2), manifest(8e-3)
    base = (
        "hddm reproduce --config configs/reproduce-gmm-subspace.yaml --set expert.steps=6400 --set "
        "router.conditioning=text --set expert.optim.lr=8e-3 --set reproduce.monolith_lr="
    )
    assert first["command"].startswith(base + "1.6e-2 --out ") and "--reuse" not in first["command"]
    out = first["command"].split("--out ")[1].split()[0]
    assert second["command"].startswith(base + "8e-3 --reuse " + out + " --out ")
    for rate, m in ((1.6e-2, first), (8e-3, second)):
        c = m["config"]
        assert (c["expert"]["optim"]["lr"], c["reproduce"]["monolith_lr"], c["router"]["conditioning"]) == (
            8e-3,
            rate,
            "text",
        )
        assert (m["budget"]["protocol"], m["budget"]["expert_steps"], m["budget"]["monolith_batch"]) == (
            "equal_steps",
            6400,
            256,
        )
        assert (m["seeds"]["trainings"], c["evaluation"]["seeds"]) == (3, 2)
    assert [round(m["seconds"] / 60, 1) for m in (first, second)] == [30.8, 10.1]
    assert "(30.8 min), the same with `--set reproduce.monolith_lr=8e-3 --reuse OUT` (10.1 min)" in text()
    assert base.replace("--set reproduce.monolith_lr=", "--set reproduce.monolith_lr=1.6e-2 --out OUT") in text()
    # the second run trains only its monoliths: every expert and router is the first run's
    for t in second["artefacts"]["trainings"]:
        assert all(e["reused"] for e in t["experts"].values()) and not t["monolith"]["reused"]


def test_the_networks_are_the_sweeps_and_the_routers_the_shared_runs():
    """Per training, the experts of clusters 0, 3 and 4 and the monolith have the tensor hashes of the rate sweep's
    records at these rates (so the rates were picked on these trainings), and the routers those of the shared run."""
    records = load("gmm_capacity_pilot.json")
    records = records["records"] if isinstance(records, dict) else records

    def sweep(label: str, training: int) -> dict:
        (r,) = [r for r in records if (r["label"], r["steps"], r.get("training", 0)) == (label, 6400, training)]
        return r["tensor_sha256"]

    for rate in OWN:
        for i, t in enumerate(manifest(rate)["artefacts"]["trainings"]):
            experts = sweep(SWEEP["experts"], i)
            for k in (0, 3, 4):
                assert t["experts"][f"cluster-{k}-fm"]["tensor_sha256"] == experts[f"experts/cluster-{k}-fm"]
            assert t["monolith"]["tensor_sha256"] == sweep(SWEEP[rate], i)["monolith"]
            shared = manifest(None)["artefacts"]["trainings"][i]["router"]
            assert t["router"]["tensor_sha256"] == shared["tensor_sha256"]
    assert "are, bit for bit, the sweep's networks at these rates" in text()
    assert "the routers are those of the shared-rate run, bit for bit" in text()


def test_the_table_is_the_runs():
    rows = doc_claims.md_table(doc_claims.raw_passage(START, END), "| experts · monolith |")
    assert rows[1:] == [
        [
            label,
            iv(paired(rate, TOP2_MONOLITH), 1),
            iv(paired(rate, TOP2_MONOLITH, "mmd2"), 2, 1e3),
            iv(ladder_excess(rate), 3),
        ]
        for label, rate in (
            ("2×10⁻³ · 2×10⁻³ (the rung of **In short**)", None),
            ("8×10⁻³ · 1.6×10⁻²", 1.6e-2),
            ("8×10⁻³ · 8×10⁻³", 8e-3),
        )
    ]
    assert manifest(None)["config"]["expert"]["optim"]["lr"] == 2e-3
    assert manifest(None)["config"]["reproduce"].get("monolith_lr", 0) == 0
    for rate in OWN:  # the ladder record reads the same runs: its paired difference is the manifest's
        (rung,) = [g for g in load(LADDER)["rungs"] if g["label"] == OWN[rate]]
        assert rung["paired"]["8FM"]["top2 − monolith"]["delta_log_density"] == paired(rate, TOP2_MONOLITH)


def test_the_readings_are_the_runs():
    t = text()
    lead = {r: paired(r, TOP2_MONOLITH)["per_training"] for r in (None, *OWN)}
    moves = [change(lead[None], lead[r]) for r in OWN]
    assert all(m["lo"] < 0 < m["hi"] for m in moves)
    assert (
        f"it changes by {iv(moves[0], 1)} nats (the monolith at 1.6×10⁻²) and {iv(moves[1], 1)} (at 8×10⁻³): ties" in t
    )
    top2 = change(row(None, "8FM · top2"), row(1.6e-2, "8FM · top2"))
    assert row(1.6e-2, "8FM · top2") == row(8e-3, "8FM · top2")  # the same experts and router, reused
    mono = [change(row(None, "monolith (equal compute)"), row(r, "monolith (equal compute)")) for r in OWN]
    between = change(row(1.6e-2, "monolith (equal compute)"), row(8e-3, "monolith (equal compute)"))
    assert top2["lo"] > 0 and all(m["lo"] > 0 for m in mono) and between["lo"] < 0 < between["hi"]
    assert (
        f"the top-2 row by {iv(top2, 1)} nats, the monolith's by {iv(mono[0], 1)} and {iv(mono[1], 1)}; its two "
        f"rates tie ({iv(between, 1)})"
    ) in t
    mmd = [
        change(paired(None, TOP2_MONOLITH, "mmd2")["per_training"], paired(r, TOP2_MONOLITH, "mmd2")["per_training"])
        for r in OWN
    ]
    assert paired(None, TOP2_MONOLITH, "mmd2")["resolved"] and all(m["hi"] < 0 for m in mmd)
    assert not any(paired(r, TOP2_MONOLITH, "mmd2")["resolved"] for r in OWN)
    assert f"moves by {iv(mmd[0], 2, 1e3)} and {iv(mmd[1], 2, 1e3)} (×10⁻³) and is a tie at either rate" in t
    top1, full = paired(1.6e-2, "8FM: top2 − top1"), paired(1.6e-2, "8FM: top2 − full")
    assert not top1["resolved"] and full["resolved"] and full["hi"] < 0
    assert max(abs(top1["mean"]), abs(full["mean"])) < 0.1
    assert f"top-2 − top-1 {iv(top1, 2)} (a tie), top-2 − full {iv(full, 2)} (full ahead, resolved)" in t
    for what in ("8FM: top2 − top1", "8FM: top2 − full", GAP, FIRST, SECOND):  # the monolith plays no part
        assert paired(1.6e-2, what) == paired(8e-3, what)


def test_the_routers_share_is_the_runs():
    t = text()
    gap = {r: paired(r, GAP) for r in (None, 1.6e-2)}
    closed = change(gap[None]["per_training"], gap[1.6e-2]["per_training"])
    assert closed["lo"] > 0
    assert (
        f"halves, from {iv(gap[None], 1)} to {iv(gap[1.6e-2], 1)} nats ({iv(closed, 1)} paired)" in t
        and 0.4 < gap[1.6e-2]["mean"] / gap[None]["mean"] < 0.5
    )
    assert paired(None, FIRST) == paired(1.6e-2, FIRST)  # the same router at exact experts
    assert f"costs {iv(paired(None, FIRST), 1)} with exact experts, as before, and {iv(paired(1.6e-2, SECOND), 1)}" in t
    assert f"({iv(paired(None, SECOND), 1)} at the shared rate)" in t
    share = {  # ratio of the means, as the In-short bullet gives it
        (r, w): 100 * paired(r, w)["mean"] / gap[r]["mean"] for r in (None, 1.6e-2) for w in (FIRST, SECOND)
    }
    assert (
        f"from {share[None, FIRST]:.1f} % to {share[1.6e-2, FIRST]:.1f} % with the router exchanged first and from "
        f"{share[None, SECOND]:.1f} % to {share[1.6e-2, SECOND]:.1f} % with it exchanged second"
    ) in t

    def per_training(r: float | None, w: str) -> list[float]:
        return [100 * a / b for a, b in zip(paired(r, w)["per_training"], gap[r]["per_training"], strict=True)]

    rises = [change(per_training(None, w), per_training(1.6e-2, w)) for w in (FIRST, SECOND)]
    assert all(x["lo"] > 0 for x in rises)
    assert f"({iv(rises[0], 1)} and {iv(rises[1], 1)} points, each training's share paired by training)" in t


@pytest.mark.parametrize("rate", sorted(OWN))
def test_the_excess_loss_gap_is_above_zero_on_every_cluster(rate):
    (rung,) = [g for g in load(LADDER)["rungs"] if g["label"] == OWN[rate]]
    assert all(c["lo"] > 0 for c in rung["monolith_minus_expert_by_cluster"].values())


def test_in_short_names_the_own_rates():
    bullet = doc_claims.passage("- **Each side at its own rate**", "- **By MMD².**")
    lead = {r: paired(r, TOP2_MONOLITH) for r in (None, *OWN)}
    moves = change(lead[None]["per_training"], lead[1.6e-2]["per_training"])
    assert f"top-2's lead holds ({iv(lead[1.6e-2], 1)} and {iv(lead[8e-3], 1)}" in bullet
    assert f"its change from the shared rate {iv(moves, 1)}, a tie" in bullet
    assert num(100 * paired(1.6e-2, SECOND)["mean"] / paired(1.6e-2, GAP)["mean"], 1, sign=False) in bullet
