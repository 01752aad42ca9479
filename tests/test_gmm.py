"""The Gaussian-mixture dataset and its exact references, checked in float64 against dense closed forms and
Monte-Carlo estimates over a grid of t that includes both endpoints."""

import math

import pytest
import torch

from hddm_flower.config.io import config_from_dict
from hddm_flower.config.rules import ConfigError
from hddm_flower.data import Dataset, read_meta
from hddm_flower.ensemble import Ensemble
from hddm_flower.gmm.dataset import GMMSpec, load_reference, prepare_gmm
from hddm_flower.gmm.exact import ExactRouter, exact_expert
from hddm_flower.gmm.mixture import GaussianMixture
from hddm_flower.models import TextCond

F64 = torch.float64
T_GRID = [0.0, 1e-4, 0.05, 0.3, 0.5, 0.7, 0.95, 1 - 1e-4, 1.0]


def random_mixture(J=3, d=7, r=2, seed=0) -> GaussianMixture:
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(J, generator=g, dtype=F64) + 0.2
    return GaussianMixture(
        w / w.sum(),
        torch.randn(J, d, generator=g, dtype=F64),
        0.6 * torch.randn(J, d, r, generator=g, dtype=F64),
        0.05 + torch.rand(J, d, generator=g, dtype=F64),
    )


def dense_moments(m: GaussianMixture, x, a, s):
    """log π_j N(x; aμ_j, a²Σ_j + s²I), E[ε | x, j], E[x0 | x, j] with dense solves (per row a, s)."""
    C, d = m.covariance(), m.dim
    S = a[:, None, None, None] ** 2 * C[None] + s[:, None, None, None] ** 2 * torch.eye(d, dtype=F64)  # (B, J, d, d)
    resid = x[:, None] - a[:, None, None] * m.means[None]
    w = torch.linalg.solve(S, resid[..., None])[..., 0]
    logdet = torch.linalg.slogdet(S)[1]
    lj = torch.log(m.weights) - 0.5 * ((resid * w).sum(-1) + logdet + d * math.log(2 * math.pi))
    return lj, s[:, None, None] * w, m.means[None] + a[:, None, None] * (C[None] @ w[..., None])[..., 0]


