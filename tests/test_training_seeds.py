"""Independent trainings: their seeds, and intervals over trainings (outer) and sampling seeds (inner)."""

import math

import pytest
from scipy import stats

from hddm_flower.config import Config
from hddm_flower.config_rules import ConfigError
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
