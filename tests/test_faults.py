"""Lost experts, bad checkpoints and resumed clients, over the fake Grid with the real ClientApp (no Ray).

Every fault ends in ``missing`` with its reason, is never written under ``run_dir/experts``, and the run goes on
with the experts it has."""

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from flwr.app import Context

from clients.client_app import app as client_app
from hddm_flower.accept import ExpertStore
from hddm_flower.checkpoints import CheckpointRejected, load_expert, validate_weights_file, weights_bytes
from hddm_flower.data import Dataset
from hddm_flower.stages.expert import expert_spec
from strategies.inprocess_grid import FakeGrid, fake_over_wire, reply_weights, rewrite_weights, set_reply_weights
from strategies.one_shot import OneShotExperts

# "memory": the fake Grid hands replies over as objects; "wire": flwr's HttpGrid pulls them as Flower's wire objects
# from a stand-in SuperLink, and the strategy spools the weights to disk chunk by chunk (strategies/spool.py)
GRIDS = {"memory": lambda fake: fake, "wire": fake_over_wire}


def _strategy(cfg, run_dir, cache_dir, dataset_dir, **kw):
    args = dict(min_nodes=1, min_experts=1, node_wait_timeout=0.5, cache_dir=str(cache_dir), poll_interval=0.05)
    store = ExpertStore(run_dir, expert_spec(cfg, Dataset.open(dataset_dir)))
    return OneShotExperts(store, cfg.to_dict(), cfg.objective_of(), **(args | kw))


def _pickled(reply):
    from safetensors.torch import load

    buf = io.BytesIO()
    torch.save(load(reply_weights(reply)), buf)  # a pickle: what torch.save / .pt / .bin files are
    return set_reply_weights(reply, buf.getvalue())


def _flip_byte(reply):
    blob = bytearray(reply_weights(reply))
    blob[-3] ^= 0xFF  # corrupted in transit or altered: the declared sha256 no longer matches
    return set_reply_weights(reply, bytes(blob), rehash=False)


def _nan(reply):
    return rewrite_weights(
        reply, lambda s: {k: v.clone().fill_(float("nan")) if "proj_out" in k else v for k, v in s.items()}
    )


def _wrong_shape(reply):
    return rewrite_weights(
        reply, lambda s: {k: v[..., :1].contiguous() if k == "proj_out.weight" else v for k, v in s.items()}
    )


def _renamed(reply):
    return rewrite_weights(reply, lambda s: {k.replace("proj_out.weight", "evil.weight"): v for k, v in s.items()})


def _mixed_dtype(reply):
    return rewrite_weights(
        reply, lambda s: {k: v.to(torch.bfloat16) if k == "proj_out.weight" else v for k, v in s.items()}
    )


def _no_hash(reply):
    meta = json.loads(str(reply.content["meta"]["meta"]))
    del meta["sha256"]
    reply.content["meta"]["meta"] = json.dumps(meta)
    return reply


def _huge(reply):
    return set_reply_weights(reply, reply_weights(reply) + b"\0" * (4 << 20))


def _other_preset(reply):
    config = json.loads(str(reply.content["meta"]["model-config"]))
    reply.content["meta"]["model-config"] = json.dumps(config | {"num_layers": 2})
    return reply


BAD = {
    "pickle file": (_pickled, "not a valid safetensors file"),
    "hash mismatch": (_flip_byte, "sha256 mismatch"),
    "NaN": (_nan, "non-finite values"),
    "wrong shape": (_wrong_shape, "proj_out.weight has shape"),
    "wrong names": (_renamed, "unexpected ['evil.weight']"),
    "mixed dtypes": (_mixed_dtype, "dtypes ['bfloat16', 'float32'] do not match"),
    "no hash": (_no_hash, "metadata lacks ['sha256']"),
    "too large": (_huge, "exceeds the limit"),
    "other preset": (_other_preset, "model config differs from the run's preset 'test' in ['num_layers']"),
}


@pytest.mark.parametrize("grid", list(GRIDS))
@pytest.mark.parametrize("kind", list(BAD))
def test_bad_checkpoint_is_rejected_with_its_reason(kind, grid, tiny_config, dataset_dir, cache_dir, tmp_path):
    tamper_fn, reason = BAD[kind]
    nodes = {1: {"partition-id": 0}, 2: {"partition-id": 3}}

    def tamper(node, reply):
        return tamper_fn(reply) if node == 2 and reply.metadata.message_type == "train" else reply

    strategy = _strategy(tiny_config, tmp_path, cache_dir, dataset_dir, experts=[0, 3])
    strategy.start(GRIDS[grid](FakeGrid(client_app, nodes, tamper=tamper)), timeout=30.0)
    assert sorted(strategy.received) == [0]
    assert strategy.missing[3].startswith("rejected checkpoint") and reason in strategy.missing[3], strategy.missing
    assert sorted(p.name for p in (tmp_path / "experts").iterdir()) == ["expert-0"]  # nothing half-written kept
    load_expert(tmp_path / "experts" / "expert-0")


