"""Where a Gaussian-mixture expert's training step goes: the evidence set's `nano` expert (its dataset's shapes, an
expert's batch), one optimiser step as :func:`hddm_flower.training.fit` takes it, eager and under ``torch.compile``,
its matmul FLOPs, and the forward + backward of the training's 8 experts one after another against the same 8 as
one vectorised model (``torch.func.stack_module_state`` + ``vmap``), and two kernel swaps that change the
network's bits: attention as a plain matmul-softmax (diffusers' ``AttnProcessor``) instead of
``scaled_dot_product_attention``, and the exact (erf) GELU instead of the tanh approximation the experts train with,
each at the expert's batch and at the monolith's (K× larger) for a training step, and at the evaluation's batch for
a forward pass without gradients.

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
from diffusers.models.activations import GELU as DiffusersGELU
from diffusers.models.attention_processor import AttnProcessor, AttnProcessor2_0
from torch import nn
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


class FitArm:
    """One FM expert trained by ``fit`` (fused AdamW, warm-up, clipping) on a fixed batch; ``compiled``: its
    transformer under ``torch.compile`` (compiled once, in the first untimed call; the loss and the optimiser step
    stay eager)."""

    def __init__(self, s: dict, compiled: bool):
        self.s, self.expert = s, FlowMatchingExpert(net(s, 0))
        if compiled:
            self.expert.net.transformer = torch.compile(self.expert.net.transformer, dynamic=False)
        self.x0, self.cond = batch(s, torch.Generator().manual_seed(1))
        self.ms(5)  # warm-up (and, compiled, the compilation)

    def loss(self, g: torch.Generator) -> torch.Tensor:
        return self.expert.training_loss(self.x0, self.cond, generator=g)

    def ms(self, steps: int) -> float:
        """Milliseconds per optimiser step over ``steps`` steps."""
        start = time.perf_counter()
        fit(self.expert, self.loss, self.s["optim"], steps=steps, log_every=10**9)
        return (time.perf_counter() - start) / steps * 1e3


def top_ops(arm: FitArm, steps: int, n: int = 8) -> list[dict]:
    """The ``n`` torch operators with the most self CPU time over ``steps`` eager steps, as shares of the total."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        arm.ms(steps)
    events = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    total = sum(e.self_cpu_time_total for e in prof.key_averages())
    events.sort(key=lambda e: -e.self_cpu_time_total)
    return [
        {"op": e.key, "calls_per_step": e.count / steps, "share": e.self_cpu_time_total / total} for e in events[:n]
    ]


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


# the kernel swaps measured: (name, plain matmul-softmax attention, exact GELU)
KERNELS = (
    ("as trained", False, False),
    ("math attention", True, False),
    ("exact GELU", False, True),
    ("both", True, True),
)


def set_kernels(transformer: nn.Module, math_attention: bool, exact_gelu: bool) -> None:
    """Swap ``transformer``'s attention kernel and GELU (the trained network's are SDPA and tanh-GELU)."""
    transformer.set_attn_processor(AttnProcessor() if math_attention else AttnProcessor2_0())
    for m in transformer.modules():
        if isinstance(m, (nn.GELU, DiffusersGELU)):
            m.approximate = "none" if exact_gelu else "tanh"


