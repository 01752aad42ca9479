"""Independent trainings: their seeds, and intervals over trainings (outer) and sampling seeds (inner)."""

import math

import pytest
from scipy import stats

from hddm_flower.config.rules import ConfigError
from hddm_flower.config.schema import Config
from hddm_flower.training_seeds import TRAINING_SEED_STRIDE, nested_interval, paired, training_config


def test_training_config_moves_training_seeds_only():
    cfg = Config()
    assert training_config(cfg, 0) is cfg
    c2 = training_config(cfg, 2)
    assert c2.expert.seed == cfg.expert.seed + 2 * TRAINING_SEED_STRIDE
    assert c2.router.seed == cfg.router.seed + 2 * TRAINING_SEED_STRIDE
    assert (c2.sampling.seed, c2.evaluation.seed) == (cfg.sampling.seed, cfg.evaluation.seed)
    with pytest.raises(ConfigError, match="expert.seed"):
        training_config(cfg, 2**31 // TRAINING_SEED_STRIDE + 1)


def test_nested_interval_closed_form():
    """Outer: the Student-t interval of the per-training means; inner: the mean per-training half-width."""
    values = [[1.0, 3.0], [2.0, 2.0], [6.0, 4.0]]
    r = nested_interval(values)
    means = [2.0, 2.0, 5.0]
    sd = math.sqrt(sum((m - 3.0) ** 2 for m in means) / 2)
    assert r["mean"] == pytest.approx(3.0) and r["n"] == 3 and r["trainings"] == 3 and r["seeds"] == 2
    assert r["half"] == pytest.approx(stats.t.ppf(0.975, 2) * sd / math.sqrt(3))
    t1 = stats.t.ppf(0.975, 1)
    assert r["inner_half"] == pytest.approx((t1 * math.sqrt(2) / math.sqrt(2) * 2 + 0) / 3)
    assert r["per_training"] == means
    assert paired(values, [[1.0, 1.0]] * 3) == [[0.0, 2.0], [1.0, 1.0], [5.0, 3.0]]
    with pytest.raises(ValueError):
        paired(values, [[1.0]] * 3)
    with pytest.raises(ValueError):
        nested_interval([[]])


def test_paired_summary_says_what_its_interval_covers():
    """Several trainings: the Student-t interval over trainings of the per-training mean differences; one training:
    over its sampling seeds only (closed forms)."""
    from hddm_flower.gmm.compare import paired_summary

    a, b = [[3.0, 5.0], [4.0, 4.0], [9.0, 7.0]], [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
    r = paired_summary(a, b)  # differences per training: [3, 2, 5]
    sd = math.sqrt(((3 - 10 / 3) ** 2 + (2 - 10 / 3) ** 2 + (5 - 10 / 3) ** 2) / 2)
    assert r["covers"] == "trainings" and r["mean"] == pytest.approx(10 / 3)
    assert r["half"] == pytest.approx(stats.t.ppf(0.975, 2) * sd / math.sqrt(3)) and not r["resolved"]
    one = paired_summary([[3.0, 5.0, 1.0]], [[1.0, 1.0, 1.0]])  # differences per seed: [2, 4, 0]
    assert one["covers"] == "sampling seeds of one training" and one["per_seed"] == [2.0, 4.0, 0.0]
    assert one["half"] == pytest.approx(stats.t.ppf(0.975, 2) * 2 / math.sqrt(3)) and not one["resolved"]


def test_paired_truth_pairs_rows_by_training_and_seed():
    from hddm_flower.gmm.compare import comparisons, paired_truth

    def row(group, mode, router="trained", per_training=None):
        r = {"row": {"group": group, "mode": mode, "router": router, "experts": "trained"}}
        seeds = per_training[0] if per_training else [{"mmd2": 0.0}, {"mmd2": 1.0}]
        return r | {"per_seed": [{"mmd2": v["mmd2"]} for v in seeds]} | ({"per_training": per_training} or {})

    pt = lambda *vals: [[{"mmd2": v} for v in t] for t in vals]  # noqa: E731
    results = {
        "8FM · top2": row("8FM", "top2", per_training=pt([2.0, 4.0], [3.0, 7.0])),
        "8FM · full": row("8FM", "full", per_training=pt([1.0, 1.0], [1.0, 1.0])),
        "8FM · top2 · exact router": row("8FM", "top2", "exact", pt([0.0, 0.0], [0.0, 2.0])),
        "monolith (equal compute)": row("monolith", "top1", per_training=pt([1.0, 3.0], [2.0, 2.0])),
    }
    assert [w for w, _, _ in comparisons(results)] == [
        "8FM: top2 − full",
        "8FM: top2 − monolith",
        "8FM: top2, trained − exact router",
    ]
    got = {e["what"]: e["mmd2"] for e in paired_truth(results)}
    assert got["8FM: top2 − full"]["per_training"] == [2.0, 4.0]
    assert got["8FM: top2 − monolith"]["per_training"] == [1.0, 3.0]
    assert got["8FM: top2, trained − exact router"]["inner_half"] == pytest.approx(stats.t.ppf(0.975, 1) * 1.0)


def test_over_trainings_reads_the_kept_trainings_only():
    """Intervals over a subset of trainings are those of the kept trainings' values, in closed form; exact rows (no
    training) stay; one kept training leaves an interval over its sampling seeds; bad subsets are refused."""
    from hddm_flower.gmm.compare import over_trainings, paired_truth

    pt = lambda *vals: [[{"mmd2": v} for v in t] for t in vals]  # noqa: E731
    row = {"group": "8FM", "mode": "top2", "router": "trained", "experts": "trained"}
    top2 = pt([1.0, 3.0], [2.0, 2.0], [9.0, 9.0], [6.0, 4.0])  # per-training means 2, 2, 9, 5
    mono = pt([0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [1.0, 1.0])
    stale = {"metrics": {"mmd2": "training 0's"}, "nested": "all four", "per_sample_file": "training 0's"}
    results = {
        "exact": {"row": row | {"group": "exact"}, "per_seed": [{"mmd2": 0.5}, {"mmd2": 0.5}]},
        "8FM · top2": {"row": row, "per_seed": top2[0], "per_training": top2, "router_steps": [{"kl": [0.0]}]} | stale,
        "monolith (equal compute)": {"row": row | {"group": "monolith", "mode": "top1"}, "per_training": mono} | stale,
    }
    results["monolith (equal compute)"]["per_seed"] = mono[0]
    held = over_trainings(results, [0, 1, 3])  # training 2 left out
    r = held["8FM · top2"]
    sd = math.sqrt(((2 - 3) ** 2 + (2 - 3) ** 2 + (5 - 3) ** 2) / 2)
    assert r["nested"]["mmd2"]["mean"] == pytest.approx(3.0) and r["nested"]["mmd2"]["per_training"] == [2, 2, 5]
    assert r["nested"]["mmd2"]["half"] == pytest.approx(stats.t.ppf(0.975, 2) * sd / math.sqrt(3))
    assert r["per_seed"] == top2[0] and r["router_steps"] == [{"kl": [0.0]}] and r["per_sample_file"] == "training 0's"
    assert r["metrics"]["mmd2"]["mean"] == pytest.approx(2.0)  # training 0's, recomputed from its seeds
    assert held["exact"] is results["exact"]
    (lead,) = [e for e in paired_truth(held) if e["what"] == "8FM: top2 − monolith"]
    assert lead["mmd2"]["per_training"] == [2.0, 2.0, 4.0] and lead["mmd2"]["covers"] == "trainings"
    later = over_trainings(results, [3, 1])  # in the order given; training 0's own fields go with training 0
    assert later["8FM · top2"]["per_training"] == [top2[3], top2[1]]
    assert not {"router_steps", "per_sample_file"} & set(later["8FM · top2"])
    assert not {"router_steps", "per_sample_file"} & set(over_trainings(results, [1, 0])["8FM · top2"])  # not first
    assert later["8FM · top2"]["metrics"]["mmd2"]["mean"] == pytest.approx(5.0)
    one = over_trainings(results, [2])["8FM · top2"]
    assert "per_training" not in one and "nested" not in one and one["metrics"]["mmd2"]["half"] == 0.0
    assert "nested" not in over_trainings(results, [0])["8FM · top2"]  # no stale interval over all four either
    (lead,) = [e for e in paired_truth(over_trainings(results, [3])) if e["what"] == "8FM: top2 − monolith"]
    assert lead["mmd2"]["covers"] == "sampling seeds of one training" and lead["mmd2"]["per_seed"] == [5.0, 3.0]
    assert results["8FM · top2"]["per_training"] == top2 and results["8FM · top2"]["nested"] == "all four"  # untouched
    for bad, match in (
        ([4], "training 4: these results hold trainings 0–3"),
        ([1, 1], "each training once"),
        ([], "no training"),
    ):
        with pytest.raises(ValueError, match=match):
            over_trainings(results, bad)
