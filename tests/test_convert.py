"""DiT → PixArt AdaLN-Single conversion on tiny random DiT checkpoints in both formats, written to disk."""

import json

import pytest
import torch
from diffusers import DiTTransformer2DModel, PixArtTransformer2DModel

from hddm_flower import dit
from hddm_flower.cli import main
from hddm_flower.convert import REFERENCE_TIMESTEP, conversion_check, convert_dit, load_init, read_dit
from hddm_flower.dit import dit_conditioning, dit_forward, dit_modulation, dit_pos_embed, init_dit_state
from hddm_flower.models import expert_config

ARCH = dict(input_size=8, in_channels=4, patch_size=2, hidden_size=64, depth=3, num_classes=10)
ADDED = {"resolution": None, "aspect_ratio": None}


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    state = init_dit_state(**ARCH, generator=torch.Generator().manual_seed(0), std=0.1)
    path = tmp_path_factory.mktemp("dit") / "DiT-tiny.pt"
    torch.save({"model": {k: v + 1 for k, v in state.items()}, "ema": state, "args": {"note": "training ckpt"}}, path)
    return path, state


@pytest.fixture(scope="module")
def diffusers_dit(tmp_path_factory):
    torch.manual_seed(0)
    model = DiTTransformer2DModel(
        num_attention_heads=4,
        attention_head_dim=16,
        in_channels=4,
        out_channels=8,
        num_layers=3,
        sample_size=8,
        patch_size=2,
        num_embeds_ada_norm=10,
    )
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1)
        for block in model.transformer_blocks[1:]:  # a real checkpoint's blocks share one embedder
            block.norm1.emb.load_state_dict(model.transformer_blocks[0].norm1.emb.state_dict())
    path = tmp_path_factory.mktemp("ddit") / "dit"
    model.save_pretrained(path)
    return path, model.eval()


def _pixart(state, config):
    model = PixArtTransformer2DModel.from_config(config)
    model.load_state_dict(state)
    return model.eval()


@pytest.mark.parametrize("objective", ["ddpm", "fm"])
def test_original_format(original, objective):
    path, source = original
    src = read_dit(path, num_heads=4)
    assert src.format == "original" and torch.equal(src.state["pos_embed"], source["pos_embed"])  # the EMA weights
    state, config, report = convert_dit(src, objective=objective, caption_channels=24, reference_timestep=500)
    model = _pixart(state, config)
    # every source key consumed, on purpose: listed as kept or dropped
    listed = " ".join(report["kept"] + report["dropped"])
    assert all(k.split(".")[0] in listed for k in source)
    assert any("class embedding" in d for d in report["dropped"]) and any("σ" in d for d in report["dropped"])
    # at the reference timestep with the null class every block's (shift, scale, gate) equals the source's
    t = torch.full((2,), 500.0)
    c = dit_conditioning(source, t, torch.full((2,), 10))
    timestep, embedded = model.adaln_single(t, ADDED, batch_size=2, hidden_dtype=torch.float32)
    for i, block in enumerate(model.transformer_blocks):
        converted = block.scale_shift_table[None] + timestep.reshape(2, 6, 64)
        torch.testing.assert_close(
            converted, dit_modulation(source, f"blocks.{i}", c).reshape(2, 6, 64), atol=1e-5, rtol=0
        )
    final = model.scale_shift_table[None] + embedded[:, None]
    torch.testing.assert_close(final, dit_modulation(source, "final_layer", c).reshape(2, 2, 64), atol=1e-5, rtol=0)
    # away from the reference the modulations differ (it is a re-parameterisation, not a copy)
    t_far = torch.full((2,), 100.0)
    timestep_far, _ = model.adaln_single(t_far, ADDED, batch_size=2, hidden_dtype=torch.float32)
    assert model.adaln_single.linear.weight.shape == (6 * 64, 64) and not torch.allclose(timestep, timestep_far)
    # the patch embedding output is identical
    x = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(1))
    w = source["x_embedder.proj.weight"]
    ref = torch.nn.functional.conv2d(x, w, source["x_embedder.proj.bias"], stride=2).flatten(2).transpose(1, 2)
    torch.testing.assert_close(model.pos_embed(x), ref + source["pos_embed"], atol=1e-6, rtol=0)
    # the whole network: DDPM keeps the ε head and computes what the source computed; FM starts at zero
    y = model(x, encoder_hidden_states=torch.randn(2, 3, 24), timestep=t, added_cond_kwargs=ADDED, return_dict=False)[0]
    if objective == "ddpm":
        torch.testing.assert_close(y, dit_forward(source, x, t, torch.full((2,), 10), 4)[:, :4], atol=1e-5, rtol=0)
        assert report["check"]["max_output_diff"] < 1e-5
    else:
        assert torch.count_nonzero(y) == 0 and "max_output_diff" not in report["check"]
    assert report["check"]["max_modulation_diff"] < 1e-5 and report["check"]["max_patch_embedding_diff"] < 1e-6


