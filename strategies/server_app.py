"""The ServerApp: assign experts, collect them one shot, then assemble, evaluate and sample the ensemble."""

from __future__ import annotations

import json
from logging import INFO
from pathlib import Path

import yaml
from flwr.app import Context
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from hddm_flower.config import Config, ConfigError, load_config, parse_overrides
from hddm_flower.pipeline import assign_objectives, finish_run, prepare_data

from .one_shot import OneShotExperts

APP_DIR = Path(__file__).resolve().parent.parent
app = ServerApp()


def resolve_run(run_config: dict, run_id: int) -> tuple[Config, Path, Path, str]:
    """Config, config file path and run directory from Flower's run config (see pyproject.toml)."""
    path = Path(str(run_config.get("config", "configs/default.yaml")))
    path = path if path.is_absolute() else APP_DIR / path
    cfg = load_config(path, parse_overrides(str(run_config.get("overrides", ""))))
    run_dir = str(run_config.get("run-dir", ""))
    if run_dir and not Path(run_dir).is_absolute():
        raise ConfigError(f"run-dir must be an absolute path (the ServerApp's working directory is the "
                          f"SuperLink's), got {run_dir!r}")
    run_dir = Path(run_dir) if run_dir else Path.home() / "hddm-runs" / f"run-{run_id}"
    return cfg, path, run_dir, str(run_config.get("cache-dir", ""))


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg, path, run_dir, cache_dir = resolve_run(dict(context.run_config), context.run_id)
    if (run_dir / "experts").exists() and any((run_dir / "experts").iterdir()):
        raise ConfigError(f"run-dir {run_dir} already holds experts from another run; choose a new run-dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(f"# resolved from {path}\n" + yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    log(INFO, "hddm-flower: run directory %s", run_dir)

    dataset_dir = prepare_data(cfg, cache_dir or None)  # the coordinator's copy (router training, evaluation)
    objectives = assign_objectives(cfg, dataset_dir)
    f = cfg.federation
    strategy = OneShotExperts(run_dir, cfg.to_dict(), objectives, min_nodes=f.min_nodes, min_experts=f.min_experts,
                              node_wait_timeout=f.node_wait_timeout, message_ttl=f.message_ttl or None,
                              cache_dir=cache_dir)

    def ensemble_fn(received: dict, missing: dict) -> dict:
        log(INFO, "hddm-flower: training the router, assembling %d experts, sampling", len(received))
        report = finish_run(cfg, run_dir, dataset_dir,
                            [{"expert_id": k, "reason": r} for k, r in missing.items()],
                            extra={"flower": {"run_id": context.run_id,
                                              "assignment": {str(n): e for n, e in strategy.assignment.items()}}})
        log(INFO, "hddm-flower: report written to %s", run_dir / "report.json")
        m = report["metrics"]
        return {"router-top1-accuracy-t0.5": m["router_top1_accuracy"][m["times"].index(0.5)],
                "ensemble-velocity-mse-t0.5": m["ensemble_velocity_mse"][m["times"].index(0.5)]}

    try:
        strategy.start(grid, timeout=f.train_timeout, ensemble_fn=ensemble_fn)
    except RuntimeError:
        (run_dir / "report.json").write_text(json.dumps({
            "status": "failed", "experts": list(strategy.received.values()),
            "missing": [{"expert_id": k, "reason": r} for k, r in sorted(strategy.missing.items())]}, indent=2))
        raise
