"""The loopback deployment's harness: a CA and certificates, ``flower-superlink`` with TLS and SuperNode
authentication, registered SuperNodes, runs submitted and watched with ``flwr``, and every process it started
stopped by its PID (:class:`Deployment`); free ports (:func:`free_ports`)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

APP = Path(__file__).resolve().parent.parent.parent  # the app (the repository root)
BIN = Path(sys.executable).parent  # flower-superlink, flower-supernode and flwr of this environment
CONNECTION = "loopback-tls"


class DeploymentError(RuntimeError):
    pass


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(first: int = 19400, last: int = 19499, width: int = 10) -> int:
    """The first port p in [first, last] with p … p + width − 1 all free (a SuperLink, an intruder and SuperNodes
    use p, p + 2 and p + 3 + k), so that two deployments on one machine never meet."""
    for p in range(first, last - width + 2, width):
        if all(port_free(q) for q in range(p, p + width)):
            return p
    raise DeploymentError(f"no {width} free ports in {first}..{last}")


class Deployment:
    """Processes of one loopback deployment under ``work``; ``port`` is the SuperLink's, the SuperNodes' local
    ClientApp ports follow it (``port + 3 + k``)."""

    def __init__(self, work: str | os.PathLike, port: int = 19400, *, quiet: bool = True, database: Path | None = None):
        self.work, self.port, self.quiet = Path(work), port, quiet
        self.database = database  # the SuperLink's SQLite state (None: in memory, lost when it stops)
        self.work.mkdir(parents=True, exist_ok=True)
        self.env = dict(
            os.environ,
            FLWR_HOME=str(self.work / "flwr"),
            FLWR_TELEMETRY_ENABLED="0",
            FLWR_DISABLE_UPDATE_CHECK="1",
            FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
            PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        )
        self.procs: dict[str, subprocess.Popen] = {}

    # -- certificates and keys ---------------------------------------------------------------------------------

    def certificates(self) -> None:
        """A CA and a server certificate for localhost / 127.0.0.1, and the flwr connection that trusts the CA."""
        w = self.work
        self._sh(
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=hddm-loopback-ca",
        )
        self._sh(
            "openssl",
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        )
        (w / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
        self._sh(
            "openssl",
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        )
        (w / "flwr").mkdir(exist_ok=True)
        (w / "flwr" / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{self.port}"\nroot-certificates = "{w / "ca.crt"}"\n'
        )

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

    def start_superlink(self, timeout: float = 60.0, *, restart: bool = False) -> None:
        """Start the SuperLink and wait until its control API answers. ``restart``: the port was this deployment's
        SuperLink's a moment ago (its closed connections may still hold it), so it is not checked."""
        if not restart and not port_free(self.port):  # never talk to somebody else's SuperLink
            raise DeploymentError(f"port {self.port} is already in use")
        self._start(
            "superlink",
            "flower-superlink",
            "--ssl-ca-certfile",
            "ca.crt",
            "--ssl-certfile",
            "server.pem",
            "--ssl-keyfile",
            "server.key",
            "--enable-supernode-auth",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--disable-runtime-dependency-installation",
            *(["--database", str(self.database)] if self.database else []),
        )
        deadline = time.monotonic() + timeout
        while True:
            self._alive("superlink")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise DeploymentError(
                        f"the SuperLink did not listen on port {self.port} within {timeout:.0f} s"
                    ) from None
                time.sleep(0.3)
        self._wait(
            lambda: self._try_flwr("supernode", "ls", CONNECTION, "--format", "json"),
            timeout,
            "the SuperLink's control API did not answer",
        )

    def start_supernode(self, name: str, key: Path, node_config: dict, local_port: int) -> subprocess.Popen:
        """Start an institution's SuperNode (its ClientApp's local API on ``local_port``)."""
        config = " ".join(f"{k}={json.dumps(v)}" for k, v in node_config.items())
        return self._start(
            name,
            "flower-supernode",
            "--root-certificates",
            "ca.crt",
            "--auth-supernode-private-key",
            str(key),
            "--superlink",
            f"127.0.0.1:{self.port}",
            "--port",
            str(local_port),
            "--node-config",
            config,
        )

    def children(self, name: str, program: str) -> list:
        """The running processes under started process ``name`` whose command line names ``program``."""
        import psutil

        def runs(p: psutil.Process) -> bool:
            try:
                return running(p) and any(program in c for c in p.cmdline())
            except (psutil.NoSuchProcess, psutil.ZombieProcess):  # exited since children() listed it: not running
                return False

        try:
            return [p for p in psutil.Process(self.procs[name].pid).children(recursive=True) if runs(p)]
        except psutil.NoSuchProcess:
            return []

    def kill_clientapps(self, name: str) -> int:
        """SIGKILL the ClientApp processes under SuperNode ``name`` (what the kernel's OOM killer does to a process
        that outgrows its memory); the SuperNode itself lives on. Returns how many were killed."""
        import psutil

        def is_clientapp(p: psutil.Process) -> bool:
            try:
                return any("flwr-clientapp" in part for part in p.cmdline())
            except (psutil.NoSuchProcess, psutil.ZombieProcess):  # exited since children() listed it: not running
                return False

        apps = [p for p in psutil.Process(self.procs[name].pid).children(recursive=True) if is_clientapp(p)]
        for p in apps:
            p.send_signal(signal.SIGKILL)
        return len(apps)

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
        except ProcessLookupError:  # the process group had already ended: stopped, which is what was asked
            return

    def close(self) -> None:
        for name in [n for n in self.procs if n != "superlink"] + ["superlink"]:
            self.stop(name)

    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- runs --------------------------------------------------------------------------------------------------

    def submit(self, run_config: dict) -> int:
        """``flwr run`` this app with ``run_config``; returns the run id."""
        text = " ".join(f"{k}={json.dumps(v)}" for k, v in run_config.items())
        out = self._flwr("run", str(APP), CONNECTION, "--run-config", text, "--format", "json")
        return int(json.loads(out)["run-id"])

    def run_status(self, run_id: int) -> str:
        """The run's status as ``flwr ls`` says ("" when the SuperLink does not know it)."""
        out = self._try_flwr("ls", CONNECTION, "--run-id", str(run_id), "--format", "json")
        runs = json.loads(out).get("runs", []) if out else []
        return runs[0]["status"] if runs else ""

    def stop_run(self, run_id: int) -> None:
        self._flwr("stop", str(run_id), CONNECTION)

    def wait_run(self, run_id: int, timeout: float = 600.0) -> str:
        """Wait until the run finished; returns its status (``finished:completed`` when it succeeded) and writes
        its ServerApp log to ``run-<id>.log``."""
        status = ""

        def finished() -> bool:
            nonlocal status
            status = self.run_status(run_id)
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
        proc = subprocess.Popen(
            cmd, cwd=self.work, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )  # its own process group: stopped with all it spawns
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


def running(p) -> bool:
    """Is psutil process ``p`` still running (a zombie is not: it only waits to be reaped)?"""
    import psutil

    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
