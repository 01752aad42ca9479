"""strategies/one_shot.py: a reply can only cost its own expert — hostile train replies and query replies, fuzzed,
through the real strategy and the real expert store (no training: the weights are an untrained test-preset net)."""

import hashlib
import json

import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hddm_flower import wire
from hddm_flower.accept import ExpertSpec, ExpertStore
from hddm_flower.checkpoints import TIME_CONVENTION, weights_bytes
from hddm_flower.models import ExpertNet, expert_config
from strategies.one_shot import OneShotExperts

CONFIG = expert_config("test", sample_size=8, in_channels=3, caption_channels=16)
SPEC = ExpertSpec(num_experts=2, model_config=CONFIG, max_bytes=2**20, preset="test", time_sampling={"kind": "uniform"})
TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1


@pytest.fixture(scope="module")
def blob():
    torch.manual_seed(0)
    return weights_bytes(ExpertNet.from_config(CONFIG).transformer.state_dict())


def _meta(blob: bytes) -> dict:
    return {
        "expert_id": 0,
        "cluster_id": 0,
        "objective": "fm",
        "preset": "test",
        "time_convention": TIME_CONVENTION,
        "steps": 3,
        "images_seen": 12,
        "device_seconds": 1.0,
        "sha256": hashlib.sha256(blob).hexdigest(),
    }


def _records(blob: bytes, meta=None, config=None, stype=wire.STYPE) -> dict:
    return {
        wire.EXPERT: ArrayRecord({wire.WEIGHTS: Array(dtype="uint8", shape=(len(blob),), stype=stype, data=blob)}),
        wire.META: ConfigRecord(
            {
                wire.META_JSON: json.dumps(_meta(blob)) if meta is None else meta,
                wire.MODEL_CONFIG_JSON: json.dumps(CONFIG) if config is None else config,
            }
        ),
        wire.METRICS: MetricRecord({"steps": 3}),
    }


def _deliver(run_dir, content: RecordDict) -> OneShotExperts:
    """One train message for expert 0 and ``content`` as its reply, through ``aggregate_train``."""
    strategy = OneShotExperts(ExpertStore(run_dir, SPEC), {}, ["fm", "fm"])
    train = Message(RecordDict(), dst_node_id=7, message_type=MessageType.TRAIN)
    train.metadata.__dict__["_message_id"] = "m0"
    strategy._message_experts["m0"] = [0]
    reply = Message(content, reply_to=train)
    strategy.aggregate_train(1, [reply])
    return strategy


def _only_experts_left(run_dir) -> list[str]:
    return sorted(p.name for p in (run_dir / "experts").iterdir()) if (run_dir / "experts").exists() else []


def test_a_good_reply_is_installed(blob, tmp_path):
    strategy = _deliver(tmp_path, RecordDict(_records(blob)))
    assert list(strategy.received) == [0] and strategy.missing == {}
    assert _only_experts_left(tmp_path) == ["expert-0"]


