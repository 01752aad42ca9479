"""The expert (diffusers PixArt-α AdaLN-Single transformer) and the router (a DiT-style classifier with a CLS
token that sees ``(x_t, t)``, and optionally the caption's pooled text embedding), with their size presets.

Presets are data: a name maps to the architecture fields; input shapes (sample size, channels, caption width)
come from the data. Paper-scale presets (XL/2 expert, B/2 router) slot into the same tables.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from diffusers import ConfigMixin, ModelMixin, PixArtTransformer2DModel
from diffusers.configuration_utils import register_to_config
from diffusers.models.embeddings import TimestepEmbedding, Timesteps
from torch import Tensor, nn

from .choices import ROUTER_CONDITIONINGS
from .objectives import FM_TIME_SCALE
from .presets import EXPERT_PRESETS, ROUTER_PRESETS


def _preset(table: dict, name: str, kind: str) -> dict:
    if name not in table:
        raise ValueError(f"unknown {kind} preset {name!r}; expected one of {sorted(table)}")
    return dict(table[name])


class TextCond(NamedTuple):
    """Per-token text states for cross-attention: ``states`` (B, L, C) and ``mask`` (B, L) with 1 = token."""

    states: Tensor
    mask: Tensor


def expert_config(preset: str, *, sample_size: int, in_channels: int, caption_channels: int) -> dict:
    """The diffusers ``PixArtTransformer2DModel`` config of an expert preset at the given input shapes."""
    arch = _preset(EXPERT_PRESETS, preset, "expert")
    width = arch["num_attention_heads"] * arch["attention_head_dim"]
    return dict(
        arch,
        sample_size=sample_size,
        in_channels=in_channels,
        out_channels=in_channels,
        caption_channels=caption_channels,
        cross_attention_dim=width,
        norm_type="ada_norm_single",
        use_additional_conditions=False,
        num_embeds_ada_norm=1000,
    )


class ExpertNet(nn.Module):
    """``net(x, timestep, cond) → output`` over a PixArt transformer (the diffusers model is ``.transformer``)."""

    def __init__(self, transformer: PixArtTransformer2DModel):
        super().__init__()
        self.transformer = transformer

    @classmethod
    def from_config(cls, config: dict) -> ExpertNet:
        return cls(PixArtTransformer2DModel.from_config(config))

    def forward(self, x: Tensor, timestep: Tensor, cond: TextCond) -> Tensor:
        """The output in ``x``'s dtype; the transformer sees ``x`` and the text states in its own weights' dtype
        (a bf16 pipeline samples float32 latents), the timestep as given (its sinusoids are computed in float32)."""
        dtype = self.transformer.dtype
        return self.transformer(
            x.to(dtype),  # (B, C, H, W)
            encoder_hidden_states=cond.states.to(dtype),  # (B, L, caption_channels)
            encoder_attention_mask=cond.mask,  # (B, L)
            timestep=timestep,  # (B,) float: 999·t for FM, (fractional) tau for DDPM
            added_cond_kwargs={"resolution": None, "aspect_ratio": None},
            return_dict=False,
        )[0].to(x.dtype)  # (B, C, H, W)


# ----------------------------------------------------------------------------------------------------------------
# Router


def _modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    return x * (1 + scale[:, None]) + shift[:, None]


class RouterBlock(nn.Module):
    """A DiT block: self-attention and MLP, each under adaLN-Zero modulation by the time embedding."""

    def __init__(self, hidden_size: int, num_heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.attn = nn.MultiheadAttention(hidden_size, num_heads, batch_first=True)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.mlp = nn.Sequential(
            nn.Linear(hidden_size, 4 * hidden_size),
            nn.GELU(approximate="tanh"),
            nn.Linear(4 * hidden_size, hidden_size),
        )
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size))
        nn.init.zeros_(self.adaLN_modulation[1].weight)  # adaLN-Zero: every block starts as the identity
        nn.init.zeros_(self.adaLN_modulation[1].bias)

    def forward(self, x: Tensor, c: Tensor) -> Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = self.adaLN_modulation(c).chunk(6, dim=-1)  # 6 × (B, D)
        h = _modulate(self.norm1(x), shift1, scale1)  # (B, 1 + N, D)
        x = x + gate1[:, None] * self.attn(h, h, h, need_weights=False)[0]
        return x + gate2[:, None] * self.mlp(_modulate(self.norm2(x), shift2, scale2))  # (B, 1 + N, D)


class Router(ModelMixin, ConfigMixin):
    """Estimates ``p(k | x_t, t)`` (``conditioning="none"``, the paper's router) or ``p(k | x_t, t, c)``
    (``"text"``): patchify ``x_t``, prepend a CLS token, DiT blocks under adaLN modulation by the conditioning
    vector, and a linear head on the CLS token.

    The conditioning vector is the time embedding; with ``"text"`` it also adds a projection (an MLP, as PixArt's
    caption projection) of the caption's pooled text embedding (``caption_dim`` numbers,
    :func:`hddm_flower.text.pooled_caption`), the way DiT adds its class embedding. The empty caption is a
    caption like any other: its pooled embedding is what an unconditional sample routes on.

    ``forward(x_t, t, caption=None)`` takes FM time ``t ∈ [0, 1]`` and the pooled embedding (B, caption_dim)
    (required with ``"text"``, refused with ``"none"``); returns logits (B, num_experts). A saved router without
    the ``conditioning`` key (written before it existed) loads as ``"none"``.
    """

    @register_to_config
    def __init__(
        self,
        num_experts: int = 8,
        sample_size: int = 16,
        in_channels: int = 3,
        patch_size: int = 2,
        hidden_size: int = 96,
        depth: int = 3,
        num_heads: int = 4,
        conditioning: str = "none",
        caption_dim: int = 0,
    ):
        super().__init__()
        if conditioning not in ROUTER_CONDITIONINGS:
            raise ValueError(f"unknown router conditioning {conditioning!r}; expected one of {ROUTER_CONDITIONINGS}")
        if (conditioning == "text") != (caption_dim > 0):
            raise ValueError(
                f"router conditioning {conditioning!r} with caption_dim {caption_dim}: 'text' needs the width of the "
                "pooled text embedding (> 0), 'none' takes 0"
            )
        num_patches = (sample_size // patch_size) ** 2
        self.patch_embed = nn.Conv2d(in_channels, hidden_size, patch_size, stride=patch_size)
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + num_patches, hidden_size))
        self.cls_token = nn.Parameter(torch.zeros(1, 1, hidden_size))
        self.time_proj = Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0)
        self.time_embed = TimestepEmbedding(256, hidden_size)
        if conditioning == "text":
            self.caption_embed = nn.Sequential(
                nn.Linear(caption_dim, hidden_size), nn.GELU(approximate="tanh"), nn.Linear(hidden_size, hidden_size)
            )
        self.blocks = nn.ModuleList(RouterBlock(hidden_size, num_heads) for _ in range(depth))
        self.norm = nn.LayerNorm(hidden_size, eps=1e-6)
        self.head = nn.Linear(hidden_size, num_experts)
        nn.init.normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=0.02)

    @property
    def conditioning(self) -> str:
        """``"none"`` (reads ``(x_t, t)``) or ``"text"`` (also the caption's pooled text embedding)."""
        return self.config.conditioning

    def forward(self, x_t: Tensor, t: Tensor, caption: Tensor | None = None) -> Tensor:
        if (caption is not None) != (self.conditioning == "text"):
            raise ValueError(
                "this router reads the caption's pooled embedding: pass caption (B, caption_dim)"
                if caption is None
                else "this router reads no caption (conditioning 'none'); do not pass one"
            )
        t = torch.as_tensor(t, device=x_t.device).expand(x_t.shape[0])
        x_t = x_t.to(self.patch_embed.weight.dtype)  # a bf16 router takes float32 samples
        c = self.time_embed(self.time_proj(FM_TIME_SCALE * t.float()).to(x_t.dtype))  # (B, D)
        if caption is not None:
            c = c + self.caption_embed(caption.to(c.dtype))  # (B, D)
        x = self.patch_embed(x_t).flatten(2).transpose(1, 2)  # (B, N, D)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed  # (B, 1 + N, D)
        for block in self.blocks:
            x = block(x, c)  # (B, 1 + N, D)
        return self.head(self.norm(x[:, 0]))  # (B, K)


def router_conditioning(router) -> str:
    """What a router callable reads: its ``conditioning`` attribute, ``"none"`` for one without (a callable of
    ``(x_t, t)`` only, e.g. the exact text-free router)."""
    return getattr(router, "conditioning", "none")


def router_config(
    preset: str,
    *,
    num_experts: int,
    sample_size: int,
    in_channels: int,
    conditioning: str = "none",
    caption_dim: int = 0,
) -> dict:
    """The :class:`Router` config of a preset; ``caption_dim`` (the text encoder's width) is kept only with
    ``conditioning="text"``."""
    return dict(
        _preset(ROUTER_PRESETS, preset, "router"),
        num_experts=num_experts,
        sample_size=sample_size,
        in_channels=in_channels,
        conditioning=conditioning,
        caption_dim=caption_dim if conditioning == "text" else 0,
    )
