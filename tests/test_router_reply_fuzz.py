"""Router-round replies, generated: acceptable ones are accepted and averaged, hostile ones dropped with their
reason, and what the rounds produce reaches every consumer (router/hddm_router.json and report.json as strict
JSON, report.md, the model cards, HDDMPipeline.from_pretrained).

The nodes are stand-ins with a closed-form update (node n adds its own fixed array d_n to every float array of the
global router, declares its training images and counts exactly its held-out images), so that the router after R
FedAvg rounds is known: the initial router plus R · Σ_accepted (w_n / Σ w) · d_n."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hddm_flower.data import Dataset
from hddm_flower.models import Router
from hddm_flower.stages.rounds import finish_federated, node_sizes
from hddm_flower.stages.router import router_model_config
from strategies.inprocess_grid import FakeGrid
from strategies.router_rounds import FlowerRounds

CLUSTERS = {11: [0], 12: [1], 13: [2], 14: [3]}
TIMEOUT = 30.0  # the rounds' timeout: the most local seconds a reply may report


def _strict(text: str):
    """json.loads that refuses NaN and ±Infinity (which Python's json writes and reads by default)."""

    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def _cfg(tiny_config, rounds: int):
    r = dataclasses.replace(tiny_config.router, training="federated", rounds=rounds, server_optimizer="avg", seed=0)
    return dataclasses.replace(tiny_config, router=r)


class StandIns:
    """ClientApp stand-ins for the router rounds: node n's train reply is the global router plus ``delta[n]`` (one
    array per float array), with its declared size and the metrics in ``metrics[n]``; its evaluate reply counts its
    held-out images. ``hostile(node, round, kind, reply)`` may rewrite a reply (kind: "train" or "evaluate")."""

    def __init__(self, dataset: Dataset, times: int, deltas: dict, metrics: dict | None = None, hostile=None):
        self.sizes = node_sizes(dataset, CLUSTERS)
        self.heldout = {n: dataset.size(c, "val") for n, c in CLUSTERS.items()}
        self.times, self.deltas, self.hostile = times, deltas, hostile
        self.metrics = metrics or {n: {"images-seen": 2, "train-loss": 0.5, "seconds": 0.1} for n in CLUSTERS}

    def __call__(self, msg: Message, context) -> Message:
        node, rnd = context.node_id, int(msg.content["config"]["server-round"])
        if msg.metadata.message_type == "train.router":
            arrays = {k: msg.content["arrays"][k].numpy() for k in msg.content["arrays"]}
            moved = {
                k: (x + self.deltas[node][k]).astype(x.dtype) if x.dtype.kind == "f" else x for k, x in arrays.items()
            }
            metrics = {"num-examples": self.sizes[node], **self.metrics[node]}
            content = RecordDict(
                {"arrays": ArrayRecord({k: Array(v) for k, v in moved.items()}), "metrics": MetricRecord(metrics)}
            )
            kind = "train"
        else:
            n, k = self.heldout[node], CLUSTERS[node][0]
            confusion = np.zeros((self.times, 4, 4), dtype=np.int64)
            confusion[:, k, k] = n
            metrics = {"num-examples": n, "confusion": confusion.flatten().tolist(), "top2-hits": [n] * self.times}
            content, kind = RecordDict({"metrics": MetricRecord(metrics)}), "evaluate"
        reply = Message(content, reply_to=msg)
        return self.hostile(node, rnd, kind, reply) if self.hostile else reply


def _initial(cfg, dataset) -> dict[str, torch.Tensor]:
    torch.manual_seed(cfg.router.seed)
    return Router(**router_model_config(cfg, dataset.meta)).state_dict()


def _expected(cfg, dataset, deltas: dict, weights: dict[int, float], accepted: list[int]) -> dict[str, torch.Tensor]:
    """The initial router plus rounds × the weighted mean of the accepted nodes' deltas (float64)."""
    total = sum(weights[n] for n in accepted)
    out = {}
    for name, value in _initial(cfg, dataset).items():
        if value.is_floating_point():
            mean = sum(weights[n] / total * deltas[n][name].astype(np.float64) for n in accepted)
            value = value.double() + cfg.router.num_rounds * torch.from_numpy(np.asarray(mean))
        out[name] = value
    return out


def _deltas(cfg, dataset, scales: dict[int, float], seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    start = _initial(cfg, dataset)
    return {
        n: {k: (s * rng.standard_normal(v.shape)).astype(np.float32) for k, v in start.items() if v.is_floating_point()}
        for n, s in scales.items()
    }


def _assert_router(router, expected, atol=1e-5):
    got = router.state_dict()
    for name, want in expected.items():
        torch.testing.assert_close(got[name].double(), want.double(), rtol=1e-5, atol=atol, msg=name)


TRAIN_KEYS = ["num-examples", "images-seen", "train-loss", "seconds"]
EVAL_KEYS = ["num-examples", "confusion", "top2-hits"]
NON_FINITE = [float("inf"), float("-inf"), float("nan")]
HOSTILE = 12


def _non_finite(node, rnd, kind, reply):
    """Node 12's round r: train metric TRAIN_KEYS[r − 1] and evaluate metric EVAL_KEYS[(r − 1) % 3] non-finite
    (inf, −inf, nan in turn; a list metric as a list of them)."""
    if node != HOSTILE:
        return reply
    metrics = reply.content["metrics"]
    keys = TRAIN_KEYS if kind == "train" else EVAL_KEYS
    key, value = keys[(rnd - 1) % len(keys)], NON_FINITE[(rnd - 1) % 3]
    metrics[key] = [value] * len(metrics[key]) if isinstance(metrics[key], list) else value
    return reply


@pytest.fixture(scope="module")
def federated_run(tiny_config, dataset_dir, tmp_path_factory):
    """A run of 4 experts (untrained: the consumers need only their files) finished by the ServerApp's
    federated stage, 4 FedAvg router rounds, node 12 sending non-finite metrics every round in another key."""
    from hddm_flower.checkpoints import save_expert
    from hddm_flower.stages.expert import build_expert
    from hddm_flower.stages.prepare import assign_objectives

    cfg, dataset = _cfg(tiny_config, rounds=len(TRAIN_KEYS)), Dataset.open(dataset_dir)
    run = tmp_path_factory.mktemp("federated-run")
    objectives = assign_objectives(cfg, dataset)
    for k in range(4):
        torch.manual_seed(k)
        expert, model_config, meta = build_expert(cfg, dataset.meta, objectives[k], expert_id=k)
        meta |= {"expert_id": k, "cluster_id": k, "steps": 3, "images_seen": 12, "device_seconds": 0.5}
        save_expert(run / "experts" / f"expert-{k}", expert.net.transformer.state_dict(), model_config, meta)
    deltas = _deltas(cfg, dataset, {n: 0.01 * n for n in CLUSTERS})
    nodes = StandIns(dataset, len(cfg.evaluation.times), deltas, hostile=_non_finite)
    grid = FakeGrid(nodes, {n: {} for n in CLUSTERS})
    report = finish_federated(
        FlowerRounds(grid, timeout=TIMEOUT, cache_dir=""), cfg, run, dataset, CLUSTERS, [], extra={}
    )
    return run, report, cfg, dataset, deltas


def test_non_finite_metrics_never_reach_the_router_record_or_the_report(federated_run):
    """inf, −inf or nan in every metric key of a router-round reply (the 4 train keys and the 3 evaluate keys,
    one per round): each such reply is dropped with its reason in report.json and report.md, router/hddm_router.json
    and report.json parse as strict JSON, and the router is the FedAvg of the three honest nodes."""
    run, report, cfg, dataset, deltas = federated_run
    record = _strict((run / "router" / "hddm_router.json").read_text())
    assert _strict((run / "report.json").read_text())["router"]["dropped_replies"] == record["dropped_replies"]
    assert sorted(record["dropped_replies"]) == ["1", "2", "3", "4"]
    md = (run / "report.md").read_text()
    for rnd, dropped in record["dropped_replies"].items():
        r = int(rnd) - 1
        train_key, eval_key = TRAIN_KEYS[r], EVAL_KEYS[r % 3]
        assert len(dropped) == 2 and all(d.startswith(f"node {HOSTILE}: metric ") for d in dropped), dropped
        assert dropped[0].startswith(f"node {HOSTILE}: metric {train_key} = "), dropped
        assert dropped[1].startswith(f"node {HOSTILE}: metric {eval_key} = "), dropped
        assert all(f"- round {rnd}: {d}" in md for d in dropped)
    assert "8 replies dropped, not averaged" in md
    assert record["images_seen"] == 4 * 3 * 2 and record["heldout"]["num_images"] == sum(
        dataset.size(c, "val") for n, c in CLUSTERS.items() if n != HOSTILE
    )
    sizes = node_sizes(dataset, CLUSTERS)
    expected = _expected(cfg, dataset, deltas, {n: float(s) for n, s in sizes.items()}, [11, 13, 14])
    from hddm_flower.hddm_pipeline import HDDMPipeline

    _assert_router(HDDMPipeline.from_pretrained(run).router, expected)
    assert "8 replies dropped, named in `report.md`" in (run / "README.md").read_text()


# --- the fuzzer: acceptable and hostile replies, generated ---------------------------------------------------------


def _npy(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, x, allow_pickle=False)
    return buf.getvalue()


def _first_float(arrays: ArrayRecord) -> str:
    return next(k for k in arrays if arrays[k].numpy().dtype.kind == "f" and arrays[k].numpy().size > 1)


def _with_array(reply: Message, make) -> Message:
    arrays = reply.content["arrays"]
    name = _first_float(arrays)
    reply.content["arrays"] = ArrayRecord({**{k: arrays[k] for k in arrays}, name: make(arrays[name])})
    return reply


def _set(key, value):
    def tamper(reply):
        reply.content["metrics"][key] = value
        return reply

    return tamper


def _drop_key(key):
    def tamper(reply):
        m = reply.content["metrics"]
        reply.content["metrics"] = MetricRecord({k: m[k] for k in m if k != key})
        return reply

    return tamper


def _second_record(reply):
    reply.content["more"] = MetricRecord({"num-examples": 1})
    return reply


TRAIN_HOSTILE = {
    "extra metric": (_set("extra", 1.0), "metric keys differ"),
    "missing metric": (_drop_key("seconds"), "metric keys differ"),
    "float weight": (_set("num-examples", 1.0), "metric num-examples = 1.0"),
    "float images-seen": (_set("images-seen", 2.0), "images-seen = 2.0"),
    "another declared size": (_set("num-examples", 10**9), "the node declared"),
    "no images seen": (_set("images-seen", 0), "images-seen = 0"),
    "more images than a round draws": (_set("images-seen", 9), "images-seen = 9"),
    "huge seconds": (_set("seconds", 1e308), "the round's timeout"),
    "negative seconds": (_set("seconds", -1.0), "the round's timeout"),
    "nan loss": (_set("train-loss", float("nan")), "train-loss = nan"),
    "a second record": (_second_record, "records"),
    "float64 array": (
        lambda r: _with_array(r, lambda a: Array(a.numpy().astype(np.float64))),
        "expected float32",
    ),
    "payload of another shape": (
        lambda r: _with_array(
            r, lambda a: Array(dtype=a.dtype, shape=a.shape, stype="numpy.ndarray", data=_npy(np.ones(1, np.float32)))
        ),
        "expected float32",
    ),
    "bytes that do not parse": (
        lambda r: _with_array(r, lambda a: Array(dtype=a.dtype, shape=a.shape, stype="numpy.ndarray", data=b"\x93NU")),
        "does not parse",
    ),
    "an infinite weight": (
        lambda r: _with_array(r, lambda a: Array(np.full(a.shape, np.inf, np.float32))),
        "is not finite",
    ),
}


def _inflated_counts(reply):
    """Consistent counts of 10× the node's held-out images."""
    m = reply.content["metrics"]
    n = m["num-examples"]
    reply.content["metrics"] = MetricRecord(
        {"num-examples": 10 * n + 1, "confusion": [10 * c + (c == n) for c in m["confusion"]],
         "top2-hits": [10 * h + 1 for h in m["top2-hits"]]}
    )  # fmt: skip
    return reply


EVAL_HOSTILE = {
    "extra metric": (_set("loss", 0.1), "metric keys differ"),
    "counts that do not add up": (_set("num-examples", 10**6), "add up"),
    "more held-out images than the node has": (_inflated_counts, "held-out images"),
    "a second record": (_second_record, "records"),
}

HONEST = "honest"
acceptable_metrics = st.fixed_dictionaries(
    {
        "images-seen": st.integers(1, 8),  # 1..local_steps × batch_size
        "train-loss": st.floats(allow_nan=False, allow_infinity=False),
        "seconds": st.floats(0, TIMEOUT),
    }
)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(
    train=st.fixed_dictionaries({n: st.sampled_from([HONEST, HONEST, *TRAIN_HOSTILE]) for n in CLUSTERS}),
    evaluate=st.fixed_dictionaries({n: st.sampled_from([HONEST, HONEST, *EVAL_HOSTILE]) for n in CLUSTERS}),
    metrics=st.fixed_dictionaries({n: acceptable_metrics for n in CLUSTERS}),
    scales=st.fixed_dictionaries({n: st.floats(-0.05, 0.05) for n in CLUSTERS}),
    seed=st.integers(0, 2**16),
)
def test_generated_replies_are_accepted_or_dropped_and_reach_every_consumer(
    federated_run, tmp_path_factory, train, evaluate, metrics, scales, seed
):
    """Each node's replies are generated: acceptable ones (any update, images seen within the round's draw, any
    finite loss, seconds within the round's timeout; exact counts of its held-out images) or one hostile kind.
    Two FedAvg rounds: every acceptable reply is accepted (no drop names its node) and the router equals the
    weighted average of the accepted updates; each hostile reply is dropped with its reason, every round. What
    the rounds produce goes through every consumer: router/hddm_router.json and report.json (strict JSON),
    report.md (each drop on its line), the model card, and HDDMPipeline.from_pretrained (the same router)."""
    from hddm_flower.evaluation.report import write_report
    from hddm_flower.hddm_pipeline import HDDMPipeline
    from hddm_flower.stages.rounds import federated_router
    from hddm_flower.stages.router import router_record

    template, report, cfg0, dataset, _ = federated_run
    cfg = _cfg(cfg0, rounds=2)
    run = tmp_path_factory.mktemp("fuzzed")
    shutil.copytree(template, run, dirs_exist_ok=True)
    deltas = _deltas(cfg, dataset, scales, seed)

    def hostile(node, rnd, kind, reply):
        mode = (train if kind == "train" else evaluate)[node]
        return reply if mode == HONEST else (TRAIN_HOSTILE if kind == "train" else EVAL_HOSTILE)[mode][0](reply)

    grid = FakeGrid(StandIns(dataset, len(cfg.evaluation.times), deltas, metrics, hostile), {n: {} for n in CLUSTERS})
    accepted = [n for n in CLUSTERS if train[n] == HONEST]
    if not accepted:
        with pytest.raises(RuntimeError, match="no valid update in 2 rounds"):
            federated_router(FlowerRounds(grid, timeout=TIMEOUT, cache_dir=""), cfg, run, dataset, CLUSTERS)
        return
    router, record = federated_router(FlowerRounds(grid, timeout=TIMEOUT, cache_dir=""), cfg, run, dataset, CLUSTERS)

    sizes = node_sizes(dataset, CLUSTERS)
    expected = _expected(cfg, dataset, deltas, {n: float(s) for n, s in sizes.items()}, accepted)
    _assert_router(router, expected)
    want = {}
    for n in CLUSTERS:
        if train[n] != HONEST:
            want.setdefault(n, []).append(TRAIN_HOSTILE[train[n]][1])
        if evaluate[n] != HONEST:
            want.setdefault(n, []).append(EVAL_HOSTILE[evaluate[n]][1])
    for rnd in ("1", "2"):
        dropped = record["dropped_replies"].get(rnd, [])
        by_node = {}
        for why in dropped:
            node = int(why.split(":")[0].removeprefix("node "))
            by_node.setdefault(node, []).append(why)
        assert sorted(by_node) == sorted(want), (rnd, dropped)  # no acceptable reply dropped, every hostile one
        for node, reasons in want.items():
            assert all(any(r in why for why in by_node[node]) for r in reasons), (node, by_node[node], reasons)
    assert record["images_seen"] == 2 * sum(metrics[n]["images-seen"] for n in accepted)
    honest_eval = [n for n in CLUSTERS if evaluate[n] == HONEST]
    assert record["heldout"].get("num_images", 0) == sum(dataset.size(CLUSTERS[n], "val") for n in honest_eval)

    # the consumers: the router record and the report as strict JSON, report.md, the cards, the pipeline
    assert _strict((run / "router" / "hddm_router.json").read_text())["dropped_replies"] == record["dropped_replies"]
    extra = {"router": {**router_record(cfg.router), **record}}
    write_report(cfg, run, dataset, report["experts"], [], report["metrics"], extra)
    assert _strict((run / "report.json").read_text())["router"]["dropped_replies"] == record["dropped_replies"]
    md = (run / "report.md").read_text()
    assert all(f"- round {rnd}: {why}" in md for rnd, whys in record["dropped_replies"].items() for why in whys)
    total = sum(map(len, record["dropped_replies"].values()))
    assert f"({total} replies dropped, named in `report.md`)" in (run / "README.md").read_text()
    _assert_router(HDDMPipeline.from_pretrained(run).router, expected)
