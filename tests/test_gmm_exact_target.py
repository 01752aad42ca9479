"""The capacity probe's exact target (benchmarks/gmm_exact_target.py): the velocity it regresses against the exact
nets and the closed form, in float64, over a grid of t with both endpoints; its draws; and that a network trained on
it learns."""

import dataclasses

import pytest
import torch

from benchmarks.gmm_exact_target import ExactTarget, train_on_exact
from hddm_flower.data import Dataset
from hddm_flower.gmm.dataset import GMMSpec, load_reference, prepare_gmm
from hddm_flower.gmm.exact import CaptionIndex, ExactNet
from hddm_flower.gmm.yardsticks import velocity_gain
from hddm_flower.models import TextCond
from hddm_flower.objectives import FM_TIME_SCALE

TIMES = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)
f64 = torch.float64


@pytest.fixture(scope="module")
def gmm(tmp_path_factory):
    spec = GMMSpec(num_clusters=3, components_per_cluster=2, image_size=4, channels=1, rank=2, num_samples=90)
    dataset = Dataset.open(prepare_gmm(tmp_path_factory.mktemp("gmm-cache"), spec, max_caption_tokens=8))
    return load_reference(dataset), dataset


def _captions(ref, comps: torch.Tensor, empty: torch.Tensor) -> TextCond:
    """Each row's component caption, or the empty caption where ``empty``."""
    n = len(comps)
    u = TextCond(ref.uncond.states.expand(n, -1, -1), ref.uncond.mask.expand(n, -1))
    c = TextCond(ref.cond.states[comps], ref.cond.mask[comps])
    return TextCond(torch.where(empty[:, None, None], u.states, c.states), torch.where(empty[:, None], u.mask, c.mask))


def _draws(ref, n: int, seed: int):
    """x_t at every t of the grid (n per t, one t per row: the target's rows each have their own)."""
    g = torch.Generator().manual_seed(seed)
    C, S, _ = ref.shape
    t = torch.tensor(TIMES, dtype=f64).repeat_interleave(n)
    x0, comps = ref.mixture.sample(len(t), g)
    x_t = (1 - t[:, None]) * x0 + t[:, None] * torch.randn(x0.shape, generator=g, dtype=f64)
    return x_t.reshape(-1, C, S, S), t, comps


