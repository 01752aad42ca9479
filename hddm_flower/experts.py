"""One velocity interface over both objectives ("wrap, don't branch").

A raw network is any callable ``net(x, timestep, cond) → output``. An adapter gives it the face the ensemble and
the sampler use, ``velocity(x_t, t, cond, uncond=None, cfg_scale=1.0) → v`` in FM time and velocity space, and the
training loss of its own objective. Classifier-free guidance happens inside the adapter, in the network's native
output space, before any conversion. Nothing outside this module asks which objective an expert has.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from .choices import CLEAN_ESTIMATES, CONVERSIONS, FM_TIME_SAMPLINGS, T_EPS, X0_CLAMP
from .clean_prior import CleanPrior
from .counts import add_count
from .objectives import (
    FM_TIME_SCALE,
    ddpm_alpha_bar,
    ddpm_eps_to_velocity,
    ddpm_eps_to_velocity_shrunk,
    ddpm_loss,
    ddpm_noise,
    fm_input_scale,
    fm_interpolate,
    fm_loss,
    interpolate_in_t,
    logit_normal_time,
    naive_timestep,
    snr_matched_timestep,
)

Net = Callable[[Tensor, Tensor, Any], Tensor]


def map_cond(fn: Callable[..., Tensor], *conds: Any) -> Any:
    """Apply ``fn`` leaf-wise to conditions: tensors, (named) tuples of tensors, or None."""
    first = conds[0]
    if first is None:
        return None
    if isinstance(first, Tensor):
        return fn(*conds)
    if isinstance(first, tuple):
        parts = [map_cond(fn, *leaves) for leaves in zip(*conds)]
        return type(first)(*parts) if hasattr(first, "_fields") else tuple(parts)
    raise TypeError(f"unsupported condition type {type(first).__name__}")


def cat_cond(a: Any, b: Any) -> Any:
    """Concatenate two conditions along the batch."""
    return map_cond(lambda x, y: torch.cat([x, y]), a, b)


def draw_like(fn: Callable[..., Tensor], shape, generator: torch.Generator | None, like: Tensor) -> Tensor:
    """``fn`` (torch.rand / torch.randn) drawn from ``generator`` on its own device, returned on ``like``'s device
    and dtype: a seeded CPU generator then drives training on any device."""
    device = generator.device if generator is not None else like.device
    return fn(shape, generator=generator, device=device, dtype=like.dtype).to(like.device)


class Expert(nn.Module):
    """Base adapter: a network plus the maps between FM time/space and the network's own.

    Subclasses define ``net_inputs`` (what the network sees at FM state ``(x_t, t)``), ``to_velocity`` (how its
    output becomes an FM velocity) and ``training_loss`` (its objective).
    """

    objective: str
    converted = False  # True where ``velocity`` is converted from another output space (velocity scaling applies)

    def __init__(self, net: Net):
        super().__init__()
        self.net = net

    def net_inputs(self, x_t: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def to_velocity(self, x_t: Tensor, t: Tensor, out: Tensor) -> Tensor:
        raise NotImplementedError

    def training_loss(self, x0: Tensor, cond: Any, generator: torch.Generator | None = None) -> Tensor:
        raise NotImplementedError

    def velocity(self, x_t: Tensor, t: Tensor, cond: Any, uncond: Any = None, cfg_scale: float = 1.0) -> Tensor:
        """FM velocity at ``(x_t, t)``; with ``uncond``, guided in native space: ``u + s·(c − u)``."""
        t = torch.as_tensor(t, dtype=x_t.dtype, device=x_t.device).expand(x_t.shape[0])
        x_in, timestep = self.net_inputs(x_t, t)
        if uncond is None or cfg_scale == 1.0:
            out = self.net(x_in, timestep, cond)
        else:
            out_c, out_u = self.net(
                torch.cat([x_in, x_in]), torch.cat([timestep, timestep]), cat_cond(cond, uncond)
            ).chunk(2)
            out = out_u + cfg_scale * (out_c - out_u)
        return self.to_velocity(x_t, t, out)


class FlowMatchingExpert(Expert):
    """An FM expert predicts the velocity directly; its network sees the time as ``FM_TIME_SCALE·t``."""

    objective = "fm"

    def __init__(self, net: Net, time_sampling: dict | None = None):
        """``time_sampling``: how training draws t, ``{"kind": "uniform"}`` (default) or
        ``{"kind": "logit_normal", "mean": m, "std": s}`` (:func:`~hddm_flower.objectives.logit_normal_time`)."""
        super().__init__(net)
        self.time_sampling = dict(time_sampling or {"kind": "uniform"})
        if self.time_sampling["kind"] not in FM_TIME_SAMPLINGS:
            raise ValueError(f"unknown FM time sampling {self.time_sampling['kind']!r}; expected {FM_TIME_SAMPLINGS}")

    def training_times(self, n: int, generator: torch.Generator | None, like: Tensor) -> Tensor:
        """``n`` training times in (0, 1) from ``generator``, by the expert's time sampling."""
        ts = self.time_sampling
        if ts["kind"] == "logit_normal":
            return logit_normal_time(draw_like(torch.randn, (n,), generator, like), ts["mean"], ts["std"])
        return draw_like(torch.rand, (n,), generator, like)

    def net_inputs(self, x_t, t):
        return x_t, FM_TIME_SCALE * t

    def to_velocity(self, x_t, t, out):
        return out

    def training_loss(self, x0, cond, generator=None):
        t = self.training_times(x0.shape[0], generator, x0)
        eps = draw_like(torch.randn, x0.shape, generator, x0)
        x_t = fm_interpolate(x0, eps, t)
        return fm_loss(self.net(x_t, FM_TIME_SCALE * t, cond), x0, eps)