@pytest.mark.parametrize("grid_kind", list(GRIDS))
def test_lost_experts_each_with_its_reason_and_the_ensemble_built_from_the_rest(
    grid_kind, tiny_config, dataset_dir, cache_dir, tmp_path
):
    """A client that raises, a message whose TTL expired, a SuperNode that vanished, one that never replies and
    an expert no node ever claimed: all five reasons are kept and the run goes on with the one that came
    (test_strategy.py builds the ensemble from what arrived)."""
    from hddm_flower.config.io import config_from_dict
    from hddm_flower.rundir import missing_experts

    cfg = config_from_dict(
        tiny_config.to_dict() | {"num_experts": 6, "objectives": {"ddpm": 1, "fm": 5, "ddpm_clusters": [1]}}
    )
    nodes = {
        10: {"partition-id": 0},
        11: {"partition-id": 1, "objective": "edm"},
        12: {"partition-id": 2},
        13: {"partition-id": 3},
        14: {"partition-id": 4},
    }
    grid = GRIDS[grid_kind](
        FakeGrid(
            client_app,
            nodes,
            silent=[14],
            link_errors={
                12: (3, "Message has expired (TTL)."),
                13: (5, "Node 13 failed to report a heartbeat within 2 × its expected interval."),
            },
        )
    )
    strategy = _strategy(cfg, tmp_path, cache_dir, dataset_dir, min_nodes=6)
    calls = []
    strategy.start(grid, timeout=1.5, ensemble_fn=lambda received, missing: calls.append((received, missing)))
    m = strategy.missing
    assert sorted(strategy.received) == [0] and sorted(m) == [1, 2, 3, 4, 5]
    assert "error reply (code 2)" in m[1] and "edm" in m[1]
    assert "error reply (code 3)" in m[2] and "expired" in m[2]
    assert "error reply (code 5)" in m[3] and "heartbeat" in m[3]
    assert "no reply within 2 s" in m[4]
    assert "no node was assigned" in m[5]
    assert list(calls[0][0]) == [0] and calls[0][1] == m
    missing = missing_experts(tmp_path, 6, m)  # report.json's list: expert id + reason, nothing else
    assert missing == [{"expert_id": k, "reason": m[k]} for k in range(1, 6)]


def test_only_the_targeted_experts_are_trained(tiny_config, dataset_dir, cache_dir, tmp_path):
    nodes = {n: {"partition-id": n} for n in range(4)}
    grid = FakeGrid(client_app, nodes)
    strategy = _strategy(tiny_config, tmp_path, cache_dir, dataset_dir, experts=[2], present=[0, 1], min_experts=3)
    strategy.start(grid, timeout=30.0)
    assert [m.content["config"]["expert-id"] for m in grid.sent if m.metadata.message_type == "train"] == [2]
    assert sorted(strategy.received) == [2] and strategy.missing == {}
    with pytest.raises(ValueError, match=r"experts \[1\] are already present"):
        _strategy(tiny_config, tmp_path, cache_dir, dataset_dir, experts=[1], present=[1])


