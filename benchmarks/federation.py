"""Benchmark: what Flower costs. ``flwr run .`` (simulation) against the same run done by hand with the CLI.

Both sides train the config's K experts at the same parallelism (``--parallel`` at a time, one torch thread each,
as the simulation's ``client-resources-num-cpus=1`` gives on this machine), then train the router, evaluate and
sample on the coordinator with the same code (``finish_run``):

* **flwr**: ``flwr run . --federation-config "num-supernodes=K client-resources-num-cpus=1" --stream`` against the
  managed local SuperLink (Ray start-up, messages, checkpoint transfer, validation on the server included);
* **cli**: ``hddm train-expert`` × K as subprocesses, ``--parallel`` at a time, then ``hddm assemble``.

The dataset is prepared once beforehand (untimed, shared). A sampler thread records the peak resident memory of
every process of each side: the ServerApp (the ``flwr-simulation`` process that hosts it), each ClientApp (the Ray
actors), and the CLI processes, and the CPU seconds of each side's whole process tree (on a busy machine the CPU
ratio is the steadier figure; the goal is stated in wall time). Steps are reduced with ``--set`` to keep a repetition short; that makes the fixed
costs (Ray start-up) weigh *more* than in the default run, so the overhead measured is an upper bound.

    python -m benchmarks.federation                       # 2 repetitions, expert.steps=100 router.steps=100
    python -m benchmarks.federation --reps 1 --set expert.steps=700 --set router.steps=400   # the default run

Writes ``benchmarks/results/federation.json``. Uses the default Flower home (``~/.flwr``) and its local SuperLink.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from benchmarks.common import ROOT, write_result
from hddm_flower.config.io import load_config, parse_overrides
from hddm_flower.provenance import versions
from hddm_flower.stages.prepare import prepare_data

FLWR_ENV = {
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
    "RAY_DEDUP_LOGS": "0",
}


class Monitor(threading.Thread):
    """Polls a process tree: each role's peak RSS (processes matched by command line) and the CPU seconds the
    whole tree used (the roots' own CPU counted from the start; children in full).

    ``roots`` are the pids whose descendants belong to the measured side: for ``flwr run`` the local SuperLink (its
    SuperExec, the simulation, Ray and the actors all descend from it), for the CLI this process.
    """

    def __init__(self, roots: list[int], roles: dict[str, tuple[str, ...]], interval: float = 0.25):
        super().__init__(daemon=True)
        self.roots, self.roles, self.interval = roots, roles, interval
        self.peak = {r: 0 for r in roles}
        self.cpu: dict[int, float] = {}
        self.start_cpu = {pid: _cpu(psutil.Process(pid)) for pid in roots}
        self._halt = threading.Event()

    def _poll(self) -> None:
        for root in self.roots:
            try:
                procs = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
            for proc in procs:
                try:
                    with proc.oneshot():
                        cmd, rss, cpu = " ".join(proc.cmdline()), proc.memory_info().rss, _cpu(proc)
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
                self.cpu[proc.pid] = max(self.cpu.get(proc.pid, 0.0), cpu - self.start_cpu.get(proc.pid, 0.0))
                for role, needles in self.roles.items():
                    if any(n in cmd for n in needles):
                        self.peak[role] = max(self.peak[role], rss)

    def run(self) -> None:
        while not self._halt.is_set():
            self._poll()
            self._halt.wait(self.interval)

    def stop(self) -> tuple[dict[str, int], float]:
        self._halt.set()
        self.join()
        self._poll()
        return self.peak, sum(self.cpu.values())


def _cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def local_superlink() -> int:
    """The pid of the managed local SuperLink, started if needed (``flwr ls`` starts it)."""
    for _ in range(2):
        for proc in psutil.process_iter(["pid", "cmdline"]):
            if proc.info["cmdline"] and any("flower-superlink" in c for c in proc.info["cmdline"]):
                return proc.info["pid"]
        subprocess.run(["flwr", "ls"], env=os.environ | FLWR_ENV, capture_output=True)
        time.sleep(2)
    raise RuntimeError("no local flower-superlink process found after `flwr ls`")


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def run_flwr(args, run_dir: Path, overrides: str, num_experts: int) -> tuple[float, dict]:
    run_config = (
        f"overrides={_toml_str(overrides)} run-dir={_toml_str(str(run_dir))} "
        f"cache-dir={_toml_str(args.cache_dir)} config={_toml_str(str(Path(args.config).resolve()))}"
    )
    cmd = [
        "flwr",
        "run",
        str(ROOT),
        "--stream",
        "--run-config",
        run_config,
        "--federation-config",
        f"num-supernodes={num_experts} client-resources-num-cpus=1",
    ]
    mon = Monitor([local_superlink()], {"server": ("flwr-simulation",), "client": ("ClientAppActor",)})
    mon.start()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=os.environ | FLWR_ENV, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    peak, cpu = mon.stop()
    report = run_dir / "report.json"
    if proc.returncode or not report.exists():
        raise RuntimeError(
            f"flwr run failed (exit {proc.returncode}); last output:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    done = len(json.loads(report.read_text())["experts"])
    if done != num_experts:
        raise RuntimeError(f"flwr run finished with {done}/{num_experts} experts; see {report}")
    return wall, cpu, peak


def run_cli(args, run_dir: Path, sets: list[str], num_experts: int) -> tuple[float, dict]:
    hddm = [sys.executable, "-m", "hddm_flower.cli"]
    common = ["--config", args.config, "--cache-dir", args.cache_dir, *sum((["--set", s] for s in sets), [])]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    mon = Monitor([os.getpid()], {"client": ("train-expert",), "server": (" assemble ",)})
    mon.start()
    t0 = time.perf_counter()
    queue, running = list(range(num_experts)), []
    while queue or running:
        while queue and len(running) < args.parallel:
            k = queue.pop(0)
            running.append(
                subprocess.Popen(
                    [
                        *hddm,
                        "train-expert",
                        *common,
                        "--expert-id",
                        str(k),
                        "--out",
                        str(run_dir / "experts" / f"expert-{k}"),
                    ],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        time.sleep(0.05)
        for p in [p for p in running if p.poll() is not None]:
            running.remove(p)
            if p.returncode:
                raise RuntimeError(f"hddm train-expert failed: {p.stderr.read()[-2000:]}")
    subprocess.run([*hddm, "assemble", *common, "--run-dir", str(run_dir)], check=True, capture_output=True)
    wall = time.perf_counter() - t0
    peak, cpu = mon.stop()
    return wall, cpu, peak


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs" / "default.yaml"))
    p.add_argument(
        "--set",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="config overrides for both sides (default: expert.steps=100 router.steps=100)",
    )
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--parallel", type=int, default=2, help="experts trained at once (= the machine's cores)")
    p.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "hddm-flower"))
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "federation.json"))
    args = p.parse_args(argv)
    sets = args.set if args.set is not None else ["expert.steps=100", "router.steps=100"]
    overrides = " ".join(sets)
    cfg = load_config(args.config, parse_overrides(overrides))
    prepare_data(cfg, args.cache_dir)  # untimed, shared by both sides
    walls: dict[str, list[float]] = {"flwr": [], "cli": []}
    cpus: dict[str, list[float]] = {"flwr": [], "cli": []}
    peaks: dict[str, list[dict]] = {"flwr": [], "cli": []}
    ratios, cpu_ratios = [], []
    work = Path(tempfile.mkdtemp(prefix="hddm-bench-fed-"))
    try:
        for rep in range(args.reps):
            for side in ("flwr", "cli") if rep % 2 == 0 else ("cli", "flwr"):
                run_dir = work / f"{side}-{rep}"
                fn = run_flwr if side == "flwr" else run_cli
                wall, cpu, peak = fn(args, run_dir, overrides if side == "flwr" else sets, cfg.num_experts)
                walls[side].append(wall)
                cpus[side].append(cpu)
                peaks[side].append(peak)
                print(f"rep {rep} {side}: {wall:.1f} s wall, {cpu:.1f} CPU s, peak RSS {peak}", flush=True)
            ratios.append(walls["flwr"][-1] / walls["cli"][-1])
            cpu_ratios.append(cpus["flwr"][-1] / cpus["cli"][-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    mib = lambda side, role: max(pk[role] for pk in peaks[side]) / 2**20  # noqa: E731
    result = {
        "what": "federation overhead: flwr run (simulation) vs the same stages with the hddm CLI",
        "command": " ".join(["python -m benchmarks.federation", *(sys.argv[1:] if argv is None else argv)]),
        "config": str(args.config),
        "overrides": overrides,
        "experts": cfg.num_experts,
        "parallel": args.parallel,
        "reps": args.reps,
        "wall_seconds_median": {k: statistics.median(v) for k, v in walls.items()},
        "wall_seconds": walls,
        "ratio_flwr_over_cli": statistics.median(ratios),
        "ratios": ratios,
        "cpu_seconds_median": {k: statistics.median(v) for k, v in cpus.items()},
        "cpu_seconds": cpus,
        "cpu_ratio_flwr_over_cli": statistics.median(cpu_ratios),
        "load_average_at_end": os.getloadavg(),
        "peak_rss_mib": {
            "flwr_server": mib("flwr", "server"),
            "flwr_client": mib("flwr", "client"),
            "cli_assemble": mib("cli", "server"),
            "cli_train_expert": mib("cli", "client"),
        },
        "goal": "ratio <= 1.10",
        "versions": versions(),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_result(out, result)
    print(json.dumps({k: v for k, v in result.items() if k != "versions"}, indent=2))
    return result


if __name__ == "__main__":
    main()
