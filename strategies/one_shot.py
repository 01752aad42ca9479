"""A one-shot, no-aggregation Flower strategy for heterogeneous diffusion experts."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from hddm_flower.checkpoints import REQUIRED_META, CheckpointRejected, install_expert, validate_weights_file
from hddm_flower.config import OBJECTIVES
from strategies.spool import SpooledArray, discard, pull_replies, spooled_arrays

WIRE_STYPE = "safetensors"  # the stype of the one array a train reply carries: the expert's safetensors bytes


class OneShotExperts(Strategy):
    """One-shot federation of diffusion experts, without aggregation.

    Each node (institution) trains one expert on its own cluster with its own objective (a simulated node may
    train several, see :meth:`discover`) and replies once per expert with the final
    checkpoint: its safetensors bytes as one array (``stype="safetensors"``, so bf16 travels as bf16). Nothing is
    averaged: each reply is pulled alone, its weights written to disk chunk by chunk as they arrive
    (:func:`strategies.spool.pull_replies`; in deployment the server never holds a whole checkpoint in memory),
    validated there (:func:`validate_weights_file`: size,
    sha256, safetensors only, names/shapes/dtypes of the run's preset, finite values) and moved to
    ``run_dir/experts/expert-<id>``. Error replies,
    rejected checkpoints, silent nodes, expired messages and experts without a node are recorded in ``missing``
    with their reason; the run goes on when at least ``min_experts`` experts are there.

    Parameters
    ----------
    run_dir : Path
        Absolute directory of this run; experts are written to ``run_dir/experts``.
    experiment : dict
        The resolved experiment configuration, sent to every node with its task.
    objectives : list[str]
        The objective of each expert id (``"fm"`` or ``"ddpm"``); its length is the number of experts.
    min_nodes : int (default: 1)
        Wait until this many nodes are connected before assigning experts, or ``node_wait_timeout`` seconds, or (in
        simulation) until all simulated nodes are there.
    min_experts : int (default: 1)
        Minimum number of experts needed to build the ensemble.
    node_wait_timeout : float (default: 120.0)
        Seconds to wait for ``min_nodes``; then the strategy goes on with the nodes it has.
    message_ttl : float | None (default: None)
        TTL of train messages in seconds (None = Flower's default, 12 h). Must exceed the training time.
    cache_dir : str (default: "")
        Where nodes without a ``data-dir`` prepare the embedded dataset ("" = their default).
    poll_interval : float (default: 1.0)
        Seconds between polls for replies.
    model_config : dict | None (default: None)
        The expert model config every checkpoint must match (the run's preset at the dataset's shapes); None
        accepts the config a reply declares (its names and shapes are still checked against it).
    max_checkpoint_bytes : int (default: 0)
        Refuse weights larger than this before writing them (0 = no limit).
    experts : Iterable[int] | None (default: None)
        Train only these expert ids (e.g. the ones a previous run lost); None = all of them.
    present : Iterable[int] (default: ())
        Expert ids already in ``run_dir/experts`` (from an earlier run); they count towards ``min_experts``.
    """

    def __init__(
        self,
        run_dir: Path,
        experiment: dict,
        objectives: list[str],
        *,
        min_nodes: int = 1,
        min_experts: int = 1,
        node_wait_timeout: float = 120.0,
        message_ttl: float | None = None,
        cache_dir: str = "",
        poll_interval: float = 1.0,
        model_config: dict | None = None,
        max_checkpoint_bytes: int = 0,
        experts: Iterable[int] | None = None,
        present: Iterable[int] = (),
    ) -> None:
        bad = [o for o in objectives if o not in OBJECTIVES]
        if bad:
            raise ValueError(f"unknown objectives {bad}; expected {OBJECTIVES}")
        self.run_dir, self.experiment, self.objectives = Path(run_dir), experiment, list(objectives)
        self.min_nodes, self.min_experts = min_nodes, min_experts
        self.node_wait_timeout, self.message_ttl, self.cache_dir = node_wait_timeout, message_ttl, cache_dir
        self.poll_interval, self.model_config, self.max_checkpoint_bytes = (
            poll_interval,
            model_config,
            max_checkpoint_bytes,
        )
        self.targets = sorted(set(range(len(objectives)) if experts is None else experts))
        self.present = set(present)
        out = [k for k in self.targets + sorted(self.present) if not 0 <= k < len(objectives)]
        if out:
            raise ValueError(f"expert ids {out} outside 0..{len(objectives) - 1}")
        if set(self.targets) & self.present:
            raise ValueError(f"experts {sorted(set(self.targets) & self.present)} are already present")
        self.assignment: dict[int, list[int]] = {}  # node id → its expert ids (one, except simulated nodes)
        self.received: dict[int, dict[str, Any]] = {}  # expert id → checkpoint metadata
        self.missing: dict[int, str] = {}  # expert id → reason
        self._message_expert: dict[str, int] = {}  # train message id → expert id

    @property
    def num_experts(self) -> int:
        return len(self.objectives)

    def summary(self) -> None:
        """Log the strategy's settings."""
        log(INFO, "\t├──> OneShotExperts settings:")
        log(
            INFO,
            "\t│\t├── Experts: %d (%s)",
            self.num_experts,
            ", ".join(f"{o}: {self.objectives.count(o)}" for o in OBJECTIVES),
        )
        log(INFO, "\t│\t├── Objectives by expert id: %s", self.objectives)
        if self.targets != list(range(self.num_experts)):
            log(INFO, "\t│\t├── Training only experts %s (present: %s)", self.targets, sorted(self.present))
        log(
            INFO,
            "\t│\t├── Min nodes: %d (wait ≤ %.0f s), min experts: %d",
            self.min_nodes,
            self.node_wait_timeout,
            self.min_experts,
        )
        log(INFO, "\t│\t└── Run directory: %s", self.run_dir)

    # -- the protocol ------------------------------------------------------------------------------------------

    def discover(self, grid: Grid, timeout: float) -> dict[int, dict]:
        """Wait for nodes, ask each for its node config, and assign expert ids. A node with ``expert-id`` (or a
        ``partition-id`` alone) holds that one expert, as an institution does. A simulated node (Flower gives it
        ``partition-id`` p and ``num-partitions`` n) holds experts p, p + n, p + 2n, … when there are fewer
        simulated nodes than experts (its data is the shared embedded dataset). Nodes that do not answer get
        nothing; experts without a node are missing."""
        deadline, simulated = time.monotonic() + self.node_wait_timeout, None
        while len(node_ids := sorted(grid.get_node_ids())) < self.min_nodes and time.monotonic() < deadline:
            if node_ids and simulated is None:  # ask one node whether it is simulated, and how many there are
                answers = [
                    dict(r.content["node-info"])
                    for r in self._stream(
                        grid,
                        [Message(RecordDict(), dst_node_id=node_ids[0], message_type=MessageType.QUERY)],
                        min(timeout, 60.0),
                        {},
                    )
                    if not r.has_error()
                ]
                simulated = int(answers[0].get("num-partitions", 0)) if answers else 0
            if simulated and len(node_ids) >= simulated:
                break  # every simulated node is there; more will not come
            time.sleep(self.poll_interval)
        log(INFO, "OneShotExperts: %d nodes connected; querying them", len(node_ids))
        queries = [Message(RecordDict(), dst_node_id=n, message_type=MessageType.QUERY) for n in node_ids]
        info: dict[int, dict] = {}
        for reply in self._stream(grid, queries, timeout, {}):
            if reply.has_error():
                log(WARNING, "node %d did not answer the query: %s", reply.metadata.src_node_id, reply.error.reason)
                continue
            info[reply.metadata.src_node_id] = dict(reply.content["node-info"])
        taken: set[int] = set()
        for node_id in sorted(info):
            claims = self._claims(info[node_id])
            if claims is None:
                log(WARNING, "node %d has no expert-id or partition-id in its node config; skipped", node_id)
                continue
            for expert_id in claims:
                if expert_id not in self.targets and 0 <= expert_id < self.num_experts:
                    log(INFO, "node %d holds expert %d, not wanted in this run; skipped", node_id, expert_id)
                elif not 0 <= expert_id < self.num_experts:
                    log(
                        WARNING,
                        "node %d asks for expert %d outside 0..%d; skipped",
                        node_id,
                        expert_id,
                        self.num_experts - 1,
                    )
                elif expert_id in taken:
                    log(WARNING, "node %d asks for expert %d, already assigned; skipped", node_id, expert_id)
                else:
                    self.assignment.setdefault(node_id, []).append(expert_id)
                    taken.add(expert_id)
        if any(len(experts) > 1 for experts in self.assignment.values()):
            log(
                INFO,
                "OneShotExperts: %d simulated nodes for %d experts; each trains %s",
                len(self.assignment),
                self.num_experts,
                "; ".join(f"node {n}: {e}" for n, e in sorted(self.assignment.items())),
            )
        for k in self.targets:
            if k not in taken:
                self.missing[k] = "no node was assigned this expert (none connected, answered or claimed it)"
        return info

    def _claims(self, node_config: dict) -> list[int] | None:
        """The expert ids a node's config claims (None: it claims none)."""
        if "expert-id" in node_config:
            return [int(node_config["expert-id"])]
        if "partition-id" not in node_config:
            return None
        p, n = int(node_config["partition-id"]), int(node_config.get("num-partitions", 0))
        return [p] if not 0 < n < self.num_experts or not 0 <= p < n else list(range(p, self.num_experts, n))

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One train message per assigned expert, to its node: the expert id, cluster, objective and the
        experiment, in a fresh record."""
        messages = []
        pairs = sorted((e, n) for n, experts in self.assignment.items() for e in experts)
        for expert_id, node_id in pairs:
            task = ConfigRecord(dict(config))
            task["server-round"] = server_round
            task["expert-id"] = expert_id
            task["cluster-id"] = expert_id
            task["objective"] = self.objectives[expert_id]
            task["experiment"] = json.dumps(self.experiment)
            task["cache-dir"] = self.cache_dir
            messages.append(
                Message(
                    RecordDict({"config": task}),
                    dst_node_id=node_id,
                    message_type=MessageType.TRAIN,
                    group_id=str(server_round),
                    ttl=self.message_ttl,
                )
            )
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """No averaging: validate each reply and write it to disk as it arrives."""
        for reply in replies:
            expert_id = self._message_expert.get(reply.metadata.reply_to_message_id)
            if expert_id is None:
                log(WARNING, "reply to an unknown message %s ignored", reply.metadata.reply_to_message_id)
                discard(reply)
                continue
            if reply.has_error():
                reason = f"error reply (code {reply.error.code}): {_summary_line(reply.error.reason)}"
                self._lose(expert_id, reason)
                continue
            how = "spooled to disk" if spooled_arrays(reply) else "pulled in memory"
            try:
                meta = self._save(expert_id, reply.content)
            except (KeyError, ValueError, TypeError) as e:
                self._lose(expert_id, f"rejected checkpoint: {_summary_line(str(e))}")
                continue
            finally:
                discard(reply)  # whatever _save did not move into the expert's folder
                del reply  # an in-memory checkpoint's bytes go with it: one at a time
            self.received[expert_id] = meta
            log(
                INFO,
                "expert %d (%s) received: %d steps (%d resumed), %.0f device-s, %d bytes (%s)",
                expert_id,
                meta["objective"],
                meta["steps"],
                meta.get("resumed_steps", 0),
                meta["device_seconds"],
                meta["weights_bytes"],
                how,
            )
        return None, MetricRecord({"experts-received": len(self.received), "experts-missing": len(self.missing)})

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """No federated evaluation: the ensemble is evaluated on the server."""
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord | None = None,
        num_rounds: int = 1,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable | None = None,
        ensemble_fn: Callable[[dict[int, dict], dict[int, str]], dict | None] | None = None,
    ) -> Result:
        """Discover nodes, send one train message per node, collect the experts, then call
        ``ensemble_fn(received, missing)`` if at least ``min_experts`` arrived.

        Raises RuntimeError when too few experts arrived (after the missing ones are recorded).
        """
        log(INFO, "Starting %s (one shot, no aggregation)", self.__class__.__name__)
        self.summary()
        self.discover(grid, timeout=min(timeout, 300.0))
        messages = list(self.configure_train(1, initial_arrays or ArrayRecord(), train_config or ConfigRecord(), grid))
        _, metrics = self.aggregate_train(1, self._stream(grid, messages, timeout, self._message_expert))
        result = Result()
        result.train_metrics_clientapp[1] = metrics
        log(INFO, "OneShotExperts: %d experts received, %d missing", len(self.received), len(self.missing))
        if len(self.received) + len(self.present) < self.min_experts:
            raise RuntimeError(
                f"only {len(self.received)} of {self.num_experts} experts arrived"
                f"{f' ({len(self.present)} already present)' if self.present else ''} "
                f"(min_experts={self.min_experts}); missing: {self.missing}"
            )
        if ensemble_fn is not None:
            out = ensemble_fn(dict(self.received), dict(self.missing))
            if out:
                result.evaluate_metrics_serverapp[1] = MetricRecord(
                    {k: v for k, v in out.items() if isinstance(v, (int, float))}
                )
        return result

    # -- helpers -----------------------------------------------------------------------------------------------

    def _stream(
        self, grid: Grid, messages: list[Message], timeout: float, expert_of: dict[str, int]
    ) -> Iterator[Message]:
        """Push ``messages`` and yield replies as they arrive, until all arrived or ``timeout`` passed.
        Fills ``expert_of`` (message id → expert id, for train messages) so replies map back by
        ``reply_to_message_id`` (error replies from the SuperLink carry node id 1)."""
        ids = list(grid.push_messages(messages))
        pending = set()
        for message_id, message in zip(ids, messages):
            is_train = message.metadata.message_type == MessageType.TRAIN
            expert_id = int(message.content["config"]["expert-id"]) if is_train else None
            if not message_id:
                if is_train:
                    self._lose(expert_id, "the train message could not be delivered to its node")
                continue
            pending.add(message_id)
            if is_train:
                expert_of[message_id] = expert_id
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for message_id in sorted(pending):  # one id per pull: one checkpoint at a time
                for reply in pull_replies(
                    grid, [message_id], self.run_dir / "experts", max_bytes=self.max_checkpoint_bytes
                ):
                    pending.discard(reply.metadata.reply_to_message_id)
                    yield reply
            if pending:
                time.sleep(self.poll_interval)
        for message_id in pending:
            if message_id in expert_of:
                self._lose(expert_of[message_id], f"no reply within {timeout:.0f} s (node silent or too slow)")

    def _save(self, expert_id: int, content: RecordDict) -> dict:
        """Write the reply's weights to disk, validate them there, and install the expert folder."""
        meta = json.loads(str(content["meta"]["meta"]))
        model_config = json.loads(str(content["meta"]["model-config"]))
        missing = [k for k in (*REQUIRED_META, "sha256") if k not in meta]
        if missing:
            raise CheckpointRejected(f"metadata lacks {missing}")
        if int(meta["expert_id"]) != expert_id:
            raise CheckpointRejected(f"reply claims expert {meta['expert_id']}, expected {expert_id}")
        if meta["objective"] not in OBJECTIVES:
            raise CheckpointRejected(f"unknown objective {meta['objective']!r}")
        if self.model_config is not None and model_config != self.model_config:
            diff = sorted(
                k for k in set(model_config) | set(self.model_config) if model_config.get(k) != self.model_config.get(k)
            )
            preset = self.experiment["expert"]["preset"]
            raise CheckpointRejected(f"model config differs from the run's preset {preset!r} in {diff[:4]}")
        arrays = content.array_records.get("expert")
        if arrays is None or list(arrays) != ["weights"] or arrays["weights"].stype != WIRE_STYPE:
            raise CheckpointRejected(
                f"the reply's 'expert' record must hold one array 'weights' of stype "
                f"{WIRE_STYPE!r} (the safetensors file)"
            )
        weights = arrays["weights"]
        spooled = isinstance(weights, SpooledArray)
        size = weights.nbytes if spooled else len(weights.data)
        if self.max_checkpoint_bytes and size > self.max_checkpoint_bytes:
            raise CheckpointRejected(
                f"size {'> ' if spooled and weights.path is None else ''}{size} bytes exceeds "
                f"the limit of {self.max_checkpoint_bytes} bytes"
            )
        incoming = self.run_dir / "experts"
        incoming.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".incoming-expert-{expert_id}-", suffix=".safetensors", dir=incoming)
        try:
            if spooled:  # already on disk (deployment): take the file over
                os.close(fd)
                os.replace(weights.path, tmp)
                weights.path = None
            else:
                with os.fdopen(fd, "wb") as f:
                    f.write(weights.data)
            del weights, arrays, content["expert"]  # nothing holds the bytes in memory any more
            meta["sha256"] = validate_weights_file(
                tmp,
                model_config,
                sha256=str(meta["sha256"]),
                dtype=meta.get("weights_dtype"),
                max_bytes=self.max_checkpoint_bytes,
            )
            meta["weights_bytes"] = os.path.getsize(tmp)
            install_expert(incoming / f"expert-{expert_id}", tmp, model_config, meta)
        finally:
            Path(tmp).unlink(missing_ok=True)
        return meta

    def _lose(self, expert_id: int, reason: str) -> None:
        log(WARNING, "expert %d missing: %s", expert_id, reason)
        self.missing[expert_id] = reason


def _summary_line(text: str) -> str:
    lines = [ln for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(no reason given)"
