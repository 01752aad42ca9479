"""The ClientApp: an institution trains one expert on its own data, in isolation, and replies with the checkpoint.

Messages it answers:

* ``query``: reports this node's ``node_config`` (partition or expert id, objective override, data directory), so
  the server can assign experts to nodes.
* ``train.router``, ``evaluate.router``, ``query.feature_stats``, ``train.feature_net``: the federated router's
  rounds, the federated FID reference statistics and feature classifier, on this node's clusters
  (:mod:`clients.round_handlers`).
* ``query.declare`` (``data.partition: institution``): what this node's own data is (:mod:`clients.declare`).
* ``train``: trains expert ``expert-id`` on its cluster with the objective the server assigned, or the one the
  SuperNode's ``--node-config objective=...`` forces (the metadata records both), and replies with the weights
  (``expert``), the checkpoint metadata and the model config (``meta``), and compute metrics (``metrics``). A
  simulated SuperNode holding several experts gets them all in one message (``expert-ids``), trains them side by
  side on its CPUs and replies with each under its own record names, or an error record for one that failed.

Node config keys understood (all optional): ``partition-id`` / ``expert-id``, ``objective`` (fm|ddpm),
``data-dir`` (a prepared dataset directory), ``shard-set`` (one cluster's folder ``cluster-k`` of `hddm cluster`
output, all this node needs; it must be the shard set of the expert id the server assigns), ``cache-dir``,
``work-dir`` (training-state checkpoints when ``expert.checkpoint_every`` > 0, and the final weights), ``device`` (e.g. cuda:0),
``num-threads``, ``isolate-training`` (train in a child process, so that a hard crash fails only this expert; the
default inside a Ray actor, i.e. in simulation).

Restarts: with ``expert.checkpoint_every`` > 0 the training state is saved in ``work-dir`` every N steps under a
name made of the expert id and a hash of the experiment's training sections, the objective and the dataset. A
restarted node that gets the same expert of the same experiment again (e.g. from a later run that targets the
missing experts) resumes from the last checkpoint, and the final metadata says how many steps were resumed
(``resumed_steps``). The final checkpoint is kept there too (also with ``checkpoint_every`` 0 when the node config
names a ``work-dir``, and always for a message naming several experts: :func:`clients.expert_pool.train_all`), so a node whose reply
was lost — the server stopped waiting, the coordinator crashed — sends it again instead of training again.
"""

from __future__ import annotations

import json
import logging
import os
import sys

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from hddm_flower import wire
from hddm_flower.choices import OBJECTIVES
from hddm_flower.config.io import config_from_dict
from hddm_flower.data import Dataset
from hddm_flower.logs import quiet_libraries
from hddm_flower.stages.prepare import prepare_data

from . import declare, expert_pool, round_handlers

app = ClientApp()
quiet_libraries()  # no third-party progress bars or warnings in the Flower log
log = logging.getLogger("hddm_flower.client")
# progress of the core (training steps) goes wherever Flower's own log goes (the SuperNode's or Ray's output)
_core_log = logging.getLogger("hddm_flower")
if not _core_log.handlers:
    _core_log.setLevel(logging.INFO)
    for handler in logging.getLogger("flwr").handlers:
        _core_log.addHandler(handler)


# the federated router's rounds and the federated reference statistics (clients/round_handlers.py)
app.train("router", mods=[round_handlers.clip_when_asked])(round_handlers.router_update)
app.evaluate("router")(round_handlers.evaluate_router)
app.query("feature_stats")(round_handlers.feature_stats)
app.train("feature_net")(round_handlers.feature_net_update)
# institution-owned data: the node's declaration (clients/declare.py)
app.query("declare")(declare.declare)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Report who this node is; the server assigns experts from these answers."""
    info = ConfigRecord({str(k): v for k, v in context.node_config.items()})
    info["cuda"] = torch.cuda.is_available()
    return Message(RecordDict({wire.NODE_INFO: info}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the expert(s) of the message in isolation and reply with their final checkpoints.

    A message naming one expert (an institution) gets the one-expert reply, or an error reply when its training
    fails. A message naming several (a simulated SuperNode holding several experts) trains them side by side,
    as many at once as this ClientApp has CPUs, one thread each (:func:`clients.expert_pool.train_all`), and replies with each
    expert's records under its own names (:func:`hddm_flower.wire.expert_record`) or, for an expert whose
    training failed, an error record: one failure costs only its own expert."""
    node = context.node_config
    task = msg.content[wire.TASK]
    cfg = config_from_dict(json.loads(str(task[wire.TASK_EXPERIMENT])), source="train message")
    jobs = _jobs(task, node)
    _set_threads(node)
    device = str(node.get("device", "cuda" if torch.cuda.is_available() else "cpu"))

    cache_dir = str(task[wire.TASK_CACHE_DIR]) or None
    several = len(jobs) > 1
    # one expert: its cluster's data checked before anything else (fail early, naming the path); several: each
    # expert's cluster checked on its own, so that one cluster without data costs only its own expert
    clusters = [] if several else [expert_id for expert_id, _, _ in jobs]
    dataset = Dataset.for_node(context.node_config, cfg, prepare_data, cache_dir=cache_dir, clusters=clusters)
    unusable: dict[int, BaseException] = {}  # expert id → why its cluster's data cannot be trained on
    if several:
        for expert_id, _, _ in jobs:
            try:
                dataset.shards(expert_id)
            except Exception as e:  # one expert's cluster: costs that expert only
                unusable[expert_id] = e
    trainable = [job for job in jobs if job[0] not in unusable]
    results = unusable | expert_pool.train_all(cfg, dataset, trainable, device, node, context.node_id, several=several)
    content = RecordDict()
    for expert_id, _, _ in jobs:
        result = results[expert_id]
        if not several:
            if isinstance(result, BaseException):
                raise result
            content.update(_expert_records(expert_id, result, None))
            continue
        try:
            if isinstance(result, BaseException):
                raise result
            content.update(_expert_records(expert_id, result, expert_id))
        except Exception as e:  # whatever this expert's training or its records raised: this expert only
            log.warning("expert %d failed: %s", expert_id, e)
            reason = f"{type(e).__name__}: {str(e).strip()}"[: wire.MAX_REASON_CHARS]
            content[wire.expert_record(wire.ERROR, expert_id)] = ConfigRecord({wire.ERROR_REASON: reason})
    return Message(content, reply_to=msg)


