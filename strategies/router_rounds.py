"""The federated router and the federated FID reference statistics (the server side).

After the experts arrived, the router is trained by rounds of Flower's own FedAdam (``router.server_optimizer:
adam``) or FedAvg (``avg``) over the nodes that hold the clusters: each node takes ``router.local_steps`` SGD
steps on its own clusters and returns the weights; Flower averages them (weighted by data) and, for FedAdam,
applies Adam to the averaged update. Every node holds one cluster in the hardest case, so a node's own objective
only ever says "my class": the remedy here is to keep the rounds close to central training: full participation
and one local SGD step make the average, weighted by each node's number of training images (FedAvg's n_k, checked
against the size the node declared), exactly one central SGD step on the pooled loss (tested in
tests/test_federated.py; equal weights would teach the router a uniform prior instead of the clusters'
frequencies), and FedAdam's server-side Adam, with the central router's warm-up and schedule on its step size,
makes the rounds follow Adam, the central router's optimiser. More local steps trade rounds for client drift;
the restricted softmax (``router.restricted_softmax`` < 1) damps that drift. Held-out accuracy is computed
federatedly every round: each node returns its confusion counts, the server adds them.

:class:`RouterStrategy` changes only what Flower's strategy leaves to the app: the message types (the
``router`` actions of the ClientApp, so they do not reach the expert-training handler), the nodes (those with
clusters), the check of every reply against its schema and the global model before Flower averages
(:mod:`strategies.round_replies`: one reply per asked node, exact records and metric keys, the arrays deserialised and
checked, and those checked arrays averaged; a malformed update is dropped and recorded with its reason in the
report's ``dropped_replies``, never averaged, and an aggregation Flower refuses skips the round, not the run), the
sum of confusion counts, and the bytes it moved.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterable
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
import torch
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
)

from hddm_flower.checkpoints import TIME_CONVENTION, save_router
from hddm_flower.config.schema import Config
from hddm_flower.config.sections import OptimConfig
from hddm_flower.data import Dataset
from hddm_flower.evaluation.evaluate import FEATURE_NET, feature_network
from hddm_flower.evaluation.metrics import FeatureClassifier
from hddm_flower.federation.local import FEATURE_BATCH, FeatureSums, accuracy_from_confusion
from hddm_flower.models import Router
from hddm_flower.rundir import ROUTER
from hddm_flower.stages.assemble import evaluate_and_report
from hddm_flower.stages.router import fit_router, router_model_config, router_record
from hddm_flower.training import lr_factor
from strategies.round_replies import ReplyRefused, check_evaluate_reply, check_train_reply, one_per_node

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


def _config(values: dict) -> ConfigRecord:
    """A ConfigRecord without empty strings (flwr's byte count refuses them; the nodes read absent as empty)."""
    return ConfigRecord({k: v for k, v in values.items() if v != ""})


def _model_config(model) -> dict:
    """A diffusers model's config without its private keys (``_name_or_path`` of a loaded one is a path)."""
    return {k: v for k, v in model.config.items() if not k.startswith("_")}


def _record_bytes(record: RecordDict) -> int:
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


class CheckedServerSideDP(DifferentialPrivacyServerSideFixedClipping):
    """Flower's server-side DP wrapper (each update clipped to L2 norm ``clipping_norm``, Gaussian noise on the
    average) around a :class:`RouterStrategy`, whose reply checks run before the wrapper clips anything."""

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        return super().aggregate_train(server_round, self.strategy.check_train_replies(server_round, replies))


class CheckedClientSideDP(DifferentialPrivacyClientSideFixedClipping):
    """Flower's client-side DP wrapper around a :class:`RouterStrategy`: each train message carries the clipping
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


def _make_strategy(server_optimizer: str, action: str = ACTION, evaluate: bool = True):
    """Flower's FedAdam, FedAvg, FedMedian, FedTrimmedAvg or Krum with the ClientApp's ``<type>.<action>``
    messages (``router``, or ``feature_net`` for the evaluation's feature classifier, which has no evaluation
    rounds)."""
    base = BASES[server_optimizer]

    class RouterStrategy(base):
        """Flower's FedAdam/FedAvg over the nodes in ``clusters`` (node id → cluster ids), with the ClientApp's
        ``router`` actions, replies checked against the global model, and the bytes per round counted."""

        def __init__(
            self,
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
            **kwargs,
        ):
            """``sizes``: each node's number of training images (what its replies must declare); ``weights``: its
            FedAvg weight (default: its size; in institution mode bounded, :func:`bounded_weights`);
            ``max_images``: the most images one node's local steps may draw in a round; ``optim`` (FedAdam): the
            central optimiser's warm-up and schedule, which the server's step size follows round by round;
            ``heldout_sizes``: each node's number of held-out images (what its evaluation counts must add up to;
            None: not checked); ``max_seconds``: the most local training seconds a reply may report (the round's
            timeout: a node cannot have trained longer than the round waited for it)."""
            n = len(clusters)
            super().__init__(
                min_train_nodes=n,
                min_evaluate_nodes=n,
                min_available_nodes=n,
                evaluate_metrics_aggr_fn=sum_counts,
                **kwargs,
            )
            self.clusters, self.num_classes, self.num_times = clusters, num_classes, num_times
            self.sizes, self.max_images, self.optim = sizes, max_images, optim
            self.heldout_sizes, self.max_seconds = heldout_sizes, max_seconds
            self.weights = dict(weights or sizes)
            self.base_eta, self.server_lr = getattr(self, "eta", None), []
            self.images_seen, self.num_rounds, self.slowest_node_seconds = 0, num_rounds, 0.0
            self.evaluate_every = max(1, -(-num_rounds // 10))  # about ten evaluations per run
            self.sent_bytes: dict[int, int] = {}
            self.received_bytes: dict[int, int] = {}
            self.dropped: dict[int, list[str]] = {}
            self._global: dict[str, np.ndarray] = {}
            self._sent: list[Message] = []
            self.max_update_norm: float | None = None  # client-side DP clipping: the norm C each node clips to

        def summary(self) -> None:
            super().summary()
            log(INFO, "\t└──> Router nodes: %s", "; ".join(f"node {n}: {c}" for n, c in sorted(self.clusters.items())))

        def _construct_messages(self, record: RecordDict, node_ids: list[int], message_type: str) -> Iterable[Message]:
            nodes = sorted(self.clusters)  # full participation of the nodes with data, whoever else is connected
            rnd = int(record[self.configrecord_key]["server-round"])
            self.sent_bytes[rnd] = self.sent_bytes.get(rnd, 0) + _record_bytes(record) * len(nodes)
            if message_type == MessageType.TRAIN:
                self._global = {k: a.numpy() for k, a in record[self.arrayrecord_key].items()}
            self._sent = list(super()._construct_messages(record, nodes, f"{message_type}.{action}"))
            return self._sent

        def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):
            """Held-out counts every ``evaluate_every`` rounds and after the last one."""
            if not evaluate or (server_round % self.evaluate_every and server_round != self.num_rounds):
                self._sent = []
                return []
            return super().configure_evaluate(server_round, arrays, config, grid)

        def _count(self, server_round: int, replies: list[Message]) -> None:
            got = 0
            for m in replies:
                try:
                    got += 0 if m.has_error() else _record_bytes(m.content)
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
                    self._record_drop(server_round, f"node {node}: error reply ({_one_line(msg.error.reason)})")
                    continue
                try:
                    msg.content = check(node, msg)
                except ReplyRefused as e:
                    self._record_drop(server_round, f"node {node}: {e}")
                    continue
                except Exception as e:  # whatever a hostile reply raises costs this reply only
                    self._record_drop(server_round, f"node {node}: {type(e).__name__}: {_one_line(str(e))}")
                    continue
                good.append(msg)
            return good

        def _aggregate(self, server_round: int, aggregate, replies: list[Message]):
            """Flower's aggregation of the checked replies; an ``AppExitException`` it raises (e.g.
            ``InconsistentMessageReplies``) skips this round's aggregation, recorded, instead of ending the run."""
            try:
                return aggregate(server_round, replies)
            except AppExitException as e:
                self._record_drop(server_round, f"aggregation skipped ({type(e).__name__}: {_one_line(str(e))})")
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
                self.eta = self.base_eta * lr_factor(server_round - 1, self.optim, self.num_rounds)
                self.server_lr.append(self.eta)
            out = self._aggregate(server_round, super().aggregate_train, good) if good else None
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
            return self._aggregate(server_round, super().aggregate_evaluate, good) if good else None

        def _record_drop(self, server_round: int, why: str) -> None:
            why = " ".join(why.split())  # one line, whatever a peer put into the ids or names it quotes
            log(WARNING, "router round %d: a reply is dropped: %s", server_round, why)
            self.dropped.setdefault(server_round, []).append(why)

        def _check_train(self, node: int, msg: Message) -> RecordDict:
            """The train reply's schema (:func:`~strategies.round_replies.check_train_reply`: records, metric keys
            and types, the global model's arrays deserialised and checked), its weight is the node's declared number
            of training images, and it drew at most ``max_images``."""
            content, m = check_train_reply(msg.content, self._global)
            n, want = m[self.weighted_by_key], self.sizes.get(node)
            if n != want:
                raise ReplyRefused(f"{self.weighted_by_key} = {n!r}, the node declared {want}")
            if not 0 < m["images-seen"] <= self.max_images:
                raise ReplyRefused(f"images-seen = {m['images-seen']!r}, not in 1..{self.max_images}")
            if not 0 <= m["seconds"] <= self.max_seconds:  # summed over rounds into the router's record
                raise ReplyRefused(
                    f"seconds = {m['seconds']:.6g}, not in [0, {self.max_seconds:g}] (the round's timeout)"
                )
            if self.max_update_norm is not None:  # the node was asked to clip its update to this norm
                norm = update_norm(content["arrays"], self._global)
                if norm > self.max_update_norm * (1 + 1e-4):
                    raise ReplyRefused(f"update norm {norm:.6g} exceeds the clipping norm {self.max_update_norm:g}")
            content["metrics"][self.weighted_by_key] = self.weights[node]
            return content

        def _check_counts(self, node: int, msg: Message) -> RecordDict:
            """The evaluate reply's schema, and counts of exactly the node's held-out images (summed over nodes
            into the report's held-out accuracy, which no node may outweigh or overflow)."""
            content = check_evaluate_reply(msg.content, self.num_times, self.num_classes)
            n = content["metrics"]["num-examples"]
            if self.heldout_sizes is not None and n != self.heldout_sizes.get(node):
                raise ReplyRefused(f"num-examples = {n}, the node has {self.heldout_sizes.get(node)} held-out images")
            return content

    return RouterStrategy