class DDPMExpert(Expert):
    """A DDPM ε-prediction expert, converted into the FM velocity space at inference without retraining.

    ``conversion="schedule_aware"`` (default): SNR-matched fractional timestep and input rescaling, exact for an
    exact network. ``conversion="naive"``: ``tau = round((T−1)·t)`` on the unscaled ``x_t`` (the paper's variant,
    for ablations). ``t_eps`` and ``x0_clamp`` guard the clean estimate near pure noise.

    ``clean_estimate="shrink"`` or ``"shrink_naive"`` with a measured ``clean_prior``
    (:mod:`hddm_flower.clean_prior`) replaces the clamped estimate by ``mu + lambda(t)·(x0_hat − mu)``
    (:func:`~hddm_flower.objectives.ddpm_eps_to_velocity_shrunk`); without a table the expert keeps ``clamp``
    (counted as ``shrink_missing_rows``).
    """

    objective = "ddpm"
    converted = True

    def __init__(
        self,
        net: Net,
        schedule: str = "cosine",
        num_train_timesteps: int = 1000,
        *,
        conversion: str = "schedule_aware",
        t_eps: float = T_EPS,
        x0_clamp: float = X0_CLAMP,
        clean_estimate: str = "clamp",
        clean_prior: CleanPrior | None = None,
    ):
        super().__init__(net)
        if conversion not in CONVERSIONS:
            raise ValueError(f"unknown conversion {conversion!r}; expected one of {CONVERSIONS}")
        if clean_estimate not in CLEAN_ESTIMATES:
            raise ValueError(f"unknown clean estimate {clean_estimate!r}; expected one of {CLEAN_ESTIMATES}")
        self.schedule, self.conversion = schedule, conversion
        self.t_eps, self.x0_clamp = t_eps, x0_clamp
        self.clean_estimate, self.clean_prior = clean_estimate, clean_prior
        if clean_estimate != "clamp" and clean_prior is not None:
            grid, lam = clean_prior.weights(clean_estimate)
            self.register_buffer("lambda_grid", grid, persistent=False)
            self.register_buffer("lambda_values", lam, persistent=False)
            self.register_buffer("prior_mean", clean_prior.mean, persistent=False)
        self.register_buffer("alpha_bar", ddpm_alpha_bar(schedule, num_train_timesteps), persistent=False)
        # set to {} to count how often the conversion's guards fire (on the device: read with counts.read_counts)
        self.clamp_counts: dict | None = None
        self.counted_rows: Tensor | None = None  # (B,) bool: the rows the counts count (None: all)

    @property
    def num_train_timesteps(self) -> int:
        return len(self.alpha_bar)

    def net_inputs(self, x_t, t):
        if self.conversion == "naive":
            return x_t, naive_timestep(t, self.num_train_timesteps).to(x_t.dtype)
        tau = snr_matched_timestep(t, self.alpha_bar).to(x_t.dtype)
        return x_t * fm_input_scale(t).reshape(-1, *([1] * (x_t.ndim - 1))), tau

    @property
    def shrinks(self) -> bool:
        """Whether the velocity goes through the shrunk clean estimate (a shrink option and a table)."""
        return self.clean_estimate != "clamp" and self.clean_prior is not None

    def shrink_lambda(self, t: Tensor) -> Tensor:
        """lambda(t) (B,) of the configured shrink, float64 (:class:`~hddm_flower.clean_prior.CleanPrior`)."""
        return interpolate_in_t(t, self.lambda_grid, self.lambda_values)

    def to_velocity(self, x_t, t, out):
        if self.shrinks:
            lam = self.shrink_lambda(t)
            if self.clamp_counts is not None:
                self._count_shrink(x_t, t, out, lam)
            return ddpm_eps_to_velocity_shrunk(x_t, t, out, self.prior_mean, lam)
        if self.clamp_counts is not None:
            self._count_clamps(x_t, t, out)
            if self.clean_estimate != "clamp":
                add_count(self.clamp_counts, "shrink_missing_rows", self._rows(t).sum())
        return ddpm_eps_to_velocity(x_t, t, out, t_eps=self.t_eps, x0_clamp=self.x0_clamp)

    def _rows(self, t: Tensor) -> Tensor:
        """The rows the counts count (B,) bool: ``counted_rows`` when set, else all."""
        return self.counted_rows if self.counted_rows is not None else torch.ones_like(t, dtype=torch.bool)

    def _count_shrink(self, x_t: Tensor, t: Tensor, eps_hat: Tensor, lam: Tensor) -> None:
        """Rows through the shrink, the sum of their lambda (mean = sum / rows), and the clamp's counts as they
        would have been (the clamp itself is not applied)."""
        self._count_clamps(x_t, t, eps_hat)
        rows = self._rows(t)
        add_count(self.clamp_counts, "shrink_rows", rows.sum())
        add_count(self.clamp_counts, "shrink_lambda_sum", torch.where(rows, lam, 0).sum())

    def _count_clamps(self, x_t: Tensor, t: Tensor, eps_hat: Tensor) -> None:
        """Rows where ``1 − t < t_eps`` and elements where ``|x̂0| > x0_clamp`` (before clamping), counted on the
        device (read once per sample batch)."""
        tb = t.reshape(-1, *([1] * (x_t.ndim - 1)))
        x0_raw = (x_t - tb * eps_hat) / (1 - tb).clamp(min=self.t_eps)
        rows = self._rows(t)
        for key, value in (
            ("rows", rows.sum()),
            ("t_eps_rows", ((1 - t < self.t_eps) & rows).sum()),
            ("elements", rows.sum() * x0_raw[0].numel()),
            ("x0_clamp_elements", ((x0_raw.abs() > self.x0_clamp).flatten(1).sum(1) * rows).sum()),
        ):
            add_count(self.clamp_counts, key, value)

    def training_loss(self, x0, cond, generator=None):
        device = generator.device if generator is not None else x0.device
        tau = torch.randint(0, self.num_train_timesteps, (x0.shape[0],), generator=generator, device=device).to(
            x0.device
        )
        eps = draw_like(torch.randn, x0.shape, generator, x0)
        z = ddpm_noise(x0, eps, tau, self.alpha_bar.to(x0.dtype))
        return ddpm_loss(self.net(z, tau.to(x0.dtype), cond), eps)
