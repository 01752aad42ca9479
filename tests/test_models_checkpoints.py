"""Models at tiny sizes and checkpoints on disk: shapes, gradients, save → load → same output, corruption."""

import json

import pytest
import torch
from diffusers import PixArtTransformer2DModel

from hddm_flower.checkpoints import (
    META,
    WEIGHTS,
    load_expert,
    load_router,
    make_expert,
    save_expert,
    save_router,
)
from hddm_flower.experts import DDPMExpert, FlowMatchingExpert
from hddm_flower.models import ExpertNet, Router, TextCond, expert_config, router_config
from hddm_flower.presets import EXPERT_PRESETS

CFG = expert_config("test", sample_size=8, in_channels=3, caption_channels=24)


def _cond(b, length=5, dim=24):
    mask = torch.ones(b, length)
    mask[:, 3:] = 0
    return TextCond(torch.randn(b, length, dim), mask)


def _meta(objective, **extra):
    meta = {
        "expert_id": 1,
        "cluster_id": 1,
        "objective": objective,
        "preset": "test",
        "time_convention": "fm",
        "steps": 3,
        "images_seen": 12,
        "device_seconds": 0.1,
    }
    if objective == "ddpm":
        meta |= {"schedule": "linear", "num_train_timesteps": 1000}
    return meta | extra


@pytest.fixture
def diffusers_warnings():
    """The messages diffusers logs at warning level or above while the test runs (the suite's processes keep only
    its errors; here they are shown, as in a command-line run), collected by a handler of diffusers' own logger."""
    import logging

    from diffusers.utils import logging as diffusers_logging

    messages: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: messages.append(record.getMessage())
    logger, level = diffusers_logging.get_logger("diffusers"), diffusers_logging.get_verbosity()
    logger.addHandler(handler)
    diffusers_logging.set_verbosity_warning()
    yield messages
    diffusers_logging.set_verbosity(level)
    logger.removeHandler(handler)


def test_expert_net_shapes_and_gradients_reach_adaln_tables():
    torch.manual_seed(0)
    net = ExpertNet.from_config(CFG)
    x = torch.randn(4, 3, 8, 8)
    out = net(x, torch.tensor([0.0, 10.5, 500.0, 999.0]), _cond(4))
    assert out.shape == x.shape
    out.pow(2).mean().backward()
    tables = [p for n, p in net.named_parameters() if n.endswith("scale_shift_table")]
    assert tables and all(p.grad is not None and p.grad.abs().sum() > 0 for p in tables)


def test_router_shapes_and_time_input():
    torch.manual_seed(0)
    router = Router(**router_config("test", num_experts=5, sample_size=8, in_channels=3))
    x = torch.randn(6, 3, 8, 8)
    logits = router(x, torch.linspace(0, 1, 6))
    assert logits.shape == (6, 5)
    # the time reaches the output (adaLN is zero at init, so train a step first)
    opt = torch.optim.SGD(router.parameters(), lr=1.0)
    router(x, torch.rand(6)).logsumexp(-1).sum().backward()
    opt.step()
    assert not torch.allclose(router(x[:1], torch.tensor([0.1])), router(x[:1], torch.tensor([0.9])))


@pytest.mark.parametrize("objective", ["fm", "ddpm"])
def test_save_load_same_velocity_and_diffusers_loadable(tmp_path, objective, diffusers_warnings):
    torch.manual_seed(0)
    net = ExpertNet.from_config(CFG)
    expert = make_expert(net, _meta(objective), t_eps=0.01, x0_clamp=20.0)
    assert isinstance(expert, FlowMatchingExpert if objective == "fm" else DDPMExpert)
    digest = save_expert(tmp_path / "e", net.transformer.state_dict(), CFG, _meta(objective))
    assert json.loads((tmp_path / "e" / META).read_text())["sha256"] == digest
    PixArtTransformer2DModel.from_pretrained(tmp_path / "e")  # plain diffusers can load the folder
    diffusers_warnings.clear()
    loaded, meta = load_expert(tmp_path / "e", t_eps=0.01, x0_clamp=20.0)
    assert diffusers_warnings == []  # no warning at each of a run's loads (accelerate is no dependency)
    assert meta["objective"] == objective and type(loaded) is type(expert)
    x, t, c = torch.randn(3, 3, 8, 8), torch.tensor([0.2, 0.5, 0.8]), _cond(3)
    with torch.no_grad():
        torch.testing.assert_close(loaded.velocity(x, t, c), expert.eval().velocity(x, t, c))
    assert not list(tmp_path.glob(".e.*"))  # no temporary folder left behind


