"""Benchmark: does an expert initialised from a converted DiT train faster than one from random weights?

Stands in for the paper's ImageNet DiT-XL/2 → expert initialisation (≈1.2× faster convergence) at CPU scale:

1. pretrain a tiny DiT in the original facebookresearch layout as a class-conditional DDPM (linear schedule, learned
   σ channels present, cluster ids as classes, 10 % null class) on the *other* clusters of the embedded dataset
   (as ImageNet is not the experts' data);
2. convert it with ``hddm convert-dit``'s code for the FM and the DDPM objective;
3. train the same expert (same cluster, steps, batch, seed) from the converted weights and from random weights,
   and compare loss curves and held-out losses.

Writes ``benchmarks/results/convert_init.json`` and ``.md``. Run: ``python -m benchmarks.convert_init``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import ROOT, machine, write_result
from hddm_flower.config.io import load_config
from hddm_flower.config.sections import OptimConfig
from hddm_flower.convert import convert_dit, read_dit, write_converted
from hddm_flower.dit import TinyDiT
from hddm_flower.models import EXPERT_PRESETS
from hddm_flower.objectives import ddpm_alpha_bar, ddpm_noise
from hddm_flower.provenance import versions
from hddm_flower.stages.expert import build_expert
from hddm_flower.stages.prepare import prepare_data
from hddm_flower.training import fit, train_expert


def pretrain_dit(
    data, num_classes: int, *, steps: int, batch_size: int, seed: int, width: int, depth: int, heads: int
) -> tuple[TinyDiT, list]:
    """Class-conditional DDPM (ε on the first C channels) with 10 % label dropout to the null class."""
    torch.manual_seed(seed)
    C, size = data.images.shape[1], data.images.shape[-1]
    dit = TinyDiT(
        heads,
        input_size=size,
        in_channels=C,
        patch_size=2,
        hidden_size=width,
        depth=depth,
        num_classes=num_classes,
        learn_sigma=True,
    )
    alpha_bar = ddpm_alpha_bar("linear").float()

    def loss_fn(g):
        idx = torch.randint(0, len(data), (batch_size,), generator=g)
        x0, y = data.images[idx], data.labels[idx].clone()
        y[torch.rand(batch_size, generator=g) < 0.1] = num_classes  # the null class
        tau = torch.randint(0, 1000, (batch_size,), generator=g)
        eps = torch.randn(x0.shape, generator=g)
        return torch.mean((dit(ddpm_noise(x0, eps, tau, alpha_bar), tau.float(), y)[:, :C] - eps) ** 2)

    stats, _ = fit(
        dit,
        loss_fn,
        OptimConfig(lr=1e-3, warmup_steps=50),
        steps=steps,
        seed=seed,
        log_every=max(1, steps // 10),
        name="DiT pretraining",
    )
    return dit, stats.loss_curve


@torch.no_grad()
def held_out_loss(expert, data, uncond, seed: int = 123, repeats: int = 8) -> float:
    g = torch.Generator().manual_seed(seed)
    losses = [expert.training_loss(data.images, data.cond, generator=g).item() for _ in range(repeats)]
    return sum(losses) / len(losses)


def steps_to_reach(curve: list, target: float) -> int | None:
    return next((step for step, loss in curve if loss <= target), None)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pretrain-steps", type=int, default=600)
    p.add_argument("--steps", type=int, default=300, help="expert training steps per run")
    p.add_argument("--cluster", type=int, default=0)
    p.add_argument("--config", default=str(ROOT / "configs" / "default.yaml"))
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "convert_init"))
    args = p.parse_args(argv)

    cfg = load_config(args.config, {"expert.steps": args.steps, "expert.log_every": 10})
    dataset = prepare_data(cfg, args.cache_dir)
    meta = dataset.meta
    arch = EXPERT_PRESETS[cfg.expert.preset]  # the DiT has the expert's architecture, as XL/2 does in the paper
    others = [k for k in range(cfg.num_experts) if k != args.cluster]  # like ImageNet: not the expert's own data
    everything, uncond = dataset.split(others, "train"), dataset.uncond
    train, val = dataset.split([args.cluster], "train"), dataset.split([args.cluster], "val")
    start = time.perf_counter()
    dit, dit_curve = pretrain_dit(
        everything,
        cfg.num_experts,
        steps=args.pretrain_steps,
        batch_size=32,
        seed=0,
        width=arch["num_attention_heads"] * arch["attention_head_dim"],
        depth=arch["num_layers"],
        heads=arch["num_attention_heads"],
    )
    pretrain_seconds = time.perf_counter() - start

    results = {
        "pretrain": {"steps": args.pretrain_steps, "loss_curve": dit_curve, "seconds": pretrain_seconds},
        "runs": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        torch.save({k: v.detach() for k, v in dit.state().items()}, Path(tmp) / "dit.pt")
        src = read_dit(Path(tmp) / "dit.pt", num_heads=arch["num_attention_heads"])
        for objective in ("fm", "ddpm"):
            state, config, report = convert_dit(src, objective=objective, caption_channels=meta["text_dim"])
            init_dir = write_converted(Path(tmp) / f"init-{objective}", state, config, report)
            for init in ("random", str(init_dir)):
                run_cfg = load_config(
                    args.config, {"expert.steps": args.steps, "expert.log_every": 10, "expert.init": init}
                )
                torch.manual_seed(1)
                expert, _, _ = build_expert(run_cfg, meta, objective, expert_id=args.cluster)
                stats = train_expert(expert, train, uncond, run_cfg.expert, seed=7)
                name = f"{objective}/{'converted' if init != 'random' else 'random'}"
                results["runs"][name] = {
                    "loss_curve": stats.loss_curve,
                    "final_loss": stats.final_loss,
                    "held_out_loss": held_out_loss(expert, val, uncond),
                    "seconds": stats.device_seconds,
                    "conversion_check": report["check"] if init != "random" else None,
                }
    for objective in ("fm", "ddpm"):
        rnd, cvt = results["runs"][f"{objective}/random"], results["runs"][f"{objective}/converted"]
        reach = steps_to_reach(cvt["loss_curve"], rnd["final_loss"])
        results[f"{objective}_speedup"] = args.steps / reach if reach else None
    results["setup"] = {
        "dataset": dataset.root.name,
        "cluster": args.cluster,
        "cluster_train_images": len(train),
        "expert_preset": cfg.expert.preset,
        "batch_size": cfg.expert.batch_size,
        "steps": args.steps,
        "machine": machine(),
        "threads": torch.get_num_threads(),
        "versions": versions(),
        "command": "python -m benchmarks.convert_init " + " ".join(argv or []),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_result(out.with_suffix(".json"), results)
    out.with_suffix(".md").write_text(render(results))
    print(render(results))
    return results


def render(r: dict) -> str:
    s = r["setup"]
    lines = [
        f"Expert init from a converted tiny DiT vs random init — cluster {s['cluster']} "
        f"({s['cluster_train_images']} images), {s['steps']} steps of batch {s['batch_size']}, same seeds; "
        f"DiT pretrained {r['pretrain']['steps']} steps as a class-conditional DDPM on the other clusters "
        f"(final loss {r['pretrain']['loss_curve'][-1][1]:.3f}).",
        "",
        "| objective | init | loss @ 50 | loss @ 150 | final train loss (smoothed) | held-out loss | speed-up to random's final loss |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, run in r["runs"].items():
        objective, init = name.split("/")
        curve = dict(run["loss_curve"])
        speed = r[f"{objective}_speedup"] if init == "converted" else None
        lines.append(
            f"| {objective} | {init} | {curve.get(50, float('nan')):.3f} | {curve.get(150, float('nan')):.3f} "
            f"| {run['final_loss']:.3f} | {run['held_out_loss']:.3f} | "
            f"{'—' if init == 'random' else (f'{speed:.2f}×' if speed else 'not reached')} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
