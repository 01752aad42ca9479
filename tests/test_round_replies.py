"""Hostile replies in the federated router's rounds: each costs its own reply, recorded with its reason, and the
averaged router is the average of the honest replies.

The nodes are stand-ins with a closed-form update (node n adds 0.01·n to every float array of the global router
and declares size n), so that the router after one FedAvg round is known exactly: the global router plus
Σ_honest (n / Σ_honest n)·0.01·n."""

from __future__ import annotations

import dataclasses
import io
import json
import uuid

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.exception import InconsistentMessageReplies

from hddm_flower.models import Router, router_config
from strategies.inprocess_grid import FakeGrid
from strategies.router_rounds import run_router_rounds

CLUSTERS = {11: [0], 12: [1], 13: [2], 14: [3]}
SIZES = {n: n for n in CLUSTERS}  # each node's number of training images (its FedAvg weight)
HOSTILE = 12
TIMES = 1  # evaluation times in the config below


def _cfg(tiny_config):
    r = dataclasses.replace(tiny_config.router, training="federated", rounds=1, server_optimizer="avg")
    ev = dataclasses.replace(tiny_config.evaluation, times=(0.5,))
    return dataclasses.replace(tiny_config, router=r, evaluation=ev)


ROUTER_CONFIG = router_config("test", num_experts=4, sample_size=8, in_channels=3)


def _update(arrays: ArrayRecord, node: int) -> dict[str, np.ndarray]:
    out = {}
    for k, a in arrays.items():
        x = a.numpy()
        out[k] = x + np.asarray(0.01 * node, dtype=x.dtype) if x.dtype.kind == "f" else x
    return out


def honest_node(msg: Message, context) -> Message:
    """A node whose update and counts are known in closed form."""
    node = context.node_id
    if msg.metadata.message_type.startswith("train"):
        arrays = ArrayRecord({k: Array(v) for k, v in _update(msg.content["arrays"], node).items()})
        metrics = {"num-examples": SIZES[node], "images-seen": 2, "train-loss": 0.5, "seconds": 0.1}
        return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord(metrics)}), reply_to=msg)
    k = CLUSTERS[node][0]
    confusion = [0] * (TIMES * 16)
    confusion[k * 4 + k] = 3  # 3 held-out images of its cluster, all right
    metrics = {"num-examples": 3, "confusion": confusion, "top2-hits": [3] * TIMES}
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)


def _expected(honest: list[int]) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    state = Router(**ROUTER_CONFIG).state_dict()
    total = sum(SIZES[n] for n in honest)
    shift = sum(SIZES[n] / total * 0.01 * n for n in honest)
    return {k: v + shift if v.is_floating_point() else v for k, v in state.items()}


def _run(tiny_config, grid):
    cfg = _cfg(tiny_config)
    cfg = dataclasses.replace(cfg, router=dataclasses.replace(cfg.router, seed=0))
    return run_router_rounds(grid, cfg, CLUSTERS, ROUTER_CONFIG, sizes=SIZES, timeout=5, cache_dir="")


def _npy(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, x, allow_pickle=False)
    return buf.getvalue()


def _first_float(reply: Message) -> str:
    arrays = reply.content["arrays"]
    return next(k for k in arrays if arrays[k].numpy().dtype.kind == "f" and arrays[k].numpy().size > 1)


def _replace_array(reply: Message, array: Array) -> Message:
    arrays = reply.content["arrays"]
    name = _first_float(reply)
    reply.content["arrays"] = ArrayRecord({**{k: arrays[k] for k in arrays}, name: array})
    return reply


def _extra_metric(reply):
    reply.content["metrics"]["extra"] = 1.0
    return reply


def _second_record(reply):
    reply.content["more"] = MetricRecord({"num-examples": 1})
    return reply


def _config_record(reply):
    reply.content["config"] = ConfigRecord({"x": "y"})
    return reply


def _unparsable(reply):
    name = _first_float(reply)
    a = reply.content["arrays"][name]
    return _replace_array(reply, Array(dtype=a.dtype, shape=a.shape, stype="numpy.ndarray", data=b"\x93NUMPY\x00"))


