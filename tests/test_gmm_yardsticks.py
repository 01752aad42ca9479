"""The mean-only yardsticks (hddm_flower/gmm/yardsticks.py) against closed forms and against the mixture's own exact
velocity, in float64, over a grid of t with both endpoints."""

import pytest
import torch

from hddm_flower.gmm.mixture import GaussianMixture
from hddm_flower.gmm.yardsticks import covariance_excess, mean_only_covariances, mean_only_levels, velocity_gain

TIMES = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)


def _component(d: int, r: int, seed: int) -> GaussianMixture:
    g = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    return GaussianMixture(
        torch.ones(1, dtype=f64),
        torch.randn(1, d, generator=g, dtype=f64),
        0.8 * torch.randn(1, d, r, generator=g, dtype=f64),
        0.05 + 0.1 * torch.rand(1, d, generator=g, dtype=f64),
    )


@pytest.mark.parametrize("t", TIMES)
def test_the_velocity_gain_gives_the_mixtures_exact_velocity(t):
    m = _component(6, 2, 0)
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    mu, M = m.means[0], velocity_gain(m.covariance()[0], t)
    expected = m.fm_velocity(x, torch.full((5,), t, dtype=torch.float64))
    torch.testing.assert_close((x - (1 - t) * mu) @ M.T - mu, expected, rtol=1e-10, atol=1e-10)


def test_one_dimension_by_hand():
    # t = 0.5, true variance 1, used 3: S = 0.5 and 1, M = 0 and −1, excess (−1)² · 0.5 = 0.5
    one, three = torch.ones(1, 1, dtype=torch.float64), 3 * torch.ones(1, 1, dtype=torch.float64)
    assert covariance_excess(one, three, 0.5) == pytest.approx(0.5, abs=1e-15)
    assert covariance_excess(one, one, 0.5) == 0.0


@pytest.mark.parametrize("t", TIMES)
def test_the_excess_is_the_mean_squared_error_of_the_two_exact_velocities_on_the_true_components_draws(t):
    truth, used = _component(5, 2, 2), _component(5, 3, 3)
    used = GaussianMixture(used.weights, truth.means, used.factors, used.diag)  # the right mean, another covariance
    g = torch.Generator().manual_seed(4)
    n = 200_000
    x0, _ = truth.sample(n, g)
    x_t = (1 - t) * x0 + t * torch.randn(x0.shape, generator=g, dtype=torch.float64)
    tt = torch.full((n,), t, dtype=torch.float64)
    err = ((used.fm_velocity(x_t, tt) - truth.fm_velocity(x_t, tt)) ** 2).mean(1)
    closed = covariance_excess(truth.covariance()[0], used.covariance()[0], t)
    assert closed == pytest.approx(float(err.mean()), abs=4 * float(err.std()) / n**0.5 + 1e-12)
    if t in (0.0, 1.0):  # at the endpoints every denoiser with the right mean is exact
        assert abs(closed) < 1e-20 and float(err.max()) < 1e-20


def test_the_levels_vanish_where_every_component_has_the_pooled_covariance():
    c = _component(4, 2, 5)
    m = GaussianMixture(
        torch.tensor([0.3, 0.7], dtype=torch.float64),
        torch.randn(2, 4, generator=torch.Generator().manual_seed(6), dtype=torch.float64),
        c.factors.expand(2, -1, -1),
        c.diag.expand(2, -1),
    )
    levels = mean_only_levels(m, torch.tensor([1]), TIMES)
    assert max(abs(x) for x in levels["pooled"]) < 1e-12
    ends, inner = levels["isotropic"][::6], levels["isotropic"][1:-1]
    assert max(abs(x) for x in ends) < 1e-20 and min(inner) > 1e-3


