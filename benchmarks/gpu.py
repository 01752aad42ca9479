"""The GPU benchmark, prepared to run in one call when a CUDA machine is lent.

1. Expert training steps at the paper's shapes (4×32×32 latents, 77×768 CLIP states), bf16 autocast, fused AdamW,
   gradient checkpointing, batch 32: samples/s, MFU and peak memory of XL/2 and B/2 (``gpu_xl_step.py``).
2. Ensemble sampling at 256² (32² latents) with the paper's config (8 XL/2 experts, 2 DDPM through the conversion,
   a B/2 router, CFG 7.5, top-2, bf16 autocast, random weights): images/s at 50 steps, grouped top-2 against one
   expert; grouped against the per-sample routing loop at 5 steps; grouped (one host read per step) against dense
   dispatch (none, every expert on every row) at 10 steps (``sampling.py``).
3. The coordinator's kernels (``gpu_coordinator.py``): B/2 router training steps (bf16, batch 256), SD-VAE decode
   of 32² latents to 256² images, Inception-v3 feature throughput.
4. Stage 4 through the run's own code on the device (``gpu_stages.py``, ``--stages-config``): experts trained
   briefly, ``finish_run`` (router training, ``evaluate_and_report``: diagnostics, feature classifier, reference
   statistics, every mode, per expert, report, samples.png through ``HDDMPipeline``), then ``HDDMPipeline``
   sampling as ``hddm sample`` does; ``--dry-run`` runs it on the CPU too. Then the coordinator's stages at N and
   4N samples in the paper's latent layout (``coordinator_scale.py --device cuda``; not in ``--dry-run``).

    python -m benchmarks.gpu                       # on the GPU machine (its time not measured yet)
    python -m benchmarks.gpu --dry-run             # CPU, test presets (stage 4: --stages-config's, loops cut to 2)

Writes ``benchmarks/results/gpu.json`` (and the parts' own JSON next to it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks import gpu_coordinator, gpu_stages, gpu_xl_step, sampling
from benchmarks.common import ROOT, module_command, write_result

PAPER = str(ROOT / "configs" / "paper-2ddpm-6fm.yaml")
DRY_STAGES = (  # --dry-run: stage 4 of --stages-config with every loop cut to 2 (the code path, not its cost)
    "expert.steps=2", "router.steps=2", "evaluation.feature_steps=2", "evaluation.num_prompts=2",
    "evaluation.num_steps=2", "evaluation.per_expert_samples=2", "sampling.num_steps=2",
)  # fmt: skip


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="CPU, test presets, 1–2 steps")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H100/H200 SXM: 989)")
    p.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--coordinator-n", type=int, default=4000, help="N of the coordinator stages (4N is also run)")
    p.add_argument(
        "--stages-config", default=str(ROOT / "configs" / "default.yaml"),
        help="the config whose stage 4 runs through finish_run and HDDMPipeline (gpu_stages.py)",
    )  # fmt: skip
    p.add_argument("--cache-dir", default="", help="prepared datasets of --stages-config (default: the project's)")
    args = p.parse_args(argv)
    out = Path(args.out_dir)
    step = gpu_xl_step
    dry = args.dry_run
    dev = ["--device", "cpu"] if dry else ["--device", "cuda"]
    t0 = time.perf_counter()
    result: dict = {
        "command": " ".join(["python -m benchmarks.gpu", *(sys.argv[1:] if argv is None else argv)]),
        "training": {},
        "sampling": {},
    }
    for preset in ["test"] if dry else ["XL/2", "B/2"]:
        result["training"][preset] = step.main(
            [
                *dev,
                "--preset",
                preset,
                "--peak-tflops",
                str(args.peak_tflops),
                *(["--batch-size", "2", "--steps", "1"] if dry else []),
                "--out",
                str(out / f"gpu_step_{preset.replace('/', '')}.json"),
            ]
        )
    shapes = [
        "--config",
        PAPER,
        "--set",
        "expert.init=random",
        *dev,
        "--size",
        "32",
        "--channels",
        "4",
        "--text-dim",
        "768",
        "--text-len",
        "77",
    ]
    if dry:
        shapes = [*shapes, "--set", "expert.preset=test", "--set", "router.preset=test", "--size", "8"]
    else:
        shapes.append("--bf16")
    result["sampling"]["images_per_s_50_steps"] = sampling.main(
        [
            *shapes,
            "--batch-size",
            "4" if dry else "64",
            "--steps",
            "2" if dry else "50",
            "--reps",
            "1" if dry else "3",
            "--samplers",
            "grouped,one_expert",
            "--out",
            str(out / "gpu_sampling_50.json"),
        ]
    )
    result["sampling"]["grouped_vs_per_sample"] = sampling.main(
        [
            *shapes,
            "--batch-size",
            "4" if dry else "64",
            "--steps",
            "1" if dry else "5",
            "--reps",
            "1" if dry else "3",
            "--samplers",
            "grouped,per_sample",
            "--out",
            str(out / "gpu_sampling_loop.json"),
        ]
    )
    # the one host read per step of grouped dispatch against dense dispatch's K / k times the experts' arithmetic
    result["sampling"]["grouped_vs_dense"] = sampling.main(
        [
            *shapes,
            "--batch-size",
            "4" if dry else "64",
            "--steps",
            "1" if dry else "10",
            "--reps",
            "1" if dry else "3",
            "--samplers",
            "grouped,dense",
            "--out",
            str(out / "gpu_sampling_dense.json"),
        ]
    )
    kernels = ["--dry-run", "--out", str(out / "gpu_coordinator-dry-run.json")] if dry else ["--device", "cuda"]
    result["coordinator_kernels"] = gpu_coordinator.main(
        kernels + ([] if dry else ["--out", str(out / "gpu_coordinator.json")])
    )
    # stage 4 through the run's own code: finish_run (router, evaluate_and_report) and HDDMPipeline
    stages = ["--config", args.stages_config, *dev, "--out", str(out / f"gpu_stages{'-dry-run' if dry else ''}.json")]
    stages += ["--cache-dir", args.cache_dir] if args.cache_dir else []
    stages += [x for o in DRY_STAGES for x in ("--set", o)] if dry else []
    result["coordinator_pipeline"] = gpu_stages.main(stages)
    if dry:
        result["coordinator_stages"] = "coordinator_scale skipped in --dry-run (its N is the GPU run's)"
    else:
        import subprocess

        cmd = module_command("benchmarks.coordinator_scale", "--device", "cuda")
        cmd += ["--n", str(args.coordinator_n), "--threads", "8", "--out", str(out / "gpu_coordinator_scale")]
        subprocess.run(cmd, cwd=ROOT, check=True)
        result["coordinator_stages"] = json.loads((out / "gpu_coordinator_scale.json").read_text())
    result["seconds"] = time.perf_counter() - t0
    path = out / ("gpu-dry-run.json" if dry else "gpu.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_result(path, result)
    print(f"wrote {path} in {result['seconds']:.0f} s")
    return result


if __name__ == "__main__":
    main()