def _expert_records(expert_id: int, result: tuple[bytes, dict, dict], key: int | None) -> dict:
    """One trained expert's records of a train reply (named by :func:`hddm_flower.wire.expert_record`)."""
    blob, model_config, meta = result
    return {
        wire.expert_record(wire.EXPERT, key): ArrayRecord(  # the safetensors file as one raw array: dtypes kept
            {wire.WEIGHTS: Array(dtype="uint8", shape=(len(blob),), stype=wire.STYPE, data=blob)}
        ),
        wire.expert_record(wire.META, key): ConfigRecord(
            {wire.META_JSON: json.dumps(meta), wire.MODEL_CONFIG_JSON: json.dumps(model_config)}
        ),
        wire.expert_record(wire.METRICS, key): _metrics(expert_id, meta),
    }


def _jobs(task: ConfigRecord, node) -> list[tuple[int, str, str]]:
    """(expert id, objective assigned, objective trained) of each expert a train message names; the node
    config's ``objective`` overrides the assigned one (the metadata records both)."""
    if wire.TASK_EXPERT_IDS in task:
        ids, assigned = list(task[wire.TASK_EXPERT_IDS]), list(task[wire.TASK_OBJECTIVES])
        if len(ids) != len(assigned):
            raise ValueError(f"train message: {len(ids)} expert ids but {len(assigned)} objectives")
    else:
        ids, assigned = [task[wire.TASK_EXPERT_ID]], [task[wire.TASK_OBJECTIVE]]
    jobs = []
    for expert_id, objective_assigned in zip(ids, assigned):
        objective = str(node.get("objective", objective_assigned))
        if objective not in OBJECTIVES:
            raise ValueError(f"node config objective={objective!r} is not one of {OBJECTIVES}")
        jobs.append((int(expert_id), str(objective_assigned), objective))
    return jobs


def _metrics(expert_id: int, meta: dict) -> MetricRecord:
    return MetricRecord(
        {
            "expert-id": expert_id,
            "steps": meta["steps"],
            "images-seen": meta["images_seen"],
            "resumed-steps": meta.get("resumed_steps", 0),
            "device-seconds": float(meta["device_seconds"]),
            "peak-memory-bytes": meta["peak_memory_bytes"],
            "final-loss": float(meta["final_loss"]),
        }
    )


def _set_threads(node) -> None:
    """``num-threads`` if the node config says; in simulation the CPUs Ray gave this ClientApp's actor
    (``client-resources-num-cpus``: Flower runs as many actors as the CPUs allow; an actor given several experts
    trains as many at once as it has CPUs, see :mod:`clients.expert_pool`); else all cores (a real SuperNode),
    shared among ``num-partitions`` if given."""
    if "num-threads" in node:
        n = int(node["num-threads"])
    elif (cpus := _actor_cpus()) is not None:
        n = cpus
    else:
        n = (os.cpu_count() or 1) // int(node.get("num-partitions", 1))
    torch.set_num_threads(max(1, n))


def _actor_cpus() -> int | None:
    """The whole CPUs assigned to the Ray actor this runs in (None outside one)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized() or not ray.get_runtime_context().get_actor_id():
        return None
    return int(ray.get_runtime_context().get_assigned_resources().get("CPU", 0)) or None
