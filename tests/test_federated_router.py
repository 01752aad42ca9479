"""The federated router (Flower's FedAdam/FedAvg over the real ClientApp handlers) and the federated reference
statistics, through an in-process Grid: one node per cluster, the hardest non-IID case."""

import dataclasses
import json

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord

from clients.client_app import app as client_app
from hddm_flower.data import Dataset, Split, read_meta
from hddm_flower.evaluation import metrics as M
from hddm_flower.evaluation.feature_sums import FeatureSums, frechet_distance_from_sums
from hddm_flower.models import Router, TextCond, router_config
from hddm_flower.stages.rounds import node_sizes
from hddm_flower.training import lr_factor
from strategies.inprocess_grid import FakeGrid
from strategies.router_rounds import federated_reference, run_router_rounds

CLUSTERS = {11: [0], 12: [1], 13: [2], 14: [3]}  # node id → its one cluster


def all_images(dataset: Dataset) -> Split:
    """Train and validation splits together, in memory: the central reference the federated sums must equal."""
    a, b = dataset.split(None, "train"), dataset.split(None, "val")
    return Split(
        torch.cat([a.images, b.images]),
        TextCond(*(torch.cat([x, y]) for x, y in zip(a.cond, b.cond))),
        torch.cat([a.labels, b.labels]),
        a.captions + b.captions,
    )


def _cfg(tiny_config, cache_dir, **router):
    cfg = dataclasses.replace(tiny_config, router=dataclasses.replace(tiny_config.router, **router))
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, cache_dir=str(cache_dir)))


def _router_config(cfg, dataset_dir):
    m = read_meta(dataset_dir)
    return router_config(
        cfg.router.preset, num_experts=cfg.num_experts, sample_size=m["image_size"], in_channels=m["channels"]
    )


def _sizes(dataset_dir):
    return node_sizes(Dataset.open(dataset_dir), CLUSTERS)


def _train(grid, cfg, dataset_dir, cache_dir):
    rc, sizes = _router_config(cfg, dataset_dir), _sizes(dataset_dir)
    return run_router_rounds(grid, cfg, CLUSTERS, rc, sizes=sizes, timeout=60, cache_dir=str(cache_dir))


def test_federated_router_rounds_over_single_cluster_nodes(tiny_config, dataset_dir, cache_dir):
    cfg = _cfg(tiny_config, cache_dir, training="federated", rounds=2)
    grid = FakeGrid(client_app, {n: {} for n in CLUSTERS})
    router, record = _train(grid, cfg, dataset_dir, cache_dir)
    kinds = [m.metadata.message_type for m in grid.sent]
    assert kinds == (["train.router"] * 4 + ["evaluate.router"] * 4) * 2  # full participation, the router actions
    assert record["rounds"] == 2 and record["strategy"] == "flwr FedAdam"
    lr = cfg.router.optim.lr  # the server's Adam step follows the central warm-up: round r is step r − 1
    assert record["server_lr_per_round"] == pytest.approx([lr * lr_factor(s, cfg.router.optim, 2) for s in (0, 1)])
    assert record["server_lr_per_round"][0] < record["server_lr_per_round"][1] <= lr
    assert record["images_seen"] == 2 * 4 * 2  # rounds × nodes × (batch 8 · 1 cluster / 4 clusters)
    assert record["heldout"]["num_images"] == len(Dataset.open(dataset_dir).split(None, "val"))  # each counted once
    assert len(record["heldout"]["top1"]) == len(cfg.evaluation.times)
    assert record["bytes_sent"] > 0 and record["bytes_received"] > 0 and record["dropped_replies"] == {}
    ref = router.state_dict()
    assert all(torch.isfinite(v).all() for v in ref.values())


