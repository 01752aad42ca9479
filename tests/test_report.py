"""The report of an assembled run (hddm_flower.report via the assemble stage) and the ServerApp's summary metrics."""

import json

import pytest

from hddm_flower.checkpoints import save_expert
from hddm_flower.data import read_meta
from hddm_flower.stages.assemble import finish_run
from hddm_flower.stages.expert import build_expert
from hddm_flower.stages.prepare import assign_objectives


@pytest.fixture(scope="module")
def report_run(tiny_config, dataset_dir, tmp_path_factory):
    """Experts 0 and 1 (untrained: the report's layout does not need trained ones) assembled with 2 and 3 missing."""
    import torch

    run = tmp_path_factory.mktemp("run")
    objectives = assign_objectives(tiny_config, dataset_dir)
    for k in (0, 1):
        torch.manual_seed(k)
        expert, model_config, meta = build_expert(tiny_config, read_meta(dataset_dir), objectives[k], expert_id=k)
        meta |= {"expert_id": k, "cluster_id": k, "steps": 3, "images_seen": 12, "device_seconds": 0.5}
        save_expert(run / "experts" / f"expert-{k}", expert.net.transformer.state_dict(), model_config, meta)
    missing = [{"expert_id": 2, "reason": "error reply (code 2)"}, {"expert_id": 3, "reason": "no reply within 2 s"}]
    return run, finish_run(tiny_config, run, dataset_dir, missing)


def test_report_json_names_experts_missing_metrics_and_versions(report_run):
    run, returned = report_run
    report = json.loads((run / "report.json").read_text())
    assert report == json.loads(json.dumps(returned)) and report["num_experts"] == 4
    assert [(e["expert_id"], e["objective"]) for e in report["experts"]] == [(0, "fm"), (1, "ddpm")]
    for e in report["experts"]:
        assert {"expert_id", "objective", "cluster_id", "steps", "images_seen", "device_seconds", "sha256"} <= set(e)
    assert [m["expert_id"] for m in report["missing"]] == [2, 3]
    assert {"metrics", "versions", "dataset", "config"} <= set(report) and report["versions"]["flwr"] == "1.42.0"
    assert report["metrics"]["feature_network"].startswith("hddm feature classifier")


def test_report_md_grids_and_plots_are_written(report_run):
    run, report = report_run
    md = (run / "report.md").read_text()
    assert md.startswith("# hddm-flower run") and "2 of 4 experts" in md
    assert "- expert 2: error reply (code 2)" in md and "- expert 3: no reply within 2 s" in md
    assert "FID/KID features: **hddm feature classifier" in md  # every result names its feature network
    assert "![samples](samples.png)" in md and (run / "samples.png").stat().st_size > 0
    ev = report["metrics"]["evaluation"]
    for name in ev["plots"].values():
        assert (run / name).stat().st_size > 0
    assert all((run / g["file"]).is_file() for g in ev["grids"])
    assert (run / "router" / "config.json").exists()


def test_server_summary_metrics_follow_the_configured_times():
    """evaluation.times need not contain 0.5 (the ServerApp indexed it with .index(0.5) and crashed)."""
    from strategies.server_app import summary_metrics

    report = {"metrics": {"times": [0.2, 0.8], "router_top1_accuracy": [0.9, 0.4], "ensemble_velocity_mse": [1.0, 2.0]}}
    assert summary_metrics(report) == {
        "router-top1-accuracy-t0.2": 0.9,
        "ensemble-velocity-mse-t0.2": 1.0,
        "router-top1-accuracy-t0.8": 0.4,
        "ensemble-velocity-mse-t0.8": 2.0,
    }