def _other_shape(reply):
    """The header says the global model's shape and dtype; the payload is one number (numpy would broadcast it)."""
    name = _first_float(reply)
    a = reply.content["arrays"][name]
    payload = _npy(np.full((1,), 5.0, dtype=np.float32))
    return _replace_array(reply, Array(dtype=a.dtype, shape=a.shape, stype="numpy.ndarray", data=payload))


def _npz(reply):
    name = _first_float(reply)
    a = reply.content["arrays"][name]
    buf = io.BytesIO()
    np.savez(buf, x=a.numpy())
    return _replace_array(reply, Array(dtype=a.dtype, shape=a.shape, stype="numpy.ndarray", data=buf.getvalue()))


def _infinite_seconds(reply):
    reply.content["metrics"]["seconds"] = float("inf")
    return reply


def _float_weight(reply):
    reply.content["metrics"]["num-examples"] = float(SIZES[HOSTILE])
    return reply


TRAIN_ATTACKS = {
    "a metric key the others lack": (_extra_metric, "metric keys differ"),
    "a second record": (_second_record, "records"),
    "a config record": (_config_record, "records"),
    "array bytes that do not parse": (_unparsable, "does not parse"),
    "a payload of another shape under the right header": (_other_shape, "expected float32"),
    "an npz archive for an array": (_npz, "not one array"),
    "an infinite metric": (_infinite_seconds, "seconds = inf"),
    "a float weight": (_float_weight, "num-examples"),
}


@pytest.mark.parametrize("attack", list(TRAIN_ATTACKS))
def test_a_hostile_train_reply_is_dropped_and_the_rest_averaged(tiny_config, attack):
    tamper_fn, reason = TRAIN_ATTACKS[attack]

    def tamper(node, reply):
        if node == HOSTILE and reply.metadata.message_type.startswith("train"):
            return tamper_fn(reply)
        return reply

    router, record = _run(tiny_config, FakeGrid(honest_node, {n: {} for n in CLUSTERS}, tamper=tamper))
    dropped = record["dropped_replies"]["1"]
    assert len(dropped) == 1 and dropped[0].startswith(f"node {HOSTILE}: ") and reason in dropped[0], dropped
    torch.testing.assert_close(router.state_dict(), _expected([11, 13, 14]), rtol=0, atol=1e-6)
    assert record["images_seen"] == 3 * 2 and record["heldout"]["num_images"] == 4 * 3
    json.dumps(record, allow_nan=False)  # what goes into router/hddm_router.json and report.json is JSON


class ExtraReplies(FakeGrid):
    """A Grid whose round also returns ``extra(replies)``: repeats, or replies to messages it never sent."""

    def __init__(self, *args, extra, **kwargs):
        super().__init__(*args, **kwargs)
        self.extra = extra

    def send_and_receive(self, messages, *, timeout=None):
        replies = list(super().send_and_receive(messages, timeout=timeout))
        return replies + self.extra(replies)


def _copy(reply: Message, src: int, reply_to: str | None = None) -> Message:
    """A copy of ``reply`` coming from ``src`` (answering ``reply_to``, default: the same message)."""
    content = RecordDict({k: v for k, v in reply.content.items()})
    msg = Message(content, dst_node_id=0, message_type=reply.metadata.message_type)
    msg.metadata.__dict__["_src_node_id"] = src
    msg.metadata.__dict__["_reply_to_message_id"] = reply_to or reply.metadata.reply_to_message_id
    msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex
    return msg


def _of(replies, node):
    return next(r for r in replies if r.metadata.src_node_id == node)


REPEATS = {
    "a reply counted twice": (lambda rs: [_copy(_of(rs, HOSTILE), HOSTILE)], "a second reply"),
    "a reply from a node that was not asked": (
        lambda rs: [_copy(_of(rs, HOSTILE), 99, reply_to=uuid.uuid4().hex)],
        "did not send",
    ),
    "a node answering another node's message": (lambda rs: [_copy(_of(rs, HOSTILE), 99)], "sent to node"),
}


