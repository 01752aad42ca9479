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
names a ``work-dir``, and always for a message naming several experts: :func:`_train_all`), so a node whose reply
was lost — the server stopped waiting, the coordinator crashed — sends it again instead of training again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import sys
import tempfile
from pathlib import Path

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from hddm_flower import wire
from hddm_flower.checkpoints import weights_bytes
from hddm_flower.choices import OBJECTIVES
from hddm_flower.config.io import config_from_dict
from hddm_flower.config.schema import TRAINING_SECTIONS
from hddm_flower.data import Dataset, default_cache_dir
from hddm_flower.data.layout import META as DATASET_META
from hddm_flower.logs import quiet_libraries
from hddm_flower.stages.expert import train_one_expert

from . import declare, round_handlers
from .node_data import node_dataset

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
    as many at once as this ClientApp has CPUs, one thread each (:func:`_train_all`), and replies with each
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
    dataset = node_dataset(context, cfg, cache_dir, [] if several else [expert_id for expert_id, _, _ in jobs])
    unusable: dict[int, BaseException] = {}  # expert id → why its cluster's data cannot be trained on
    if several:
        for expert_id, _, _ in jobs:
            try:
                dataset.shards(expert_id)
            except Exception as e:  # one expert's cluster: costs that expert only
                unusable[expert_id] = e
    trainable = [job for job in jobs if job[0] not in unusable]
    results = unusable | _train_all(cfg, dataset, trainable, device, node, context.node_id, several=several)
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


def _work_dir(cfg, node, expert_id: int, objective: str, dataset: Dataset, *, keep: bool = False) -> Path | None:
    """Where a restarted node finds this expert's training state and kept result (``expert.checkpoint_every`` >
    0, a node config that names a ``work-dir``, or ``keep``: a node given several experts keeps each one as it
    ends; named by :func:`_work_name`), or None."""
    if not cfg.expert.checkpoint_every and not node.get("work-dir") and not keep:
        return None
    return Path(str(node.get("work-dir", "")) or default_cache_dir() / "work") / _work_name(
        cfg, expert_id, objective, dataset
    )


def _train_all(
    cfg, dataset: Dataset, jobs: list[tuple[int, str, str]], device: str, node, node_id: int, *, several: bool = False
) -> dict:
    """Train every job; expert id → (weights blob, model config, metadata) or the exception it ended with.

    Isolated (in simulation), each expert trains in its own child process, as many at once as this process has
    torch threads (the actor's CPUs), the threads shared evenly among them (one each when there are more experts
    than CPUs); not isolated, one after another in this process. An expert trained before whose reply was lost
    is sent again from its kept checkpoint (``work-dir``).

    ``several`` (the message names several experts): a failure is its expert's result, never raised, even when only
    one of them is left to train here; and each expert is kept in the work directory as soon as it ends
    (:func:`_work_dir`), whether or not a ``work-dir`` or ``expert.checkpoint_every`` is set. One reply carries
    all of this node's experts, so a reply that never arrives (the server's ``train_timeout`` passed while the
    last expert trained, the node or its SuperNode died, the reply was lost) would cost every expert of the node;
    kept, a later run that targets them (run config ``experts``) gets each finished one sent again without a
    training step, and only the unfinished ones train (resumed with ``expert.checkpoint_every``). Why this and not
    one message (and reply) per expert: the one message lets the node schedule its experts on its own CPUs, as
    many at once as it has, the threads shared among them (docs/performance.md), which separate messages cannot
    (Flower's simulation hands each to whichever actor is free, and concurrent messages to one node race on its
    one Context); an error in any step of one expert is already that expert's alone (an error record in the
    reply); and what a single reply cannot survive, its loss, costs with the kept copies a re-run's transfer, not
    the trainings."""
    results: dict[int, object] = {}
    pending = []
    for expert_id, assigned, objective in jobs:
        work = _work_dir(cfg, node, expert_id, objective, dataset, keep=several)
        done = _finished(work)
        if done is not None:  # trained before, but the reply never made it (server timed out, node restarted …)
            log.info("expert %d: already trained (%s); sending the kept checkpoint", expert_id, work)
            results[expert_id] = done
        else:
            pending.append((expert_id, assigned, objective, work))
    if _isolated(node):
        trained = _train_side_by_side(cfg, dataset, pending, device)
    else:
        trained = _train_here(cfg, dataset, pending, device, raise_errors=not several)
    for job in pending:
        result = trained[job[0]]
        results[job[0]] = result if isinstance(result, BaseException) else _finish(job, cfg, node_id, *result)
    return {k: results[k] for k, _, _ in jobs}