def test_bf16_weights_travel_and_rest_as_bf16(tiny_config, dataset_dir, cache_dir, tmp_path):
    from hddm_flower.config.io import config_from_dict

    cfg = config_from_dict(
        tiny_config.to_dict() | {"expert": tiny_config.to_dict()["expert"] | {"weights_dtype": "bfloat16"}}
    )
    sizes = {}

    def measure(node, reply):
        if reply.metadata.message_type == "train":
            sizes["sent"] = reply.content.array_records["expert"].count_bytes()
        return reply

    strategy = _strategy(cfg, tmp_path, cache_dir, dataset_dir, experts=[0])
    strategy.start(FakeGrid(client_app, {1: {"partition-id": 0}}, tamper=measure), timeout=30.0)
    weights = tmp_path / "experts" / "expert-0" / "diffusion_pytorch_model.safetensors"
    from safetensors import safe_open

    with safe_open(weights, "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
    n = sum(p.numel() for p in load_expert(weights.parent)[0].parameters())
    assert weights.stat().st_size < 2 * n + 20_000  # two bytes a parameter plus the header
    assert abs(sizes["sent"] - weights.stat().st_size) < 1_000  # what was sent is the file, not fp32-doubled
    assert strategy.received[0]["weights_dtype"] == "bfloat16"


def test_validate_weights_file_checks_everything_without_unpickling(tmp_path):
    from hddm_flower.models import ExpertNet, expert_config

    config = expert_config("test", sample_size=8, in_channels=3, caption_channels=8)
    state = ExpertNet.from_config(config).transformer.state_dict()
    good = tmp_path / "good.safetensors"
    good.write_bytes(weights_bytes(state))
    digest = validate_weights_file(good, config, dtype="float32")
    assert validate_weights_file(good, config, sha256=digest, max_bytes=good.stat().st_size) == digest
    with pytest.raises(CheckpointRejected, match="exceeds the limit"):
        validate_weights_file(good, config, max_bytes=100)
    with pytest.raises(CheckpointRejected, match=r"dtypes \['float32'\] do not match the declared bfloat16"):
        validate_weights_file(good, config, dtype="bfloat16")
    evil = tmp_path / "evil.safetensors"  # a pickle whose loading would run code: refused before any parsing
    evil.write_bytes(b"\x80\x04cos\nsystem\n(S'touch " + str(tmp_path / "pwned").encode() + b"'\ntR.")
    with pytest.raises(CheckpointRejected, match="not a valid safetensors file"):
        validate_weights_file(evil, config)
    assert not (tmp_path / "pwned").exists()


# ---------------------------------------------------------------------------------------------------------------
# A killed and restarted client resumes

_CHILD = """
import json, sys
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from clients.client_app import app
TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 7, 1
experiment, node = json.loads(sys.argv[1]), json.loads(sys.argv[2])
task = ConfigRecord({"expert-id": 0, "cluster-id": 0, "objective": "fm", "experiment": json.dumps(experiment),
                     "cache-dir": node["cache-dir"]})
msg = Message(RecordDict({"config": task}), dst_node_id=7, message_type=MessageType.TRAIN)
app(msg, Context(run_id=1, node_id=7, node_config=node, state=RecordDict(), run_config={}))
"""


def test_killed_client_resumes_from_its_last_checkpoint(tiny_config, dataset_dir, cache_dir, tmp_path):
    """SIGKILL a ClientApp process mid-training; the same node, given the same expert again, resumes from its last
    local checkpoint, and the checkpoint that arrives says how many steps were resumed."""
    from hddm_flower.config.io import config_from_dict

    values = tiny_config.to_dict()
    values["expert"] = values["expert"] | {"steps": 400, "checkpoint_every": 10, "log_every": 50}
    cfg = config_from_dict(values)
    node = {"partition-id": 0, "work-dir": str(tmp_path / "work"), "cache-dir": str(cache_dir), "num-threads": 1}
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, json.dumps(cfg.to_dict()), json.dumps(node)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not list((tmp_path / "work").glob("expert-0-*.pt")) and time.monotonic() < deadline:
        assert child.poll() is None, child.stderr.read().decode()[-2000:]
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)  # the node dies mid-training, with no chance to clean up
    child.wait()
    assert child.returncode == -signal.SIGKILL
    state = torch.load(next((tmp_path / "work").glob("expert-0-*.pt")), weights_only=True)
    assert 0 < state["step"] < 400 and state["step"] % 10 == 0

    strategy = _strategy(cfg, tmp_path / "run", cache_dir, dataset_dir, experts=[0])
    strategy.start(FakeGrid(client_app, {7: node}), timeout=120.0)
    meta = strategy.received[0]
    assert meta["steps"] == 400 and meta["resumed_steps"] >= state["step"] > 0
    assert (
        json.loads((tmp_path / "run" / "experts" / "expert-0" / "hddm_expert.json").read_text())["resumed_steps"]
        == meta["resumed_steps"]
    )
    assert not list((tmp_path / "work").glob("*.pt"))  # the training state is gone, the final weights are kept

    # the reply got lost (e.g. the server stopped waiting): asked again, the node sends what it kept, no training
    again = _strategy(cfg, tmp_path / "run2", cache_dir, dataset_dir, experts=[0])
    started = time.monotonic()
    again.start(FakeGrid(client_app, {7: node}), timeout=60.0)
    assert again.received[0]["sha256"] == meta["sha256"] and time.monotonic() - started < 30


# ---------------------------------------------------------------------------------------------------------------
# A late-joining expert


