"""Benchmark: what routed ensemble sampling costs, against a per-sample routing loop and against one expert.

Three samplers integrate the same FM Euler steps from the same noise, batch, prompts and CFG scale:

* **grouped top-k** (``hddm_flower.ensemble.sample_ensemble``): one router call per step on the whole batch; each
  selected expert runs once per step on the rows routed to it;
* **per-sample loop**: the router still runs batched, but every sample calls its k experts on its own (batch 1),
  the way a routing loop is first written;
* **one expert**: a single expert on the whole batch (the floor: the ensemble's top-2 cannot cost less than two
  expert calls per row);
* **dense** (``Ensemble(dispatch="dense")``): every expert on every row, the mixing weights zeroing what was not
  routed; the step loop reads nothing back from the device, where grouped reads the experts' row counts once per
  step. On a GPU, grouped against dense is what that one read per step costs against K / k times the experts'
  arithmetic.

The ensemble is the config's: K experts with the config's objective mix (DDPM experts go through the conversion)
and router preset, random weights (speed does not depend on them) or a trained run (``--run-dir``). Each
repetition times each sampler once (order rotating); figures are medians over ``--reps``, ratios are taken within
a repetition; on CPU the clock is the process's CPU time (robust on a shared machine), on a GPU wall time.
Goals: grouped ≥ 3× faster than the loop at batch 64; grouped ≤ 2.2× one expert for top-2.

    python -m benchmarks.sampling                       # default config, batch 64, 10 steps, 1 thread
    python -m benchmarks.sampling --run-dir ~/hddm-runs/run-1 --threads 2

Writes ``benchmarks/results/sampling.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import ROOT, commit, machine, write_result
from hddm_flower.config.io import load_config, parse_overrides
from hddm_flower.ensemble import Ensemble, euler_sample, routing_weights, sample_ensemble
from hddm_flower.experts import map_cond
from hddm_flower.models import Router, TextCond, router_config
from hddm_flower.provenance import versions
from hddm_flower.stages.assemble import load_ensemble
from hddm_flower.stages.expert import build_expert


def per_sample_velocity(ens: Ensemble, x, t, cond, uncond, cfg_scale: float):
    """Reference routing: batched router, then each sample's selected experts called on that sample alone."""
    w = routing_weights(ens.posterior(x, t), ens.routing, k=ens.k, threshold=ens.threshold).to(x.dtype)
    v = torch.zeros_like(x)
    for i in range(x.shape[0]):
        one = lambda c: c[i : i + 1]  # noqa: E731
        for k in w[i].nonzero().flatten().tolist():
            v[i : i + 1] += w[i, k] * ens.experts[str(k)].velocity(
                x[i : i + 1], t[i : i + 1], map_cond(one, cond), map_cond(one, uncond), cfg_scale
            )
    return v


def random_ensemble(cfg, *, size: int, channels: int, text_dim: int, device: str = "cpu") -> Ensemble:
    """The config's ensemble with random weights, built directly on ``device``."""
    torch.manual_seed(0)
    meta = {"image_size": size, "channels": channels, "text_dim": text_dim}
    objectives = cfg.objective_of(list(range(cfg.num_experts)))  # 'auto' → the highest ids get DDPM
    experts = {}
    with torch.device(device):
        for k, objective in enumerate(objectives):
            experts[k] = build_expert(cfg, meta, objective, expert_id=k)[0]
            if objective == "ddpm":
                experts[k].t_eps, experts[k].x0_clamp = cfg.sampling.t_eps, cfg.sampling.x0_clamp
        router = Router(
            **router_config(cfg.router.preset, num_experts=cfg.num_experts, sample_size=size, in_channels=channels)
        )
    s = cfg.sampling
    ens = Ensemble(experts, router, cfg.num_experts, routing=s.routing, k=s.top_k, threshold=s.threshold)
    return ens.to(device).eval()


def _device_name(dev: torch.device) -> str:
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"cpu ({platform.processor() or 'unknown'})"


