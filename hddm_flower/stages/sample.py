"""Sampling the configured prompts from an assembled ensemble (FM Euler, per-expert CFG)."""

from __future__ import annotations

import torch

from ..ensemble import Ensemble, sample_ensemble
from ..models import TextCond
from ..text import TextEncoder


@torch.no_grad()
def sample_grid(
    ensemble: Ensemble,
    encoder: TextEncoder,
    prompts: list[str],
    uncond: TextCond,
    *,
    samples_per_prompt: int,
    num_steps: int,
    cfg_scale: float,
    seed: int,
) -> torch.Tensor:
    """Samples (P·S, C, H, W) in [−1, 1], prompt-major, from the ensemble with per-expert CFG."""
    cond, _ = encoder.encode(prompts)
    cond = TextCond(
        cond.states.repeat_interleave(samples_per_prompt, 0), cond.mask.repeat_interleave(samples_per_prompt, 0)
    )
    n = len(prompts) * samples_per_prompt
    un = TextCond(uncond.states.expand(n, -1, -1), uncond.mask.expand(n, -1))
    size = ensemble.router.config.sample_size
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(n, ensemble.router.config.in_channels, size, size, generator=g)
    return sample_ensemble(ensemble, noise, cond, un, num_steps=num_steps, cfg_scale=cfg_scale, generator=g)