def update_norm(arrays: ArrayRecord, start: dict[str, np.ndarray]) -> float:
    """The L2 norm of a node's update (its arrays minus the global model it was sent), over every array, as
    Flower's clipping measures it."""
    total = 0.0
    for name, before in start.items():
        diff = arrays[name].numpy().astype(np.float64) - before.astype(np.float64)
        total += float(np.sum(diff * diff))
    return total**0.5


def bounded_weights(sizes: dict[int, int], ratio: float) -> dict[int, float]:
    """FedAvg weights from declared sizes, none above ``ratio`` × the median declared size (0 = the sizes as they
    are): a node that declares a million images weighs no more than ``ratio`` typical nodes."""
    if not ratio or not sizes:
        return {n: float(s) for n, s in sizes.items()}
    cap = ratio * float(np.median(list(sizes.values())))
    return {n: float(min(s, cap)) for n, s in sizes.items()}


def node_sizes(dataset: Dataset, clusters: dict[int, list[int]]) -> dict[int, int]:
    """Each node's number of training images (its FedAvg weight), from the dataset's metadata (in
    ``data.partition: institution``, what the nodes declared)."""
    return {int(n): dataset.size([int(k) for k in c], "train") for n, c in clusters.items()}


def run_router_rounds(
    grid: Grid,
    cfg: Config,
    clusters: dict[int, list[int]],
    router_config: dict,
    *,
    sizes: dict[int, int],
    timeout: float,
    cache_dir: str,
    weights: dict[int, float] | None = None,
    heldout_sizes: dict[int, int] | None = None,
) -> tuple[Router, dict]:
    """Train the router by ``cfg.router.num_rounds`` rounds over the nodes in ``clusters`` (node id → its cluster
    ids; ``sizes``: node id → its number of training images, :func:`node_sizes`; ``weights``: node id → its
    FedAvg weight, default its size, :func:`bounded_weights` for sizes the nodes declared; ``heldout_sizes``: node
    id → its number of held-out images, what its evaluation counts must add up to); returns the router and its
    record for the report: rounds, bytes per round and in total, wall time, federated held-out accuracy per round
    and time, dropped replies."""
    r = cfg.router
    short = None
    if r.server_optimizer == "krum" and len(clusters) < 2 * r.robust_f + 3:  # fewer nodes came than configured
        short = (
            f"{len(clusters)} nodes, not more than 2·robust_f + 2 = {2 * r.robust_f + 2}: Krum's bound does not hold"
        )
        log(WARNING, "federated router: %s", short)
    torch.manual_seed(r.seed)  # the same initial router as the central one
    router = Router(**router_config)
    strategy = _make_strategy(r.server_optimizer)(
        {int(n): [int(k) for k in c] for n, c in clusters.items()},
        sizes,
        r.local_steps * r.batch_size,
        cfg.num_experts,
        len(cfg.evaluation.times),
        r.num_rounds,
        r.optim,
        weights,
        heldout_sizes,
        timeout,
        **(
            {"eta": r.optim.lr, "eta_l": r.local_lr, "tau": 1e-8, "beta_2": 0.999}
            if r.server_optimizer == "adam"
            else robust_kwargs(r.server_optimizer, r.robust_f, len(clusters))
        ),
    )
    runner = strategy
    if r.dp_noise_multiplier > 0:
        wrapper = DP_WRAPPERS[r.dp_clipping]
        runner = wrapper(strategy, r.dp_noise_multiplier, r.dp_clipping_norm, len(strategy.clusters))
    shared = {
        "experiment": json.dumps(cfg.to_dict()),
        "clusters": json.dumps({str(n): c for n, c in strategy.clusters.items()}),
        "router-config": json.dumps(router_config),
        "cache-dir": cache_dir,
    }
    start = time.perf_counter()
    result = runner.start(
        grid,
        ArrayRecord(router.state_dict()),
        num_rounds=r.num_rounds,
        timeout=timeout,
        train_config=_config(shared),
        evaluate_config=_config(shared),
    )
    seconds = time.perf_counter() - start
    if result.arrays is None or not result.train_metrics_clientapp:
        raise RuntimeError(f"the federated router got no valid update in {r.num_rounds} rounds")
    router.load_state_dict(result.arrays.to_torch_state_dict(), strict=True)
    router.eval()
    times, k = list(cfg.evaluation.times), cfg.num_experts
    per_round = {}
    for rnd, m in sorted(result.evaluate_metrics_clientapp.items()):
        conf = torch.tensor(m["confusion"]).reshape(len(times), k, k)
        per_round[rnd] = {
            "top1": accuracy_from_confusion(conf),
            "top2": [h / max(1, m["num-examples"]) for h in m["top2-hits"]],
            "num_images": m["num-examples"],
        }
    last = per_round[max(per_round)] if per_round else None
    sent, received = strategy.sent_bytes, strategy.received_bytes
    record = {
        "training": "federated",
        "strategy": f"flwr {type(strategy).__mro__[1].__name__}"
        + (f" in {type(runner).__mro__[1].__name__}" if runner is not strategy else ""),
        "server_optimizer": r.server_optimizer,
        **({"robust_f": r.robust_f} if r.server_optimizer in ("krum", "trimmed_avg") else {}),
        **({"krum_too_few_nodes": short} if short else {}),
        **(
            {
                "dp_noise_multiplier": r.dp_noise_multiplier,
                "dp_clipping_norm": r.dp_clipping_norm,
                "dp_clipping": r.dp_clipping,
            }
            if runner is not strategy
            else {}
        ),
        "rounds": r.num_rounds,
        "local_steps": r.local_steps,
        "local_lr": r.local_lr,
        "restricted_softmax": r.restricted_softmax,
        "nodes": {str(n): c for n, c in strategy.clusters.items()},
        "weights": {str(n): w for n, w in sorted(strategy.weights.items())},
        "images_seen": strategy.images_seen,
        "server_lr_per_round": [round(x, 10) for x in strategy.server_lr],
        "wall_seconds": round(seconds, 2),
        # the local training's share of the wall time when the nodes work in parallel (the slowest node per round)
        "slowest_node_seconds": round(strategy.slowest_node_seconds, 2),
        "bytes_per_round": round(sum(sent.values()) / max(1, len(sent)) + sum(received.values()) / max(1, len(sent))),
        "bytes_sent": int(sum(sent.values())),
        "bytes_received": int(sum(received.values())),
        "dropped_replies": {str(k): v for k, v in strategy.dropped.items()},
        "heldout": {"times": times, "federated": True, **(last or {})},
        "heldout_per_round": {str(k): v["top1"] for k, v in per_round.items()},
    }
    return router, record


