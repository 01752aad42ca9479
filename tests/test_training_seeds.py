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
