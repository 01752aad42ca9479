"""Independent trainings in the intervals: the seeds of training i, and intervals over trainings (outer) and
sampling seeds (inner).

An interval over sampling seeds of one training says how well that training's score is known; it says nothing
about another training of the same config. ``evaluation.training_seeds`` = N asks for N independent trainings of
the experts and the router (training i seeds them ``TRAINING_SEED_STRIDE·i`` further on), each evaluated on the
same sampling seeds; :func:`nested_interval` summarises ``values[i][j]`` (training i, sampling seed j): the
Student-t interval of the per-training means over the N trainings (what a fresh training would give on average),
beside the mean half-width of the per-training intervals over sampling seeds. Comparisons are paired by training
and seed (:func:`paired`): the same training index uses the same seeds in every configuration.
"""

from __future__ import annotations

import copy

from .choices import MAX_SEED
from .config.io import config_from_dict
from .config.rules import ConfigError
from .config.schema import Config
from .gmm.truth import interval

TRAINING_SEED_STRIDE = 100_003
"""Seed offset between trainings (a prime far above any expert id or per-expert offset)."""


def training_config(cfg: Config, i: int) -> Config:
    """``cfg`` for independent training ``i`` (0 = ``cfg`` itself): expert and router seeds moved by
    ``i·TRAINING_SEED_STRIDE``; sampling and evaluation seeds unchanged (inference stays aligned)."""
    if i == 0:
        return cfg
    d = copy.deepcopy(cfg.to_dict())
    for section in ("expert", "router"):
        d[section]["seed"] = d[section]["seed"] + i * TRAINING_SEED_STRIDE
        if d[section]["seed"] > MAX_SEED:
            raise ConfigError(f"{section}.seed: training {i} would need seed {d[section]['seed']} > {MAX_SEED}")
    return config_from_dict(d, f"training {i}")


def nested_interval(values: list[list[float]], level: float = 0.95) -> dict:
    """``values[i][j]`` for training i and sampling seed j: the interval over trainings of the per-training means
    (``mean``, ``lo``, ``hi``, ``half``, ``n`` = trainings) plus ``inner_half``, the mean half-width over sampling
    seeds within one training, and the ``per_training`` means."""
    if not values or any(not v for v in values):
        raise ValueError("nested_interval needs at least one sampling seed of at least one training")
    per_training = [sum(v) / len(v) for v in values]
    inner = [interval(v, level)["half"] for v in values]
    return interval(per_training, level) | {
        "trainings": len(values),
        "seeds": min(len(v) for v in values),
        "inner_half": sum(inner) / len(inner),
        "per_training": per_training,
    }


def paired(a: list[list[float]], b: list[list[float]]) -> list[list[float]]:
    """``a − b`` by training and sampling seed (both laid out as ``values[i][j]``)."""
    if len(a) != len(b) or any(len(x) != len(y) for x, y in zip(a, b)):
        raise ValueError("paired differences need the same trainings and seeds on both sides")
    return [[x - y for x, y in zip(u, v)] for u, v in zip(a, b)]
