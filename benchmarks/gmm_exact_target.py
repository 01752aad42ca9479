"""A capacity probe for the Gaussian mixture: a network trained on the exact velocity instead of the data.

The FM loss regresses ``ε − x_0``, whose variance given ``x_t`` is the Bayes loss (about one per dimension at low
noise), on a finite training split, so a network's excess loss over Bayes falls only as fast as it averages that
noise out, and can fit the split's draws rather than the density: a gap between two networks at a finite budget
can be either of these. Here the target is the exact velocity ``v*(x_t, t, c)`` of the mixture, in closed form,
on fresh draws of the mixture at every step: the loss *is* the excess loss (per dimension, on the training
distribution; each batch's draws still vary, its target no longer does), and no draw is seen twice. An expert is
probed on its cluster's components, the monolith on all of them, each with its captions and, at the config's
``expert.caption_dropout``, the empty caption (as the reference stores it, float16-rounded, within 1e-3 of the
dataset's; its target is then the velocity of all the network's components), at the batch and steps of
``reproduce.budget``, with the experts' weight initialisation and optimiser (:func:`hddm_flower.training.fit`:
AdamW, warm-up, schedule, clipping); EMA, gradient accumulation and mixed precision are refused, resuming is not
offered. What ``benchmarks.gmm_capacity_pilot --target exact`` trains instead of the data's networks.
"""

from __future__ import annotations

import torch
from torch import Tensor

from benchmarks.ddpm_profile import caption_cond, draw_x0
from hddm_flower.budget import budget_of
from hddm_flower.experts import Expert
from hddm_flower.gmm.dataset import GMMReference, load_reference
from hddm_flower.gmm.exact import CaptionIndex
from hddm_flower.models import TextCond
from hddm_flower.reproduce.training import monolith_section
from hddm_flower.stages.expert import build_expert
from hddm_flower.text import pooled_caption
from hddm_flower.training import drop_captions, fit


class ExactTarget:
    """``v*(x_t, t, c)`` of the mixture restricted to the components ``members`` (an expert: its cluster's; the
    monolith: all), given the caption: the members whose caption it is, or every member for the empty caption (or
    a caption no member has). On one cluster's members it is :class:`~hddm_flower.gmm.exact.ExactNet`'s velocity."""

    def __init__(self, ref: GMMReference, members: Tensor):
        self.ref = ref
        self.members = torch.sort(torch.as_tensor(members, dtype=torch.long)).values
        self.mixture = ref.mixture.subset(self.members)
        self.captions = CaptionIndex(ref)

    @torch.no_grad()
    def __call__(self, x_t: Tensor, t: Tensor, cond: TextCond) -> Tensor:
        mask = self.captions.compatible(pooled_caption(cond.states.float(), cond.mask.float()))[:, self.members]
        mask = mask | ~mask.any(-1, keepdim=True)
        flat, t = x_t.reshape(x_t.shape[0], -1).double(), t.double()
        # rows grouped by their components (a caption names one): the masked softmax over all members is the
        # softmax over the mask's own, and per-row times make each call's cost (rows × components × d × rank)
        out = torch.empty_like(flat)
        patterns, which = torch.unique(mask, dim=0, return_inverse=True)
        for i, pattern in enumerate(patterns):
            rows = which == i
            out[rows] = self.mixture.subset(pattern.nonzero().squeeze(1)).fm_velocity(flat[rows], t[rows])
        return out.reshape(x_t.shape)

    def batch(self, expert: Expert, n: int, caption_dropout: float, g: torch.Generator):
        """``n`` fresh draws ``(x_t, t, cond, v*)`` (float32; v* computed in float64): x_0 from the members by their
        weights with its component's caption (the empty caption with probability ``caption_dropout``), t as the
        expert's training draws it, x_t on the FM path."""
        C, S, _ = self.ref.shape
        x0, comps = draw_x0(self.ref, self.members, n, g)
        t = expert.training_times(n, g, x0)
        eps = torch.randn(x0.shape, generator=g, dtype=torch.float64)
        x_t = ((1 - t[:, None]) * x0 + t[:, None] * eps).reshape(n, C, S, S)
        cond = drop_captions(caption_cond(self.ref, comps, n), self.ref.uncond, caption_dropout, g)  # as training does
        return x_t.float(), t.float(), cond, self(x_t, t, cond).float()