def run_feature_net_rounds(
    grid: Grid, cfg: Config, clusters: dict[int, list[int]], dataset: Dataset, folder: Path, *, timeout: float
) -> dict:
    """The evaluation's feature classifier (offline FID features) when the coordinator holds no images: the
    router's machinery (Flower's FedAdam/FedAvg over the same nodes, one local SGD step per round by default,
    ClientApp action ``train.feature_net``) for ``evaluation.feature_steps`` rounds; saved into ``folder`` the way
    :func:`hddm_flower.evaluation.evaluate.feature_network` finds it. Returns its record for the report."""
    ev, r = cfg.evaluation, cfg.router
    torch.manual_seed(ev.seed)
    net = FeatureClassifier(in_channels=dataset.pixel_channels, num_classes=cfg.num_experts, text_dim=dataset.text_dim)
    strategy = _make_strategy(r.server_optimizer, "feature_net", evaluate=False)(
        {int(n): [int(k) for k in c] for n, c in clusters.items()},
        node_sizes(dataset, clusters),
        r.local_steps * FEATURE_BATCH,
        cfg.num_experts,
        len(ev.times),
        ev.feature_steps,
        None,
        bounded_weights(node_sizes(dataset, clusters), r.max_weight_ratio),  # the sizes the nodes declared
        None,
        timeout,
        **(
            {"eta": FEATURE_LR, "eta_l": r.local_lr, "tau": 1e-8, "beta_2": 0.999}
            if r.server_optimizer == "adam"
            else robust_kwargs(r.server_optimizer, r.robust_f, len(clusters))
        ),
    )
    shared = {
        "experiment": json.dumps(cfg.to_dict()),
        "clusters": json.dumps({str(n): c for n, c in strategy.clusters.items()}),
        "feature-net-config": json.dumps(_model_config(net)),
    }
    start = time.perf_counter()
    result = strategy.start(
        grid, ArrayRecord(net.state_dict()), num_rounds=ev.feature_steps, timeout=timeout, train_config=_config(shared)
    )
    if result.arrays is None or not result.train_metrics_clientapp:
        raise RuntimeError(f"the federated feature classifier got no valid update in {ev.feature_steps} rounds")
    net.load_state_dict(result.arrays.to_torch_state_dict(), strict=True)
    net.eval().save_pretrained(folder)
    sent, received = strategy.sent_bytes, strategy.received_bytes
    record = {
        "training": "federated",
        "strategy": f"flwr {type(strategy).__mro__[1].__name__}",
        "rounds": ev.feature_steps,
        "nodes": {str(n): c for n, c in strategy.clusters.items()},
        "images_seen": strategy.images_seen,
        "wall_seconds": round(time.perf_counter() - start, 2),
        "bytes_sent": int(sum(sent.values())),
        "bytes_received": int(sum(received.values())),
        "dropped_replies": {str(k): v for k, v in strategy.dropped.items()},
    }
    (folder / "hddm_feature_net.json").write_text(
        json.dumps(
            {
                "steps": ev.feature_steps,
                "seed": ev.seed,
                "trained_on": dataset.description(),
                "data": "federated: each node's own clean images, one cluster per node",
                **record,
            },
            indent=2,
        )
    )
    return record


