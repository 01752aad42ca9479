"""Where a Gaussian-mixture expert's training step goes: the evidence set's `nano` expert (its dataset's shapes, an
expert's batch), one optimiser step as :func:`hddm_flower.training.fit` takes it, eager and under ``torch.compile``,
its matmul FLOPs, and the forward + backward of the training's 8 experts one after another against the same 8 as
one vectorised model (``torch.func.stack_module_state`` + ``vmap``).

    python -m benchmarks.gmm_train_step [--config configs/reproduce-gmm-subspace.yaml] [--steps 300] [--reps 3]

What it answers: whether the ~16–20 ms a step is per-operation overhead (then compiling or vectorising the experts
would cut it severalfold) or arithmetic at these shapes (then only fewer FLOPs or more cores would). Random inputs
of the dataset's shapes (the FLOPs do not depend on the values); one torch thread (a ``--jobs`` worker's share).
Writes ``benchmarks/results/gmm_train_step.{json,md}``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.func import functional_call, grad_and_value, stack_module_state, vmap
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.common import RESULTS, commit, load_at_start, machine, write_result
from hddm_flower.budget import expert_config as budget_expert_config
from hddm_flower.config.io import load_config
from hddm_flower.experts import FlowMatchingExpert
from hddm_flower.models import ExpertNet, TextCond, expert_config
from hddm_flower.stages.prepare import prepare_data
from hddm_flower.training import fit


def shapes(config: str) -> dict:
    cfg = load_config(config)
    meta = prepare_data(cfg).meta
    e = budget_expert_config(cfg).expert
    return {
        "preset": e.preset,
        "batch": e.batch_size,
        "channels": meta["channels"],
        "image_size": meta["image_size"],
        "text_dim": meta["text_dim"],
        "caption_tokens": meta["max_caption_tokens"],
        "num_experts": cfg.num_experts,
        "optim": e.optim,
    }


def net(s: dict, seed: int) -> ExpertNet:
    torch.manual_seed(seed)
    cfg = expert_config(
        s["preset"], sample_size=s["image_size"], in_channels=s["channels"], caption_channels=s["text_dim"]
    )
    return ExpertNet.from_config(cfg)


def batch(s: dict, g: torch.Generator, k: int | None = None) -> tuple[torch.Tensor, TextCond]:
    lead = (s["batch"],) if k is None else (k, s["batch"])
    x0 = torch.randn(*lead, s["channels"], s["image_size"], s["image_size"], generator=g)
    states = torch.randn(*lead, s["caption_tokens"], s["text_dim"], generator=g)
    return x0, TextCond(states, torch.ones(*lead, s["caption_tokens"]))


def fit_ms(s: dict, steps: int, compiled: bool) -> float:
    """Milliseconds per optimiser step of ``fit`` (fused AdamW, warm-up, clipping) on one FM expert."""
    expert = FlowMatchingExpert(net(s, 0))
    if compiled:
        expert.net.transformer = torch.compile(expert.net.transformer, dynamic=False)
    x0, cond = batch(s, torch.Generator().manual_seed(1))

    def loss_fn(g):
        return expert.training_loss(x0, cond, generator=g)

    fit(expert, loss_fn, s["optim"], steps=5, log_every=10**9)  # warm-up (and, compiled, the compilation)
    start = time.perf_counter()
    fit(expert, loss_fn, s["optim"], steps=steps, log_every=10**9)
    return (time.perf_counter() - start) / steps * 1e3


def flops_per_step(s: dict) -> int:
    expert = FlowMatchingExpert(net(s, 0))
    x0, cond = batch(s, torch.Generator().manual_seed(1))
    with FlopCounterMode(display=False) as counter:
        expert.training_loss(x0, cond, generator=torch.Generator().manual_seed(2)).backward()
    return counter.get_total_flops()


def experts_ms(s: dict, steps: int) -> dict[str, float]:
    """Forward + backward of K experts on K batches: one after another, and as one vmapped model."""
    k = s["num_experts"]
    nets = [net(s, i) for i in range(k)]
    x0, cond = batch(s, torch.Generator().manual_seed(1), k)
    t = torch.rand(k, s["batch"], generator=torch.Generator().manual_seed(3)) * 999

    def loop() -> None:
        for i, n in enumerate(nets):
            n.zero_grad(set_to_none=True)
            ((n(x0[i], t[i], TextCond(cond.states[i], cond.mask[i])) - x0[i]) ** 2).mean().backward()

    params, buffers = stack_module_state(nets)
    skeleton = copy.deepcopy(nets[0]).to("meta")

    def loss(p, b, x, tt, states, mask):
        return ((functional_call(skeleton, (p, b), (x, tt, TextCond(states, mask))) - x) ** 2).mean()

    step = vmap(grad_and_value(loss))

    def vectorised() -> None:
        step(params, buffers, x0, t, cond.states, cond.mask)

    out = {}
    for name, fn in (("one_after_another", loop), ("vmap", vectorised)):
        fn()
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        out[name] = (time.perf_counter() - start) / steps * 1e3
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="configs/reproduce-gmm-subspace.yaml")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", default=str(RESULTS / "gmm_train_step"))
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    s = shapes(args.config)
    load = load_at_start()
    reps = []
    for _ in range(args.reps):
        r = {"eager_ms": fit_ms(s, args.steps, False)}
        r |= {f"{k}_ms": v for k, v in experts_ms(s, args.steps // 4).items()}
        reps.append(r)
    compiled = fit_ms(s, args.steps, True)  # once: the compilation is cached within the process
    med = {k: statistics.median(r[k] for r in reps) for k in reps[0]}
    flops = flops_per_step(s)
    record = {
        "command": "python -m benchmarks.gmm_train_step " + " ".join(sys.argv[1:] if argv is None else argv),
        "config": args.config,
        "shapes": {k: v for k, v in s.items() if k != "optim"},
        "machine": machine() + ", 1 torch thread",
        "load_at_start": load,
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d"),
        "versions": {"torch": torch.__version__},
        "repetitions": reps,
        "median": med,
        "compiled_ms": compiled,
        "matmul_gflop_per_step": flops / 1e9,
        "gflop_per_s_eager": flops / 1e9 / (med["eager_ms"] / 1e3),
    }
    write_result(f"{args.out}.json", record)
    lines = [
        "# One optimiser step of a Gaussian-mixture expert",
        "",
        f"`{record['command'].strip()}`; {record['machine']}; {load}; commit {record['commit']}; "
        f"{record['date']}. Shapes: {record['shapes']}. Medians over {args.reps} repetitions "
        f"({args.steps} steps each; the K-expert arms {args.steps // 4} each); the compiled arm once.",
        "",
        "| what | ms |",
        "|---|---|",
        f"| one step of `fit`, eager | {med['eager_ms']:.1f} |",
        f"| one step of `fit`, `torch.compile` (inductor) | {compiled:.1f} |",
        f"| forward + backward of {s['num_experts']} experts, one after another | {med['one_after_another_ms']:.1f} |",
        f"| the same {s['num_experts']} as one vmapped model | {med['vmap_ms']:.1f} |",
        "",
        f"Matmul FLOPs per step: {record['matmul_gflop_per_step']:.3f} GFLOP, i.e. "
        f"{record['gflop_per_s_eager']:.1f} GFLOP/s eager.",
        "",
    ]
    Path(f"{args.out}.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return record


if __name__ == "__main__":
    main()
