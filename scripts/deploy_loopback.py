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
5. with ``--drill`` the run is a fault drill instead (:func:`fault_drill`): a SuperNode with an unregistered key
   is refused; mid-training one node's ClientApp is SIGKILLed (code 8) and another node's SuperNode (code 5), and
   the run completes without their experts, saying why; a second run that targets only those experts resumes
   both from their local checkpoints, trains the router federated with one of them hostile (its router replies
   dropped, with the reason in the report) and completes the run directory with every expert; a run whose
   message TTL is shorter than its training records the expiry (code 3);
6. with ``--institution`` every node holds its own shard set and cache and the coordinator none
   (``data.partition: institution``, federated feature classifier, router and reference statistics); afterwards
   the coordinator's cache and run directory are checked for shards and latents;
7. with ``--crash-drill`` the run is the coordinator crash drill instead (:func:`crash_drill`): the SuperLink
   (state in ``work/state.db``; ``--superlink-state memory`` for none) and the run's ServerApp are SIGKILLed while
   every expert trains; the SuperNodes finish and keep their experts; after the SuperLink's restart a re-run into
   the same run directory collects the kept experts without a training step;
8. stops everything it started: each process was started in its own process group and is stopped by its PID.

Usage (the run directory, logs and keys stay in the work directory it prints)::

    python scripts/deploy_loopback.py --nodes 3 --port 19400 [--drill | --crash-drill]
    python scripts/deploy_loopback.py --nodes 3 --config configs/default.yaml --overrides "expert.steps=30"
    python scripts/deploy_loopback.py --nodes 3 --institution   # the coordinator holds no data
