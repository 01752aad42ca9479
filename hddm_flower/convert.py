"""ImageNet DiT (class-conditional DDPM) → PixArt-α AdaLN-Single expert initialisation, and init loading.

The paper starts every expert from the public ImageNet 256² DiT-XL/2 checkpoint: patch/position embeddings and
the transformer blocks are kept; the class embedding and the learned-σ head channels are dropped; the text path
(cross-attention, caption projection) and, for FM experts, the output head are re-initialised. FM experts see the
time as 999·t, the DiT's own timestep scale.

Per-block adaLN → AdaLN-Single follows PixArt-α's re-parameterisation: the shared ``t_block`` takes the blocks'
mean modulation layer, and block i's ``scale_shift_table`` is set so that at a reference timestep with the null
class every block's (shift, scale, gate) equals the source block's:
``table_i = M_i(c_ref) − t_block(e_ref)`` with ``c_ref = t_emb(τ_ref) + y_emb(null)`` (the source conditioning)
and ``e_ref`` the converted model's timestep embedding at τ_ref. The cross-attention output projection starts at
zero, so at that reference point the converted network computes what the source computed.

Both source formats are read into the original (facebookresearch) layout first, by explicit key maps that consume
every key; the conversion then consumes every key of that layout and asserts that nothing is left over.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from diffusers import PixArtTransformer2DModel
from torch import Tensor

from .dit import (
    DIT_PRESET_HEADS,
    dit_arch,
    dit_conditioning,
    dit_depth,
    dit_forward,
    dit_modulation,
    dit_pos_embed,
    dit_timestep_embedding,
)
from .safeio import open_regular, read_text

REFERENCE_TIMESTEP = 500


@dataclass
class DiTSource:
    """A DiT checkpoint in the original layout. ``freq_shift`` is the timestep features' ``downscale_freq_shift``
    of the network that produced it (0 for facebookresearch/DiT, 1 for diffusers' ``DiTTransformer2DModel``)."""

    state: dict[str, Tensor]
    arch: dict
    format: str
    freq_shift: int
    path: str
    heads_from: str  # where ``arch["num_heads"]`` came from: the diffusers config, the user, or a published preset


MAX_CONFIG_BYTES = 2**20
MAX_CHECKPOINT_BYTES = 64 * 2**30  # DiT-XL/2's original checkpoint is 2.7 GB; a training checkpoint with opt ~3×


def read_dit(path: str | Path, num_heads: int | None = None) -> DiTSource:
    """Read a DiT checkpoint: an original ``.pt`` (state dict, or a training checkpoint with ``ema``/``model``;
    loaded with ``weights_only=True``), a ``.safetensors`` file, or a diffusers ``DiTTransformer2DModel`` folder.

    The attention heads of an original checkpoint are not stored in it: ``num_heads`` gives them, else the
    published DiT of that depth and width does (:data:`DIT_PRESET_HEADS`); any other shape is refused rather than
    guessed. A diffusers folder's config says its heads; a ``num_heads`` that disagrees with it is an error."""
    path = Path(path)
    if path.is_dir():
        config = json.loads(read_text(path / "config.json", "DiT config", MAX_CONFIG_BYTES))
        if config.get("_class_name") != "DiTTransformer2DModel":
            raise ValueError(f"{path} holds a {config.get('_class_name')!r}, not a DiTTransformer2DModel")
        state = _load_weights(path)
        state = _diffusers_dit_to_original(state, config)
        heads = config["num_attention_heads"]
        if num_heads is not None and num_heads != heads:
            raise ValueError(f"{path}/config.json says num_attention_heads={heads}, not {num_heads}")
        return DiTSource(state, dit_arch(state, heads), "diffusers", 1, str(path), f"{path}/config.json")
    if not path.exists():
        raise FileNotFoundError(f"DiT checkpoint {path} does not exist")
    state = _load_weights(path)
    for key in ("ema", "model"):  # facebookresearch/DiT training checkpoints: {"model", "ema", "opt", "args"}
        if isinstance(state.get(key), dict):
            state = state[key]
            break
    if "x_embedder.proj.weight" not in state:
        raise ValueError(f"{path} is not an original-format DiT state dict (no x_embedder.proj.weight)")
    width, depth = state["x_embedder.proj.weight"].shape[0], dit_depth(state)
    if num_heads is not None:
        heads_from = "given (--num-heads)"
    elif (depth, width) in DIT_PRESET_HEADS:
        num_heads = DIT_PRESET_HEADS[depth, width]
        heads_from = f"the published DiT of depth {depth} and width {width}"
    else:
        raise ValueError(
            f"{path}: a DiT of depth {depth} and width {width} is not a published model and an original checkpoint "
            "does not store its attention heads: pass --num-heads"
        )
    return DiTSource(dict(state), dit_arch(state, num_heads), "original", 0, str(path), heads_from)


def _load_weights(path: Path) -> dict:
    from safetensors.torch import load_file

    if path.is_dir():
        files = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))
        if len(files) != 1:
            raise ValueError(f"expected one weights file in {path}, found {[f.name for f in files]}")
        path = files[0]
    with open_regular(path, "DiT checkpoint", MAX_CHECKPOINT_BYTES) as f:  # a regular file of bounded size
        if path.suffix == ".safetensors":
            return load_file(path)
        return torch.load(f, map_location="cpu", weights_only=True)


