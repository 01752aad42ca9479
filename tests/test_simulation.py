"""One real Flower simulation (Ray, 2 SuperNodes, a few steps): the apps exactly as `flwr run .` loads them."""

import json

import pytest
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from clients.client_app import app as client_app
from strategies.server_app import main as server_main

pytestmark = pytest.mark.simulation


def test_simulation_two_nodes(tiny_config_path, cache_dir, tmp_path):
    run_dir = tmp_path / "run"
    run_config = {
        "config": str(tiny_config_path),
        "overrides": "num_experts=2 objectives={ddpm: 1, fm: 1, ddpm_clusters: [1]} federation.min_nodes=2",
        "run-dir": str(run_dir), "cache-dir": str(cache_dir),
    }
    server = ServerApp()

    @server.main()
    def _main(grid: Grid, context: Context) -> None:  # run_simulation passes an empty run config
        context.run_config.update(run_config)
        server_main(grid, context)

    run_simulation(server_app=server, client_app=client_app, num_supernodes=2,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": 2, "logging_level": "ERROR", "log_to_driver": False}})
    report = json.loads((run_dir / "report.json").read_text())
    assert sorted((e["expert_id"], e["objective"]) for e in report["experts"]) == [(0, "fm"), (1, "ddpm")]
    assert report["missing"] == [] and report["flower"]["assignment"]
    assert (run_dir / "samples.png").exists() and (run_dir / "config.yaml").exists()
