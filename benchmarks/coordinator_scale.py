#!/usr/bin/env python3
"""The coordinator's memory does not grow with the dataset: each server stage's RSS increase, bytes read and time
at N and 4N samples.

A synthetic clustered dataset in the paper's layout is generated (seeded; not downloaded): K = 8 shard sets of
webdataset tars, each sample a latent (``--latent-side``, 4 channels, float16), per-token text states of the
offline MiniLM's width (``--tokens`` × 384, float16), a caption and its json (split, cluster; every
``--val-every``-th sample held out); ``meta.json`` as ``hddm cluster`` writes it. Small samples keep N ≥ 20,000
cheap to write and read; the memory argument is the same at any sample size (a stage that held a split would hold
N samples of it). The 4N dataset is written once; the N one is a view of its first quarter (symlinked shards).

Each stage runs in its own process, forked from one that imported everything (stages cannot mask each other's
peaks, and none pays the imports), with the coordinator's thread count set as the ServerApp sets it
(:func:`hddm_flower.devices.coordinator_threads`). It reports its *increase*: the peak RSS of the stage over its
own RSS after imports and setup (VmHWM reset through ``/proc/self/clear_refs``; ``ru_maxrss`` cannot see a stage
that stays under the imports' high-water mark; what the stage imports or pages in lazily counts), the bytes it
read (``/proc/self/io`` ``rchar``: every read(2), page cache included), the bytes it must read by construction
(``must_read``: the samples its streams reach × the mean sample size in the shards), and its wall time:

* ``router``: :func:`hddm_flower.stages.router.fit_router` for ``router.steps`` (fixed: must read steps × batch
  + the shuffle buffer, not N);
* ``feature``: the evaluation's feature classifier trained from a stream for ``evaluation.feature_steps``;
* ``reference``: the FID/KID reference statistics of every image in one streaming pass, cached beside the
  dataset (must read all N);
* ``diagnostics``: :func:`hddm_flower.stages.diagnostics.evaluate` on the streamed, seeded held-out subsample of
  ``evaluation.diagnostic_images`` (must read until its buffers fill and the subsample is drawn: not N);
* ``report``: the ServerApp's own :func:`hddm_flower.stages.assemble.evaluate_and_report` (diagnostics, one
  routing mode, the per-expert pass, grids, ``HDDMPipeline`` sampling, prompt adherence, report.json/md) on an
  8-expert ensemble (2 DDPM + 6 FM, the ``test`` preset), the feature classifier and reference statistics of the
  stages before reused (as a second report of a run reuses them); the prompt clusters are computed (not cached),
  so it must read every caption once: N;
* ``monolith``: ``hddm reproduce``'s monolith (:func:`hddm_flower.reproduce.training.train_monolith`, ``data.stream``)
  for K × ``expert.steps`` steps, checkpointed every ``expert.checkpoint_every`` steps.

Features are the run's own feature classifier (no Inception offline); its size does not depend on N.

    python -m benchmarks.coordinator_scale                 # N = 20,000 and 4N = 80,000 (≈ 0.8 GB of disk, deleted)
    python -m benchmarks.coordinator_scale --n 4000 --shard-size 25 --out /tmp/quick   # a quick look

Its length is one experiment with its runs, measurements and write-up.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT, commit, forked, machine, write_result

K, C, DIM = 8, 4, 384  # clusters, latent channels, MiniLM's width (the pipeline encodes its prompts with it)
STAGES = ("router", "feature", "reference", "diagnostics", "report", "monolith")
DIAGNOSTICS_BUFFER = 1024  # stages.diagnostics.SHUFFLE_BUFFER (checked in stage())
MONOLITH_BUFFER = 1000  # data.streams.StreamingAllClusters' default shuffle buffer
FEATURE_BATCH, FEATURE_BUFFER = 64, 4096  # evaluate.feature_network's stream


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def generate(out: Path, n: int, args, seed: int = 0) -> Path:
    """K clusters of n / K samples: latents around a per-cluster mean, text states from a pool (fast to write),
    written by the project's :class:`~hddm_flower.data.writer.DatasetWriter` (``--shard-size`` samples a shard)."""
    import torch

    from hddm_flower.data.writer import DatasetWriter

    S, L, shard, every = args.latent_side, args.tokens, args.shard_size, args.val_every
    rng = np.random.default_rng(seed)
    means = rng.normal(0, 1, (K, C, S, S)).astype(np.float32)
    pool = [_npy(rng.normal(0, 0.5, (L, DIM)).astype(np.float16)) for _ in range(32)]
    per = n // K
    clusters = []
    with DatasetWriter(out) as writer:
        for k in range(K):
            with writer.shard_writer(k, maxcount=shard) as shards:
                for s0 in range(0, per, shard):
                    lat = (0.7 * means[k] + 0.7 * rng.normal(0, 1, (min(shard, per - s0), C, S, S))).astype(np.float16)
                    for j, x in enumerate(lat):
                        i = s0 + j
                        split = "val" if i % every == every - 1 else "train"
                        shards.write(
                            {
                                "__key__": f"{k}{i:08d}",
                                "latent.npy": _npy(x),
                                "emb.npy": pool[(i * 7 + k) % len(pool)],
                                "txt": f"synthetic caption {k}-{i}",
                                "json": json.dumps({"cluster": k, "split": split}),
                            }
                        )
            clusters.append(
                {"id": k, "size": per, "val": per // every, "detail": float(k), "categories": {}, "examples": []}
            )
        writer.write_uncond(torch.zeros(L, DIM), (torch.arange(L) < 2).float())
        writer.write_meta(
            {
                "name": "synthetic-paper-layout",
                "version": 1,
                "image_size": S,
                "channels": C,
                "num_images": per * K,
                "num_clusters": K,
                "text_encoder": f"synthetic ({L}×{DIM} float16 states)",
                "text_dim": DIM,
                "max_caption_tokens": L,
                "latent": None,
                "cluster_features": "synthetic (a mean per cluster)",
                "license": "synthetic, generated by benchmarks/coordinator_scale.py",
                "clusters": clusters,
            }
        )
    return out


def view(big: Path, out: Path, fraction: int, args) -> Path:
    """The first 1/fraction of every cluster of ``big`` (links to its shards, its own meta.json)."""
    from hddm_flower.data import Dataset
    from hddm_flower.data.writer import DatasetWriter

    source = Dataset.open(big)
    meta = copy.deepcopy(source.meta)
    with DatasetWriter(out) as writer:
        for c in meta["clusters"]:
            shards = source.shards(c["id"])
            keep = shards[: len(shards) // fraction]
            for url in keep:
                writer.link_shard(c["id"], Path(url).resolve())
            c["size"], c["val"] = len(keep) * args.shard_size, len(keep) * args.shard_size // args.val_every
        meta["num_images"] = sum(c["size"] for c in meta["clusters"])
        writer.copy_uncond(big)
        writer.write_meta(meta)
    return out


def config(args):
    from hddm_flower.config.io import config_from_dict

    return config_from_dict(
        {
            "num_experts": K,
            "objectives": {"ddpm": 2, "fm": 6, "ddpm_clusters": [0, 1]},
            "data": {"stream": True, "max_caption_tokens": args.tokens},
            "expert": {
                "preset": "test",
                "steps": args.expert_steps,
                "batch_size": 8,
                "warmup_steps": 1,
                "checkpoint_every": max(1, args.expert_steps),
            },
            "router": {"preset": "test", "steps": args.router_steps, "batch_size": 64},
            "coordinator": {"device": args.device, "threads": args.threads},
            "sampling": {"num_steps": args.sample_steps, "samples_per_prompt": 2, "prompts": ["a", "b"]},
            "evaluation": {
                "routing_modes": ["top2"],
                "num_prompts": args.prompts,
                "samples_per_prompt": 2,
                "per_expert_samples": 4,
                "grid_prompts": 2,
                "batch_size": 64,
                "feature_steps": args.feature_steps,
                "kid_subset_size": 10,
                "kid_subsets": 10,
                "reference_images": args.kid_reservoir,
                "diagnostic_images": args.diagnostic_images,
                "times": [0.1, 0.5, 0.9],
            },
        },
        "coordinator_scale",
    )


def must_read_samples(name: str, cfg, meta: dict, val_every: int) -> int:
    """The samples a stage's streams must pass by construction (a tar stream reads every member of a sample it
    passes, and a split filter passes the other split's samples too)."""
    n, k = meta["num_images"], meta["num_clusters"]
    val = sum(c["val"] for c in meta["clusters"])
    train_pass = lambda drawn, buffer: min(n, round((drawn + buffer) * n / (n - val)))  # noqa: E731
    if name == "router":
        return train_pass(cfg.router.steps * cfg.router.batch_size, cfg.router.shuffle_buffer)
    if name == "feature":
        return train_pass(cfg.evaluation.feature_steps * FEATURE_BATCH, FEATURE_BUFFER)
    if name == "monolith":
        e = cfg.expert
        return train_pass(k * e.steps * e.batch_size * e.grad_accumulation, MONOLITH_BUFFER)
    if name == "reference":
        return n
    diagnostics = min(n, (cfg.evaluation.diagnostic_images + DIAGNOSTICS_BUFFER) * val_every)
    if name == "diagnostics":
        return diagnostics
    return diagnostics + n  # report: + every caption once (prompt clusters; prompts and per-expert prompts: few)


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

    from hddm_flower.data import Dataset
    from hddm_flower.data.layout import PROMPT_CLUSTERS
    from hddm_flower.devices import coordinator_threads
    from hddm_flower.evaluation import reference
    from hddm_flower.evaluation.evaluate import feature_network
    from hddm_flower.reproduce.training import train_monolith
    from hddm_flower.rundir import FEATURE_NET
    from hddm_flower.stages import diagnostics
    from hddm_flower.stages.assemble import evaluate_and_report, load_ensemble
    from hddm_flower.stages.router import fit_router

    if diagnostics.SHUFFLE_BUFFER != DIAGNOSTICS_BUFFER:
        raise RuntimeError("stages.diagnostics.SHUFFLE_BUFFER changed: update DIAGNOSTICS_BUFFER here")
    cfg = config(args)
    threads = coordinator_threads(cfg.coordinator.threads)
    d, work = Dataset.open(args.dataset), Path(args.work)
    run = work / "run"
    decode = d.decoder(cfg)
    if args.stage == "report":  # computed in the stage, as on a run's first report
        shutil.rmtree(d.root / PROMPT_CLUSTERS, ignore_errors=True)
    torch.zeros(1) + 1  # torch's lazy initialisation happens before the baseline
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS: the peak from here on is the stage's own
    baseline, io0 = _status_kib("VmRSS"), _io()
    start = time.perf_counter()
    if args.stage == "router":
        fit_router(cfg, d, run)
        extra = json.loads((run / "router" / "hddm_router.json").read_text())
        extra = {k: extra[k] for k in ("steps", "images_seen", "device", "training_images")}
    elif args.stage == "feature":
        fx, _, _ = feature_network(cfg, d, run / FEATURE_NET, decode=decode)
        extra = {"features": fx.name, "steps": cfg.evaluation.feature_steps}
    elif args.stage == "reference":
        fx, _, _ = feature_network(cfg, d, run / FEATURE_NET, decode=decode)
        stats, cached = reference.reference_statistics(d, fx, decode=decode, reservoir=args.kid_reservoir, seed=0)
        extra = {"images": sum(s.count for s in stats.values()), "reused": cached["reused"]}
    elif args.stage == "diagnostics":
        ensemble, _ = load_ensemble(cfg, run)
        ev = cfg.evaluation
        batches = diagnostics.heldout_batches(d, ev.diagnostic_images, ev.batch_size, cfg.sampling.seed)
        m = diagnostics.evaluate(ensemble, batches, seed=cfg.sampling.seed, times=tuple(ev.times))
        extra = {"images": m["num_images"]}
    elif args.stage == "report":
        r = evaluate_and_report(cfg, run, d, [])
        top2 = r["metrics"]["evaluation"]["modes"]["top2"]
        extra = {"fid": top2["fid"], "diagnostic_images": r["metrics"]["num_images"]}
    else:
        ckpt = work / "monolith-train-state.pt"
        ckpt.unlink(missing_ok=True)
        _, _, meta = train_monolith(cfg, d, checkpoint=ckpt)
        extra = {"steps": meta["steps"], "images_seen": meta["images_seen"]}
    seconds = time.perf_counter() - start
    io1 = _io()
    return {
        "rss_after_imports_mib": baseline / 1024,
        "increase_mib": (_status_kib("VmHWM") - baseline) / 1024,  # the stage's peak over its post-import RSS
        "rchar": io1["rchar"] - io0["rchar"],
        "read_bytes": io1["read_bytes"] - io0["read_bytes"],
        "seconds": seconds,
        "threads": threads,
        **extra,
    }


def setup_run(args, d: str, work: str) -> None:
    """Experts for the diagnostics and report stages (``expert.steps`` each, the test preset); not measured."""
    from hddm_flower.checkpoints import save_expert
    from hddm_flower.data import Dataset
    from hddm_flower.devices import coordinator_threads
    from hddm_flower.stages.expert import train_one_expert
    from hddm_flower.stages.prepare import assign_objectives

    cfg, dataset = config(args), Dataset.open(d)
    coordinator_threads(cfg.coordinator.threads)
    for k, objective in enumerate(assign_objectives(cfg, dataset)):
        save_expert(Path(work) / "run" / "experts" / f"expert-{k}", *train_one_expert(cfg, dataset, k, objective))


def _preload() -> None:
    """Everything the stages import, imported once here: each stage is forked from this process
    (:func:`benchmarks.common.forked`) and pays no import of its own."""
    import torch  # noqa: F401

    import hddm_flower.evaluation.adherence  # noqa: F401
    import hddm_flower.evaluation.report  # noqa: F401
    import hddm_flower.hddm_pipeline  # noqa: F401
    import hddm_flower.reproduce.run  # noqa: F401
    import hddm_flower.stages.assemble  # noqa: F401
    import hddm_flower.stages.expert  # noqa: F401
    import hddm_flower.stages.prepare  # noqa: F401


def run_stage(name: str, d: Path, work: Path, args) -> dict:
    load = os.getloadavg()
    result = forked(stage, argparse.Namespace(**vars(args) | {"stage": name, "dataset": str(d), "work": str(work)}))
    return result | {"load_average_at_start": [round(x, 2) for x in load]}


def _ratio(a: float, b: float) -> float:
    return round(b / a, 3) if a else float("inf")


def render(results: dict) -> str:
    a, b = results["sizes"]["N"], results["sizes"]["4N"]
    lines = [
        "# Coordinator scale: each stage's RSS increase, bytes read and time at N and 4N",
        "",
        f"`{results['command']}` on {results['machine']}, commit {results['commit']}, {results['date']}; "
        f"{results['conditions']}",
        "",
        "| stage | increase N (MiB) | increase 4N (MiB) | ratio | read N (MB) | bound N (MB) | read 4N (MB) "
        "| bound 4N (MB) | read ratio | time N (s) | time 4N (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results["ratios_4N_over_N"].items():
        x, y = a[name], b[name]
        lines.append(
            f"| {name} | {x['increase_mib']:.1f} | {y['increase_mib']:.1f} | **{r['increase']:.3f}** "
            f"| {x['rchar'] / 1e6:.1f} | {x['must_read_bytes'] / 1e6:.1f} | {y['rchar'] / 1e6:.1f} "
            f"| {y['must_read_bytes'] / 1e6:.1f} | {r['rchar']:.2f} | {x['seconds']:.1f} | {y['seconds']:.1f} |"
        )
    lines += [
        "",
        f"N = {a['samples']:,}, 4N = {b['samples']:,} samples of {results['sample_bytes']:.0f} bytes in the shards "
        f"(mean); goal (every stage's increase at 4N ≤ 1.15 × at N) met: {results['goal_met']}. "
        "*increase*: the stage's peak RSS over its own RSS after imports; *read*: `rchar` of `/proc/self/io`; "
        "*bound*: the samples its streams pass at most by construction (what they draw, full shuffle buffers, "
        "the other split's samples a split filter passes over) × the mean sample size; the code a stage imports "
        "lazily is read too (a few MB).",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=20_000, help="N (the second size is 4N); a multiple of 32 × --shard-size")
    p.add_argument("--router-steps", type=int, default=100)
    p.add_argument("--feature-steps", type=int, default=50)
    p.add_argument("--expert-steps", type=int, default=2, help="each expert's steps (the monolith: K ×)")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--sample-steps", type=int, default=4)
    p.add_argument("--kid-reservoir", type=int, default=500)
    p.add_argument("--diagnostic-images", type=int, default=256)
    p.add_argument("--threads", type=int, default=1, help="coordinator.threads (0: the CPUs of the process)")
    p.add_argument("--latent-side", type=int, default=8)
    p.add_argument("--tokens", type=int, default=8, help="text tokens per caption (384-d states)")
    p.add_argument("--shard-size", type=int, default=125)
    p.add_argument("--val-every", type=int, default=10, help="every this many-th sample is held out")
    p.add_argument("--device", default="cpu")
    p.add_argument("--conditions", default="", help="what else ran on the machine (recorded with the result)")
    p.add_argument("--keep", default=None, metavar="DIR", help="write the datasets here and keep them (reused)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "coordinator_scale"))
    args = p.parse_args(argv)
    if args.n % (K * args.shard_size * 4):
        p.error(f"--n must be a multiple of {K * args.shard_size * 4} (8 clusters × 4 quarters × --shard-size)")
    import tempfile

    from hddm_flower.data import Dataset
    from hddm_flower.data.layout import REFERENCE_STATS, is_prepared

    keep = args.keep is not None
    root = Path(args.keep) if keep else Path(tempfile.mkdtemp(prefix="coordinator-scale-"))
    results: dict = {"sizes": {}}
    cfg = config(args)
    _preload()
    started = time.perf_counter()
    try:
        t0 = time.perf_counter()
        if keep and is_prepared(root / "data-N"):  # generated by an earlier call with --keep
            big, small = root / "data-4N", root / "data-N"
        else:
            big = generate(root / "data-4N", 4 * args.n, args)
            small = view(big, root / "data-N", 4, args)
        results["generate_seconds"] = round(time.perf_counter() - t0, 1)
        results["dataset_bytes_4N"] = sum(f.stat().st_size for f in big.rglob("*.tar"))
        results["sample_bytes"] = results["dataset_bytes_4N"] / (4 * args.n)
        for label, d in (("N", small), ("4N", big)):
            work = root / f"work-{label}"
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(d / REFERENCE_STATS, ignore_errors=True)  # the pass is measured, not reused
            work.mkdir()
            forked(setup_run, args, str(d), str(work))
            meta = Dataset.open(d).meta
            results["sizes"][label] = {"samples": meta["num_images"]}
            for name in STAGES:
                r = run_stage(name, d, work, args)
                must = must_read_samples(name, cfg, meta, args.val_every)
                r |= {"must_read_samples": must, "must_read_bytes": round(must * results["sample_bytes"])}
                results["sizes"][label][name] = r
                print(label, name, json.dumps(r), flush=True)
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    a, b = results["sizes"]["N"], results["sizes"]["4N"]
    results["ratios_4N_over_N"] = {
        name: {
            "increase": _ratio(a[name]["increase_mib"], b[name]["increase_mib"]),
            "rchar": _ratio(a[name]["rchar"], b[name]["rchar"]),
            "must_read": _ratio(a[name]["must_read_bytes"], b[name]["must_read_bytes"]),
            "seconds": _ratio(a[name]["seconds"], b[name]["seconds"]),
        }
        for name in STAGES
    }
    results["goal"] = "each stage's RSS increase over its post-import baseline at 4N ≤ 1.15 × at N"
    results["goal_met"] = all(r["increase"] <= 1.15 for r in results["ratios_4N_over_N"].values())
    load = [size[name]["load_average_at_start"][0] for size in results["sizes"].values() for name in STAGES]
    results |= {
        "command": "python -m benchmarks.coordinator_scale " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": f"{machine()}, Python {platform.python_version()}",
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "conditions": (args.conditions + "; " if args.conditions else "")
        + f"1-minute load average {min(load):.1f}–{max(load):.1f} at the stages' starts",
        "settings": {k: v for k, v in vars(args).items() if k not in ("stage", "dataset", "work", "keep", "out")},
    }
    out = Path(args.out)
    write_result(out.with_suffix(".json"), results)
    text = render(results)
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
