"""The loopback deployment's story (:func:`deploy`) and its drills: the fault drill (:func:`fault_drill`: an
unregistered key, a killed ClientApp and SuperNode, a resumed run with a hostile node, an expired message), the
coordinator crash drill (:func:`crash_drill`), institution-owned data (:func:`institution_data`), and what the
outcome must show (:func:`check`)."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from .harness import APP, Deployment, DeploymentError, running


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
    result: dict = {"steps": DRILL_STEPS}  # of the killed run's experts, and so of the resumed ones
    intruder = d.start_supernode("intruder", d.node_key("intruder"), {"expert-id": 0}, d.port + 2)
    try:
        intruder.wait(timeout=60)
    except subprocess.TimeoutExpired:  # still up after 60 s: the SuperLink let it in (or it hangs), said here
        print("drill: the intruder SuperNode was still running after 60 s (not refused)", file=sys.stderr)
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
        f"expert.steps={DRILL_STEPS} expert.checkpoint_every=10 expert.log_every=500"
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
            f"federation.message_ttl=5 expert.steps={TTL_STEPS} expert.log_every=1000 "
            "federation.train_timeout=300",  # the query round waits for a node busy with run_b (≤ 300 s)
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
# the killed run trains long enough for both doomed nodes to write a first checkpoint (step 10) while the other is
# still training (the `test` preset took ~11 ms a step in the deployment test on a 2-core AVX2 CPU), and the expiring
# run's training alone outlasts its 5 s TTL
DRILL_STEPS = 1000
TTL_STEPS = 1500
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
    result["coordinator_gone"] = not any(running(p) for p in serverapps)
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