def test_corrupt_and_invalid_checkpoints_are_rejected(tmp_path):
    net = ExpertNet.from_config(CFG)
    state = net.transformer.state_dict()
    save_expert(tmp_path / "e", state, CFG, _meta("fm"))
    weights = tmp_path / "e" / WEIGHTS
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="does not match the sha256"):
        load_expert(tmp_path / "e")
    with pytest.raises(ValueError, match="lacks"):
        save_expert(tmp_path / "f", state, CFG, {"objective": "fm"})
    with pytest.raises(ValueError, match="unknown objective 'edm'"):
        make_expert(net, _meta("edm"))
    assert not (tmp_path / "f").exists()


def test_router_round_trip(tmp_path, diffusers_warnings):
    torch.manual_seed(0)
    router = Router(**router_config("test", num_experts=3, sample_size=8, in_channels=3)).eval()
    save_router(tmp_path / "router", router, {"steps": 0})
    x, t = torch.randn(2, 3, 8, 8), torch.tensor([0.3, 0.7])
    with torch.no_grad():
        torch.testing.assert_close(load_router(tmp_path / "router")(x, t), router(x, t))
    assert diffusers_warnings == []


def test_unknown_preset_is_named():
    with pytest.raises(ValueError, match="unknown expert preset 'huge'"):
        expert_config("huge", sample_size=8, in_channels=3, caption_channels=8)


def _expert_parameters(preset: str, sample_size: int, in_channels: int, caption_channels: int) -> int:
    """The parameter count of a PixArt AdaLN-Single expert in closed form (width w, L blocks, patch p)."""
    a = EXPERT_PRESETS[preset]
    w, L, p, C, c = (
        a["num_attention_heads"] * a["attention_head_dim"],
        a["num_layers"],
        a["patch_size"],
        in_channels,
        caption_channels,
    )
    n = C * p * p * w + w  # patch embedding (the sin-cos positions are a buffer)
    n += 256 * w + w + w * w + w  # timestep MLP
    n += 6 * w * w + 6 * w  # AdaLN-Single: one modulation for every block
    n += c * w + w + w * w + w  # caption projection
    n += L * (2 * (4 * w * w + 4 * w) + 8 * w * w + 5 * w + 6 * w)  # self- and cross-attention, MLP ×4, block table
    return n + 2 * w + w * p * p * C + p * p * C  # output table and projection


@pytest.mark.parametrize("preset", ["test", "femto", "pico", "nano", "mini", "tiny"])
@pytest.mark.parametrize("shape", [(8, 3, 384), (12, 3, 384), (16, 1, 24)])
def test_small_presets_have_their_closed_form_parameter_counts(preset, shape):
    """Nothing about the image size enters the count (positions are fixed sin-cos); the width does, squared."""
    with torch.device("meta"):
        net = PixArtTransformer2DModel.from_config(
            expert_config(preset, sample_size=shape[0], in_channels=shape[1], caption_channels=shape[2])
        )
    assert sum(p.numel() for p in net.parameters()) == _expert_parameters(preset, *shape)


def test_nano_and_mini_sizes_at_the_gmm_shapes():
    """nano (2 blocks, width 32) against mini (2 blocks, width 64) on 3×12×12 pixels with MiniLM captions."""
    assert (_expert_parameters("nano", 12, 3, 384), _expert_parameters("mini", 12, 3, 384)) == (63_852, 209_612)


def test_paper_scale_presets_match_the_paper_without_allocating():
    """XL/2 expert ≈ 605M and B/2 router ≈ 129M parameters at the paper's shapes (4×32×32, CLIP width 768)."""
    with torch.device("meta"):
        xl = PixArtTransformer2DModel.from_config(
            expert_config("XL/2", sample_size=32, in_channels=4, caption_channels=768)
        )
        router = Router(**router_config("B/2", num_experts=8, sample_size=32, in_channels=4))
    n_xl = sum(p.numel() for p in xl.parameters())
    n_router = sum(p.numel() for p in router.parameters())
    assert abs(n_xl / 605e6 - 1) < 0.01, n_xl
    assert abs(n_router / 129e6 - 1) < 0.05, n_router
