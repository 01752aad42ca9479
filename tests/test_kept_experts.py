"""clients/kept_experts.py: a node's kept experts: the key under which a node keeps an expert's training state and final
weights, and what it does with a damaged copy."""

import dataclasses
import hashlib
import json

from clients.kept_experts import finished, keep, work_name
from hddm_flower.data import Dataset


def _dataset(root, **meta):
    root.mkdir(parents=True, exist_ok=True)
    (root / "meta.json").write_text(json.dumps({"name": "twemoji", "num_clusters": 4} | meta))
    return Dataset.open(root)


def test_the_key_names_the_expert_and_everything_its_weights_depend_on(tiny_config, tmp_path):
    data = _dataset(tmp_path / "a")
    key = work_name(tiny_config, 1, "fm", data)
    assert key.startswith("expert-1-") and key == work_name(tiny_config, 1, "fm", data)
    per_run = dataclasses.replace(
        tiny_config, federation=dataclasses.replace(tiny_config.federation, train_timeout=999)
    )
    assert work_name(per_run, 1, "fm", data) == key  # federation and sampling change per run, not the weights
    other = {
        "expert id": work_name(tiny_config, 2, "fm", data),
        "objective": work_name(tiny_config, 1, "ddpm", data),
        "training config": work_name(
            dataclasses.replace(tiny_config, expert=dataclasses.replace(tiny_config.expert, steps=4)), 1, "fm", data
        ),
        "dataset": work_name(tiny_config, 1, "fm", _dataset(tmp_path / "b", num_clusters=5)),
    }
    assert len({key, *other.values()}) == 5, other


def test_a_kept_expert_is_sent_only_while_intact(tmp_path):
    work = tmp_path / "expert-0-abc"
    assert finished(work) is None and finished(None) is None
    blob = b"weights"
    keep(work, blob, {"preset": "test"}, {"sha256": hashlib.sha256(blob).hexdigest(), "steps": 3})
    assert finished(work) == (blob, {"preset": "test"}, {"sha256": hashlib.sha256(blob).hexdigest(), "steps": 3})
    assert not list(tmp_path.glob("*.tmp"))
    work.with_suffix(".safetensors").write_bytes(b"weightz")  # bit rot: trained again, not sent
    assert finished(work) is None
    work.with_suffix(".json").write_text('{"meta": ')  # a torn JSON (another tool, a full disk): trained again
    assert finished(work) is None
    work.with_suffix(".json").write_text("[]")
    assert finished(work) is None


def test_a_node_with_a_work_dir_keeps_its_expert_without_checkpoints(tiny_config, dataset_dir, cache_dir, tmp_path):
    """``expert.checkpoint_every`` 0, but the node config names a ``work-dir``: the final expert is kept there, and
    the same task again is answered with it (same bytes) without a training step."""
    import logging

    from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from clients.client_app import app
    from hddm_flower import wire

    assert tiny_config.expert.checkpoint_every == 0
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 7, 1
    node = {"expert-id": 0, "work-dir": str(tmp_path / "work"), "cache-dir": str(cache_dir), "num-threads": 1}
    task = {
        wire.TASK_EXPERT_ID: 0,
        wire.TASK_CLUSTER_ID: 0,
        wire.TASK_OBJECTIVE: "fm",
        wire.TASK_EXPERIMENT: json.dumps(tiny_config.to_dict()),
        wire.TASK_CACHE_DIR: str(cache_dir),
    }

    def ask() -> tuple[bytes, list[str]]:
        msg = Message(RecordDict({wire.TASK: ConfigRecord(task)}), dst_node_id=7, message_type=MessageType.TRAIN)
        records = []
        handler = logging.Handler()
        handler.emit = records.append
        core = logging.getLogger("hddm_flower")
        core.addHandler(handler)
        try:
            reply = app(msg, Context(run_id=1, node_id=7, node_config=node, state=RecordDict(), run_config={}))
        finally:
            core.removeHandler(handler)
        assert not reply.has_error(), reply.error
        return reply.content[wire.EXPERT][wire.WEIGHTS].data, [r.getMessage() for r in records]

    first, log1 = ask()
    assert any("training fm" in line for line in log1) and any(" step 3/3 " in line for line in log1)
    assert [p.suffix for p in sorted((tmp_path / "work").iterdir())] == [".json", ".safetensors"]
    again, log2 = ask()
    assert again == first
    assert any("sending the kept checkpoint" in line for line in log2)
    assert not any(" step " in line or "training fm" in line for line in log2)
