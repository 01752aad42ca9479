"""Prepared GPU check: does one XL/2 expert train on one 24 GB GPU?

One PixArt-α XL/2 expert at the paper's shapes (4×32×32 latents, 77×768 CLIP text states), batch 32, bf16
autocast, gradient checkpointing and fused AdamW — the settings of ``configs/paper-2ddpm-6fm.yaml`` — through the
project's own adapter and optimiser code. Reports peak memory (goal ≤ 24 GB), the median step time, images per
second and model FLOPs utilisation (model FLOPs counted with torch's FlopCounterMode on a step without
checkpointing, so recomputation does not count; peak bf16 throughput given by ``--peak-tflops``).

    python -m benchmarks.gpu_xl_step                      # on a CUDA machine
    python -m benchmarks.gpu_xl_step --device cpu --preset test --batch-size 2 --steps 2   # dry run

Writes ``benchmarks/results/gpu_xl_step.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.common import ROOT, write_result
from hddm_flower.experts import DDPMExpert, FlowMatchingExpert
from hddm_flower.models import ExpertNet, TextCond, expert_config
from hddm_flower.training import make_optimizer


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="XL/2")
    p.add_argument("--objective", choices=("fm", "ddpm"), default="fm")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=10, help="timed steps (after 3 warm-up steps)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--no-checkpointing", action="store_true")
    p.add_argument(
        "--ema-decay", type=float, default=0.9999, help="EMA of the weights, kept on the device as training keeps it "
        "(its copy counts in the peak memory); 0 = none"
    )  # fmt: skip
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the GPU (H100/H200: 989)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu_xl_step.json"))
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on a GPU machine, or pass --device cpu for a dry run")

    torch.manual_seed(0)
    config = expert_config(args.preset, sample_size=32, in_channels=4, caption_channels=768)
    net = ExpertNet.from_config(config).to(device)
    expert = FlowMatchingExpert(net) if args.objective == "fm" else DDPMExpert(net, "linear").to(device)
    params = sum(p.numel() for p in expert.parameters())
    B = args.batch_size
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(B, 4, 32, 32, generator=g).to(device)
    lengths = torch.randint(5, 78, (B,), generator=g)
    cond = TextCond(
        torch.randn(B, 77, 768, generator=g).to(device), (torch.arange(77)[None] < lengths[:, None]).float().to(device)
    )
    opt = make_optimizer(list(expert.parameters()), 1e-4, 0.0, "auto", device)
    ema = None
    if args.ema_decay:
        from diffusers.training_utils import EMAModel  # as training.fit keeps it: a float32 copy on the device

        ema = EMAModel(list(expert.parameters()), decay=args.ema_decay)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = expert.training_loss(x0, cond, generator=g)  # a CPU generator, as in training.fit
        loss.backward()
        torch.nn.utils.clip_grad_norm_(expert.parameters(), 1.0)
        opt.step()
        if ema is not None:
            ema.step(expert.parameters())
        return loss.item()

    # model FLOPs of one training step (forward + backward), without recomputation
    with FlopCounterMode(display=False) as counter:
        step()
    flops_per_step = counter.get_total_flops()

    if not args.no_checkpointing:
        net.transformer.enable_gradient_checkpointing()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(3):  # warm-up
        step()
    times = []
    for _ in range(args.steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    result = {
        "preset": args.preset,
        "objective": args.objective,
        "parameters": params,
        "batch_size": B,
        "input": "4x32x32 latents, 77x768 text states",
        "precision": "bf16 autocast, fp32 master weights",
        "gradient_checkpointing": not args.no_checkpointing,
        "optimizer": "AdamW (fused on CUDA)",
        "ema_decay": args.ema_decay,  # > 0: the EMA copy is in the peak memory
        "step_seconds_median": median,
        "step_seconds": times,
        "images_per_second": B / median,
        "model_flops_per_step": flops_per_step,
        "mfu": flops_per_step / median / (args.peak_tflops * 1e12) if device.type == "cuda" else None,
        "peak_tflops_assumed": args.peak_tflops,
        "peak_memory_allocated_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        "peak_memory_reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30 if device.type == "cuda" else None,
        "goal": "peak memory <= 24 GB on one GPU",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_result(out, result)
    print(json.dumps({k: v for k, v in result.items() if k != "step_seconds"}, indent=2))
    return result


if __name__ == "__main__":
    main()
