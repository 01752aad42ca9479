"""The error-aware clean estimate of converted DDPM experts (shrink) and the hand-over, against closed forms in
float64 on a t grid that includes both endpoints."""

import pytest
import torch

from hddm_flower.accept import parse_expert_meta
from hddm_flower.checkpoints import CheckpointRejected
from hddm_flower.clean_prior import CleanPrior, measure_clean_prior, parse_clean_prior
from hddm_flower.counts import read_counts
from hddm_flower.data import Dataset
from hddm_flower.ensemble import Ensemble, hand_over
from hddm_flower.experts import DDPMExpert, FlowMatchingExpert
from hddm_flower.gmm.mixture import GaussianMixture
from hddm_flower.objectives import (
    alpha_bar_at,
    ddpm_alpha_bar,
    ddpm_eps_to_velocity,
    ddpm_eps_to_velocity_shrunk,
    naive_shrink_weight,
    shrink_weight,
)
from hddm_flower.wire import WireError

F64 = torch.float64
D = 6
GRID = (0.05, 0.2, 0.5, 0.8, 0.9, 0.95, 0.99, 0.999)
T_ALL = (0.0, *GRID, 1.0)  # the table's grid with both endpoints


def _gaussian() -> GaussianMixture:
    g = torch.Generator().manual_seed(3)
    mean = torch.randn(1, D, generator=g, dtype=F64)
    factors = 0.8 * torch.randn(1, D, 2, generator=g, dtype=F64)
    diag = 0.05 + 0.3 * torch.rand(1, D, generator=g, dtype=F64)
    return GaussianMixture(torch.ones(1), mean, factors, diag)


def _spread(gmm: GaussianMixture, t: float) -> float:
    """Closed form of C(t) = Var x0*(x_t) per element for one Gaussian: tr((1−t)²·Σ S⁻¹ Σ)/d, S = (1−t)²Σ + t²I."""
    sigma = gmm.covariance()[0]
    s = (1 - t) ** 2 * sigma + t**2 * torch.eye(D, dtype=F64)
    return float(torch.trace((1 - t) ** 2 * sigma @ torch.linalg.solve(s, sigma))) / D


def _exact_prior(gmm: GaussianMixture, times=GRID) -> CleanPrior:
    c = torch.tensor([_spread(gmm, t) for t in times], dtype=F64)
    s2 = float(torch.trace(gmm.covariance()[0])) / D
    return CleanPrior(torch.tensor(times, dtype=F64), c, c.clone(), torch.ones_like(c), s2, gmm.means[0], 1)


class _EpsNet(torch.nn.Module):
    """The exact eps-prediction of ``gmm`` on the VP path at fractional timesteps of ``alpha_bar``, plus optional
    i.i.d. noise of standard deviation ``sigma`` (a trained network's error, known)."""

    def __init__(self, gmm, alpha_bar, sigma=0.0, seed=0):
        super().__init__()
        self.gmm, self.alpha_bar, self.sigma = gmm, alpha_bar, sigma
        self.g = torch.Generator().manual_seed(seed)

    def forward(self, z, tau, cond):
        eps = self.gmm.vp_eps(z, alpha_bar_at(tau, self.alpha_bar))
        return eps + self.sigma * torch.randn(eps.shape, generator=self.g, dtype=F64) if self.sigma else eps


def _fm_eps_star(gmm, x_t, t):
    return gmm.denoise(x_t, 1 - t, t)[0]


@pytest.mark.parametrize("t", T_ALL)
def test_exact_network_with_its_table_keeps_the_exact_velocity(t):
    """lambda = C/V = 1 for an exact network: the shrunk velocity is v* to 1e-10 at every grid time, and at
    t = 1 (lambda = 0) it is x_t − mu = v*."""
    gmm = _gaussian()
    prior = _exact_prior(gmm)
    g = torch.Generator().manual_seed(1)
    x0, _ = gmm.sample(64, g)
    x_t = (1 - t) * x0 + t * torch.randn(64, D, generator=g, dtype=F64)
    tt = torch.full((64,), t, dtype=F64)
    v = ddpm_eps_to_velocity_shrunk(x_t, tt, _fm_eps_star(gmm, x_t, tt), prior.mean, prior.lam("shrink", tt))
    torch.testing.assert_close(v, gmm.fm_velocity(x_t, tt), rtol=0, atol=1e-10)


