"""Training loops: one expert on its own cluster (its adapter supplies the objective), and the router.

Both run the same loop (:func:`fit`): AdamW (the fused kernel) with linear warm-up, gradient clipping, gradient
accumulation, optional bf16 autocast and weight EMA, a seeded generator for batches, noise and times, a progress
log, and periodic local checkpoints that a restarted training resumes from exactly. They return what the
checkpoint metadata reports about compute.
"""

from __future__ import annotations

import logging
import math
import resource
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from tqdm.auto import tqdm

from .choices import OPTIMIZERS, PRECISIONS
from .config.sections import ExpertConfig, OptimConfig, RouterConfig
from .data import Split
from .experts import Expert, draw_like
from .models import Router, TextCond
from .objectives import fm_interpolate
from .safeio import atomic_path

if TYPE_CHECKING:
    from diffusers.training_utils import EMAModel

log = logging.getLogger(__name__)


@dataclass
class TrainStats:
    steps: int = 0
    images_seen: int = 0
    device_seconds: float = 0.0
    peak_memory_bytes: int = 0
    final_loss: float = float("nan")
    ema: bool = False
    resumed_steps: int = 0  # steps restored from a local checkpoint instead of trained in this call
    loss_curve: list[tuple[int, float]] = field(default_factory=list)


def peak_memory_bytes(device: torch.device) -> int:
    """Peak accelerator memory on CUDA; on CPU the process's peak resident set size."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def drop_captions(cond: TextCond, uncond: TextCond, p: float, generator: torch.Generator) -> TextCond:
    """Replace each row's caption by the empty caption with probability p (classifier-free guidance training)."""
    drop = torch.rand(len(cond.mask), generator=generator) < p
    if not drop.any():
        return cond
    drop = drop.to(cond.mask.device)
    keep = ~drop[:, None]
    return TextCond(
        torch.where(keep[..., None], cond.states, uncond.states.expand_as(cond.states)),
        torch.where(keep, cond.mask, uncond.mask.expand_as(cond.mask)),
    )


def make_optimizer(params, lr: float, weight_decay: float, impl: str, device: torch.device) -> torch.optim.AdamW:
    """AdamW; ``auto`` picks the fused kernel where torch has one (CPU, CUDA, MPS, XPU; on CPU it is 3–4× faster
    than foreach for the tiny expert, docs/performance.md) and the foreach one elsewhere."""
    if impl not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer implementation {impl!r}; expected one of {OPTIMIZERS}")
    if impl == "auto":
        impl = "fused" if device.type in ("cpu", "cuda", "mps", "xpu") else "foreach"
    kw = {"fused": True} if impl == "fused" else {"foreach": True} if impl == "foreach" else {"foreach": False}
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, **kw)


