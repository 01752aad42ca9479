"""The strategy of the federated rounds (the router's and the evaluation's feature classifier's): Flower's own
FedAdam, FedAvg, FedMedian, FedTrimmedAvg or Krum, wrapped the way Flower's differential-privacy strategies wrap one.

:class:`CheckedRounds` changes only what Flower's strategy leaves to the app: the message types (the
``router`` actions of the ClientApp, so they do not reach the expert-training handler), the nodes (those with
clusters), the check of every reply against its schema and the global model before Flower averages
(:mod:`strategies.round_replies`: one reply per asked node, exact records and metric keys, the arrays deserialised and
checked, and those checked arrays averaged; a malformed update is dropped and recorded with its reason in the
report's ``dropped_replies``, never averaged, and an aggregation Flower refuses skips the round, not the run), the
sum of confusion counts, and the bytes it moved. Flower's DP wrappers wrap it in turn
(:class:`CheckedServerSideDP`, :class:`CheckedClientSideDP`), with the reply checks first.
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.app.exception import AppExitException
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAdam,
    FedAvg,
    FedMedian,
    FedTrimmedAvg,
    Krum,
    Strategy,
)

from hddm_flower.config.sections import OptimConfig
from hddm_flower.training import lr_factor

from .round_replies import ReplyRefused, check_evaluate_reply, check_train_reply, one_per_node

ACTION = "router"


def sum_counts(contents: list[RecordDict], weighted_by_key: str) -> MetricRecord:
    """Aggregate evaluation replies by adding their counts (confusion, top-2 hits, examples), not averaging."""
    out: dict[str, Any] = {}
    for content in contents:
        for name, value in content["metrics"].items():
            if isinstance(value, list):
                out[name] = [a + b for a, b in zip(out[name], value)] if name in out else list(value)
            else:
                out[name] = out.get(name, 0) + value
    return MetricRecord(out)


def record_bytes(record: RecordDict) -> int:
    return sum(r.count_bytes() for r in record.values())


BASES = {"adam": FedAdam, "avg": FedAvg, "median": FedMedian, "trimmed_avg": FedTrimmedAvg, "krum": Krum}


def robust_kwargs(server_optimizer: str, robust_f: int, num_nodes: int) -> dict:
    """The settings of Flower's robust aggregations for ``robust_f`` hostile nodes out of ``num_nodes``: Krum's
    ``num_malicious_nodes``, FedTrimmedAvg's ``beta`` (the fraction cut at each end: f nodes per side)."""
    if server_optimizer == "krum":
        return {"num_malicious_nodes": robust_f}
    if server_optimizer == "trimmed_avg":
        return {"beta": min(robust_f / max(1, num_nodes), 0.49)}
    return {}


def base_strategy(server_optimizer: str, num_nodes: int, **kwargs) -> FedAvg:
    """Flower's aggregation that ``router.server_optimizer`` names, asking all ``num_nodes`` nodes every round
    and adding up their evaluation counts (:func:`sum_counts`); ``kwargs`` go to its constructor."""
    return BASES[server_optimizer](
        min_train_nodes=num_nodes,
        min_evaluate_nodes=num_nodes,
        min_available_nodes=num_nodes,
        evaluate_metrics_aggr_fn=sum_counts,
        **kwargs,
    )


