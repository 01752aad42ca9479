#!/usr/bin/env python3
"""A real Flower deployment of this app on one machine: TLS, SuperNode authentication, N institutions.

What it does, in order (each step is a method of :class:`Deployment`, which the tests drive step by step):

1. creates a CA and a server certificate whose SAN matches the loopback address (a real coordinator uses a real
   CA and its public host name);
2. starts ``flower-superlink`` with TLS and ``--enable-supernode-auth`` (in-memory state, no runtime dependency
   installation);
3. for each institution k: makes an EC key pair (``ssh-keygen``: what the institution does; only ``node-k.pub``
   ever leaves it), registers the public key (``flwr supernode register``: what the coordinator does), and starts
   ``flower-supernode`` with the CA bundle, its private key and its ``--node-config`` (``expert-id``,
   ``cache-dir``, ``work-dir``; optionally ``data-dir`` and ``objective``);
4. submits the app with ``flwr run`` and waits for the run to finish (``flwr ls --run-id``: the exit code of
   ``flwr run`` does not say whether the run failed);
5. stops everything it started: each process was started in its own process group and is stopped by its PID.

Usage (the run directory, logs and keys stay in the work directory it prints)::

    python scripts/deploy_loopback.py --nodes 2 --port 19400
    python scripts/deploy_loopback.py --nodes 3 --config configs/default.yaml --overrides "expert.steps=30"
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

APP = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # flower-superlink, flower-supernode and flwr of this environment
CONNECTION = "loopback-tls"


class DeploymentError(RuntimeError):
    pass


class Deployment:
    """Processes of one loopback deployment under ``work``; ``port`` is the SuperLink's, the SuperNodes' local
    ClientApp ports follow it (``port + 3 + k``)."""

    def __init__(self, work: str | os.PathLike, port: int = 19400, *, quiet: bool = True):
        self.work, self.port, self.quiet = Path(work), port, quiet
        self.work.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ, FLWR_HOME=str(self.work / "flwr"), FLWR_TELEMETRY_ENABLED="0",
                        FLWR_DISABLE_UPDATE_CHECK="1", FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
                        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
        self.procs: dict[str, subprocess.Popen] = {}

    # -- certificates and keys ---------------------------------------------------------------------------------

    def certificates(self) -> None:
        """A CA and a server certificate for localhost / 127.0.0.1, and the flwr connection that trusts the CA."""
        w = self.work
        self._sh("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
                 "-days", "2", "-subj", "/CN=hddm-loopback-ca")
        self._sh("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
                 "-subj", "/CN=localhost")
        (w / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
        self._sh("openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "san.ext")
        (w / "flwr").mkdir(exist_ok=True)
        (w / "flwr" / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{self.port}"\nroot-certificates = "{w / "ca.crt"}"\n')

    def node_key(self, name: str) -> Path:
        """An institution's EC key pair (OpenSSH format); returns the private key's path (``.pub`` beside it)."""
        key = self.work / name
        if not key.exists():
            self._sh("ssh-keygen", "-q", "-t", "ecdsa", "-b", "384", "-N", "", "-f", str(key), "-C", name)
        return key

    def register(self, key: Path) -> None:
        """The coordinator registers an institution's public key (nothing else is exchanged)."""
        self._flwr("supernode", "register", f"{key}.pub", CONNECTION, "--name", key.name)

    # -- processes ---------------------------------------------------------------------------------------------

    def start_superlink(self, timeout: float = 60.0) -> None:
        self._start("superlink", "flower-superlink", "--ssl-ca-certfile", "ca.crt", "--ssl-certfile", "server.pem",
                    "--ssl-keyfile", "server.key", "--enable-supernode-auth", "--host", "127.0.0.1",
                    "--port", str(self.port), "--disable-runtime-dependency-installation")
        deadline = time.monotonic() + timeout
        while True:
            self._alive("superlink")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise DeploymentError(f"the SuperLink did not listen on port {self.port} within {timeout:.0f} s")
                time.sleep(0.3)
        self._wait(lambda: self._try_flwr("supernode", "ls", CONNECTION, "--format", "json"), timeout,
                   "the SuperLink's control API did not answer")

    def start_supernode(self, name: str, key: Path, node_config: dict, local_port: int) -> subprocess.Popen:
        """Start an institution's SuperNode (its ClientApp's local API on ``local_port``)."""
        config = " ".join(f"{k}={json.dumps(v)}" for k, v in node_config.items())
        return self._start(name, "flower-supernode", "--root-certificates", "ca.crt", "--auth-supernode-private-key",
                           str(key), "--superlink", f"127.0.0.1:{self.port}", "--port", str(local_port),
                           "--node-config", config)

    def nodes_online(self) -> int:
        out = self._try_flwr("supernode", "ls", CONNECTION, "--format", "json")
        nodes = json.loads(out).get("nodes", []) if out else []
        return sum(1 for n in nodes if str(n.get("status", "")).lower() == "online")

    def wait_nodes(self, n: int, timeout: float = 90.0) -> None:
        self._wait(lambda: self.nodes_online() >= n, timeout, f"{n} SuperNodes did not come online")

    def wait_offline(self, n: int, timeout: float = 120.0) -> None:
        """Wait until at most ``n`` nodes are online. A SuperNode that died stays "online" until its heartbeat
        lapses (flwr 1.42: 2 × 30 s); until then its key cannot activate again (exit code 305, [code: 2004])."""
        self._wait(lambda: self.nodes_online() <= n, timeout, f"the SuperLink still lists more than {n} nodes online")

    def stop(self, name: str, sig: int = signal.SIGTERM) -> None:
        """Stop one started process and everything it spawned (its process group, by its PID)."""
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass

    def close(self) -> None:
        for name in [n for n in self.procs if n != "superlink"] + ["superlink"]:
            self.stop(name)

    def __enter__(self) -> "Deployment":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- runs --------------------------------------------------------------------------------------------------

    def submit(self, run_config: dict) -> int:
        """``flwr run`` this app with ``run_config``; returns the run id."""
        text = " ".join(f"{k}={json.dumps(v)}" for k, v in run_config.items())
        out = self._flwr("run", str(APP), CONNECTION, "--run-config", text, "--format", "json")
        return int(json.loads(out)["run-id"])

    def wait_run(self, run_id: int, timeout: float = 600.0) -> str:
        """Wait until the run finished; returns its status (``finished:completed`` when it succeeded) and writes
        its ServerApp log to ``run-<id>.log``."""
        status = ""

        def finished() -> bool:
            nonlocal status
            out = self._try_flwr("ls", CONNECTION, "--run-id", str(run_id), "--format", "json")
            runs = json.loads(out).get("runs", []) if out else []
            status = runs[0]["status"] if runs else ""
            return status.startswith("finished")

        self._wait(finished, timeout, f"run {run_id} did not finish", interval=3.0)
        log = self._try_flwr("log", str(run_id), CONNECTION, "--show") or ""
        (self.work / f"run-{run_id}.log").write_text(log)
        return status

    # -- helpers -----------------------------------------------------------------------------------------------

    def _start(self, name: str, *cmd: str) -> subprocess.Popen:
        if name in self.procs and self.procs[name].poll() is None:
            raise DeploymentError(f"{name} is already running")
        log = open(self.work / f"{name}.log", "ab")
        proc = subprocess.Popen(cmd, cwd=self.work, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # its own process group: stopped with all it spawns
        log.close()
        self.procs[name] = proc
        return proc

    def _alive(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is not None:
            tail = (self.work / f"{name}.log").read_text(errors="replace")[-1500:]
            raise DeploymentError(f"{name} exited with code {proc.returncode}:\n{tail}")

    def _sh(self, *cmd: str) -> str:
        res = subprocess.run(cmd, cwd=self.work, env=self.env, capture_output=True, text=True)
        if res.returncode:
            raise DeploymentError(f"{shlex.join(cmd)} failed ({res.returncode}): {res.stderr.strip()[-500:]}")
        return res.stdout

    def _flwr(self, *args: str) -> str:
        return self._sh(str(BIN / "flwr"), *args)

    def _try_flwr(self, *args: str) -> str | None:
        res = subprocess.run([str(BIN / "flwr"), *args], cwd=self.work, env=self.env, capture_output=True, text=True)
        return res.stdout if res.returncode == 0 else None

    @staticmethod
    def _wait(ok, timeout: float, what: str, interval: float = 1.0) -> None:
        deadline = time.monotonic() + timeout  # (each flwr call costs a second of CPU: poll gently)
        while not ok():
            if time.monotonic() > deadline:
                raise DeploymentError(f"{what} within {timeout:.0f} s")
            time.sleep(interval)


def deploy(nodes: int, port: int, work: Path, *, config: str, overrides: str, cache_dir: Path,
           timeout: float = 900.0) -> tuple[str, Path]:
    """The whole story for ``nodes`` institutions (expert k on node k); returns the run status and directory."""
    with Deployment(work, port) as d:
        d.certificates()
        d.start_superlink()
        for k in range(nodes):
            key = d.node_key(f"node-{k}")
            d.register(key)
            d.start_supernode(f"supernode-{k}", key, {"expert-id": k, "num-threads": 1, "cache-dir": str(cache_dir),
                                                      "work-dir": str(work / f"work-{k}")}, port + 3 + k)
        d.wait_nodes(nodes)
        run_dir = work / "run"
        run_id = d.submit({"config": config, "run-dir": str(run_dir), "cache-dir": str(cache_dir),
                           "overrides": f"federation.min_nodes={nodes} {overrides}".strip()})
        return d.wait_run(run_id, timeout), run_dir


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--nodes", type=int, default=2, help="institutions (SuperNodes), one expert each")
    p.add_argument("--port", type=int, default=19400, help="SuperLink port; SuperNodes use port+3+k")
    p.add_argument("--work", type=Path, default=None, help="work directory (default: a new temporary one)")
    p.add_argument("--config", default="configs/default.yaml", help="experiment YAML (relative to the app)")
    p.add_argument("--overrides", default=None,
                   help="config overrides; default: a quick run with one DDPM expert and the rest FM")
    p.add_argument("--cache-dir", type=Path, default=None, help="dataset cache shared by all (default: in --work)")
    args = p.parse_args(argv)
    if args.nodes < 1:
        p.error("--nodes must be ≥ 1")
    for tool in ("openssl", "ssh-keygen"):
        if shutil.which(tool) is None:
            p.error(f"{tool} is not installed")
    work = args.work or Path(tempfile.mkdtemp(prefix="hddm-deploy-"))
    n = args.nodes
    overrides = args.overrides if args.overrides is not None else (
        f"num_experts={n} objectives={{ddpm: 1, fm: {n - 1}, ddpm_clusters: [0]}} expert.steps=30 router.steps=30 "
        f"sampling.num_steps=10 sampling.samples_per_prompt=2 federation.min_experts={n}")
    try:
        status, run_dir = deploy(n, args.port, work, config=args.config, overrides=overrides,
                                 cache_dir=args.cache_dir or work / "cache")
    except DeploymentError as e:
        print(f"deploy: error: {e} (logs in {work})", file=sys.stderr)
        return 1
    ok = status == "finished:completed" and (run_dir / "report.json").exists()
    print(f"run status: {status}; run directory: {run_dir}; logs: {work}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
