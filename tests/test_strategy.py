"""The one-shot strategy over a fake Grid (no Ray) with the real ClientApp and the real expert store."""

import pytest
import torch
from flwr.app import ConfigRecord

from clients.client_app import app as client_app
from hddm_flower.accept import ExpertStore
from hddm_flower.checkpoints import load_expert
from hddm_flower.data import Dataset
from hddm_flower.stages.expert import expert_spec
from strategies.inprocess_grid import FakeGrid, rewrite_weights
from strategies.one_shot import OneShotExperts


def _strategy(cfg, run_dir, cache_dir, dataset_dir, **kw):
    objectives = cfg.objective_of()
    args = dict(
        min_nodes=len(objectives),
        min_experts=cfg.federation.min_experts,
        node_wait_timeout=1.0,
        cache_dir=str(cache_dir),
        poll_interval=0.05,
    )
    return OneShotExperts(
        ExpertStore(run_dir, expert_spec(cfg, Dataset.open(dataset_dir))), cfg.to_dict(), objectives, **(args | kw)
    )


def test_one_shot_collects_experts_and_records_failures(tiny_config, dataset_dir, cache_dir, tmp_path):
    cfg = tiny_config
    assert cfg.objective_of() == ["fm", "ddpm", "ddpm", "fm"]
    nodes = {
        101: {"partition-id": 0, "num-partitions": 4},
        102: {"partition-id": 1, "num-partitions": 4},
        103: {"partition-id": 2, "num-partitions": 4, "objective": "edm"},  # its ClientApp raises
        104: {"partition-id": 3, "num-partitions": 4},  # silent: never answers its train message
        105: {"partition-id": 3, "num-partitions": 4},  # claims an expert already taken: gets nothing
    }
    grid = FakeGrid(client_app, nodes, silent=[104])
    strategy = _strategy(cfg, tmp_path, cache_dir, dataset_dir)
    calls = []

    def ensemble_fn(received, missing):
        calls.append((dict(received), dict(missing)))
        return {"experts": len(received)}

    result = strategy.start(grid, timeout=2.0, ensemble_fn=ensemble_fn)

    # one fresh record per node, each with its own expert id, cluster and objective
    train = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert sorted(m.metadata.dst_node_id for m in train) == [101, 102, 103, 104]
    tasks = {m.metadata.dst_node_id: m.content["config"] for m in train}
    assert len({id(t) for t in tasks.values()}) == 4
    assert {n: (t["expert-id"], t["cluster-id"], t["objective"]) for n, t in tasks.items()} == {
        101: (0, 0, "fm"),
        102: (1, 1, "ddpm"),
        103: (2, 2, "ddpm"),
        104: (3, 3, "fm"),
    }

    # the error reply and the silent node end up in `missing`; the rest was written to disk
    assert sorted(strategy.received) == [0, 1]
    assert set(strategy.missing) == {2, 3}
    assert "error reply (code 2)" in strategy.missing[2] and "edm" in strategy.missing[2]
    assert "no reply within 2 s" in strategy.missing[3]
    assert result.train_metrics_clientapp[1]["experts-received"] == 2

    # the ServerApp's ensemble_fn gets what arrived and what is missing (the report is tested in test_report.py)
    assert [(sorted(r), sorted(m)) for r, m in calls] == [([0, 1], [2, 3])]
    assert result.evaluate_metrics_serverapp[1]["experts"] == 2
    assert sorted(p.name for p in (tmp_path / "experts").iterdir()) == ["expert-0", "expert-1"]
    expert, meta = load_expert(tmp_path / "experts" / "expert-1")
    assert meta["objective"] == "ddpm" and meta["schedule"] == "linear" and meta["objective_assigned"] == "ddpm"


def test_pinned_expert_ids_go_to_their_nodes_whatever_the_others_claim(tiny_config, dataset_dir, cache_dir, tmp_path):
    """federation.expert_nodes: node 101 claims experts 0 and 2 before node 102 (a lower node id) but expert 0 is
    pinned to 102, and 102, pinned to 0 alone, also claims 1: 101 gets only the unpinned 2, 102 only 0, expert 1
    nobody. Without pins the lower node id would have taken expert 0 too."""
    nodes = {101: {"partition-id": 0, "num-partitions": 2}, 102: {"partition-id": 0, "num-partitions": 1}}
    grid = FakeGrid(client_app, nodes)
    pins = [102, 0, 0, 0]
    strategy = _strategy(tiny_config, tmp_path, cache_dir, dataset_dir, min_nodes=2, expert_nodes=pins)
    strategy.discover(grid, timeout=2.0)
    assert strategy.assignment == {101: [2], 102: [0]}
    assert "no node was assigned" in strategy.missing[1] and set(strategy.missing) == {1, 3}
    unpinned = _strategy(tiny_config, tmp_path / "b", cache_dir, dataset_dir, min_nodes=2)
    unpinned.discover(FakeGrid(client_app, nodes), timeout=2.0)
    assert unpinned.assignment == {101: [0, 2], 102: [1, 3]}


def test_experts_decided_before_the_strategy_go_to_their_nodes_and_no_claim_is_read(
    tiny_config, dataset_dir, cache_dir, tmp_path
):
    """``nodes`` (the institutions' checked declarations): node 102 claims expert 0 with a lower id than node 103,
    to which the declarations gave it; 103 trains it, 102 trains nothing, and an expert given to a node that does
    not answer is missing."""
    nodes = {102: {"expert-id": 0}, 103: {"expert-id": 0}}
    strategy = _strategy(tiny_config, tmp_path, cache_dir, dataset_dir, min_nodes=2, nodes={0: 103, 1: 104})
    strategy.discover(FakeGrid(client_app, nodes), timeout=2.0)
    assert strategy.assignment == {103: [0]} and set(strategy.missing) == {1, 2, 3}


