"""Held-out diagnostics of an assembled ensemble in velocity space: router accuracy, expert, ensemble and oracle
velocity errors over a grid of t (no feature network involved), on a bounded, streamed sample of the held-out
split."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ..data import Dataset
from ..ensemble import Ensemble
from ..experts import map_cond
from ..objectives import fm_interpolate

SHUFFLE_BUFFER = 1024  # samples held to draw the seeded subsample from (memory: this many, whatever N)


def heldout_batches(dataset: Dataset, num_images: int, batch_size: int, seed: int) -> Iterable[tuple]:
    """A seeded subsample of at most ``num_images`` held-out (val) samples with their caption states, streamed in
    batches: memory is one batch plus the shuffle buffer, the bytes read about ``num_images`` + the buffer."""

    def limited():
        left = num_images
        for x, y, cond in dataset.images(None, batch_size=batch_size, split="val", seed=seed, shuffle_buffer=SHUFFLE_BUFFER,
            loop=False, text=True,
        ):  # fmt: skip
            if left <= 0:
                return
            n = min(left, len(x))
            left -= n
            yield x[:n], y[:n], map_cond(lambda c: c[:n], cond)

    return limited()


@torch.no_grad()
def evaluate(
    ensemble: Ensemble, batches: Iterable[tuple], *, seed: int = 0, times: tuple[float, ...] = (0.1, 0.3, 0.5, 0.7, 0.9)
) -> dict[str, Any]:
    """Held-out diagnostics in velocity space (no feature network involved), over ``batches`` of
    ``(x0, cluster labels, TextCond)`` (:func:`heldout_batches`), one batch at a time.

    * ``router_top1_accuracy`` / ``router_top2_accuracy`` per t: the router's cluster prediction from ``(x_t, t)`` (and the
      image's own caption, for a router that reads it).
    * ``expert_velocity_mse``: each expert on its own cluster's held-out images, ``‖v̂ − (eps − x0)‖²``.
    * ``ensemble_velocity_mse``: the ensemble with its routing mode on all held-out images, and
      ``oracle_velocity_mse``: oracle routing (the true cluster's expert) on the images whose expert is present;
      with every expert present the gap is what routing errors cost.

    Sums stay on the device and are read once at the end; the noise comes from one seeded CPU generator.
    Memory: one batch, whatever the split's size.
    """
    g = torch.Generator().manual_seed(seed)
    dev = ensemble.device
    present = [int(k) for k in ensemble.experts]
    present_t = torch.tensor(present, device=dev)
    T, K = len(times), len(present)
    zeros = lambda *shape: torch.zeros(*shape, dtype=torch.float64, device=dev)  # noqa: E731
    top1, top2, ens_se, oracle_se, oracle_n = zeros(T), zeros(T), zeros(T), zeros(T), zeros(T)
    expert_se, expert_n = zeros(T, K), zeros(T, K)
    seen, elements = 0, 0
    for x0, labels, cond in batches:
        x0, labels, cond = x0.to(dev), labels.to(dev), map_cond(lambda c: c.to(dev), cond)
        n, per_row = len(x0), x0[0].numel()
        seen, elements = seen + n, elements + n * per_row
        # each expert's rows and the rows with an expert: gathered once per batch (one read for all times)
        mine = torch.isin(labels, present_t).nonzero().squeeze(1)
        rows = {k: (labels == k).nonzero().squeeze(1) for k in present}
        for i, t in enumerate(times):
            eps = torch.randn(x0.shape, generator=g).to(dev)
            x_t = fm_interpolate(x0, eps, torch.tensor(t, device=dev))
            target = eps - x0
            tt = torch.full((n,), t, device=dev)
            best = ensemble.posterior(x_t, tt, cond).topk(min(2, ensemble.num_experts), -1).indices
            top1[i] += (best[:, 0] == labels).sum()
            top2[i] += (best == labels[:, None]).any(-1).sum()
            ens_se[i] += (ensemble.velocity(x_t, tt, cond) - target).double().square().sum()
            if len(mine):
                v_oracle = ensemble.velocity(
                    x_t[mine], tt[mine], map_cond(lambda c: c[mine], cond), routing="oracle", labels=labels[mine]
                )
                oracle_se[i] += (v_oracle - target[mine]).double().square().sum()
                oracle_n[i] += len(mine) * per_row
            for j, k in enumerate(present):
                r = rows[k]
                if len(r):
                    v_k = ensemble.experts[str(k)].velocity(x_t[r], tt[r], map_cond(lambda c: c[r], cond))
                    expert_se[i, j] += (v_k - target[r]).double().square().sum()
                    expert_n[i, j] += len(r) * per_row
    if not seen:
        raise ValueError("velocity diagnostics: no held-out image")
    top1, top2, ens_se, oracle_se, oracle_n, expert_se, expert_n = (
        v.cpu() for v in (top1, top2, ens_se, oracle_se, oracle_n, expert_se, expert_n)
    )  # the one read back
    per_expert = expert_se.sum(0) / expert_n.sum(0)
    return {
        "times": list(times),
        "num_images": seen,
        "heldout_sample": "a seeded subsample of the val split, streamed (evaluation.diagnostic_images at most)",
        "router_top1_accuracy": (top1 / seen).tolist(),
        "router_top2_accuracy": (top2 / seen).tolist(),
        "ensemble_velocity_mse": (ens_se / elements).tolist(),
        "oracle_velocity_mse": [float(s / c) if c else float("nan") for s, c in zip(oracle_se, oracle_n)],
        "expert_velocity_mse": {
            str(k): float(per_expert[j]) if expert_n[:, j].sum() else None for j, k in enumerate(present)
        },
    }


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
