"""The ServerApp: assign experts, collect them one shot, then assemble, evaluate and sample the ensemble."""

from __future__ import annotations

import json
from collections.abc import Iterable
from logging import INFO
from pathlib import Path

from flwr.app import Context
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from hddm_flower.accept import ExpertStore
from hddm_flower.config.io import load_config, parse_overrides
from hddm_flower.config.rules import ConfigError
from hddm_flower.config.schema import Config
from hddm_flower.data import Dataset
from hddm_flower.data.layout import is_prepared
from hddm_flower.devices import coordinator_threads
from hddm_flower.logs import quiet_libraries
from hddm_flower.rundir import (
    CONFIG,
    REPORT_JSON,
    check_rerun,
    missing_experts,
    present_experts,
    trained_objectives,
    write_config,
)
from hddm_flower.stages.expert import expert_spec
from hddm_flower.stages.prepare import assign_objectives, prepare_data
from hddm_flower.stages.rounds import finish_federated

from .gather_declarations import DESCRIPTOR, gather_declarations
from .one_shot import OneShotExperts
from .router_rounds import FlowerRounds

APP_DIR = Path(__file__).resolve().parent.parent
app = ServerApp()
quiet_libraries()  # no third-party progress bars or warnings in the Flower log
NOT_TRAINED = "not trained in this run"  # the reason of an absent expert this run did not target


def resolve_run(run_config: dict, run_id: int) -> tuple[Config, Path, Path, str]:
    """Config, config file path and run directory from Flower's run config (see pyproject.toml)."""
    path = Path(str(run_config.get("config", "configs/default.yaml")))
    path = path if path.is_absolute() else APP_DIR / path
    cfg = load_config(path, parse_overrides(str(run_config.get("overrides", ""))))
    run_dir = str(run_config.get("run-dir", ""))
    if run_dir and not Path(run_dir).is_absolute():
        raise ConfigError(
            f"run-dir must be an absolute path (the ServerApp's working directory is the SuperLink's), got {run_dir!r}"
        )
    run_dir = Path(run_dir) if run_dir else Path.home() / "hddm-runs" / f"run-{run_id}"
    return cfg, path, run_dir, str(run_config.get("cache-dir", ""))


def parse_expert_ids(text: str, num_experts: int) -> list[int] | None:
    """The run config's ``experts`` ("" = all; "3" or "1,5" = only these ids, e.g. the ones a run lost)."""
    if not str(text).strip():
        return None
    try:
        ids = sorted({int(x) for x in str(text).replace(" ", "").split(",")})
    except ValueError:
        raise ConfigError(f'run config experts={text!r}: expected expert ids separated by commas, e.g. "1,5"') from None
    bad = [k for k in ids if not 0 <= k < num_experts]
    if bad:
        raise ConfigError(f"run config experts={text!r}: ids {bad} outside 0..{num_experts - 1}")
    return ids


def summary_metrics(report: dict) -> dict[str, float]:
    """The ServerApp's evaluation metrics for Flower's result: router accuracy and ensemble velocity error at each
    diagnostic time of ``evaluation.times`` (whichever times the config chose)."""
    m = report["metrics"]
    out = {}
    for i, t in enumerate(m["times"]):
        for key, name in (
            ("router_top1_accuracy", "router-top1-accuracy"),
            ("ensemble_velocity_mse", "ensemble-velocity-mse"),
        ):
            if m[key][i] is not None:  # None: skipped (a coordinator without data has no velocity diagnostics)
                out[f"{name}-t{t:g}"] = float(m[key][i])
    return out


def earlier_descriptor(run_dir: Path, present: Iterable[int]) -> Dataset | None:
    """The descriptor an earlier run into ``run_dir`` wrote, when that run left experts (``present``): a late
    joiner's re-run must match the run's data as it is. A run without experts binds nothing (its nodes may have
    prepared their data again)."""
    folder = run_dir / DESCRIPTOR
    return Dataset.open(folder) if list(present) and is_prepared(folder) else None


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg, path, run_dir, cache_dir = resolve_run(dict(context.run_config), context.run_id)
    threads = coordinator_threads(cfg.coordinator.threads)  # not every core of the machine: spinning stalls
    targets = parse_expert_ids(str(context.run_config.get("experts", "")), cfg.num_experts)
    check_rerun(run_dir, cfg, targets)
    present = present_experts(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not (run_dir / CONFIG).exists() or targets is None:
        write_config(run_dir / CONFIG, cfg, f"resolved from {path}")
    log(INFO, "hddm-flower: run directory %s (coordinator: %d torch threads)", run_dir, threads)

    f = cfg.federation
    institutions = None
    if cfg.data.partition == "institution":  # the nodes' own data: declarations, no copy on the coordinator
        fixed = {k: o for k, o in enumerate(trained_objectives(run_dir, [""] * cfg.num_experts)) if o}
        earlier = earlier_descriptor(run_dir, present)
        institutions = gather_declarations(grid, cfg, run_dir, timeout=f.train_timeout, fixed=fixed, earlier=earlier)
        dataset, objectives = Dataset.open(institutions.descriptor), institutions.objectives
        targets = [k for k in (range(cfg.num_experts) if targets is None else targets) if k in institutions.nodes]
        targets = [k for k in targets if k not in present]
    else:
        dataset = prepare_data(cfg, cache_dir or None)  # the coordinator's copy (router training, evaluation)
        objectives = assign_objectives(cfg, dataset)
    strategy = OneShotExperts(
        ExpertStore(run_dir, expert_spec(cfg, dataset)),
        cfg.to_dict(),
        objectives,
        min_nodes=f.min_nodes,
        min_experts=f.min_experts,
        node_wait_timeout=f.node_wait_timeout,
        message_ttl=f.message_ttl or None,
        cache_dir=cache_dir,
        experts=targets,
        present=present,
        expert_nodes=f.expert_nodes,
        nodes=None if institutions is None else institutions.nodes,
    )

    def ensemble_fn(received: dict, missing: dict) -> dict:
        log(INFO, "hddm-flower: training the router, assembling %d experts, sampling", len(received) + len(present))
        clusters = strategy.assignment
        if institutions is not None:  # every node that declared and whose expert is here, late joiners included
            clusters = institutions.clusters(present_experts(run_dir))
        report = finish_federated(
            FlowerRounds(grid, timeout=f.train_timeout, cache_dir=cache_dir),
            cfg,
            run_dir,
            dataset,
            clusters,
            missing_experts(run_dir, cfg.num_experts, missing, default=NOT_TRAINED),
            extra={
                "flower": {
                    "run_id": context.run_id,
                    "trained": strategy.targets,
                    "assignment": {str(n): e for n, e in strategy.assignment.items()},
                }
            }
            | ({"institutions": institutions.record()} if institutions is not None else {}),
        )
        log(INFO, "hddm-flower: report written to %s", run_dir / REPORT_JSON)
        return summary_metrics(report)

    try:
        strategy.start(grid, timeout=f.train_timeout, ensemble_fn=ensemble_fn)
    except RuntimeError:
        (run_dir / REPORT_JSON).write_text(
            json.dumps(
                {
                    "status": "failed",
                    "experts": list(strategy.received.values()),
                    "missing": missing_experts(run_dir, cfg.num_experts, strategy.missing, default=NOT_TRAINED),
                },
                indent=2,
            )
        )
        raise
