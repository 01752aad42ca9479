"""The heterogeneous ensemble and the FM Euler sampler.

``v(x_t, t) = Σ_k w_k(x_t, t)·v_k(x_t, t)``: the router estimates the posterior ``p(k | x_t, t)`` that ``x_t``
came from cluster k (a router with ``conditioning == "text"``: ``p(k | x_t, t, c)``, given the pooled embedding of
the conditional caption); the routing mode turns it into mixing weights; every expert contributes its (guided)
FM velocity through the same interface (:mod:`hddm_flower.experts`), whatever its training objective.

Under CFG the weights are computed once per step, on the conditional caption, and both branches of every expert
use them: guidance stays per expert, ``v = Σ_k w_k(c)·[v_k(∅) + s·(v_k(c) − v_k(∅))]``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from .choices import ROUTING_MODES, VELOCITY_SCALINGS
from .counts import add_count
from .devices import autocast
from .experts import map_cond
from .models import router_conditioning
from .objectives import cap_velocity_rms, velocity_rms, velocity_rms_prior
from .text import pooled_caption

DISPATCHES = ("auto", "dense", "gather")  # how the experts get their rows (Ensemble._dispatch)


def routing_weights(
    probs: Tensor,
    mode: str = "top_k",
    *,
    k: int = 2,
    threshold: float = 0.2,
    labels: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Mixing weights (B, K) from router probabilities (B, K); every row sums to 1.

    * ``top_k``: the k most probable experts, their probabilities renormalised.
    * ``full``: the router's probabilities as they are.
    * ``threshold``: experts with probability ≥ ``threshold`` (always the arg-max), renormalised.
    * ``sample``: one expert drawn from the probabilities.
    * ``oracle``: one-hot on the given ``labels`` (the true cluster), ignoring the router.
    Experts a caller has masked out must have probability 0 and are never selected (oracle aside).
    """
    if mode == "full":
        return probs / probs.sum(-1, keepdim=True)
    if mode == "top_k":
        top = probs.topk(min(k, probs.shape[-1]), dim=-1)
        w = torch.zeros_like(probs).scatter(-1, top.indices, top.values)
    elif mode == "threshold":
        keep = (probs >= threshold) | (probs == probs.amax(-1, keepdim=True))
        w = torch.where(keep, probs, torch.zeros_like(probs))
    elif mode == "sample":
        # inverse CDF of uniforms drawn where the generator lives (a seeded CPU generator drives sampling on any
        # device; nothing is read back): the first expert whose cumulative probability exceeds u·total
        where = generator.device if generator is not None else probs.device
        u = torch.rand(len(probs), 1, generator=generator, device=where, dtype=probs.dtype).to(probs.device)
        cdf = probs.cumsum(-1)
        pick = (cdf <= u * cdf[:, -1:]).sum(-1, keepdim=True).clamp(max=probs.shape[-1] - 1)
        return torch.zeros_like(probs).scatter(-1, pick, 1.0)
    elif mode == "oracle":
        if labels is None:
            raise ValueError("routing mode 'oracle' needs the true cluster labels")
        return torch.nn.functional.one_hot(labels.long(), probs.shape[-1]).to(probs.dtype)
    else:
        raise ValueError(f"unknown routing mode {mode!r}; expected one of {ROUTING_MODES}")
    return w / w.sum(-1, keepdim=True)


@dataclass(frozen=True)
class VelocityScaling:
    """Adaptive velocity scaling of converted (DDPM) velocities at high noise, where their clean estimate is
    poorest. ``mode="fm_rms"``: at ``t > t_min`` each converted velocity's per-sample RMS is capped at the
    mixing-weighted RMS of the FM experts routed to the same sample at the same step; a sample routed to no FM
    expert is capped at ``√(1 + x0_variance)``, the RMS of the true velocity ``ε − x0``. ``mode="off"``: nothing."""

    mode: str = "off"
    t_min: float = 0.85
    x0_variance: float = 1.0

    def __post_init__(self):
        if self.mode not in VELOCITY_SCALINGS:
            raise ValueError(f"unknown velocity scaling {self.mode!r}; expected one of {VELOCITY_SCALINGS}")
        if not 0 <= self.t_min < 1:
            raise ValueError(f"velocity scaling t_min {self.t_min} is not in [0, 1)")
        if self.x0_variance < 0:
            raise ValueError(f"velocity scaling x0_variance {self.x0_variance} is negative")