@pytest.mark.parametrize("t", T_ALL)
def test_shrunk_velocity_is_the_velocity_of_the_shrunk_estimate(t):
    """Both branches equal (x_t − x0~)/t with x0~ = mu + lambda·(x0^ − mu), for any lambda in [0, 1] inside (0, 1);
    at t = 0 (lambda = 1) it is eps^ − x_t and at t = 1 (lambda = 0) x_t − mu."""
    g = torch.Generator().manual_seed(2)
    x_t, eps_hat, mu = (torch.randn(32, D, generator=g, dtype=F64) for _ in range(3))
    tt = torch.full((32,), t, dtype=F64)
    if t == 0:
        lam, expected = torch.ones(32, dtype=F64), eps_hat - x_t
    elif t == 1:
        lam, expected = torch.zeros(32, dtype=F64), x_t - mu
    else:
        lam = torch.rand(32, generator=g, dtype=F64)
        x0_hat = (x_t - t * eps_hat) / (1 - t)
        expected = (x_t - (mu + lam[:, None] * (x0_hat - mu))) / t
    v = ddpm_eps_to_velocity_shrunk(x_t, tt, eps_hat, mu, lam)
    torch.testing.assert_close(v, expected, rtol=1e-9, atol=1e-9)
    if t < 1:  # lambda = 1 is the unguarded conversion exactly
        ones = torch.ones(32, dtype=F64)
        plain = ddpm_eps_to_velocity(x_t, tt, eps_hat, t_eps=1e-12, x0_clamp=1e12)
        torch.testing.assert_close(ddpm_eps_to_velocity_shrunk(x_t, tt, eps_hat, mu, ones), plain, rtol=1e-9, atol=0)


def test_measured_table_of_a_noisy_network_matches_the_closed_form():
    """The node's measurement on an exact network plus known noise (std sigma): C is Var x0* and
    lambda = C / (C + sigma²·t²/(1 − t)²); on the exact network lambda = 1 (in expectation) and the eps error is the
    posterior variance, which the naive weighting mistakes for the network's error."""
    gmm = _gaussian()
    ab = ddpm_alpha_bar("cosine")
    x0, _ = gmm.sample(4000, torch.Generator().manual_seed(4))
    times = (0.2, 0.5, 0.8, 0.9, 0.95, 0.99)
    sigma = 0.3
    noisy = measure_clean_prior(
        _EpsNet(gmm, ab, sigma), ab, gmm.means[0], x0, None, times=times, repeats=1,
        generator=torch.Generator().manual_seed(5),
    )  # fmt: skip
    exact = measure_clean_prior(
        _EpsNet(gmm, ab), ab, gmm.means[0], x0, None, times=times, repeats=1,
        generator=torch.Generator().manual_seed(5),
    )  # fmt: skip
    c = torch.tensor([_spread(gmm, t) for t in times], dtype=F64)
    tt = torch.tensor(times, dtype=F64)
    var_eta = sigma**2 * tt**2 / (1 - tt) ** 2
    expected = c / (c + var_eta)
    # Monte Carlo tolerances: 5 standard errors of the mean of (x0^ − mu)·(x0 − mu) over n pairs
    n, s2 = len(x0), exact.x0_variance
    se_c = (c * s2 / n).sqrt()
    assert ((exact.spread - c).abs() <= 5 * se_c).all()
    lam_exact = shrink_weight(exact.spread, exact.total)
    assert ((lam_exact - 1).abs() <= 5 * ((s2 - c) / (c * n)).sqrt()).all()
    se_lam = ((c + var_eta) * s2 / n).sqrt() / (c + var_eta)
    assert ((shrink_weight(noisy.spread, noisy.total) - expected).abs() <= 5 * se_lam).all()
    assert expected[0] > 0.9 and expected[-1] < 0.01  # the grid spans trusting the network to trusting the mean
    naive = naive_shrink_weight(tt, torch.tensor(exact.x0_variance), exact.eps_mse)
    assert (naive < 0.97).all()  # the naive weighting shrinks an exact network


def test_naive_weight_closed_form_and_endpoints():
    t = torch.tensor(T_ALL, dtype=F64)
    lam = naive_shrink_weight(t, torch.tensor(0.7, dtype=F64), torch.full_like(t, 0.2))
    inner = 0.7 * (1 - t[1:-1]) ** 2 / (0.7 * (1 - t[1:-1]) ** 2 + 0.2 * t[1:-1] ** 2)
    torch.testing.assert_close(lam[1:-1], inner, rtol=1e-12, atol=0)
    assert lam[0] == 1 and lam[-1] == 0
    assert shrink_weight(torch.tensor(0.0), torch.tensor(0.0)) == 0  # nothing to combine: the mean
    assert shrink_weight(torch.tensor(2.0), torch.tensor(1.0)) == 1 and shrink_weight(torch.tensor(-1.0), 1.0) == 0