def test_diffusers_format(diffusers_dit):
    path, source = diffusers_dit
    src = read_dit(path)
    assert src.format == "diffusers" and src.freq_shift == 1 and src.arch["depth"] == 3
    state, config, report = convert_dit(src, objective="ddpm", caption_channels=24)
    model = _pixart(state, config)
    x = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(2))
    t, null = torch.full((2,), 500.0), torch.full((2,), 10)
    with torch.no_grad():
        for i, block in enumerate(model.transformer_blocks):
            src_mod = source.transformer_blocks[i].norm1.linear(
                torch.nn.functional.silu(source.transformer_blocks[i].norm1.emb(t, null, hidden_dtype=torch.float32))
            )
            timestep, _ = model.adaln_single(t, ADDED, batch_size=2, hidden_dtype=torch.float32)
            torch.testing.assert_close(
                block.scale_shift_table[None] + timestep.reshape(2, 6, 64), src_mod.reshape(2, 6, 64), atol=1e-5, rtol=0
            )
        torch.testing.assert_close(model.pos_embed(x), source.pos_embed(x), atol=1e-6, rtol=0)
        y_src = source(x, timestep=t, class_labels=null, return_dict=False)[0][:, :4]
        y = model(
            x, encoder_hidden_states=torch.zeros(2, 1, 24), timestep=t, added_cond_kwargs=ADDED, return_dict=False
        )[0]
    torch.testing.assert_close(y, y_src, atol=1e-4, rtol=0)  # layer-norm eps: diffusers DiT 1e-5, PixArt 1e-6


def test_heads_are_told_never_guessed(original, diffusers_dit, tmp_path, capsys, monkeypatch):
    """An original checkpoint stores no head count: an unpublished shape without --num-heads is refused, a published
    one takes the paper's count, and the report records the count and where it came from."""
    path, _ = original
    with pytest.raises(ValueError, match="depth 3 and width 64 is not a published model.*pass --num-heads"):
        read_dit(path)
    assert main(["convert-dit", str(path), "--out", str(tmp_path / "x"), "--caption-channels", "24"]) == 2
    assert "--num-heads" in capsys.readouterr().err and not (tmp_path / "x").exists()
    with pytest.raises(ValueError, match="3 attention heads do not divide the DiT width 64"):
        read_dit(path, num_heads=3)
    monkeypatch.setitem(dit.DIT_PRESET_HEADS, (3, 64), 8)  # as if DiT-tiny were a published model
    src = read_dit(path)
    assert src.arch["num_heads"] == 8 and "published DiT of depth 3 and width 64" in src.heads_from
    _, config, report = convert_dit(src, objective="ddpm", caption_channels=24)
    assert config["num_attention_heads"] == 8 and config["attention_head_dim"] == 8
    assert report["num_heads"] == 8 and "published" in report["num_heads_from"]
    assert report["check"]["max_output_diff"] < 1e-5 and "8 heads" in report["check"]["reference"]
    # a diffusers folder says its heads; a contradicting --num-heads is refused; the check runs diffusers' own DiT
    dpath, _ = diffusers_dit
    with pytest.raises(ValueError, match="num_attention_heads=4, not 2"):
        read_dit(dpath, num_heads=2)
    src = read_dit(dpath)
    state, config, report = convert_dit(src, objective="ddpm", caption_channels=24)
    assert report["num_heads"] == 4 and report["num_heads_from"].endswith("config.json")
    assert "diffusers DiTTransformer2DModel" in report["check"]["reference"]
    assert report["check"]["max_output_diff"] < 1e-4
    # that check would see a wrong head count in the converted model
    wrong = dict(config, num_attention_heads=2, attention_head_dim=32)
    assert conversion_check(src, state, wrong, REFERENCE_TIMESTEP)["max_output_diff"] > 1e-2


