"""The original DiT (Peebles & Xie) as a pure function of its state dict, for reading and checking checkpoints.

``dit_forward(state, x, t, y)`` computes what facebookresearch/DiT's ``DiT.forward`` computes, from the keys of
its checkpoints (``x_embedder``, ``t_embedder``, ``y_embedder``, ``pos_embed``, ``blocks.N.*``, ``final_layer``).
The converter uses it to check its own output, the tests use it as the source of truth, and the conversion
benchmark pretrains a tiny DiT in this layout.
"""

from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# The published DiT models (Peebles & Xie, Table 1): (depth, width) → attention heads. An original ``.pt`` stores
# no head count; these are the only ones known without being told.
DIT_PRESET_HEADS = {(28, 1152): 16, (24, 1024): 16, (12, 768): 12, (12, 384): 6}


def dit_depth(state: dict[str, Tensor]) -> int:
    """Number of transformer blocks of an original-format DiT state dict."""
    return 1 + max(int(m.group(1)) for k in state if (m := re.match(r"blocks\.(\d+)\.", k)))


def dit_arch(state: dict[str, Tensor], num_heads: int) -> dict:
    """Architecture of an original-format DiT state dict. The attention heads are not stored in it: the caller
    says how many (a diffusers config, the user, or :data:`DIT_PRESET_HEADS`)."""
    hidden, in_channels, p, _ = state["x_embedder.proj.weight"].shape
    if num_heads < 1 or hidden % num_heads:
        raise ValueError(f"{num_heads} attention heads do not divide the DiT width {hidden}")
    depth = dit_depth(state)
    out = state["final_layer.linear.weight"].shape[0] // (p * p)
    num_patches = state["pos_embed"].shape[1]
    return {
        "hidden_size": hidden,
        "in_channels": in_channels,
        "patch_size": p,
        "depth": depth,
        "num_heads": num_heads,
        "learn_sigma": out == 2 * in_channels,
        "input_size": int(math.isqrt(num_patches)) * p,
        "num_classes": state["y_embedder.embedding_table.weight"].shape[0],
    }


