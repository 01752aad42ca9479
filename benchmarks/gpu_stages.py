"""Stage 4 on the coordinator's device, through the run's own code: experts trained briefly by the stages'
``train_one_expert``, then ``finish_run`` (router training from the stream, then ``evaluate_and_report``: velocity
diagnostics, the feature classifier, reference statistics, every routing mode, the per-expert pass, grids, the
report and samples.png through ``HDDMPipeline``), then ``HDDMPipeline.from_pretrained`` on the run directory
sampling as ``hddm sample`` does. Records the seconds of each part and, on CUDA, the peak memory.

    python -m benchmarks.gpu_stages --device cuda                    # the default config's stage 4 on the GPU
    python -m benchmarks.gpu_stages --device cpu --set expert.steps=3 # a dry run
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, write_result


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs" / "default.yaml"))
    p.add_argument("--set", action="append", default=[], help="a config override KEY=VALUE (repeatable)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--cache-dir", default="", help="prepared datasets (default: the project's cache)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu_stages.json"))
    args = p.parse_args(argv)

    import torch

    from hddm_flower.checkpoints import save_expert
    from hddm_flower.config.io import load_config, parse_overrides
    from hddm_flower.hddm_pipeline import load_pipeline, sample_images
    from hddm_flower.rundir import write_config
    from hddm_flower.stages.assemble import finish_run
    from hddm_flower.stages.expert import train_one_expert
    from hddm_flower.stages.prepare import assign_objectives, prepare_data

    overrides = parse_overrides(" ".join([*args.set, f"coordinator.device={args.device}"]))
    cfg = load_config(args.config, overrides)
    cuda = args.device.startswith("cuda")
    seconds = {}
    t = time.perf_counter()
    dataset = prepare_data(cfg, args.cache_dir or None)
    seconds["prepare"] = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        run.mkdir()
        write_config(run / "config.yaml", cfg, f"benchmarks.gpu_stages from {args.config}")
        objectives = assign_objectives(cfg, dataset)
        t = time.perf_counter()
        for k in range(cfg.num_experts):
            save_expert(run / "experts" / f"expert-{k}", *train_one_expert(cfg, dataset, k, objectives[k]))
        seconds["experts"] = time.perf_counter() - t
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        report = finish_run(cfg, run, dataset, [])
        seconds["router_and_evaluate_and_report"] = time.perf_counter() - t
        t = time.perf_counter()
        pipe = load_pipeline(run)
        pipe.to(torch.device(args.device))
        s = cfg.sampling
        images = sample_images(pipe, s.prompts, samples_per_prompt=s.samples_per_prompt, seed=s.seed)
        seconds["pipeline_sample"] = time.perf_counter() - t
        router = json.loads((run / "router" / "hddm_router.json").read_text())
    m = report["metrics"]
    result = {
        "command": " ".join(["python -m benchmarks.gpu_stages", *(argv or [])]),
        "device": args.device,
        "router": {k: router[k] for k in ("device", "mixed_precision", "steps", "device_seconds")},
        "modes": {mode: {"fid": r["fid"], "seconds": r["seconds"]} for mode, r in m["evaluation"]["modes"].items()},
        "diagnostics_images": m["num_images"],
        "samples": list(images.shape),
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
        "peak_memory_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "torch": torch.__version__,
    }
    write_result(args.out, result)
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
