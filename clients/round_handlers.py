"""Message handlers of the federated router and the federated evaluation statistics (the node side).

Each computes on this node's own clusters and replies with a model update, counts or sums, never samples:

* ``train.router`` (a round of :class:`strategies.round_strategy.CheckedRounds`): a few SGD steps of the
  global router on this node's clusters (:func:`hddm_flower.federation.local.router_local_update`; a router that reads
  the caption trains on the pooled embeddings of the node's own captions); replies with the new weights (their
  update clipped here when the server asks for client-side DP clipping: :func:`clip_when_asked`),
  ``num-examples`` = the node's number of training images (FedAvg's weight n_k, which the server checks against
  the size the node declared) and ``images-seen`` = the images its steps drew.
* ``evaluate.router``: the router's confusion counts and top-2 hits on this node's held-out split at
  ``evaluation.times`` (:func:`hddm_flower.federation.local.router_confusion`).
* ``train.feature_net``: a round of the evaluation's feature classifier when the coordinator holds no images
  (``data.partition: institution``): as ``train.router``, with the classifier's objective on clean images.
* ``query.feature_stats``: per cluster, the sums ``(n, Σf, Σffᵀ)`` of the features of this node's images (train
  and validation, as the central reference) with the run's feature network, which the message carries.

Which clusters are this node's: the ``clusters`` map of the message (node id → cluster ids, from the expert
assignment). Where its data is: the node config's ``shard-set`` or ``data-dir``, else the embedded dataset built
in the cache, as for the experts (:mod:`clients.client_app`).
"""

from __future__ import annotations

import functools
import json
import logging
import time

import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp.mod import fixedclipping_mod
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM  # the key fixedclipping_mod reads

from clients import drill
from hddm_flower.config.io import config_from_dict
from hddm_flower.config.schema import Config
from hddm_flower.data import Dataset, Split
from hddm_flower.evaluation.feature_sums import cluster_feature_sums
from hddm_flower.evaluation.metrics import FeatureClassifier, classifier_features, inception_features
from hddm_flower.federation.local import FEATURE_BATCH, feature_net_local_update, router_confusion, router_local_update
from hddm_flower.models import Router
from hddm_flower.stages.prepare import prepare_data
from hddm_flower.text import pooled_caption

log = logging.getLogger("hddm_flower.client")
_SPLITS: dict[tuple, Split] = {}  # (dataset dir, clusters, split) → the split, kept across rounds of one run
# A process that serves several nodes (simulation, in-process benchmarks) asks for a train and a val split per node
# in turn every round: a bound below 2 × nodes evicts each split just before it is needed again (every message
# re-read its shards: a third of an in-process round's time). One node's splits are what it trains from anyway.
MAX_SPLITS = 64


def my_clusters(context: Context, clusters_json: str) -> list[int]:
    clusters = json.loads(clusters_json).get(str(context.node_id))
    if not clusters:
        raise ValueError(f"node {context.node_id} holds no cluster of this run (the server sent it no assignment)")
    return [int(k) for k in clusters]


def _split(dataset: Dataset, clusters: list[int], split: str) -> Split:
    key = (str(dataset.root), tuple(clusters), split)
    if key not in _SPLITS:
        if len(_SPLITS) >= MAX_SPLITS:
            _SPLITS.pop(next(iter(_SPLITS)))
        _SPLITS[key] = dataset.split(clusters, split)
    return _SPLITS[key]


@functools.lru_cache(maxsize=4)
def _experiment(text: str) -> Config:
    return config_from_dict(json.loads(text), source="router message")


def _task(msg: Message, context: Context) -> tuple[Config, list[int], Dataset, dict]:
    conf = msg.content["config"]
    cfg = _experiment(str(conf["experiment"]))
    clusters = my_clusters(context, str(conf["clusters"]))
    return (
        cfg,
        clusters,
        Dataset.for_node(
            context.node_config, cfg, prepare_data, cache_dir=str(conf.get("cache-dir", "")), clusters=clusters
        ),
        conf,
    )


@functools.lru_cache(maxsize=2)
def _router_of(config: str) -> Router:
    return Router(**json.loads(config))


def _router(msg: Message, conf) -> Router:
    """The received global router (one module per router config is built once and reloaded every round)."""
    router = _router_of(str(conf["router-config"]))
    router.load_state_dict(msg.content["arrays"].to_torch_state_dict(), strict=True)
    return router


_POOLED: dict[tuple, torch.Tensor] = {}  # (dataset dir, clusters, split) → the split's pooled captions


def _pooled_captions(router: Router, dataset: Dataset, clusters: list[int], split: str, data: Split):
    """The split's pooled caption embeddings (N, dim) for a router that reads the caption (kept with the split),
    else None."""
    if router.conditioning != "text":
        return None
    key = (str(dataset.root), tuple(clusters), split)
    if key not in _POOLED:
        if len(_POOLED) >= MAX_SPLITS:
            _POOLED.pop(next(iter(_POOLED)))
        _POOLED[key] = pooled_caption(*data.cond)
    return _POOLED[key]


def clip_when_asked(msg: Message, context: Context, call_next) -> Message:
    """The ``train.router`` handler's mod: Flower's ``fixedclipping_mod`` (the update clipped to the norm C before
    it leaves the node) when the message carries a clipping norm (the server's
    ``DifferentialPrivacyClientSideFixedClipping``, ``router.dp_clipping: client``); else the handler as it is."""
    config = msg.content.config_records.get("config")
    if config is not None and KEY_CLIPPING_NORM in config:
        return fixedclipping_mod(msg, context, call_next)
    return call_next(msg, context)