def test_a_prompt_aware_router_trains_federatedly_on_each_nodes_own_captions(tiny_config, dataset_dir, cache_dir):
    """``router.conditioning: text`` through the real ClientApp handlers: the global router's caption projection
    travels and changes (each node trains on its own captions' pooled embeddings), the replies pass the schema."""
    from hddm_flower.stages.router import router_model_config

    cfg = _cfg(tiny_config, cache_dir, training="federated", rounds=2, conditioning="text")
    rc = router_model_config(cfg, read_meta(dataset_dir))
    assert rc["conditioning"] == "text" and rc["caption_dim"] == read_meta(dataset_dir)["text_dim"]
    grid = FakeGrid(client_app, {n: {} for n in CLUSTERS})
    torch.manual_seed(cfg.router.seed)
    start = {k: v.clone() for k, v in Router(**rc).state_dict().items()}
    router, record = run_router_rounds(
        grid, cfg, CLUSTERS, rc, sizes=_sizes(dataset_dir), timeout=60, cache_dir=str(cache_dir)
    )
    assert router.conditioning == "text" and record["dropped_replies"] == {} and record["rounds"] == 2
    assert len(record["heldout"]["top1"]) == len(cfg.evaluation.times)
    moved = [
        k for k, v in router.state_dict().items() if k.startswith("caption_embed") and not torch.equal(v, start[k])
    ]
    assert moved  # the caption projection was trained


def test_a_malformed_update_costs_only_its_own_reply(tiny_config, dataset_dir, cache_dir):
    def tamper(node, reply):
        if node == 12 and reply.metadata.message_type.startswith("train"):
            arrays = reply.content["arrays"]
            name = next(iter(arrays))
            bad = np.full(arrays[name].shape, np.nan, dtype=np.float32)
            reply.content["arrays"] = ArrayRecord({**{k: arrays[k] for k in arrays}, name: Array(bad)})
        if node == 13 and reply.metadata.message_type.startswith("evaluate"):
            reply.content["metrics"]["confusion"] = [10**6] * len(reply.content["metrics"]["confusion"])
        if node == 14 and reply.metadata.message_type.startswith("train"):  # claims a weight it does not have
            reply.content["metrics"]["num-examples"] = 10**6
        return reply

    cfg = _cfg(tiny_config, cache_dir, training="federated", rounds=1, server_optimizer="avg", local_lr=0.05)
    grid = FakeGrid(client_app, {n: {} for n in CLUSTERS}, tamper=tamper)
    router, record = _train(grid, cfg, dataset_dir, cache_dir)
    dropped = record["dropped_replies"]["1"]
    assert any("node 12" in d and "not finite" in d for d in dropped)
    assert any("node 13" in d and "add up" in d for d in dropped)
    assert any("node 14" in d and f"declared {_sizes(dataset_dir)[14]}" in d for d in dropped)
    assert all(torch.isfinite(v).all() for v in router.state_dict().values())
    assert record["images_seen"] == 2 * 2  # the two good updates were averaged
    assert record["strategy"] == "flwr FedAvg"


def test_a_node_in_the_hostile_router_drill_is_dropped_and_the_rest_averaged(tiny_config, dataset_dir, cache_dir):
    """The node config ``drill=hostile-router`` (what scripts/deploy_loopback.py --drill gives one SuperNode) makes
    the real ClientApp send a router reply whose first weight matrix is one row moved by 1000 (numpy would
    broadcast it over every row): each round drops it with its reason, and the router is the FedAvg of the three
    honest nodes, the same as a run without the hostile one."""
    cfg = _cfg(tiny_config, cache_dir, training="federated", rounds=2, server_optimizer="avg", local_lr=0.05)
    rc = _router_config(cfg, dataset_dir)
    honest = {n: c for n, c in CLUSTERS.items() if n != 14}
    nodes = {n: {} for n in honest} | {14: {"drill": "hostile-router"}}
    router, record = run_router_rounds(
        FakeGrid(client_app, nodes), cfg, CLUSTERS, rc, sizes=_sizes(dataset_dir), timeout=60, cache_dir=str(cache_dir)
    )
    assert sorted(record["dropped_replies"]) == ["1", "2"]
    for dropped in record["dropped_replies"].values():
        (why,) = dropped
        assert why.startswith("node 14: array ") and "float32(1, " in why and ", expected float32(" in why, why
    alone, _ = run_router_rounds(
        FakeGrid(client_app, {n: {} for n in honest}),
        cfg,
        honest,
        rc,
        sizes=node_sizes(Dataset.open(dataset_dir), honest),
        timeout=60,
        cache_dir=str(cache_dir),
    )
    for name, value in alone.state_dict().items():
        torch.testing.assert_close(router.state_dict()[name], value, rtol=1e-6, atol=1e-7, msg=name)
    with pytest.raises(ValueError, match=r"node config drill='evil' is not one of \('hostile-router',\)"):
        from flwr.app import Context, RecordDict

        from clients import drill

        drill.router_reply(
            Context(run_id=1, node_id=1, node_config={"drill": "evil"}, state=RecordDict(), run_config={}), RecordDict()
        )


