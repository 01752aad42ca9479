"""The ClientApp's experts in training: each in its own child process or one after another in this one, and each
trained expert kept for a resend (:mod:`clients.kept_experts`).

In simulation every ClientApp of a Ray actor shares its process, so there the experts train in child processes
(:func:`isolated`) forked from a fork server that has the training's imports loaded once (:func:`workers`), as many
at once as this process has torch threads, the threads shared evenly among them; a hard crash costs only its own
expert (:mod:`clients.train_worker`).
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

from hddm_flower.checkpoints import weights_bytes
from hddm_flower.data import Dataset
from hddm_flower.stages.expert import train_one_expert

from . import kept_experts

log = logging.getLogger("hddm_flower.client")


def train_all(
    cfg, dataset: Dataset, jobs: list[tuple[int, str, str]], device: str, node, node_id: int, *, several: bool = False
) -> dict:
    """Train every job; expert id → (weights blob, model config, metadata) or the exception it ended with.

    Isolated (in simulation), each expert trains in its own child process, as many at once as this process has
    torch threads (the actor's CPUs), the threads shared evenly among them (one each when there are more experts
    than CPUs); not isolated, one after another in this process. An expert trained before whose reply was lost
    is sent again from its kept checkpoint (``work-dir``).

    ``several`` (the message names several experts): a failure is its expert's result, never raised, even when only
    one of them is left to train here; and each expert is kept in the work directory as soon as it ends
    (:func:`clients.kept_experts.work_dir`), whether or not a ``work-dir`` or ``expert.checkpoint_every`` is set. One reply carries
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
        work = kept_experts.work_dir(cfg, node, expert_id, objective, dataset, keep=several)
        done = kept_experts.finished(work)
        if done is not None:  # trained before, but the reply never made it (server timed out, node restarted …)
            log.info("expert %d: already trained (%s); sending the kept checkpoint", expert_id, work)
            results[expert_id] = done
        else:
            pending.append((expert_id, assigned, objective, work))
    if isolated(node):
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
            kept_experts.keep(work, blob, model_config, meta)
            work.with_suffix(".pt").unlink(missing_ok=True)
        except OSError as e:  # a full or read-only disk costs the copy, not the expert: the reply still carries it
            log.warning("expert %d: could not keep it in %s (%s); sending it unkept", expert_id, work, e)
    return blob, model_config, meta


def isolated(node) -> bool:
    """Train in a child process? The node config's ``isolate-training`` says; by default yes inside a Ray actor
    (simulation), where a hard crash would take the actor and other nodes' experts down with it."""
    if "isolate-training" in node:
        return bool(node["isolate-training"])
    ray = sys.modules.get("ray")
    return bool(ray is not None and ray.is_initialized() and ray.get_runtime_context().get_actor_id())


def train_in_child(
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
    has torch, diffusers and the core imported once (:func:`workers`), so an expert costs a fork, not an
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
    child = workers().Process(target=train_worker.run, args=(str(out / "spec.json"),), name=f"hddm-expert-{expert_id}")
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


def workers():
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
