#!/usr/bin/env python3
"""The coordinator's memory does not grow with the dataset: peak RSS and time per server stage at N and 4N samples.

A synthetic clustered dataset in the paper's layout is generated (seeded; not downloaded): K = 8 shard sets of
webdataset tars, each sample a 4×32×32 float16 latent (8 KiB), 77×768 float16 text states (118 KiB), a caption and
its json (split, cluster); ``meta.json`` as ``hddm cluster`` writes it. The 4N dataset is written once; the N one
is a view of its first quarter (symlinked shards), so both are the same data.

Each stage runs in its own process (stages cannot mask each other's peaks); it reports its peak RSS
(``ru_maxrss``), its RSS after imports and setup, its *increase*: the peak RSS of the stage over its own
post-import RSS (VmHWM reset through ``/proc/self/clear_refs`` after the imports; ``ru_maxrss`` cannot see a stage
that stays under the imports' high-water mark), the bytes it read (``/proc/self/io``), and its wall time:

* ``router``: :func:`hddm_flower.stages.router.fit_router` for a fixed number of steps (the data it reads does not
  grow with N: the time should not either);
* ``reference``: the evaluation's feature classifier trained from a stream (fixed steps), then the FID/KID
  reference statistics of every image in one streaming pass, cached beside the dataset (reads all N);
* ``evaluation``: :func:`hddm_flower.evaluate.evaluate_run` with one routing mode (top2) of an 8-expert ensemble
  (2 DDPM + 6 FM, the ``test`` preset), reusing the cached statistics: prompts streamed, samples, FID/KID.

Features are the run's own feature classifier on latents (no VAE and no Inception offline); the memory argument is
the same for any feature network (its size does not depend on N).

    python -m benchmarks.coordinator_scale                 # N = 20,000 and 4N = 80,000 (≈ 10 GB of disk, deleted)
    python -m benchmarks.coordinator_scale --n 1600 --shard-size 50 --out /tmp/quick   # a quick look
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT, machine, module_command, write_result

K, L, DIM, C, S = 8, 77, 768, 4, 32
SHARD = 125  # samples per shard (--shard-size)
VAL_EVERY = 100  # every 100th sample is held out (1 %)


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def generate(out: Path, n: int, seed: int = 0) -> Path:
    """K clusters of n / K samples: latents around a per-cluster mean, text states from a pool (fast to write)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    means = rng.normal(0, 1, (K, C, S, S)).astype(np.float32)
    pool = [_npy(rng.normal(0, 0.5, (L, DIM)).astype(np.float16)) for _ in range(32)]  # 118 KiB each
    per = n // K
    clusters = []
    for k in range(K):
        folder = out / f"cluster-{k}"
        folder.mkdir(parents=True)
        for s0 in range(0, per, SHARD):
            with tarfile.open(folder / f"shard-{s0 // SHARD:06d}.tar", "w") as tar:
                lat = (0.7 * means[k] + 0.7 * rng.normal(0, 1, (min(SHARD, per - s0), C, S, S))).astype(np.float16)
                for j, x in enumerate(lat):
                    i = s0 + j
                    key = f"{k}{i:08d}"
                    split = "val" if i % VAL_EVERY == VAL_EVERY - 1 else "train"
                    _add(tar, f"{key}.latent.npy", _npy(x))
                    _add(tar, f"{key}.emb.npy", pool[(i * 7 + k) % len(pool)])
                    _add(tar, f"{key}.txt", f"synthetic caption {k}-{i}".encode())
                    _add(tar, f"{key}.json", json.dumps({"cluster": k, "split": split}).encode())
        clusters.append(
            {"id": k, "size": per, "val": per // VAL_EVERY, "detail": float(k), "categories": {}, "examples": []}
        )
    uncond = {"states": np.zeros((L, DIM), np.float32), "mask": (np.arange(L) < 2).astype(np.float32)}
    meta = {
        "name": "synthetic-paper-layout",
        "version": 1,
        "image_size": S,
        "channels": C,
        "num_images": per * K,
        "num_clusters": K,
        "text_encoder": "synthetic (77×768 float16 states)",
        "text_dim": DIM,
        "max_caption_tokens": L,
        "latent": None,
        "clusters": clusters,
    }
    save_file(uncond, out / "uncond.safetensors")
    (out / "meta.json").write_text(json.dumps(meta, indent=2))
    return out


def view(big: Path, out: Path, fraction: int) -> Path:
    """The first 1/fraction of every cluster of ``big`` (symlinked shards, its own meta.json)."""
    meta = json.loads((big / "meta.json").read_text())
    for c in meta["clusters"]:
        shards = sorted((big / f"cluster-{c['id']}").glob("shard-*.tar"))
        keep = shards[: len(shards) // fraction]
        (out / f"cluster-{c['id']}").mkdir(parents=True)
        for p in keep:
            (out / f"cluster-{c['id']}" / p.name).symlink_to(p)
        c["size"], c["val"] = len(keep) * SHARD, len(keep) * SHARD // VAL_EVERY
    meta["num_images"] = sum(c["size"] for c in meta["clusters"])
    shutil.copy(big / "uncond.safetensors", out / "uncond.safetensors")
    (out / "meta.json").write_text(json.dumps(meta, indent=2))
    return out


def config(args, work: Path):
    from hddm_flower.config_io import config_from_dict

    return config_from_dict(
        {
            "num_experts": K,
            "objectives": {"ddpm": 2, "fm": 6, "ddpm_clusters": [0, 1]},
            "data": {"stream": True},
            "expert": {"preset": "test", "steps": 1, "batch_size": 2, "warmup_steps": 1},
            "router": {"preset": "tiny", "steps": args.router_steps, "batch_size": 64},
            "coordinator": {"device": args.device},
            "sampling": {"num_steps": args.sample_steps},
            "evaluation": {
                "routing_modes": ["top2"],
                "num_prompts": args.prompts,
                "samples_per_prompt": 2,
                "feature_steps": args.feature_steps,
                "kid_subset_size": 50,
                "kid_subsets": 10,
                "reference_images": args.kid_reservoir,
            },
        },
        "coordinator_scale",
    )


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def _io() -> dict[str, int]:
    """This process's I/O counters (``rchar``: bytes read through read(2), cache included; ``read_bytes``: from
    the storage)."""
    return {k: int(v) for k, v in (line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())}


def stage(args) -> dict:
    """One stage in this process; returns its measurements."""
    import torch

    torch.set_num_threads(args.threads)
    from hddm_flower.data import Dataset
    from hddm_flower.evaluate import evaluate_run, feature_network
    from hddm_flower.reference import reference_statistics
    from hddm_flower.stages.assemble import load_ensemble
    from hddm_flower.stages.router import fit_router

    d, work = Path(args.dataset), Path(args.work)
    cfg = config(args, work)
    run = work / "run"
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS: the peak from here on is the stage's own
    baseline, io0 = _status_kib("VmRSS"), _io()
    start = time.perf_counter()
    if args.stage == "router":
        fit_router(cfg, d, work / "router-run")
        extra = json.loads((work / "router-run" / "router" / "hddm_router.json").read_text())
        extra = {k: extra[k] for k in ("steps", "images_seen", "device", "training_images")}
    elif args.stage == "reference":
        decode = Dataset.open(d).decoder(cfg)
        fx, _, _ = feature_network(cfg, d, work / "feature-net", decode=decode)
        stats, cached = reference_statistics(d, fx, decode=decode, reservoir=args.kid_reservoir, seed=0)
        extra = {"images": sum(s.count for s in stats.values()), "reused": cached["reused"], "features": fx.name}
    else:
        ensemble, _ = load_ensemble(cfg, run)
        ev = evaluate_run(cfg, ensemble, d, work / "eval", feature_dir=work / "feature-net", per_expert=False)
        top2 = ev["modes"]["top2"]
        extra = {"fid": top2["fid"], "kid": top2["kid"], "reference": ev["protocol"]["reference"]}
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    io1 = _io()
    return {
        "peak_rss_mib": peak / 1024,
        "rss_after_imports_mib": rss0 / 1024,
        "increase_mib": (_status_kib("VmHWM") - baseline) / 1024,  # the stage's peak over its post-import RSS
        "rchar": io1["rchar"] - io0["rchar"],
        "read_bytes": io1["read_bytes"] - io0["read_bytes"],
        "seconds": seconds,
        **extra,
    }


def setup_run(args, d: Path, work: Path) -> None:
    """Experts (one step each, the test preset) and a router for the evaluation stage; not measured."""
    from hddm_flower.checkpoints import save_expert
    from hddm_flower.stages.expert import train_one_expert
    from hddm_flower.stages.prepare import assign_objectives
    from hddm_flower.stages.router import fit_router

    cfg = config(args, work)
    run = work / "run"
    for k, objective in enumerate(assign_objectives(cfg, d)):
        save_expert(run / "experts" / f"expert-{k}", *train_one_expert(cfg, d, k, objective))
    fit_router(cfg, d, run)


def run_stage(name: str, d: Path, work: Path, args) -> dict:
    cmd = module_command("benchmarks.coordinator_scale", "--stage", name, "--dataset", str(d), "--work", str(work))
    cmd += ["--router-steps", str(args.router_steps), "--feature-steps", str(args.feature_steps)]
    cmd += ["--prompts", str(args.prompts), "--sample-steps", str(args.sample_steps), "--device", args.device]
    cmd += ["--kid-reservoir", str(args.kid_reservoir), "--threads", str(args.threads)]
    load = os.getloadavg()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=os.environ | {"PYTHONPATH": str(ROOT)})
    if out.returncode:
        raise RuntimeError(f"stage {name} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return result | {"load_average_at_start": [round(x, 2) for x in load]}


def main() -> None:
    global SHARD
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=20_000, help="N (the second size is 4N); a multiple of 32 × --shard-size")
    p.add_argument("--router-steps", type=int, default=150)
    p.add_argument("--feature-steps", type=int, default=100)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--sample-steps", type=int, default=10)
    p.add_argument("--kid-reservoir", type=int, default=2000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--shard-size", type=int, default=SHARD)
    p.add_argument("--device", default="cpu")
    p.add_argument("--keep", default=None, metavar="DIR", help="write the datasets here and keep them (reused)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "coordinator_scale"))
    p.add_argument("--stage", choices=["router", "reference", "evaluation"], help=argparse.SUPPRESS)
    p.add_argument("--dataset", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.stage:
        print(json.dumps(stage(args)))
        return
    SHARD = args.shard_size
    if args.n % (K * SHARD * 4):
        p.error(f"--n must be a multiple of {K * SHARD * 4} (8 clusters × 4 quarters × --shard-size)")
    import tempfile

    keep = args.keep is not None
    root = Path(args.keep) if keep else Path(tempfile.mkdtemp(prefix="coordinator-scale-"))
    results = {"sizes": {}}
    try:
        t0 = time.perf_counter()
        if keep and (root / "data-N" / "meta.json").exists():  # generated by an earlier call with --keep
            big, small = root / "data-4N", root / "data-N"
        else:
            big = generate(root / "data-4N", 4 * args.n)
            small = view(big, root / "data-N", 4)
        results["generate_seconds"] = round(time.perf_counter() - t0, 1)
        results["dataset_bytes_4N"] = sum(f.stat().st_size for f in big.rglob("*.tar"))
        for label, d in (("N", small), ("4N", big)):
            work = root / f"work-{label}"
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(d / "reference-stats", ignore_errors=True)  # the pass is measured, not reused
            work.mkdir()
            setup_run(args, d, work)
            results["sizes"][label] = {"samples": json.loads((d / "meta.json").read_text())["num_images"]}
            for name in ("router", "reference", "evaluation"):
                results["sizes"][label][name] = run_stage(name, d, work, args)
                print(label, name, json.dumps(results["sizes"][label][name]), flush=True)
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    a, b = results["sizes"]["N"], results["sizes"]["4N"]
    results["ratios_4N_over_N"] = {
        name: {
            "peak_rss": round(b[name]["peak_rss_mib"] / a[name]["peak_rss_mib"], 3),
            "increase": round(b[name]["increase_mib"] / max(a[name]["increase_mib"], 1e-9), 3),
            "rchar": round(b[name]["rchar"] / max(a[name]["rchar"], 1), 3),
            "seconds": round(b[name]["seconds"] / a[name]["seconds"], 2),
        }
        for name in ("router", "reference", "evaluation")
    }
    results["goal"] = "each stage's RSS increase over its post-import baseline at 4N ≤ 1.15 × at N"
    results["goal_met"] = all(r["increase"] <= 1.15 for r in results["ratios_4N_over_N"].values())
    results |= {
        "command": "python -m benchmarks.coordinator_scale " + " ".join(sys.argv[1:]),
        "machine": f"{machine()}, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "settings": {k: v for k, v in vars(args).items() if k not in ("stage", "dataset", "work", "keep", "out")},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_result(out.with_suffix(".json"), results)
    lines = [
        "# Coordinator scale: peak RSS and time per stage at N and 4N",
        "",
        f"`{results['command']}` on {results['machine']}, {results['date']}.",
        "",
        "| stage | increase N (MiB) | increase 4N (MiB) | ratio | read N (MB) | read 4N (MB) | time N (s) "
        "| time 4N (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results["ratios_4N_over_N"].items():
        lines.append(
            f"| {name} | {a[name]['increase_mib']:.0f} | {b[name]['increase_mib']:.0f} | {r['increase']:.3f} "
            f"| {a[name]['rchar'] / 1e6:.1f} | {b[name]['rchar'] / 1e6:.1f} "
            f"| {a[name]['seconds']:.1f} | {b[name]['seconds']:.1f} |"
        )
    lines += ["", f"N = {a['samples']:,}, 4N = {b['samples']:,}; goal met: {results['goal_met']}."]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