@torch.no_grad()
def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs" / "default.yaml"))
    p.add_argument("--run-dir", default=None, help="a finished run (trained experts + router); default random")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=10, help="Euler steps (equal for every sampler)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--samplers", default="grouped,per_sample,one_expert", help="comma-separated subset to time")
    p.add_argument("--device", default="cpu")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (GPU); weights and the conversion stay fp32")
    p.add_argument("--size", type=int, default=None, help="input side (default: the config's image size)")
    p.add_argument("--channels", type=int, default=3, help="input channels (4 for SD-VAE latents)")
    p.add_argument("--text-dim", type=int, default=384, help="text state width (MiniLM 384, CLIP L/14 768)")
    p.add_argument("--text-len", type=int, default=None, help="text tokens (default: the config's)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "sampling.json"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = load_config(args.config, parse_overrides(" ".join(args.set)))
    s, B, dev = cfg.sampling, args.batch_size, torch.device(args.device)
    if args.run_dir:
        ens = load_ensemble(cfg, Path(args.run_dir).expanduser())[0].to(dev).eval()
    else:
        ens = random_ensemble(
            cfg,
            size=args.size or cfg.data.image_size,
            channels=args.channels,
            text_dim=args.text_dim,
            device=args.device,
        )
    size, C = ens.router.config.sample_size, ens.router.config.in_channels
    some = next(iter(ens.experts.values())).net.transformer.config
    L, D = args.text_len or cfg.data.max_caption_tokens, some.caption_channels
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(2, L + 1, (B,), generator=g)
    cond = TextCond(
        torch.randn(B, L, D, generator=g).to(dev), (torch.arange(L)[None] < lengths[:, None]).float().to(dev)
    )
    uncond = TextCond(
        torch.randn(1, L, D, generator=g).expand(B, -1, -1).to(dev),
        (torch.arange(L)[None] < 2).float().expand(B, -1).to(dev),
    )
    noise = torch.randn(B, C, size, size, generator=g).to(dev)
    single = next(iter(ens.experts.values()))
    dense = copy.copy(ens)  # the same modules, every expert on every row
    dense.dispatch = "dense"
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.bf16)

    def timed(fn):
        """Wall time on a GPU; process CPU time on CPU (robust on a shared machine with one thread)."""
        with autocast:
            t0, c0 = time.perf_counter(), time.process_time()
            out = fn()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
                return out, time.perf_counter() - t0
            return out, time.process_time() - c0

    samplers = {
        "grouped": lambda: sample_ensemble(ens, noise, cond, uncond, num_steps=args.steps, cfg_scale=s.cfg_scale),
        "per_sample": lambda: euler_sample(
            lambda x, t: per_sample_velocity(ens, x, t, cond, uncond, s.cfg_scale), noise, args.steps
        ),
        "one_expert": lambda: euler_sample(
            lambda x, t: single.velocity(x, t, cond, uncond, s.cfg_scale), noise, args.steps
        ),
        "dense": lambda: sample_ensemble(dense, noise, cond, uncond, num_steps=args.steps, cfg_scale=s.cfg_scale),
    }
    names = args.samplers.split(",")
    unknown = set(names) - set(samplers)
    if unknown:
        raise SystemExit(f"--samplers: unknown {sorted(unknown)}; expected some of {list(samplers)}")
    load = [round(x, 2) for x in os.getloadavg()]
    warm = {name: timed(samplers[name])[0] for name in names}  # warm-up (kernels, allocator)
    check = (
        (warm["grouped"] - warm["per_sample"]).abs().max().item() if {"grouped", "per_sample"} <= set(names) else None
    )
    dense_check = (warm["grouped"] - warm["dense"]).abs().max().item() if {"grouped", "dense"} <= set(names) else None
    times: dict[str, list[float]] = {k: [] for k in names}
    for rep in range(args.reps):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            times[name].append(timed(samplers[name])[1])

    def ratio(a, b):
        return statistics.median(x / y for x, y in zip(times[a], times[b])) if a in times and b in times else None

    result = {
        "what": f"ensemble sampling cost: grouped {s.routing} (k={s.top_k}) vs {', '.join(n for n in names if n != 'grouped')}",
        "command": " ".join(["python -m benchmarks.sampling", *(sys.argv[1:] if argv is None else argv)]),
        "machine": machine(),
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average_at_start": load,
        "ensemble": args.run_dir
        or f"random weights, {cfg.num_experts} experts ({cfg.expert.preset}), router {cfg.router.preset}",
        "batch_size": B,
        "steps": args.steps,
        "cfg_scale": s.cfg_scale,
        "threads": args.threads,
        "reps": args.reps,
        "input": f"{C}x{size}x{size}, {L}x{D} text states",
        "device": _device_name(dev),
        "precision": "bf16 autocast" if args.bf16 else "fp32",
        "clock": "wall time (GPU)" if dev.type == "cuda" else "process CPU time",
        "seconds_median": {k: statistics.median(v) for k, v in times.items()},
        "images_per_s": {k: B / statistics.median(v) for k, v in times.items()},
        "grouped_speedup_over_per_sample": ratio("per_sample", "grouped"),
        "grouped_cost_over_one_expert": ratio("grouped", "one_expert"),
        "dense_cost_over_grouped": ratio("dense", "grouped"),
        "max_abs_diff_grouped_vs_per_sample": check,
        "max_abs_diff_grouped_vs_dense": dense_check,
        "goals": {
            "grouped_speedup_over_per_sample": ">= 3 at batch 64",
            "grouped_cost_over_one_expert": "<= 2.2 for top-2",
        },
        "seconds_all": times,
        "versions": versions(),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_result(out, result)
    print(json.dumps({k: v for k, v in result.items() if k not in ("seconds_all", "versions")}, indent=2))
    return result


if __name__ == "__main__":
    main()
