"""The ClientApp: an institution trains one expert on its own data, in isolation, and replies with the checkpoint.

Messages it answers:

* ``query``: reports this node's ``node_config`` (partition or expert id, objective override, data directory), so
  the server can assign experts to nodes.
* ``train``: trains expert ``expert-id`` on its cluster with the objective the server assigned, or the one the
  SuperNode's ``--node-config objective=...`` forces (the metadata records both), and replies with the weights
  (``expert``), the checkpoint metadata and the model config (``meta``), and compute metrics (``metrics``).

Node config keys understood (all optional): ``partition-id`` / ``expert-id``, ``objective`` (fm|ddpm),
``data-dir`` (a prepared dataset directory), ``shard-set`` (one cluster's folder ``cluster-k`` of `hddm cluster`
output, all this node needs; it must be the shard set of the expert id the server assigns), ``cache-dir``, ``work-dir`` (training-state checkpoints when
``expert.checkpoint_every`` > 0), ``device`` (e.g. cuda:0), ``num-threads``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from hddm_flower.config import OBJECTIVES, config_from_dict
from hddm_flower.data import cluster_shards, default_cache_dir
from hddm_flower.pipeline import prepare_data, train_one_expert

app = ClientApp()
log = logging.getLogger("hddm_flower.client")
# progress of the core (training steps) goes wherever Flower's own log goes (the SuperNode's or Ray's output)
_core_log = logging.getLogger("hddm_flower")
if not _core_log.handlers:
    _core_log.setLevel(logging.INFO)
    for handler in logging.getLogger("flwr").handlers:
        _core_log.addHandler(handler)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Report who this node is; the server assigns experts from these answers."""
    info = ConfigRecord({str(k): v for k, v in context.node_config.items()})
    info["cuda"] = torch.cuda.is_available()
    return Message(RecordDict({"node-info": info}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train one expert in isolation and reply with its final checkpoint."""
    node = context.node_config
    task = msg.content["config"]
    cfg = config_from_dict(json.loads(str(task["experiment"])), source="train message")
    expert_id = int(task["expert-id"])
    assigned = str(task["objective"])
    objective = str(node.get("objective", assigned))
    if objective not in OBJECTIVES:
        raise ValueError(f"node config objective={objective!r} is not one of {OBJECTIVES}")
    _set_threads(node)
    device = str(node.get("device", "cuda" if torch.cuda.is_available() else "cpu"))

    if node.get("shard-set"):  # this institution's own cluster folder (`hddm cluster` output: cluster-k/)
        dataset_dir = Path(str(node["shard-set"]))
        cluster_shards(dataset_dir, expert_id)  # fail early: a wrong path, another cluster's set, or no shards
    elif node.get("data-dir"):
        dataset_dir = Path(str(node["data-dir"]))
        cluster_shards(dataset_dir, expert_id)  # fail early and clearly on a wrong path or an empty cluster
    else:  # the embedded dataset, prepared locally (once per cache directory)
        dataset_dir = prepare_data(cfg, str(node.get("cache-dir", "")) or str(task["cache-dir"]) or None)

    log.info("expert %d: training %s on cluster %d (%s, assigned %s)", expert_id, objective, expert_id, device,
             assigned)
    checkpoint = None
    if cfg.expert.checkpoint_every:  # a restarted node resumes the same experiment's training from here
        digest = hashlib.sha256(f"{task['experiment']}|{objective}".encode()).hexdigest()[:16]
        work = Path(str(node.get("work-dir", "")) or default_cache_dir() / "work")
        checkpoint = work / f"expert-{expert_id}-{digest}.pt"
    state, model_config, meta = train_one_expert(cfg, dataset_dir, expert_id, objective, device=device,
                                                 checkpoint=checkpoint)
    if checkpoint is not None:
        checkpoint.unlink(missing_ok=True)  # the final weights travel in the reply
    meta |= {"objective_assigned": assigned, "node_id": context.node_id}
    metrics = MetricRecord({"expert-id": expert_id, "steps": meta["steps"], "images-seen": meta["images_seen"],
                            "device-seconds": float(meta["device_seconds"]),
                            "peak-memory-bytes": meta["peak_memory_bytes"], "final-loss": float(meta["final_loss"])})
    content = RecordDict({
        "expert": ArrayRecord(state),
        "meta": ConfigRecord({"meta": json.dumps(meta), "model-config": json.dumps(model_config)}),
        "metrics": metrics,
    })
    return Message(content, reply_to=msg)


def _set_threads(node) -> None:
    """One thread per simulated node (they share the machine); all cores for a real SuperNode."""
    if "num-threads" in node:
        n = int(node["num-threads"])
    else:
        n = max(1, (os.cpu_count() or 1) // int(node.get("num-partitions", 1)))
    torch.set_num_threads(n)