FEATURE_LR = 2e-3  # the central feature classifier's Adam step size (hddm_flower.evaluation.metrics)


def federated_reference(
    grid: Grid,
    cfg: Config,
    clusters: dict[int, list[int]],
    feature_net,
    description: str,
    *,
    timeout: float,
    cache_dir: str,
    counts: dict[int, int] | None = None,
) -> tuple[dict[int, FeatureSums], dict]:
    """Ask every node for the feature sums of its clusters (``query.feature_stats``) and return them per cluster,
    with a record of who answered. ``feature_net`` (the run's :class:`FeatureClassifier`) travels with the
    message, unless ``evaluation.inception_weights`` names the Inception file every node holds locally.
    ``counts`` (cluster → its number of images, train and validation, as the coordinator knows it): a cluster's
    sums must count exactly that many images; every cluster's sums must be ones that many vectors can have
    (:meth:`FeatureSums.from_numpy`). One reply per asked node; a reply from another node is ignored."""
    inception = cfg.evaluation.inception_weights
    base = {
        "experiment": json.dumps(cfg.to_dict()),
        "clusters": json.dumps({str(n): c for n, c in clusters.items()}),
        "cache-dir": cache_dir,
        "inception": inception,
    }
    content = RecordDict({"config": _config(base)})
    if not inception:
        content["config"]["feature-net-config"] = json.dumps(_model_config(feature_net))
        content["config"]["feature-net-description"] = description
        content["feature-net"] = ArrayRecord(feature_net.state_dict())
    messages = [
        Message(content, dst_node_id=n, message_type=f"{MessageType.QUERY}.feature_stats") for n in sorted(clusters)
    ]
    sums: dict[int, FeatureSums] = {}
    failed: dict[str, str] = {}
    dim = 2048 if inception else feature_net.config.feature_dim  # what every node's sums must have
    replies = list(grid.send_and_receive(messages, timeout=timeout))  # the grid gives each message its id
    kept, dropped = one_per_node(replies, {m.metadata.message_id: m.metadata.dst_node_id for m in messages})
    for i, why in enumerate(dropped):
        failed[f"dropped-{i}"] = why
    for node, reply in kept:
        if reply.has_error():
            failed[str(node)] = _one_line(reply.error.reason)
            continue
        for k in clusters.get(node, []):
            name = f"sums-{k}"
            try:
                if name not in reply.content.array_records:
                    raise ValueError(f"no {name}")
                arrays = {a: reply.content[name][a].numpy() for a in reply.content[name]}
                got = FeatureSums.from_numpy(arrays, source=f"node {node}, cluster {k}")
                if got.dim != dim:
                    raise ValueError(f"node {node}, cluster {k}: {got.dim}-d feature sums, expected {dim}-d")
                if counts is not None and got.count != counts.get(k):
                    raise ValueError(
                        f"node {node}, cluster {k}: sums of {got.count} images, the cluster has {counts.get(k)}"
                    )
                sums[k] = got
            except Exception as e:  # whatever a malformed reply raises costs this node's cluster only
                failed[f"{node}/{k}"] = f"{type(e).__name__}: {_one_line(str(e))}"
    for key, why in failed.items():
        log(WARNING, "federated reference statistics: %s left out: %s", key, why)
    record = {
        "federated": True,
        "clusters": sorted(sums),
        "num_images": sum(s.count for s in sums.values()),
        "failed": failed,
        "bytes_sent": _record_bytes(content) * len(messages),
    }
    return sums, record