def _train_side_by_side(cfg, dataset: Dataset, pending: list, device: str) -> dict:
    """Each expert in its own child process, as many at once as this process has torch threads, the threads
    shared evenly among them; expert id → (blob, model config, metadata) or the exception it ended with."""
    threads = torch.get_num_threads()
    at_once = max(1, min(len(pending), threads))
    each = max(1, threads // at_once)
    if len(pending) > 1:
        log.info("training experts %s: %d at a time, %d thread(s) each", [j[0] for j in pending], at_once, each)
    results: dict[int, object] = {}
    running: dict[int, tuple] = {}  # expert id → (child process, its temporary directory)
    queue = list(pending)
    while queue or running:
        while queue and len(running) < at_once:
            expert_id, assigned, objective, work = queue.pop(0)
            _announce(expert_id, objective, assigned, device, each)
            checkpoint = work.with_suffix(".pt") if work else None
            try:
                running[expert_id] = _start_child(cfg, dataset, expert_id, objective, device, checkpoint, each)
            except Exception as e:  # no process for this expert (fork server, temporary folder): this one only
                results[expert_id] = e
        if not running:
            continue
        ended = _wait_any([child for child, _ in running.values()])
        for expert_id in [k for k, (child, _) in running.items() if child in ended]:
            child, tmp = running.pop(expert_id)
            try:
                results[expert_id] = _collect(child, tmp, expert_id)
            except Exception as e:  # this expert only; the caller reports it
                results[expert_id] = e
    return results


def _train_here(cfg, dataset: Dataset, pending: list, device: str, *, raise_errors: bool) -> dict:
    """Each expert in this process, one after another; a failure raises (``raise_errors``) or is the expert's
    result."""
    results: dict[int, object] = {}
    for expert_id, assigned, objective, work in pending:
        _announce(expert_id, objective, assigned, device, torch.get_num_threads())
        try:
            checkpoint = work.with_suffix(".pt") if work else None
            state, model_config, meta = train_one_expert(
                cfg, dataset, expert_id, objective, device=device, checkpoint=checkpoint
            )
            results[expert_id] = (weights_bytes(state, cfg.expert.weights_dtype), model_config, meta)
            del state
        except Exception as e:
            if raise_errors:
                raise
            results[expert_id] = e
    return results


def _announce(expert_id: int, objective: str, assigned: str, device: str, threads: int) -> None:
    log.info(
        "expert %d: training %s on cluster %d (%s, %d thread%s, assigned %s)",
        expert_id,
        objective,
        expert_id,
        device,
        threads,
        "" if threads == 1 else "s",
        assigned,
    )


def _finish(job, cfg, node_id: int, blob: bytes, model_config: dict, meta: dict) -> tuple[bytes, dict, dict]:
    """Complete a fresh expert's metadata and keep it for a resend (with ``work-dir``)."""
    expert_id, assigned, _, work = job
    meta |= {
        "objective_assigned": assigned,
        "node_id": node_id,
        "weights_dtype": cfg.expert.weights_dtype,
        "sha256": hashlib.sha256(blob).hexdigest(),
    }
    if work is not None:  # keep the result until a later message (or the operator) no longer needs it
        try:
            _keep(work, blob, model_config, meta)
            work.with_suffix(".pt").unlink(missing_ok=True)
        except OSError as e:  # a full or read-only disk costs the copy, not the expert: the reply still carries it
            log.warning("expert %d: could not keep it in %s (%s); sending it unkept", expert_id, work, e)
    return blob, model_config, meta


def _isolated(node) -> bool:
    """Train in a child process? The node config's ``isolate-training`` says; by default yes inside a Ray actor
    (simulation), where a hard crash would take the actor and other nodes' experts down with it."""
    if "isolate-training" in node:
        return bool(node["isolate-training"])
    ray = sys.modules.get("ray")
    return bool(ray is not None and ray.is_initialized() and ray.get_runtime_context().get_actor_id())


def _train_in_child(
    cfg, dataset: Dataset, expert_id: int, objective: str, device: str, checkpoint: Path | None
) -> tuple[bytes, dict, dict]:
    """Train one expert in a child process with this process's torch threads (:func:`_start_child`) and wait for
    it (:func:`_collect`)."""
    child, tmp = _start_child(cfg, dataset, expert_id, objective, device, checkpoint, torch.get_num_threads())
    child.join()
    return _collect(child, tmp, expert_id)


def _start_child(cfg, dataset: Dataset, expert_id: int, objective: str, device: str, checkpoint, threads: int):
    """Start training in a child process (:func:`clients.train_worker.run`) with ``threads`` torch threads;
    returns the process and its temporary directory. The child is forked from this process's fork server, which
    has torch, diffusers and the core imported once (:func:`_workers`), so an expert costs a fork, not an
    interpreter start and its imports."""
    from clients import train_worker

    tmp = tempfile.TemporaryDirectory(prefix=f"hddm-expert-{expert_id}-")
    out = Path(tmp.name)
    spec = {
        "experiment": cfg.to_dict(),
        "dataset_dir": str(dataset.root),
        "expert_id": expert_id,
        "objective": objective,
        "device": device,
        "checkpoint": str(checkpoint) if checkpoint else None,
        "out": tmp.name,
        "threads": threads,
        "owner": os.getpid(),  # the training ends if this process does (clients.train_worker)
    }
    (out / "spec.json").write_text(json.dumps(spec))
    child = _workers().Process(target=train_worker.run, args=(str(out / "spec.json"),), name=f"hddm-expert-{expert_id}")
    child.start()
    return child, tmp


def _wait_any(children: list) -> set:
    """Block until at least one of the child processes has ended; the ended ones."""
    from multiprocessing.connection import wait

    wait([c.sentinel for c in children])
    ended = set()
    for c in children:
        if not c.is_alive():
            c.join()
            ended.add(c)
    return ended


def _collect(child, tmp: tempfile.TemporaryDirectory, expert_id: int) -> tuple[bytes, dict, dict]:
    """Read an ended child's weights and result; a crash or failure of the child becomes an exception naming
    the expert. Removes the child's temporary directory."""
    from clients import train_worker

    with tmp:
        out = Path(tmp.name)
        rc = child.exitcode
        if rc:
            if rc < 0:
                why = f"was killed by {signal.Signals(-rc).name} (out of memory?)"
            else:
                error = out / train_worker.ERROR
                why = f"failed with exit code {rc}: {error.read_text().strip() if error.exists() else 'no message'}"
            raise RuntimeError(f"the training process of expert {expert_id} {why}")
        result = json.loads((out / "result.json").read_text())
        return (out / "weights.safetensors").read_bytes(), result["model_config"], result["meta"]


_WORKERS = None


def _workers():
    """The multiprocessing context whose fork server (started on first use, one per process, i.e. per Ray actor)
    has preloaded what training imports; each training is a fresh process forked from it."""
    global _WORKERS
    if _WORKERS is None:
        import multiprocessing

        from clients import train_worker

        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["clients.train_worker", *train_worker.PRELOAD])
        _WORKERS = ctx
    return _WORKERS