def test_client_side_dp_each_node_clips_its_own_update(tiny_config, dataset_dir, cache_dir):
    """router.dp_clipping: client — Flower's DifferentialPrivacyClientSideFixedClipping: every train message carries
    the clipping norm C, the real ClientApp clips its own update to it (Flower's fixedclipping_mod), the noise is
    added to the average; a node whose update is longer than C (it did not clip) is dropped, with the reason. The
    router moves by at most C (plus the noise), while the same round without DP moves it by more than 10 C."""

    def tamper(node, reply):  # node 14 ignores the clipping norm: every weight moved by 0.01
        if node == 14 and reply.metadata.message_type == "train.router":
            arrays = reply.content["arrays"]
            reply.content["arrays"] = ArrayRecord({k: Array(arrays[k].numpy() + np.float32(0.01)) for k in arrays})
        return reply

    c = 1e-3
    common = dict(training="federated", rounds=1, server_optimizer="avg", local_lr=0.05)
    cfg = _cfg(tiny_config, cache_dir, **common, dp_noise_multiplier=1e-6, dp_clipping="client", dp_clipping_norm=c)
    grid = FakeGrid(client_app, {n: {} for n in CLUSTERS}, tamper=tamper)
    router, record = _train(grid, cfg, dataset_dir, cache_dir)
    assert record["strategy"] == "flwr FedAvg in DifferentialPrivacyClientSideFixedClipping"
    assert record["dp_clipping"] == "client"
    asked = [m.content["config"]["clipping_norm"] for m in grid.sent if m.metadata.message_type == "train.router"]
    assert asked == [c] * 4
    (why,) = record["dropped_replies"]["1"]
    assert why.startswith("node 14: update norm ") and why.endswith("exceeds the clipping norm 0.001"), why
    assert record["images_seen"] == 3 * 2  # the three clipped updates were averaged

    def moved(r):
        torch.manual_seed(cfg.router.seed)
        start = Router(**_router_config(cfg, dataset_dir)).state_dict()
        return float(torch.cat([(r.state_dict()[k] - v).flatten().double() for k, v in start.items()]).norm())

    assert moved(router) <= c * 1.01
    plain, _ = _train(
        FakeGrid(client_app, {n: {} for n in CLUSTERS}), _cfg(tiny_config, cache_dir, **common), dataset_dir, cache_dir
    )
    assert moved(plain) > 10 * c


