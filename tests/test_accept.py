"""hddm_flower.accept: the one path that accepts an expert, fuzzed with hostile metadata and weights."""

import hashlib
import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hddm_flower.accept import ExpertSpec, ExpertStore, accept_expert, parse_expert_meta
from hddm_flower.checkpoints import TIME_CONVENTION, CheckpointRejected, read_expert_meta, weights_bytes
from hddm_flower.models import ExpertNet, expert_config

CONFIG = expert_config("test", sample_size=8, in_channels=3, caption_channels=16)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)


@pytest.fixture(scope="module")
def blob():
    torch.manual_seed(0)
    return weights_bytes(ExpertNet.from_config(CONFIG).transformer.state_dict())


def good_meta(blob: bytes, **kw) -> dict:
    return {
        "expert_id": 1,
        "cluster_id": 1,
        "objective": "ddpm",
        "schedule": "linear",
        "num_train_timesteps": 1000,
        "preset": "test",
        "time_convention": TIME_CONVENTION,
        "steps": 3,
        "images_seen": 12,
        "device_seconds": 1.5,
        "sha256": hashlib.sha256(blob).hexdigest(),
        "weights_dtype": "float32",
        "loss_curve": [[1, 0.5]],
    } | kw


SPEC = ExpertSpec(num_experts=4, model_config=CONFIG, max_bytes=2**20, preset="test")


def _incoming(tmp_path, blob: bytes):
    path = tmp_path / "incoming.safetensors"
    path.write_bytes(blob)
    return path


def test_a_good_expert_is_installed_with_its_metadata(blob, tmp_path):
    meta = accept_expert(tmp_path, _incoming(tmp_path, blob), json.dumps(good_meta(blob)), json.dumps(CONFIG), SPEC)
    folder = tmp_path / "experts" / "expert-1"
    assert read_expert_meta(folder)["sha256"] == meta["sha256"] and meta["weights_bytes"] == len(blob)
    assert sorted(p.name for p in (tmp_path / "experts").iterdir()) == ["expert-1"]
    assert not (tmp_path / "incoming.safetensors").exists()  # consumed
    with pytest.raises(FileExistsError, match="already exists"):  # never over an installed expert
        accept_expert(tmp_path, _incoming(tmp_path, blob), good_meta(blob), CONFIG, SPEC)


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"expert_id": True}, "expected an integer, got bool"),  # int(True) == 1 was accepted
        ({"expert_id": "1"}, "expected an integer, got str"),  # int("1") was accepted
        ({"expert_id": 1e300}, "outside"),
        ({"expert_id": [1]}, "expected an integer"),  # int([1]) raised TypeError deep inside
        ({"steps": float("inf")}, "Infinity"),  # int(inf) raised OverflowError: not caught before
        ({"device_seconds": "fast"}, "expected a number"),  # report.md's format would crash after the run
        ({"objective": "edm"}, "not one of"),
        ({"schedule": "sigmoid"}, "not one of"),
        ({"num_train_timesteps": 0}, "outside"),
        ({"time_convention": "t=0 noise"}, "not this code's"),
        ({"sha256": "ab" * 40}, "characters"),
        ({"sha256": "zz" * 32}, "hex"),
        ({"weights_dtype": "int8"}, "not one of"),
        ({"objective": "fm", "time_sampling": "logit_normal"}, "expected an object"),
        ({"objective": "fm", "time_sampling": {"kind": "beta"}}, "not one of"),
        ({"objective": "fm", "time_sampling": {"kind": "logit_normal", "mean": 0}}, "std: expected a number"),
        ({"objective": "fm", "time_sampling": {"kind": "logit_normal", "mean": 0, "std": 0}}, "outside"),
    ],
)
def test_each_bad_field_is_refused_in_one_line(blob, tmp_path, change, reason):
    with pytest.raises(CheckpointRejected, match=reason) as e:
        accept_expert(tmp_path, _incoming(tmp_path, blob), json.dumps(good_meta(blob) | change), CONFIG, SPEC)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "incoming.safetensors").exists() and list((tmp_path / "experts").glob("*")) == []