def _work_name(cfg, expert_id: int, objective: str, dataset: Dataset) -> str:
    """The name of an expert's training state and kept result in the node's work directory: the expert id and a
    hash of what its weights depend on — the training sections of the experiment (not federation or sampling:
    they change per run), the objective this node trains, and the data (the prepared dataset's ``meta.json``:
    source, sizes, clusters). Another experiment, objective or dataset never picks up this expert."""
    what = {k: cfg.to_dict()[k] for k in TRAINING_SECTIONS}
    data = hashlib.sha256((dataset.root / DATASET_META).read_bytes()).hexdigest()
    digest = hashlib.sha256(f"{json.dumps(what, sort_keys=True)}|{objective}|{data}".encode()).hexdigest()[:16]
    return f"expert-{expert_id}-{digest}"


def _keep(work: Path, blob: bytes, model_config: dict, meta: dict) -> None:
    """Keep the final checkpoint next to the training state (weights first, then the JSON that marks it done)."""
    weights, info = work.with_suffix(".safetensors"), work.with_suffix(".json")
    weights.parent.mkdir(parents=True, exist_ok=True)
    tmp = weights.with_name(weights.name + ".tmp")
    tmp.write_bytes(blob)
    os.replace(tmp, weights)
    tmp = info.with_name(info.name + ".tmp")
    tmp.write_text(json.dumps({"meta": meta, "model_config": model_config}))
    os.replace(tmp, info)


def _finished(work: Path | None) -> tuple[bytes, dict, dict] | None:
    """The kept final checkpoint of this expert and experiment, if it exists and its hash still matches."""
    if work is None or not work.with_suffix(".json").exists():
        return None
    try:
        info = json.loads(work.with_suffix(".json").read_text())
        blob = work.with_suffix(".safetensors").read_bytes()
        if hashlib.sha256(blob).hexdigest() != info["meta"]["sha256"]:
            raise ValueError("its sha256 does not match its metadata")
        return blob, info["model_config"], info["meta"]
    except (OSError, ValueError, KeyError, TypeError) as e:  # a damaged copy costs a training, not the expert
        log.warning("kept checkpoint %s is unusable (%s); training again", work, str(e).splitlines()[0][:200])
        return None


def _set_threads(node) -> None:
    """``num-threads`` if the node config says; in simulation the CPUs Ray gave this ClientApp's actor
    (``client-resources-num-cpus``: Flower runs as many actors as the CPUs allow; an actor given several experts
    trains as many at once as it has CPUs, see :func:`_train_side_by_side`); else all cores (a real SuperNode),
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