@pytest.mark.parametrize("case", list(REPEATS))
def test_one_reply_per_asked_node(tiny_config, case):
    extra, reason = REPEATS[case]
    grid = ExtraReplies(honest_node, {n: {} for n in CLUSTERS}, extra=extra)
    router, record = _run(tiny_config, grid)
    dropped = record["dropped_replies"]["1"]
    # one drop in the train round and one in the evaluation round, both named
    assert len(dropped) == 2 and all(reason in d for d in dropped), dropped
    torch.testing.assert_close(router.state_dict(), _expected([11, 12, 13, 14]), rtol=0, atol=1e-6)
    assert record["heldout"]["num_images"] == 4 * 3  # each node's counts once


def _eval_extra_metric(reply):
    reply.content["metrics"]["loss"] = 0.1
    return reply


def _eval_too_many(reply):
    reply.content["metrics"]["num-examples"] = 10**6
    return reply


@pytest.mark.parametrize(
    "tamper_fn, reason",
    [(_eval_extra_metric, "metric keys differ"), (_eval_too_many, "add up"), (_second_record, "records")],
)
def test_a_hostile_evaluate_reply_costs_only_its_counts(tiny_config, tamper_fn, reason):
    def tamper(node, reply):
        if node == HOSTILE and reply.metadata.message_type.startswith("evaluate"):
            return tamper_fn(reply)
        return reply

    router, record = _run(tiny_config, FakeGrid(honest_node, {n: {} for n in CLUSTERS}, tamper=tamper))
    dropped = record["dropped_replies"]["1"]
    assert len(dropped) == 1 and reason in dropped[0], dropped
    assert record["heldout"]["num_images"] == 3 * 3
    torch.testing.assert_close(router.state_dict(), _expected([11, 12, 13, 14]), rtol=0, atol=1e-6)


def test_an_error_reply_is_recorded(tiny_config):
    def node(msg, context):
        if context.node_id == HOSTILE and msg.metadata.message_type.startswith("train"):
            raise RuntimeError("out of memory")
        return honest_node(msg, context)

    router, record = _run(tiny_config, FakeGrid(node, {n: {} for n in CLUSTERS}))
    assert any(
        d.startswith(f"node {HOSTILE}: error reply") and "out of memory" in d for d in record["dropped_replies"]["1"]
    )
    torch.testing.assert_close(router.state_dict(), _expected([11, 13, 14]), rtol=0, atol=1e-6)


def test_an_aggregation_that_flower_refuses_skips_the_round_not_the_run(tiny_config):
    """Flower's ``InconsistentMessageReplies`` (an ``AppExitException``) from the aggregation of a round is
    recorded and that round's update skipped; the rounds before it stand."""
    from strategies.round_strategy import CheckedRounds, base_strategy

    strategy = CheckedRounds(base_strategy("avg", len(CLUSTERS)), CLUSTERS, SIZES, 8, 4, 1, 2)

    def refuse(server_round, replies):
        raise InconsistentMessageReplies(reason="All MetricRecords must have the same keys")

    assert strategy._aggregate(2, refuse, []) is None
    assert strategy.dropped == {
        2: ["aggregation skipped (InconsistentMessageReplies: All MetricRecords must have the same keys)"]
    }


def _run_with(tiny_config, grid, weights=None, **router):
    cfg = _cfg(tiny_config)
    cfg = dataclasses.replace(cfg, router=dataclasses.replace(cfg.router, seed=0, **router))
    return run_router_rounds(grid, cfg, CLUSTERS, ROUTER_CONFIG, sizes=SIZES, timeout=5, cache_dir="", weights=weights)


def _shift(router) -> float:
    """The one number every float array of the router moved by (the stand-in nodes move all of them alike)."""
    torch.manual_seed(0)
    start = Router(**ROUTER_CONFIG).state_dict()
    diffs = [(router.state_dict()[k] - v).flatten() for k, v in start.items() if v.is_floating_point()]
    d = torch.cat(diffs)
    assert float(d.max() - d.min()) < 1e-5 * max(1.0, float(d.abs().max()))  # one shift for all (float32)
    return float(d.mean())