def federated_router(
    grid: Grid,
    cfg: Config,
    run_dir: Path,
    dataset: Dataset,
    clusters: dict[int, list[int]],
    *,
    timeout: float,
    cache_dir: str,
) -> tuple[Router, dict]:
    """The federated router over ``clusters`` (:func:`run_router_rounds`: each node's weight its training
    images, bounded when the nodes declared them; its evaluation counts its held-out images), saved into
    ``run_dir/router`` with its record (``hddm_router.json``, strict JSON); returns the router and the record."""
    sizes = node_sizes(dataset, clusters)
    heldout = {int(n): dataset.size([int(k) for k in c], "val") for n, c in clusters.items()}
    declared = dataset.data_free  # institution mode: sizes the nodes declared, bounded
    router, record = run_router_rounds(
        grid,
        cfg,
        clusters,
        router_model_config(cfg, dataset.meta),
        sizes=sizes,
        timeout=timeout,
        cache_dir=cache_dir,
        weights=bounded_weights(sizes, cfg.router.max_weight_ratio) if declared else None,
        heldout_sizes=heldout,
    )
    save_router(
        run_dir / ROUTER,
        router,
        {"preset": cfg.router.preset, **router_record(cfg.router), "time_convention": TIME_CONVENTION} | record,
    )
    return router, record


