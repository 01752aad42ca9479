"""Training objectives and the DDPM → velocity conversion, as pure tensor functions.

Conventions (docs/design.md), used everywhere in this package:

* FM time ``t ∈ [0, 1]`` with **t = 1 pure noise**; the Flow-Matching path is ``x_t = (1 − t)·x0 + t·eps``.
* "velocity" is the FM velocity ``v = eps − x0`` = dx_t/dt. It is *not* diffusers' ``v_prediction``.
* DDPM experts live on a discrete variance-preserving schedule ``alpha_bar[tau]``, ``tau ∈ {0, …, T−1}``
  (``tau = T−1`` is the noisiest): ``z = sqrt(alpha_bar)·x0 + sqrt(1 − alpha_bar)·eps``; the network predicts eps.
* FM networks see the time as ``FM_TIME_SCALE·t`` (999·t), the same range as DDPM timesteps.

Schedule-aware conversion of a DDPM expert at FM time t (exact when the network is exact and the SNR of ``x_t``
lies inside the schedule's range):

1. SNR match: ``alpha_bar* = (1−t)² / ((1−t)² + t²)``; ``tau*`` is the fractional timestep where the schedule's
   log-SNR, linearly interpolated between integer timesteps, equals that of ``alpha_bar*`` (clamped to [0, T−1]).
2. Input rescale: ``x̃ = x_t / sqrt((1−t)² + t²)``, a VP sample at ``alpha_bar*``.
3. ``eps_hat = net(x̃, tau*)``; ``x0_hat = (x_t − t·eps_hat) / max(1 − t, t_eps)`` clamped to ``±x0_clamp``;
   ``v_hat = eps_hat − x0_hat``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .choices import ESTIMATE_GUARD, SCHEDULES, SHRINK_BRANCH_T

FM_TIME_SCALE = 999.0
"""FM networks receive ``FM_TIME_SCALE·t`` as their timestep (the paper's "999·t")."""


def _bcast(t: Tensor, x: Tensor) -> Tensor:
    """View a per-sample time (B,) as (B, 1, …, 1) so it broadcasts against x (B, …)."""
    t = torch.as_tensor(t, dtype=x.dtype, device=x.device)
    return t.reshape(-1, *([1] * (x.ndim - 1))) if t.ndim else t


# ----------------------------------------------------------------------------------------------------------------
# Flow Matching


def fm_interpolate(x0: Tensor, eps: Tensor, t: Tensor) -> Tensor:
    """``x_t = (1 − t)·x0 + t·eps``."""
    t = _bcast(t, x0)
    return (1 - t) * x0 + t * eps


def logit_normal_time(z: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """Training times ``t = sigmoid(mean + std·z)`` from standard normal ``z``: the logit-normal density
    ``p(t) = exp(−(logit t − mean)² / 2std²) / (std·sqrt(2π)·t·(1 − t))`` of SD3 (Esser et al. 2024), which spends
    the steps on intermediate noise levels instead of the nearly clean and nearly pure-noise ends."""
    return torch.sigmoid(mean + std * z)


def fm_velocity_target(x0: Tensor, eps: Tensor) -> Tensor:
    """The regression target of an FM expert, ``v = eps − x0``."""
    return eps - x0


def fm_loss(v_hat: Tensor, x0: Tensor, eps: Tensor) -> Tensor:
    """``E ‖v_hat − (eps − x0)‖²`` (mean over all elements)."""
    return torch.mean((v_hat - fm_velocity_target(x0, eps)) ** 2)


def x0_from_velocity(x_t: Tensor, t: Tensor, v: Tensor) -> Tensor:
    """``x0 = x_t − t·v`` on the FM path."""
    return x_t - _bcast(t, x_t) * v


def eps_from_velocity(x_t: Tensor, t: Tensor, v: Tensor) -> Tensor:
    """``eps = x_t + (1 − t)·v`` on the FM path."""
    return x_t + (1 - _bcast(t, x_t)) * v


def velocity_from_eps(x_t: Tensor, t: Tensor, eps: Tensor) -> Tensor:
    """``v = (eps − x_t) / (1 − t)`` on the FM path (no endpoint guard; see :func:`ddpm_eps_to_velocity`)."""
    return (eps - x_t) / (1 - _bcast(t, x_t))


def velocity_from_x0(x_t: Tensor, t: Tensor, x0: Tensor) -> Tensor:
    """``v = (x_t − x0) / t`` on the FM path (no endpoint guard)."""
    return (x_t - x0) / _bcast(t, x_t)


# ----------------------------------------------------------------------------------------------------------------
# DDPM (variance preserving, discrete time)


def ddpm_alpha_bar(schedule: str, num_train_timesteps: int = 1000, dtype: torch.dtype = torch.float64) -> Tensor:
    """The cumulative product ``alpha_bar[tau]``, tau = 0 … T−1, of a VP schedule.

    ``linear``: beta from 1e-4 to 0.02 (Ho et al.; the ImageNet DiT checkpoint's schedule).
    ``cosine``: Nichol & Dhariwal, ``alpha_bar(s) = cos²((s/T + 0.008)/1.008 · π/2)``, betas capped at 0.999.
    """
    T = num_train_timesteps
    if schedule == "linear":
        betas = torch.linspace(1e-4, 0.02, T, dtype=torch.float64)
    elif schedule == "cosine":
        f = lambda s: math.cos((s / T + 0.008) / 1.008 * math.pi / 2) ** 2  # noqa: E731
        betas = torch.tensor([min(1 - f(i + 1) / f(i), 0.999) for i in range(T)], dtype=torch.float64)
    else:
        raise ValueError(f"unknown DDPM schedule {schedule!r}; expected one of {SCHEDULES}")
    return torch.cumprod(1 - betas, dim=0).to(dtype)


def ddpm_log_snr(alpha_bar: Tensor) -> Tensor:
    """``log(alpha_bar / (1 − alpha_bar))``, decreasing in tau."""
    return torch.log(alpha_bar) - torch.log1p(-alpha_bar)


def alpha_bar_at(tau: Tensor, alpha_bar: Tensor) -> Tensor:
    """``alpha_bar`` at a fractional timestep: log-SNR interpolated linearly between integer timesteps.

    This is the continuous extension that :func:`snr_matched_timestep` inverts exactly.
    """
    lam = ddpm_log_snr(alpha_bar.to(torch.float64))
    tau = torch.as_tensor(tau, dtype=torch.float64).clamp(0, len(lam) - 1)
    lo = tau.floor().long().clamp(max=len(lam) - 2)
    frac = tau - lo
    lam_tau = lam[lo] + frac * (lam[lo + 1] - lam[lo])
    return torch.sigmoid(lam_tau)


def ddpm_noise(x0: Tensor, eps: Tensor, tau: Tensor, alpha_bar: Tensor) -> Tensor:
    """``z = sqrt(alpha_bar[tau])·x0 + sqrt(1 − alpha_bar[tau])·eps`` for integer timesteps tau (B,)."""
    ab = _bcast(alpha_bar.to(x0.device)[tau], x0)
    return ab.sqrt() * x0 + (1 - ab).sqrt() * eps


def ddpm_loss(eps_hat: Tensor, eps: Tensor) -> Tensor:
    """``E ‖eps_hat − eps‖²`` (mean over all elements)."""
    return torch.mean((eps_hat - eps) ** 2)


# ----------------------------------------------------------------------------------------------------------------
# DDPM → velocity conversion


def fm_alpha_bar(t: Tensor) -> Tensor:
    """The VP ``alpha_bar*`` with the same SNR as the FM path at time t: ``(1−t)² / ((1−t)² + t²)``."""
    return (1 - t) ** 2 / ((1 - t) ** 2 + t**2)


def fm_input_scale(t: Tensor) -> Tensor:
    """``1 / sqrt((1−t)² + t²)``: maps an FM sample ``x_t`` to the VP sample with the same SNR."""
    return torch.rsqrt((1 - t) ** 2 + t**2)


def snr_matched_timestep(t: Tensor, alpha_bar: Tensor) -> Tensor:
    """Fractional DDPM timestep ``tau*`` whose SNR equals the FM path's SNR ``((1−t)/t)²`` at time t.

    Inverts the piecewise-linear log-SNR of the table (see :func:`alpha_bar_at`); SNRs outside the table's range
    clamp to tau = 0 (cleaner than the schedule can express) or tau = T − 1 (noisier). Returns float64.
    """
    t = torch.as_tensor(t, dtype=torch.float64)
    lam_t = 2 * (torch.log1p(-t) - torch.log(t))  # FM log-SNR; +inf at t = 0, −inf at t = 1
    neg_lam = -ddpm_log_snr(alpha_bar.to(device=t.device, dtype=torch.float64))  # increasing in tau
    T = len(neg_lam)
    hi = torch.searchsorted(neg_lam, -lam_t).clamp(1, T - 1)  # neg_lam[hi−1] ≤ −lam_t ≤ neg_lam[hi]
    lo = hi - 1
    frac = (-lam_t - neg_lam[lo]) / (neg_lam[hi] - neg_lam[lo])
    return (lo + frac.clamp(0, 1)).clamp(0, T - 1)


def naive_timestep(t: Tensor, num_train_timesteps: int = 1000) -> Tensor:
    """The paper's crude mapping ``tau = round((T − 1)·t)``, with no SNR matching (ablations only)."""
    return torch.round((num_train_timesteps - 1) * torch.as_tensor(t, dtype=torch.float64))


def ddpm_eps_to_velocity(x_t: Tensor, t: Tensor, eps_hat: Tensor, *, t_eps: float, x0_clamp: float) -> Tensor:
    """FM velocity from a noise prediction at FM state ``(x_t, t)``.

    ``x0_hat = (x_t − t·eps_hat) / max(1 − t, t_eps)``, clamped to ``±x0_clamp``; ``v_hat = eps_hat − x0_hat``.
    ``t_eps`` guards the division near pure noise (t → 1), where ``x_t`` carries no information about x0;
    ``x0_clamp`` bounds the clean estimate there. Away from both guards this is exactly
    ``velocity_from_eps(x_t, t, eps_hat)``.
    """
    tb = _bcast(t, x_t)
    x0_hat = (x_t - tb * eps_hat) / (1 - tb).clamp(min=t_eps)
    x0_hat = x0_hat.clamp(-x0_clamp, x0_clamp)
    return eps_hat - x0_hat


# ----------------------------------------------------------------------------------------------------------------
# The error-aware clean estimate ("shrink"): a trained network's x0_hat combined with its cluster's mean
#
# A trained eps-network eps_hat = eps* + delta gives x0_hat = x0* − t·delta/(1 − t): near noise its clean estimate
# is mostly the network's error amplified. The best linear estimate of x0 from x0_hat and the cluster mean mu is
# x0_tilde = mu + lambda(t)·(x0_hat − mu), lambda = C/V with C = E[(x0_hat − mu)·(x0 − mu)], V = E‖x0_hat − mu‖²
# (per element). Writing x0_hat = x0* + eta (eta uncorrelated), C = Var x0* and V = C + Var eta: the precisions of
# the network's estimate and the prior combined. An exact network has V = C, lambda = 1: its velocity is unchanged.


def shrink_weight(spread: Tensor, total: Tensor) -> Tensor:
    """``lambda = C / V`` clipped to [0, 1], and 0 where ``V`` is 0 (nothing to combine: the estimate is the mean)."""
    spread, total = torch.as_tensor(spread), torch.as_tensor(total)
    lam = spread / total.clamp(min=torch.finfo(total.dtype).tiny)
    return torch.where(total > 0, lam.clamp(0, 1), torch.zeros_like(lam))


def naive_shrink_weight(t: Tensor, x0_variance: Tensor, eps_mse: Tensor) -> Tensor:
    """The literal precision weighting ``s² / (s² + e_eps·t²/(1 − t)²)`` of the data variance ``s²`` and the
    network's total eps error ``e_eps`` at t, turned into an x0 error by ``t/(1 − t)``: 1 at t = 0, 0 at t = 1.

    It counts the prior twice (``e_eps`` of an exact network is the posterior variance, not 0), so it shrinks even
    an exact network; :func:`shrink_weight` does not."""
    t = torch.as_tensor(t, dtype=torch.float64)
    s2 = torch.as_tensor(x0_variance, dtype=torch.float64)
    err = torch.as_tensor(eps_mse, dtype=torch.float64) * t**2
    return torch.where(t < 1, s2 * (1 - t) ** 2 / (s2 * (1 - t) ** 2 + err).clamp(min=1e-300), torch.zeros_like(t))


def interpolate_in_t(t: Tensor, grid: Tensor, values: Tensor) -> Tensor:
    """Piecewise-linear ``values`` (G,) over the increasing ``grid`` (G,) at times ``t`` (B,) (ends held)."""
    grid, values = grid.to(torch.float64), values.to(torch.float64)
    t = torch.as_tensor(t, dtype=torch.float64).clamp(grid[0], grid[-1])  # tensor bounds: no host read
    hi = torch.searchsorted(grid, t).clamp(1, len(grid) - 1)
    lo = hi - 1
    frac = ((t - grid[lo]) / (grid[hi] - grid[lo])).clamp(0, 1)
    return values[lo] + frac * (values[hi] - values[lo])


def ddpm_eps_to_velocity_shrunk(x_t: Tensor, t: Tensor, eps_hat: Tensor, mean: Tensor, lam: Tensor) -> Tensor:
    """FM velocity from a noise prediction through the shrunk clean estimate ``x0_tilde = mu + lam·(x0_hat − mu)``.

    ``v = (x_t − x0_tilde)/t``, evaluated where it is stable: as written for ``t ≥ SHRINK_BRANCH_T``, and as the
    equal ``eps_hat − x0_hat + (1 − lam)·(x0_hat − mu)/t`` below it (the conversion's own velocity plus the
    shrink's correction). With ``lam = 1`` this is ``eps_hat − x0_hat`` exactly; no clamp, no ``t_eps``. The named
    guard ``ESTIMATE_GUARD`` on ``t`` and ``1 − t`` only meets terms that vanish at the endpoints (``lam(0) = 1``,
    ``lam(1) = 0``): at t = 1 the velocity is ``x_t − mu``, at t = 0 it is ``eps_hat − x_t``.
    ``mean`` broadcasts against one sample (C, H, W); ``lam`` is per row (B,).
    """
    tb, lb = _bcast(t, x_t), _bcast(lam.to(x_t.dtype), x_t)
    mu = mean.to(x_t.dtype)
    x0_hat = (x_t - tb * eps_hat) / (1 - tb).clamp(min=ESTIMATE_GUARD)
    x0_tilde = mu + lb * (x0_hat - mu)
    high = (x_t - x0_tilde) / tb.clamp(min=ESTIMATE_GUARD)
    low = eps_hat - x0_hat + (1 - lb) * (x0_hat - mu) / tb.clamp(min=ESTIMATE_GUARD)
    return torch.where(tb >= SHRINK_BRANCH_T, high, low)


# ----------------------------------------------------------------------------------------------------------------
# Adaptive velocity scaling (the paper's high-noise fix for converted DDPM velocities; its form is not published)


def velocity_rms(v: Tensor) -> Tensor:
    """Per-sample root mean square (B,) of a velocity (B, …)."""
    return v.pow(2).flatten(1).mean(1).sqrt()


def velocity_rms_prior(x0_variance: float) -> float:
    """RMS of the true velocity ``ε − x0`` for ε ~ N(0, I) independent of zero-mean data of per-element variance
    ``x0_variance``: ``E‖ε − x0‖²/d = 1 + Var x0``."""
    return math.sqrt(1.0 + x0_variance)


def cap_velocity_rms(v: Tensor, cap: Tensor) -> tuple[Tensor, Tensor]:
    """Scale each sample of ``v`` (B, …) down so that its RMS is at most ``cap`` (B,); samples already below keep
    their value. Returns the capped velocity and which samples were scaled (B,) bool."""
    rms = velocity_rms(v)
    cap = torch.as_tensor(cap, dtype=rms.dtype, device=rms.device).expand_as(rms)
    fired = rms > cap
    factor = torch.where(fired, cap / rms.clamp(min=torch.finfo(rms.dtype).tiny), torch.ones_like(rms))
    return v * _bcast(factor.to(v.dtype), v), fired
