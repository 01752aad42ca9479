"""clients/client_app.py's kept experts: the key under which a node keeps an expert's training state and final
weights, and what it does with a damaged copy."""

import dataclasses
import hashlib
import json

from clients.client_app import _finished, _keep, _work_name


def _dataset(root, **meta):
    root.mkdir(parents=True, exist_ok=True)
    (root / "meta.json").write_text(json.dumps({"name": "twemoji", "num_clusters": 4} | meta))
    return root


def test_the_key_names_the_expert_and_everything_its_weights_depend_on(tiny_config, tmp_path):
    data = _dataset(tmp_path / "a")
    key = _work_name(tiny_config, 1, "fm", data)
    assert key.startswith("expert-1-") and key == _work_name(tiny_config, 1, "fm", data)
    per_run = dataclasses.replace(
        tiny_config, federation=dataclasses.replace(tiny_config.federation, train_timeout=999)
    )
    assert _work_name(per_run, 1, "fm", data) == key  # federation and sampling change per run, not the weights
    other = {
        "expert id": _work_name(tiny_config, 2, "fm", data),
        "objective": _work_name(tiny_config, 1, "ddpm", data),
        "training config": _work_name(
            dataclasses.replace(tiny_config, expert=dataclasses.replace(tiny_config.expert, steps=4)), 1, "fm", data
        ),
        "dataset": _work_name(tiny_config, 1, "fm", _dataset(tmp_path / "b", num_clusters=5)),
    }
    assert len({key, *other.values()}) == 5, other


def test_a_kept_expert_is_sent_only_while_intact(tmp_path):
    work = tmp_path / "expert-0-abc"
    assert _finished(work) is None and _finished(None) is None
    blob = b"weights"
    _keep(work, blob, {"preset": "test"}, {"sha256": hashlib.sha256(blob).hexdigest(), "steps": 3})
    assert _finished(work) == (blob, {"preset": "test"}, {"sha256": hashlib.sha256(blob).hexdigest(), "steps": 3})
    assert not list(tmp_path.glob("*.tmp"))
    work.with_suffix(".safetensors").write_bytes(b"weightz")  # bit rot: trained again, not sent
    assert _finished(work) is None
    work.with_suffix(".json").write_text('{"meta": ')  # a torn JSON (another tool, a full disk): trained again
    assert _finished(work) is None
    work.with_suffix(".json").write_text("[]")
    assert _finished(work) is None
