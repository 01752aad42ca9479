#!/usr/bin/env python3
"""The coordinator's kernels on a device, at the paper's shapes (random weights; nothing downloaded).

* ``router``: B/2 router training steps (bf16 autocast, batch 256, 4×32×32 latents): steps/s and images/s;
* ``vae_decode``: the SD VAE decoder (``sd-vae-ft-mse`` architecture) on 32² latents → 256² images: images/s;
* ``inception``: Inception-v3 (the FID network's architecture, torchvision, 299² inputs, fp32) features: images/s.

The FID Inception's own weights (torch-fidelity) and the VAE's are not on these machines; random weights cost the
same FLOPs. ``--dry-run`` uses tiny shapes on the CPU (the test suite runs it).

    python -m benchmarks.gpu_coordinator --device cuda
    python -m benchmarks.gpu_coordinator --dry-run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import ROOT, write_result


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def bench_router(device: torch.device, preset: str, batch: int, size: int, steps: int, bf16: bool) -> dict:
    from hddm_flower.config.sections import RouterConfig
    from hddm_flower.models import Router, router_config
    from hddm_flower.training import train_router

    router = Router(**router_config(preset, num_experts=8, sample_size=size, in_channels=4))
    x = torch.randn(batch, 4, size, size, device=device)
    y = torch.randint(0, 8, (batch,), device=device)

    def batches():
        while True:
            yield x, y

    options = RouterConfig(preset=preset, batch_size=batch, log_every=10**9)
    prec = "bf16" if bf16 else "no"
    train_router(router, batches(), options, steps=2, device=device, mixed_precision=prec)  # warm-up
    _sync(device)
    t0 = time.perf_counter()
    stats = train_router(router, batches(), options, steps=steps, device=device, mixed_precision=prec)
    _sync(device)
    s = time.perf_counter() - t0
    params = sum(p.numel() for p in router.parameters())
    return {
        "preset": preset,
        "parameters": params,
        "batch_size": batch,
        "steps": steps,
        "steps_per_s": steps / s,
        "images_per_s": steps * batch / s,
        "mixed_precision": prec,
        "final_loss": stats.final_loss,
        "peak_memory_gib": _peak(device),
    }


@torch.no_grad()
def bench_vae(device: torch.device, tiny: bool, batch: int, reps: int) -> dict:
    from diffusers import AutoencoderKL

    if tiny:
        vae = AutoencoderKL(block_out_channels=(8, 8), layers_per_block=1, latent_channels=4, norm_num_groups=4)
        size = 8
    else:  # the sd-vae-ft-mse architecture (83.7M parameters)
        vae = AutoencoderKL(
            in_channels=3,
            out_channels=3,
            down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4,
            block_out_channels=(128, 256, 512, 512),
            layers_per_block=2,
            latent_channels=4,
            sample_size=256,
        )
        size = 32
    vae = vae.to(device).eval()
    z = torch.randn(batch, 4, size, size, device=device)
    vae.decode(z)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        img = vae.decode(z).sample
    _sync(device)
    s = time.perf_counter() - t0
    return {
        "latent": [4, size, size],
        "image": list(img.shape[1:]),
        "batch_size": batch,
        "images_per_s": reps * batch / s,
        "dtype": "float32",
        "peak_memory_gib": _peak(device),
    }


@torch.no_grad()
def bench_inception(device: torch.device, size: int, batch: int, reps: int) -> dict:
    from torchvision.models import inception_v3

    net = inception_v3(weights=None, aux_logits=False, init_weights=False).to(device).eval()
    net.fc = torch.nn.Identity()  # the 2048-d pool features FID uses
    x = torch.randn(batch, 3, size, size, device=device)
    net(x)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        f = net(x)
    _sync(device)
    s = time.perf_counter() - t0
    return {
        "input": [3, size, size],
        "features": int(f.shape[1]),
        "batch_size": batch,
        "images_per_s": reps * batch / s,
        "dtype": "float32",
        "peak_memory_gib": _peak(device),
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, 1–2 steps")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu_coordinator.json"))
    args = p.parse_args(argv)
    dry = args.dry_run
    device = torch.device("cpu" if dry else args.device)
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "router": bench_router(
            device, "test" if dry else "B/2", 4 if dry else 256, 8 if dry else 32, 1 if dry else 30, not dry
        ),
        "vae_decode": bench_vae(device, dry, 2 if dry else 32, 1 if dry else 5),
        "inception": bench_inception(device, 75 if dry else 299, 2 if dry else 200, 1 if dry else 5),
        "command": " ".join(["python -m benchmarks.gpu_coordinator", *(sys.argv[1:] if argv is None else argv)]),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_result(out, result)
    return result


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
