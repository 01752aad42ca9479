"""A trained router on the ensemble's own sampler trajectories, against the exact posterior of a Gaussian mixture.

While a row samples, every call of its router at ``(x_t, t)`` is compared with the exact posterior at the same
``x_t`` (:class:`~hddm_flower.gmm.exact.ExactRouter`: ``p(k | x_t, t)``, or ``p(k | x_t, t, c)`` for a router that
reads the caption): the states the sampler visits, not the training path's. Per Euler step, over the samples:

* ``kl``: ``KL(exact ‖ router) = Σ_k p_k (log p_k − log q_k)``;
* ``top1``: the fraction whose most probable cluster is the exact one; ``top2``: the fraction whose two most
  probable clusters are the exact two, in any order (always 1 with two clusters);
* ``tv``: ``½ Σ_k |q_k − p_k|``; at t = 1, where x_t is pure noise and the exact posterior is the prior (the
  cluster weights; ``p(k | c)`` for a caption-reading router), it is the router's prior error (``prior_tv``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..models import router_conditioning

ROUTER_METRICS = ("router_kl", "router_top1_agreement", "router_top2_agreement", "router_prior_tv")
"""The per-seed scalars of :meth:`RouterProbe.summary` (means over the Euler steps; the prior's TV at t = 1)."""


def compare(log_q: Tensor, log_p: Tensor) -> dict[str, Tensor]:
    """Per-sample ``kl``, ``top1``, ``top2`` and ``tv`` (B,) of router log-probabilities ``log_q`` against exact
    ``log_p`` (B, K), in float64."""
    log_q, log_p = log_q.double(), log_p.double()
    p, q = log_p.exp(), log_q.exp()
    kl = torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p)).sum(-1)
    k = min(2, log_p.shape[-1])
    top = lambda x: x.topk(k, -1).indices.sort(-1).values  # noqa: E731
    return {
        "kl": kl,
        "top1": (log_q.argmax(-1) == log_p.argmax(-1)).double(),
        "top2": (top(log_q) == top(log_p)).all(-1).double(),
        "tv": 0.5 * (q - p).abs().sum(-1),
    }


class RouterProbe(nn.Module):
    """Passes ``router`` through and accumulates, per time ``t``, its agreement with ``exact`` at every call."""

    def __init__(self, router: nn.Module, exact: nn.Module):
        super().__init__()
        self.inner, self.exact = router, exact
        self.conditioning = router_conditioning(router)
        self.config = router.config
        self.sums: dict[float, dict[str, float]] = {}

    def forward(self, x_t: Tensor, t: Tensor, *caption: Tensor) -> Tensor:
        logits = self.inner(x_t, t, *caption)
        with torch.no_grad():
            log_p = self.exact(x_t.double(), t.double(), *(c.double() for c in caption)).log_softmax(-1)
            per_sample = compare(logits.double().log_softmax(-1), log_p)
            s = self.sums.setdefault(round(float(t.reshape(-1)[0]), 6), dict.fromkeys((*per_sample, "n"), 0.0))
            for name, v in per_sample.items():
                s[name] += float(v.sum())
            s["n"] += len(x_t)
        return logits

    def reset(self) -> None:
        self.sums = {}

    def summary(self) -> tuple[dict[str, float], dict[str, list[float]]] | None:
        """``(scalars, steps)`` of the calls since :meth:`reset`, or None without any (oracle routing): the
        :data:`ROUTER_METRICS` and, per step from t = 1 down, ``times``, ``kl``, ``top1``, ``top2`` and ``tv``."""
        if not self.sums:
            return None
        times = sorted(self.sums, reverse=True)
        steps = {"times": times} | {
            name: [self.sums[t][name] / self.sums[t]["n"] for t in times] for name in ("kl", "top1", "top2", "tv")
        }
        mean = lambda name: sum(steps[name]) / len(times)  # noqa: E731
        scalars = {
            "router_kl": mean("kl"),
            "router_top1_agreement": mean("top1"),
            "router_top2_agreement": mean("top2"),
        }
        if times[0] == 1.0:
            scalars["router_prior_tv"] = steps["tv"][0]
        return scalars, steps
