"""Held-out diagnostics of an assembled ensemble in velocity space: router accuracy, expert, ensemble and oracle
velocity errors over a grid of t (no feature network involved)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..data import Split
from ..ensemble import Ensemble
from ..experts import map_cond
from ..objectives import fm_interpolate


@torch.no_grad()
def evaluate(
    ensemble: Ensemble, data: Split, *, seed: int = 0, times: tuple[float, ...] = (0.1, 0.3, 0.5, 0.7, 0.9)
) -> dict[str, Any]:
    """Held-out diagnostics in velocity space (no feature network involved).

    * ``router_top1_accuracy`` / ``router_top2_accuracy`` per t: the router's cluster prediction from ``(x_t, t)``.
    * ``expert_velocity_mse``: each expert on its own cluster's held-out images, ``‖v̂ − (eps − x0)‖²``.
    * ``ensemble_velocity_mse``: the ensemble with its routing mode on all held-out images, and
      ``oracle_velocity_mse``: oracle routing (the true cluster's expert) on the images whose expert is present;
      with every expert present the gap is what routing errors cost.
    """
    g = torch.Generator().manual_seed(seed)
    dev = ensemble.device
    images, labels, cond = data.images.to(dev), data.labels.to(dev), map_cond(lambda c: c.to(dev), data.cond)
    out: dict[str, Any] = {
        "times": list(times),
        "num_images": len(data),
        "router_top1_accuracy": [],
        "router_top2_accuracy": [],
        "ensemble_velocity_mse": [],
        "oracle_velocity_mse": [],
    }
    present = [int(k) for k in ensemble.experts]
    per_expert = {k: [] for k in present}
    for t in times:
        eps = torch.randn(data.images.shape, generator=g).to(dev)
        x_t = fm_interpolate(images, eps, torch.tensor(t, device=dev))
        target = eps - images
        tt = torch.full((len(data),), t, device=dev)
        probs = ensemble.posterior(x_t, tt)
        top2 = probs.topk(2, -1).indices
        out["router_top1_accuracy"].append((top2[:, 0] == labels).float().mean().item())
        out["router_top2_accuracy"].append((top2 == labels[:, None]).any(-1).float().mean().item())
        v = ensemble.velocity(x_t, tt, cond)
        out["ensemble_velocity_mse"].append(((v - target) ** 2).mean().item())
        mine = torch.isin(labels, torch.tensor(present, device=dev))
        v_oracle = ensemble.velocity(
            x_t[mine], tt[mine], map_cond(lambda c: c[mine], cond), routing="oracle", labels=labels[mine]
        )
        out["oracle_velocity_mse"].append(((v_oracle - target[mine]) ** 2).mean().item())
        for k in present:
            rows = labels == k
            if rows.any():
                v_k = ensemble.experts[str(k)].velocity(x_t[rows], tt[rows], map_cond(lambda c: c[rows], cond))
                per_expert[k].append(((v_k - target[rows]) ** 2).mean().item())
    out["expert_velocity_mse"] = {str(k): float(np.mean(v)) if v else None for k, v in per_expert.items()}
    return out


SKIPPED = "skipped: the coordinator holds no held-out image (institution-owned data)"


def skipped_diagnostics(cfg, heldout: dict | None) -> dict[str, Any]:
    """The diagnostics block of a coordinator without data: router accuracy from the federated held-out counts
    (``heldout``: the federated router's record, summed confusion counts of the nodes' validation splits); the
    velocity errors need held-out images and are listed as skipped (None)."""
    times = list(cfg.evaluation.times)
    none = [None] * len(times)
    heldout = heldout or {}
    return {
        "times": times,
        "num_images": heldout.get("num_images", 0),
        "router_top1_accuracy": heldout.get("top1", none),
        "router_top2_accuracy": heldout.get("top2", none),
        "router_accuracy_source": "federated: confusion counts of the nodes' validation splits, summed",
        "ensemble_velocity_mse": none,
        "oracle_velocity_mse": none,
        "expert_velocity_mse": {},
        "skipped": {"velocity diagnostics": SKIPPED},
    }