def test_node_override_and_tampered_checkpoint(tiny_config, dataset_dir, cache_dir, tmp_path):
    """A SuperNode may force its objective (metadata records both); a reply with corrupt weights is refused."""
    nodes = {201: {"partition-id": 0, "objective": "ddpm"}, 202: {"partition-id": 1}}

    def tamper(node, reply):
        if node == 202 and not reply.has_error() and "expert" in reply.content.array_records:
            rewrite_weights(reply, lambda state: {k: torch.full_like(v, float("nan")) for k, v in state.items()})
        return reply

    strategy = _strategy(tiny_config, tmp_path, cache_dir, dataset_dir, min_nodes=2, min_experts=1)
    strategy.start(FakeGrid(client_app, nodes, tamper=tamper), timeout=30.0)
    assert strategy.received[0]["objective"] == "ddpm" and strategy.received[0]["objective_assigned"] == "fm"
    assert "rejected checkpoint" in strategy.missing[1] and "non-finite" in strategy.missing[1]
    assert "no node" in strategy.missing[2] and "no node" in strategy.missing[3]
    assert not (tmp_path / "experts" / "expert-1").exists()


def test_too_few_experts_raise_after_recording(tiny_config, dataset_dir, cache_dir, tmp_path):
    strategy = _strategy(tiny_config, tmp_path, cache_dir, dataset_dir, min_nodes=1, min_experts=2)
    grid = FakeGrid(client_app, {301: {"partition-id": 2, "objective": "edm"}})
    with pytest.raises(RuntimeError, match="only 0 of 4 experts arrived"):
        strategy.start(grid, timeout=5.0, train_config=ConfigRecord())
    assert set(strategy.missing) == {0, 1, 2, 3}


def test_server_run_config_resolution(tiny_config_path, tmp_path):
    from hddm_flower.config.rules import ConfigError
    from strategies.server_app import resolve_run

    cfg, path, run_dir, cache = resolve_run(
        {"config": str(tiny_config_path), "overrides": "expert.steps=5", "run-dir": "", "cache-dir": ""}, 42
    )
    assert cfg.expert.steps == 5 and run_dir.name == "run-42" and run_dir.is_absolute()
    _, default_path, _, _ = resolve_run({}, 1)
    assert default_path.name == "default.yaml" and default_path.is_file()
    with pytest.raises(ConfigError, match="run-dir must be an absolute path"):
        resolve_run({"config": str(tiny_config_path), "run-dir": "relative/out"}, 1)
    with pytest.raises(ConfigError, match="unknown key expert.stpes"):
        resolve_run({"config": str(tiny_config_path), "overrides": "expert.stpes=5"}, 1)


def test_server_memory_benchmark_runs_small(tmp_path):
    """benchmarks/server_memory.py's sender and server, in-process and tiny (the real run measures in two
    processes): what is sent is the safetensors file plus object headers, and every expert is installed, in each
    pulling mode, through flwr's HttpGrid."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "server_memory", Path(__file__).parent.parent / "benchmarks" / "server_memory.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    sent = [bench.produce(tmp_path / "store", k, layers=1) for k in range(2)]
    for s in sent:
        assert 1 < s["wire_bytes"] / s["safetensors_bytes"] < 1.001 and s["objects"] > 3
        assert abs(s["safetensors_bytes"] / s["float32_bytes"] - 0.5) < 0.01  # bf16, not fp32-doubled
        assert s["arrayrecord_numpy_path"].startswith("TypeError")
    for mode in bench.MODES:
        result = bench.serve(tmp_path / "store", 2, 1, mode, tmp_path / mode)
        assert result["peak_rss_mib"] > 0 and sorted(p.name for p in (tmp_path / mode / "experts").iterdir()) == [
            "expert-0",
            "expert-1",
        ]
        assert result["objects_pulled"] > 2 * 3  # every reply crossed as wire objects


def test_server_refuses_mixing_runs_and_parses_target_ids(tiny_config_path, tmp_path):
    import yaml
    from flwr.app import Context, RecordDict

    from hddm_flower.config.io import load_config
    from hddm_flower.config.rules import ConfigError
    from strategies.server_app import main, parse_expert_ids

    assert parse_expert_ids("", 4) is None and parse_expert_ids(" 3, 1,3", 4) == [1, 3]
    with pytest.raises(ConfigError, match=r"ids \[4\] outside 0..3"):
        parse_expert_ids("4", 4)
    with pytest.raises(ConfigError, match="expected expert ids separated by commas"):
        parse_expert_ids("one", 4)

    run = tmp_path / "run"
    (run / "experts" / "expert-0").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(load_config(tiny_config_path).to_dict()))

    def start(**run_config):
        main(
            None,
            Context(
                run_id=1,
                node_id=0,
                node_config={},
                state=RecordDict(),
                run_config={"config": str(tiny_config_path), "run-dir": str(run)} | run_config,
            ),
        )

    with pytest.raises(ConfigError, match="already holds experts from another run"):
        start()
    with pytest.raises(ConfigError, match=r"experts \[0\] are already in"):
        start(experts="0,2")
    with pytest.raises(ConfigError, match="was trained with another expert configuration"):
        start(experts="2", overrides="expert.steps=4")
