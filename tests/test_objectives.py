"""Objectives and the DDPM → velocity conversion against closed-form answers, in float64."""

import math

import pytest
import torch

from hddm_flower.experts import DDPMExpert, FlowMatchingExpert
from hddm_flower.objectives import (
    alpha_bar_at,
    ddpm_alpha_bar,
    ddpm_eps_to_velocity,
    ddpm_log_snr,
    ddpm_noise,
    eps_from_velocity,
    fm_alpha_bar,
    fm_input_scale,
    fm_interpolate,
    naive_timestep,
    snr_matched_timestep,
    velocity_from_eps,
    velocity_from_x0,
    x0_from_velocity,
)

from .gmm import three_blobs

T_GRID = torch.tensor([0.0, 1e-6, 0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 1.0], dtype=torch.float64)


def _representable(alpha_bar):
    """FM times whose SNR lies inside the schedule's range (where the conversion is exact)."""
    lam = ddpm_log_snr(alpha_bar)
    t_lo = 1 / (1 + math.exp(lam[0] / 2))  # SNR of tau = 0
    t_hi = 1 / (1 + math.exp(lam[-1] / 2))  # SNR of tau = T − 1
    return t_lo, t_hi


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_schedules_closed_form(schedule):
    ab = ddpm_alpha_bar(schedule)
    assert ab.shape == (1000,) and ab.dtype == torch.float64
    assert torch.all(ab[1:] < ab[:-1]) and 0 < ab[-1] < ab[0] < 1
    if schedule == "linear":
        expected = torch.cumprod(1 - torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64), 0)
        torch.testing.assert_close(ab, expected, rtol=0, atol=0)
        assert math.isclose(ab[0].item(), 1 - 1e-4)
    else:  # cosine: alpha_bar(tau) = f(tau + 1) / f(0) wherever the 0.999 beta cap is inactive
        f = lambda s: math.cos((s / 1000 + 0.008) / 1.008 * math.pi / 2) ** 2  # noqa: E731
        for tau in [0, 1, 10, 250, 500, 900, 990]:
            assert math.isclose(ab[tau].item(), f(tau + 1) / f(0), rel_tol=1e-9)


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_snr_matched_timestep_inverts_alpha_bar(schedule):
    ab = ddpm_alpha_bar(schedule)
    # at integer timesteps the matched tau is that integer
    taus = torch.tensor([0, 1, 7, 100, 500, 998, 999], dtype=torch.float64)
    t = 1 / (1 + torch.sqrt(ab[taus.long()] / (1 - ab[taus.long()])))  # FM time with the same SNR
    torch.testing.assert_close(snr_matched_timestep(t, ab), taus, rtol=0, atol=1e-6)
    # in between, alpha_bar_at(tau*) equals the FM path's alpha_bar*
    t_lo, t_hi = _representable(ab)
    t = torch.linspace(t_lo, t_hi, 513, dtype=torch.float64)
    torch.testing.assert_close(alpha_bar_at(snr_matched_timestep(t, ab), ab), fm_alpha_bar(t), rtol=1e-10, atol=0)
    # endpoints and beyond the range clamp
    tau = snr_matched_timestep(T_GRID, ab)
    assert tau[0] == 0 and tau[-1] == 999 and torch.all(tau[1:] >= tau[:-1])
    assert torch.all(torch.isfinite(tau))


def test_round_trips_eps_x0_velocity():
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(13, 3, 4, 4, generator=g, dtype=torch.float64)
    eps = torch.randn(13, 3, 4, 4, generator=g, dtype=torch.float64)
    t = torch.linspace(0.01, 0.99, 13, dtype=torch.float64)
    x_t = fm_interpolate(x0, eps, t)
    v = eps - x0
    torch.testing.assert_close(x0_from_velocity(x_t, t, v), x0)
    torch.testing.assert_close(eps_from_velocity(x_t, t, v), eps)
    torch.testing.assert_close(velocity_from_eps(x_t, t, eps), v)
    torch.testing.assert_close(velocity_from_x0(x_t, t, x0), v)
    # endpoints of the path: pure data at t = 0, pure noise at t = 1
    torch.testing.assert_close(fm_interpolate(x0, eps, torch.zeros(13, dtype=torch.float64)), x0)
    torch.testing.assert_close(fm_interpolate(x0, eps, torch.ones(13, dtype=torch.float64)), eps)
    # the guarded conversion equals the plain one away from its guards
    torch.testing.assert_close(ddpm_eps_to_velocity(x_t, t, eps, t_eps=1e-3, x0_clamp=1e9), v)


