"""Real deployments on loopback: flower-superlink with TLS and SuperNode authentication, authenticated SuperNodes,
the app submitted with `flwr run` (ports 19400–19499, a private FLWR_HOME per deployment, every process stopped by
its PID). Slow (about a minute each), so marked `deploy`; they run by default."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.deploy, pytest.mark.timeout(600)]

_spec = importlib.util.spec_from_file_location("deploy_loopback", ROOT / "scripts" / "deploy_loopback.py")
deploy_loopback = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(deploy_loopback)

TWO = "num_experts=2 objectives={ddpm: 1, fm: 1, ddpm_clusters: [1]} router.steps=3"


@pytest.fixture(autouse=True)
def _tools():
    import shutil

    for tool in ("openssl", "ssh-keygen"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is needed for the deployment tests")


def test_deployment_script_trains_two_experts_with_tls_and_node_auth(tiny_config_path, dataset_dir, cache_dir,
                                                                      tmp_path):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    res = subprocess.run([str(ROOT / "scripts" / "deploy-loopback-tls.sh"), "2", "19400", "--work", str(tmp_path),
                          "--config", str(tiny_config_path), "--cache-dir", str(cache_dir),
                          "--overrides", f"{TWO} federation.min_experts=2"],
                         env=env, capture_output=True, text=True, timeout=540)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert "run status: finished:completed" in res.stdout
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert sorted((e["expert_id"], e["objective"]) for e in report["experts"]) == [(0, "fm"), (1, "ddpm")]
    assert report["missing"] == []
    superlink_log = (tmp_path / "superlink.log").read_text()
    assert "Uvicorn running on https://127.0.0.1:19400" in superlink_log  # TLS
    assert superlink_log.count("[ControlServicer.RegisterNode] Created node_id") == 2  # two registered keys
    assert not (tmp_path / "node-0").read_text().startswith("ssh-") and (tmp_path / "node-0.pub").exists()
    for name in ("superlink", "supernode-0", "supernode-1"):  # everything it started is gone
        assert not _running(tmp_path / "flwr", name)


def test_intruder_refused_lost_node_recorded_then_its_restart_resumes(tiny_config_path, dataset_dir, cache_dir,
                                                                      tmp_path):
    """One deployment, three events: a SuperNode with an unregistered key is refused; a SuperNode killed
    (SIGKILL, with its ClientApp) mid-training ends up in `missing` while the run completes with the other
    expert; restarted (same key, same work-dir), a run that targets only the missing expert resumes its training
    from the last local checkpoint and completes the ensemble."""
    port = 19420
    overrides = (f"{TWO} expert.steps=300 expert.checkpoint_every=10 expert.log_every=50 "
                 f"federation.min_nodes=2 federation.min_experts=1 federation.train_timeout=45")
    run_dir = tmp_path / "run"
    with deploy_loopback.Deployment(tmp_path, port) as d:
        d.certificates()
        d.start_superlink()
        keys = [d.node_key(f"node-{k}") for k in range(2)]
        for key in keys:
            d.register(key)

        def node(k):
            return d.start_supernode(f"supernode-{k}", keys[k], {"expert-id": k, "num-threads": 1,
                                                                 "cache-dir": str(cache_dir),
                                                                 "work-dir": str(tmp_path / f"work-{k}")},
                                     port + 3 + k)

        # an institution nobody registered: refused
        intruder = d.start_supernode("intruder", d.node_key("intruder"), {"expert-id": 1}, port + 9)
        for _ in range(60):
            if intruder.poll() is not None:
                break
            time.sleep(0.5)
        log = (tmp_path / "intruder.log").read_text()
        assert intruder.poll() not in (None, 0) and "Failed to activate" in log, log[-1500:]
        d.stop("intruder")

        node(0), node(1)
        d.wait_nodes(2)
        run_a = d.submit({"config": str(tiny_config_path), "run-dir": str(run_dir), "cache-dir": str(cache_dir),
                          "overrides": overrides})
        deadline = time.monotonic() + 240  # kill node 1 (SuperNode, SuperExec, ClientApp) at its first checkpoint
        while not list((tmp_path / "work-1").glob("expert-1-*.pt")):
            assert time.monotonic() < deadline, (tmp_path / "supernode-1.log").read_text()[-2000:]
            time.sleep(0.2)
        d.stop("supernode-1", signal.SIGKILL)
        assert d.wait_run(run_a, 400) == "finished:completed"
        report = json.loads((run_dir / "report.json").read_text())
        assert [e["expert_id"] for e in report["experts"]] == [0]
        (lost,) = report["missing"]
        assert lost["expert_id"] == 1 and ("no reply within 45 s" in lost["reason"] or "code 5" in lost["reason"])
        checkpoint = torch_step(next((tmp_path / "work-1").glob("expert-1-*.pt")))
        assert 0 < checkpoint < 300

        d.wait_offline(1)  # its key can activate again once the SuperLink saw the heartbeat lapse (≤ 60 s)
        node(1)  # the institution restarts its SuperNode: same key, same work-dir
        d.wait_nodes(2)
        run_b = d.submit({"config": str(tiny_config_path), "run-dir": str(run_dir), "cache-dir": str(cache_dir),
                          "overrides": overrides, "experts": "1"})
        assert d.wait_run(run_b, 400) == "finished:completed"
    report = json.loads((run_dir / "report.json").read_text())
    assert [e["expert_id"] for e in report["experts"]] == [0, 1] and report["missing"] == []
    meta = json.loads((run_dir / "experts" / "expert-1" / "hddm_expert.json").read_text())
    assert meta["steps"] == 300 and meta["resumed_steps"] >= checkpoint
    assert report["flower"]["trained"] == [1]


def torch_step(path: Path) -> int:
    import torch

    return int(torch.load(path, weights_only=True)["step"])


def _running(flwr_home: Path, name: str) -> bool:
    """Whether a process of this deployment is still alive (its command line names the private FLWR_HOME or it
    is the named process of this work directory)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return any(str(flwr_home.parent) in line and name in line for line in out.splitlines())
