"""The exact prompt-aware router of a Gaussian mixture, p(k | x_t, t, c), in float64 against dense closed forms on a
t grid that includes both endpoints: the responsibilities over the components compatible with the caption."""

import dataclasses

import pytest
import torch

from hddm_flower.data import Dataset
from hddm_flower.ensemble import Ensemble
from hddm_flower.gmm.dataset import GMMSpec, load_reference, prepare_gmm
from hddm_flower.gmm.exact import ExactRouter, exact_expert
from hddm_flower.models import TextCond
from hddm_flower.text import pooled_caption
from tests.test_gmm import T_GRID, dense_moments

F64 = torch.float64


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    spec = GMMSpec(num_clusters=3, components_per_cluster=2, image_size=4, channels=1, rank=2, num_samples=90)
    return load_reference(Dataset.open(prepare_gmm(tmp_path_factory.mktemp("gmm-cache"), spec, max_caption_tokens=8)))


def _pooled(cond: TextCond, j: int, n: int) -> torch.Tensor:
    return pooled_caption(cond.states[j : j + 1].float(), cond.mask[j : j + 1].float()).expand(n, -1)


def _dense_posterior(ref, x_t: torch.Tensor, t: float, components: list[int]) -> torch.Tensor:
    """p(k | x_t, t, j ∈ components) by dense solves: π_j N(x_t; (1 − t)μ_j, (1 − t)²Σ_j + t²I) over the
    components, normalised, summed per cluster."""
    n = len(x_t)
    lj, _, _ = dense_moments(
        ref.mixture, x_t.flatten(1), torch.full((n,), 1 - t, dtype=F64), torch.full((n,), t, dtype=F64)
    )
    keep = torch.zeros(ref.mixture.num_components, dtype=torch.bool)
    keep[components] = True
    r = lj.masked_fill(~keep, float("-inf")).softmax(-1)
    return r @ torch.nn.functional.one_hot(ref.cluster_of, ref.num_clusters).double()


def test_a_components_caption_routes_to_its_cluster_on_the_t_grid(ref):
    """Each caption names one component: p(k | x_t, t, c_j) is one-hot on j's cluster at every t, endpoints too
    (the dense closed form restricted to {j})."""
    router = ExactRouter(ref, "text")
    x = torch.randn(5, 1, 4, 4, generator=torch.Generator().manual_seed(1), dtype=F64)
    for j in range(ref.mixture.num_components):
        for t in T_GRID:
            p = router(x, torch.full((5,), t, dtype=F64), _pooled(ref.cond, j, 5)).softmax(-1)
            torch.testing.assert_close(p, _dense_posterior(ref, x, t, [j]), rtol=1e-9, atol=1e-12)
            assert (p.argmax(-1) == ref.cluster_of[j]).all()