def train_on_exact(expert: Expert, target: ExactTarget, options, *, batch: int, steps: int, seed: int, name: str):
    """Train ``expert`` for ``steps`` steps of ``batch`` fresh draws on ``target``'s exact velocity with
    ``options`` (an ``expert`` config section: its optimiser, caption dropout and logging; EMA, accumulation and
    mixed precision are refused, one-line ValueError); returns the
    :class:`~hddm_flower.training.TrainStats` (its ``final_loss``: the smoothed excess loss of the last steps)."""
    unsupported = {
        "ema_decay": options.ema_decay,
        "grad_accumulation": options.grad_accumulation != 1 and options.grad_accumulation,
        "mixed_precision": options.mixed_precision != "no" and options.mixed_precision,
    }
    if bad := [f"expert.{k}={v}" for k, v in unsupported.items() if v]:
        raise ValueError(f"the exact-target probe trains without {', '.join(bad)}: set them to their defaults")
    expert.train()

    def loss_fn(g: torch.Generator) -> Tensor:
        x_t, t, cond, v = target.batch(expert, batch, options.caption_dropout, g)
        return torch.mean((expert.velocity(x_t, t, cond) - v) ** 2)

    stats, _ = fit(expert, loss_fn, options.optim, steps=steps, seed=seed, log_every=options.log_every, name=name)
    expert.eval()
    stats.images_seen = steps * batch
    return stats


def train_network(cfg, dataset, k: int | None) -> tuple[dict, dict, dict]:
    """Expert ``k`` (``None``: the monolith) of a ``data.name: gmm`` ``dataset`` trained on the exact velocity
    (:func:`train_on_exact`), with the weight initialisation, seed, batch and steps ``hddm reproduce`` gives it
    under ``reproduce.budget``; returns what :func:`~hddm_flower.stages.expert.train_one_expert` does (the
    transformer's state dict, its diffusers config and the checkpoint metadata, which says ``target: exact``)."""
    ref = load_reference(dataset)
    b = budget_of(cfg)
    if k is None:
        members, batch, steps, seed = torch.arange(len(ref.cluster_of)), b.monolith_batch, b.monolith_steps, 1000
    else:
        members, batch, steps, seed = (ref.cluster_of == k).nonzero().squeeze(1), b.expert_batch, b.expert_steps, k
    torch.manual_seed(cfg.expert.seed + seed)  # weight init, as train_one_expert and train_monolith seed it
    expert, model_config, meta = build_expert(cfg, dataset.meta, "fm", expert_id=0 if k is None else k)
    name = "monolith [fm, exact target]" if k is None else f"expert {k} [fm, exact target]"
    options = monolith_section(cfg) if k is None else cfg.expert  # the monolith at reproduce.monolith_lr, if set
    stats = train_on_exact(
        expert, ExactTarget(ref, members), options, batch=batch, steps=steps, seed=cfg.expert.seed + seed, name=name
    )
    meta |= {"expert_id": 0 if k is None else k, "cluster_id": "all" if k is None else k, "monolith": k is None}
    meta |= {"target": "exact", "steps": steps, "batch_size": batch, "final_loss": stats.final_loss}
    meta |= {"device_seconds": round(stats.device_seconds, 3), "seed": cfg.expert.seed + seed}
    meta |= {"caption_dropout": cfg.expert.caption_dropout, "members": len(members)}
    meta |= {"loss_curve": stats.loss_curve, "images_seen": stats.images_seen, "lr": options.optim.lr}
    state = {n: v.detach().cpu() for n, v in expert.net.transformer.state_dict().items()}
    return state, model_config, meta
