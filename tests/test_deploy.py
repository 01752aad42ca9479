"""A real deployment on loopback: flower-superlink with TLS and SuperNode authentication, authenticated SuperNodes,
the app submitted with `flwr run` (port 19400 and the next few, a private FLWR_HOME, every process stopped by its
PID), then its fault drill. Slow (about 5 minutes), so marked `deploy`; it runs by default."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.deploy, pytest.mark.timeout(600)]

THREE = "num_experts=3 objectives={ddpm: 1, fm: 2, ddpm_clusters: [1]} router.steps=3"


@pytest.fixture(autouse=True)
def _tools():
    import shutil

    for tool in ("openssl", "ssh-keygen"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is needed for the deployment tests")


def test_deployment_script_with_tls_node_auth_and_its_fault_drill(tiny_config_path, dataset_dir, cache_dir, tmp_path):
    """`scripts/deploy-loopback-tls.sh 3 --drill`: a TLS SuperLink with SuperNode authentication and 3 registered
    SuperNodes; a SuperNode with an unregistered key is refused; the run starts, node 1's ClientApp is SIGKILLed
    (code 8) and node 2's SuperNode is SIGKILLed (code 5) mid-training, both end up in `missing` while the run
    completes; node 2 restarted (same key, same work-dir) and hostile (node config drill=hostile-router), a second
    run that targets experts 1 and 2 resumes both from their last local checkpoints, trains the router federated
    over nodes 1 and 2 in one round and drops node 2's router reply, naming it and why, and the run
    directory ends with all three experts trained end to end; a run
    whose message TTL (5 s) is shorter than its training records the expiry (code 3). Every process the script
    started is gone afterwards."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    res = _script(
        [
            str(ROOT / "scripts" / "deploy-loopback-tls.sh"),
            "3",
            "0",
            "--work",
            str(tmp_path),
            "--config",
            str(tiny_config_path),
            "--cache-dir",
            str(cache_dir),
            "--overrides",
            f"{THREE} federation.min_experts=3",
            "--drill",
        ],
        env,
        timeout=560,
    )
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert "run status: finished:completed" in res.stdout
    out = json.loads((tmp_path / "deploy.json").read_text())

    # the deployment: TLS, three registered keys, in the end three experts
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert sorted((e["expert_id"], e["objective"]) for e in report["experts"]) == [(0, "fm"), (1, "ddpm"), (2, "fm")]
    assert report["missing"] == []
    superlink_log = (tmp_path / "superlink.log").read_text()
    assert f"Uvicorn running on https://127.0.0.1:{out['port']}" in superlink_log  # TLS
    assert superlink_log.count("[ControlServicer.RegisterNode] Created node_id") == 3  # three registered keys
    assert (tmp_path / "node-0.pub").read_text().startswith("ecdsa-sha2-nistp384 ")  # what an institution sends

    # the drill
    drill = out["drill"]
    assert drill["intruder_refused"]
    assert "[code: 2004] Failed to activate SuperNode" in (tmp_path / "intruder.log").read_text()
    killed = drill["killed_run"]
    assert killed["status"] == "finished:completed" and drill["clientapps_killed"] == 1
    assert [e["expert_id"] for e in killed["report"]["experts"]] == [0]
    crashed, lost = killed["report"]["missing"]
    assert crashed["expert_id"] == 1 and "error reply (code 8)" in crashed["reason"], crashed  # the SuperNode
    assert "ClientApp stopped responding" in crashed["reason"]  # noticed its ClientApp died
    assert lost["expert_id"] == 2 and "error reply (code 5)" in lost["reason"], lost  # the SuperLink noticed
    resumed = drill["resumed_run"]
    assert resumed["status"] == "finished:completed"
    assert [e["expert_id"] for e in resumed["report"]["experts"]] == [0, 1, 2] and resumed["report"]["missing"] == []
    assert resumed["report"]["flower"]["trained"] == [1, 2]
    router = resumed["report"]["router"]  # node 2 sent a hostile router reply: dropped, with why
    assert router["training"] == "federated" and router["rounds"] == 1
    hostile = next(n for n, e in resumed["report"]["flower"]["assignment"].items() if e == [2])
    assert sorted(router["dropped_replies"]) == ["1"], router["dropped_replies"]
    for (why,) in router["dropped_replies"].values():
        assert why.startswith(f"node {hostile}: array ") and ", expected float32(" in why, why
    for k, expert in resumed["experts"].items():
        assert expert["steps"] == drill["steps"] and 10 <= expert["resumed_steps"] < drill["steps"], (k, expert)
        in_report = resumed["report"]["experts"][int(k)]
        assert in_report["resumed_steps"] == expert["resumed_steps"]
        assert (
            in_report["weights_bytes"]
            == (tmp_path / "run" / "experts" / f"expert-{k}" / "diffusion_pytorch_model.safetensors").stat().st_size
        )
        assert in_report["weights_dtype"] == expert["weights_dtype"]
    assert not list((tmp_path / "run" / "experts").glob(".*"))  # no spooled or incoming file left behind
    logs = "".join(p.read_text(errors="replace") for p in tmp_path.glob("run-*.log"))
    assert logs.count("(spooled to disk)") == 3  # flwr's HttpGrid: every expert written to disk as it arrived
    expired = drill["expired_run"]
    assert expired["status"] == "finished:failed" and expired["report"]["status"] == "failed"
    reason = expired["report"]["missing"][0]
    assert reason["expert_id"] == 0 and "error reply (code 3)" in reason["reason"], reason
    assert not list((tmp_path / "run-ttl" / "experts").glob("*"))
    assert not _running(tmp_path)  # everything it started is gone


