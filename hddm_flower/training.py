"""Training loops: one expert on its own cluster (its adapter supplies the objective), and the router.

Both loops are plain: AdamW with linear warm-up, gradient clipping, a seeded generator for batches, noise and
times, and a progress log. They return what the checkpoint metadata reports about compute.
"""

from __future__ import annotations

import logging
import resource
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor
from tqdm.auto import tqdm

from .data import Split
from .experts import Expert
from .models import Router, TextCond
from .objectives import fm_interpolate

log = logging.getLogger(__name__)


@dataclass
class TrainStats:
    steps: int = 0
    images_seen: int = 0
    device_seconds: float = 0.0
    peak_memory_bytes: int = 0
    final_loss: float = float("nan")
    loss_curve: list[tuple[int, float]] = field(default_factory=list)


def peak_memory_bytes(device: torch.device) -> int:
    """Peak accelerator memory on CUDA; on CPU the process's peak resident set size."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _drop_captions(cond: TextCond, uncond: TextCond, p: float, generator: torch.Generator) -> TextCond:
    """Replace each row's caption by the empty caption with probability p (classifier-free guidance training)."""
    drop = torch.rand(len(cond.mask), generator=generator) < p
    if not drop.any():
        return cond
    drop = drop.to(cond.mask.device)
    keep = ~drop[:, None]
    return TextCond(torch.where(keep[..., None], cond.states, uncond.states.expand_as(cond.states)),
                    torch.where(keep, cond.mask, uncond.mask.expand_as(cond.mask)))


def fit(params, loss_fn: Callable[[torch.Generator], Tensor], *, steps: int, lr: float, weight_decay: float = 0.0,
        warmup_steps: int = 0, grad_clip: float | None = 1.0, seed: int = 0, log_every: int = 100,
        name: str = "train", progress: bool = False) -> TrainStats:
    """The one optimisation loop: AdamW with linear warm-up and gradient clipping over ``loss_fn(generator)``."""
    params = list(params)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, warmup_steps)))
    g = torch.Generator().manual_seed(seed)
    stats, ema, start = TrainStats(), None, time.perf_counter()
    for step in tqdm(range(steps), desc=name, disable=not progress, mininterval=1.0):
        loss = loss_fn(g)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip:
            torch.nn.utils.clip_grad_norm_(params, grad_clip)
        opt.step()
        sched.step()
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        if (step + 1) % log_every == 0 or step + 1 == steps:
            stats.loss_curve.append((step + 1, ema))
            log.info("%s step %d/%d loss %.4f (%.1f s)", name, step + 1, steps, ema, time.perf_counter() - start)
    stats.steps, stats.device_seconds, stats.final_loss = steps, time.perf_counter() - start, float(ema)
    return stats


def train_expert(expert: Expert, data: Split, uncond: TextCond, *, steps: int, batch_size: int, lr: float,
                 weight_decay: float = 0.0, warmup_steps: int = 0, grad_clip: float = 1.0,
                 caption_dropout: float = 0.1, seed: int = 0, log_every: int = 100, name: str = "expert",
                 device: torch.device | str = "cpu", progress: bool = False) -> TrainStats:
    """Train ``expert`` in isolation on ``data`` with its own objective (``expert.training_loss``)."""
    device = torch.device(device)
    expert.to(device).train()
    uncond = TextCond(uncond.states.to(device), uncond.mask.to(device))

    def loss_fn(g: torch.Generator) -> Tensor:
        idx = torch.randint(0, len(data), (batch_size,), generator=g)
        x0, cond = data.batch(idx)
        cond = TextCond(cond.states.to(device), cond.mask.to(device))
        return expert.training_loss(x0.to(device), _drop_captions(cond, uncond, caption_dropout, g), generator=g)

    stats = fit(expert.parameters(), loss_fn, steps=steps, lr=lr, weight_decay=weight_decay,
                warmup_steps=warmup_steps, grad_clip=grad_clip, seed=seed, log_every=log_every, name=name,
                progress=progress)
    stats.images_seen, stats.peak_memory_bytes = steps * batch_size, peak_memory_bytes(device)
    expert.eval()
    return stats


def router_loss(router: Router, x0: Tensor, labels: Tensor, generator: torch.Generator) -> Tensor:
    """Cross-entropy of the cluster label from ``(x_t, t)``, with x_t on the FM path and t ~ U(0, 1)."""
    t = torch.rand(len(x0), generator=generator)
    x_t = fm_interpolate(x0, torch.randn(x0.shape, generator=generator), t)
    return torch.nn.functional.cross_entropy(router(x_t, t), labels)


def train_router(router: Router, data: Split, *, steps: int, batch_size: int, lr: float, seed: int = 0,
                 log_every: int = 100, progress: bool = False) -> TrainStats:
    """Train the router on the coordinator's copy of the data (all clusters, labels = cluster ids)."""
    router.train()

    def loss_fn(g: torch.Generator) -> Tensor:
        idx = torch.randint(0, len(data), (batch_size,), generator=g)
        return router_loss(router, data.images[idx], data.labels[idx], g)

    stats = fit(router.parameters(), loss_fn, steps=steps, lr=lr, warmup_steps=min(50, steps // 10), seed=seed,
                log_every=log_every, name="router", progress=progress)
    stats.images_seen = steps * batch_size
    router.eval()
    return stats