def test_input_rescale_gives_vp_sample_at_matched_snr():
    g = torch.Generator().manual_seed(1)
    x0, eps = torch.randn(2, 9, 5, generator=g, dtype=torch.float64)
    t = torch.linspace(0.0, 1.0, 9, dtype=torch.float64)
    ab = fm_alpha_bar(t)
    x_tilde = fm_input_scale(t)[:, None] * fm_interpolate(x0, eps, t)
    torch.testing.assert_close(x_tilde, ab.sqrt()[:, None] * x0 + (1 - ab).sqrt()[:, None] * eps)


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_ddpm_adapter_turns_exact_eps_into_exact_velocity(schedule):
    """ε* of a Gaussian mixture through the DDPM adapter equals the mixture's v*, to 1e-6, for all
    representable t (the whole open interval but for the schedule's extreme SNRs)."""
    gmm, ab = three_blobs(), ddpm_alpha_bar(schedule)
    expert = DDPMExpert(lambda z, tau, cond: gmm.ddpm_eps_star(z, tau, ab), schedule, t_eps=1e-12, x0_clamp=1e12)
    t_lo, t_hi = _representable(ab)
    g = torch.Generator().manual_seed(2)
    for t in torch.cat(
        [torch.tensor([t_lo, t_hi], dtype=torch.float64), torch.linspace(0.0, 1.0, 41, dtype=torch.float64)[1:-1]]
    ):
        if not t_lo <= t <= t_hi:
            continue
        x0 = gmm.sample(64, g)
        x_t = fm_interpolate(x0, torch.randn(x0.shape, generator=g, dtype=torch.float64), t)
        v_hat = expert.velocity(x_t, t, None)
        torch.testing.assert_close(v_hat, gmm.fm_velocity_star(x_t, t), rtol=0, atol=1e-6)


def test_fm_adapter_is_identity_with_scaled_time():
    seen = {}

    def net(x, timestep, cond):
        seen["timestep"] = timestep
        return 2 * x

    x = torch.randn(4, 3, dtype=torch.float64)
    t = torch.tensor([0.0, 0.25, 0.5, 1.0], dtype=torch.float64)
    torch.testing.assert_close(FlowMatchingExpert(net).velocity(x, t, None), 2 * x)
    torch.testing.assert_close(seen["timestep"], 999 * t)


