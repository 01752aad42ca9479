"""A one-shot, no-aggregation Flower strategy for heterogeneous diffusion experts.

Its length is one Strategy class: the query round, the assignment, the train round with replies streamed to disk and
the failures kept share the run's state, as Flower's own FedAvg keeps its rounds in one class.
"""

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

from hddm_flower import wire
from hddm_flower.accept import ExpertStore
from hddm_flower.checkpoints import CheckpointRejected
from hddm_flower.choices import OBJECTIVES
from hddm_flower.federation.declarations import claim_refusal
from hddm_flower.rundir import incoming_name
from strategies.spool import SpooledArray, discard, pull_replies, spooled_arrays

MAX_NODE_INFO_ITEMS = 256  # keys a node's query reply may hold


class OneShotExperts(Strategy):
    """One-shot federation of diffusion experts, without aggregation.

    Each node (institution) trains one expert on its own cluster with its own objective (a simulated node may
    hold several, see :meth:`discover`: it gets them all in one message, trains them side by side and replies
    with all of them, each checked alone) and replies with the final checkpoint: its safetensors
    bytes as one array (the wire format of :mod:`hddm_flower.wire`, so bf16 travels as bf16). Nothing is
    averaged: each reply is pulled alone, its weights written to disk chunk by chunk as they arrive
    (:func:`strategies.spool.pull_replies`; in deployment the server never holds a whole checkpoint in memory) and
    handed to the ``store`` the ServerApp owns, which accepts or refuses it
    (:meth:`hddm_flower.accept.ExpertStore.accept`: bounded metadata, model config, size, sha256, safetensors only,
    names/shapes/dtypes of the run's preset, finite values, then installed) — the way Flower's own strategies
    leave saving to the ServerApp. A reply can only cost its own expert: error replies, malformed or rejected
    replies (whatever they raise), silent nodes, expired messages and experts without a node are recorded in
    ``missing`` with a one-line reason, and the run goes on when at least ``min_experts`` experts are there.

    Parameters
    ----------
    store : ExpertStore
        Where accepted experts go (``store.incoming``: where replies are spooled; ``store.max_bytes``: the size
        limit applied while they arrive; ``store.accept(expert_id, weights_file, meta, model_config)``).
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
    experts : Iterable[int] | None (default: None)
        Train only these expert ids (e.g. the ones a previous run lost); None = all of them.
    present : Iterable[int] (default: ())
        Expert ids already in the run directory (from an earlier run); they count towards ``min_experts``.
    """

    def __init__(
        self,
        store: ExpertStore,
        experiment: dict,
        objectives: list[str],
        *,
        min_nodes: int = 1,
        min_experts: int = 1,
        node_wait_timeout: float = 120.0,
        message_ttl: float | None = None,
        cache_dir: str = "",
        poll_interval: float = 1.0,
        experts: Iterable[int] | None = None,
        present: Iterable[int] = (),
        expert_nodes: Iterable[int] = (),
        nodes: dict[int, int] | None = None,
    ) -> None:
        bad = [o for o in objectives if o not in OBJECTIVES]
        if bad:
            raise ValueError(f"unknown objectives {bad}; expected {OBJECTIVES}")
        self.store, self.experiment, self.objectives = store, experiment, list(objectives)
        self.min_nodes, self.min_experts = min_nodes, min_experts
        self.node_wait_timeout, self.message_ttl, self.cache_dir = node_wait_timeout, message_ttl, cache_dir
        self.poll_interval = poll_interval
        self.expert_nodes = list(expert_nodes)  # federation.expert_nodes: expert id → the node that alone may train it
        # expert id → node id decided before this strategy runs (the institutions' checked declarations): the node
        # configs' claims are then not read, so a node left out there cannot take an expert here
        self.nodes = None if nodes is None else dict(nodes)
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
        self._message_experts: dict[str, list[int]] = {}  # train message id → its expert ids

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
        log(INFO, "\t│\t└── Run directory: %s", self.store.run_dir)

    # -- the protocol ------------------------------------------------------------------------------------------

    def discover(self, grid: Grid, timeout: float) -> dict[int, dict]:
        """Wait for nodes, ask each for its node config, and assign expert ids. A node with ``expert-id`` (or a
        ``partition-id`` alone) holds that one expert, as an institution does. A simulated node (Flower gives it
        ``partition-id`` p and ``num-partitions`` n) holds experts p, p + n, p + 2n, … when there are fewer
        simulated nodes than experts (its data is the shared embedded dataset). With ``nodes`` (expert id → node
        id, decided from the institutions' declarations) each target goes to its node and no claim is read. Nodes
        that do not answer get nothing; experts without a node are missing."""
        deadline, simulated = time.monotonic() + self.node_wait_timeout, None
        while len(node_ids := sorted(grid.get_node_ids())) < self.min_nodes and time.monotonic() < deadline:
            if node_ids and simulated is None:  # ask one node whether it is simulated, and how many there are
                answers = [
                    info
                    for r in self._stream(
                        grid,
                        [Message(RecordDict(), dst_node_id=node_ids[0], message_type=MessageType.QUERY)],
                        min(timeout, 60.0),
                    )
                    if (info := self._node_info(r)) is not None
                ]
                try:  # no answer yet (an actor still starting on a busy machine): ask again next time
                    simulated = _partitions(answers[0]) if answers else None
                except Exception as e:  # whatever a node's answer raises costs this node only
                    log(WARNING, "node %d: %s; not treated as simulated", node_ids[0], _summary_line(str(e)))
                    simulated = 0
            if simulated and len(node_ids) >= simulated:
                break  # every simulated node is there; more will not come
            time.sleep(self.poll_interval)
        log(INFO, "OneShotExperts: %d nodes connected; querying them", len(node_ids))
        queries = [Message(RecordDict(), dst_node_id=n, message_type=MessageType.QUERY) for n in node_ids]
        info: dict[int, dict] = {}
        for reply in self._stream(grid, queries, timeout):
            node_info = self._node_info(reply)
            if node_info is not None:
                info[reply.metadata.src_node_id] = node_info
        taken: set[int] = set()
        if self.nodes is not None:
            for k in self.targets:
                if self.nodes.get(k) in info:
                    self.assignment.setdefault(self.nodes[k], []).append(k)
                    taken.add(k)
        for node_id in sorted(info) if self.nodes is None else ():
            try:
                claims = self._claims(info[node_id])
            except Exception as e:  # whatever a node's answer raises costs this node only
                log(WARNING, "node %d: %s; skipped", node_id, _summary_line(str(e)))
                continue
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
                elif why := claim_refusal(self.expert_nodes, node_id, expert_id):
                    log(WARNING, "node %d %s; skipped", node_id, why)
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

    @staticmethod
    def _node_info(reply: Message) -> dict | None:
        """A query reply's node config as a dict, or None (logged) for an error reply or a malformed one: no
        :data:`~hddm_flower.wire.NODE_INFO` record, or more than :data:`MAX_NODE_INFO_ITEMS` keys. The files of
        any arrays the reply carried are removed."""
        node = reply.metadata.src_node_id
        discard(reply)  # a query reply has no weights to keep: whatever arrays it carried were spooled in vain
        if reply.has_error():
            log(WARNING, "node %d did not answer the query: %s", node, _summary_line(reply.error.reason))
            return None
        try:
            record = reply.content.config_records.get(wire.NODE_INFO)
            if record is None:
                raise wire.WireError(f"no {wire.NODE_INFO!r} config record")
            if len(record) > MAX_NODE_INFO_ITEMS:
                raise wire.WireError(f"{len(record)} keys, more than {MAX_NODE_INFO_ITEMS}")
            return dict(record)
        except Exception as e:  # whatever a malformed reply raises costs this node only
            log(WARNING, "node %d sent a malformed query reply (%s); skipped", node, _summary_line(str(e)))
            return None

    def _claims(self, node_config: dict) -> list[int] | None:
        """The expert ids a node's config claims (None: it claims none); :class:`~hddm_flower.wire.WireError`
        for a value that is not an integer in range."""
        if "expert-id" in node_config:
            return [wire.as_int(node_config["expert-id"], "node config expert-id", -(2**31), 2**31)]
        if "partition-id" not in node_config:
            return None
        p = wire.as_int(node_config["partition-id"], "node config partition-id", -(2**31), 2**31)
        n = _partitions(node_config)
        return [p] if not 0 < n < self.num_experts or not 0 <= p < n else list(range(p, self.num_experts, n))

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One train message per node, in a fresh record: the expert id, cluster, objective and the experiment.
        A node holding several experts (a simulated SuperNode) gets them all in one message
        (:data:`~hddm_flower.wire.TASK_EXPERT_IDS`, :data:`~hddm_flower.wire.TASK_OBJECTIVES`), so that it can
        train them side by side on its CPUs."""
        messages = []
        for node_id, experts in sorted(self.assignment.items(), key=lambda item: min(item[1])):
            expert_id = min(experts)
            task = ConfigRecord(dict(config))
            task[wire.TASK_ROUND] = server_round
            task[wire.TASK_EXPERT_ID] = expert_id
            task[wire.TASK_CLUSTER_ID] = expert_id
            task[wire.TASK_OBJECTIVE] = self.objectives[expert_id]
            if len(experts) > 1:
                task[wire.TASK_EXPERT_IDS] = sorted(experts)
                task[wire.TASK_OBJECTIVES] = [self.objectives[k] for k in sorted(experts)]
            task[wire.TASK_EXPERIMENT] = json.dumps(self.experiment)
            task[wire.TASK_CACHE_DIR] = self.cache_dir
            messages.append(
                Message(
                    RecordDict({wire.TASK: task}),
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
        """No averaging: hand each expert of each reply to the store as it arrives. Whatever reading, checking or
        installing an expert raises, only that expert is lost (recorded in ``missing`` with the reason); an error
        reply costs the experts of its message."""
        for reply in replies:
            experts = self._message_experts.get(reply.metadata.reply_to_message_id)
            if experts is None:
                log(WARNING, "reply to an unknown message %s ignored", reply.metadata.reply_to_message_id)
                discard(reply)
                continue
            if reply.has_error():
                self._lose_message(
                    experts, f"error reply (code {reply.error.code}): {_summary_line(reply.error.reason)}"
                )
                continue
            try:
                how = "spooled to disk" if spooled_arrays(reply) else "pulled in memory"
                for expert_id in experts:
                    self._accept_one(expert_id, reply.content, expert_id if len(experts) > 1 else None, how)
            finally:
                discard(reply)  # whatever _receive did not move into the experts' folders
                del reply  # an in-memory checkpoint's bytes go with it: one message at a time
        return None, MetricRecord({"experts-received": len(self.received), "experts-missing": len(self.missing)})

    def _accept_one(self, expert_id: int, content: RecordDict, key: int | None, how: str) -> None:
        """Receive one expert of a reply (its records named by :func:`~hddm_flower.wire.expert_record` with
        ``key``); whatever fails costs this expert only."""
        try:
            error = content.config_records.get(wire.expert_record(wire.ERROR, key)) if key is not None else None
            if error is not None:
                reason = wire.as_str(error.get(wire.ERROR_REASON, ""), "error reason", max_len=wire.MAX_REASON_CHARS)
                self._lose(expert_id, f"training failed on the node: {_summary_line(reason)}")
                return
            meta = self._receive(expert_id, content, key)
        except (CheckpointRejected, wire.WireError) as e:
            self._lose(expert_id, f"rejected checkpoint: {_summary_line(str(e))}")
            return
        except Exception as e:  # a malformed reply or a failure while installing it: this expert only
            self._lose(expert_id, f"reply could not be accepted ({type(e).__name__}: {_summary_line(str(e))})")
            return
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
        """Discover nodes, send one train message per expert, collect the experts, then call
        ``ensemble_fn(received, missing)`` if at least ``min_experts`` arrived.

        This drives its own loop instead of :meth:`Strategy.start`'s rounds because a one-shot federation of
        experts is not a sequence of rounds over one global model: there is nothing to aggregate and no global
        ``ArrayRecord`` to broadcast; the experts must first be assigned from a query round (which node holds which
        cluster); each reply is a different model that has to be pulled and checked alone, as it arrives, within a
        deadline of many hours (Flower's ``send_and_receive`` would hold every reply in memory at once and give no
        per-expert reasons for what is missing); and the server-side "evaluation" is assembling the ensemble, not
        a federated evaluate round. The Flower protocol pieces (``configure_train``, ``aggregate_train``,
        ``summary``) keep their meaning and are what this loop calls.

        Raises RuntimeError when too few experts arrived (after the missing ones are recorded).
        """
        log(INFO, "Starting %s (one shot, no aggregation)", self.__class__.__name__)
        self.summary()
        self.discover(grid, timeout=min(timeout, 300.0))
        messages = list(self.configure_train(1, initial_arrays or ArrayRecord(), train_config or ConfigRecord(), grid))
        _, metrics = self.aggregate_train(1, self._stream(grid, messages, timeout))
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

    def sent(self, message_id: str, message: Message) -> list[int]:
        """Record that the train ``message`` was pushed as ``message_id``, so that its reply maps back to the experts
        it carries (by ``reply_to_message_id``: error replies from the SuperLink carry node id 1); those ids."""
        experts = _task_experts(message.content[wire.TASK])
        self._message_experts[message_id] = experts
        return experts

    def _stream(self, grid: Grid, messages: list[Message], timeout: float) -> Iterator[Message]:
        """Push ``messages`` and yield replies as they arrive, until all arrived or ``timeout`` passed; train
        messages are recorded (:meth:`sent`)."""
        ids = list(grid.push_messages(messages))
        pending, queried = set(), {}
        for message_id, message in zip(ids, messages):
            is_train = message.metadata.message_type == MessageType.TRAIN
            if not message_id:
                if is_train:
                    self._lose_message(
                        _task_experts(message.content[wire.TASK]),
                        "the train message could not be delivered to its node",
                    )
                continue
            pending.add(message_id)
            if is_train:
                self.sent(message_id, message)
            else:
                queried[message_id] = message.metadata.dst_node_id
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for message_id in sorted(pending):  # one id per pull: one checkpoint at a time
                for reply in pull_replies(grid, [message_id], self.store.incoming, max_bytes=self.store.max_bytes):
                    pending.discard(reply.metadata.reply_to_message_id)
                    yield reply
            if pending:
                time.sleep(self.poll_interval)
        for message_id in pending:
            if message_id in queried:
                log(WARNING, "node %d did not answer the query within %.0f s", queried[message_id], timeout)
                continue
            self._lose_message(
                self._message_experts.get(message_id, []), f"no reply within {timeout:.0f} s (node silent or too slow)"
            )

    def _receive(self, expert_id: int, content: RecordDict, key: int | None = None) -> dict:
        """Take one expert of a train reply apart (the wire format of :mod:`hddm_flower.wire`; ``key``: the
        suffix of its record names in a several-expert reply), put its weights in a file of the store's incoming
        folder, and hand them with the metadata and model config to ``store.accept``."""
        meta_name, expert_name = wire.expert_record(wire.META, key), wire.expert_record(wire.EXPERT, key)
        meta_record = content.config_records.get(meta_name)
        arrays = content.array_records.get(expert_name)
        if meta_record is None or arrays is None:
            raise CheckpointRejected(
                f"the reply lacks its {meta_name!r} config record or its {expert_name!r} array record "
                f"(it has {sorted(content)[:6]})"
            )
        if wire.META_JSON not in meta_record or wire.MODEL_CONFIG_JSON not in meta_record:
            raise CheckpointRejected(f"the {meta_name!r} record lacks {wire.META_JSON!r} or {wire.MODEL_CONFIG_JSON!r}")
        if list(arrays) != [wire.WEIGHTS] or arrays[wire.WEIGHTS].stype != wire.STYPE:
            raise CheckpointRejected(
                f"the reply's {expert_name!r} record must hold one array {wire.WEIGHTS!r} of stype "
                f"{wire.STYPE!r} (the safetensors file)"
            )
        weights = arrays[wire.WEIGHTS]
        spooled = isinstance(weights, SpooledArray)
        size = weights.nbytes if spooled else len(weights.data)
        if self.store.max_bytes and (size > self.store.max_bytes or (spooled and weights.path is None)):
            raise CheckpointRejected(
                f"size {'> ' if spooled and weights.path is None else ''}{size} bytes exceeds "
                f"the limit of {self.store.max_bytes} bytes"
            )
        fd, tmp = tempfile.mkstemp(
            prefix=f"{incoming_name(expert_id)}-", suffix=f".{wire.STYPE}", dir=self.store.incoming
        )
        try:
            if spooled:  # already on disk (deployment): take the file over
                os.close(fd)
                os.replace(weights.path, tmp)
                weights.path = None
            else:
                with os.fdopen(fd, "wb") as f:
                    f.write(weights.data)
            del weights, arrays, content[expert_name]  # nothing holds the bytes in memory any more
            return self.store.accept(
                expert_id,
                Path(tmp),
                meta_record[wire.META_JSON],
                meta_record[wire.MODEL_CONFIG_JSON],
                self.objectives[expert_id],
            )
        finally:
            Path(tmp).unlink(missing_ok=True)

    def _lose(self, expert_id: int, reason: str) -> None:
        log(WARNING, "expert %d missing: %s", expert_id, reason)
        self.missing[expert_id] = reason

    def _lose_message(self, experts: list[int], reason: str) -> None:
        """Every expert of a train message whose reply will not come. A node given several experts keeps each
        one as it ends (clients/client_app.py), so the reason says how a later run collects the finished ones."""
        if len(experts) > 1:
            ids = ",".join(str(k) for k in sorted(experts))
            reason += (
                f"; its node keeps each of experts {ids} it finished: a run into this run directory with run config "
                f'experts="{ids}" collects them without training them again'
            )
        for expert_id in experts:
            self._lose(expert_id, reason)


def _task_experts(task: ConfigRecord) -> list[int]:
    """The expert ids a train task (our own message) names: all of them, or its one expert."""
    if wire.TASK_EXPERT_IDS in task:
        return [int(k) for k in task[wire.TASK_EXPERT_IDS]]
    return [int(task[wire.TASK_EXPERT_ID])]


def _partitions(node_config: dict) -> int:
    """A node config's ``num-partitions`` (0 when absent)."""
    return wire.as_int(node_config.get("num-partitions", 0), "node config num-partitions", 0, 2**20)


def _summary_line(text: str) -> str:
    lines = [ln for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(no reason given)"