def test_federated_reference_statistics_equal_the_central_ones(tiny_config, dataset_dir, cache_dir):
    """Each node's feature sums of its own cluster, added by the server, equal the central reference (1e-6)."""
    cfg = _cfg(tiny_config, cache_dir)
    torch.manual_seed(0)
    net = M.FeatureClassifier(in_channels=3, num_classes=4, text_dim=384).eval()
    fx = M.classifier_features(net, "random test net")
    grid = FakeGrid(client_app, {n: {} for n in CLUSTERS})
    sums, record = federated_reference(
        grid, cfg, CLUSTERS, net, "random test net", timeout=60, cache_dir=str(cache_dir)
    )
    assert sorted(sums) == [0, 1, 2, 3] and record["failed"] == {}
    ref = all_images(Dataset.open(dataset_dir))
    central = fx(ref.images)
    total = sums[0] + sums[1] + sums[2] + sums[3]
    assert total.count == len(ref) == record["num_images"]
    mu, cov = total.mean_cov()
    torch.testing.assert_close(mu, central.mean(0), rtol=0, atol=1e-6)
    torch.testing.assert_close(cov, torch.cov(central.T), rtol=0, atol=1e-6)
    for k in range(4):  # per cluster (the per-expert FID's reference)
        torch.testing.assert_close(sums[k].outer, FeatureSums.of(central[ref.labels == k]).outer, rtol=1e-9, atol=1e-9)
    fake = central[:40] + 0.1
    assert frechet_distance_from_sums(total, fake) == pytest.approx(M.frechet_distance(central, fake), abs=1e-6)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("router.training", "fed", "router.training: unknown value 'fed'"),
        ("router.server_optimizer", "sgd", "router.server_optimizer: unknown value"),
        ("router.local_steps", 0, "router.local_steps: must be ≥ 1"),
        ("router.restricted_softmax", 0.0, r"router.restricted_softmax: must be in \(0, 1\]"),
        (
            "router.dp_clipping",
            "both",
            r"x.yaml: router.dp_clipping: unknown value 'both'; expected one of \('server', 'client'\)",
        ),
        ("evaluation.reference", "nodes", "evaluation.reference: unknown value 'nodes'"),
    ],
)
def test_federated_settings_are_checked(key, value, message):
    from hddm_flower.config.io import config_from_dict
    from hddm_flower.config.rules import ConfigError

    section, name = key.split(".")
    with pytest.raises(ConfigError, match=message):
        config_from_dict({section: {name: value}}, source="x.yaml")


def test_rounds_default_to_the_central_budget():
    from hddm_flower.config.sections import RouterConfig

    assert RouterConfig(steps=400, local_steps=1).num_rounds == 400
    assert RouterConfig(steps=400, local_steps=3).num_rounds == 134
    assert RouterConfig(steps=400, rounds=7).num_rounds == 7


@pytest.mark.timeout(900)
def test_server_app_with_federated_router_and_reference(tiny_config_path, cache_dir, tmp_path):
    """The ServerApp end to end over 4 single-cluster nodes (in-process Grid): experts, then the federated router
    (FedAdam) and the federated FID reference; the report holds their costs and sources. Node 2 is hostile in the
    first router round: its reply carries a metric key the others lack (Flower's InconsistentMessageReplies ended
    the run after every expert had been trained); the run completes and the report names the dropped reply."""
    from flwr.app import Context, RecordDict

    from strategies.server_app import main as server_main

    run_dir = tmp_path / "run"
    run_config = {
        "config": str(tiny_config_path),
        "overrides": "router.training=federated router.rounds=2 evaluation.reference=federated "
        "evaluation.routing_modes=[top2]",
        "run-dir": str(run_dir),
        "cache-dir": str(cache_dir),
    }
    hostile = []

    def tamper(node, reply):
        if node == 2 and reply.metadata.message_type == "train.router" and not reply.has_error() and not hostile:
            hostile.append(reply)  # its first router reply only
            reply.content["metrics"]["extra"] = 1.0
        return reply

    grid = FakeGrid(client_app, {n: {"partition-id": n - 1} for n in range(1, 5)}, tamper=tamper)
    server_main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    report = json.loads((run_dir / "report.json").read_text())
    assert [e["expert_id"] for e in report["experts"]] == [0, 1, 2, 3] and report["missing"] == []
    r = report["router"]
    assert sorted(r["nodes"].values()) == [[0], [1], [2], [3]]  # single-class nodes
    assert r["training"] == "federated" and r["rounds"] == 2 and r["strategy"] == "flwr FedAdam"
    assert r["bytes_sent"] > 0 and r["bytes_received"] > 0
    assert r["dropped_replies"] == {"1": ["node 2: metric keys differ: ['extra'] extra, [] missing"]}
    assert r["heldout"]["num_images"] > 0 and len(r["heldout"]["top1"]) == len(report["metrics"]["times"])
    assert report["reference_statistics"]["clusters"] == [0, 1, 2, 3]
    top2 = report["metrics"]["evaluation"]["modes"]["top2"]
    assert top2["kid"] is None and top2["fid"] >= 0
    assert top2["num_reference"] == report["reference_statistics"]["num_images"]
    assert "federated" in report["metrics"]["evaluation"]["protocol"]["reference"]
    assert (run_dir / "router" / "hddm_router.json").exists() and "KID" in (run_dir / "report.md").read_text()