def test_table_interpolates_with_the_endpoints_fixed():
    gmm = _gaussian()
    p = CleanPrior(
        torch.tensor([0.5], dtype=F64), torch.tensor([0.3], dtype=F64), torch.tensor([0.6], dtype=F64),
        torch.tensor([1.0], dtype=F64), 1.0, gmm.means[0], 10,
    )  # fmt: skip
    torch.testing.assert_close(
        p.lam("shrink", torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0], dtype=F64)),
        torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0], dtype=F64),
    )


def test_ddpm_expert_with_and_without_a_table():
    """An exact DDPM expert with the exact table gives v* (schedule-aware, inside the schedule's SNR range); without
    a table, clean_estimate shrink keeps today's clamp and counts the rows."""
    gmm = _gaussian()
    ab = ddpm_alpha_bar("cosine")
    shrunk = DDPMExpert(_EpsNet(gmm, ab), "cosine", clean_estimate="shrink", clean_prior=_exact_prior(gmm))
    plain = DDPMExpert(_EpsNet(gmm, ab), "cosine", clean_estimate="shrink", x0_clamp=1.5)
    clamp = DDPMExpert(_EpsNet(gmm, ab), "cosine", x0_clamp=1.5)
    g = torch.Generator().manual_seed(6)
    x0, _ = gmm.sample(32, g)
    shrunk.clamp_counts, plain.clamp_counts = {}, {}
    for t in (0.2, 0.5, 0.9, 0.99, 1.0):
        x_t = (1 - t) * x0 + t * torch.randn(32, D, generator=g, dtype=F64)
        tt = torch.full((32,), t, dtype=F64)
        torch.testing.assert_close(shrunk.velocity(x_t, tt, None), gmm.fm_velocity(x_t, tt), rtol=0, atol=1e-8)
        torch.testing.assert_close(plain.velocity(x_t, tt, None), clamp.velocity(x_t, tt, None), rtol=0, atol=0)
    shrunk_counts, plain_counts = read_counts(shrunk.clamp_counts), read_counts(plain.clamp_counts)
    assert shrunk_counts["shrink_rows"] == 160 and plain_counts["shrink_missing_rows"] == 160
    assert shrunk_counts["shrink_lambda_sum"] == pytest.approx(4 * 32)  # lambda 1, 1, 1, 1, then 0 at t = 1


def test_clean_prior_round_trip_and_bad_tables():
    gmm = _gaussian()
    meta = _exact_prior(gmm).to_meta()
    back = parse_clean_prior(meta, shape=(D,))
    torch.testing.assert_close(
        back.lam("shrink", torch.tensor(T_ALL)), _exact_prior(gmm).lam("shrink", torch.tensor(T_ALL))
    )
    bad = [
        ({"times": [0.5, 0.2] + meta["times"][2:]}, "increase"),
        ({"times": [0.0] + meta["times"][1:]}, "increase"),
        ({"total": meta["total"][:-1]}, "values for"),
        ({"total": [-1.0] * len(GRID)}, "total"),
        ({"mean": meta["mean"][:-1]}, "mean"),
        ({"eps_mse": [float("nan")] * len(GRID)}, "eps_mse"),
        ({"shape": [D + 1]}, "mean"),
    ]
    for change, words in bad:
        with pytest.raises(WireError, match=words):
            parse_clean_prior(meta | change)
    with pytest.raises(WireError, match="sample shape"):
        parse_clean_prior(meta, shape=(2, 3))
    peer = {
        "expert_id": 0, "cluster_id": 0, "objective": "ddpm", "preset": "mini", "steps": 1, "images_seen": 1,
        "device_seconds": 1.0, "sha256": "0" * 64, "schedule": "cosine", "num_train_timesteps": 1000,
        "clean_prior": meta | {"times": [0.9] * len(GRID)},
    }  # fmt: skip
    from hddm_flower.checkpoints import TIME_CONVENTION

    peer["time_convention"] = TIME_CONVENTION
    with pytest.raises(CheckpointRejected, match="clean_prior times"):
        parse_expert_meta(peer)
    assert parse_expert_meta(peer | {"clean_prior": meta})["objective"] == "ddpm"


def test_hand_over_weights():
    w = torch.tensor([[0.6, 0.4, 0.0], [0.5, 0.0, 0.5], [1.0, 0.0, 0.0], [0.6, 0.4, 0.0]], dtype=F64)
    converted = torch.tensor([True, False, False])
    rows = torch.tensor([True, True, True, False])
    out, fallback = hand_over(w, converted, rows)
    expected = torch.tensor([[0, 1.0, 0], [0, 0, 1.0], [1.0, 0, 0], [0.6, 0.4, 0]], dtype=F64)
    torch.testing.assert_close(out, expected)
    assert fallback.tolist() == [False, False, True, False]