def router_update(msg: Message, context: Context) -> Message:
    """One round: local SGD steps of the received router on this node's training images (and own captions)."""
    cfg, clusters, dataset, conf = _task(msg, context)
    r = cfg.router
    data = _split(dataset, clusters, "train")
    router = _router(msg, conf)
    captions = _pooled_captions(router, dataset, clusters, "train", data)
    server_round = int(conf["server-round"])
    start = time.perf_counter()
    batch = max(1, round(r.batch_size * len(clusters) / cfg.num_experts))
    stats = router_local_update(
        router,
        data.images,
        data.labels,
        steps=r.local_steps,
        batch_size=batch,
        lr=r.local_lr,
        seed=r.seed * 1_000_003 + server_round * 1009 + clusters[0],
        alpha=r.restricted_softmax,
        captions=captions,
        uncond_caption=None if captions is None else pooled_caption(*dataset.uncond),
        caption_dropout=r.caption_dropout,
    )
    content = RecordDict({"arrays": ArrayRecord(router.state_dict()), "metrics": _metrics(data, stats, start)})
    return Message(drill.router_reply(context, content), reply_to=msg)


def _metrics(data: Split, stats: dict, start: float) -> MetricRecord:
    """A training round's reply metrics: FedAvg's weight ``num-examples`` is this node's training-set size."""
    return MetricRecord(
        {
            "num-examples": len(data),
            "images-seen": stats["images-seen"],
            "train-loss": stats["loss"],
            "seconds": time.perf_counter() - start,
        }
    )


@functools.lru_cache(maxsize=2)
def _feature_net_of(config: str) -> FeatureClassifier:
    return FeatureClassifier.from_config(json.loads(config))


def feature_net_update(msg: Message, context: Context) -> Message:
    """One round of the evaluation's feature classifier (``data.partition: institution``, no local Inception): local
    SGD steps of the received classifier on this node's clean training images (decoded to pixels), labels and
    caption embeddings; replies with the new weights and the number of images they saw."""
    cfg, clusters, dataset, conf = _task(msg, context)
    data = _split(dataset, clusters, "train")
    net = _feature_net_of(str(conf["feature-net-config"]))
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict(), strict=True)
    start = time.perf_counter()
    stats = feature_net_local_update(
        net,
        _pixels(cfg, dataset, clusters, data),
        data.labels,
        pooled_caption(*data.cond),
        steps=cfg.router.local_steps,
        batch_size=max(1, round(FEATURE_BATCH * len(clusters) / cfg.num_experts)),
        lr=cfg.router.local_lr,
        seed=cfg.evaluation.seed * 1_000_003 + int(conf["server-round"]) * 1009 + clusters[0],
    )
    return Message(
        RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": _metrics(data, stats, start)}), reply_to=msg
    )


_PIXELS: dict[tuple, torch.Tensor] = {}


def _pixels(cfg: Config, dataset: Dataset, clusters: list[int], data: Split) -> torch.Tensor:
    """The training split as pixels (latents decoded once per run by the node's VAE)."""
    key = (str(dataset.root), tuple(clusters))
    if key not in _PIXELS:
        _PIXELS.clear()
        _PIXELS[key] = dataset.decoder(cfg)(data.images)
    return _PIXELS[key]


def evaluate_router(msg: Message, context: Context) -> Message:
    """Confusion counts (flattened T×K×K) and top-2 hits of the received router on this node's held-out images."""
    cfg, clusters, dataset, conf = _task(msg, context)
    data = _split(dataset, clusters, "val")
    router = _router(msg, conf)
    conf_counts, top2 = router_confusion(
        router,
        data.images,
        data.labels,
        cfg.evaluation.times,
        seed=cfg.sampling.seed + 7919 * clusters[0],
        captions=_pooled_captions(router, dataset, clusters, "val", data),
    )
    metrics = MetricRecord(
        {"num-examples": len(data), "confusion": conf_counts.flatten().tolist(), "top2-hits": top2.tolist()}
    )
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)


def feature_stats(msg: Message, context: Context) -> Message:
    """Per cluster of this node: ``sums-<k>`` = (n, Σf, Σffᵀ) of its images' features (float64)."""
    cfg, clusters, dataset, conf = _task(msg, context)
    if str(conf.get("inception", "")):
        fx = inception_features(str(conf["inception"]))
    else:
        net = FeatureClassifier.from_config(json.loads(str(conf["feature-net-config"])))
        net.load_state_dict(msg.content["feature-net"].to_torch_state_dict(), strict=True)
        fx = classifier_features(net.eval(), str(conf["feature-net-description"]))
    decode = dataset.decoder(cfg)
    out = RecordDict()
    for k in clusters:  # streamed batch by batch: no cluster is decoded or held at once
        sums = cluster_feature_sums(fx, dataset, k, decode=decode)
        out[f"sums-{k}"] = ArrayRecord({n: Array(a) for n, a in sums.to_numpy().items()})
        log.info("cluster %d: feature sums of %d images (%s)", k, sums.count, fx.name)
    out["metrics"] = MetricRecord({"num-examples": sum(int(out[f"sums-{k}"]["count"].numpy()[0]) for k in clusters)})
    return Message(out, reply_to=msg)
