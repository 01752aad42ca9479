"""The training loop: exact resume from a local checkpoint, EMA export, accumulation, bf16, checkpointing."""

import dataclasses
import math

import pytest
import torch

from hddm_flower.config.sections import ExpertConfig, OptimConfig
from hddm_flower.data import Dataset
from hddm_flower.experts import FlowMatchingExpert
from hddm_flower.models import ExpertNet, expert_config
from hddm_flower.training import fit, lr_factor, train_expert


def _expert(seed=0):
    torch.manual_seed(seed)
    return FlowMatchingExpert(
        ExpertNet.from_config(expert_config("test", sample_size=16, in_channels=3, caption_channels=384))
    )


@pytest.fixture(scope="module")
def data(dataset_dir):
    return Dataset.open(dataset_dir).split([0], "train"), Dataset.open(dataset_dir).uncond


def _train(expert, data, checkpoint=None, **kw):
    """Train with the expert section ``expert: {steps: 6, batch_size: 4, optim: {warmup_steps: 2}, …}`` + ``kw``."""
    split, uncond = data
    optim = OptimConfig(
        lr=1e-3, warmup_steps=2, implementation=kw.pop("optimizer", "auto"), schedule=kw.pop("schedule", "constant")
    )
    options = ExpertConfig(steps=6, batch_size=4, optim=optim, seed=1, log_every=1)
    options = dataclasses.replace(options, **kw).validate()
    return train_expert(expert, split, uncond, options, checkpoint=checkpoint)


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_resume_continues_exactly(data, tmp_path, schedule):
    straight = _expert()
    _train(straight, data, schedule=schedule)

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
        _train(interrupted, data, checkpoint=ckpt, checkpoint_every=3, schedule=schedule)
    assert ckpt.exists()

    resumed = _expert(seed=123)  # a fresh process: other initial weights, restored from the checkpoint
    stats = _train(resumed, data, checkpoint=ckpt, checkpoint_every=3, schedule=schedule)
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


@pytest.mark.parametrize("warmup", [0, 1, 5])
@pytest.mark.parametrize("min_ratio", [0.0, 0.1])
def test_learning_rate_schedules_match_their_closed_form(warmup, min_ratio):
    """Warm-up (s + 1)/w, then constant, or ½(1 + cos π·(s − w)/(S − w)) from 1 to min_lr_ratio; through torch's
    LambdaLR as fit() drives it, at every step including the first and the last."""
    steps, lr = 20, 2e-3
    for schedule in ("constant", "cosine"):
        optim = OptimConfig(lr=lr, warmup_steps=warmup, schedule=schedule, min_lr_ratio=min_ratio).validate()
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))], lr=lr)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, optim, steps))
        for s in range(steps):
            if s < warmup:
                want = (s + 1) / warmup
            elif schedule == "constant":
                want = 1.0
            else:
                want = min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * (s - warmup) / (steps - warmup)))
            assert opt.param_groups[0]["lr"] == pytest.approx(lr * want, rel=1e-12, abs=1e-15), (schedule, s)
            opt.step()
            sched.step()
        if schedule == "cosine":  # the end of the warm-up is the top, and the decay ends just above the floor
            assert lr_factor(warmup, optim, steps) == 1.0
            assert min_ratio < lr_factor(steps - 1, optim, steps) < 0.05 + min_ratio
            assert lr_factor(steps, optim, steps) == pytest.approx(min_ratio)
