"""Stage 4 on the server of a federation: the router (federated when ``router.training`` says, else central) and
the FID reference statistics (federated when ``evaluation.reference`` says), then the evaluation and the report
(:func:`~hddm_flower.stages.assemble.evaluate_and_report`), whose ``router`` block holds the costs (rounds, bytes,
wall time).

The rounds themselves go through a :class:`FederatedRounds`, which the framework provides (the ServerApp's
``strategies.router_rounds.FlowerRounds`` over Flower's grid): this module decides what is trained and kept, and
stays framework-free.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Protocol

import numpy as np

from ..checkpoints import TIME_CONVENTION, save_router
from ..config.schema import Config
from ..data import Dataset
from ..evaluation.evaluate import FEATURE_NET, feature_network
from ..evaluation.feature_sums import FeatureSums
from ..models import Router
from ..rundir import ROUTER
from .assemble import evaluate_and_report
from .router import fit_router, router_model_config, router_record


class FederatedRounds(Protocol):
    """The federated rounds of stage 4, as the framework runs them over the nodes in ``clusters`` (node id → its
    cluster ids)."""

    def router(
        self,
        cfg: Config,
        clusters: dict[int, list[int]],
        router_config: dict,
        *,
        sizes: dict[int, int],
        weights: dict[int, float] | None,
        heldout_sizes: dict[int, int] | None,
    ) -> tuple[Router, dict]:
        """The router trained by ``router.num_rounds`` rounds, and its record for the report."""
        ...

    def feature_net(self, cfg: Config, clusters: dict[int, list[int]], dataset: Dataset, folder: Path) -> dict:
        """The evaluation's feature classifier trained by rounds and saved into ``folder``; its record."""
        ...

    def reference(
        self,
        cfg: Config,
        clusters: dict[int, list[int]],
        feature_net,
        description: str,
        *,
        counts: dict[int, int] | None,
    ) -> tuple[dict[int, FeatureSums], dict]:
        """Every node's feature sums of its clusters, per cluster, and a record of who answered."""
        ...


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


def federated_router(
    rounds: FederatedRounds, cfg: Config, run_dir: Path, dataset: Dataset, clusters: dict[int, list[int]]
) -> tuple[Router, dict]:
    """The federated router over ``clusters`` (each node's weight its training images, bounded when the nodes
    declared them; its evaluation counts its held-out images), saved into ``run_dir/router`` with its record
    (``hddm_router.json``, strict JSON); returns the router and the record."""
    sizes = node_sizes(dataset, clusters)
    heldout = {int(n): dataset.size([int(k) for k in c], "val") for n, c in clusters.items()}
    declared = dataset.data_free  # institution mode: sizes the nodes declared, bounded
    router, record = rounds.router(
        cfg,
        clusters,
        router_model_config(cfg, dataset.meta),
        sizes=sizes,
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
    rounds: FederatedRounds,
    cfg: Config,
    run_dir: Path,
    dataset: Dataset,
    clusters: dict[int, list[int]],
    missing: list[dict],
    *,
    extra: dict,
) -> dict:
    """After the experts arrived: the router (federated when ``router.training`` says, else central), the FID
    reference statistics (federated when ``evaluation.reference`` says), then the evaluation and the report, whose
    ``router`` block holds the costs (rounds, bytes, wall time)."""
    extra = dict(extra)
    if cfg.router.training == "federated":
        router, record = federated_router(rounds, cfg, run_dir, dataset, clusters)
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
            extra["feature_net"] = federated_feature_net(rounds, cfg, clusters, dataset, run_dir)
        _, net, desc = feature_network(cfg, dataset, run_dir / FEATURE_NET, decode=dataset.decoder(cfg))
        # the clusters' sizes as the coordinator knows them (declared, in institution mode)
        counts = {int(k): dataset.size([int(k)], None) for c in clusters.values() for k in c}
        reference, extra["reference_statistics"] = rounds.reference(cfg, clusters, net, desc, counts=counts)
        if not reference:
            raise RuntimeError("no node sent feature sums; the FID reference is empty")
    return evaluate_and_report(cfg, run_dir, dataset, missing, router=router, extra=extra, reference=reference)


def federated_feature_net(
    rounds: FederatedRounds, cfg: Config, clusters: dict[int, list[int]], dataset: Dataset, run_dir: Path
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
    return rounds.feature_net(cfg, clusters, dataset, folder)
