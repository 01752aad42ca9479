"""Benchmark: expert training throughput against the loop a user would write from the diffusers examples.

Both sides train the same ``PixArtTransformer2DModel`` (the default config's preset, fresh weights from the same
seed) on the same in-memory cluster of the embedded dataset, at the same batch, precision, thread count, learning
rate, warm-up, gradient clipping and caption dropout:

* **ours**: ``hddm_flower.training.train_expert`` — the code a client runs (adapter loss, seeded generator,
  AdamW ``auto`` implementation, progress/log/checkpoint hooks);
* **plain**: an idiomatic loop after diffusers' ``train_text_to_image.py`` / PixArt / SD3 examples in plain
  PyTorch (no Accelerate wrapper): ``torch.optim.AdamW`` with its defaults, ``get_scheduler("constant_with_warmup")``,
  ``DDPMScheduler.add_noise`` for ε-prediction, ``(1 − σ)·x + σ·noise`` with target ``noise − x`` for flow matching.

Each repetition times ``--steps`` optimiser steps of each side (order alternating between repetitions, after one
untimed warm-up run of each); the figure is the median over ``--reps`` repetitions of samples/s and the ratio
ours / plain measured within the same repetition. Samples/s are per second of the process's CPU time, which a
busy shared machine disturbs far less than wall time (with one torch thread they are the same on an idle one);
the wall-clock figures are recorded beside them.

    python -m benchmarks.train_step                 # default preset/batch, 1 thread (an actor's CPU share)
    python -m benchmarks.train_step --threads 2 --objective ddpm

Writes ``benchmarks/results/train_step.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from diffusers import DDPMScheduler
from diffusers.optimization import get_scheduler

from benchmarks.common import ROOT, write_result
from hddm_flower.config.io import load_config
from hddm_flower.models import ExpertNet
from hddm_flower.provenance import versions
from hddm_flower.stages.expert import build_expert
from hddm_flower.stages.prepare import prepare_data
from hddm_flower.training import train_expert


def plain_diffusers_loop(
    transformer,
    data,
    uncond,
    *,
    objective: str,
    steps: int,
    batch_size: int,
    lr: float,
    warmup_steps: int,
    grad_clip: float,
    caption_dropout: float,
    schedule: str,
) -> None:
    """The training loop of the diffusers examples, on the model a user gets from ``from_config``."""
    optimizer = torch.optim.AdamW(transformer.parameters(), lr=lr)
    lr_scheduler = get_scheduler("constant_with_warmup", optimizer=optimizer, num_warmup_steps=warmup_steps)
    noise_scheduler = DDPMScheduler(
        num_train_timesteps=1000, beta_schedule="squaredcos_cap_v2" if schedule == "cosine" else "linear"
    )
    transformer.train()
    for _ in range(steps):
        idx = torch.randint(0, len(data), (batch_size,))
        latents, (states, mask) = data.batch(idx)
        drop = torch.rand(batch_size) < caption_dropout  # empty caption for classifier-free guidance
        states = torch.where(drop[:, None, None], uncond.states, states)
        mask = torch.where(drop[:, None], uncond.mask, mask)
        noise = torch.randn_like(latents)
        if objective == "ddpm":
            timesteps = torch.randint(0, noise_scheduler.config.num_train_timesteps, (batch_size,))
            noisy = noise_scheduler.add_noise(latents, noise, timesteps)
            target = noise
        else:
            sigmas = torch.rand(batch_size)
            noisy = (1 - sigmas[:, None, None, None]) * latents + sigmas[:, None, None, None] * noise
            timesteps, target = sigmas * 999, noise - latents
        model_pred = transformer(
            noisy,
            encoder_hidden_states=states,
            encoder_attention_mask=mask,
            timestep=timesteps,
            added_cond_kwargs={"resolution": None, "aspect_ratio": None},
            return_dict=False,
        )[0]
        loss = F.mse_loss(model_pred.float(), target.float(), reduction="mean")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(transformer.parameters(), grad_clip)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs" / "default.yaml"))
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--objective", choices=("fm", "ddpm"), default="fm")
    p.add_argument("--cluster", type=int, default=0)
    p.add_argument("--steps", type=int, default=30, help="timed optimiser steps per side and repetition")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch threads (a simulated client gets 1 CPU)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "train_step.json"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = load_config(args.config)
    e = cfg.expert
    dataset = prepare_data(cfg, args.cache_dir)
    meta, data, uncond = dataset.meta, dataset.split([args.cluster]), dataset.uncond

    def fresh():
        torch.manual_seed(0)
        return build_expert(cfg, meta, args.objective)[0]

    def ours(steps: int) -> None:
        train_expert(fresh(), data, uncond, dataclasses.replace(e, steps=steps, log_every=10**9))

    def plain(steps: int) -> None:
        net: ExpertNet = fresh().net
        plain_diffusers_loop(
            net.transformer,
            data,
            uncond,
            objective=args.objective,
            steps=steps,
            batch_size=e.batch_size,
            lr=e.optim.lr,
            warmup_steps=e.optim.warmup_steps,
            grad_clip=e.optim.grad_clip,
            caption_dropout=e.caption_dropout,
            schedule=cfg.ddpm.schedule,
        )

    sides = {"ours": ours, "plain": plain}
    for fn in sides.values():  # warm-up: allocator, kernels, lazy imports
        fn(3)
    rates: dict[str, list[float]] = {k: [] for k in sides}  # samples per second of process CPU time
    wall: dict[str, list[float]] = {k: [] for k in sides}  # samples per second of wall time
    ratios = []
    for rep in range(args.reps):
        order = list(sides) if rep % 2 == 0 else list(sides)[::-1]
        for name in order:
            t0, c0 = time.perf_counter(), time.process_time()
            sides[name](args.steps)
            rates[name].append(args.steps * e.batch_size / (time.process_time() - c0))
            wall[name].append(args.steps * e.batch_size / (time.perf_counter() - t0))
        ratios.append(rates["ours"][-1] / rates["plain"][-1])
    result = {
        "what": "expert training throughput: hddm train_expert vs a plain diffusers-examples loop",
        "command": " ".join(["python -m benchmarks.train_step", *(sys.argv[1:] if argv is None else argv)]),
        "preset": e.preset,
        "objective": args.objective,
        "batch_size": e.batch_size,
        "input": f"{meta['channels']}x{meta['image_size']}x{meta['image_size']} pixels, "
        f"{meta['max_caption_tokens']}x{meta['text_dim']} text states",
        "precision": e.mixed_precision,
        "threads": args.threads,
        "steps_per_rep": args.steps,
        "reps": args.reps,
        "clock": "process CPU time (robust on a shared machine with 1 thread); wall-clock figures beside it",
        "samples_per_s": {k: statistics.median(v) for k, v in rates.items()},
        "samples_per_s_wall": {k: statistics.median(v) for k, v in wall.items()},
        "samples_per_s_all": rates,
        "ratio_ours_over_plain": statistics.median(ratios),
        "ratios": ratios,
        "ratio_ours_over_plain_wall": statistics.median(a / b for a, b in zip(wall["ours"], wall["plain"])),
        "goal": "ratio >= 1.0",
        "versions": versions(),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_result(out, result)
    print(json.dumps({k: v for k, v in result.items() if k not in ("samples_per_s_all", "versions")}, indent=2))
    return result


if __name__ == "__main__":
    main()