@pytest.mark.drill
@pytest.mark.timeout(1500)
def test_coordinator_crash_drill(request, tiny_config_path, cache_dir, tmp_path):
    """`scripts/deploy-loopback-tls.sh 3 0 --crash-drill`: the SuperLink (on its state database) and the run's
    ServerApp are SIGKILLed while the three experts train; the SuperNodes train on and keep their experts; the
    SuperLink restarts, the SuperNodes reconnect by themselves, and a re-run into the same run directory installs
    the three kept experts (the same sha256) without a training step, and completes. Several minutes: opt-in with
    `pytest -m drill tests/test_deploy.py`."""
    if "drill" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("the coordinator crash drill takes minutes; run it with: pytest -m drill tests/test_deploy.py")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    res = _script(
        [
            str(ROOT / "scripts" / "deploy-loopback-tls.sh"),
            "3",
            "0",
            "--work",
            str(tmp_path),
            "--config",
            str(tiny_config_path),
            "--cache-dir",
            str(cache_dir),
            "--overrides",
            f"{THREE} federation.min_experts=3",
            "--crash-drill",
        ],
        env,
        timeout=1400,
    )
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    crash = json.loads((tmp_path / "deploy.json").read_text())["crash_drill"]
    assert crash["serverapps_killed"] == 1 and crash["coordinator_gone"]
    assert crash["supernodes_alive"] == [0, 1, 2]  # the SuperNodes outlived the coordinator …
    assert sorted(crash["kept_after_s"]) == ["0", "1", "2"]  # … finished training and kept their experts
    assert crash["reconnected_by_themselves"] and crash["supernodes_exited"] == []  # --database kept their keys
    collected = crash["collected_run"]
    assert collected["status"] == "finished:completed" and collected["report"]["missing"] == []
    assert [e["expert_id"] for e in collected["report"]["experts"]] == [0, 1, 2]
    assert all(collected["kept_sent"].values()) and not any(collected["training_steps"].values())
    assert all(collected["same_weights"].values())
    assert not _running(tmp_path)


def _script(cmd: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """Run the deployment script; past ``timeout`` it gets SIGTERM (it then stops every process it started) before
    the test fails, so that no SuperLink or SuperNode outlives the test."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"the deployment script ran past {timeout:.0f} s: {(out + err)[-2000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _running(work: Path) -> list[str]:
    """Processes of this deployment still alive (their command lines name its work directory)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if str(work) in line and "pytest" not in line]
