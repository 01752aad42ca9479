"""reproduce.budget: the steps and batches of experts and monolith under equal_images and equal_steps."""

import dataclasses

import torch

from hddm_flower.budget import budget_of, describe, expert_config
from hddm_flower.config.io import config_from_dict
from hddm_flower.data import Dataset


def _cfg(budget: str, **expert):
    return config_from_dict({"num_experts": 8, "reproduce": {"budget": budget}, "expert": expert}, "budget-test")


def test_equal_images_gives_the_monolith_k_times_the_steps_at_the_same_batch():
    b = budget_of(_cfg("equal_images", steps=200, batch_size=32))
    assert (b.expert_steps, b.expert_batch, b.monolith_steps, b.monolith_batch) == (200, 32, 1600, 32)
    assert b.monolith_images == 8 * b.expert_images == 8 * 200 * 32
    cfg = _cfg("equal_images", steps=200, batch_size=32)
    assert expert_config(cfg) is cfg


def test_equal_steps_splits_the_batch_among_the_experts():
    """DDM: every side the same steps; the monolith's batch B split into K expert batches of B / K, so the images
    seen are equal too (also with gradient accumulation)."""
    cfg = _cfg("equal_steps", steps=800, batch_size=64, grad_accumulation=2)
    b = budget_of(cfg)
    assert (b.expert_steps, b.expert_batch, b.monolith_steps, b.monolith_batch) == (800, 8, 800, 64)
    assert b.monolith_images == 8 * b.expert_images == 800 * 64 * 2
    e = expert_config(cfg).expert
    assert (e.steps, e.batch_size, e.grad_accumulation) == (800, 8, 2)
    assert "each of the 8 experts 800 steps × batch 8, the monolith 800 steps × batch 64" in describe(
        dataclasses.asdict(b)
    )


def test_the_monolith_and_the_experts_train_on_their_budget(tiny_config, dataset_dir, tmp_path):
    """Under equal_steps the trained monolith takes expert.steps steps of expert.batch_size and an expert the same
    steps of batch / K, as their metadata records. The monolith's cache key differs from equal_images'; the
    experts' is that of equal_images experts trained alike (batch / K, the same steps), so the two share them."""
    from hddm_flower.reproduce.training import (
        dataset_id,
        expert_fingerprint,
        monolith_fingerprint,
        train_monolith,
        train_or_reuse_experts,
    )

    k = tiny_config.num_experts
    cfg = dataclasses.replace(
        tiny_config,
        expert=dataclasses.replace(tiny_config.expert, steps=2, batch_size=2 * k),
        reproduce=dataclasses.replace(tiny_config.reproduce, budget="equal_steps"),
    )
    dataset = Dataset.open(dataset_dir)
    _, _, meta = train_monolith(cfg, dataset)
    assert (meta["steps"], meta["batch_size"], meta["budget"]) == (2, 2 * k, "equal_steps")
    data_id = dataset_id(dataset)
    (t,) = train_or_reuse_experts([cfg], [tmp_path], dataset, [(0, "fm")], data_id, 1, False)
    expert = __import__("json").loads((tmp_path / "experts" / "cluster-0-fm" / "hddm_expert.json").read_text())
    assert (expert["steps"], expert["batch_size"]) == (2, 2)
    assert not t["experts"]["cluster-0-fm"]["reused"]
    assert monolith_fingerprint(cfg, data_id) != monolith_fingerprint(tiny_config, data_id)
    alike = dataclasses.replace(tiny_config, expert=dataclasses.replace(tiny_config.expert, steps=2, batch_size=2))
    assert (
        expert_fingerprint(cfg, data_id) == expert_fingerprint(alike, data_id) == monolith_fingerprint(alike, data_id)
    )
    assert expert_fingerprint(cfg, data_id) != expert_fingerprint(tiny_config, data_id)
    assert t["fingerprint"] == expert_fingerprint(cfg, data_id) and t["monolith_fingerprint"] != t["fingerprint"]


