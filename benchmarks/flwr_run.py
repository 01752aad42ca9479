"""The README's run command, timed: ``flwr run . --stream`` with the README's five variables exported, from the
command to the run's report, into a fresh run directory.

    python -m benchmarks.flwr_run --run-dir /tmp/hddm-flwr-run [--name flwr_run-2026-12-05] [--run-config "..."]

``flwr run --stream`` exits 0 even when the run fails, so the figure counts only when the run directory holds its
``report.json`` with every expert; otherwise nothing is written and the exit code is 1. Writes
``benchmarks/results/NAME.{json,md}`` with the command, commit, machine, load at the start and end, date, wall
seconds, the experts' device seconds and the report's top-2 FID, KID and grid adherence (the run's own feature
classifier: these do not compare across runs). Flower's managed SuperLink keeps running after the command returns;
a run that finds one already running reuses it (said in the record).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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


def superlink_running() -> bool:
    """Whether a Flower SuperLink process is running on this machine already (``pgrep``)."""
    return subprocess.run(["pgrep", "-f", "flower-superlink"], capture_output=True).returncode == 0


def summarise(report: dict) -> dict:
    """What the record keeps of a run's report.json."""
    top2 = report["metrics"]["evaluation"]["modes"].get("top2", {})
    adherence = report["metrics"]["sampling"]["adherence"]
    seconds = [e.get("device_seconds") for e in report["experts"]]
    return {
        "experts": len(report["experts"]),
        "num_experts": report["num_experts"],
        "missing": report["missing"],
        "objectives": [e["objective"] for e in report["experts"]],
        "expert_steps": sorted({e["steps"] for e in report["experts"]}),
        "expert_device_seconds": {"min": min(seconds), "max": max(seconds)} if None not in seconds else None,
        "top2_fid": top2.get("fid"),
        "top2_kid": top2.get("kid"),
        "grid_adherence": adherence.get("mean"),
        "feature_network": report["metrics"].get("feature_network"),
    }


def render(record: dict) -> str:
    s, secs = record["report"], record["report"]["expert_device_seconds"]
    kid, adherence = s["top2_kid"], s["grid_adherence"]
    return (
        f"# `{record['command']}`\n\n"
        "| commit | machine | date | load at start → end | wall time to the report | experts |\n|---|---|---|---|---|---|\n"
        f"| {record['commit']} | {record['machine']} | {record['date']} | "
        f"{record['load_average']['start']:.1f} → {record['load_average']['end']:.1f} | "
        f"**{record['seconds']:.1f} s ({record['seconds'] / 60:.1f} min)** | {s['experts']}/{s['num_experts']} |\n\n"
        + (f"Each expert {secs['min']:.1f}–{secs['max']:.1f} device-seconds; " if secs else "")
        + f"the run's own report: top-2 FID {s['top2_fid']:.1f}, KID {'–' if kid is None else f'{kid:.2f}'}, grid "
        f"adherence {'–' if adherence is None else f'{adherence:.3f}'} (its own feature classifier, "
        f"{s['feature_network']}; not comparable across runs). A SuperLink was "
        f"{'already running and reused' if record['superlink_reused'] else 'started by the command'}; the embedded "
        f"dataset was {'prepared in the run (a first use)' if record.get('dataset_prepared_in_run') else 'cached'}.\n"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", required=True, help="a fresh folder for the run (refused if it exists)")
    p.add_argument("--name", default=f"flwr_run-{time.strftime('%Y-%m-%d', time.gmtime())}")
    p.add_argument("--run-config", default="", help="more of flwr's --run-config, e.g. 'expert-steps=20'")
    args = p.parse_args()
    run_dir = Path(args.run_dir).resolve()
    if run_dir.exists():
        sys.exit(f"--run-dir {run_dir}: exists; the figure is for a fresh run directory")
    if not shutil.which("flwr"):
        sys.exit("flwr: not on PATH (pip install -e . installs it)")
    run_config = " ".join(x for x in (f'run-dir="{run_dir}"', args.run_config) if x)
    command = ["flwr", "run", ".", "--stream", "--run-config", run_config]
    reused, load0, date = superlink_running(), os.getloadavg()[0], time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    log_path = run_dir.with_name(run_dir.name + ".log")
    start = time.monotonic()
    with open(log_path, "w") as log:
        rc = subprocess.run(
            command, cwd=ROOT, env=os.environ | README_ENV, stdout=log, stderr=subprocess.STDOUT
        ).returncode
    seconds = time.monotonic() - start
    report_path = run_dir / "report.json"
    if rc != 0 or not report_path.is_file():
        sys.exit(
            f"flwr run: exit code {rc}, {report_path} {'present' if report_path.is_file() else 'missing'}; log {log_path}"
        )
    summary = summarise(json.loads(report_path.read_text()))
    if summary["missing"] or summary["experts"] != summary["num_experts"]:
        sys.exit(f"flwr run: {summary['experts']} of {summary['num_experts']} experts arrived; log {log_path}")
    record = {
        "command": " ".join(command[:4]) + f" --run-config '{run_config}'",
        "environment": README_ENV,
        "commit": commit(),
        "machine": machine(),
        "date": date,
        "load_average": {"start": load0, "end": os.getloadavg()[0]},
        "seconds": round(seconds, 1),
        "superlink_reused": reused,
        # a first use prepares the embedded dataset inside the run (its log says so); later runs find it cached
        "dataset_prepared_in_run": PREPARING in log_path.read_text(errors="replace"),
        "report": summary,
    }
    write_result(RESULTS / f"{args.name}.json", record)
    (RESULTS / f"{args.name}.md").write_text(md := render(record))
    print(md)


if __name__ == "__main__":
    main()