def lr_factor(step: int, optim: OptimConfig, steps: int) -> float:
    """The learning rate of 0-based optimiser step ``step`` as a fraction of ``optim.lr``: linear warm-up
    (step + 1) / warmup_steps over the first ``warmup_steps`` steps, then 1 (``schedule: constant``), or a cosine
    from 1 at the end of the warm-up towards ``min_lr_ratio`` at step ``steps`` (``schedule: cosine``)."""
    warmup = optim.warmup_steps
    if step < warmup:
        return (step + 1) / warmup
    if optim.schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return optim.min_lr_ratio + (1 - optim.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def fit(
    model: torch.nn.Module,
    loss_fn: Callable[[torch.Generator], Tensor],
    optim: OptimConfig,
    *,
    steps: int,
    seed: int = 0,
    accumulation: int = 1,
    ema_decay: float = 0.0,
    mixed_precision: str = "no",
    checkpoint: str | Path | None = None,
    checkpoint_every: int = 0,
    log_every: int = 100,
    name: str = "train",
    progress: bool = False,
    on_start: Callable[[int], None] | None = None,
) -> tuple[TrainStats, EMAModel | None]:
    """The one optimisation loop over ``loss_fn(generator)`` (one micro-batch per call).

    ``optim``: AdamW with linear warm-up and gradient clipping; ``accumulation`` micro-batches per step, optional bf16 autocast
    and an EMA of the weights (returned; the caller decides what to export). With ``checkpoint`` set, the full
    training state (weights, optimiser, schedule, EMA, random generator, step) is saved every
    ``checkpoint_every`` steps, and a later call with the same path resumes exactly where it stopped.
    ``on_start(step)`` is called once before the first step with the step training starts from (0, or the step a
    checkpoint restored): a streamed data source starts its stream there.
    """
    if mixed_precision not in PRECISIONS:
        raise ValueError(f"unknown mixed precision {mixed_precision!r}; expected one of {PRECISIONS}")
    params = [p for p in model.parameters() if p.requires_grad]
    device = params[0].device
    opt = make_optimizer(params, optim.lr, optim.weight_decay, optim.implementation, device)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, optim, steps))
    g = torch.Generator().manual_seed(seed)
    if ema_decay:
        from diffusers.training_utils import EMAModel  # heavy import: only when EMA is on

        ema = EMAModel(params, decay=ema_decay)
    else:
        ema = None
    stats, loss_ema, first, elapsed = TrainStats(), None, 0, 0.0
    checkpoint = Path(checkpoint) if checkpoint else None
    if checkpoint is not None and checkpoint.exists():
        state = torch.load(checkpoint, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        if ema is not None:
            ema.load_state_dict(state["ema"])
        g.set_state(state["generator"].cpu())
        first, loss_ema, elapsed = int(state["step"]), torch.tensor(float(state["loss_ema"])), float(state["elapsed"])
        stats.loss_curve = [tuple(x) for x in state["loss_curve"]]
        stats.resumed_steps = first
        log.info("%s resumed from %s at step %d", name, checkpoint, first)
    if on_start is not None:
        on_start(first)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=mixed_precision == "bf16")
    start = time.perf_counter() - elapsed
    for step in tqdm(range(first, steps), desc=name, disable=not progress, mininterval=1.0, initial=first, total=steps):
        opt.zero_grad(set_to_none=True)
        total = torch.zeros((), device=device)  # the loss stays on the device: no host sync per step
        for _ in range(accumulation):
            with autocast:
                loss = loss_fn(g) / accumulation
            loss.backward()
            total += loss.detach().float()
        if optim.grad_clip:
            torch.nn.utils.clip_grad_norm_(params, optim.grad_clip)
        opt.step()
        sched.step()
        if ema is not None:
            ema.step(params)
        loss_ema = total if loss_ema is None else 0.98 * loss_ema.to(device) + 0.02 * total
        if (step + 1) % log_every == 0 or step + 1 == steps:
            stats.loss_curve.append((step + 1, loss_ema.item()))
            log.info(
                "%s step %d/%d loss %.4f (%.1f s)",
                name,
                step + 1,
                steps,
                stats.loss_curve[-1][1],
                time.perf_counter() - start,
            )
        if checkpoint is not None and checkpoint_every and (step + 1) % checkpoint_every == 0 and step + 1 < steps:
            _save_training_state(
                checkpoint,
                model,
                opt,
                sched,
                ema,
                g,
                step + 1,
                loss_ema.item(),
                time.perf_counter() - start,
                stats.loss_curve,
            )
    stats.final_loss = float("nan") if loss_ema is None else loss_ema.item()  # (waits for the device)
    stats.steps, stats.device_seconds = steps, time.perf_counter() - start
    return stats, ema