def test_endpoint_guards():
    x_t = torch.tensor([[3.0, -3.0]], dtype=torch.float64)
    eps_hat = torch.tensor([[0.5, -0.5]], dtype=torch.float64)
    # t = 1: the division uses t_eps instead of 0 and x0_hat is clamped
    t1 = torch.tensor([1.0], dtype=torch.float64)
    v = ddpm_eps_to_velocity(x_t, t1, eps_hat, t_eps=0.01, x0_clamp=20.0)
    x0_hat = ((x_t - eps_hat) / 0.01).clamp(-20, 20)  # (2.5/0.01 = 250 → 20)
    torch.testing.assert_close(v, eps_hat - x0_hat)
    torch.testing.assert_close(v, torch.tensor([[0.5 - 20, -0.5 + 20]], dtype=torch.float64))
    # t_eps only acts when 1 − t < t_eps
    t = torch.tensor([0.995], dtype=torch.float64)
    v_guard = ddpm_eps_to_velocity(x_t, t, eps_hat, t_eps=0.01, x0_clamp=1e9)
    torch.testing.assert_close(v_guard, eps_hat - (x_t - 0.995 * eps_hat) / 0.01)
    v_free = ddpm_eps_to_velocity(x_t, t, eps_hat, t_eps=0.001, x0_clamp=1e9)
    torch.testing.assert_close(v_free, velocity_from_eps(x_t, t, eps_hat))
    # t = 0: x0_hat = x_t (clamped), whatever eps_hat says
    t0 = torch.tensor([0.0], dtype=torch.float64)
    torch.testing.assert_close(
        ddpm_eps_to_velocity(x_t, t0, eps_hat, t_eps=0.01, x0_clamp=2.0), eps_hat - x_t.clamp(-2, 2)
    )
    # the adapter stays finite on the whole grid including both endpoints
    ab = ddpm_alpha_bar("linear")
    gmm = three_blobs()
    expert = DDPMExpert(lambda z, tau, c: gmm.ddpm_eps_star(z, tau, ab), "linear", t_eps=0.01, x0_clamp=20.0)
    x = torch.randn(len(T_GRID), 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    v = expert.velocity(x, T_GRID, None)
    assert torch.all(torch.isfinite(v)) and torch.all((eps_from_velocity(x, T_GRID, v) - x).abs() < 1e3)


def test_naive_variant_maps_time_linearly_without_rescale():
    seen = {}

    def net(x, timestep, cond):
        seen["x"], seen["timestep"] = x, timestep
        return torch.zeros_like(x)

    x = torch.randn(3, 2, dtype=torch.float64)
    t = torch.tensor([0.0, 0.5004, 1.0], dtype=torch.float64)
    DDPMExpert(net, "cosine", conversion="naive").velocity(x, t, None)
    torch.testing.assert_close(seen["x"], x)
    torch.testing.assert_close(seen["timestep"], torch.tensor([0.0, 500.0, 999.0], dtype=torch.float64))
    torch.testing.assert_close(naive_timestep(t), seen["timestep"])
    # and it is *not* exact: on the mixture the naive velocity is off where the schedule differs from FM's SNR
    gmm, ab = three_blobs(), ddpm_alpha_bar("cosine")
    naive = DDPMExpert(
        lambda z, tau, c: gmm.ddpm_eps_star(z, tau, ab), "cosine", conversion="naive", t_eps=1e-12, x0_clamp=1e12
    )
    x_t = torch.randn(32, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    t = torch.full((32,), 0.3, dtype=torch.float64)
    assert (naive.velocity(x_t, t, None) - gmm.fm_velocity_star(x_t, t)).abs().max() > 1e-2


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_training_losses_vanish_for_exact_predictors(schedule):
    """Each adapter's training loss is the MSE to its own target: an exact predictor of that target scores 0."""
    g = torch.Generator().manual_seed(5)
    x0 = torch.randn(8, 3, dtype=torch.float64, generator=g)
    ab = ddpm_alpha_bar(schedule)
    # a DDPM "network" that knows x0 recovers eps from z exactly
    ddpm = DDPMExpert(
        lambda z, tau, c: (
            (z - alpha_bar_at(tau, ab).sqrt()[:, None] * x0) / (1 - alpha_bar_at(tau, ab)).sqrt()[:, None]
        ),
        schedule,
    )
    assert ddpm.training_loss(x0, None, generator=g).item() < 1e-20
    # an FM "network" that knows x0 recovers v from x_t and t
    fm = FlowMatchingExpert(lambda x_t, ts, c: velocity_from_x0(x_t, ts / 999, x0))
    assert fm.training_loss(x0, None, generator=g).item() < 1e-20
    # and the DDPM noising is the VP formula
    eps = torch.randn(8, 3, dtype=torch.float64, generator=g)
    tau = torch.arange(8) * 100
    torch.testing.assert_close(
        ddpm_noise(x0, eps, tau, ab), ab[tau].sqrt()[:, None] * x0 + (1 - ab[tau]).sqrt()[:, None] * eps
    )


def _normal_cdf(x):
    return 0.5 * (1 + torch.erf(x / math.sqrt(2)))


@pytest.mark.parametrize(("mean", "std"), [(0.0, 1.0), (-0.5, 0.6)])
def test_logit_normal_training_times_follow_their_closed_form(mean, std):
    """An FM expert with logit-normal time sampling draws t with CDF Φ((logit t − mean) / std), 0 at t = 0 and 1 at
    t = 1, whose derivative is the density of :func:`logit_normal_time`'s docstring; its loss still vanishes for an
    exact predictor."""
    n = 200_000
    fm = FlowMatchingExpert(
        lambda x_t, ts, c: torch.zeros_like(x_t), {"kind": "logit_normal", "mean": mean, "std": std}
    )
    like = torch.zeros(1, dtype=torch.float64)
    t = fm.training_times(n, torch.Generator().manual_seed(0), like)
    assert t.dtype == torch.float64 and bool(((t > 0) & (t < 1)).all())
    inner = T_GRID[(T_GRID > 0) & (T_GRID < 1)]
    cdf = _normal_cdf((torch.logit(inner) - mean) / std)
    empirical = (t[None, :] <= inner[:, None]).double().mean(1)
    assert float((empirical - cdf).abs().max()) < 5 * math.sqrt(0.25 / n)  # 5 standard errors at worst
    assert float((t <= 0.0).double().mean()) == 0.0 and float((t <= 1.0).double().mean()) == 1.0
    h = 1e-6  # the density is the CDF's derivative
    density = torch.exp(-((torch.logit(inner) - mean) ** 2) / (2 * std**2)) / (
        std * math.sqrt(2 * math.pi) * inner * (1 - inner)
    )
    ok = (inner > 1e-3) & (inner < 1 - 1e-3)  # central differences need room on both sides
    x = inner[ok]
    numeric = (_normal_cdf((torch.logit(x + h) - mean) / std) - _normal_cdf((torch.logit(x - h) - mean) / std)) / (
        2 * h
    )
    torch.testing.assert_close(numeric, density[ok], rtol=1e-4, atol=1e-8)
    x0 = torch.randn(8, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    exact = FlowMatchingExpert(
        lambda x_t, ts, c: velocity_from_x0(x_t, ts / 999, x0), {"kind": "logit_normal", "mean": mean, "std": std}
    )
    assert exact.training_loss(x0, None, generator=torch.Generator().manual_seed(2)).item() < 1e-20


def test_uniform_training_times_are_torch_rand_and_unknown_kinds_are_refused():
    """The default draws exactly what ``torch.rand`` draws from the same generator (runs stay reproducible)."""
    like = torch.zeros(1, dtype=torch.float64)
    fm = FlowMatchingExpert(lambda x_t, ts, c: x_t)
    t = fm.training_times(64, torch.Generator().manual_seed(3), like)
    assert torch.equal(t, torch.rand(64, generator=torch.Generator().manual_seed(3), dtype=torch.float64))
    with pytest.raises(ValueError, match="unknown FM time sampling 'beta'"):
        FlowMatchingExpert(lambda x_t, ts, c: x_t, {"kind": "beta"})
