#!/usr/bin/env python3
"""Server peak memory while K large bf16 experts arrive, and the bytes each one costs on the wire.

Two processes, as in a deployment:

* a *sender* process builds K synthetic experts (random bf16 weights of a PixArt B/2-width model with 16 blocks at
  the paper's latent shapes: 156.8M parameters, 299 MiB as bf16), packs each exactly as the ClientApp does (the
  safetensors bytes as one ``Array``), and stores the reply as Flower's wire objects (``get_all_nested_objects``
  → ``deflate``: the 5 MiB ``ArrayChunk`` objects a SuperNode pushes), one file per object — standing in for the
  SuperLink's object store, which holds replies outside the ServerApp's process;
* the *server* process (this one) runs :class:`OneShotExperts` over flwr's real ``HttpGrid``, whose Runtime API
  client is ``strategies/inprocess_grid.WireRuntime`` serving those objects (``PullMessages``, ``PullObject``,
  ``ConfirmMessageReceived``; no HTTP). The strategy pulls each reply with ``strategies/spool.py`` (chunks written
  to disk as they arrive), validates the file (sha256, safetensors header, names, shapes, dtypes, finite values)
  and installs it.

Reported: the server's peak RSS above its baseline (torch, diffusers and flwr imported), against the size of one
expert and of K, for three ways of pulling: ``spool`` (what the strategy does), ``flwr`` (flwr's own
``HttpGrid.pull_messages``, one reply at a time: what the strategy did before spooling) and ``naive`` (all replies
pulled before any is saved, as ``Grid.send_and_receive`` does); and the bytes on the wire per expert against its
safetensors file (and against float32).

    python -m benchmarks.server_memory                       # 8 × 299 MiB bf16 (needs ~5 GB of disk, ~3 min)
    python -m benchmarks.server_memory --experts 2 --layers 2  # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, module_command, peak_rss_mib, rss_mib, write_result

MODES = {
    "spool": "OneShotExperts: one reply at a time, weights spooled to disk chunk by chunk",
    "flwr": "OneShotExperts with flwr's HttpGrid.pull_messages, one reply at a time (before spooling)",
    "naive": "all replies pulled with HttpGrid.pull_messages, then saved (Grid.send_and_receive)",
}


def model_config(layers: int) -> dict:
    from hddm_flower.models import expert_config

    return expert_config("B/2", sample_size=32, in_channels=4, caption_channels=768) | {"num_layers": layers}


def produce(store: Path, k: int, layers: int) -> dict:
    """Build expert k, pack it like the ClientApp, and store its reply to message ``train-k`` as wire objects."""
    import hashlib

    import torch
    from diffusers import PixArtTransformer2DModel
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from hddm_flower.checkpoints import TIME_CONVENTION, weights_bytes
    from strategies.inprocess_grid import store_reply

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 100 + k, 1
    config = model_config(layers)
    with torch.device("meta"):
        shapes = {n: t.shape for n, t in PixArtTransformer2DModel.from_config(config).state_dict().items()}
    g = torch.Generator().manual_seed(k)
    state = {n: torch.randn(s, generator=g, dtype=torch.float32).to(torch.bfloat16) for n, s in shapes.items()}
    try:
        ArrayRecord(state)
        numpy_path = "accepted"
    except TypeError as e:  # flwr 1.42: bf16 has no numpy dtype
        numpy_path = f"TypeError: {e}"
    blob = weights_bytes(state)
    fp32_bytes = sum(t.numel() * 4 for t in state.values())
    del state
    meta = {
        "expert_id": k,
        "cluster_id": k,
        "objective": "fm",
        "preset": "B/2",
        "time_convention": TIME_CONVENTION,
        "steps": 0,
        "images_seen": 0,
        "device_seconds": 0.0,
        "weights_dtype": "bfloat16",
        "sha256": hashlib.sha256(blob).hexdigest(),
    }
    train = Message(RecordDict(), dst_node_id=100 + k, message_type=MessageType.TRAIN)
    train.metadata.__dict__["_message_id"] = f"train-{k}"
    reply = Message(
        RecordDict(
            {
                "expert": ArrayRecord(
                    {"weights": Array(dtype="uint8", shape=(len(blob),), stype="safetensors", data=blob)}
                ),
                "meta": ConfigRecord({"meta": json.dumps(meta), "model-config": json.dumps(config)}),
                "metrics": MetricRecord({"expert-id": k}),
            }
        ),
        reply_to=train,
    )
    folder = store / f"reply-{k}"
    wire = store_reply(reply, folder)
    return {
        "expert_id": k,
        "safetensors_bytes": len(blob),
        "wire_bytes": wire,
        "objects": sum(1 for p in folder.iterdir() if not p.name.endswith(".pb")),
        "float32_bytes": fp32_bytes,
        "arrayrecord_numpy_path": numpy_path,
    }


def serve(store: Path, experts: int, layers: int, mode: str, run_dir: Path) -> dict:
    import torch  # noqa: F401  (the baseline includes what a ServerApp imports)
    from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    import strategies.one_shot
    from hddm_flower.accept import ExpertSpec, ExpertStore
    from strategies.inprocess_grid import WireRuntime, wire_grid
    from strategies.one_shot import OneShotExperts

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    nodes = {100 + k: k for k in range(experts)}

    def deliver(message: Message):
        """The nodes: a query gets the node's expert id; a train message the reply the sender stored."""
        k = nodes[message.metadata.dst_node_id]
        if message.metadata.message_type == "query":
            reply = Message(RecordDict({"node-info": ConfigRecord({"expert-id": k})}), reply_to=message)
            reply.metadata.__dict__["_src_node_id"] = message.metadata.dst_node_id
            return reply
        return store / f"reply-{k}"

    runtime = WireRuntime(
        nodes, deliver, message_id=lambda proto: f"{proto.metadata.message_type}-{nodes[proto.metadata.dst_node_id]}"
    )
    grid = wire_grid(runtime)
    spec = ExpertSpec(num_experts=experts, model_config=model_config(layers), max_bytes=0, preset="B/2")
    strategy = OneShotExperts(
        ExpertStore(run_dir, spec),
        {"expert": {"preset": "B/2"}},
        ["fm"] * experts,
        min_nodes=experts,
        node_wait_timeout=1,
        poll_interval=0.01,
    )
    spooled_pull = strategies.one_shot.pull_replies
    if mode == "flwr":  # flwr's own pull (the chunks inflated in memory) instead of the spooled one
        strategies.one_shot.pull_replies = lambda grid, ids, spool_dir, **kw: list(grid.pull_messages(ids))
    baseline, start = rss_mib(), time.perf_counter()
    try:
        if mode == "naive":  # what Grid.send_and_receive does: every reply in memory, then aggregate
            strategy.discover(grid, timeout=10)
            messages = list(strategy.configure_train(1, ArrayRecord(), ConfigRecord(), grid))
            ids = grid.push_messages(messages)
            for message_id, message in zip(ids, messages):
                strategy.sent(message_id, message)
            strategy.aggregate_train(1, grid.pull_messages(ids))
        else:
            strategy.start(grid, timeout=600)
    finally:
        strategies.one_shot.pull_replies = spooled_pull
    seconds = time.perf_counter() - start
    assert sorted(strategy.received) == list(range(experts)), strategy.missing
    leftovers = sorted(p.name for p in (run_dir / "experts").iterdir() if not p.name.startswith("expert-"))
    assert not leftovers, f"files left behind in experts/: {leftovers}"
    return {
        "mode": mode,
        "what": MODES[mode],
        "baseline_rss_mib": round(baseline, 1),
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "peak_above_baseline_mib": round(peak_rss_mib() - baseline, 1),
        "seconds": round(seconds, 1),
        "objects_pulled": runtime.pulled_objects,
    }


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--layers", type=int, default=16, help="blocks of the B/2-width model (16: 299 MiB as bf16)")
    p.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temporary one)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "server_memory.json")
    p.add_argument("--modes", default="spool,flwr,naive", help=f"comma-separated, from {list(MODES)}")
    p.add_argument("--role", choices=["main", "produce", "serve"], default="main", help=argparse.SUPPRESS)
    p.add_argument("--k", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=list(MODES), default="spool", help=argparse.SUPPRESS)
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.role == "produce":
        print(json.dumps(produce(args.work, args.k, args.layers)))
        return 0
    if args.role == "serve":
        print(json.dumps(serve(args.work / "store", args.experts, args.layers, args.mode, args.work / "run")))
        return 0

    work = args.work or Path(tempfile.mkdtemp(prefix="hddm-server-memory-"))
    store = work / "store"

    def child(*extra: str) -> dict:
        cmd = module_command(
            "benchmarks.server_memory",
            "--work",
            str(work if "serve" in extra else store),
            "--experts",
            str(args.experts),
            "--layers",
            str(args.layers),
            *extra,
        )
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if res.returncode:
            raise SystemExit(f"{' '.join(extra)} failed:\n{res.stderr[-3000:]}")
        return json.loads(res.stdout.strip().splitlines()[-1])

    try:
        started = time.perf_counter()
        sent = []
        for k in range(args.experts):  # (a kept --work store is reused)
            done = store / f"sent-{k}.json"
            if not done.exists():
                shutil.rmtree(store / f"reply-{k}", ignore_errors=True)
                store.mkdir(parents=True, exist_ok=True)
                (store / "tmp.json").write_text(json.dumps(child("--role", "produce", "--k", str(k))))
                os.replace(store / "tmp.json", done)
            sent.append(json.loads(done.read_text()))
        print(f"sender: {args.experts} experts stored as wire objects in {time.perf_counter() - started:.0f} s")
        runs = []
        for mode in args.modes.split(","):
            if mode not in MODES:
                raise SystemExit(f"--modes: unknown mode {mode!r}; expected some of {list(MODES)}")
            shutil.rmtree(work / "run", ignore_errors=True)
            runs.append(child("--role", "serve", "--mode", mode))
            print(json.dumps(runs[-1]))
        one = sent[0]["safetensors_bytes"] / 2**20
        result = {
            "experts": args.experts,
            "model": f"PixArt B/2 width, {args.layers} blocks, 4x32x32 latents, text 768",
            "weights_dtype": "bfloat16",
            "expert_mib": round(one, 1),
            "all_experts_mib": round(one * args.experts, 1),
            "wire_bytes_over_safetensors": round(
                sum(s["wire_bytes"] for s in sent) / sum(s["safetensors_bytes"] for s in sent), 5
            ),
            "wire_bytes_over_float32": round(
                sum(s["wire_bytes"] for s in sent) / sum(s["float32_bytes"] for s in sent), 4
            ),
            "arrayrecord_from_bf16_state_dict": sent[0]["arrayrecord_numpy_path"],
            "per_expert": sent,
            "server": runs,
            "conditions": f"{os.cpu_count()} CPUs shared with other jobs; replies read from local disk; "
            f"peak = ru_maxrss of the server process, baseline = its RSS after imports",
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_result(args.out, result)
        print(f"one expert: {one:.0f} MiB; all {args.experts}: {one * args.experts:.0f} MiB")
        for s in runs:
            print(
                f"server peak above baseline, {s['mode']}: {s['peak_above_baseline_mib']:.0f} MiB = "
                f"{s['peak_above_baseline_mib'] / one:.2f} × one expert ({s['what']})"
            )
        print(
            f"bytes on the wire / safetensors file: {result['wire_bytes_over_safetensors']:.5f}; "
            f"/ float32: {result['wire_bytes_over_float32']:.4f}; results in {args.out}"
        )
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