def hand_over(w: Tensor, converted: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
    """Weights (B, K) with the ``converted`` experts (K,) bool given no weight on ``rows`` (B,) bool, renormalised
    over the others; a row left with no weight keeps its weights (the fallback). Returns the weights and the rows
    that fell back."""
    kept = w.masked_fill(converted, 0)
    total = kept.sum(-1, keepdim=True)
    fallback = rows & (total[:, 0] <= 0)
    handed = rows & ~fallback
    return torch.where(handed[:, None], kept / total.clamp(min=torch.finfo(w.dtype).tiny), w), fallback


class Ensemble(nn.Module):
    """Experts (any objective) plus a router, exposing the same ``velocity`` face as a single expert.

    ``experts`` maps an expert id in ``0 … num_experts − 1`` to an adapter; ids without an expert (lost in the
    federation) are masked out of the router's posterior, which is renormalised over the experts present.
    ``router(x_t, t) → logits (B, num_experts)``; a router whose ``conditioning`` is ``"text"`` is called as
    ``router(x_t, t, caption)`` with the pooled embedding (B, dim) of the conditional caption (see the module
    docstring for CFG). ``velocity_scaling``: see :class:`VelocityScaling` (off by default); when it is on, each converted expert's ``clamp_counts`` (if set) also counts its eligible and scaled
    rows. ``handover_t`` < 1: at t > handover_t the converted (DDPM) experts are masked out of the router's
    posterior before the routing mode picks (so top-k picks among the FM experts), and oracle weights on a converted
    expert move to the FM experts; a row with no FM weight left (no FM expert present, or the router gives the FM
    experts probability 0, or an oracle row) keeps its weights. ``handover_counts`` (set to {} to count) counts the
    rows past ``handover_t``, those handed over and those that fell back. Counts stay on the device
    (:func:`~hddm_flower.counts.read_counts` reads them). ``dispatch``: how each expert gets its rows
    (:meth:`_dispatch`). ``mixed_precision="bf16"``: :func:`sample_ensemble` runs the router and experts under bf16
    autocast (the state ``x`` and the Euler update stay float32).
    """

    def __init__(
        self,
        experts: Mapping[int, nn.Module],
        router: Callable[[Tensor, Tensor], Tensor],
        num_experts: int,
        *,
        routing: str = "top_k",
        k: int = 2,
        threshold: float = 0.2,
        velocity_scaling: VelocityScaling = VelocityScaling(),
        handover_t: float = 1.0,
        mixed_precision: str = "no",
        dispatch: str = "auto",
    ):
        super().__init__()
        if not experts:
            raise ValueError("an ensemble needs at least one expert")
        bad = [i for i in experts if not 0 <= i < num_experts]
        if bad:
            raise ValueError(f"expert ids {bad} outside 0..{num_experts - 1}")
        if routing not in ROUTING_MODES:
            raise ValueError(f"unknown routing mode {routing!r}; expected one of {ROUTING_MODES}")
        self.experts = nn.ModuleDict({str(i): e for i, e in sorted(experts.items())})
        self.router = router
        self.num_experts, self.routing, self.k, self.threshold = num_experts, routing, k, threshold
        self.velocity_scaling, self.mixed_precision = velocity_scaling, mixed_precision
        if not 0 <= handover_t <= 1:
            raise ValueError(f"handover_t {handover_t} is not in [0, 1]")
        self.handover_t = handover_t
        self.handover_counts: dict | None = None  # device counts, read with counts.read_counts
        if dispatch not in DISPATCHES:
            raise ValueError(f"unknown dispatch {dispatch!r}; expected one of {DISPATCHES}")
        self.dispatch = dispatch
        self._has_fm = any(not getattr(e, "converted", False) for e in experts.values())
        present = torch.zeros(num_experts, dtype=torch.bool)
        present[list(experts)] = True
        self.register_buffer("present", present, persistent=False)
        self.register_buffer("present_ids", torch.tensor(sorted(experts)), persistent=False)
        converted = torch.zeros(num_experts, dtype=torch.bool)
        converted[[i for i, e in experts.items() if getattr(e, "converted", False)]] = True
        self.register_buffer("converted", converted, persistent=False)

    @property
    def device(self) -> torch.device:
        return self.present.device

    @property
    def reads_caption(self) -> bool:
        """Whether the router reads the caption (``conditioning == "text"``)."""
        return router_conditioning(self.router) == "text"

    def posterior(self, x_t: Tensor, t: Tensor, cond: Any = None) -> Tensor:
        """Router posterior ``p(k | x_t, t)`` over the experts present (B, K); a router that reads the caption gets
        the pooled embedding of ``cond`` (the conditional caption, :class:`~hddm_flower.models.TextCond`)."""
        if self.reads_caption:
            if cond is None:
                raise ValueError("this ensemble's router reads the caption: pass the conditional caption")
            logits = self.router(x_t, t, pooled_caption(cond.states.float(), cond.mask.float()).to(x_t.dtype))
        else:
            logits = self.router(x_t, t)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        return logits.masked_fill(~self.present, float("-inf")).softmax(-1)

    def velocity(
        self,
        x_t: Tensor,
        t: Tensor,
        cond: Any,
        uncond: Any = None,
        cfg_scale: float = 1.0,
        *,
        routing: str | None = None,
        labels: Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Mixed FM velocity; ``routing`` overrides the ensemble's mode for this call (e.g. "oracle")."""
        t = torch.as_tensor(t, dtype=x_t.dtype, device=x_t.device).expand(x_t.shape[0])
        # route (past handover_t: among the FM experts); one set of weights for both CFG branches, computed on
        # the conditional caption
        probs = self.posterior(x_t, t, cond)
        late = None
        if self.handover_t < 1 and self._has_fm:
            late = t > self.handover_t
            probs, _ = hand_over(probs, self.converted, late)
        routing = routing or self.routing
        w = routing_weights(
            probs,
            routing,
            k=self.k,
            threshold=self.threshold,
            labels=labels,
            generator=generator,
        ).to(x_t.dtype)
        if late is not None:
            w, fallback = hand_over(w, self.converted, late)
            for key, value in (("rows", len(t)), ("late_rows", late.sum()), ("fallback_rows", fallback.sum())):
                add_count(self.handover_counts, key, value)
        # per-expert (guided) velocity on the rows routed to it (all rows for dense dispatch); then combine
        parts = []
        for key, rows in self._dispatch(w, routing):
            expert = self.experts[key]
            if rows is None:  # the expert's counts count only the rows routed to it
                if hasattr(expert, "counted_rows"):
                    expert.counted_rows = w[:, int(key)] > 0
                try:
                    v_k = expert.velocity(x_t, t, cond, uncond, cfg_scale)
                finally:
                    if hasattr(expert, "counted_rows"):
                        expert.counted_rows = None
            else:
                v_k = expert.velocity(
                    x_t[rows], t[rows], map_cond(lambda c: c[rows], cond), map_cond(lambda c: c[rows], uncond),
                    cfg_scale,
                )  # fmt: skip
            parts.append((int(key), expert, rows, v_k))
        if self.velocity_scaling.mode != "off":
            parts = self._scale_converted(parts, w, t)
        v = torch.zeros_like(x_t)
        shape = (-1, *([1] * (x_t.ndim - 1)))
        for k, _, rows, v_k in parts:
            if rows is None:  # a row not routed to k gets exactly nothing from it (even a non-finite v_k)
                v = v + torch.where(w[:, k].reshape(shape) > 0, w[:, k].reshape(shape) * v_k, 0)
            else:
                v[rows] += w[rows, k].reshape(shape) * v_k
        return v

    def _dispatch(self, w: Tensor, routing: str) -> list[tuple[str, Tensor | None]]:
        """(expert key, its rows) for every expert to evaluate. ``dense``: every expert on every row (rows None)
        and nothing read back from the device: the mixing weights zero what was not routed. ``gather``: each
        expert on its routed rows only, gathered from one stable sort of the routing mask; the row counts are
        the one host read per step (a network's batch size must be known to launch it). ``auto``: dense when
        routing leaves every expert on (nearly) every row (``full``; ``top_k`` with k ≥ the experts present), else
        gather."""
        keys = list(self.experts)
        dispatch = self.dispatch
        if dispatch == "auto":
            everyone = routing == "full" or (routing == "top_k" and self.k >= len(keys))
            dispatch = "dense" if everyone else "gather"
        if dispatch == "dense":
            return [(key, None) for key in keys]
        selected = w[:, self.present_ids] > 0  # (B, K present)
        order = torch.sort((~selected).to(torch.uint8), dim=0, stable=True).indices  # routed rows first, in order
        sizes = selected.sum(0).tolist()  # the step's one host read
        return [(key, order[:n, i]) for i, (key, n) in enumerate(zip(keys, sizes)) if n]

    def _scale_converted(self, parts: list, w: Tensor, t: Tensor) -> list:
        """:class:`VelocityScaling` ``fm_rms`` on the converted experts' velocities (counts stay on the device)."""
        vs = self.velocity_scaling
        dtype = torch.promote_types(t.dtype, torch.float32)  # RMS in at least fp32 under bf16 autocast
        num, den = torch.zeros(len(t), dtype=dtype, device=t.device), torch.zeros(len(t), dtype=dtype, device=t.device)
        everything = slice(None)
        for k, expert, rows, v_k in parts:
            if not expert.converted:
                r = everything if rows is None else rows
                w_k = w[r, k].to(dtype)
                if rows is None:
                    w_k = torch.where(w_k > 0, w_k, 0)
                num[r] += w_k * velocity_rms(v_k.to(dtype))
                den[r] += w_k
        prior = torch.full_like(num, velocity_rms_prior(vs.x0_variance))
        reference = torch.where(den > 0, num / den.clamp(min=1e-12), prior)
        out = []
        for k, expert, rows, v_k in parts:
            if expert.converted:
                r = everything if rows is None else rows
                capped, fired = cap_velocity_rms(v_k, reference[r])
                high = t[r] > vs.t_min
                if rows is None:  # count only the rows routed to k
                    high = high & (w[:, k] > 0)
                v_k = torch.where(high.reshape(-1, *([1] * (v_k.ndim - 1))), capped, v_k)
                counts = getattr(expert, "clamp_counts", None)
                for key, value in (
                    ("velocity_scaling_rows", high.sum()),
                    ("velocity_scaled_rows", (high & fired).sum()),
                    ("velocity_scaled_by_prior_rows", (high & fired & (den[r] == 0)).sum()),
                ):
                    add_count(counts, key, value)
            out.append((k, expert, rows, v_k))
        return out


def euler_sample(
    velocity: Callable[[Tensor, Tensor], Tensor],
    x1: Tensor,
    num_steps: int,
    *,
    on_step: Callable[[int, Tensor], None] | None = None,
) -> Tensor:
    """Integrate ``dx/dt = velocity(x, t)`` from t = 1 (noise ``x1``) to t = 0 with ``num_steps`` Euler steps.

    The grid is ``linspace(1, 0, num_steps + 1)`` in float64; ``on_step(i, x)`` is called after step i (e.g. a
    progress bar)."""
    ts = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64)  # time grid in float64
    x = x1
    for i, (t, t_next) in enumerate(zip(ts[:-1], ts[1:])):
        t_b = torch.full((x.shape[0],), float(t), dtype=x.dtype, device=x.device)
        x = x + float(t_next - t) * velocity(x, t_b)  # Euler step
        if on_step is not None:
            on_step(i, x)
    return x


@torch.no_grad()
def sample_ensemble(
    ensemble: Ensemble,
    noise: Tensor,
    cond: Any,
    uncond: Any = None,
    *,
    num_steps: int = 50,
    cfg_scale: float = 1.0,
    labels: Tensor | None = None,
    generator: torch.Generator | None = None,
    on_step: Callable[[int, Tensor], None] | None = None,
) -> Tensor:
    """Sample from the ensemble: FM Euler from ``noise`` (t = 1) to data (t = 0), CFG per expert.

    Runs on the ensemble's device (inputs moved there once; the result returns to ``noise``'s device and dtype),
    under bf16 autocast when the ensemble's ``mixed_precision`` says so."""
    device = ensemble.device
    move = lambda c: c.to(device, non_blocking=True)  # noqa: E731
    cond, uncond = map_cond(move, cond), map_cond(move, uncond)
    labels = None if labels is None else move(labels)
    with autocast(device, ensemble.mixed_precision):
        x = euler_sample(
            lambda x, t: ensemble.velocity(x, t, cond, uncond, cfg_scale, labels=labels, generator=generator),
            move(noise),
            num_steps,
            on_step=on_step,
        )
    return x.to(noise.device, noise.dtype)