def kernel_ms(s: dict, steps: int, reps: int, eval_batch: int) -> dict[str, dict[str, float]]:
    """Median milliseconds per training step (at the expert's and the monolith's batch) and per forward pass
    without gradients (at ``eval_batch``) under each of :data:`KERNELS`, the variants interleaved, their order
    rotating from one repetition to the next."""
    arms = {f"train_batch_{b}": FitArm(dict(s, batch=b), False) for b in (s["batch"], s["batch"] * s["num_experts"])}
    forward_net = net(s, 0).eval()
    x, cond = batch(dict(s, batch=eval_batch), torch.Generator().manual_seed(4))
    t = torch.rand(eval_batch, generator=torch.Generator().manual_seed(5)) * 999

    @torch.no_grad()
    def forward(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            forward_net(x, t, cond)
        return (time.perf_counter() - start) / n * 1e3

    times: dict[str, dict[str, list[float]]] = {}
    for i in range(reps):
        for name, math_attention, exact_gelu in KERNELS[i % len(KERNELS) :] + KERNELS[: i % len(KERNELS)]:
            for where, arm in arms.items():
                set_kernels(arm.expert.net.transformer, math_attention, exact_gelu)
                times.setdefault(where, {}).setdefault(name, []).append(arm.ms(steps))
            set_kernels(forward_net.transformer, math_attention, exact_gelu)
            forward(2)
            times.setdefault(f"forward_batch_{eval_batch}", {}).setdefault(name, []).append(forward(steps // 10))
    return {where: {k: statistics.median(v) for k, v in by.items()} for where, by in times.items()}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="configs/reproduce-gmm-subspace.yaml")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--eval-batch", type=int, default=704, help="the forward pass's batch (the GMM evaluation's)")
    p.add_argument("--out", default=str(RESULTS / "gmm_train_step"))
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    s = shapes(args.config)
    load = load_at_start()
    eager, compiled = FitArm(s, False), FitArm(s, True)
    reps = []
    for i in range(args.reps):  # the arms interleaved, their order alternating
        order = [("eager", eager), ("compiled", compiled)][:: 1 if i % 2 == 0 else -1]
        r = {f"{name}_ms": arm.ms(args.steps) for name, arm in order}
        r |= {f"{k}_ms": v for k, v in experts_ms(s, args.steps // 4).items()}
        reps.append(r)
    med = {k: statistics.median(r[k] for r in reps) for k in reps[0]}
    kernels = kernel_ms(s, args.steps // 2, args.reps, args.eval_batch)
    ops = top_ops(eager, 50)
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
        "kernels_ms": kernels,
        "top_ops_eager": ops,
        "matmul_gflop_per_step": flops / 1e9,
        "gflop_per_s_eager": flops / 1e9 / (med["eager_ms"] / 1e3),
    }
    write_result(f"{args.out}.json", record)
    lines = [
        "# One optimiser step of a Gaussian-mixture expert",
        "",
        f"`{record['command'].strip()}`; {record['machine']}; {load}; commit {record['commit']}; "
        f"{record['date']}. Shapes: {record['shapes']}. Medians over {args.reps} repetitions "
        f"({args.steps} steps each, the two `fit` arms interleaved; the K-expert arms {args.steps // 4} each).",
        "",
        "| what | ms |",
        "|---|---|",
        f"| one step of `fit`, eager | {med['eager_ms']:.1f} |",
        f"| one step of `fit`, the transformer under `torch.compile` (inductor) | {med['compiled_ms']:.1f} |",
        f"| forward + backward of {s['num_experts']} experts, one after another | {med['one_after_another_ms']:.1f} |",
        f"| the same {s['num_experts']} as one vmapped model | {med['vmap_ms']:.1f} |",
        "",
        f"Matmul FLOPs per step: {record['matmul_gflop_per_step']:.3f} GFLOP, i.e. "
        f"{record['gflop_per_s_eager']:.1f} GFLOP/s eager.",
        "",
        "Kernel swaps (each changes the network's bits; the exact GELU also its function, so a network trained with "
        "one is not the network trained with the other), median ms and the ratio to the kernels the experts train "
        f"with, {args.steps // 2} steps ({args.steps // 10} forward passes) per arm and repetition:",
        "",
        "| where | " + " | ".join(name for name, *_ in KERNELS) + " |",
        "|---|" + "---|" * len(KERNELS),
        *(
            f"| {where.replace('_', ' ')} | "
            + " | ".join(f"{v[name]:.1f} ({v[name] / v['as trained']:.2f}×)" for name, *_ in KERNELS)
            + " |"
            for where, v in kernels.items()
        ),
        "",
        "The torch operators with the most self CPU time in 50 eager steps (`torch.profiler`):",
        "",
        "| operator | calls per step | share of the step's CPU time |",
        "|---|---|---|",
        *(f"| `{o['op']}` | {o['calls_per_step']:.0f} | {o['share']:.1%} |" for o in ops),
        "",
    ]
    Path(f"{args.out}.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return record


if __name__ == "__main__":
    main()