def test_declared_sizes_are_bounded():
    """No node weighs more than ``ratio`` × the median declared size; 0 leaves the sizes."""
    from hddm_flower.stages.rounds import bounded_weights

    assert bounded_weights({1: 10, 2: 20, 3: 10**6}, 4.0) == {1: 10.0, 2: 20.0, 3: 80.0}
    assert bounded_weights({1: 10, 2: 20, 3: 10**6}, 0) == {1: 10.0, 2: 20.0, 3: 1e6}


def test_the_fedavg_weight_is_the_bounded_one_not_the_declared_one(tiny_config):
    """Node 12 declared a million images (and its replies say so, consistently): its weight is capped at
    4 × the median declared size, and the average is the one with the capped weight."""
    from hddm_flower.stages.rounds import bounded_weights

    sizes = SIZES | {HOSTILE: 10**6}

    def node(msg, context):
        reply = honest_node(msg, context)
        if context.node_id == HOSTILE and msg.metadata.message_type.startswith("train"):
            reply.content["metrics"]["num-examples"] = sizes[HOSTILE]
        return reply

    weights = bounded_weights(sizes, 4.0)
    cfg = _cfg(tiny_config)
    cfg = dataclasses.replace(cfg, router=dataclasses.replace(cfg.router, seed=0))
    router, record = run_router_rounds(
        FakeGrid(node, {n: {} for n in CLUSTERS}), cfg, CLUSTERS, ROUTER_CONFIG, sizes=sizes, timeout=5,
        cache_dir="", weights=weights,
    )  # fmt: skip
    total = sum(weights.values())
    assert weights[HOSTILE] == 4 * 13.5 and record["weights"][str(HOSTILE)] == 4 * 13.5
    assert _shift(router) == pytest.approx(sum(w / total * 0.01 * n for n, w in weights.items()), abs=1e-6)


def _huge(reply):
    """A reply that passes every check: the right arrays, finite, only far away."""
    arrays = reply.content["arrays"]
    moved = {k: a.numpy() + np.asarray(1000.0, dtype=a.numpy().dtype) if a.numpy().dtype.kind == "f" else a.numpy()
             for k, a in ((k, arrays[k]) for k in arrays)}  # fmt: skip
    reply.content["arrays"] = ArrayRecord({k: Array(v) for k, v in moved.items()})
    return reply


@pytest.mark.parametrize(
    "server_optimizer, shifts",
    [
        ("avg", None),  # FedAvg follows the hostile node far away
        ("median", [(0.13 + 0.14) / 2]),  # the element-wise median of 0.11, 0.13, 0.14, 1000
        ("trimmed_avg", [(0.13 + 0.14) / 2]),  # one cut at each end (robust_f = 1 of 4)
        ("krum", [0.13, 0.14]),  # the update closest to its nearest neighbour: node 13's or 14's
    ],
)
def test_robust_aggregation_bounds_one_hostile_node(tiny_config, server_optimizer, shifts):
    def tamper(node, reply):
        if node == HOSTILE and reply.metadata.message_type.startswith("train"):
            return _huge(reply)
        return reply

    router, record = _run_with(
        tiny_config, FakeGrid(honest_node, {n: {} for n in CLUSTERS}, tamper=tamper), server_optimizer=server_optimizer
    )
    assert record["dropped_replies"] == {}  # nothing to drop: the update is well formed
    if server_optimizer == "krum":  # 4 nodes for robust_f 1: fewer than Krum's bound needs, and the report says so
        assert record["krum_too_few_nodes"].startswith("4 nodes, not more than 2·robust_f + 2 = 4")
    shift = _shift(router)
    if shifts is None:
        assert shift > 100
    else:
        assert min(abs(shift - s) for s in shifts) < 1e-5, shift


