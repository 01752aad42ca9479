"""The training loop: exact resume from a local checkpoint, EMA export, accumulation, bf16, checkpointing."""

import dataclasses

import pytest
import torch

from hddm_flower.config_sections import ExpertConfig, OptimConfig
from hddm_flower.data import load_split, load_uncond
from hddm_flower.experts import FlowMatchingExpert
from hddm_flower.models import ExpertNet, expert_config
from hddm_flower.training import fit, train_expert


def _expert(seed=0):
    torch.manual_seed(seed)
    return FlowMatchingExpert(
        ExpertNet.from_config(expert_config("test", sample_size=16, in_channels=3, caption_channels=384))
    )


@pytest.fixture(scope="module")
def data(dataset_dir):
    return load_split(dataset_dir, [0], "train"), load_uncond(dataset_dir)


def _train(expert, data, checkpoint=None, **kw):
    """Train with the expert section ``expert: {steps: 6, batch_size: 4, optim: {warmup_steps: 2}, …}`` + ``kw``."""
    split, uncond = data
    optim = OptimConfig(lr=1e-3, warmup_steps=2, implementation=kw.pop("optimizer", "auto"))
    options = ExpertConfig(steps=6, batch_size=4, optim=optim, seed=1, log_every=1)
    options = dataclasses.replace(options, **kw).validate()
    return train_expert(expert, split, uncond, options, checkpoint=checkpoint)


def test_resume_continues_exactly(data, tmp_path):
    straight = _expert()
    _train(straight, data)

    interrupted, ckpt = _expert(), tmp_path / "state.pt"
    calls = {"n": 0}
    original = interrupted.training_loss

    def crashing(*a, **k):  # the node dies during step 5
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return original(*a, **k)

    interrupted.training_loss = crashing
    with pytest.raises(KeyboardInterrupt):
        _train(interrupted, data, checkpoint=ckpt, checkpoint_every=3)
    assert ckpt.exists()

    resumed = _expert(seed=123)  # a fresh process: other initial weights, restored from the checkpoint
    stats = _train(resumed, data, checkpoint=ckpt, checkpoint_every=3)
    assert stats.steps == 6 and [s for s, _ in stats.loss_curve] == [1, 2, 3, 4, 5, 6]
    for (k, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)


def test_ema_is_exported_and_differs_from_raw_weights(data):
    raw, ema = _expert(), _expert()
    _train(raw, data)
    stats = _train(ema, data, ema_decay=0.9)
    assert stats.ema
    w_raw = raw.net.transformer.proj_out.weight
    w_ema = ema.net.transformer.proj_out.weight
    assert not torch.allclose(w_raw, w_ema)


def test_gradient_checkpointing_changes_nothing_but_memory(data):
    a, b = _expert(), _expert()
    _train(a, data, steps=2)
    _train(b, data, steps=2, gradient_checkpointing=True)
    for (k, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=0, msg=k)
    assert not b.net.transformer.gradient_checkpointing  # switched off again after training


@pytest.mark.parametrize("optimizer", ["fused", "foreach", "default"])
def test_optimizer_implementations_agree(data, optimizer):
    ref, other = _expert(), _expert()
    _train(ref, data, steps=2, optimizer="default")
    _train(other, data, steps=2, optimizer=optimizer)
    for x, y in zip(ref.parameters(), other.parameters()):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)


def test_accumulation_and_bf16(data):
    stats = _train(_expert(), data, steps=2, grad_accumulation=3, mixed_precision="bf16")
    assert stats.images_seen == 2 * 4 * 3 and stats.final_loss == stats.final_loss  # finite, not NaN
    with pytest.raises(ValueError, match="unknown mixed precision 'fp8'"):
        fit(_expert(), lambda g: torch.zeros(()), OptimConfig(), steps=1, mixed_precision="fp8")
