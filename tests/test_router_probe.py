"""The router probe against closed forms in float64: KL, agreement and TV to the exact posterior of a mixture, per
time of a grid that includes both endpoints."""

import math

import pytest
import torch
from torch import nn

from hddm_flower.gmm.dataset import GMMReference
from hddm_flower.gmm.exact import ExactRouter
from hddm_flower.gmm.mixture import GaussianMixture
from hddm_flower.gmm.router_probe import RouterProbe, compare
from hddm_flower.models import TextCond

F64 = torch.float64
T_GRID = [1.0, 0.9, 0.5, 0.1, 0.0]


@pytest.fixture(scope="module")
def ref():
    """Three clusters of one component each in 4 dimensions, unequal weights."""
    g = torch.Generator().manual_seed(0)
    m = GaussianMixture(
        torch.tensor([0.5, 0.3, 0.2], dtype=F64),
        3 * torch.randn(3, 4, generator=g, dtype=F64),
        0.3 * torch.randn(3, 4, 1, generator=g, dtype=F64),
        torch.full((3, 4), 0.2, dtype=F64),
    )
    none = TextCond(torch.zeros(3, 1, 2), torch.ones(3, 1))
    return GMMReference(m, torch.arange(3), ["a", "b", "c"], none, TextCond(none.states[:1], none.mask[:1]), (1, 2, 2))


def test_compare_against_closed_forms():
    p = torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.4, 0.0]], dtype=F64)
    q = torch.tensor([[0.2, 0.3, 0.5], [0.5, 0.2, 0.3]], dtype=F64)
    got = compare(q.log(), p.log())
    want_kl = [0.5 * math.log(0.5 / 0.2) + 0.2 * math.log(0.2 / 0.5), 0.6 * math.log(0.6 / 0.5) + 0.4 * math.log(2)]
    torch.testing.assert_close(got["kl"], torch.tensor(want_kl, dtype=F64), rtol=1e-12, atol=1e-15)  # 0·log 0 = 0
    assert got["top1"].tolist() == [0.0, 1.0]
    assert got["top2"].tolist() == [0.0, 0.0]  # {0, 1} vs {1, 2}; {0, 1} vs {0, 2}
    torch.testing.assert_close(got["tv"], torch.tensor([0.3, 0.3], dtype=F64), rtol=1e-12, atol=1e-15)
    same = compare(torch.tensor([[0.1, 0.6, 0.3]], dtype=F64).log(), torch.tensor([[0.2, 0.5, 0.3]], dtype=F64).log())
    assert same["top2"].item() == 1.0 and same["top1"].item() == 1.0  # {1, 2} in both, the same first


class _Uniform(nn.Module):
    config = None

    def forward(self, x_t, t):
        return torch.zeros(len(x_t), 3, dtype=x_t.dtype)


def test_the_exact_router_probed_against_itself_agrees_and_a_uniform_one_has_the_closed_form_prior_error(ref):
    exact = ExactRouter(ref)
    x = torch.randn(50, 1, 2, 2, generator=torch.Generator().manual_seed(1), dtype=F64)
    itself, uniform = RouterProbe(exact, ExactRouter(ref)), RouterProbe(_Uniform(), ExactRouter(ref))
    for t in T_GRID:
        tt = torch.full((50,), t, dtype=F64)
        torch.testing.assert_close(itself(x, tt), exact(x, tt), rtol=0, atol=0)  # passed through unchanged
        uniform(x, tt)
    scalars, steps = itself.summary()
    assert steps["times"] == T_GRID and scalars["router_kl"] == pytest.approx(0, abs=1e-12)
    assert scalars["router_top1_agreement"] == 1.0 and scalars["router_top2_agreement"] == 1.0
    assert scalars["router_prior_tv"] == pytest.approx(0, abs=1e-12)
    w = ref.mixture.weights
    scalars, steps = uniform.summary()
    # t = 1: the exact posterior is the cluster weights whatever x_t: KL(w ‖ uniform) = Σ w log(3w), TV = ½Σ|w − ⅓|
    assert steps["kl"][0] == pytest.approx(float((w * (3 * w).log()).sum()), rel=1e-12)
    assert scalars["router_prior_tv"] == pytest.approx(float(0.5 * (w - 1 / 3).abs().sum()), rel=1e-12)
    assert steps["kl"][-1] > steps["kl"][0]  # t = 0: the exact posterior is nearly one-hot, far from uniform
    uniform.reset()
    assert uniform.summary() is None