class CheckedRounds(Strategy):
    """Flower's FedAdam, FedAvg, FedMedian, FedTrimmedAvg or Krum (``strategy``, :func:`base_strategy`) over the
    nodes in ``clusters`` (node id → cluster ids), with the ClientApp's ``<type>.<action>`` messages (``router``, or
    ``feature_net`` for the evaluation's feature classifier, which has no evaluation rounds: ``evaluate`` False),
    replies checked against the global model before the wrapped strategy aggregates them, and the bytes per round
    counted. A wrapper as Flower's differential-privacy strategies are: it holds the strategy and hands it each
    round's configuration and the checked replies.

    Parameters
    ----------
    strategy : FedAvg
        The Flower strategy that configures and aggregates the rounds.
    clusters : dict[int, list[int]]
        The nodes asked every round (full participation of the nodes with data) and their clusters.
    sizes : dict[int, int]
        Each node's number of training images (what its train replies must declare).
    max_images : int
        The most images one node's local steps may draw in a round.
    num_classes, num_times : int
        The shape of an evaluation reply's confusion counts (clusters × ``evaluation.times``).
    num_rounds : int
        The rounds of the run (evaluation every ``evaluate_every`` rounds and after the last).
    optim : OptimConfig, optional
        FedAdam: the central optimiser's warm-up and schedule, which the server's step size follows round by round.
    weights : dict[int, float], optional
        Each node's FedAvg weight (default: its size; in institution mode bounded,
        :func:`hddm_flower.stages.rounds.bounded_weights`).
    heldout_sizes : dict[int, int], optional
        Each node's number of held-out images (what its evaluation counts must add up to; None: not checked).
    max_seconds : float
        The most local training seconds a reply may report (the round's timeout: a node cannot have trained
        longer than the round waited for it).
    """

    def __init__(
        self,
        strategy: FedAvg,
        clusters: dict[int, list[int]],
        sizes: dict[int, int],
        max_images: int,
        num_classes: int,
        num_times: int,
        num_rounds: int,
        optim: OptimConfig | None = None,
        weights: dict[int, float] | None = None,
        heldout_sizes: dict[int, int] | None = None,
        max_seconds: float = float("inf"),
        *,
        action: str = ACTION,
        evaluate: bool = True,
    ):
        super().__init__()
        self.strategy, self.action, self.evaluates = strategy, action, evaluate
        self.clusters, self.num_classes, self.num_times = clusters, num_classes, num_times
        self.sizes, self.max_images, self.optim = sizes, max_images, optim
        self.heldout_sizes, self.max_seconds = heldout_sizes, max_seconds
        self.weights = dict(weights or sizes)
        self.base_eta, self.server_lr = getattr(strategy, "eta", None), []
        self.images_seen, self.num_rounds, self.slowest_node_seconds = 0, num_rounds, 0.0
        self.evaluate_every = max(1, -(-num_rounds // 10))  # about ten evaluations per run
        self.sent_bytes: dict[int, int] = {}
        self.received_bytes: dict[int, int] = {}
        self.dropped: dict[int, list[str]] = {}
        self._global: dict[str, np.ndarray] = {}
        self._sent: list[Message] = []
        self.max_update_norm: float | None = None  # client-side DP clipping: the norm C each node clips to

    def summary(self) -> None:
        self.strategy.summary()
        log(INFO, "\t└──> Router nodes: %s", "; ".join(f"node {n}: {c}" for n, c in sorted(self.clusters.items())))

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):
        return self._address(self.strategy.configure_train(server_round, arrays, config, grid), MessageType.TRAIN)

    def _address(self, messages: Iterable[Message], message_type: str) -> list[Message]:
        """The wrapped strategy's message of this round, sent as the ClientApp's ``<type>.<action>`` to every node
        with clusters (full participation of the nodes with data, whoever else is connected)."""
        messages = list(messages)
        if not messages:
            self._sent = []
            return []
        record, nodes = messages[0].content, sorted(self.clusters)  # one payload for every node
        rnd = int(record[self.strategy.configrecord_key]["server-round"])
        self.sent_bytes[rnd] = self.sent_bytes.get(rnd, 0) + record_bytes(record) * len(nodes)
        if message_type == MessageType.TRAIN:
            self._global = {k: a.numpy() for k, a in record[self.strategy.arrayrecord_key].items()}
        kind = f"{message_type}.{self.action}"
        self._sent = [Message(content=record, dst_node_id=n, message_type=kind) for n in nodes]
        return self._sent

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):
        """Held-out counts every ``evaluate_every`` rounds and after the last one."""
        if not self.evaluates or (server_round % self.evaluate_every and server_round != self.num_rounds):
            self._sent = []
            return []
        messages = self.strategy.configure_evaluate(server_round, arrays, config, grid)
        return self._address(messages, MessageType.EVALUATE)

    def _count(self, server_round: int, replies: list[Message]) -> None:
        got = 0
        for m in replies:
            try:
                got += 0 if m.has_error() else record_bytes(m.content)
            except Exception as e:  # a record Flower cannot size: the reply is dropped below anyway
                log(WARNING, "router round %d: a reply's size is unknown (%s)", server_round, type(e).__name__)
        self.received_bytes[server_round] = self.received_bytes.get(server_round, 0) + got

    def _checked(self, server_round: int, replies: Iterable[Message], check) -> list[Message]:
        """The replies of this round that pass ``check(node, message)`` (which returns the checked content),
        one per asked node (:func:`~strategies.round_replies.one_per_node`), each carrying what was checked.
        Whatever checking one reply raises costs that reply only; every drop is recorded with its reason."""
        replies = list(replies)
        self._count(server_round, replies)
        asked = {m.metadata.message_id: m.metadata.dst_node_id for m in self._sent}
        kept, dropped = one_per_node(replies, asked)
        for why in dropped:
            self._record_drop(server_round, why)
        good = []
        for node, msg in kept:
            if msg.has_error():
                self._record_drop(server_round, f"node {node}: error reply ({one_line(msg.error.reason)})")
                continue
            try:
                msg.content = check(node, msg)
            except ReplyRefused as e:
                self._record_drop(server_round, f"node {node}: {e}")
                continue
            except Exception as e:  # whatever a hostile reply raises costs this reply only
                self._record_drop(server_round, f"node {node}: {type(e).__name__}: {one_line(str(e))}")
                continue
            good.append(msg)
        return good

    def _aggregate(self, server_round: int, aggregate, replies: list[Message]):
        """Flower's aggregation of the checked replies; an ``AppExitException`` it raises (e.g.
        ``InconsistentMessageReplies``) skips this round's aggregation, recorded, instead of ending the run."""
        try:
            return aggregate(server_round, replies)
        except AppExitException as e:
            self._record_drop(server_round, f"aggregation skipped ({type(e).__name__}: {one_line(str(e))})")
            return None

    def check_train_replies(self, server_round: int, replies: Iterable[Message]) -> list[Message]:
        """This round's train replies that pass :meth:`_check_train` (for a wrapper that must see only
        checked replies; :meth:`aggregate_train` then takes them as checked)."""
        self._prechecked = server_round
        return self._checked(server_round, replies, self._check_train)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        if getattr(self, "_prechecked", None) == server_round:
            good = list(replies)
        else:
            good = self._checked(server_round, replies, self._check_train)
        ok = [m.content["metrics"] for m in good]
        if self.base_eta is not None and self.optim is not None:  # FedAdam: round r is central step r − 1
            self.strategy.eta = self.base_eta * lr_factor(server_round - 1, self.optim, self.num_rounds)
            self.server_lr.append(self.strategy.eta)
        out = self._aggregate(server_round, self.strategy.aggregate_train, good) if good else None
        arrays, metrics = out if out is not None else (None, None)
        if arrays is not None:  # FedAdam computes in float64: the model keeps its own dtypes on the wire
            self.images_seen += sum(int(m["images-seen"]) for m in ok)
            self.slowest_node_seconds += max((float(m["seconds"]) for m in ok), default=0.0)
            arrays = ArrayRecord(
                {k: Array(a.numpy().astype(self._global[k].dtype, copy=False)) for k, a in arrays.items()}
            )
        return arrays, metrics

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]):
        good = self._checked(server_round, replies, self._check_counts)
        return self._aggregate(server_round, self.strategy.aggregate_evaluate, good) if good else None

    def _record_drop(self, server_round: int, why: str) -> None:
        why = " ".join(why.split())  # one line, whatever a peer put into the ids or names it quotes
        log(WARNING, "router round %d: a reply is dropped: %s", server_round, why)
        self.dropped.setdefault(server_round, []).append(why)

    def _check_train(self, node: int, msg: Message) -> RecordDict:
        """The train reply's schema (:func:`~strategies.round_replies.check_train_reply`: records, metric keys
        and types, the global model's arrays deserialised and checked), its weight is the node's declared number
        of training images, and it drew at most ``max_images``."""
        content, m = check_train_reply(msg.content, self._global)
        key = self.strategy.weighted_by_key
        n, want = m[key], self.sizes.get(node)
        if n != want:
            raise ReplyRefused(f"{key} = {n!r}, the node declared {want}")
        if not 0 < m["images-seen"] <= self.max_images:
            raise ReplyRefused(f"images-seen = {m['images-seen']!r}, not in 1..{self.max_images}")
        if not 0 <= m["seconds"] <= self.max_seconds:  # summed over rounds into the router's record
            raise ReplyRefused(f"seconds = {m['seconds']:.6g}, not in [0, {self.max_seconds:g}] (the round's timeout)")
        if self.max_update_norm is not None:  # the node was asked to clip its update to this norm
            norm = update_norm(content["arrays"], self._global)
            if norm > self.max_update_norm * (1 + 1e-4):
                raise ReplyRefused(f"update norm {norm:.6g} exceeds the clipping norm {self.max_update_norm:g}")
        content["metrics"][key] = self.weights[node]
        return content

    def _check_counts(self, node: int, msg: Message) -> RecordDict:
        """The evaluate reply's schema, and counts of exactly the node's held-out images (summed over nodes
        into the report's held-out accuracy, which no node may outweigh or overflow)."""
        content = check_evaluate_reply(msg.content, self.num_times, self.num_classes)
        n = content["metrics"]["num-examples"]
        if self.heldout_sizes is not None and n != self.heldout_sizes.get(node):
            raise ReplyRefused(f"num-examples = {n}, the node has {self.heldout_sizes.get(node)} held-out images")
        return content


