"""The README's run command, timed: ``flwr run . --stream`` with the README's five variables exported, from the
command to the run's report, into a fresh run directory.

    python -m benchmarks.flwr_run --run-dir /tmp/hddm-flwr-run [--name flwr_run-2026-12-05] [--run-config "..."]

``flwr run --stream`` exits 0 even when the run fails, so the figure counts only when the run directory holds its
``report.json`` with every expert; otherwise nothing is written and the exit code is 1. Writes
``benchmarks/results/NAME.{json,md}`` with the command, commit, machine, load at the start and end, date, wall
seconds, the experts' device seconds and the report's top-2 FID, KID and grid adherence (the run's own feature
classifier: these do not compare across runs). It refuses to start while a local SuperLink answers or runs (flwr would
reuse it: its start untimed, its environment not README's) and stops the SuperLink that flwr started when it is done
(the ``flower-superlink`` with flwr's local-superlink log file, nothing else).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import RESULTS, ROOT, commit, machine, write_result

# the README's variables: no dependency install, no telemetry, no update check, Ray's progress lines unfolded
README_ENV = {
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
    "RAY_DEDUP_LOGS": "0",
}


PREPARING = "preparing the embedded Twemoji dataset"  # the ServerApp's log line when the dataset is not cached yet


def managed_superlink_pids() -> list[int]:
    """The PIDs of the SuperLink that ``flwr run`` manages on this machine: a ``flower-superlink`` whose
    ``--log-file`` is Flower's local-superlink log of this user (how flwr starts it), not any process with the name."""
    from flwr.supercore.utils import get_flwr_home

    log_file = str(get_flwr_home() / "local-superlink" / "superlink.log")  # where flwr 1.42's managed one logs
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError):  # the process ended since the listing: not a SuperLink now
            continue
        args = [a.decode(errors="replace") for a in argv]
        if any(a.endswith("flower-superlink") for a in args[:2]) and log_file in args:
            pids.append(int(proc.name))
    return pids


def superlink_answers() -> bool:
    """Whether a local SuperLink answers on flwr's port (flwr's own probe: such a SuperLink would be reused)."""
    import urllib.request

    from flwr.cli.constant import CONTROL_API_PROBE_TIMEOUT, LOCAL_SUPERLINK_HTTP_API_PORT

    url = f"http://127.0.0.1:{LOCAL_SUPERLINK_HTTP_API_PORT}/health"
    try:
        with urllib.request.urlopen(url, timeout=CONTROL_API_PROBE_TIMEOUT) as response:
            return 200 <= response.status < 300
    except OSError:  # refused, timed out or an HTTP error: nothing answers there
        return False


def stop(pids: list[int], timeout: float = 30.0) -> list[int]:
    """SIGTERM ``pids`` and wait up to ``timeout`` s for them to go; returns those still running."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:  # it ended by itself meanwhile: stopped, as wanted
            continue
        except PermissionError as e:  # another user's: said, and returned below as still running
            print(f"cannot stop PID {pid}: {e.strerror}", file=sys.stderr)
    deadline = time.monotonic() + timeout
    while (alive := [pid for pid in pids if _running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    return alive


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, ended but not yet reaped by its parent, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # reaped: gone
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def working_tree_clean() -> bool | None:
    """Whether the checkout is HEAD with nothing changed or added (None outside a git checkout): the record names
    HEAD, and ``flwr run .`` packages untracked files too."""
    try:
        out = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True)
    except OSError as e:  # no git here: the record says None, and why is printed
        print(f"flwr_run: the working tree's state is not recorded: {e}", file=sys.stderr)
        return None
    return out.stdout.strip() == "" if out.returncode == 0 else None


def summarise(report: dict) -> dict:
    """What the record keeps of a run's report.json (a report with every expert)."""
    evaluation = report["metrics"].get("evaluation", {}).get("modes", {}).get("top2", {})
    adherence = report["metrics"].get("sampling", {}).get("adherence", {})
    seconds = [e.get("device_seconds") for e in report["experts"]]
    return {
        "experts": len(report["experts"]),
        "num_experts": report["num_experts"],
        "missing": report["missing"],
        "objectives": [e["objective"] for e in report["experts"]],
        "expert_steps": sorted({e["steps"] for e in report["experts"]}),
        "expert_device_seconds": {"min": min(seconds), "max": max(seconds)}
        if seconds and None not in seconds
        else None,
        "top2_fid": evaluation.get("fid"),
        "top2_kid": evaluation.get("kid"),
        "grid_adherence": adherence.get("mean"),
        "feature_network": report["metrics"].get("feature_network"),
    }