"""

from __future__ import annotations

import argparse
import contextlib
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
                return _running(p) and any(program in c for c in p.cmdline())
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
        except ProcessLookupError:
            pass

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


def deploy(
    nodes: int,
    port: int,
    work: Path,
    *,
    config: str,
    overrides: str,
    cache_dir: Path,
    timeout: float = 900.0,
    drill: bool = False,
    crash: bool = False,
    database: bool = True,
    data_dir: str = "",
    objectives: list[str] | None = None,
    institution: bool = False,
) -> dict:
    """The whole story for ``nodes`` institutions (expert k on node k), then optionally the fault drill; returns
    what happened (also written to ``work/deploy.json``). ``crash``: the coordinator crash drill instead
    (:func:`crash_drill`; its SuperLink keeps its state in ``work/state.db`` unless ``database`` is False)."""
    out: dict = {"nodes": nodes, "port": port, "work": str(work)}
    if institution:  # each node holds its own data; the coordinator's cache starts and must stay without samples
        shard_sets = institution_data(config, overrides, work)
        # a drill's budget: few rounds of the federated router and feature classifier (later overrides win)
        overrides = f"{INSTITUTION} router.rounds=2 evaluation.feature_steps=2 {overrides}".strip()
        cache_dir = work / "coordinator-cache"
        cache_dir.mkdir(parents=True, exist_ok=True)
    with Deployment(work, port, database=work / "state.db" if crash and database else None) as d:
        d.certificates()
        d.start_superlink()
        keys = [d.node_key(f"node-{k}") for k in range(nodes)]
        for key in keys:
            d.register(key)

        def node(k: int, drill: str = "") -> None:
            config = {
                "expert-id": k,
                "num-threads": 1,
                "cache-dir": str(cache_dir),
                "work-dir": str(work / f"work-{k}"),
            }
            if drill:  # this node misbehaves on purpose (clients/drill.py)
                config["drill"] = drill
            if data_dir:  # the institution's own prepared data
                config["data-dir"] = data_dir
            if institution:  # its own shard set and cache, nothing shared with the coordinator
                config |= {"shard-set": shard_sets[k], "cache-dir": str(work / f"node-{k}-cache")}
            if objectives and objectives[k]:  # the institution insists on its objective
                config["objective"] = objectives[k]
            d.start_supernode(f"supernode-{k}", keys[k], config, port + 3 + k)

        for k in range(nodes):
            node(k)
        d.wait_nodes(nodes)
        run_config = {"config": config, "cache-dir": str(cache_dir)}
        if drill:  # the run goes through a crash and a restart, and ends with every expert
            out["drill"] = fault_drill(d, nodes, node, run_config, overrides, work, timeout)
            out["run"] = {"status": out["drill"]["resumed_run"]["status"], "run_dir": str(work / "run")}
        elif crash:  # the coordinator crashes mid-training; a re-run collects what the nodes kept
            out["crash_drill"] = crash_drill(d, nodes, node, run_config, overrides, work, timeout)
            out["run"] = {"status": out["crash_drill"]["collected_run"]["status"], "run_dir": str(work / "run")}
        else:
            run_id = d.submit(
                run_config
                | {"run-dir": str(work / "run"), "overrides": f"federation.min_nodes={nodes} {overrides}".strip()}
            )
            out["run"] = {"status": d.wait_run(run_id, timeout), "run_dir": str(work / "run")}
    if institution:
        out["institution"] = {
            "coordinator_cache": str(cache_dir),
            "samples_on_coordinator": [str(p) for p in sample_files(cache_dir) + sample_files(work / "run")],
        }
    (work / "deploy.json").write_text(json.dumps(out, indent=2))
    return out


INSTITUTION = "data.partition=institution router.training=federated evaluation.reference=federated"
SAMPLE_FILES = (".tar", ".npy", ".latent.npy")  # shards and latents (the run directory's PNGs are its own samples)


def institution_data(config: str, overrides: str, work: Path) -> list[str]:
    """The institutions' own data for an ``--institution`` run: the embedded dataset of the run's config prepared
    in ``work/institutions-data`` (standing in for data the institutions hold), one ``cluster-k`` shard set per
    node; the coordinator is never given this path."""
    sys.path.insert(0, str(APP))
    from hddm_flower.config.io import load_config, parse_overrides
    from hddm_flower.data.layout import cluster_dir
    from hddm_flower.stages.prepare import prepare_data

    cfg = load_config(APP / config, parse_overrides(overrides))
    prepared = prepare_data(cfg, work / "institutions-data")
    return [str(cluster_dir(prepared.root, k)) for k in range(cfg.num_experts)]


def sample_files(root: Path) -> list[Path]:
    """Shards and latents under ``root``: what a coordinator without data must not hold."""
    return [p for p in root.rglob("*") if p.is_file() and p.name.endswith(SAMPLE_FILES)] if root.exists() else []


def fault_drill(d: Deployment, nodes: int, node, run_config: dict, overrides: str, work: Path, timeout: float) -> dict:
    """On the running deployment (≥ 3 nodes):

    1. a SuperNode with an unregistered key must be refused;
    2. the run starts; at their first local checkpoints, node n−2's ClientApp process is SIGKILLed (what the
       kernel's OOM killer does; its SuperNode lives on) and node n−1's SuperNode is SIGKILLed with everything it
       started (the machine is gone): the run must complete without those two experts and say why (code 8 and
       code 5);
    3. node n−1's SuperNode restarted with the same key and work-dir, now hostile (node config
       ``drill=hostile-router``, :mod:`clients.drill`: its router replies carry an array of another shape), a
       second run into the same run directory that targets only those two experts and trains the router federated
       (one round over the nodes it assigned) must resume both trainings from their checkpoints, drop the hostile
       node's router reply with its reason, and complete the ensemble with a report that says so;
    4. meanwhile, on the node the second run leaves idle, a run whose train message lives 5 s
       (``federation.message_ttl``), less than its training takes, must record the expert as expired (code 3) and
       fail for want of experts, with the reason in its report."""
    result: dict = {}
    intruder = d.start_supernode("intruder", d.node_key("intruder"), {"expert-id": 0}, d.port + 2)
    try:
        intruder.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pass
    log = (work / "intruder.log").read_text(errors="replace")
    result["intruder_refused"] = intruder.poll() not in (None, 0) and "Failed to activate" in log
    d.stop("intruder")

    crashed, lost = nodes - 2, nodes - 1
    run_dir = work / "run"
    # the train timeout is generous: the SuperNode reports the dead ClientApp (code 8) and the SuperLink the dead
    # node (code 5) ≤ 60 s after the kills, so the run does not wait for them, and a slow machine does not turn the
    # live node into a timeout
    drill = (
        f"{overrides} federation.min_nodes={nodes} federation.min_experts=1 federation.train_timeout=180 "
        f"expert.steps=1000 expert.checkpoint_every=10 expert.log_every=500"
    )
    run_a = d.submit(run_config | {"run-dir": str(run_dir), "overrides": drill})
    deadline = time.monotonic() + timeout
    for k in (crashed, lost):
        while not list((work / f"work-{k}").glob(f"expert-{k}-*.pt")):
            if time.monotonic() > deadline:
                raise DeploymentError(f"node {k} never wrote a training checkpoint")
            time.sleep(0.2)
    result["clientapps_killed"] = d.kill_clientapps(f"supernode-{crashed}")
    d.stop(f"supernode-{lost}", signal.SIGKILL)  # the machine is gone: SuperNode, SuperExec and ClientApp
    result["killed_run"] = {
        "status": d.wait_run(run_a, timeout),
        "report": json.loads((run_dir / "report.json").read_text()),
    }
    d.wait_offline(nodes - 1)  # until then the SuperLink refuses the same key (exit 305, code 2004)
    node(lost, drill=HOSTILE)  # the institution restarts its SuperNode: same key, same work-dir, and now hostile
    d.wait_nodes(nodes)
    federated = f"{drill} router.training=federated router.rounds=1"
    run_b = d.submit(run_config | {"run-dir": str(run_dir), "overrides": federated, "experts": f"{crashed},{lost}"})
    # at the same time, on node 0 (which run_b leaves idle): a run whose train message expires before its reply
    expired_dir = work / "run-ttl"
    run_c = d.submit(
        run_config
        | {
            "run-dir": str(expired_dir),
            "experts": "0",
            "overrides": f"{overrides} federation.min_nodes={nodes} federation.min_experts=1 "
            f"federation.message_ttl=5 expert.steps=1500 expert.log_every=1000",
        }
    )
    result["resumed_run"] = {
        "status": d.wait_run(run_b, timeout),
        "report": json.loads((run_dir / "report.json").read_text()),
        "experts": {
            str(k): json.loads((run_dir / "experts" / f"expert-{k}" / "hddm_expert.json").read_text())
            for k in (crashed, lost)
        },
    }
    result["expired_run"] = {
        "status": d.wait_run(run_c, timeout),
        "report": json.loads((expired_dir / "report.json").read_text()),
    }
    return result


HOSTILE = "hostile-router"  # the drill's hostile node (clients/drill.py)
CRASH_STEPS = 2000  # long enough to kill the coordinator mid-training, short enough for a drill


def crash_drill(d: Deployment, nodes: int, node, run_config: dict, overrides: str, work: Path, timeout: float) -> dict:
    """The coordinator crashes while every expert trains; the nodes keep training and keep their experts; after a
    restart, a plain re-run into the same run directory collects them without training again.

    1. a run starts (checkpoint every 50 steps, so that each node keeps its training state and its final expert
       in its work directory); once every node has written a training checkpoint, the SuperLink is SIGKILLed with
       everything it started (its SuperExec and the run's ServerApp: the coordinator's machine is gone);
    2. the SuperNodes live on and their ClientApps finish training (each keeps its final expert, keyed by expert
       id and a hash of the training configuration, objective and data); the drill waits for all of them;
    3. the SuperLink restarts on the same state database (``--database``: the registered node keys and node ids
       survive, so the SuperNodes reconnect by themselves); the dead run is stopped (``flwr stop``) unless the
       SuperLink marked it failed already. With an in-memory SuperLink (``database`` None) the coordinator
       registers the keys again and restarts the SuperNodes that exited, as the institutions would;
    4. the same run config is submitted again into the same run directory (it holds no expert): every node
       answers with the expert it kept, no training step runs, and the run completes with every expert."""
    result: dict = {}
    run_dir = work / "run"
    crash = (
        f"{overrides} federation.min_nodes={nodes} federation.min_experts={nodes} federation.train_timeout=300 "
        f"expert.steps={CRASH_STEPS} expert.checkpoint_every=50 expert.log_every=100"
    )
    config = run_config | {"run-dir": str(run_dir), "overrides": crash}
    started = time.monotonic()
    run_a = d.submit(config)
    deadline = started + timeout
    for k in range(nodes):  # every node is training
        while not list((work / f"work-{k}").glob(f"expert-{k}-*.pt")):
            if time.monotonic() > deadline:
                raise DeploymentError(f"node {k} never wrote a training checkpoint")
            time.sleep(0.2)
    serverapps = d.children("superlink", "flwr-serverapp")
    result["serverapps_killed"] = len(serverapps)
    coordinator = d.children("superlink", "")  # the SuperExec and the ServerApp run in process groups of their own
    d.stop("superlink", signal.SIGKILL)  # the coordinator's machine is gone: SuperLink, SuperExec, ServerApp
    for p in coordinator:
        with contextlib.suppress(Exception):  # gone already
            p.kill()
    time.sleep(1.0)
    result["superlink_state"] = str(d.database) if d.database else "memory"
    result["coordinator_gone"] = not any(_running(p) for p in serverapps)
    result["killed_after_s"] = round(time.monotonic() - started, 1)
    trained: dict[int, float] = {}
    while len(trained) < nodes:  # the nodes train on, and keep what they trained
        for k in range(nodes):
            if k not in trained and list((work / f"work-{k}").glob(f"expert-{k}-*.json")):
                trained[k] = round(time.monotonic() - started, 1)
        if time.monotonic() > deadline:
            raise DeploymentError(f"nodes {sorted(set(range(nodes)) - set(trained))} never kept a trained expert")
        time.sleep(0.5)
    result["kept_after_s"] = trained
    result["supernodes_alive"] = [k for k in range(nodes) if d.procs[f"supernode-{k}"].poll() is None]
    marks = {k: (work / f"supernode-{k}.log").stat().st_size for k in range(nodes)}
    result["training_s"] = max(trained.values())
    restart = time.monotonic()
    d.start_superlink(restart=True)
    if d.database is None:  # an in-memory SuperLink starts empty: the coordinator registers the keys again
        for k in range(nodes):
            d.register(d.node_key(f"node-{k}"))
    try:
        d.wait_nodes(nodes, timeout=120)  # do the SuperNodes reconnect by themselves?
        result["reconnected_by_themselves"] = True
    except DeploymentError:
        result["reconnected_by_themselves"] = False
    result["supernodes_exited"] = [k for k in range(nodes) if d.procs[f"supernode-{k}"].poll() is not None]
    for k in result["supernodes_exited"]:  # the institution restarts its SuperNode: same key, same work-dir
        node(k)
    if not result["reconnected_by_themselves"]:
        d.wait_nodes(nodes, timeout=120)
    result["reconnected_s"] = round(time.monotonic() - restart, 1)
    result["dead_run_status"] = d.run_status(run_a)
    if result["dead_run_status"] and not result["dead_run_status"].startswith("finished"):  # still "running"
        d.stop_run(run_a)
    collect = time.monotonic()
    run_b = d.submit(config)
    asked: dict[int, float] = {}  # node k → when its SuperNode received the re-run's train message
    installed: dict[int, float] = {}  # expert k → when its folder appeared in the run directory
    while len(installed) < nodes and time.monotonic() < collect + timeout:
        for k in range(nodes):
            log = work / f"supernode-{k}.log"
            if k not in asked and "Receiving: train message" in log.read_text(errors="replace")[marks[k] :]:
                asked[k] = time.monotonic()
            if k not in installed and (run_dir / "experts" / f"expert-{k}").is_dir():
                installed[k] = time.monotonic()
        time.sleep(0.5)
    result["collect_s"] = round(time.monotonic() - collect, 1)  # submitted → every expert installed
    # train message received by the node → its expert installed on the server: what answering took the node
    result["answer_s"] = {k: round(installed[k] - asked[k], 1) for k in installed if k in asked}
    status = d.wait_run(run_b, timeout)
    result["rerun_s"] = round(time.monotonic() - collect, 1)  # … → router, evaluation and report done
    logs = {k: (work / f"supernode-{k}.log").read_text(errors="replace")[marks[k] :] for k in range(nodes)}
    result["collected_run"] = {
        "status": status,
        "report": json.loads((run_dir / "report.json").read_text()),
        "kept_sent": {k: "sending the kept checkpoint" in log for k, log in logs.items()},
        "same_weights": {  # the expert installed is the one the node kept (same sha256)
            k: _kept_sha256(work / f"work-{k}", k) == _installed_sha256(run_dir, k) for k in range(nodes)
        },
        "training_device_s": {  # how long each expert's training took, as its node measured it
            e["expert_id"]: round(float(e["device_seconds"]), 1)
            for e in json.loads((run_dir / "report.json").read_text()).get("experts", [])
        },
        "training_steps": {k: log.count(f"expert {k} [") for k, log in logs.items()},  # "expert k [fm] step …"
    }
    return result


def _kept_sha256(work_dir: Path, k: int) -> str | None:
    kept = list(work_dir.glob(f"expert-{k}-*.json"))
    return json.loads(kept[0].read_text())["meta"].get("sha256") if len(kept) == 1 else None


def _installed_sha256(run_dir: Path, k: int) -> str | None:
    meta = run_dir / "experts" / f"expert-{k}" / "hddm_expert.json"
    return json.loads(meta.read_text()).get("sha256") if meta.exists() else None


def _running(p) -> bool:
    """Is psutil process ``p`` still running (a zombie is not: it only waits to be reaped)?"""
    import psutil

    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def check(out: dict) -> list[str]:
    """What did not go as it should (empty when the deployment, and the drill if run, behaved)."""
    problems = []
    nodes = out["nodes"]
    if out["run"]["status"] != "finished:completed":
        problems.append(f"run: {out['run']['status']}")
    elif not (Path(out["run"]["run_dir"]) / "report.json").exists():
        problems.append("run: no report.json")
    if out.get("institution", {}).get("samples_on_coordinator"):
        problems.append(
            f"institution: the coordinator holds samples {out['institution']['samples_on_coordinator'][:3]}"
        )
    drill = out.get("drill")
    if drill is not None:
        crashed, lost = nodes - 2, nodes - 1
        if not drill["intruder_refused"]:
            problems.append("drill: a SuperNode with an unregistered key was not refused")
        killed = drill["killed_run"]
        missing = {m["expert_id"]: m["reason"] for m in killed["report"].get("missing", [])}
        if (
            killed["status"] != "finished:completed"
            or sorted(missing) != [crashed, lost]
            or "(code 8)" not in missing[crashed]
            or "(code 5)" not in missing[lost]
        ):
            problems.append(
                f"drill: the run with a killed ClientApp and a killed node ended {killed['status']}, missing {missing}"
            )
        resumed = drill["resumed_run"]
        steps = {k: e.get("resumed_steps") for k, e in resumed["experts"].items()}
        if resumed["status"] != "finished:completed" or resumed["report"]["missing"] or not all(steps.values()):
            problems.append(
                f"drill: the resumed run ended {resumed['status']}, missing "
                f"{resumed['report']['missing']}, resumed steps {steps}"
            )
        dropped = resumed["report"].get("router", {}).get("dropped_replies", {})
        if sorted(dropped) != ["1"] or not all(len(d) == 1 and "expected" in d[0] for d in dropped.values()):
            problems.append(f"drill: the hostile node's router replies were not each dropped once: {dropped}")
        expired = drill["expired_run"]
        reasons = [m["reason"] for m in expired["report"]["missing"] if m["expert_id"] == 0]
        if expired["status"] != "finished:failed" or not reasons or "(code 3)" not in reasons[0]:
            problems.append(f"drill: the run with a 5 s TTL ended {expired['status']}, expert 0: {reasons}")
    crash = out.get("crash_drill")
    if crash is not None:
        if not crash["serverapps_killed"] or not crash["coordinator_gone"]:
            problems.append(
                f"crash drill: {crash['serverapps_killed']} ServerApps killed, gone: {crash['coordinator_gone']}"
            )
        if crash["supernodes_alive"] != list(range(nodes)):
            problems.append(f"crash drill: only SuperNodes {crash['supernodes_alive']} outlived the SuperLink")
        collected = crash["collected_run"]
        report = collected["report"]
        if (
            collected["status"] != "finished:completed"
            or report.get("missing")
            or sorted(e["expert_id"] for e in report.get("experts", [])) != list(range(nodes))
        ):
            problems.append(f"crash drill: the re-run ended {collected['status']}, missing {report.get('missing')}")
        if not all(collected["same_weights"].values()):
            problems.append(f"crash drill: installed experts are not the kept ones: {collected['same_weights']}")
        if not all(collected["kept_sent"].values()) or any(collected["training_steps"].values()):
            problems.append(
                f"crash drill: kept experts sent {collected['kept_sent']}, "
                f"training steps logged after the restart {collected['training_steps']}"
            )
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    p.add_argument("--nodes", type=int, default=2, help="institutions (SuperNodes), one expert each")
    p.add_argument(
        "--port",
        type=int,
        default=0,
        help="SuperLink port; SuperNodes use port+3+k (default: the first free block in 19400..19499)",
    )
    p.add_argument("--work", type=Path, default=None, help="work directory (default: a new temporary one)")
    p.add_argument("--config", default="configs/default.yaml", help="experiment YAML (relative to the app)")
    p.add_argument(
        "--overrides", default=None, help="config overrides; default: a quick run with one DDPM expert and the rest FM"
    )
    p.add_argument("--cache-dir", type=Path, default=None, help="dataset cache shared by all (default: in --work)")
    p.add_argument(
        "--data-dir",
        default="",
        help="a prepared dataset directory every node trains from "
        "(node config data-dir; default: each prepares the embedded one)",
    )
    p.add_argument(
        "--objectives",
        default="",
        help="per-node objective overrides, e.g. ',ddpm' (node config objective; empty = the server's assignment)",
    )
    p.add_argument(
        "--drill",
        action="store_true",
        help="run the fault drill instead: an unregistered key, a ClientApp and a SuperNode killed "
        "mid-training, a run that targets only their experts resuming both, a message whose TTL "
        "expires (needs ≥ 3 nodes)",
    )
    p.add_argument(
        "--institution",
        action="store_true",
        help="institution-owned data: each node trains on its own shard set and cache, the coordinator holds no "
        "data (data.partition: institution, federated router and reference); checks it holds no sample",
    )
    p.add_argument("--timeout", type=float, default=900.0, help="seconds a run may take (default 900)")
    p.add_argument(
        "--crash-drill",
        action="store_true",
        help="run the coordinator crash drill instead: the SuperLink and ServerApp are killed while every expert "
        "trains, the SuperNodes finish and keep their experts, the SuperLink restarts on its state database, and "
        "a re-run into the same run directory collects the kept experts without training them again",
    )
    p.add_argument(
        "--superlink-state",
        choices=("database", "memory"),
        default="database",
        help="with --crash-drill: the SuperLink's state in work/state.db (it survives the crash) or in memory "
        "(the keys are registered again and exited SuperNodes restarted)",
    )
    args = p.parse_args(argv)
    if args.institution and (args.drill or args.crash_drill or args.data_dir):
        p.error("--institution runs without --drill, --crash-drill and --data-dir")
    if args.nodes < 1 or (args.drill and args.nodes < 3):
        p.error("--nodes must be ≥ 1 (≥ 3 with --drill)")
    if args.drill and args.crash_drill:
        p.error("--drill and --crash-drill are two separate drills; choose one")
    if args.superlink_state != "database" and not args.crash_drill:
        p.error("--superlink-state belongs to --crash-drill")
    for tool in ("openssl", "ssh-keygen"):
        if shutil.which(tool) is None:
            p.error(f"{tool} is not installed")
    # SIGTERM (a test's or a supervisor's timeout) unwinds like an error: every process started is stopped
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    work = args.work or Path(tempfile.mkdtemp(prefix="hddm-deploy-"))
    if not args.port:
        try:
            args.port = free_ports(width=max(10, args.nodes + 4))
        except DeploymentError as e:
            p.error(str(e))
    n = args.nodes
    overrides = (
        args.overrides
        if args.overrides is not None
        else (
            f"num_experts={n} objectives={{ddpm: 1, fm: {n - 1}, ddpm_clusters: [0]}} expert.steps=30 router.steps=30 "
            f"sampling.num_steps=10 sampling.samples_per_prompt=2 federation.min_experts={n}"
        )
    )
    try:
        objectives = args.objectives.split(",") if args.objectives else None
        if objectives is not None and len(objectives) != n:
            p.error(f"--objectives has {len(objectives)} entries for {n} nodes")
        out = deploy(
            n,
            args.port,
            work,
            config=args.config,
            overrides=overrides,
            cache_dir=args.cache_dir or work / "cache",
            drill=args.drill,
            crash=args.crash_drill,
            database=args.superlink_state == "database",
            data_dir=args.data_dir,
            objectives=objectives,
            institution=args.institution,
            timeout=args.timeout,
        )
    except DeploymentError as e:
        print(f"deploy: error: {e} (logs in {work})", file=sys.stderr)
        return 1
    print(f"run status: {out['run']['status']}; run directory: {out['run']['run_dir']}; logs: {work}")
    if args.drill:
        d = out["drill"]
        print(
            f"drill: unregistered key refused: {d['intruder_refused']}; killed ClientApp and SuperNode: "
            f"{d['killed_run']['report']['missing']}; after the restart: resumed steps "
            f"{ {k: e.get('resumed_steps') for k, e in d['resumed_run']['experts'].items()} }, missing "
            f"{d['resumed_run']['report']['missing']}, hostile router replies dropped "
            f"{d['resumed_run']['report'].get('router', {}).get('dropped_replies')}; 5 s TTL: {d['expired_run']['status']}, "
            f"{d['expired_run']['report']['missing'][:1]}"
        )
    if args.crash_drill:
        c = out["crash_drill"]
        print(
            f"crash drill: SuperLink and {c['serverapps_killed']} ServerApp killed at {c['killed_after_s']} s; "
            f"experts kept by the nodes at {c['kept_after_s']} s; SuperLink state {c['superlink_state']}: "
            f"SuperNodes reconnected by themselves: {c['reconnected_by_themselves']}, exited: "
            f"{c['supernodes_exited']}, all online {c['reconnected_s']} s after the restart; the re-run collected "
            f"them in {c['collect_s']} s (train message received → expert installed: {c['answer_s']} s) and "
            f"finished in {c['rerun_s']} s (trainings took "
            f"{c['collected_run']['training_device_s']} device-s; "
            f"kept experts sent: {c['collected_run']['kept_sent']}, training steps logged: "
            f"{c['collected_run']['training_steps']}), missing {c['collected_run']['report'].get('missing')}"
        )
    problems = check(out)
    for problem in problems:
        print(f"deploy: FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