def _save_training_state(path: Path, model, opt, sched, ema, g, step, loss_ema, elapsed, curve) -> None:
    """Write the training state atomically (a local file of this node, read back with weights_only=True)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "generator": g.get_state(),
        "step": step,
        "loss_ema": loss_ema,
        "elapsed": elapsed,
        "loss_curve": [list(x) for x in curve],
    }
    if ema is not None:
        state["ema"] = ema.state_dict()
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def train_expert(
    expert: Expert,
    data: Split,
    uncond: TextCond,
    options: ExpertConfig,
    *,
    seed: int | None = None,
    checkpoint: str | Path | None = None,
    name: str = "expert",
    device: torch.device | str = "cpu",
    progress: bool = False,
) -> TrainStats:
    """Train ``expert`` in isolation on ``data`` with its own objective (``expert.training_loss``), as the
    ``expert`` config section says (steps, batch size, optimiser, accumulation, EMA, precision, checkpointing).

    ``seed`` (default ``options.seed``) seeds batches, noise and times; ``checkpoint`` is the local training-state
    file saved every ``options.checkpoint_every`` steps and resumed from; a streamed ``data`` (with ``resume_at``,
    e.g. :class:`~hddm_flower.data.StreamingSplit`) is told the step training starts from. With
    ``options.ema_decay`` > 0 the expert ends holding the EMA weights (``stats.ema`` says so).
    """
    o = options
    batch_size, caption_dropout, gradient_checkpointing = o.batch_size, o.caption_dropout, o.gradient_checkpointing
    device = torch.device(device)
    expert.to(device).train()
    transformer = getattr(expert.net, "transformer", None)
    if gradient_checkpointing and transformer is not None:
        transformer.enable_gradient_checkpointing()
    uncond = TextCond(uncond.states.to(device), uncond.mask.to(device))

    def loss_fn(g: torch.Generator) -> Tensor:
        idx = torch.randint(0, len(data), (batch_size,), generator=g)
        x0, cond = data.batch(idx)
        cond = TextCond(cond.states.to(device), cond.mask.to(device))
        return expert.training_loss(x0.to(device), drop_captions(cond, uncond, caption_dropout, g), generator=g)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    stats, ema = fit(
        expert,
        loss_fn,
        o.optim,
        steps=o.steps,
        seed=o.seed if seed is None else seed,
        accumulation=o.grad_accumulation,
        ema_decay=o.ema_decay,
        mixed_precision=o.mixed_precision,
        checkpoint=checkpoint,
        checkpoint_every=o.checkpoint_every,
        log_every=o.log_every,
        name=name,
        progress=progress,
        on_start=getattr(data, "resume_at", None),  # a stream starts where the training starts
    )
    if ema is not None:
        ema.copy_to([p for p in expert.parameters() if p.requires_grad])
        stats.ema = True
    if gradient_checkpointing and transformer is not None:
        transformer.disable_gradient_checkpointing()
    stats.images_seen = o.steps * o.batch_size * o.grad_accumulation
    stats.peak_memory_bytes = peak_memory_bytes(device)
    expert.eval()
    return stats


def drop_pooled_captions(caption: Tensor, uncond: Tensor, p: float, generator: torch.Generator) -> Tensor:
    """Replace each row's pooled caption embedding (B, dim) by the empty caption's (1, dim) with probability p
    (drawn from ``generator`` wherever it lives), so that a router that reads the caption also routes the empty
    caption (an unconditional sample)."""
    drop = draw_like(torch.rand, (len(caption),), generator, caption) < p
    return torch.where(drop[:, None], uncond.to(caption).expand_as(caption), caption)


def router_loss(
    router: Router, x0: Tensor, labels: Tensor, generator: torch.Generator, caption: Tensor | None = None
) -> Tensor:
    """Cross-entropy of the cluster label from ``(x_t, t)`` (and the pooled ``caption`` (B, dim) for a router that
    reads it), with x_t on the FM path and t ~ U(0, 1) (drawn from ``generator`` wherever it lives, used on
    ``x0``'s device)."""
    t = draw_like(torch.rand, (len(x0),), generator, x0)
    x_t = fm_interpolate(x0, draw_like(torch.randn, x0.shape, generator, x0), t)
    logits = router(x_t, t) if caption is None else router(x_t, t, caption)
    return torch.nn.functional.cross_entropy(logits.float(), labels)


def train_router(
    router: Router,
    batches: Iterator[tuple[Tensor, ...]],
    options: RouterConfig,
    *,
    steps: int | None = None,
    uncond_caption: Tensor | None = None,
    device: torch.device | str = "cpu",
    mixed_precision: str = "no",
    progress: bool = False,
) -> TrainStats:
    """Train the router on ``(x0, cluster label)`` batches (:meth:`hddm_flower.data.Dataset.images`: all
    clusters, images or latents only; for a router that reads the caption, ``(x0, label, pooled caption)`` batches
    and ``uncond_caption``, the empty caption's pooled embedding (1, dim), which replaces a caption with probability
    ``options.caption_dropout``) as the ``router`` config section says, for ``steps`` (default
    ``options.steps``) on ``device``, optionally under bf16 autocast. Batches move to the device without a host
    sync; the loss stays there between log lines."""
    device = torch.device(device)
    router.to(device).train()
    steps = options.steps if steps is None else steps
    reads_caption = router.conditioning == "text"
    if reads_caption and uncond_caption is None:
        raise ValueError("a router that reads the caption needs the empty caption's pooled embedding for dropout")
    if reads_caption:
        uncond_caption = uncond_caption.to(device)

    def loss_fn(g: torch.Generator) -> Tensor:
        x0, labels, *caption = next(batches)
        if reads_caption != bool(caption):
            raise ValueError(
                f"router conditioning {router.conditioning!r} but the batches "
                f"{'carry' if caption else 'carry no'} pooled captions"
            )
        x0, labels = x0.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        if not reads_caption:
            return router_loss(router, x0, labels, g)
        c = drop_pooled_captions(caption[0].to(device, non_blocking=True), uncond_caption, options.caption_dropout, g)
        return router_loss(router, x0, labels, g, c)

    stats, _ = fit(
        router,
        loss_fn,
        options.optim,
        steps=steps,
        seed=options.seed,
        mixed_precision=mixed_precision,
        log_every=options.log_every,
        name="router",
        progress=progress,
    )
    stats.images_seen = steps * options.batch_size
    stats.peak_memory_bytes = peak_memory_bytes(device)
    router.eval()
    return stats