class CheckedServerSideDP(DifferentialPrivacyServerSideFixedClipping):
    """Flower's server-side DP wrapper (each update clipped to L2 norm ``clipping_norm``, Gaussian noise on the
    average) around a :class:`CheckedRounds`, whose reply checks run before the wrapper clips anything."""

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        return super().aggregate_train(server_round, self.strategy.check_train_replies(server_round, replies))


class CheckedClientSideDP(DifferentialPrivacyClientSideFixedClipping):
    """Flower's client-side DP wrapper around a :class:`CheckedRounds`: each train message carries the clipping
    norm C, each node clips its own update to it (the ClientApp's ``fixedclipping_mod``, clients/round_handlers.py), and
    the wrapper adds Gaussian noise to the average. The reply checks run first, and they also hold each node to
    it: a reply whose update is longer than C (a node that did not clip) is dropped with its reason, so that the
    noise's guarantee does not rest on every node's word."""

    def __init__(self, strategy, noise_multiplier: float, clipping_norm: float, num_sampled_clients: int) -> None:
        super().__init__(strategy, noise_multiplier, clipping_norm, num_sampled_clients)
        strategy.max_update_norm = clipping_norm

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        return super().aggregate_train(server_round, self.strategy.check_train_replies(server_round, replies))


DP_WRAPPERS = {"server": CheckedServerSideDP, "client": CheckedClientSideDP}


def update_norm(arrays: ArrayRecord, start: dict[str, np.ndarray]) -> float:
    """The L2 norm of a node's update (its arrays minus the global model it was sent), over every array, as
    Flower's clipping measures it."""
    total = 0.0
    for name, before in start.items():
        diff = arrays[name].numpy().astype(np.float64) - before.astype(np.float64)
        total += float(np.sum(diff * diff))
    return total**0.5


def one_line(text: str) -> str:
    """A peer's message as one bounded line."""
    lines = [ln for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(no reason given)"
