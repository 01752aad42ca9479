"""One real Flower simulation (Ray, 2 SuperNodes, a few steps): the apps exactly as `flwr run .` loads them."""

import json

import pytest
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from clients.client_app import app as client_app
from strategies.server_app import main as server_main

pytestmark = pytest.mark.simulation


def test_simulation_two_nodes_for_four_experts(tiny_config_path, cache_dir, tmp_path, monkeypatch):
    """As plain `flwr run .` runs it since flwr 1.32: 2 simulated SuperNodes, Flower's default 2 CPUs per ClientApp
    (one actor on 2 cores), more experts than nodes: each node gets its share in one message and trains it side by
    side, two at a time with one of the actor's 2 threads each; the server does not wait for federation.min_nodes."""
    # a node given several experts keeps each one in its default work dir ($HDDM_CACHE/work; Ray's workers inherit
    # the variable): here, not in the user's cache
    monkeypatch.setenv("HDDM_CACHE", str(tmp_path / "node-cache"))
    run_dir = tmp_path / "run"
    run_config = {
        "config": str(tiny_config_path),
        # were the server to wait for min_nodes, this run would outlast the test timeout (300 s)
        # the queries wait for Ray to start the actors, one after the other, on a busy machine
        "overrides": "federation.min_nodes=4 federation.node_wait_timeout=3600 federation.train_timeout=600",
        "run-dir": str(run_dir),
        "cache-dir": str(cache_dir),
    }
    server = ServerApp()

    @server.main()
    def _main(grid: Grid, context: Context) -> None:  # run_simulation passes an empty run config
        context.run_config.update(run_config)
        server_main(grid, context)

    run_simulation(
        server_app=server,
        client_app=client_app,
        num_supernodes=2,
        backend_config={
            "client_resources": {"num_cpus": 2, "num_gpus": 0.0},
            "init_args": {"num_cpus": 2, "logging_level": "ERROR", "log_to_driver": False},
        },
    )
    report = json.loads((run_dir / "report.json").read_text())
    assert sorted((e["expert_id"], e["objective"]) for e in report["experts"]) == [
        (0, "fm"),
        (1, "ddpm"),
        (2, "ddpm"),
        (3, "fm"),
    ]
    assert report["missing"] == []
    assert sorted(sorted(e) for e in report["flower"]["assignment"].values()) == [[0, 2], [1, 3]]
    threads = {
        json.loads((run_dir / "experts" / f"expert-{k}" / "hddm_expert.json").read_text())["cpu_threads"]
        for k in range(4)
    }
    assert threads == {1}  # the actor's 2 CPUs shared by two trainings at a time, in the forked processes
    assert (run_dir / "samples.png").exists() and (run_dir / "config.yaml").exists()
    assert len(list((tmp_path / "node-cache" / "work").glob("expert-*.json"))) == 4  # each expert kept as it ended