def _number(x, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def render(record: dict) -> str:
    s, secs = record["report"], record["report"]["expert_device_seconds"]
    return (
        f"# `{record['command']}`\n\n"
        "| commit | machine | date | load at start → end | wall time to the report | experts |\n|---|---|---|---|---|---|\n"
        f"| {record['commit']} | {record['machine']} | {record['date']} | "
        f"{record['load_average']['start']:.1f} → {record['load_average']['end']:.1f} | "
        f"**{record['seconds']:.1f} s ({record['seconds'] / 60:.1f} min)** | {s['experts']}/{s['num_experts']} |\n\n"
        + (f"Each expert {secs['min']:.1f}–{secs['max']:.1f} device-seconds; " if secs else "")
        + f"the run's own report: top-2 FID {_number(s['top2_fid'], '.1f')}, KID {_number(s['top2_kid'], '.2f')}, "
        f"grid adherence {_number(s['grid_adherence'], '.3f')} (its own feature classifier, {s['feature_network']}; "
        "not comparable across runs). The command started its own SuperLink; the embedded dataset was "
        f"{'prepared in the run (a first use)' if record.get('dataset_prepared_in_run') else 'cached'}."
        + (" The working tree differed from the commit named." if record.get("working_tree_clean") is False else "")
        + (f" {record['note']}" if record.get("note") else "")
        + "\n"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", required=True, help="a fresh folder for the run (refused if it exists)")
    p.add_argument("--name", default=f"flwr_run-{time.strftime('%Y-%m-%d', time.gmtime())}")
    p.add_argument("--run-config", default="", help="more of flwr's --run-config, e.g. 'expert-steps=20'")
    args = p.parse_args()
    run_dir = Path(args.run_dir).resolve()
    out_json, out_md = RESULTS / f"{args.name}.json", RESULTS / f"{args.name}.md"
    if run_dir.exists():
        sys.exit(f"--run-dir {run_dir}: exists; the figure is for a fresh run directory")
    if out_json.exists() or out_md.exists():
        sys.exit(f"--name {args.name}: {out_json.name} exists; give another --name (a record is never overwritten)")
    if not shutil.which("flwr"):
        sys.exit("flwr: not on PATH (pip install -e . installs it)")
    if superlink_answers() or managed_superlink_pids():
        # a running SuperLink would be reused: its start would not be timed and its environment, not README's, would
        # reach the ServerApp and the ClientApps
        sys.exit(f"a local Flower SuperLink is running already (PIDs {managed_superlink_pids()}); stop it first")
    run_config = " ".join(x for x in (f'run-dir="{run_dir}"', args.run_config) if x)
    command = ["flwr", "run", ".", "--stream", "--run-config", run_config]
    load0, date = os.getloadavg()[0], time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    clean = working_tree_clean()
    log_path = run_dir.with_name(run_dir.name + ".log")
    start = time.monotonic()
    try:
        with open(log_path, "w") as log:
            rc = subprocess.run(
                command, cwd=ROOT, env=os.environ | README_ENV, stdout=log, stderr=subprocess.STDOUT
            ).returncode
        seconds = time.monotonic() - start  # flwr run returns once the run has ended, after its report
        load1 = os.getloadavg()[0]
    finally:  # the SuperLink flwr started (and the run inside it, if flwr was interrupted) goes with this command
        if left := stop(managed_superlink_pids()):
            print(f"the SuperLink flwr started is still running (PIDs {left})", file=sys.stderr)
    report_path = run_dir / "report.json"
    if rc != 0 or not report_path.is_file():
        sys.exit(
            f"flwr run: exit code {rc}, {report_path} {'present' if report_path.is_file() else 'missing'}; log {log_path}"
        )
    report = json.loads(report_path.read_text())
    if report["missing"] or len(report["experts"]) != report["num_experts"]:
        sys.exit(f"flwr run: {len(report['experts'])} of {report['num_experts']} experts arrived; log {log_path}")
    record = {
        "command": " ".join(command[:4]) + f" --run-config '{run_config}'",
        "environment": README_ENV,
        "commit": commit(),
        "working_tree_clean": clean,
        "machine": machine(),
        "date": date,
        "load_average": {"start": load0, "end": load1},
        "seconds": round(seconds, 1),
        # a first use prepares the embedded dataset inside the run (its log says so); later runs find it cached
        "dataset_prepared_in_run": PREPARING in log_path.read_text(errors="replace"),
        "report": summarise(report),
    }
    md = render(record)  # before anything is written: a record that cannot be rendered leaves no file
    write_result(out_json, record)
    out_md.write_text(md)
    print(md)


if __name__ == "__main__":
    main()