def test_the_empty_caption_gives_the_text_free_posterior(ref):
    free, aware = ExactRouter(ref), ExactRouter(ref, "text")
    x = torch.randn(7, 1, 4, 4, generator=torch.Generator().manual_seed(2), dtype=F64)
    for t in T_GRID:
        tt = torch.full((7,), t, dtype=F64)
        want = _dense_posterior(ref, x, t, list(range(ref.mixture.num_components)))
        torch.testing.assert_close(aware(x, tt, _pooled(ref.uncond, 0, 7)).softmax(-1), want, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(free(x, tt).softmax(-1), want, rtol=1e-9, atol=1e-12)


def test_a_caption_shared_across_clusters_weighs_its_components_by_the_evidence(ref):
    """Where a caption does not fix the cluster (two components of different clusters share it), the posterior is
    the responsibilities over exactly those two components: neither one-hot nor the text-free posterior."""
    a, b = 0, int((ref.cluster_of != ref.cluster_of[0]).nonzero()[0])
    states, mask = ref.cond.states.clone(), ref.cond.mask.clone()
    states[b], mask[b] = states[a], mask[a]
    shared = dataclasses.replace(ref, cond=TextCond(states, mask))
    router = ExactRouter(shared, "text")
    x = torch.randn(6, 1, 4, 4, generator=torch.Generator().manual_seed(3), dtype=F64)
    for t in T_GRID:
        p = router(x, torch.full((6,), t, dtype=F64), _pooled(shared.cond, a, 6)).softmax(-1)
        torch.testing.assert_close(p, _dense_posterior(shared, x, t, [a, b]), rtol=1e-9, atol=1e-12)
    assert 0.05 < float(p[0, shared.cluster_of[a]]) < 0.95  # t = 1: the two components' prior weights


def test_exact_experts_with_the_exact_prompt_aware_router_give_the_captions_velocity(ref):
    """Σ_k p(k | x_t, t, c) v*_k(x_t, t, c) = v*(x_t, t | c): top-2 routing of exact experts is exact given the
    caption (the text-free router's is not: it mixes in the other clusters' experts)."""
    experts = {k: exact_expert(ref, k, "fm") for k in range(ref.num_clusters)}
    aware = Ensemble(experts, ExactRouter(ref, "text"), ref.num_clusters, routing="top_k", k=2)
    free = Ensemble(experts, ExactRouter(ref), ref.num_clusters, routing="top_k", k=2)
    x = torch.randn(4, 1, 4, 4, generator=torch.Generator().manual_seed(4), dtype=F64)
    j = 3
    cond = TextCond(ref.cond.states[j : j + 1].expand(4, -1, -1), ref.cond.mask[j : j + 1].expand(4, -1))
    gap = []
    for t in T_GRID:
        tt = torch.full((4,), t, dtype=F64)
        want = ref.mixture.subset([j]).fm_velocity(x.flatten(1), tt)
        torch.testing.assert_close(aware.velocity(x, tt, cond).flatten(1), want, rtol=1e-6, atol=1e-6)
        gap.append(float((free.velocity(x, tt, cond).flatten(1) - want).abs().max()))
    assert max(gap) > 0.1


def test_the_exact_router_refuses_a_caption_it_does_not_read(ref):
    x, t = torch.zeros(2, 1, 4, 4, dtype=F64), torch.full((2,), 0.5, dtype=F64)
    with pytest.raises(ValueError, match="conditioning 'none'"):
        ExactRouter(ref)(x, t, _pooled(ref.uncond, 0, 2))
    with pytest.raises(ValueError, match="conditioning 'text'"):
        ExactRouter(ref, "text")(x, t)


@pytest.fixture(scope="module")
def colour_dataset(tmp_path_factory):
    """Captions that do not fix the cluster: each names a colour only, shared by every cluster."""
    spec = GMMSpec(
        num_clusters=3, components_per_cluster=2, image_size=4, channels=1, rank=2, num_samples=90, captions="colour"
    )
    return prepare_gmm(tmp_path_factory.mktemp("gmm-colour"), spec, max_caption_tokens=8)


@pytest.fixture(scope="module")
def colour_ref(colour_dataset):
    return load_reference(Dataset.open(colour_dataset))


def test_colour_captions_are_shared_by_every_cluster_and_their_cluster_prior_is_closed_form(colour_ref):
    """p(k | c) = Σ_{j ∈ k, c_j = c} π_j / Σ_{c_j = c} π_j: against the weights by hand, and the exact prompt-aware
    router at t = 1 (x_t carries no information: the posterior is that prior) in float64."""
    from hddm_flower.gmm.exact import caption_cluster_prior

    ref = colour_ref
    assert ref.captions == ["red", "green"] * 3
    prior = caption_cluster_prior(ref)  # (2 captions, 3 clusters)
    w = ref.mixture.weights
    for c in range(2):
        want = torch.stack([w[2 * k + c] for k in range(3)]) / sum(w[2 * k + c] for k in range(3))
        torch.testing.assert_close(prior[c], want, rtol=1e-12, atol=1e-15)
        assert (prior[c] > 0.01).all()  # no cluster is fixed by the caption
    router = ExactRouter(ref, "text")
    x = torch.randn(5, 1, 4, 4, generator=torch.Generator().manual_seed(5), dtype=F64)
    for c in range(2):
        p = router(x, torch.ones(5, dtype=F64), _pooled(ref.cond, c, 5)).softmax(-1)
        torch.testing.assert_close(p, prior[c].expand(5, -1), rtol=1e-9, atol=1e-12)
        for t in T_GRID:  # every t: the dense posterior over the caption's components, one per cluster
            p = router(x, torch.full((5,), t, dtype=F64), _pooled(ref.cond, c, 5)).softmax(-1)
            torch.testing.assert_close(p, _dense_posterior(ref, x, t, [c, 2 + c, 4 + c]), rtol=1e-9, atol=1e-12)


def test_colour_captions_give_the_exact_density_given_the_caption(colour_ref):
    """Each exact expert conditions on its own cluster's component of the colour, and full routing of the exact
    experts by the exact prompt-aware router gives the velocity of p(x | c), the mixture of that colour's
    components over every cluster, on the t grid (endpoints included)."""
    ref = colour_ref
    experts = {k: exact_expert(ref, k, "fm") for k in range(ref.num_clusters)}
    full = Ensemble(experts, ExactRouter(ref, "text"), ref.num_clusters, routing="full")
    x = torch.randn(4, 1, 4, 4, generator=torch.Generator().manual_seed(6), dtype=F64)
    c = 1  # "green": components 1, 3, 5
    cond = TextCond(ref.cond.states[c : c + 1].expand(4, -1, -1), ref.cond.mask[c : c + 1].expand(4, -1))
    for t in T_GRID:
        tt = torch.full((4,), t, dtype=F64)
        for k in range(ref.num_clusters):
            want_k = ref.mixture.subset([2 * k + c]).fm_velocity(x.flatten(1), tt)
            torch.testing.assert_close(experts[k].velocity(x, tt, cond).flatten(1), want_k, rtol=1e-6, atol=1e-6)
        want = ref.mixture.subset([1, 3, 5]).fm_velocity(x.flatten(1), tt)
        torch.testing.assert_close(full.velocity(x, tt, cond).flatten(1), want, rtol=1e-6, atol=1e-6)