@pytest.mark.parametrize(
    "content, reason",
    [
        # metadata Python's json cannot nest or int() cannot take: these escaped start() and ended the run before
        (lambda b: _records(b, meta="[" * 100_000 + "]" * 100_000), "not valid JSON"),
        (
            lambda b: _records(b, meta=json.dumps(_meta(b) | {"steps": 1e308 * 10}).replace("Infinity", "1e999")),
            "overflows",
        ),
        (lambda b: _records(b, meta=json.dumps(_meta(b) | {"expert_id": [0]})), "expected an integer"),
        (lambda b: _records(b, meta=json.dumps(_meta(b) | {"device_seconds": "soon"})), "expected a number"),
        # weird records: a config record where the weights should be, a metric record where the metadata should be
        (lambda b: {wire.EXPERT: ConfigRecord({"weights": "x"}), wire.META: _records(b)[wire.META]}, "lacks"),
        (lambda b: {wire.EXPERT: _records(b)[wire.EXPERT], wire.META: MetricRecord({"meta": 1})}, "lacks"),
        (
            lambda b: {**_records(b), wire.META: ConfigRecord({wire.META_JSON: 5, wire.MODEL_CONFIG_JSON: "{}"})},
            "got int",
        ),
        (lambda b: _records(b, stype="numpy.ndarray"), "stype"),
        (lambda b: _records(b, config=json.dumps(CONFIG | {"num_layers": 2})), "differs"),
        (lambda b: _records(b + b"\0", meta=json.dumps(_meta(b))), "sha256 mismatch"),
        (lambda b: {}, "lacks"),
        # valid on their own, wrong for this run: a cluster the run does not have (the report looked it up and
        # raised after the whole evaluation), an objective the run did not assign, another FM time sampling
        (lambda b: _records(b, meta=json.dumps(_meta(b) | {"cluster_id": 7})), "cluster_id 7"),
        (lambda b: _records(b, meta=json.dumps(_meta(b) | {"objective_assigned": "ddpm"})), "objective_assigned"),
        (
            lambda b: _records(
                b, meta=json.dumps(_meta(b) | {"time_sampling": {"kind": "logit_normal", "mean": 3.0, "std": 1.0}})
            ),
            "time_sampling",
        ),
    ],
)
def test_a_hostile_reply_costs_only_its_expert(blob, tmp_path, content, reason):
    strategy = _deliver(tmp_path, RecordDict(content(blob)))
    assert strategy.received == {} and list(strategy.missing) == [0]
    assert reason in strategy.missing[0] and "\n" not in strategy.missing[0], strategy.missing[0]
    assert _only_experts_left(tmp_path) == []  # nothing half-written


@pytest.mark.parametrize(
    "reason, why", [("RuntimeError: boom", "training failed on the node: RuntimeError: boom"), (5, "expected a string")]
)
def test_a_several_expert_reply_costs_each_expert_only_its_own_records(blob, tmp_path, reason, why):
    """A simulated node's reply to a message naming experts 0, 1, 2: expert 0's records (under their ``.0``
    names) are installed; expert 1's error record (its reason a string, or hostile) and expert 2's absent records
    cost only those experts; records in the one-expert format do not stand in for any of them."""
    strategy = OneShotExperts(
        ExpertStore(tmp_path, ExpertSpec(num_experts=3, model_config=CONFIG, max_bytes=2**20, preset="test")),
        {},
        ["fm", "fm", "fm"],
    )
    train = Message(RecordDict(), dst_node_id=7, message_type=MessageType.TRAIN)
    train.metadata.__dict__["_message_id"] = "m0"
    strategy._message_experts["m0"] = [0, 1, 2]
    content = {wire.expert_record(name, 0): record for name, record in _records(blob).items()}
    content[wire.expert_record(wire.ERROR, 1)] = ConfigRecord({wire.ERROR_REASON: reason})
    content |= _records(blob)  # the one-expert names: not expert 2's
    strategy.aggregate_train(1, [Message(RecordDict(content), reply_to=train)])
    assert list(strategy.received) == [0] and sorted(strategy.missing) == [1, 2]
    assert why in strategy.missing[1] and "lacks its 'meta.2'" in strategy.missing[2], strategy.missing
    assert _only_experts_left(tmp_path) == ["expert-0"]


records = st.dictionaries(
    st.sampled_from([wire.EXPERT, wire.META, wire.METRICS, "other"]),
    st.sampled_from(["array", "config", "metric"]),
    max_size=4,
)
values = st.one_of(
    st.text(max_size=30),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(),
    st.booleans(),
    st.binary(max_size=30),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=records, meta_value=values, config_value=values, stype=st.sampled_from([wire.STYPE, "raw", ""]))