@pytest.mark.parametrize(
    "meta, reason",
    [
        ("[" * 50_000 + "]" * 50_000, "not valid JSON"),  # RecursionError escaped the strategy before
        ('{"expert_id": NaN}', "NaN"),
        ("1" * 10_000, "too large"),
        ("x" * (3 * 2**20), "exceed the limit"),
        ("[]", "expected a JSON object"),
    ],
)
def test_hostile_metadata_documents_are_refused(blob, tmp_path, meta, reason):
    with pytest.raises(CheckpointRejected, match=reason):
        accept_expert(tmp_path, _incoming(tmp_path, blob), meta, CONFIG, SPEC)


def test_ids_and_model_config_are_the_runs(blob, tmp_path):
    with pytest.raises(CheckpointRejected, match="claims expert 1, expected 2"):
        accept_expert(tmp_path, _incoming(tmp_path, blob), good_meta(blob), CONFIG, SPEC, expert_id=2)
    with pytest.raises(CheckpointRejected, match=r"outside this run's 0..3"):
        accept_expert(tmp_path, _incoming(tmp_path, blob), good_meta(blob, expert_id=4), CONFIG, SPEC)
    with pytest.raises(CheckpointRejected, match="differs from the run's preset 'test' in \\['num_layers'\\]"):
        accept_expert(tmp_path, _incoming(tmp_path, blob), good_meta(blob), CONFIG | {"num_layers": 9}, SPEC)
    with pytest.raises(CheckpointRejected, match="sha256 mismatch"):
        accept_expert(tmp_path, _incoming(tmp_path, blob), good_meta(blob, sha256="0" * 64), CONFIG, SPEC)
    small = ExpertSpec(4, CONFIG, max_bytes=1000)
    with pytest.raises(CheckpointRejected, match="exceeds the limit of 1000 bytes"):
        accept_expert(tmp_path, _incoming(tmp_path, blob), good_meta(blob), CONFIG, small)
    assert accept_expert(
        tmp_path, _incoming(tmp_path, blob), good_meta(blob, expert_id=4, cluster_id=4), CONFIG, SPEC, grow=True
    )


@FUZZ
@given(key=st.sampled_from(sorted(good_meta(b""))), value=json_values)
def test_fuzzed_metadata_field_is_refused_or_checked(blob, key, value):
    meta = good_meta(blob) | {key: value}
    try:
        out = parse_expert_meta(json.dumps(meta) if _finite_json(value) else meta)
    except CheckpointRejected as e:
        assert "\n" not in str(e) and len(str(e)) < 400
        return
    assert type(out["expert_id"]) is int and 0 <= out["expert_id"] <= 2**20
    assert out["objective"] in ("fm", "ddpm") and out["time_convention"] == TIME_CONVENTION
    assert type(out["steps"]) is int and type(out["device_seconds"]) is float
    assert len(out["sha256"]) == 64


def _finite_json(value) -> bool:
    try:
        json.dumps(value, allow_nan=False)
        return True
    except ValueError:
        return False


@FUZZ
@given(cut=st.integers(0, 4000), flip=st.integers(0, 10**6), byte=st.integers(0, 255))
def test_fuzzed_weights_are_refused_and_leave_nothing(blob, tmp_path_factory, cut, flip, byte):
    """Truncated or corrupted safetensors files (header, lengths, data) with a matching sha256: refused with a
    reason, never a crash; no file is left behind."""
    data = bytearray(blob[: len(blob) - cut] if cut else blob)
    if data:
        data[flip % len(data)] = byte
    data = bytes(data)
    run = tmp_path_factory.mktemp("run")
    meta = good_meta(data)
    try:
        out = accept_expert(run, _incoming(run, data), meta, CONFIG, SPEC)
    except CheckpointRejected as e:
        assert "\n" not in str(e)
        assert list((run / "experts").glob("*")) == [] if (run / "experts").exists() else True
    else:  # only an unchanged tensor layout with finite values passes
        assert data[:8] == blob[:8] and out["weights_bytes"] == len(blob)
    assert not (run / "incoming.safetensors").exists()


def test_store_accepts_into_its_run_directory(blob, tmp_path):
    store = ExpertStore(tmp_path, SPEC)
    path = store.incoming / ".incoming-expert-1-x.safetensors"
    path.write_bytes(blob)
    meta = store.accept(1, path, json.dumps(good_meta(blob)), json.dumps(CONFIG))
    assert meta["expert_id"] == 1 and (tmp_path / "experts" / "expert-1").is_dir() and store.max_bytes == 2**20
