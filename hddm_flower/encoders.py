"""Pretrained encoders loaded from local directories: the latent autoencoder (sd-vae-ft-mse layout).

The text side is :class:`hddm_flower.text.TextEncoder`, which loads any transformers text encoder and its
tokenizer from a folder (MiniLM by default; a CLIP ViT-L/14 text model for the paper's configs); DINOv2 features
are in :mod:`hddm_flower.cluster`. `hddm prepare` stores ``LatentCodec.encode`` latents (posterior mean) and
:meth:`hddm_flower.data.Dataset.decoder` decodes samples with it. Nothing here downloads: a path that does not hold the model is an
error that names it.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import Tensor


class LatentCodec:
    """A diffusers ``AutoencoderKL`` from a local folder (e.g. a copy of stabilityai/sd-vae-ft-mse).

    ``encode`` maps images in [−1, 1] (B, 3, H, W) to scaled latents ``scaling_factor·z`` (the expert's x0);
    ``decode`` maps them back. The scaling factor comes from the folder's config (0.18215 for sd-vae-ft-mse).
    """

    def __init__(self, path: str | os.PathLike, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
        from diffusers import AutoencoderKL

        self.path = Path(path)
        if not (self.path / "config.json").exists():
            raise FileNotFoundError(
                f"VAE directory {self.path} does not hold a diffusers AutoencoderKL (no config.json)"
            )
        self.vae = (
            AutoencoderKL.from_pretrained(self.path, torch_dtype=dtype, low_cpu_mem_usage=False).to(device).eval()
        )
        self.scaling_factor = float(self.vae.config.scaling_factor)
        self.name = f"AutoencoderKL:{self.path.name}"

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.vae.config.block_out_channels) - 1)

    @torch.no_grad()
    def encode(self, images: Tensor, *, sample: bool = True, generator: torch.Generator | None = None) -> Tensor:
        """Images in [−1, 1] → scaled latents; ``sample=False`` takes the posterior mean."""
        dist = self.vae.encode(images.to(self.vae.device, self.vae.dtype)).latent_dist
        z = dist.sample(generator=generator) if sample else dist.mode()
        return z * self.scaling_factor

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        """Scaled latents → images in [−1, 1]."""
        x = self.vae.decode(latents.to(self.vae.device, self.vae.dtype) / self.scaling_factor).sample
        return x.clamp(-1, 1).float()