@pytest.mark.parametrize("shared", [True, False])
def test_woodbury_moments_match_dense_solves_on_the_t_grid(shared):
    m = random_mixture()
    g = torch.Generator().manual_seed(1)
    for t in T_GRID:
        x = torch.randn(5, m.dim, generator=g, dtype=F64)
        tt = torch.full((5,), t, dtype=F64) if shared else torch.tensor([t, 0.0, 0.5, 1.0, 0.9], dtype=F64)
        got = m._moments(x, 1 - tt, tt)
        lj, eps, x0 = dense_moments(m, x, 1 - tt, tt)
        torch.testing.assert_close(got.log_joint, lj, rtol=1e-10, atol=1e-9)
        torch.testing.assert_close(got.eps, eps, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(got.x0, x0, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(m._moments(x, 1 - tt, tt, means=False).log_joint, lj, rtol=1e-10, atol=1e-9)


def test_endpoints_and_path_identity():
    m = random_mixture()
    x = torch.randn(6, m.dim, generator=torch.Generator().manual_seed(2), dtype=F64)
    prior_mean = (m.weights[:, None] * m.means).sum(0)
    torch.testing.assert_close(m.fm_velocity(x, 1.0), x - prior_mean)  # t = 1: E[x0 | noise] is the prior mean
    torch.testing.assert_close(m.fm_velocity(x, 0.0), -x)  # t = 0: ε* = 0, x0* = x
    for t in T_GRID:
        eps, x0 = m.denoise(x, 1 - t, t)
        torch.testing.assert_close((1 - t) * x0 + t * eps, x, rtol=0, atol=1e-12)  # x_t = a·x0* + s·ε*
    # log p(x0) against torch.distributions
    comp = torch.distributions.MultivariateNormal(m.means, m.covariance())
    mix = torch.distributions.MixtureSameFamily(torch.distributions.Categorical(m.weights), comp)
    torch.testing.assert_close(m.log_prob(x), mix.log_prob(x))


def test_sampling_matches_the_moments():
    m = random_mixture(J=2, d=4, r=2)
    x, j = m.sample(200_000, torch.Generator().manual_seed(3))
    mean = (m.weights[:, None] * m.means).sum(0)
    torch.testing.assert_close(x.mean(0), mean, rtol=0, atol=0.02)
    x0 = x[j == 0]
    torch.testing.assert_close(torch.cov(x0.T), m.covariance()[0], rtol=0, atol=0.03)
    assert abs(float((j == 0).double().mean() - m.weights[0])) < 0.005


# ----------------------------------------------------------------------------------------------------------------
# the dataset and the exact references


@pytest.fixture(scope="module")
def gmm_dir(tmp_path_factory):
    spec = GMMSpec(num_clusters=3, components_per_cluster=2, image_size=4, channels=1, rank=2, num_samples=90)
    return prepare_gmm(tmp_path_factory.mktemp("gmm-cache"), spec, max_caption_tokens=8)


def test_dataset_has_the_common_layout(gmm_dir):
    meta = read_meta(gmm_dir)
    assert meta["name"] == "gmm" and meta["num_clusters"] == 3 and meta["channels"] == 1 and not meta["latent"]
    ref = load_reference(Dataset.open(gmm_dir))
    train = Dataset.open(gmm_dir).split(None, "train")
    assert train.images.shape[1:] == (1, 4, 4) and train.images.dtype == torch.float32
    assert sorted(set(train.captions)) == sorted(set(ref.captions))
    # the stored images lie in the cluster their folder says (grey 4×4 patterns overlap a little)
    comp = ref.mixture.component_of(train.images.double().flatten(1))
    assert (ref.cluster_of[comp] == train.labels).double().mean() > 0.8
    # one cluster folder stands alone
    one = Dataset.open(gmm_dir / "cluster-1").split([1], "train")
    assert (one.labels == 1).all() and load_reference(Dataset.open(gmm_dir / "cluster-1")).captions == ref.captions


def _snis(mixture: GaussianMixture, x_t, t, n, seed):
    """Self-normalised importance estimate of E[ε − x0 | x_t] and of E[1{component} | x_t] from prior draws."""
    x0, j = mixture.sample(n, torch.Generator().manual_seed(seed))
    logw = -0.5 * ((x_t[:, None] - (1 - t) * x0[None]) ** 2).sum(-1) / t**2  # (B, n)
    w = logw.softmax(-1)
    eps = (x_t[:, None] - (1 - t) * x0[None]) / t
    v = (w[..., None] * (eps - x0[None])).sum(1)
    ess = 1 / (w**2).sum(-1)
    post = torch.stack([(w * (j == c)).sum(-1) for c in range(mixture.num_components)], -1)
    return v, post, ess


@pytest.mark.parametrize("t", [0.2, 0.5, 0.8])
def test_exact_fm_expert_and_router_match_monte_carlo(gmm_dir, t):
    ref = load_reference(Dataset.open(gmm_dir))
    k = 1
    cluster = ref.mixture.subset((ref.cluster_of == k).nonzero().squeeze(1))
    g = torch.Generator().manual_seed(4)
    x0, _ = cluster.sample(4, g)
    x_t = (1 - t) * x0 + t * torch.randn(x0.shape, generator=g, dtype=F64)
    v_mc, _, ess = _snis(cluster, x_t, t, 40_000, seed=5)
    assert ess.min() > 100
    expert = exact_expert(ref, k, "fm")
    uncond = TextCond(ref.uncond.states.expand(4, -1, -1), ref.uncond.mask.expand(4, -1))
    v = expert.velocity(x_t.reshape(4, 1, 4, 4), torch.full((4,), t, dtype=F64), uncond).flatten(1)
    # Monte-Carlo error of a weighted mean ~ spread / √ESS; the spread of ε − x0 | x_t is ≲ 1/t per coordinate
    tol = 6 / (t * ess.min().sqrt())
    assert (v - v_mc).abs().max() < tol, ((v - v_mc).abs().max(), tol)

    # the exact router: p(k | x_t, t) against the importance estimate over the whole mixture
    x0, _ = ref.mixture.sample(4, g)
    x_t = (1 - t) * x0 + t * torch.randn(x0.shape, generator=g, dtype=F64)
    _, post_mc, ess = _snis(ref.mixture, x_t, t, 40_000, seed=6)
    member = torch.nn.functional.one_hot(ref.cluster_of, 3).double()
    router = ExactRouter(ref)
    p = router(x_t.reshape(4, 1, 4, 4), torch.full((4,), t, dtype=F64)).softmax(-1)
    assert (p - post_mc @ member).abs().max() < 5 / ess.min().sqrt()


def test_exact_router_is_calibrated_over_the_t_grid(gmm_dir):
    """Tower property and orthogonality of the posterior, by Monte Carlo over (x0, k, ε), t at the endpoints too."""
    ref = load_reference(Dataset.open(gmm_dir))
    router = ExactRouter(ref)
    g = torch.Generator().manual_seed(7)
    n = 6000
    x0, j = ref.mixture.sample(n, g)
    k = ref.cluster_of[j]
    onehot = torch.nn.functional.one_hot(k, 3).double()
    pi_k = torch.stack([ref.mixture.weights[ref.cluster_of == c].sum() for c in range(3)])
    for t in T_GRID:
        x_t = (1 - t) * x0 + t * torch.randn(x0.shape, generator=g, dtype=F64)
        p = router(x_t.reshape(n, 1, 4, 4), torch.full((n,), t, dtype=F64)).softmax(-1)
        se = 4 / math.sqrt(n)
        assert (p.mean(0) - pi_k).abs().max() < se  # E[p(k | x_t)] = π_k
        assert ((onehot - p) * p).mean(0).abs().max() < se  # E[(1{k} − p_k) p_k(x_t)] = 0
    assert torch.allclose(p, pi_k.expand(n, -1))  # t = 1: the posterior is the prior


def test_exact_ddpm_expert_agrees_with_fm_through_the_schedule_aware_conversion(gmm_dir):
    ref = load_reference(Dataset.open(gmm_dir))
    g = torch.Generator().manual_seed(8)
    x0, _ = ref.mixture.sample(16, g)
    uncond = TextCond(ref.uncond.states.expand(16, -1, -1), ref.uncond.mask.expand(16, -1))
    fm = exact_expert(ref, 0, "fm")
    opts = {"t_eps": 1e-6, "x0_clamp": 1e6}
    for schedule in ("linear", "cosine"):
        aware = exact_expert(ref, 0, "ddpm", schedule=schedule, conversion="schedule_aware", **opts)
        naive = exact_expert(ref, 0, "ddpm", schedule=schedule, conversion="naive", **opts)
        for t in (0.05, 0.5, 0.95):
            x_t = ((1 - t) * x0 + t * torch.randn(x0.shape, generator=g, dtype=F64)).reshape(16, 1, 4, 4)
            tt = torch.full((16,), t, dtype=F64)
            v = fm.velocity(x_t, tt, uncond)
            torch.testing.assert_close(aware.velocity(x_t, tt, uncond), v, rtol=1e-6, atol=1e-6)
            if schedule == "cosine" and t == 0.5:  # the naive mapping misreads the noise level
                assert (naive.velocity(x_t, tt, uncond) - v).abs().max() > 0.05


def test_caption_selects_the_component(gmm_dir):
    ref = load_reference(Dataset.open(gmm_dir))
    g = torch.Generator().manual_seed(9)
    x = torch.randn(6, 1, 4, 4, generator=g, dtype=F64)
    t = torch.full((6,), 0.4, dtype=F64)
    k = 2
    members = (ref.cluster_of == k).nonzero().squeeze(1).tolist()
    other = (ref.cluster_of != k).nonzero().squeeze(1)[0].item()
    expert = exact_expert(ref, k, "fm")
    cluster = ref.mixture.subset(members)

    def cond(j):
        return TextCond(ref.cond.states[j : j + 1].expand(6, -1, -1), ref.cond.mask[j : j + 1].expand(6, -1))

    for local, j in enumerate(members):
        want = cluster.subset([local]).fm_velocity(x.flatten(1), t)
        torch.testing.assert_close(expert.velocity(x, t, cond(j)).flatten(1), want)
    uncond = expert.velocity(x, t, TextCond(ref.uncond.states.expand(6, -1, -1), ref.uncond.mask.expand(6, -1)))
    torch.testing.assert_close(uncond.flatten(1), cluster.fm_velocity(x.flatten(1), t))
    torch.testing.assert_close(expert.velocity(x, t, cond(other)), uncond)  # another cluster's caption


def test_full_routing_of_exact_experts_is_the_exact_marginal_velocity(gmm_dir):
    """Σ_k p(k | x_t) v*_k(x_t) = v*(x_t): exact experts + exact router + full routing are exact (unconditional)."""
    ref = load_reference(Dataset.open(gmm_dir))
    ens = Ensemble({k: exact_expert(ref, k, "fm") for k in range(3)}, ExactRouter(ref), 3, routing="full")
    x = torch.randn(8, 1, 4, 4, generator=torch.Generator().manual_seed(10), dtype=F64)
    uncond = TextCond(ref.uncond.states.expand(8, -1, -1), ref.uncond.mask.expand(8, -1))
    for t in T_GRID:
        tt = torch.full((8,), t, dtype=F64)
        torch.testing.assert_close(
            ens.velocity(x, tt, uncond).flatten(1), ref.mixture.fm_velocity(x.flatten(1), tt), rtol=1e-6, atol=1e-6
        )


def test_config_accepts_gmm_and_names_bad_values():
    cfg = config_from_dict({"data": {"name": "gmm", "image_size": 8}}, "gmm.yaml")
    assert cfg.data.name == "gmm"
    with pytest.raises(ConfigError, match="num_experts"):
        config_from_dict({"num_experts": 9, "data": {"name": "gmm"}}, "gmm.yaml")
    with pytest.raises(ConfigError, match="data.gmm_channels"):
        config_from_dict({"data": {"name": "gmm", "gmm_channels": 2}}, "gmm.yaml")


def _span_residual(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − P_b a‖ / ‖a‖: how much of a's columns lies outside the span of b's (float64)."""
    q = torch.linalg.qr(b)[0]
    return float((a - q @ (q.T @ a)).norm() / a.norm())


def test_cluster_covariance_gives_each_cluster_a_subspace_no_other_cluster_shares():
    from hddm_flower.gmm.dataset import make_mixture

    r = 6
    m, _, cluster_of = make_mixture(GMMSpec(num_clusters=4, components_per_cluster=3, rank=r, covariance="cluster"))
    cluster_of = torch.tensor(cluster_of)
    U = m.factors  # (J, d, r)
    norms = U.norm(dim=1)
    assert ((norms >= 0.8 - 1e-12) & (norms <= 1.6 + 1e-12)).all()  # per-direction std as the pattern covariance
    for i in range(len(U)):
        for j in range(len(U)):
            res = _span_residual(U[i], U[j])
            if cluster_of[i] == cluster_of[j]:
                assert res < 1e-10  # one span per cluster
            else:
                # random r-dimensional subspaces of d = 192 overlap by about r/d: nearly all of U_i lies outside
                assert res > 0.9, (i, j, res)
        # other axes in the same span: the components are not copies of one another
        mates = [j for j in range(len(U)) if cluster_of[j] == cluster_of[i] and j != i]
        assert all(not torch.allclose(U[i] / norms[i], U[j] / norms[j], atol=1e-3) for j in mates)
    # the pattern covariance shares the channel-brightness directions across clusters (what "cluster" removes)
    p, _, p_cluster = make_mixture(GMMSpec(num_clusters=4, components_per_cluster=3, rank=r))
    a, b = p_cluster.index(0), p_cluster.index(1)
    assert _span_residual(p.factors[a][:, 1:4], p.factors[b]) < 1e-10


def test_covariance_kind_names_the_dataset_and_bad_kinds_are_refused(tmp_path):
    from hddm_flower.gmm.dataset import gmm_dataset_dir

    plain, cluster = GMMSpec(), GMMSpec(covariance="cluster")
    assert gmm_dataset_dir(tmp_path, plain, 12).name == "gmm-v1-3x8px-k8-j4-r4-n8000-L12-seed0"  # unchanged
    assert gmm_dataset_dir(tmp_path, cluster, 12).name.endswith("-cov-cluster")
    with pytest.raises(ValueError, match="covariance must be one of"):
        GMMSpec(covariance="shared").check()
    with pytest.raises(ConfigError, match="data.gmm_covariance"):
        config_from_dict({"data": {"name": "gmm", "gmm_covariance": "shared"}}, "gmm.yaml")


def test_the_default_mixture_is_the_one_every_committed_gmm_result_was_drawn_from():
    """The default spec's weights, means, factors and diagonals, captions and clusters, as the mixture was before
    ``covariance`` existed: a change here re-draws every committed Gaussian-mixture result's dataset.

    The tensors are held to three float64 summaries each (sum, sum of squares, a fixed cosine-weighted sum) at
    1e-9, not to their bytes: the factors' QR and norms go through the BLAS, whose kernel (chosen per CPU) moves
    their last bit (5.6e-17 between OpenBLAS's Haswell and SkylakeX kernels). A re-draw (another seed, covariance
    rule or component order) moves the factors', the diagonals' and the weighted sums by far more than 1e-9; the
    means are fixed patterns, not draws. Dtypes and shapes, the captions and the clusters are compared exactly."""
    import hashlib

    from hddm_flower.gmm.dataset import make_mixture

    m, captions, cluster_of = make_mixture(GMMSpec())
    expected = {  # (sum, sum of squares, Σ v·cos(flat index))
        "diag": (42.51160234181289, 0.31563171805085355, -0.003935920013826167),
        "factors": (926.8178972428402, 198.49982014849664, -1.3996003522063163),
        "means": (-2353.7678251457983, 1913.30974452875, 15.124724042737363),
        "weights": (1.0, 0.05065724967354696, 0.2624759727749546),
    }
    shapes = {"diag": (32, 192), "factors": (32, 192, 4), "means": (32, 192), "weights": (32,)}
    state = m.state_dict()
    assert sorted(state) == sorted(expected)
    for name, want in expected.items():
        assert state[name].dtype == torch.float64 and tuple(state[name].shape) == shapes[name], name
        v = state[name]
        w = torch.cos(torch.arange(v.numel(), dtype=torch.float64)).view(v.shape)
        got = (float(v.sum()), float((v * v).sum()), float((v * w).sum()))
        assert got == pytest.approx(want, rel=1e-9, abs=1e-9), name
    digest = hashlib.sha256(repr((captions, cluster_of)).encode()).hexdigest()
    assert digest == "56e88591b93919518ae087fc257920deb3125cd2b75ed666b8b51019157d09b8"