def test_add_expert_to_an_assembled_run(tiny_config_path, dataset_dir, cache_dir, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    from hddm_flower.cli import main

    common = ["--config", str(tiny_config_path), "--cache-dir", str(cache_dir)]
    run = tmp_path / "run"
    for k in (0, 1):
        out = run / "experts" / f"expert-{k}"
        assert main(["train-expert", *common, "--expert-id", str(k), "--out", str(out)]) == 0
    assert main(["assemble", *common, "--run-dir", str(run)]) == 0
    first = (run / "experts" / "expert-0" / "diffusion_pytorch_model.safetensors").read_bytes()
    assert (
        main(
            [
                "train-expert",
                *common,
                "--expert-id",
                "2",
                "--out",
                str(tmp_path / "late-2"),
                "--set",
                "expert.weights_dtype=bfloat16",
            ]
        )
        == 0
    )  # a late institution that saves bf16
    from safetensors import safe_open

    with safe_open(tmp_path / "late-2" / "diffusion_pytorch_model.safetensors", "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
    assert json.loads((tmp_path / "late-2" / "hddm_expert.json").read_text())["weights_dtype"] == "bfloat16"
    capsys.readouterr()

    assert main(["add-expert", str(run), str(tmp_path / "late-2"), *common]) == 0
    assert "expert 2 (ddpm) added" in capsys.readouterr().out
    report = json.loads((run / "report.json").read_text())
    assert [e["expert_id"] for e in report["experts"]] == [0, 1, 2]
    assert [e["weights_dtype"] for e in report["experts"]] == ["float32", "float32", "bfloat16"]
    assert report["missing"] == [{"expert_id": 3, "reason": "no expert folder"}]
    assert report["added_experts"][0]["expert_id"] == 2 and not report["added_experts"][0]["replaced"]
    assert (run / "experts" / "expert-0" / "diffusion_pytorch_model.safetensors").read_bytes() == first
    assert len(report["metrics"]["expert_velocity_mse"]) == 3  # re-evaluated with the new expert

    def fails(args, message):
        assert main(["add-expert", *args, *common]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err

    fails([str(run), str(tmp_path / "late-2")], "already exists; pass --replace")
    fails([str(tmp_path / "nowhere"), str(tmp_path / "late-2")], "is not a run directory")
    fails([str(run), str(tmp_path)], "is not an expert folder")
    weights = tmp_path / "late-2" / "diffusion_pytorch_model.safetensors"
    state = load_file(weights)
    state["proj_out.bias"] = torch.full_like(state["proj_out.bias"], float("inf"))
    save_file(state, weights)
    fails([str(run), str(tmp_path / "late-2"), "--replace"], "sha256 mismatch")
    assert json.loads((run / "report.json").read_text())["added_experts"][-1]["expert_id"] == 2  # unchanged
    assert (
        main(
            [
                "add-expert",
                str(run),
                str(tmp_path / "late-2"),
                "--replace",
                "--set",
                "num_experts=2",
                "--set",
                "objectives.ddpm=1",
                "--set",
                "objectives.fm=1",
                "--set",
                "objectives.ddpm_clusters=[1]",
                "--set",
                "federation.min_experts=1",
                *common,
            ]
        )
        == 2
    )
    assert "expert 2 is new to this run (0..1); pass --cluster-data" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------
# A hard crash of one expert's training does not take the process that hosts other nodes down (in simulation the
# ClientApp trains in a child process: clients/train_worker.py)


def _kill_worker_when(predicate, stop, killed):
    """Watch this machine's expert training processes (each writes its pid next to its spec, in a temporary
    ``hddm-expert-*`` folder) for one that matches ``predicate(spec)`` and SIGKILL it once (what the kernel's OOM
    killer does)."""
    import tempfile

    while not stop.is_set() and not killed:
        for pid_file in Path(tempfile.gettempdir()).glob("hddm-expert-*/pid"):
            try:
                spec = json.loads((pid_file.parent / "spec.json").read_text())
                pid = int(pid_file.read_text())
            except (OSError, ValueError):
                continue
            if predicate(spec):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
        time.sleep(0.1)


@pytest.mark.simulation
def test_in_simulation_a_crashed_client_loses_only_its_expert(tiny_config_path, cache_dir, tmp_path, monkeypatch):
    """A real Ray simulation (2 SuperNodes, 1 CPU each): expert 1's training is SIGKILLed mid-way; expert 0
    arrives, the ensemble is built from it and report.json says why expert 1 is missing."""
    import threading

    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from strategies.server_app import main as server_main

    monkeypatch.setenv("HDDM_CACHE", str(tmp_path / "home-cache"))  # the nodes' default work-dir lives here
    work = tmp_path / "home-cache" / "work"
    run_dir = tmp_path / "run"
    run_config = {
        "config": str(tiny_config_path),
        "run-dir": str(run_dir),
        "cache-dir": str(cache_dir),
        "overrides": "num_experts=2 objectives={ddpm: 1, fm: 1, ddpm_clusters: [1]} federation.min_nodes=2 "
        "federation.min_experts=1 expert.steps=300 expert.checkpoint_every=10 "
        "federation.train_timeout=600",  # the query waits for Ray to start the actors on a busy machine
    }
    server = ServerApp()

    @server.main()
    def _main(grid: Grid, context: Context) -> None:
        context.run_config.update(run_config)
        server_main(grid, context)

    stop, killed = threading.Event(), []
    watcher = threading.Thread(
        target=_kill_worker_when,
        daemon=True,
        args=(
            lambda spec: (
                spec["expert_id"] == 1 and str(work) in str(spec["checkpoint"]) and Path(spec["checkpoint"]).exists()
            ),
            stop,
            killed,
        ),
    )
    watcher.start()
    try:
        run_simulation(
            server_app=server,
            client_app=client_app,
            num_supernodes=2,
            backend_config={
                "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                "init_args": {"num_cpus": 2, "logging_level": "ERROR", "log_to_driver": False},
            },
        )
    finally:
        stop.set()
    assert killed
    report = json.loads((run_dir / "report.json").read_text())
    assert [e["expert_id"] for e in report["experts"]] == [0]
    (lost,) = report["missing"]
    assert lost["expert_id"] == 1 and "killed by SIGKILL" in lost["reason"], lost


def test_a_new_institution_joins_an_assembled_run_with_its_own_cluster(
    tiny_config, tiny_config_path, cache_dir, tmp_path, capsys
):
    """A run of 3 experts on a 3-cluster dataset; a fourth institution, with data the run never had (here: cluster
    3 of the 4-cluster clustering), trains expert 3 and is added with its cluster's shard set: the run grows to 4
    experts, the router is retrained with 4 classes on the old clusters plus the new one, and nothing else changes."""
    import shutil

    import yaml

    from hddm_flower.checkpoints import load_router
    from hddm_flower.cli import main
    from hddm_flower.data import read_meta
    from hddm_flower.stages.prepare import prepare_data

    common = ["--config", str(tiny_config_path), "--cache-dir", str(cache_dir)]
    three = [*common, "--set", "num_experts=3", "--set", "objectives={ddpm: 1, fm: 2, ddpm_clusters: [1]}"]
    three += ["--set", "federation.expert_nodes=[11, 12, 13]"]  # a pinned run: the newcomer is pinned to no node
    run = tmp_path / "run"
    for k in range(3):
        assert main(["train-expert", *three, "--expert-id", str(k), "--out", str(run / "experts" / f"expert-{k}")]) == 0
    assert main(["assemble", *three, "--run-dir", str(run)]) == 0
    before = {
        k: (run / "experts" / f"expert-{k}" / "diffusion_pytorch_model.safetensors").read_bytes() for k in range(3)
    }
    cluster = prepare_data(tiny_config, cache_dir).root / "cluster-3"  # the newcomer's own shard set
    capsys.readouterr()
    # the newcomer trains with the run's config on its own shard set
    assert (
        main(
            [
                "train-expert",
                *three,
                "--expert-id",
                "3",
                "--cluster-data",
                str(cluster),
                "--out",
                str(tmp_path / "new-3"),
            ]
        )
        == 2
    )
    assert "--cluster-data needs --objective" in capsys.readouterr().err
    assert (
        main(
            [
                "train-expert",
                *three,
                "--expert-id",
                "3",
                "--cluster-data",
                str(cluster),
                "--objective",
                "fm",
                "--out",
                str(tmp_path / "new-3"),
            ]
        )
        == 0
    )
    new_meta = json.loads((tmp_path / "new-3" / "hddm_expert.json").read_text())
    assert (new_meta["expert_id"], new_meta["data_cluster"], new_meta["objective"]) == (3, 3, "fm")
    capsys.readouterr()

    def fails(args, message):
        assert main(["add-expert", *args, "--cache-dir", str(cache_dir)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err

    fails([str(run), str(tmp_path / "new-3")], "expert 3 is new to this run (0..2); pass --cluster-data")
    fails([str(run), str(tmp_path / "new-3"), "--cluster-data", str(cluster.parent)], "is not one cluster's shard set")
    fails(
        [
            str(run),
            str(tmp_path / "new-3"),
            "--set",
            "num_experts=2",
            "--set",
            "objectives={ddpm: 1, fm: 1, ddpm_clusters: [1]}",
            "--set",
            "federation.min_experts=1",
            "--set",
            "federation.expert_nodes=[11, 12]",
        ],
        "outside this run's 0..1 and is not the next",
    )
    other = tmp_path / "other-size"  # a shard set prepared at another resolution
    shutil.copytree(cluster, other)
    (other / "meta.json").write_text(json.dumps(json.loads((other / "meta.json").read_text()) | {"image_size": 32}))
    fails([str(run), str(tmp_path / "new-3"), "--cluster-data", str(other)], "does not match the run's dataset")
    assert not (run / "dataset-4").exists() and "num_experts: 3" in (run / "config.yaml").read_text()
    assert not list(run.glob("config.before-*")) and (run / "feature_net").is_dir()  # nothing half-done

    assert (
        main(
            [
                "add-expert",
                str(run),
                str(tmp_path / "new-3"),
                "--cluster-data",
                str(cluster),
                "--cache-dir",
                str(cache_dir),
            ]
        )
        == 0
    )
    assert "expert 3 (fm) added" in capsys.readouterr().out
    report = json.loads((run / "report.json").read_text())
    assert [e["expert_id"] for e in report["experts"]] == [0, 1, 2, 3] and report["missing"] == []
    assert report["num_experts"] == 4 and report["added_experts"][0]["new_cluster"] == str(cluster)
    assert len(report["metrics"]["expert_velocity_mse"]) == 4  # each expert on its own cluster, the new one too
    assert load_router(run / "router").head.out_features == 4
    grown = yaml.safe_load((run / "config.yaml").read_text())
    assert grown["num_experts"] == 4 and grown["objectives"]["ddpm_clusters"] == [1]
    assert (grown["objectives"]["ddpm"], grown["objectives"]["fm"]) == (1, 3)
    assert grown["data"]["prepared"] == str((run / "dataset-4").resolve())
    assert grown["federation"]["expert_nodes"] == [11, 12, 13, 0]
    assert yaml.safe_load((run / "config.before-expert-3.yaml").read_text())["num_experts"] == 3
    view = read_meta(run / "dataset-4")
    assert view["num_clusters"] == 4 and view["clusters"][3]["source"] == str(cluster.resolve())
    for k in range(3):
        assert (run / "experts" / f"expert-{k}" / "diffusion_pytorch_model.safetensors").read_bytes() == before[k]
    fails([str(run), str(tmp_path / "new-3"), "--cluster-data", str(cluster)], "expert 3 already has its cluster")
    fails([str(run), str(tmp_path / "new-3")], "already exists; pass --replace")
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(("dataset", "feature_net"))) == [
        "dataset-4",
        "feature_net",
        "feature_net.before-expert-3",
    ]


def test_training_in_a_forked_child_returns_the_weights_or_the_error(tiny_config, dataset_dir, tmp_path):
    """The crash isolation simulation uses (clients/expert_pool.train_in_child): the same weights as training in
    process, and an exception in the child comes back as one line, with the exit code."""
    import clients.expert_pool as pool
    from hddm_flower.config.io import config_from_dict
    from hddm_flower.stages.expert import train_one_expert

    cfg = config_from_dict(tiny_config.to_dict() | {"expert": tiny_config.to_dict()["expert"] | {"steps": 2}})
    torch.set_num_threads(1)
    blob, model_config, meta = pool.train_in_child(cfg, Dataset.open(dataset_dir), 0, "fm", "cpu", None)
    state, model_config_here, _ = train_one_expert(cfg, Dataset.open(dataset_dir), 0, "fm")
    from safetensors.torch import load

    got = load(blob)
    assert model_config == model_config_here and meta["expert_id"] == 0 and meta["steps"] == 2
    assert all(torch.equal(got[k], v) for k, v in state.items())  # same seed, same data, same weights
    with pytest.raises(RuntimeError, match=r"training process of expert 1 failed with exit code 1: .*edm"):
        pool.train_in_child(cfg, Dataset.open(dataset_dir), 1, "edm", "cpu", None)


def test_fewer_simulated_nodes_than_experts_each_train_several(tiny_config, dataset_dir, cache_dir, tmp_path):
    """Plain `flwr run .` simulates 2 SuperNodes (flwr ≥ 1.32): partition p of n holds experts p, p+n, …, gets
    them all in one train message and replies with all of them; the server does not wait for min_nodes when every
    simulated node is there (it waits up to 3600 s for 4). Node 10 trains its two side by side in forked processes (2 CPUs: two at once, one
    thread each), node 11 one after another in its own process. A failing training (a corrupt training state in
    the work dir) costs only its own expert. Institutions (expert-id, or a partition-id without num-partitions)
    keep one expert each."""
    import clients.kept_experts as kept
    from hddm_flower.config.io import config_from_dict

    values = tiny_config.to_dict()
    values["expert"] = values["expert"] | {"checkpoint_every": 1000}  # a work dir, never written at 3 steps
    cfg = config_from_dict(values)
    work = str(tmp_path / "work")
    nodes = {
        10: {"partition-id": 0, "num-partitions": 2, "isolate-training": True, "num-threads": 2, "work-dir": work},
        11: {"partition-id": 1, "num-partitions": 2, "isolate-training": False, "work-dir": work},
    }
    for k, node in ((2, nodes[10]), (3, nodes[11])):  # one training of each node fails on resuming its state
        state = kept.work_dir(cfg, node, k, cfg.objective_of()[k], Dataset.open(dataset_dir)).with_suffix(".pt")
        state.parent.mkdir(parents=True, exist_ok=True)
        state.write_bytes(b"not a training state")
    # were the server to wait for min_nodes, this test would outlast its timeout (300 s)
    strategy = _strategy(cfg, tmp_path / "run", cache_dir, dataset_dir, min_nodes=4, node_wait_timeout=3600.0)
    grid = FakeGrid(client_app, nodes)
    strategy.start(grid, timeout=120.0)
    assert strategy.assignment == {10: [0, 2], 11: [1, 3]}
    tasks = {m.metadata.dst_node_id: m.content["config"] for m in grid.sent if m.metadata.message_type == "train"}
    assert {n: (list(t["expert-ids"]), list(t["objectives"])) for n, t in tasks.items()} == {
        10: ([0, 2], ["fm", "ddpm"]),
        11: ([1, 3], ["ddpm", "fm"]),
    }
    assert sorted(strategy.received) == [0, 1] and sorted(strategy.missing) == [2, 3]
    assert all("training failed on the node" in strategy.missing[k] for k in (2, 3)), strategy.missing
    assert [strategy.received[k]["objective"] for k in (0, 1)] == ["fm", "ddpm"]
    assert strategy.received[0]["cpu_threads"] == 1  # side by side: one thread each of the node's two
    assert sorted(p.name for p in (tmp_path / "run" / "experts").iterdir()) == ["expert-0", "expert-1"]
    one_each = _strategy(tiny_config, tmp_path / "b", cache_dir, dataset_dir, node_wait_timeout=0.1)
    assert one_each._claims({"partition-id": 2}) == [2] and one_each._claims(
        {"expert-id": 3, "partition-id": 0, "num-partitions": 2}
    ) == [3]
    assert [one_each._claims({"partition-id": p, "num-partitions": 3}) for p in range(3)] == [[0, 3], [1], [2]]
    assert one_each._claims({"partition-id": 1, "num-partitions": 8}) == [1]  # enough nodes: one expert each


def test_a_node_whose_second_of_four_experts_fails_delivers_the_other_three(
    tiny_config_path, dataset_dir, cache_dir, tmp_path
):
    """The ServerApp end to end over one simulated SuperNode that holds all four experts (partition 0 of 1, as
    each of plain `flwr run .`'s 2 SuperNodes holds 4 of 8) and trains them from its own copy of the prepared
    dataset, in which cluster 1 (its 2nd expert's) has lost its shards: experts 0, 2 and 3 arrive, the run
    completes, and the report names expert 1 and why. (Before, the node's data check raised for the whole
    message: all four were lost and the run failed for want of experts.)"""
    import shutil

    from flwr.app import RecordDict

    from strategies.server_app import main as server_main

    data = tmp_path / "node-data"
    shutil.copytree(dataset_dir, data)
    for shard in (data / "cluster-1").glob("shard-*.tar"):
        shard.unlink()
    node = {"partition-id": 0, "num-partitions": 1, "data-dir": str(data), "work-dir": str(tmp_path / "work")}
    run_dir = tmp_path / "run"
    run_config = {
        "config": str(tiny_config_path),
        "overrides": "federation.min_experts=3 evaluation.routing_modes=[top2]",
        "run-dir": str(run_dir),
        "cache-dir": str(cache_dir),
    }
    grid = FakeGrid(client_app, {10: node | {"isolate-training": False}})
    server_main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    (task,) = [m.content["config"] for m in grid.sent if m.metadata.message_type == "train"]
    assert list(task["expert-ids"]) == [0, 1, 2, 3]  # one message for the node's four experts
    report = json.loads((run_dir / "report.json").read_text())
    assert "status" not in report and [e["expert_id"] for e in report["experts"]] == [0, 2, 3]  # not "failed"
    (lost,) = report["missing"]
    assert lost["expert_id"] == 1 and lost["reason"].startswith("training failed on the node: ValueError: cluster 1")
    assert "no shards" in lost["reason"], lost
    assert sorted(p.name for p in (run_dir / "experts").glob("expert-*")) == ["expert-0", "expert-2", "expert-3"]
    assert f"- expert 1: {lost['reason']}" in (run_dir / "report.md").read_text()
    # each of the three was kept on the node as it ended (what a re-run collects when a whole reply is lost)
    assert sorted(p.name.split("-")[1] for p in (tmp_path / "work").glob("expert-*.json")) == ["0", "2", "3"]


def test_a_lost_several_expert_reply_costs_a_rerun_not_the_trainings(
    tiny_config, dataset_dir, cache_dir, tmp_path, monkeypatch
):
    """A node holding four experts trains them all, but its one reply never arrives (the server stopped waiting):
    all four are missing, and the reason says how to collect them. The node kept each one as it ended (no
    work-dir and no expert.checkpoint_every set: in its default cache), so a run that targets the four gets every
    one sent again without a training step (the metadata is the kept one, its measured device seconds included)."""
    monkeypatch.setenv("HDDM_CACHE", str(tmp_path / "node-cache"))  # the node's default work dir lives here
    node = {"partition-id": 0, "num-partitions": 1, "isolate-training": False}
    first = _strategy(tiny_config, tmp_path / "run", cache_dir, dataset_dir)
    with pytest.raises(RuntimeError, match="only 0 of 4 experts arrived"):
        first.start(FakeGrid(client_app, {10: node}, lost=[10]), timeout=1.0)
    assert sorted(first.missing) == [0, 1, 2, 3] and first.received == {}
    for reason in first.missing.values():
        assert reason.startswith("no reply within 1 s") and 'experts="0,1,2,3"' in reason, reason
    kept = {
        int(p.name.split("-")[1]): json.loads(p.read_text())["meta"]
        for p in (tmp_path / "node-cache" / "work").glob("expert-*.json")
    }
    assert sorted(kept) == [0, 1, 2, 3]

    again = _strategy(tiny_config, tmp_path / "run", cache_dir, dataset_dir, experts=[0, 1, 2, 3])
    again.start(FakeGrid(client_app, {10: node}), timeout=30.0)
    assert again.missing == {} and sorted(again.received) == [0, 1, 2, 3]
    for k, meta in again.received.items():
        assert {key: meta[key] for key in kept[k]} == kept[k], k  # sent from the kept copy, not trained again


def test_each_failure_of_a_several_expert_node_is_its_own_experts(tiny_config, dataset_dir, cache_dir, tmp_path):
    """Three of a node's four clusters have no shards and the fourth expert's training fails (a corrupt training
    state in its work dir): four failures, four reasons, each its own expert's, not one error reply for the node
    (the last one left to train must not raise for all of them)."""
    import shutil

    import clients.kept_experts as kept

    data = tmp_path / "node-data"
    shutil.copytree(dataset_dir, data)
    for k in (0, 1, 2):
        for shard in (data / f"cluster-{k}").glob("shard-*.tar"):
            shard.unlink()
    node = {"partition-id": 0, "num-partitions": 1, "data-dir": str(data), "work-dir": str(tmp_path / "work")}
    node["isolate-training"] = False
    state = kept.work_dir(tiny_config, node, 3, tiny_config.objective_of()[3], Dataset.open(data)).with_suffix(".pt")
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_bytes(b"not a training state")
    strategy = _strategy(tiny_config, tmp_path / "run", cache_dir, dataset_dir)
    with pytest.raises(RuntimeError, match="only 0 of 4 experts arrived"):
        strategy.start(FakeGrid(client_app, {10: node}), timeout=30.0)
    m = strategy.missing
    assert sorted(m) == [0, 1, 2, 3] and all(r.startswith("training failed on the node: ") for r in m.values()), m
    assert all(f"ValueError: cluster {k} of " in m[k] and "no shards" in m[k] for k in (0, 1, 2)), m
    assert "cluster" not in m[3] and "no shards" not in m[3], m[3]  # its own failure: the training state


def test_a_node_that_never_answers_the_query_is_named_and_its_expert_missing(
    tiny_config, dataset_dir, cache_dir, tmp_path, caplog
):
    """A node whose query reply never comes (an actor still starting, a node gone) is named in the log with the
    time waited; its expert is missing with the reason, and the run goes on with the node that answered."""
    from hddm_flower.config.io import config_from_dict

    cfg = config_from_dict(
        tiny_config.to_dict() | {"num_experts": 2, "objectives": {"ddpm": 1, "fm": 1, "ddpm_clusters": [1]}}
    )

    class QueryLost(FakeGrid):
        def pull_messages(self, message_ids):
            return [
                r
                for r in super().pull_messages(message_ids)
                if not (r.metadata.src_node_id == 21 and r.metadata.message_type == "query")
            ]

    grid = QueryLost(client_app, {20: {"partition-id": 0}, 21: {"partition-id": 1}})
    strategy = _strategy(cfg, tmp_path, cache_dir, dataset_dir, min_nodes=2)
    with caplog.at_level("WARNING", logger="flwr"):
        strategy.start(grid, timeout=1.0)
    assert any("node 21 did not answer the query within 1 s" in r.getMessage() for r in caplog.records)
    assert sorted(strategy.received) == [0] and "no node was assigned" in strategy.missing[1]