def test_server_side_dp_clips_each_update_before_averaging(tiny_config):
    """Flower's DifferentialPrivacyServerSideFixedClipping around the checked strategy: the hostile update of
    norm ≫ C moves the router by at most C / 4 plus the noise (σ = 1e-4 · C); a malformed reply is still
    dropped before the wrapper sees it."""

    def tamper(node, reply):
        if node == HOSTILE and reply.metadata.message_type.startswith("train"):
            return _huge(reply)
        if node == 13 and reply.metadata.message_type.startswith("train"):
            return _extra_metric(reply)
        return reply

    c = 0.5
    router, record = _run_with(
        tiny_config,
        FakeGrid(honest_node, {n: {} for n in CLUSTERS}, tamper=tamper),
        server_optimizer="avg",
        dp_noise_multiplier=1e-4,
        dp_clipping_norm=c,
    )
    assert "DifferentialPrivacyServerSideFixedClipping" in record["strategy"]
    assert any(d.startswith("node 13: metric keys differ") for d in record["dropped_replies"]["1"])
    torch.manual_seed(0)
    start = Router(**ROUTER_CONFIG).state_dict()
    moved = torch.cat([(router.state_dict()[k] - v).flatten() for k, v in start.items() if v.is_floating_point()])
    assert float(moved.norm()) < c + 0.05  # without clipping: ≈ 1000 · √(number of weights) / 3


def _huge_seconds(reply):
    reply.content["metrics"]["seconds"] = 1e308  # finite; two rounds of it sum to inf in the router's record
    return reply


def _consistent_inflated_counts(reply):
    """Counts that add up, of 10 × the node's 3 held-out images (its share of the summed held-out accuracy)."""
    k = CLUSTERS[HOSTILE][0]
    confusion = [0] * (TIMES * 16)
    confusion[k * 4 + k] = 30
    reply.content["metrics"] = MetricRecord({"num-examples": 30, "confusion": confusion, "top2-hits": [30] * TIMES})
    return reply


def test_reported_seconds_and_held_out_counts_are_bounded_by_what_the_server_knows(tiny_config):
    """A node may report at most the round's timeout as its local seconds (they are summed over rounds into
    router/hddm_router.json: 2 × 1e308 is inf, which strict JSON refuses), and its evaluation must count exactly
    its held-out images (a node counting 10× its images would outweigh the others in the reported accuracy)."""

    def tamper(node, reply):
        if node == HOSTILE:
            return (_huge_seconds if reply.metadata.message_type.startswith("train") else _consistent_inflated_counts)(
                reply
            )
        return reply

    cfg = _cfg(tiny_config)
    cfg = dataclasses.replace(cfg, router=dataclasses.replace(cfg.router, seed=0, rounds=2))
    router, record = run_router_rounds(
        FakeGrid(honest_node, {n: {} for n in CLUSTERS}, tamper=tamper), cfg, CLUSTERS, ROUTER_CONFIG, sizes=SIZES,
        timeout=5, cache_dir="", heldout_sizes={n: 3 for n in CLUSTERS},
    )  # fmt: skip
    for rnd in ("1", "2"):
        seconds, counts = record["dropped_replies"][rnd]
        assert seconds == f"node {HOSTILE}: seconds = 1e+308, not in [0, 5] (the round's timeout)", seconds
        assert counts == f"node {HOSTILE}: num-examples = 30, the node has 3 held-out images", counts
    assert record["heldout"]["num_images"] == 3 * 3 and record["slowest_node_seconds"] == 2 * 0.1
    json.dumps(record, allow_nan=False)
    shift = sum(SIZES[n] / 38 * 0.01 * n for n in (11, 13, 14))
    assert _shift(router) == pytest.approx(2 * shift, abs=1e-6)


@pytest.mark.parametrize("server_optimizer", ["adam", "avg", "median", "trimmed_avg", "krum"])
def test_the_round_strategy_wraps_flowers_own(server_optimizer):
    """The rounds' strategy is a wrapper around an instance of Flower's strategy (as Flower's DP strategies wrap
    one), not a subclass made per call: every aggregation is Flower's, and the wrapped one is what the record names."""
    from flwr.serverapp.strategy import FedAvg, Strategy

    from strategies.round_strategy import BASES, CheckedRounds, base_strategy

    base = base_strategy(
        server_optimizer, len(CLUSTERS), **({"beta": 0.2} if server_optimizer == "trimmed_avg" else {})
    )
    strategy = CheckedRounds(base, CLUSTERS, SIZES, 8, 4, 1, 2)
    assert type(base) is BASES[server_optimizer] and isinstance(base, FedAvg)
    assert isinstance(strategy, Strategy) and not isinstance(strategy, FedAvg) and strategy.strategy is base
    assert base.min_train_nodes == base.min_available_nodes == len(CLUSTERS)