def timestep_frequencies(t: Tensor, dim: int = 256, max_period: float = 10000.0, freq_shift: int = 0) -> Tensor:
    """Sinusoidal timestep features ``[cos, sin]``. DiT uses ``freq_shift = 0`` (as diffusers' PixArt does);
    diffusers' ``DiTTransformer2DModel`` uses 1 (its ``downscale_freq_shift``)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32) / (half - freq_shift))
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def dit_timestep_embedding(state: dict[str, Tensor], t: Tensor, freq_shift: int = 0) -> Tensor:
    """``t_embedder(t)`` (B, D)."""
    h = F.linear(
        timestep_frequencies(t, freq_shift=freq_shift), state["t_embedder.mlp.0.weight"], state["t_embedder.mlp.0.bias"]
    )
    return F.linear(F.silu(h), state["t_embedder.mlp.2.weight"], state["t_embedder.mlp.2.bias"])


def dit_conditioning(state: dict[str, Tensor], t: Tensor, y: Tensor, freq_shift: int = 0) -> Tensor:
    """``c = t_embedder(t) + y_embedder(y)`` (B, D)."""
    return dit_timestep_embedding(state, t, freq_shift) + state["y_embedder.embedding_table.weight"][y]


def dit_modulation(state: dict[str, Tensor], prefix: str, c: Tensor) -> Tensor:
    """``adaLN_modulation(c)`` of a block or of the final layer: (B, 6D) or (B, 2D)."""
    return F.linear(F.silu(c), state[f"{prefix}.adaLN_modulation.1.weight"], state[f"{prefix}.adaLN_modulation.1.bias"])


def dit_patch_embed(state: dict[str, Tensor], x: Tensor) -> Tensor:
    """Patch embedding plus the fixed sin-cos position embedding (B, N, D)."""
    w = state["x_embedder.proj.weight"]
    h = F.conv2d(x, w, state["x_embedder.proj.bias"], stride=w.shape[-1])
    return h.flatten(2).transpose(1, 2) + state["pos_embed"]


def dit_forward(
    state: dict[str, Tensor], x: Tensor, t: Tensor, y: Tensor, num_heads: int, freq_shift: int = 0
) -> Tensor:
    """The DiT forward pass: (B, C, H, W) → (B, out_channels, H, W)."""

    def modulate(h, shift, scale):
        return h * (1 + scale[:, None]) + shift[:, None]

    def ln(h):
        return F.layer_norm(h, h.shape[-1:], eps=1e-6)

    c = dit_conditioning(state, t, y, freq_shift)  # (B, D)
    h = dit_patch_embed(state, x)  # (B, N, D)
    B, N, D = h.shape
    depth = dit_depth(state)
    for i in range(depth):
        pre = f"blocks.{i}"
        shift1, scale1, gate1, shift2, scale2, gate2 = dit_modulation(state, pre, c).chunk(6, dim=-1)
        qkv = F.linear(modulate(ln(h), shift1, scale1), state[f"{pre}.attn.qkv.weight"], state[f"{pre}.attn.qkv.bias"])
        q, k, v = qkv.reshape(B, N, 3, num_heads, D // num_heads).permute(2, 0, 3, 1, 4)  # 3 × (B, H, N, d)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, D)
        h = h + gate1[:, None] * F.linear(a, state[f"{pre}.attn.proj.weight"], state[f"{pre}.attn.proj.bias"])
        m = F.linear(modulate(ln(h), shift2, scale2), state[f"{pre}.mlp.fc1.weight"], state[f"{pre}.mlp.fc1.bias"])
        m = F.linear(F.gelu(m, approximate="tanh"), state[f"{pre}.mlp.fc2.weight"], state[f"{pre}.mlp.fc2.bias"])
        h = h + gate2[:, None] * m
    shift, scale = dit_modulation(state, "final_layer", c).chunk(2, dim=-1)
    h = F.linear(modulate(ln(h), shift, scale), state["final_layer.linear.weight"], state["final_layer.linear.bias"])
    p = state["x_embedder.proj.weight"].shape[-1]
    side = int(math.isqrt(N))
    out = h.reshape(B, side, side, p, p, -1)
    return torch.einsum("nhwpqc->nchpwq", out).reshape(B, -1, side * p, side * p)


def dit_pos_embed(dim: int, grid: int) -> Tensor:
    """DiT's fixed 2-D sin-cos position embedding (N, dim): half the channels encode the column, half the row;
    each half is ``[sin(pos·ω), cos(pos·ω)]`` with ``ω_i = 10000^(−i/(dim/4))``."""
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim / 4))
    rows, cols = torch.meshgrid(
        torch.arange(grid, dtype=torch.float64), torch.arange(grid, dtype=torch.float64), indexing="ij"
    )

    def one_d(pos: Tensor) -> Tensor:
        out = pos.reshape(-1, 1) * omega[None]
        return torch.cat([torch.sin(out), torch.cos(out)], dim=1)

    return torch.cat([one_d(cols), one_d(rows)], dim=1).float()


def init_dit_state(
    *,
    input_size: int,
    in_channels: int,
    patch_size: int,
    hidden_size: int,
    depth: int,
    num_classes: int = 1000,
    learn_sigma: bool = True,
    generator: torch.Generator | None = None,
    std: float = 0.02,
) -> dict[str, Tensor]:
    """A random original-format DiT state dict (every tensor non-zero, so conversions are tested for real)."""
    D, p, C = hidden_size, patch_size, in_channels
    out = 2 * C if learn_sigma else C

    def r(*shape):
        return torch.randn(*shape, generator=generator) * std

    pos = dit_pos_embed(D, input_size // p)[None]
    s = {
        "x_embedder.proj.weight": r(D, C, p, p),
        "x_embedder.proj.bias": r(D),
        "pos_embed": pos,
        "t_embedder.mlp.0.weight": r(D, 256),
        "t_embedder.mlp.0.bias": r(D),
        "t_embedder.mlp.2.weight": r(D, D),
        "t_embedder.mlp.2.bias": r(D),
        "y_embedder.embedding_table.weight": r(num_classes + 1, D),
        "final_layer.linear.weight": r(p * p * out, D),
        "final_layer.linear.bias": r(p * p * out),
        "final_layer.adaLN_modulation.1.weight": r(2 * D, D),
        "final_layer.adaLN_modulation.1.bias": r(2 * D),
    }
    for i in range(depth):
        pre = f"blocks.{i}"
        s |= {
            f"{pre}.attn.qkv.weight": r(3 * D, D),
            f"{pre}.attn.qkv.bias": r(3 * D),
            f"{pre}.attn.proj.weight": r(D, D),
            f"{pre}.attn.proj.bias": r(D),
            f"{pre}.mlp.fc1.weight": r(4 * D, D),
            f"{pre}.mlp.fc1.bias": r(4 * D),
            f"{pre}.mlp.fc2.weight": r(D, 4 * D),
            f"{pre}.mlp.fc2.bias": r(D),
            f"{pre}.adaLN_modulation.1.weight": r(6 * D, D),
            f"{pre}.adaLN_modulation.1.bias": r(6 * D),
        }
    return s


class TinyDiT(nn.Module):
    """Trainable original-format DiT parameters (for the conversion benchmark's class-conditional pretraining)."""

    def __init__(self, num_heads: int, **arch):
        super().__init__()
        self.num_heads = num_heads
        self.params = nn.ParameterDict(
            {
                k.replace(".", "__"): nn.Parameter(v, requires_grad=k != "pos_embed")
                for k, v in init_dit_state(**arch).items()
            }
        )

    def state(self) -> dict[str, Tensor]:
        return {k.replace("__", "."): v for k, v in self.params.items()}

    def forward(self, x: Tensor, t: Tensor, y: Tensor) -> Tensor:
        return dit_forward(self.state(), x, t, y, self.num_heads)