def finish_federated(
    grid: Grid,
    cfg: Config,
    run_dir: Path,
    dataset: Dataset,
    clusters: dict[int, list[int]],
    missing: list[dict],
    *,
    extra: dict,
    timeout: float,
    cache_dir: str,
) -> dict:
    """After the experts arrived: the router (federated when ``router.training`` says, else central), the FID
    reference statistics (federated when ``evaluation.reference`` says), then the evaluation and the report, whose
    ``router`` block holds the costs (rounds, bytes, wall time)."""
    extra = dict(extra)
    if cfg.router.training == "federated":
        router, record = federated_router(grid, cfg, run_dir, dataset, clusters, timeout=timeout, cache_dir=cache_dir)
    else:
        start = time.perf_counter()
        router = fit_router(cfg, dataset, run_dir)
        record = {
            "training": "central",
            "steps": cfg.router.steps,
            "images_seen": cfg.router.steps * cfg.router.batch_size,
            "wall_seconds": round(time.perf_counter() - start, 2),
            "bytes_sent": 0,
            "bytes_received": 0,
        }
    extra["router"] = {**router_record(cfg.router), **record}
    reference = None
    if cfg.evaluation.reference == "federated":
        if dataset.data_free:  # no image here: the classifier (FID features or LPIPS fallback) federated
            extra["feature_net"] = _federated_feature_net(grid, cfg, clusters, dataset, run_dir, timeout)
        _, net, desc = feature_network(cfg, dataset, run_dir / FEATURE_NET, decode=dataset.decoder(cfg))
        # the clusters' sizes as the coordinator knows them (declared, in institution mode)
        counts = {int(k): dataset.size([int(k)], None) for c in clusters.values() for k in c}
        reference, extra["reference_statistics"] = federated_reference(
            grid, cfg, clusters, net, desc, timeout=timeout, cache_dir=cache_dir, counts=counts
        )
        if not reference:
            raise RuntimeError("no node sent feature sums; the FID reference is empty")
    return evaluate_and_report(cfg, run_dir, dataset, missing, router=router, extra=extra, reference=reference)


def _one_line(text: str) -> str:
    """A peer's message as one bounded line."""
    lines = [ln for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(no reason given)"


def _federated_feature_net(
    grid: Grid, cfg: Config, clusters: dict[int, list[int]], dataset: Dataset, run_dir: Path, timeout: float
) -> dict:
    """The run's feature classifier trained over ``clusters``, reused when it was trained over the same nodes'
    clusters with the same settings (a re-run that adds an institution trains it again)."""
    folder = run_dir / FEATURE_NET
    info = folder / "hddm_feature_net.json"
    want = {str(n): [int(k) for k in c] for n, c in clusters.items()}
    if info.exists():
        old = json.loads(info.read_text())
        same = (old.get("steps"), old.get("seed"), old.get("nodes")) == (
            cfg.evaluation.feature_steps,
            cfg.evaluation.seed,
            want,
        )
        if same:
            return {k: old[k] for k in ("training", "strategy", "rounds", "nodes", "images_seen") if k in old} | {
                "reused": True
            }
        shutil.rmtree(folder)
    return run_feature_net_rounds(grid, cfg, clusters, dataset, folder, timeout=timeout)