def _diffusers_dit_to_original(s: dict[str, Tensor], config: dict) -> dict[str, Tensor]:
    """diffusers ``DiTTransformer2DModel`` keys → facebookresearch/DiT keys (every key consumed)."""
    s, out = dict(s), {}
    emb = "transformer_blocks.0.norm1.emb"
    copies = {
        "timestep_embedder.linear_1.weight": "t_embedder.mlp.0.weight",
        "timestep_embedder.linear_1.bias": "t_embedder.mlp.0.bias",
        "timestep_embedder.linear_2.weight": "t_embedder.mlp.2.weight",
        "timestep_embedder.linear_2.bias": "t_embedder.mlp.2.bias",
        "class_embedder.embedding_table.weight": "y_embedder.embedding_table.weight",
    }
    for src_name, dst_name in copies.items():
        out[dst_name] = s.pop(f"{emb}.{src_name}")
    for n in ("weight", "bias"):
        out[f"x_embedder.proj.{n}"] = s.pop(f"pos_embed.proj.{n}")
        out[f"final_layer.adaLN_modulation.1.{n}"] = s.pop(f"proj_out_1.{n}")
        out[f"final_layer.linear.{n}"] = s.pop(f"proj_out_2.{n}")
    for i in range(config["num_layers"]):
        src, dst = f"transformer_blocks.{i}", f"blocks.{i}"
        for src_name, dst_name in copies.items():  # later blocks carry copies of block 0's embedder
            key = f"{src}.norm1.emb.{src_name}"
            if key in s and not torch.equal(s.pop(key), out[dst_name]):
                raise ValueError(f"{key} differs from block 0's copy; this converter assumes a shared embedder")
        for n in ("weight", "bias"):
            out[f"{dst}.adaLN_modulation.1.{n}"] = s.pop(f"{src}.norm1.linear.{n}")
            out[f"{dst}.attn.qkv.{n}"] = torch.cat([s.pop(f"{src}.attn1.to_{x}.{n}") for x in "qkv"])
            out[f"{dst}.attn.proj.{n}"] = s.pop(f"{src}.attn1.to_out.0.{n}")
            out[f"{dst}.mlp.fc1.{n}"] = s.pop(f"{src}.ff.net.0.proj.{n}")
            out[f"{dst}.mlp.fc2.{n}"] = s.pop(f"{src}.ff.net.2.{n}")
    if s:
        raise ValueError(f"diffusers DiT keys not understood: {sorted(s)[:5]}")
    D, p = out["x_embedder.proj.weight"].shape[0], config["patch_size"]
    out["pos_embed"] = dit_pos_embed(D, config["sample_size"] // p)[None]  # diffusers recomputes it; DiT stores it
    return out


def convert_dit(
    src: DiTSource,
    *,
    objective: str,
    caption_channels: int,
    reference_timestep: float = REFERENCE_TIMESTEP,
    seed: int = 0,
) -> tuple[dict, dict, dict]:
    """Convert a DiT into a PixArt transformer state dict for an ``fm`` or ``ddpm`` expert.

    Returns (state dict, diffusers config, conversion report).
    """
    if objective not in ("fm", "ddpm"):
        raise ValueError(f"unknown objective {objective!r}; expected fm or ddpm")
    a = src.arch
    D, C, p, depth = a["hidden_size"], a["in_channels"], a["patch_size"], a["depth"]
    config = dict(
        num_layers=depth,
        num_attention_heads=a["num_heads"],
        attention_head_dim=D // a["num_heads"],
        patch_size=p,
        sample_size=a["input_size"],
        in_channels=C,
        out_channels=C,
        caption_channels=caption_channels,
        cross_attention_dim=D,
        norm_type="ada_norm_single",
        use_additional_conditions=False,
        num_embeds_ada_norm=1000,
    )
    torch.manual_seed(seed)
    fresh = PixArtTransformer2DModel.from_config(config).state_dict()
    s = {k: v.float() for k, v in src.state.items()}
    out: dict[str, Tensor] = {}
    kept, dropped, reinit = [], [], []

    def move(src_key: str, dst_key: str, value: Tensor | None = None):
        out[dst_key] = s.pop(src_key) if value is None else value
        kept.append(f"{src_key} -> {dst_key}")

    # patch embedding; the position embedding is DiT's fixed sin-cos one, which diffusers recomputes
    move("x_embedder.proj.weight", "pos_embed.proj.weight")
    move("x_embedder.proj.bias", "pos_embed.proj.bias")
    pos = s.pop("pos_embed")
    if not torch.allclose(pos.reshape(-1, D), dit_pos_embed(D, a["input_size"] // p), atol=1e-5):
        raise ValueError("the source's pos_embed is not DiT's fixed sin-cos embedding; cannot map it")
    kept.append("pos_embed -> (recomputed identically by PixArt's PatchEmbed)")

    # reference conditioning: timestep τ_ref with the null class (the last row of the class table)
    t_ref = torch.tensor([float(reference_timestep)])
    table = s.pop("y_embedder.embedding_table.weight")
    dropped.append(f"y_embedder.embedding_table.weight (class embedding; row {len(table) - 1} used as the null class)")
    c_ref = dit_timestep_embedding(s, t_ref, src.freq_shift) + table[-1]  # (1, D): the source's conditioning
    e_ref = dit_timestep_embedding(s, t_ref, 0)  # (1, D): PixArt's embedding (features with freq shift 0)
    for n in ("weight", "bias"):
        move(f"t_embedder.mlp.0.{n}", f"adaln_single.emb.timestep_embedder.linear_1.{n}")
        move(f"t_embedder.mlp.2.{n}", f"adaln_single.emb.timestep_embedder.linear_2.{n}")

    # shared t_block = the blocks' mean modulation layer; per-block tables re-parameterise the difference
    W = torch.stack([s[f"blocks.{i}.adaLN_modulation.1.weight"] for i in range(depth)]).mean(0)
    b = torch.stack([s[f"blocks.{i}.adaLN_modulation.1.bias"] for i in range(depth)]).mean(0)
    out["adaln_single.linear.weight"], out["adaln_single.linear.bias"] = W, b
    t_block_ref = F.linear(F.silu(e_ref), W, b)  # (1, 6D)
    for i in range(depth):
        pre, dst = f"blocks.{i}", f"transformer_blocks.{i}"
        mod_ref = dit_modulation(s, pre, c_ref)  # (1, 6D): the source block's (shift, scale, gate) × 2
        s.pop(f"{pre}.adaLN_modulation.1.weight"), s.pop(f"{pre}.adaLN_modulation.1.bias")
        out[f"{dst}.scale_shift_table"] = (mod_ref - t_block_ref).reshape(6, D)
        kept.append(f"{pre}.adaLN_modulation.1 -> adaln_single.linear (mean) + {dst}.scale_shift_table")
        for n in ("weight", "bias"):
            for j, x in enumerate("qkv"):
                out[f"{dst}.attn1.to_{x}.{n}"] = s[f"{pre}.attn.qkv.{n}"].chunk(3)[j]
            s.pop(f"{pre}.attn.qkv.{n}")
            kept.append(f"{pre}.attn.qkv.{n} -> {dst}.attn1.to_q/k/v.{n}")
            move(f"{pre}.attn.proj.{n}", f"{dst}.attn1.to_out.0.{n}")
            move(f"{pre}.mlp.fc1.{n}", f"{dst}.ff.net.0.proj.{n}")
            move(f"{pre}.mlp.fc2.{n}", f"{dst}.ff.net.2.{n}")
            for x in ("q", "k", "v"):  # text cross-attention: fresh
                out[f"{dst}.attn2.to_{x}.{n}"] = fresh[f"{dst}.attn2.to_{x}.{n}"]
            out[f"{dst}.attn2.to_out.0.{n}"] = torch.zeros_like(fresh[f"{dst}.attn2.to_out.0.{n}"])
        reinit.append(f"{dst}.attn2 (cross-attention; to_out.0 zero, so it adds nothing at first)")
    for k in [k for k in fresh if k.startswith("caption_projection.")]:
        out[k] = fresh[k]
    reinit.append("caption_projection (text states → width)")

    # final layer: modulation re-parameterised the same way; head kept (ε channels) for DDPM, zeroed for FM
    mod_f = dit_modulation(s, "final_layer", c_ref)  # (1, 2D)
    s.pop("final_layer.adaLN_modulation.1.weight"), s.pop("final_layer.adaLN_modulation.1.bias")
    out["scale_shift_table"] = mod_f.reshape(2, D) - e_ref  # PixArt: table + embedded_timestep
    kept.append("final_layer.adaLN_modulation.1 -> scale_shift_table")
    head_w, head_b = s.pop("final_layer.linear.weight"), s.pop("final_layer.linear.bias")
    out_ch = head_w.shape[0] // (p * p)
    eps_rows = torch.arange(head_w.shape[0]) % out_ch < C  # rows ordered (p, q, c): c fastest
    if out_ch == 2 * C:
        dropped.append("final_layer.linear rows of the learned-σ channels")
    if objective == "ddpm":
        out["proj_out.weight"], out["proj_out.bias"] = head_w[eps_rows], head_b[eps_rows]
        kept.append("final_layer.linear (ε channels) -> proj_out")
    else:
        out["proj_out.weight"] = torch.zeros_like(fresh["proj_out.weight"])
        out["proj_out.bias"] = torch.zeros_like(fresh["proj_out.bias"])
        reinit.append("proj_out (the FM velocity head, zero: the converted expert starts at v = 0)")
        dropped.append("final_layer.linear (the ε head; an FM expert predicts velocity)")

    if s:
        raise AssertionError(f"source keys left unconverted: {sorted(s)}")
    missing, extra = set(fresh) - set(out), set(out) - set(fresh)
    if missing or extra:
        raise AssertionError(f"converted keys do not match PixArt: missing {sorted(missing)}, extra {sorted(extra)}")
    for k, v in out.items():
        if v.shape != fresh[k].shape:
            raise AssertionError(f"{k}: shape {tuple(v.shape)}, PixArt expects {tuple(fresh[k].shape)}")
    report = {
        "source": src.path,
        "format": src.format,
        "arch": a,
        "num_heads": a["num_heads"],
        "num_heads_from": src.heads_from,
        "objective": objective,
        "reference_timestep": float(reference_timestep),
        "kept": kept,
        "dropped": dropped,
        "reinitialised": reinit,
        "time_mapping": (
            "fm: the network's timestep is 999·t (t = 1 noise), the DiT's own scale"
            if objective == "fm"
            else "ddpm: the network's timestep is the DDPM τ ∈ [0, 999]"
        ),
        "check": conversion_check(src, out, config, reference_timestep),
    }
    return out, config, report


@torch.no_grad()
def conversion_check(
    src: DiTSource, state: dict, config: dict, reference_timestep: float, batch: int = 2
) -> dict[str, float]:
    """At the reference timestep with the null class: the largest difference between the converted and the
    source blocks' modulations, and (ε head kept) between their outputs on random inputs."""
    model = PixArtTransformer2DModel.from_config(config)
    model.load_state_dict(state)
    model.eval()
    D, depth = src.arch["hidden_size"], src.arch["depth"]
    t = torch.full((batch,), float(reference_timestep))
    timestep, embedded = model.adaln_single(
        t, {"resolution": None, "aspect_ratio": None}, batch_size=batch, hidden_dtype=torch.float32
    )
    null = torch.full((batch,), len(src.state["y_embedder.embedding_table.weight"]) - 1)
    c = dit_conditioning(src.state, t, null, src.freq_shift)
    mod_diff = max(
        (
            model.transformer_blocks[i].scale_shift_table[None]
            + timestep.reshape(batch, 6, D)
            - dit_modulation(src.state, f"blocks.{i}", c).reshape(batch, 6, D)
        )
        .abs()
        .max()
        .item()
        for i in range(depth)
    )
    g = torch.Generator().manual_seed(0)
    size, C = src.arch["input_size"], src.arch["in_channels"]
    x = torch.randn(batch, C, size, size, generator=g)
    patch_diff = (model.pos_embed(x) - _source_patch(src, x)).abs().max().item()
    result = {"max_modulation_diff": mod_diff, "max_patch_embedding_diff": patch_diff}
    if torch.count_nonzero(state["proj_out.weight"]):
        text = torch.zeros(batch, 1, config["caption_channels"])
        y = model(
            x,
            encoder_hidden_states=text,
            encoder_attention_mask=torch.ones(batch, 1),
            timestep=t,
            added_cond_kwargs={"resolution": None, "aspect_ratio": None},
            return_dict=False,
        )[0]
        result["max_output_diff"] = (y - _source_output(src, x, t, null)[:, :C]).abs().max().item()
        result["reference"] = (
            "the diffusers DiTTransformer2DModel itself"
            if src.format == "diffusers"
            else f"dit_forward with {src.arch['num_heads']} heads ({src.heads_from})"
        )
    return result


def _source_output(src: DiTSource, x: Tensor, t: Tensor, y: Tensor) -> Tensor:
    """The source network's output. A diffusers folder is run by diffusers itself, so the check shares nothing
    with the conversion (its heads included); an original checkpoint by :func:`dit_forward` with the heads
    :func:`read_dit` was told or found in the published presets — never guessed."""
    if src.format == "diffusers":
        from diffusers import DiTTransformer2DModel

        model = DiTTransformer2DModel.from_pretrained(src.path, low_cpu_mem_usage=False).eval()
        return model(x, timestep=t, class_labels=y, return_dict=False)[0]
    return dit_forward(src.state, x, t, y, src.arch["num_heads"], src.freq_shift)


def _source_patch(src: DiTSource, x: Tensor) -> Tensor:
    w = src.state["x_embedder.proj.weight"]
    h = F.conv2d(x, w, src.state["x_embedder.proj.bias"], stride=w.shape[-1]).flatten(2).transpose(1, 2)
    return h + src.state["pos_embed"]


def write_converted(out_dir: str | Path, state: dict, config: dict, report: dict) -> Path:
    """Save a converted transformer as a diffusers folder with ``conversion_report.json`` and ``hddm_init.json``."""
    out_dir = Path(out_dir)
    model = PixArtTransformer2DModel.from_config(config)
    model.load_state_dict(state)
    model.save_pretrained(out_dir)
    (out_dir / "conversion_report.json").write_text(json.dumps(report, indent=2))
    (out_dir / "hddm_init.json").write_text(
        json.dumps(
            {"objective": report["objective"], "source": report["source"], "time_mapping": report["time_mapping"]},
            indent=2,
        )
    )
    return out_dir


def load_init(folder: str | Path, model_config: dict) -> tuple[dict[str, Tensor], list[str]]:
    """Initial weights for an expert of ``model_config`` from a diffusers PixArt folder (``hddm convert-dit``
    output, or e.g. a downloaded PixArt-XL-2-256x256 ``transformer``). The learned-σ head channels are dropped and
    a caption projection of another text width is re-initialised; any other mismatch is an error."""
    folder = Path(folder)
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"expert.init: {folder} is not a diffusers model folder (no config.json)")
    src = PixArtTransformer2DModel.from_pretrained(folder, low_cpu_mem_usage=False)
    sc, notes = src.config, []
    for key in ("sample_size", "in_channels", "patch_size", "num_layers", "num_attention_heads", "attention_head_dim"):
        if sc[key] != model_config[key]:
            raise ValueError(f"expert.init: {folder} has {key}={sc[key]}, the expert needs {model_config[key]}")
    state = src.state_dict()
    fresh = PixArtTransformer2DModel.from_config(model_config).state_dict()
    C = model_config["in_channels"]
    if sc["out_channels"] == 2 * C:
        rows = torch.arange(state["proj_out.weight"].shape[0]) % (2 * C) < C
        state["proj_out.weight"], state["proj_out.bias"] = state["proj_out.weight"][rows], state["proj_out.bias"][rows]
        notes.append("dropped the learned-σ channels of proj_out")
    if sc["caption_channels"] != model_config["caption_channels"]:
        for k in [k for k in fresh if k.startswith("caption_projection.")]:
            state[k] = fresh[k]
        notes.append(
            f"re-initialised caption_projection ({sc['caption_channels']} → "
            f"{model_config['caption_channels']} text channels)"
        )
    bad = [k for k in fresh if k not in state or state[k].shape != fresh[k].shape]
    if bad:
        raise ValueError(f"expert.init: {folder} does not fit the expert: {bad[:3]}")
    return {k: state[k] for k in fresh}, notes
