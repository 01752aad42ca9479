"""The router that reads the prompt (``router.conditioning: text``): the model, its record, old routers loading as
``none``, the ensemble's CFG weights computed once on the conditional caption, and central training on a stream
that carries only pooled caption embeddings."""

import json
from pathlib import Path

import pytest
import torch

from hddm_flower.checkpoints import load_router, save_router
from hddm_flower.config.io import config_from_dict, load_config
from hddm_flower.data import Dataset
from hddm_flower.ensemble import Ensemble
from hddm_flower.models import Router, TextCond, router_conditioning, router_config
from hddm_flower.text import pooled_caption
from hddm_flower.training import drop_pooled_captions


def _text_router(seed=0, dim=6):
    torch.manual_seed(seed)
    router = Router(
        **router_config("test", num_experts=3, sample_size=8, in_channels=3, conditioning="text", caption_dim=dim)
    )
    with torch.no_grad():  # off adaLN-Zero's start, where no conditioning reaches the logits
        for block in router.blocks:
            block.adaLN_modulation[1].weight.normal_(0, 0.5)
    return router.eval()


def test_the_caption_changes_the_logits_and_is_required():
    router = _text_router()
    x, t = torch.randn(2, 3, 8, 8), torch.tensor([0.4, 0.4])
    a, b = torch.randn(1, 6).expand(2, -1), torch.randn(1, 6).expand(2, -1)
    with torch.no_grad():
        assert not torch.allclose(router(x, t, a), router(x, t, b))
    with pytest.raises(ValueError, match="reads the caption's pooled embedding"):
        router(x, t)
    plain = Router(**router_config("test", num_experts=3, sample_size=8, in_channels=3))
    assert plain.conditioning == "none" and "caption_embed" not in dict(plain.named_modules())
    with pytest.raises(ValueError, match="reads no caption"):
        plain(x, t, a)
    with pytest.raises(ValueError, match="'text' needs the width"):
        Router(conditioning="text")


def test_round_trip_and_an_old_router_loads_as_the_paper_router(tmp_path):
    router = _text_router()
    save_router(tmp_path / "text", router, {"conditioning": "text"})
    assert json.loads((tmp_path / "text" / "config.json").read_text())["conditioning"] == "text"
    x, t, c = torch.randn(2, 3, 8, 8), torch.tensor([0.2, 0.9]), torch.randn(2, 6)
    with torch.no_grad():
        torch.testing.assert_close(load_router(tmp_path / "text")(x, t, c), router(x, t, c))
    # a router saved before the key existed: its config.json has neither conditioning nor caption_dim
    old = Router(**router_config("test", num_experts=3, sample_size=8, in_channels=3))
    save_router(tmp_path / "old", old, {"inputs": "x_t and t only"})
    config = json.loads((tmp_path / "old" / "config.json").read_text())
    for key in ("conditioning", "caption_dim"):
        config.pop(key)
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))
    loaded = load_router(tmp_path / "old")
    assert loaded.conditioning == "none" and router_conditioning(loaded) == "none"
    with torch.no_grad():
        torch.testing.assert_close(loaded(x, t), old.eval()(x, t))


class _Recorder(torch.nn.Module):
    """An expert stand-in that records the captions it is asked for; velocity = the caption's first state."""

    objective, converted = "fm", False

    def __init__(self):
        super().__init__()
        self.calls = []

    def velocity(self, x_t, t, cond, uncond=None, cfg_scale=1.0):
        self.calls.append((cond.states[:, 0, 0].clone(), None if uncond is None else uncond.states[:, 0, 0].clone()))
        v = lambda c: c.states[:, 0, :1, None, None].expand_as(x_t)  # noqa: E731
        return v(cond) if uncond is None else v(uncond) + cfg_scale * (v(cond) - v(uncond))


def test_cfg_branches_share_one_set_of_weights_from_the_conditional_caption():
    """The router is asked once per step, with the pooled conditional caption; the guided velocity is
    Σ_k w_k(c)·[v_k(∅) + s·(v_k(c) − v_k(∅))]."""
    seen = []

    class Router2(torch.nn.Module):
        conditioning = "text"

        def forward(self, x_t, t, caption):
            seen.append(caption.clone())
            return torch.stack([caption[:, 0] * 4, -caption[:, 0] * 4], -1)

    experts = {0: _Recorder(), 1: _Recorder()}
    ens = Ensemble(experts, Router2(), 2, routing="full")
    g = torch.Generator().manual_seed(0)
    cond = TextCond(torch.randn(3, 4, 6, generator=g), torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]]).float())
    uncond = TextCond(torch.randn(3, 4, 6, generator=g), torch.tensor([[1, 0, 0, 0]] * 3).float())
    x, t = torch.zeros(3, 1, 2, 2), torch.full((3,), 0.5)
    v = ens.velocity(x, t, cond, uncond, 3.0)
    assert len(seen) == 1
    torch.testing.assert_close(seen[0], pooled_caption(cond.states, cond.mask))
    w = torch.stack([seen[0][:, 0] * 4, -seen[0][:, 0] * 4], -1).softmax(-1)
    guided = uncond.states[:, 0, 0] + 3.0 * (cond.states[:, 0, 0] - uncond.states[:, 0, 0])
    torch.testing.assert_close(v[:, 0, 0, 0], (w * guided[:, None]).sum(-1))
    with pytest.raises(ValueError, match="reads the caption"):
        ens.posterior(x, t)


def test_caption_dropout_replaces_rows_by_the_empty_caption():
    g = torch.Generator().manual_seed(0)
    c, uncond = torch.randn(4000, 3, generator=g), torch.randn(1, 3, generator=g)
    out = drop_pooled_captions(c, uncond, 0.25, torch.Generator().manual_seed(1))
    dropped = (out == uncond).all(-1)
    assert ((out == c).all(-1) | dropped).all()
    assert abs(float(dropped.double().mean()) - 0.25) < 4 * (0.25 * 0.75 / 4000) ** 0.5
    assert (drop_pooled_captions(c, uncond, 0.0, g) == c).all() and (
        drop_pooled_captions(c, uncond, 1.0, g) == uncond
    ).all()


def test_config_names_the_conditioning():
    cfg = config_from_dict({"router": {"conditioning": "text", "caption_dropout": 0.2}}, "x.yaml")
    assert (cfg.router.conditioning, cfg.router.caption_dropout) == ("text", 0.2)
    assert config_from_dict({}, "x.yaml").router.conditioning == "none"
    for name in ("paper-2ddpm-6fm", "paper-8fm", "default"):
        assert load_config(Path(__file__).parent.parent / "configs" / f"{name}.yaml").router.conditioning == "none"


def test_the_router_stream_carries_each_captions_pooled_embedding(dataset_dir):
    """``pooled=True``: each training sample once (shuffled), with its own caption's pooled embedding (the same
    as text.pooled_caption of its stored states), and no token states in the batch."""

    split = Dataset.open(dataset_dir).split(None, "train")
    want = {
        x.numpy().tobytes(): (int(y), p) for x, y, p in zip(split.images, split.labels, pooled_caption(*split.cond))
    }
    seen = 0
    for x, y, caption in Dataset.open(dataset_dir).images(
        batch_size=16, split="train", seed=3, loop=False, pooled=True
    ):
        assert caption.shape == (len(x), split.cond.states.shape[-1])
        for xi, yi, ci in zip(x, y, caption):
            label, pooled = want.pop(xi.numpy().tobytes())
            assert label == int(yi)
            torch.testing.assert_close(ci, pooled, rtol=1e-5, atol=1e-6)
            seen += 1
    assert seen == len(split) and not want