def test_the_isotropic_level_of_an_isotropic_mixture_is_zero_and_the_weights_are_the_clusters():
    f64 = torch.float64
    iso = GaussianMixture(
        torch.tensor([0.5, 0.5], dtype=f64),
        torch.zeros(2, 3, dtype=f64),
        torch.zeros(2, 3, 1, dtype=f64),
        torch.tensor([[0.2] * 3, [0.6] * 3], dtype=f64),
    )
    # the pooled variance is 0.4: component 0 (0.2) and 1 (0.6) each err; alone, each is its own excess
    both = mean_only_levels(iso, torch.tensor([0, 1]), (0.5,))["isotropic"][0]
    one = [covariance_excess(iso.covariance()[j], 0.4 * torch.eye(3, dtype=f64), 0.5) for j in (0, 1)]
    assert both == pytest.approx(0.5 * one[0] + 0.5 * one[1], rel=1e-12) and min(one) > 0
    same = GaussianMixture(iso.weights, iso.means, iso.factors, torch.full((2, 3), 0.4, dtype=f64))
    assert mean_only_levels(same, torch.tensor([0, 1]), (0.5,))["isotropic"][0] == pytest.approx(0, abs=1e-15)


def test_the_levels_benchmark_estimates_on_the_pilots_draws_what_the_closed_form_gives(tmp_path):
    from benchmarks.gmm_ladder import cluster_draws
    from benchmarks.gmm_levels import levels_of
    from hddm_flower.data import Dataset
    from hddm_flower.gmm.dataset import GMMSpec, load_reference, prepare_gmm

    spec = GMMSpec(3, 2, image_size=4, channels=1, rank=2, num_samples=90, covariance="cluster")
    ref = load_reference(Dataset.open(prepare_gmm(tmp_path, spec, max_caption_tokens=8)))
    out = levels_of(ref, [0, 2], samples=4000, seed=7)
    assert list(out["per_cluster"]) == ["0", "2"] and len(out["times"]) == 7
    for per in out["per_cluster"].values():
        closed, drawn = per["isotropic"], per["isotropic_on_the_draws"]
        assert drawn[0] < 1e-20 and drawn[-1] < 1e-20 and closed[0] < 1e-20 and closed[-1] < 1e-20
        assert all(e == pytest.approx(c, rel=0.1) for c, e in zip(closed[1:-1], drawn[1:-1]))
    # the draws are the pilot's: the same seed gives the same x_t, another seed others
    a = [d[2] for d in cluster_draws(ref, 0, 8, seed=7)]
    b = [d[2] for d in cluster_draws(ref, 0, 8, seed=7)]
    c = [d[2] for d in cluster_draws(ref, 0, 8, seed=8)]
    assert all(torch.equal(x, y) for x, y in zip(a, b)) and not torch.equal(a[3], c[3])
    mean = out["mean_over_clusters"]["isotropic"]
    assert mean == [
        (x + y) / 2 for x, y in zip(out["per_cluster"]["0"]["isotropic"], out["per_cluster"]["2"]["isotropic"])
    ]


def test_the_levels_take_the_mixture_weighted_covariances_and_weigh_a_clusters_components_within_it():
    f64 = torch.float64
    g = torch.Generator().manual_seed(9)
    weights = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=f64)
    m = GaussianMixture(
        weights,
        torch.randn(4, 3, generator=g, dtype=f64),
        torch.randn(4, 3, 2, generator=g, dtype=f64),
        0.1 + torch.rand(4, 3, generator=g, dtype=f64),
    )
    cov = [m.covariance()[j] for j in range(4)]
    pooled = sum(float(w) * c for w, c in zip(weights, cov))  # Σ_j π_j Σ_j, by hand
    sigma2 = sum(float(w) * float(torch.trace(c)) / 3 for w, c in zip(weights, cov))
    used = mean_only_covariances(m)
    torch.testing.assert_close(used["pooled"], pooled, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(used["isotropic"], sigma2 * torch.eye(3, dtype=f64), rtol=1e-12, atol=1e-12)
    # a proper subset of the components: each weighted by its weight within the subset (0.2 and 0.4 → 1/3, 2/3)
    for t in (0.3, 0.7):
        levels = mean_only_levels(m, torch.tensor([1, 3]), (t,))
        for name in ("isotropic", "pooled"):
            hand = covariance_excess(cov[1], used[name], t) / 3 + 2 * covariance_excess(cov[3], used[name], t) / 3
            assert levels[name][0] == pytest.approx(hand, rel=1e-12)
