"""The clean prior a DDPM expert ships for the error-aware conversion: its cluster's mean and, on a grid of FM
times, how far its own clean estimate can be trusted (:func:`hddm_flower.objectives.ddpm_eps_to_velocity_shrunk`).

Measured by the node at the end of training (:func:`measure_clean_prior`), no image leaves it:

* ``mean``: the per-element mean of its training images (C, H, W). Per element, not per channel: at t = 1 the
  exact clean estimate *is* this mean, so the conversion's velocity there is exact (``x_t − mu``) for any data,
  stationary or not; it costs one image's worth of numbers (16 KiB for a 4×32×32 latent).
* on its held-out split, at each grid time t, with its own captions and fresh noise (``eps_hat`` = the network at
  the SNR-matched input, ``x0_hat = (x_t − t·eps_hat)/(1 − t)``), per element:
  ``spread`` C = E[(x0_hat − mu)·(x0 − mu)], ``total`` V = E‖x0_hat − mu‖² and ``eps_mse`` = E‖eps_hat − eps‖²;
  and ``x0_variance`` s² = E‖x0 − mu‖².

``lambda(t) = C/V`` (``shrink``) or ``s²/(s² + eps_mse·t²/(1 − t)²)`` (``shrink_naive``), defined as 1 at t = 0 and 0 at
t = 1, interpolated linearly in t. The table travels in the expert's metadata (``clean_prior``) and is checked by
:func:`parse_clean_prior` when a peer sends it: a bad table rejects that expert only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .objectives import (
    fm_input_scale,
    interpolate_in_t,
    naive_shrink_weight,
    shrink_weight,
    snr_matched_timestep,
)
from .wire import WireError, as_float, as_int

CLEAN_PRIOR_TIMES = (
    0.05,
    0.1,
    0.2,
    0.3,
    0.4,
    0.5,
    0.6,
    0.7,
    0.8,
    0.85,
    0.9,
    0.93,
    0.95,
    0.97,
    0.98,
    0.99,
    0.995,
    0.999,
)
"""Interior FM times at which a node measures its table (dense near noise, where lambda falls)."""

MAX_PRIOR_ELEMENTS = 1 << 16
"""Largest ``mean`` a peer may send (a 16×64×64 latent)."""


@dataclass(frozen=True)
class CleanPrior:
    """A DDPM expert's measured clean prior (module docstring); all tensors float64."""

    times: Tensor  # (G,) interior grid, increasing in (0, 1)
    spread: Tensor  # (G,) C
    total: Tensor  # (G,) V
    eps_mse: Tensor  # (G,) e_eps
    x0_variance: float  # s²
    mean: Tensor  # (C, H, W)
    heldout: int  # held-out (x0, eps) pairs per grid time

    def weights(self, kind: str) -> tuple[Tensor, Tensor]:
        """The full grid ``[0, times…, 1]`` and lambda on it for ``kind`` ``shrink`` or ``shrink_naive``."""
        if kind == "shrink":
            inner = shrink_weight(self.spread, self.total)
        elif kind == "shrink_naive":
            inner = naive_shrink_weight(self.times, torch.tensor(self.x0_variance, dtype=torch.float64), self.eps_mse)
        else:
            raise ValueError(f"no lambda for clean estimate {kind!r}")
        one, zero = torch.ones(1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)
        return torch.cat([zero, self.times, one]), torch.cat([one, inner, zero])

    def lam(self, kind: str, t: Tensor) -> Tensor:
        """lambda at times ``t`` (B,), float64."""
        grid, values = self.weights(kind)
        return interpolate_in_t(t, grid, values)

    def to_meta(self) -> dict[str, Any]:
        return {
            "times": self.times.tolist(),
            "spread": self.spread.tolist(),
            "total": self.total.tolist(),
            "eps_mse": self.eps_mse.tolist(),
            "x0_variance": self.x0_variance,
            "shape": list(self.mean.shape),
            "mean": self.mean.flatten().tolist(),
            "heldout": self.heldout,
        }


