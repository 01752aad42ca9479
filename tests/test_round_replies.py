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
from strategies.federated_router import train_router_federated
from strategies.inprocess_grid import FakeGrid

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
    return train_router_federated(grid, cfg, CLUSTERS, ROUTER_CONFIG, sizes=SIZES, timeout=5, cache_dir="")


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
    from strategies import federated_router as fr

    strategy = fr._make_strategy("avg")(CLUSTERS, SIZES, 8, 4, 1, 2)

    def refuse(server_round, replies):
        raise InconsistentMessageReplies(reason="All MetricRecords must have the same keys")

    assert strategy._aggregate(2, refuse, []) is None
    assert strategy.dropped == {
        2: ["aggregation skipped (InconsistentMessageReplies: All MetricRecords must have the same keys)"]
    }