def test_on_one_clusters_components_the_target_is_the_exact_nets_velocity(gmm):
    ref, _ = gmm
    x_t, t, comps = _draws(ref, 6, 0)
    empty = torch.arange(len(t)) % 3 == 0  # every third row with the empty caption
    cond = _captions(ref, comps, empty)
    for k in range(ref.num_clusters):
        members = (ref.cluster_of == k).nonzero().squeeze(1)
        expected = ExactNet(ref, k, "fm")(x_t, FM_TIME_SCALE * t, cond)
        torch.testing.assert_close(ExactTarget(ref, members)(x_t, t, cond), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("t", TIMES)
def test_under_a_components_caption_the_monoliths_target_is_that_components_affine_velocity(gmm, t):
    # a caption names one component, so v* = M(x − aμ) − μ with M = (sI − aΣ)(a²Σ + s²I)⁻¹, a = 1 − t, s = t:
    # at t = 0 it is −x, at t = 1 it is x − μ
    ref, _ = gmm
    target = ExactTarget(ref, torch.arange(len(ref.cluster_of)))
    cov = ref.mixture.covariance()
    g = torch.Generator().manual_seed(1)
    C, S, _ = ref.shape
    for j in range(len(ref.cluster_of)):
        x = torch.randn(5, C * S * S, generator=g, dtype=f64)
        tt = torch.full((5,), t, dtype=f64)
        cond = _captions(ref, torch.full((5,), j), torch.zeros(5, dtype=torch.bool))
        mu = ref.mixture.means[j]
        closed = (x - (1 - t) * mu) @ velocity_gain(cov[j], t).T - mu
        got = target(x.reshape(5, C, S, S), tt, cond).reshape(5, -1)
        torch.testing.assert_close(got, closed, rtol=1e-9, atol=1e-9)
        if t == 0.0:
            torch.testing.assert_close(got, -x, rtol=1e-12, atol=1e-12)
        if t == 1.0:
            torch.testing.assert_close(got, x - mu, rtol=1e-12, atol=1e-12)


def test_under_the_empty_caption_the_target_is_the_velocity_of_all_the_networks_components(gmm):
    ref, _ = gmm
    x_t, t, comps = _draws(ref, 4, 2)
    cond = _captions(ref, comps, torch.ones(len(t), dtype=torch.bool))
    flat = x_t.reshape(len(t), -1)
    everything = torch.arange(len(ref.cluster_of))
    torch.testing.assert_close(
        ExactTarget(ref, everything)(x_t, t, cond).reshape(len(t), -1), ref.mixture.fm_velocity(flat, t)
    )
    members = (ref.cluster_of == 1).nonzero().squeeze(1)
    torch.testing.assert_close(
        ExactTarget(ref, members)(x_t, t, cond).reshape(len(t), -1), ref.mixture.subset(members).fm_velocity(flat, t)
    )


class _Uniform:
    """An adapter's training-time draw (what FlowMatchingExpert does with uniform time sampling)."""

    def training_times(self, n, generator, like):
        return torch.rand(n, generator=generator, dtype=like.dtype)


def test_a_batch_draws_the_members_with_their_captions_drops_captions_at_the_rate_and_targets_v_star(gmm):
    ref, _ = gmm
    members = (ref.cluster_of == 2).nonzero().squeeze(1)
    target = ExactTarget(ref, members)
    x_t, t, cond, v = target.batch(_Uniform(), 4000, 0.25, torch.Generator().manual_seed(3))
    assert x_t.dtype == t.dtype == v.dtype == torch.float32 and x_t.shape == (4000, *ref.shape)
    comp = CaptionIndex(ref)(cond)
    dropped = comp < 0
    assert abs(float(dropped.float().mean()) - 0.25) < 0.03  # 4 standard deviations of the rate
    assert set(comp[~dropped].tolist()) == set(members.tolist())  # every member drawn, nothing else
    assert 0 <= float(t.min()) and float(t.max()) < 1
    torch.testing.assert_close(v, target(x_t.double(), t.double(), cond).float(), rtol=1e-5, atol=1e-5)
    # the batches are the generator's: the same seed gives the same draws
    again = target.batch(_Uniform(), 4000, 0.25, torch.Generator().manual_seed(3))
    assert torch.equal(again[0], x_t) and torch.equal(again[3], v)


def test_a_network_trained_on_the_exact_target_comes_closer_to_it(gmm, tiny_config):
    from hddm_flower.stages.expert import build_expert

    ref, dataset = gmm
    members = (ref.cluster_of == 0).nonzero().squeeze(1)
    target = ExactTarget(ref, members)
    torch.manual_seed(0)
    expert, _, _ = build_expert(tiny_config, dataset.meta, "fm")
    held = target.batch(expert, 512, 0.0, torch.Generator().manual_seed(9))

    def excess() -> float:
        with torch.no_grad():
            return float(((expert.velocity(*held[:3]) - held[3]) ** 2).mean())

    before = excess()
    options = dataclasses.replace(tiny_config.expert, optim=dataclasses.replace(tiny_config.expert.optim, lr=1e-2))
    stats = train_on_exact(expert, target, options, batch=32, steps=60, seed=0, name="test")
    assert stats.images_seen == 60 * 32 and not expert.training
    assert excess() < 0.2 * before  # (1.34 → 0.11 when written)


class _Fixed:
    """An adapter whose training draws every t at ``t``."""

    def __init__(self, t: float):
        self.t = t

    def training_times(self, n, generator, like):
        return torch.full((n,), self.t, dtype=like.dtype)


def test_a_batch_puts_its_members_draws_at_t_0_and_pure_noise_at_t_1_with_the_experts_own_times(gmm):
    # x_t = (1 − t)·x0 + t·ε at the times the adapter draws: at t = 0 the members' own draws (each in the component
    # its caption names), at t = 1 standard normal noise whatever the data
    ref, _ = gmm
    members = (ref.cluster_of == 1).nonzero().squeeze(1)
    target = ExactTarget(ref, members)
    x_t, t, cond, _ = target.batch(_Fixed(0.0), 2000, 0.0, torch.Generator().manual_seed(5))
    assert bool((t == 0).all())
    named = CaptionIndex(ref)(cond)
    nearest = ref.mixture.component_of(x_t.double().reshape(len(x_t), -1))
    assert set(named.tolist()) == set(members.tolist())
    # (the tiny mixture's components overlap: 0.71 of the draws are nearest their own and 0.97 in the cluster; pure
    # noise gives 0.03 and 0.09, draws of every component 0.26 and 0.44)
    assert float((nearest == named).float().mean()) > 0.6 and float(torch.isin(nearest, members).float().mean()) > 0.9
    x_t, t, _, v = target.batch(_Fixed(1.0), 4000, 0.0, torch.Generator().manual_seed(6))
    flat = x_t.double().reshape(len(x_t), -1)
    assert bool((t == 1).all()) and float(flat.mean(0).abs().max()) < 0.1 and abs(float(flat.var(0).mean()) - 1) < 0.05


def test_the_probes_networks_start_where_the_datas_do_at_their_budget_with_their_seeds(gmm, tiny_config, monkeypatch):
    """train_network against train_one_expert and train_monolith (equal steps, training 1, the monolith at a
    learning rate of its own): the same initial weights, seed, batch, steps and rate for each expert and the
    monolith; only what they regress differs."""
    import benchmarks.gmm_exact_target as probe
    import hddm_flower.reproduce.training as monolith_path
    import hddm_flower.stages.expert as expert_path
    from hddm_flower.budget import budget_of
    from hddm_flower.budget import expert_config as budget_expert_config
    from hddm_flower.config.io import config_from_dict
    from hddm_flower.training import TrainStats
    from hddm_flower.training_seeds import training_config

    ref, dataset = gmm
    d = tiny_config.to_dict()
    d |= {"num_experts": 3, "objectives": {"ddpm": 0, "fm": 3}}
    d["expert"] |= {"steps": 5, "batch_size": 12}
    d["reproduce"] |= {"budget": "equal_steps", "monolith_lr": 7e-3}
    cfg = training_config(config_from_dict(d, "test"), 1)
    seen = {}

    def capture(kind):
        def fake(expert, *args, **kw):
            first = {n: v.clone() for n, v in expert.net.transformer.state_dict().items()}
            if kind == "probe":
                target = args[0]
                seen[kind] = (first, kw["seed"], kw["batch"], kw["steps"], args[1].optim.lr, target.members.tolist())
            else:
                o = args[2]
                seen[kind] = (first, kw["seed"], o.batch_size, o.steps, o.optim.lr)
            return TrainStats()

        return fake

    monkeypatch.setattr(probe, "train_on_exact", capture("probe"))
    monkeypatch.setattr(expert_path, "train_expert", capture("data"))
    monkeypatch.setattr(monolith_path, "train_expert", capture("data"))
    b = budget_of(cfg)
    for k in (None, 0, 2):
        _, _, meta = probe.train_network(cfg, dataset, k)
        if k is None:
            monolith_path.train_monolith(cfg, dataset)
            members, batch, steps = list(range(len(ref.cluster_of))), b.monolith_batch, b.monolith_steps
        else:
            expert_path.train_one_expert(budget_expert_config(cfg), dataset, k, "fm")
            members = (ref.cluster_of == k).nonzero().squeeze(1).tolist()
            batch, steps = b.expert_batch, b.expert_steps
        weights, seed, *rest = seen["probe"]
        data_weights, data_seed, *data_rest = seen["data"]
        lr = 7e-3 if k is None else cfg.expert.optim.lr
        assert rest == [batch, steps, lr, members] and data_rest == [batch, steps, lr] and meta["lr"] == lr, k
        assert seed == data_seed and all(torch.equal(weights[n], data_weights[n]) for n in data_weights), k
        assert meta["target"] == "exact" and meta["batch_size"] == batch and meta["steps"] == steps
    assert (b.expert_batch, b.monolith_batch, b.expert_steps, b.monolith_steps) == (4, 12, 5, 5)


def test_the_probe_refuses_what_it_does_not_train_with(gmm, tiny_config):
    ref, _ = gmm
    target = ExactTarget(ref, (ref.cluster_of == 0).nonzero().squeeze(1))
    for change, what in (({"ema_decay": 0.99}, "ema_decay"), ({"mixed_precision": "bf16"}, "mixed_precision")):
        options = dataclasses.replace(tiny_config.expert, **change)
        with pytest.raises(ValueError, match=f"expert.{what}="):
            train_on_exact(None, target, options, batch=2, steps=1, seed=0, name="x")


def test_the_pilot_reuses_a_network_only_for_the_target_that_trained_it(tmp_path, tiny_config):
    import json

    from benchmarks.gmm_capacity_pilot import train
    from hddm_flower.checkpoints import META

    for found, asked in (("exact", "data"), (None, "exact")):
        root = tmp_path / str(found)
        (root / "monolith").mkdir(parents=True)
        (root / "monolith" / META).write_text(json.dumps({} if found is None else {"target": found}))
        with pytest.raises(ValueError, match=f"trained on the {found or 'data'} target, not the {asked} one"):
            train(tiny_config, None, root, [], only="monolith", target=asked)