def test_fuzzed_reply_records_cost_only_their_expert(blob, tmp_path_factory, shape, meta_value, config_value, stype):
    content = {}
    for name, kind in shape.items():
        if kind == "array":
            content[name] = ArrayRecord(
                {wire.WEIGHTS: Array(dtype="uint8", shape=(len(blob),), stype=stype, data=blob)}
            )
        elif kind == "config":
            content[name] = ConfigRecord({wire.META_JSON: meta_value, wire.MODEL_CONFIG_JSON: config_value})
        else:
            content[name] = MetricRecord({"x": 1.0})
    run = tmp_path_factory.mktemp("run")
    strategy = _deliver(run, RecordDict(content))
    assert strategy.received == {} and list(strategy.missing) == [0] and "\n" not in strategy.missing[0]
    assert _only_experts_left(run) == []


@settings(max_examples=200, deadline=None)
@given(info=st.dictionaries(st.sampled_from(["expert-id", "partition-id", "num-partitions", "x"]), values, max_size=4))
def test_fuzzed_node_info_skips_the_node_or_assigns_a_valid_expert(info, tmp_path_factory):
    strategy = OneShotExperts(ExpertStore(tmp_path_factory.mktemp("run"), SPEC), {}, ["fm", "fm"])
    query = Message(RecordDict(), dst_node_id=9, message_type=MessageType.QUERY)
    query.metadata.__dict__["_message_id"] = "q"
    reply = Message(RecordDict({wire.NODE_INFO: ConfigRecord(info)}), reply_to=query)
    reply.metadata.__dict__["_src_node_id"] = 9
    node_info = strategy._node_info(reply)
    try:
        claims = strategy._claims(node_info)
    except wire.WireError as e:
        assert "\n" not in str(e)
        return
    assert claims is None or all(type(k) is int for k in claims)


def test_malformed_query_replies_skip_the_node():
    strategy = OneShotExperts(ExpertStore("/nonexistent", SPEC), {}, ["fm"])
    query = Message(RecordDict(), dst_node_id=9, message_type=MessageType.QUERY)
    query.metadata.__dict__["_message_id"] = "q"
    for content in (RecordDict(), RecordDict({wire.NODE_INFO: MetricRecord({"a": 1})})):
        reply = Message(content, reply_to=query)
        reply.metadata.__dict__["_src_node_id"] = 9
        assert strategy._node_info(reply) is None
    reply = Message(RecordDict({wire.NODE_INFO: ConfigRecord({f"k{i}": i for i in range(300)})}), reply_to=query)
    reply.metadata.__dict__["_src_node_id"] = 9
    assert strategy._node_info(reply) is None
    with pytest.raises(wire.WireError, match="expected an integer"):
        strategy._claims({"expert-id": float("inf")})  # int(inf): OverflowError escaped discover() before
    with pytest.raises(wire.WireError, match="expected an integer"):
        strategy._claims({"partition-id": True})


def test_a_query_reply_that_carries_weights_leaves_no_file_behind(tmp_path):
    """A node answers the query with its node info and a weights-sized array of the spooled stype: the array is
    written to the incoming folder as it arrives (as any reply's is) and removed once the node info is read."""
    from strategies.inprocess_grid import WireRuntime, wire_grid

    def deliver(message):
        junk = ArrayRecord({"w": Array(dtype="uint8", shape=(4096,), stype=wire.STYPE, data=b"\1" * 4096)})
        info = ConfigRecord({"expert-id": 0})
        return Message(RecordDict({wire.NODE_INFO: info, "junk": junk}), reply_to=message)

    run = tmp_path / "run"
    strategy = OneShotExperts(ExpertStore(run, SPEC), {}, ["fm", "fm"], node_wait_timeout=0, poll_interval=0.01)
    strategy.discover(wire_grid(WireRuntime([7], deliver)), timeout=5)
    assert strategy.assignment == {7: [0]}
    assert [p.name for p in run.rglob("*") if p.is_file()] == []