def test_pos_embed_matches_diffusers():
    from diffusers.models.embeddings import get_2d_sincos_pos_embed

    for dim, grid in [(32, 4), (1152, 16)]:
        ref = torch.as_tensor(get_2d_sincos_pos_embed(dim, grid, base_size=grid, output_type="pt")).float()
        torch.testing.assert_close(dit_pos_embed(dim, grid), ref, atol=1e-6, rtol=0)


def test_cli_convert_and_init(original, tmp_path, capsys):
    path, _ = original
    out = tmp_path / "fm-init"
    assert (
        main(
            [
                "convert-dit",
                str(path),
                "--out",
                str(out),
                "--objective",
                "fm",
                "--caption-channels",
                "24",
                "--num-heads",
                "4",
            ]
        )
        == 0
    )
    report = json.loads((out / "conversion_report.json").read_text())
    assert report["objective"] == "fm" and "999·t" in report["time_mapping"]
    PixArtTransformer2DModel.from_pretrained(out)  # a plain diffusers folder
    # an expert config with the same architecture initialises from it; a different one is refused by name
    cfg = dict(
        expert_config("test", sample_size=8, in_channels=4, caption_channels=24),
        num_layers=3,
        num_attention_heads=4,
        attention_head_dim=16,
        cross_attention_dim=64,
    )
    state, notes = load_init(out, cfg)
    assert torch.count_nonzero(state["proj_out.weight"]) == 0 and notes == []
    _, notes = load_init(out, dict(cfg, caption_channels=384))
    assert "caption_projection" in notes[0]
    with pytest.raises(ValueError, match="num_layers=3, the expert needs 1"):
        load_init(out, expert_config("test", sample_size=8, in_channels=4, caption_channels=24))
    assert main(["convert-dit", str(tmp_path / "missing.pt"), "--out", str(tmp_path / "x")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_expert_init_from_a_converted_dit(original, tiny_config, dataset_dir, tmp_path):
    """expert.init: a convert-dit folder initialises the expert; training starts from those weights."""
    import dataclasses

    from hddm_flower.data import read_meta
    from hddm_flower.stages.expert import build_expert

    meta = read_meta(dataset_dir)  # 16×16 RGB pixels, 384-d MiniLM states
    state = init_dit_state(
        input_size=16,
        in_channels=3,
        patch_size=2,
        hidden_size=32,
        depth=1,
        num_classes=4,
        generator=torch.Generator().manual_seed(3),
    )
    torch.save(state, tmp_path / "dit.pt")
    assert (
        main(
            [
                "convert-dit",
                str(tmp_path / "dit.pt"),
                "--out",
                str(tmp_path / "init"),
                "--objective",
                "ddpm",
                "--caption-channels",
                "384",
                "--num-heads",
                "2",
            ]
        )
        == 0
    )
    cfg = dataclasses.replace(tiny_config, expert=dataclasses.replace(tiny_config.expert, init=str(tmp_path / "init")))
    expert, _, info = build_expert(cfg, meta, "fm")
    loaded = expert.net.transformer.state_dict()
    torch.testing.assert_close(loaded["pos_embed.proj.weight"], state["x_embedder.proj.weight"])
    assert info["init_notes"] == ["converted for ddpm, trained as fm"]
