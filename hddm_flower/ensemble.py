"""The heterogeneous ensemble and the FM Euler sampler.

``v(x_t, t) = Σ_k w_k(x_t, t)·v_k(x_t, t)``: the router estimates the posterior ``p(k | x_t, t)`` that ``x_t``
came from cluster k; the routing mode turns it into mixing weights; every expert contributes its (guided)
FM velocity through the same interface (:mod:`hddm_flower.experts`), whatever its training objective.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from .experts import map_cond

ROUTING_MODES = ("top_k", "full", "threshold", "sample", "oracle")


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
        # draw where the generator lives (a seeded CPU generator drives sampling on any device)
        on = probs if generator is None or generator.device == probs.device else probs.to(generator.device)
        pick = torch.multinomial(on, 1, generator=generator).to(probs.device)
        return torch.zeros_like(probs).scatter(-1, pick, 1.0)
    elif mode == "oracle":
        if labels is None:
            raise ValueError("routing mode 'oracle' needs the true cluster labels")
        return torch.nn.functional.one_hot(labels.long(), probs.shape[-1]).to(probs.dtype)
    else:
        raise ValueError(f"unknown routing mode {mode!r}; expected one of {ROUTING_MODES}")
    return w / w.sum(-1, keepdim=True)


class Ensemble(nn.Module):
    """Experts (any objective) plus a router, exposing the same ``velocity`` face as a single expert.

    ``experts`` maps an expert id in ``0 … num_experts − 1`` to an adapter; ids without an expert (lost in the
    federation) are masked out of the router's posterior, which is renormalised over the experts present.
    ``router(x_t, t) → logits (B, num_experts)``.
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
        present = torch.zeros(num_experts, dtype=torch.bool)
        present[list(experts)] = True
        self.register_buffer("present", present, persistent=False)

    def posterior(self, x_t: Tensor, t: Tensor) -> Tensor:
        """Router posterior ``p(k | x_t, t)`` over the experts present (B, K)."""
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
        # route
        w = routing_weights(
            self.posterior(x_t, t),
            routing or self.routing,
            k=self.k,
            threshold=self.threshold,
            labels=labels,
            generator=generator,
        ).to(x_t.dtype)
        # per-expert (guided) velocity, evaluated only on the rows routed to it; then combine
        v = torch.zeros_like(x_t)
        for key, expert in self.experts.items():
            rows = (w[:, int(key)] > 0).nonzero().squeeze(1)
            if rows.numel() == 0:
                continue
            v_k = expert.velocity(
                x_t[rows], t[rows], map_cond(lambda c: c[rows], cond), map_cond(lambda c: c[rows], uncond), cfg_scale
            )
            v[rows] += w[rows, int(key)].reshape(-1, *([1] * (x_t.ndim - 1))) * v_k
        return v


def euler_sample(velocity: Callable[[Tensor, Tensor], Tensor], x1: Tensor, num_steps: int) -> Tensor:
    """Integrate ``dx/dt = velocity(x, t)`` from t = 1 (noise ``x1``) to t = 0 with ``num_steps`` Euler steps."""
    ts = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64)  # time grid in float64
    x = x1
    for t, t_next in zip(ts[:-1], ts[1:]):
        t_b = torch.full((x.shape[0],), float(t), dtype=x.dtype, device=x.device)
        x = x + float(t_next - t) * velocity(x, t_b)  # Euler step
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
) -> Tensor:
    """Sample from the ensemble: FM Euler from ``noise`` (t = 1) to data (t = 0), CFG per expert."""
    return euler_sample(
        lambda x, t: ensemble.velocity(x, t, cond, uncond, cfg_scale, labels=labels, generator=generator),
        noise,
        num_steps,
    )