class _Constant(torch.nn.Module):
    def __init__(self, value):
        super().__init__()
        self.value = value

    def forward(self, x, timestep, cond):
        return torch.full_like(x, self.value)


def test_ensemble_hands_over_above_t_and_falls_back():
    """Top-2 past handover_t picks FM experts only (renormalised); below it the router's choice stands; the oracle
    on a DDPM cluster keeps its expert (fallback), and an ensemble without FM experts is unchanged."""
    experts = {
        0: DDPMExpert(_Constant(0.0), "cosine", t_eps=1e-12, x0_clamp=1e12),
        1: FlowMatchingExpert(_Constant(1.0)),
        2: FlowMatchingExpert(_Constant(3.0)),
    }
    logits = torch.log(torch.tensor([0.6, 0.3, 0.1], dtype=F64))
    router = lambda x, t: logits.expand(len(x), 3)  # noqa: E731
    ens = Ensemble(experts, router, 3, routing="top_k", k=2, handover_t=0.9)
    ens.handover_counts = {}
    x = torch.zeros(4, D, dtype=F64)
    torch.testing.assert_close(
        ens.velocity(x, torch.full((4,), 0.95, dtype=F64), None), torch.full((4, D), 1.5, dtype=F64)
    )
    v_low = ens.velocity(x, torch.full((4,), 0.5, dtype=F64), None)  # DDPM (0.6/0.9) and FM 1 (0.3/0.9)
    eps_to_v = ddpm_eps_to_velocity(
        x, torch.full((4,), 0.5, dtype=F64), torch.zeros_like(x), t_eps=1e-12, x0_clamp=1e12
    )
    torch.testing.assert_close(v_low, (0.6 * eps_to_v + 0.3 * 1.0) / 0.9)
    labels = torch.zeros(4, dtype=torch.long)
    v_oracle = ens.velocity(x, torch.full((4,), 0.95, dtype=F64), None, routing="oracle", labels=labels)
    assert read_counts(ens.handover_counts) == {"rows": 12, "late_rows": 8, "fallback_rows": 4}
    tt = torch.full((4,), 0.95, dtype=F64)
    torch.testing.assert_close(v_oracle, experts[0].velocity(x, tt, None))
    only_ddpm = Ensemble({0: experts[0]}, lambda x, t: torch.zeros(len(x), 1), 1, routing="top_k", k=1, handover_t=0.5)
    torch.testing.assert_close(only_ddpm.velocity(x, tt, None), experts[0].velocity(x, tt, None))


def test_ddpm_node_without_held_out_samples_ships_its_expert_without_a_table(tmp_path, caplog):
    """A cluster with an empty validation split still yields its DDPM expert: no table, the reason in its
    metadata and log, and the expert loads with the clamp (as an older checkpoint does)."""
    from hddm_flower.checkpoints import make_expert
    from hddm_flower.config.io import config_from_dict
    from hddm_flower.data import read_meta
    from hddm_flower.gmm.dataset import GMMSpec, prepare_gmm
    from hddm_flower.models import ExpertNet
    from hddm_flower.stages.expert import train_one_expert

    spec = GMMSpec(num_clusters=2, components_per_cluster=1, image_size=4, channels=1, rank=1, num_samples=16)
    d = prepare_gmm(tmp_path, spec, val_fraction=0.0, max_caption_tokens=4)
    assert all(c.get("val", 0) == 0 for c in read_meta(d)["clusters"])
    cfg = config_from_dict(
        {
            "num_experts": 2,
            "objectives": {"ddpm": 1, "fm": 1, "ddpm_clusters": [0]},
            "federation": {"min_nodes": 1, "min_experts": 1},
            "expert": {"preset": "test", "steps": 1, "batch_size": 2, "optim": {"warmup_steps": 1}},
        }
    )
    with caplog.at_level("WARNING", logger="hddm_flower"):
        state, model_config, meta = train_one_expert(cfg, Dataset.open(d), 0, "ddpm")
    assert meta["clean_prior"] is None and "0 held-out" in meta["clean_prior_note"]
    assert any("clean prior not measured" in r.getMessage() for r in caplog.records)
    parse_expert_meta(meta | {"sha256": "0" * 64})  # a peer accepts it
    net = ExpertNet.from_config(model_config)
    net.transformer.load_state_dict(state)
    expert = make_expert(net, meta, clean_estimate="shrink")
    assert isinstance(expert, DDPMExpert) and not expert.shrinks
