"""A real deployment on loopback: flower-superlink with TLS and SuperNode authentication, authenticated SuperNodes,
the app submitted with `flwr run` (port 19400 and the next few, a private FLWR_HOME, every process stopped by its
PID), then its fault drill. Slow (about 3 minutes), so marked `deploy`; it runs by default."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.deploy, pytest.mark.timeout(600)]

TWO = "num_experts=2 objectives={ddpm: 1, fm: 1, ddpm_clusters: [1]} router.steps=3"


@pytest.fixture(autouse=True)
def _tools():
    import shutil

    for tool in ("openssl", "ssh-keygen"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is needed for the deployment tests")


def test_deployment_script_with_tls_node_auth_and_its_fault_drill(tiny_config_path, dataset_dir, cache_dir,
                                                                   tmp_path):
    """`scripts/deploy-loopback-tls.sh 2 --drill`: a TLS SuperLink with SuperNode authentication and 2 registered
    SuperNodes; a SuperNode with an unregistered key is refused; the run starts, one SuperNode is SIGKILLed
    mid-training and ends up in `missing` while the run completes; restarted (same key, same work-dir), a second
    run that targets only its expert resumes from the last local checkpoint, and the run directory ends with both
    experts trained end to end. Every process the script started is gone afterwards."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    res = subprocess.run([str(ROOT / "scripts" / "deploy-loopback-tls.sh"), "2", "0", "--work", str(tmp_path),
                          "--config", str(tiny_config_path), "--cache-dir", str(cache_dir),
                          "--overrides", f"{TWO} federation.min_experts=2", "--drill"],
                         env=env, capture_output=True, text=True, timeout=560)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert "run status: finished:completed" in res.stdout
    out = json.loads((tmp_path / "deploy.json").read_text())

    # the deployment: TLS, two registered keys, in the end two experts
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert sorted((e["expert_id"], e["objective"]) for e in report["experts"]) == [(0, "fm"), (1, "ddpm")]
    assert report["missing"] == []
    superlink_log = (tmp_path / "superlink.log").read_text()
    assert f"Uvicorn running on https://127.0.0.1:{out['port']}" in superlink_log  # TLS
    assert superlink_log.count("[ControlServicer.RegisterNode] Created node_id") == 2  # two registered keys
    assert (tmp_path / "node-0.pub").read_text().startswith("ecdsa-sha2-nistp384 ")  # what an institution sends

    # the drill
    drill = out["drill"]
    assert drill["intruder_refused"]
    assert "[code: 2004] Failed to activate SuperNode" in (tmp_path / "intruder.log").read_text()
    killed = drill["killed_run"]
    assert killed["status"] == "finished:completed"
    assert [e["expert_id"] for e in killed["report"]["experts"]] == [0]
    (lost,) = killed["report"]["missing"]
    assert lost["expert_id"] == 1 and "error reply (code 5)" in lost["reason"], lost  # the SuperLink noticed
    resumed = drill["resumed_run"]
    assert resumed["status"] == "finished:completed"
    assert [e["expert_id"] for e in resumed["report"]["experts"]] == [0, 1] and resumed["report"]["missing"] == []
    assert resumed["report"]["flower"]["trained"] == [1]
    assert resumed["expert"]["steps"] == 300 and 10 <= resumed["expert"]["resumed_steps"] < 300
    in_report = resumed["report"]["experts"][1]
    assert in_report["resumed_steps"] == resumed["expert"]["resumed_steps"]
    assert in_report["weights_bytes"] == (tmp_path / "run" / "experts" / "expert-1" /
                                          "diffusion_pytorch_model.safetensors").stat().st_size
    assert in_report["weights_dtype"] == resumed["expert"]["weights_dtype"]
    assert not list((tmp_path / "run" / "experts").glob(".*"))  # no spooled or incoming file left behind
    logs = "".join(p.read_text(errors="replace") for p in tmp_path.glob("run-*.log"))
    assert logs.count("(spooled to disk)") == 2  # flwr's HttpGrid: both experts written to disk as they arrived
    assert not _running(tmp_path)  # everything it started is gone


def _running(work: Path) -> list[str]:
    """Processes of this deployment still alive (their command lines name its work directory)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if str(work) in line and "pytest" not in line]
