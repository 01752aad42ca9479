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

:func:`run_router_rounds` and :func:`run_feature_net_rounds` run the rounds with the checked strategy of
:mod:`strategies.round_strategy`; :func:`federated_reference` asks every node for its feature sums.
:class:`FlowerRounds` gives them to stage 4 (:func:`hddm_flower.stages.rounds.finish_federated`), which decides
what is trained and kept.
"""

from __future__ import annotations

import json
import time
from logging import WARNING
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.common import log
from flwr.serverapp import Grid

from hddm_flower.config.schema import Config
from hddm_flower.data import Dataset
from hddm_flower.evaluation.feature_sums import FeatureSums
from hddm_flower.evaluation.metrics import FeatureClassifier
from hddm_flower.federation.local import FEATURE_BATCH, accuracy_from_confusion
from hddm_flower.models import Router
from hddm_flower.stages.rounds import bounded_weights, node_sizes

from .round_replies import one_per_node
from .round_strategy import DP_WRAPPERS, CheckedRounds, base_strategy, one_line, record_bytes, robust_kwargs


def _config(values: dict) -> ConfigRecord:
    """A ConfigRecord without empty strings (flwr's byte count refuses them; the nodes read absent as empty)."""
    return ConfigRecord({k: v for k, v in values.items() if v != ""})


def _model_config(model) -> dict:
    """A diffusers model's config without its private keys (``_name_or_path`` of a loaded one is a path)."""
    return {k: v for k, v in model.config.items() if not k.startswith("_")}


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
    nodes = {int(n): [int(k) for k in c] for n, c in clusters.items()}
    strategy = CheckedRounds(
        base_strategy(
            r.server_optimizer,
            len(nodes),
            **(
                {"eta": r.optim.lr, "eta_l": r.local_lr, "tau": 1e-8, "beta_2": 0.999}
                if r.server_optimizer == "adam"
                else robust_kwargs(r.server_optimizer, r.robust_f, len(clusters))
            ),
        ),
        nodes,
        sizes,
        r.local_steps * r.batch_size,
        cfg.num_experts,
        len(cfg.evaluation.times),
        r.num_rounds,
        r.optim,
        weights,
        heldout_sizes,
        timeout,
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
        "strategy": f"flwr {type(strategy.strategy).__name__}"
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
    nodes = {int(n): [int(k) for k in c] for n, c in clusters.items()}
    strategy = CheckedRounds(
        base_strategy(
            r.server_optimizer,
            len(nodes),
            **(
                {"eta": FEATURE_LR, "eta_l": r.local_lr, "tau": 1e-8, "beta_2": 0.999}
                if r.server_optimizer == "adam"
                else robust_kwargs(r.server_optimizer, r.robust_f, len(clusters))
            ),
        ),
        nodes,
        node_sizes(dataset, clusters),
        r.local_steps * FEATURE_BATCH,
        cfg.num_experts,
        len(ev.times),
        ev.feature_steps,
        None,
        bounded_weights(node_sizes(dataset, clusters), r.max_weight_ratio),  # the sizes the nodes declared
        None,
        timeout,
        action="feature_net",
        evaluate=False,
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
        "strategy": f"flwr {type(strategy.strategy).__name__}",
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
            failed[str(node)] = one_line(reply.error.reason)
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
                failed[f"{node}/{k}"] = f"{type(e).__name__}: {one_line(str(e))}"
    for key, why in failed.items():
        log(WARNING, "federated reference statistics: %s left out: %s", key, why)
    record = {
        "federated": True,
        "clusters": sorted(sums),
        "num_images": sum(s.count for s in sums.values()),
        "failed": failed,
        "bytes_sent": record_bytes(content) * len(messages),
    }
    return sums, record


class FlowerRounds:
    """Stage 4's federated rounds (:class:`hddm_flower.stages.rounds.FederatedRounds`) over the ServerApp's grid:
    every round waits at most ``timeout`` seconds for the nodes; ``cache_dir`` is where the nodes build the run's
    dataset when their node config names none."""

    def __init__(self, grid: Grid, *, timeout: float, cache_dir: str) -> None:
        self.grid, self.timeout, self.cache_dir = grid, timeout, cache_dir

    def router(self, cfg, clusters, router_config, *, sizes, weights, heldout_sizes) -> tuple[Router, dict]:
        return run_router_rounds(
            self.grid,
            cfg,
            clusters,
            router_config,
            sizes=sizes,
            timeout=self.timeout,
            cache_dir=self.cache_dir,
            weights=weights,
            heldout_sizes=heldout_sizes,
        )

    def feature_net(self, cfg, clusters, dataset: Dataset, folder) -> dict:
        return run_feature_net_rounds(self.grid, cfg, clusters, dataset, folder, timeout=self.timeout)

    def reference(self, cfg, clusters, feature_net, description, *, counts) -> tuple[dict[int, FeatureSums], dict]:
        return federated_reference(
            self.grid,
            cfg,
            clusters,
            feature_net,
            description,
            timeout=self.timeout,
            cache_dir=self.cache_dir,
            counts=counts,
        )
