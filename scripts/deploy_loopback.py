#!/usr/bin/env python3
"""A real Flower deployment of this app on one machine: TLS, SuperNode authentication, N institutions.

What it does, in order (each step is a method of :class:`loopback.harness.Deployment`; the story is
:func:`loopback.drills.deploy`):

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
5. with ``--drill`` the run is a fault drill instead (:func:`loopback.drills.fault_drill`): a SuperNode with an unregistered key
   is refused; mid-training one node's ClientApp is SIGKILLed (code 8) and another node's SuperNode (code 5), and
   the run completes without their experts, saying why; a second run that targets only those experts resumes
   both from their local checkpoints, trains the router federated with one of them hostile (its router replies
   dropped, with the reason in the report) and completes the run directory with every expert; a run whose
   message TTL is shorter than its training records the expiry (code 3);
6. with ``--institution`` every node holds its own shard set and cache and the coordinator none
   (``data.partition: institution``, federated feature classifier, router and reference statistics); afterwards
   the coordinator's cache and run directory are checked for shards and latents;
7. with ``--crash-drill`` the run is the coordinator crash drill instead (:func:`loopback.drills.crash_drill`): the SuperLink
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
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from loopback.drills import check, deploy
from loopback.harness import DeploymentError, free_ports


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