def test_hostile_feature_sums_cost_only_their_cluster(tiny_config, cache_dir):
    """Node 11 answers honestly; node 12 sends sums of another dimension, node 13 an array numpy cannot read, node
    14 an error: the reference holds cluster 0, the others are recorded as failed, and the run is not stopped."""
    from flwr.app import Message, RecordDict

    cfg = _cfg(tiny_config, cache_dir)
    net = M.FeatureClassifier(in_channels=3, num_classes=4, text_dim=384).eval()
    d = net.config.feature_dim
    gen = torch.Generator().manual_seed(0)

    def sums(dim: int) -> ArrayRecord:
        arrays = FeatureSums.of(torch.randn(5, dim, generator=gen, dtype=torch.float64)).to_numpy()
        return ArrayRecord({n: Array(a) for n, a in arrays.items()})

    def node(msg, context):
        k = CLUSTERS[context.node_id][0]
        if context.node_id == 14:
            raise RuntimeError("out of memory\nwhile computing features")
        record = sums(d + 1 if context.node_id == 12 else d)
        if context.node_id == 13:
            record["total"] = Array(dtype="float64", shape=(d,), stype="numpy.ndarray", data=b"\x00" * 7)
        return Message(RecordDict({f"sums-{k}": record}), reply_to=msg)

    got, record = federated_reference(
        FakeGrid(node, {n: {} for n in CLUSTERS}), cfg, CLUSTERS, net, "random test net", timeout=5, cache_dir=""
    )
    assert sorted(got) == [0] and got[0].dim == d
    assert sorted(record["failed"]) == ["12/1", "13/2", "14"], record["failed"]
    assert f"{d + 1}-d feature sums, expected {d}-d" in record["failed"]["12/1"]
    assert all("\n" not in why for why in record["failed"].values())


def test_feature_sums_that_no_images_can_have_or_of_another_count_are_refused(tiny_config, cache_dir):
    """Node 11 is honest; node 12 halves its count (the covariance Σffᵀ/n' − μ'μ'ᵀ is then not positive
    semi-definite), node 13 sends consistent sums of 3 more images than its cluster has, node 14 sums of 6
    vectors claimed as 2 (a rank-5 scatter from 2 vectors): only cluster 0 is kept, each refusal named."""
    from flwr.app import Message, RecordDict

    cfg = _cfg(tiny_config, cache_dir)
    net = M.FeatureClassifier(in_channels=3, num_classes=4, text_dim=384).eval()
    d = net.config.feature_dim
    gen = torch.Generator().manual_seed(0)
    sizes = {0: 6, 1: 6, 2: 6, 3: 6}

    def node(msg, context):
        k = CLUSTERS[context.node_id][0]
        extra = 3 if context.node_id == 13 else 0
        f = torch.randn(sizes[k] + extra, d, generator=gen, dtype=torch.float64) + 2.0
        arrays = FeatureSums.of(f).to_numpy()
        if context.node_id == 12:
            arrays["count"] = np.array([3], dtype=np.int64)
        if context.node_id == 14:
            arrays = FeatureSums.of(f - f.mean(0)).to_numpy()
            arrays["count"] = np.array([2], dtype=np.int64)
        return Message(RecordDict({f"sums-{k}": ArrayRecord({n: Array(a) for n, a in arrays.items()})}), reply_to=msg)

    got, record = federated_reference(
        FakeGrid(node, {n: {} for n in CLUSTERS}), cfg, CLUSTERS, net, "random", timeout=5, cache_dir="", counts=sizes
    )
    assert sorted(got) == [0], record["failed"]
    failed = record["failed"]
    assert "not positive semi-definite" in failed["12/1"]
    assert "sums of 9 images, the cluster has 6" in failed["13/2"]
    assert "rank 5, more than count − 1 = 1" in failed["14/3"]