def test_the_ladder_and_capacity_configs_load_with_their_budgets():
    """The shipped GMM variants: equal_steps (each expert at 256 / 8 = 32, the monolith 200 steps × 256, three
    trainings) and the capacity-limited mixture (48 components of rank 12 in 3×12×12), whose mixture builds."""
    from pathlib import Path

    from hddm_flower.config.io import load_config
    from hddm_flower.gmm.dataset import GMMSpec, make_mixture

    root = Path(__file__).parent.parent / "configs"
    steps = load_config(root / "reproduce-gmm-equal-steps.yaml")
    b = budget_of(steps)
    assert (b.protocol, b.expert_steps, b.expert_batch, b.monolith_steps, b.monolith_batch) == (
        "equal_steps",
        200,
        32,
        200,
        256,
    )
    assert steps.evaluation.training_seeds == 3
    cap = load_config(root / "reproduce-gmm-capacity.yaml")
    d = cap.data
    assert (d.image_size, d.gmm_components, d.gmm_rank, cap.expert.preset) == (12, 6, 12, "mini")
    assert budget_of(cap).expert_batch == 32
    spec = GMMSpec(cap.num_experts, d.gmm_components, d.image_size, d.gmm_channels, d.gmm_rank, d.gmm_samples)
    mixture, captions, _ = make_mixture(spec)
    assert (mixture.num_components, mixture.dim, mixture.factors.shape[-1]) == (48, 432, 12)
    assert len(set(captions)) == 48


def test_the_nano_config_gives_every_network_the_same_small_architecture_and_the_same_steps():
    """reproduce-gmm-nano.yaml: the ladder's mixture, nano experts and a nano monolith (one preset for both),
    800 steps each under equal_steps (experts at 32, the monolith at 256), cosine to zero, three trainings, 8FM."""
    from pathlib import Path

    from hddm_flower.config.io import load_config

    root = Path(__file__).parent.parent / "configs"
    nano, ladder = load_config(root / "reproduce-gmm-nano.yaml"), load_config(root / "reproduce-gmm-equal-steps.yaml")
    assert nano.data == ladder.data  # the same mixture as the ladder's rungs: only the network and its schedule differ
    b = budget_of(nano)
    assert (b.protocol, b.expert_steps, b.expert_batch, b.monolith_steps, b.monolith_batch) == (
        "equal_steps",
        800,
        32,
        800,
        256,
    )
    assert (nano.objectives.ddpm, nano.objectives.fm, nano.reproduce.ddpm_counts) == (0, 8, [0])  # 8FM only
    assert (nano.expert.preset, nano.expert.optim.lr, nano.expert.optim.schedule) == ("nano", 2e-3, "cosine")
    assert (nano.expert.optim.warmup_steps, nano.expert.optim.min_lr_ratio) == (20, 0.0)
    assert (nano.evaluation.training_seeds, nano.evaluation.seeds) == (3, 2)


def test_the_monolith_trains_at_its_own_learning_rate_where_one_is_set(tiny_config, dataset_dir):
    """reproduce.monolith_lr: the monolith trains as a monolith whose expert.optim.lr is that rate (the same
    weights, bit for bit) and not as one at the experts' rate; its cache key moves with it and the experts' does not.
    A rate equal to the experts' keys as 0 (the default) does."""
    from hddm_flower.reproduce.training import dataset_id, expert_fingerprint, monolith_fingerprint, train_monolith

    def with_rates(expert_lr: float, monolith_lr: float):
        optim = dataclasses.replace(tiny_config.expert.optim, lr=expert_lr)
        return dataclasses.replace(
            tiny_config,
            expert=dataclasses.replace(tiny_config.expert, steps=3, optim=optim),
            reproduce=dataclasses.replace(tiny_config.reproduce, monolith_lr=monolith_lr),
        )

    dataset = Dataset.open(dataset_dir)
    own, base, as_experts = with_rates(1e-3, 5e-2), with_rates(1e-3, 0.0), with_rates(5e-2, 0.0)
    trained = {name: train_monolith(c, dataset) for name, c in [("own", own), ("base", base), ("as", as_experts)]}
    assert trained["own"][2]["lr"] == 5e-2 and trained["base"][2]["lr"] == 1e-3
    for key, value in trained["own"][0].items():
        assert torch.equal(value, trained["as"][0][key]), key
    assert any(not torch.equal(v, trained["base"][0][k]) for k, v in trained["own"][0].items())
    data_id = dataset_id(dataset)
    assert monolith_fingerprint(own, data_id) == monolith_fingerprint(as_experts, data_id)
    assert monolith_fingerprint(own, data_id) != monolith_fingerprint(base, data_id)
    assert expert_fingerprint(own, data_id) == expert_fingerprint(base, data_id)
    assert monolith_fingerprint(with_rates(1e-3, 1e-3), data_id) == monolith_fingerprint(base, data_id)