def parse_clean_prior(value: Any, shape: tuple[int, ...] | None = None) -> CleanPrior:
    """A ``clean_prior`` metadata entry checked field by field (raises :class:`~hddm_flower.wire.WireError`):
    an increasing grid in (0, 1), finite non-negative moments of the grid's length, and a finite mean of
    ``shape`` (the expert's sample shape, when known)."""
    what = "metadata clean_prior"
    if not isinstance(value, dict):
        raise WireError(f"{what}: expected an object, got {type(value).__name__}")
    lists = {}
    for key in ("times", "spread", "total", "eps_mse", "shape", "mean"):
        v = value.get(key)
        if not isinstance(v, list) or not v:
            raise WireError(f"{what} {key}: expected a non-empty list")
        lists[key] = v
    g = len(lists["times"])
    if g > 1000:
        raise WireError(f"{what} times: {g} grid points (at most 1000)")
    times = torch.tensor([as_float(x, f"{what} times", 0.0, 1.0) for x in lists["times"]], dtype=torch.float64)
    if not (times > 0).all() or not (times < 1).all() or not (times[1:] > times[:-1]).all():
        raise WireError(f"{what} times: must increase strictly inside (0, 1)")
    moments = {}
    for key in ("spread", "total", "eps_mse"):
        if len(lists[key]) != g:
            raise WireError(f"{what} {key}: {len(lists[key])} values for {g} times")
        lo = -1e30 if key == "spread" else 0.0  # C may be negative for a network worse than its mean
        moments[key] = torch.tensor([as_float(x, f"{what} {key}", lo, 1e30) for x in lists[key]], dtype=torch.float64)
    dims = tuple(as_int(x, f"{what} shape", 1, MAX_PRIOR_ELEMENTS) for x in lists["shape"])
    n = 1
    for d in dims:
        n *= d
    if n > MAX_PRIOR_ELEMENTS or len(lists["mean"]) != n:
        raise WireError(f"{what} mean: {len(lists['mean'])} values for shape {list(dims)}")
    if shape is not None and dims != tuple(shape):
        raise WireError(f"{what} shape {list(dims)} is not the expert's sample shape {list(shape)}")
    mean = torch.tensor([as_float(x, f"{what} mean", -1e6, 1e6) for x in lists["mean"]], dtype=torch.float64)
    return CleanPrior(
        times,
        moments["spread"],
        moments["total"],
        moments["eps_mse"],
        as_float(value.get("x0_variance"), f"{what} x0_variance", 0.0, 1e30),
        mean.reshape(dims),
        as_int(value.get("heldout"), f"{what} heldout", 1),
    )


def _each(fn, cond: Any) -> Any:
    """``fn`` on a condition's tensors: None, a tensor, or a (named) tuple of tensors such as a TextCond."""
    if cond is None or isinstance(cond, Tensor):
        return None if cond is None else fn(cond)
    return type(cond)(*(fn(c) for c in cond))


@torch.no_grad()
def measure_clean_prior(
    net,
    alpha_bar: Tensor,
    mean: Tensor,
    x0: Tensor,
    cond: Any,
    *,
    times: tuple[float, ...] = CLEAN_PRIOR_TIMES,
    repeats: int = 4,
    generator: torch.Generator | None = None,
    batch_size: int = 1024,
) -> CleanPrior:
    """Measure the table of an eps-network ``net(x, timestep, cond)`` on held-out images ``x0`` (N, C, H, W) with
    their conditions ``cond`` (batched like ``x0``, e.g. a :class:`~hddm_flower.models.TextCond`), each used with
    ``repeats`` noise draws per time; ``mean`` is the training images' mean (C, H, W). The network sees the
    schedule-aware input of the conversion (SNR-matched timestep, rescaled ``x_t``)."""
    x0 = x0.to(torch.float64)
    mu = mean.to(torch.float64)
    x0_rep = x0.repeat(repeats, *([1] * (x0.ndim - 1)))
    cond_rep = _each(lambda c: c.repeat(repeats, *([1] * (c.ndim - 1))), cond)
    n, d = len(x0_rep), x0[0].numel()
    s2 = float(((x0 - mu) ** 2).sum() / (len(x0) * d))
    spread, total, eps_mse = [], [], []
    dtype = next((p.dtype for p in getattr(net, "parameters", lambda: iter(()))()), torch.float64)
    device = next((p.device for p in getattr(net, "parameters", lambda: iter(()))()), torch.device("cpu"))
    for t in times:
        eps = torch.randn(x0_rep.shape, generator=generator, dtype=torch.float64)
        x_t = (1 - t) * x0_rep + t * eps
        tau = snr_matched_timestep(torch.tensor([t]), alpha_bar)
        c_sum = v_sum = e_sum = 0.0
        for i in range(0, n, batch_size):
            rows = slice(i, i + batch_size)
            xb = x_t[rows]
            scale = float(fm_input_scale(torch.tensor(t, dtype=torch.float64)))
            c_b = _each(lambda c: c[rows].to(device), cond_rep)
            eps_hat = net((xb * scale).to(device, dtype), tau.expand(len(xb)).to(device, dtype), c_b)
            eps_hat = eps_hat.to("cpu", torch.float64)
            x0_hat = (xb - t * eps_hat) / (1 - t)
            c_sum += float(((x0_hat - mu) * (x0_rep[rows] - mu)).sum())
            v_sum += float(((x0_hat - mu) ** 2).sum())
            e_sum += float(((eps_hat - eps[rows]) ** 2).sum())
        spread.append(c_sum / (n * d))
        total.append(v_sum / (n * d))
        eps_mse.append(e_sum / (n * d))
    f64 = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    return CleanPrior(f64(list(times)), f64(spread), f64(total), f64(eps_mse), s2, mu, n)