def test_a_negative_monolith_learning_rate_is_a_config_error():
    import pytest

    from hddm_flower.config.rules import ConfigError

    with pytest.raises(ConfigError, match="reproduce.monolith_lr: must be ≥ 0"):
        config_from_dict({"reproduce": {"monolith_lr": -1e-3}}, "budget-test")


def test_through_the_pipeline_the_monolith_takes_its_rate_and_the_experts_no_other_rates_training(
    tiny_config, dataset_dir, tmp_path
):
    """train_or_reuse_experts with reproduce.monolith_lr: the monolith is trained at that rate under its own key.
    Under equal_images the monolith's key at a rate of its own is that of experts trained at that rate, so a run at
    the experts' rate 1e-3 into an output whose experts were trained at 5e-2 must still refuse them, not take them
    for experts of an older key."""
    import json

    import pytest

    from hddm_flower.config.rules import ConfigError
    from hddm_flower.reproduce.training import dataset_id, monolith_fingerprint, train_or_reuse_experts

    def with_rates(expert_lr: float, monolith_lr: float):
        optim = dataclasses.replace(tiny_config.expert.optim, lr=expert_lr)
        return dataclasses.replace(
            tiny_config,
            expert=dataclasses.replace(tiny_config.expert, steps=2, optim=optim),
            reproduce=dataclasses.replace(tiny_config.reproduce, budget="equal_images", monolith_lr=monolith_lr),
        )

    dataset = Dataset.open(dataset_dir)
    data_id = dataset_id(dataset)
    own = with_rates(1e-3, 5e-2)
    (t,) = train_or_reuse_experts([own], [tmp_path / "own"], dataset, [(0, "fm")], data_id, 1, False)
    meta = json.loads((tmp_path / "own" / "monolith" / "hddm_expert.json").read_text())
    expert = json.loads((tmp_path / "own" / "experts" / "cluster-0-fm" / "hddm_expert.json").read_text())
    assert (meta["lr"], expert["lr"]) == (5e-2, 1e-3)
    assert t["monolith_fingerprint"] == meta["reproduce_fingerprint"] == monolith_fingerprint(own, data_id)
    train_or_reuse_experts([with_rates(5e-2, 0.0)], [tmp_path / "fast"], dataset, [(0, "fm")], data_id, 1, False)
    with pytest.raises(ConfigError, match="cluster-0-fm was trained with another config"):
        train_or_reuse_experts([own], [tmp_path / "fast"], dataset, [(0, "fm")], data_id, 1, False)


def test_the_tables_name_the_monolith_s_own_rate_beside_the_experts():
    from hddm_flower.budget import describe_rates

    rates = {"expert": {"optim": {"lr": 8e-3}}}
    assert describe_rates(rates | {"reproduce": {"monolith_lr": 1.6e-2}}) == "learning rate 0.008 (the monolith 0.016)"
    assert describe_rates(rates | {"reproduce": {"monolith_lr": 0.0}}) == "learning rate 0.008"
    assert describe_rates(rates | {"reproduce": {"monolith_lr": 8e-3}}) == "learning rate 0.008"
    assert describe_rates(rates) == "learning rate 0.008"  # a manifest written before the key existed
