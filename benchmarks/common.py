"""What every benchmark shares: where results go, the machine and commit a figure was measured on, the process's
memory, and writing a result as JSON."""

from __future__ import annotations

import fcntl
import json
import os
import platform
import resource
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RESULTS = ROOT / "benchmarks" / "results"


def machine() -> str:
    """``CPU model (vector unit), N cores, M GiB RAM, GPU`` of this machine (the GPU only when torch is already
    imported)."""
    model, flags, vector = "", set(), ""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError as e:  # not Linux: the model from platform, the vector unit said to be unknown
        cpuinfo, vector = [], f"vector unit unknown: {e.strerror}"
    for line in cpuinfo:
        if line.startswith("model name") and not model:
            model = line.split(":", 1)[1].strip()
        elif line.startswith("flags") and not flags:
            flags = set(line.split(":", 1)[1].split())
    model = model or platform.processor() or platform.machine()
    # the widest vector unit: machines sold under one model name differ in it; recorded beside every time figure
    vector = next((name for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2")) if flag in flags), vector)
    model = f"{model} ({vector})" if vector else model
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    gpu = ""
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        gpu = f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ", no GPU"
    return f"{model}, {os.cpu_count()} cores, {ram:.0f} GiB RAM{gpu}"


def load_at_start() -> str:
    """``load L`` (the 1-minute load average now): figures from a shared machine say how busy it was."""
    return f"load {os.getloadavg()[0]:.1f} at start"


def commit() -> str:
    """The short hash of the checkout's HEAD, or ``unknown`` outside a git checkout."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def rss_mib() -> float:
    """This process's resident memory now, MiB (Linux)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def peak_rss_mib() -> float:
    """This process's peak resident memory so far (``ru_maxrss``), MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def module_command(module: str, *args: str) -> list[str]:
    """The command line that runs the benchmark ``module`` (``benchmarks.NAME``) in a fresh Python process; run it
    with ``cwd=ROOT``."""
    return [sys.executable, "-m", module, *args]


def uncommitted() -> list[str] | str:
    """The tracked files whose content differs from the checkout's HEAD (``[]`` when it is clean), or ``unknown``
    outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sorted(line[3:] for line in out.splitlines() if line.strip())


def stamp() -> dict:
    """Where and when a result was made: this machine, the checkout's commit, the tracked files that differed from it
    (the code that ran is the commit only where that list is empty), today's date, and torch's thread count where
    torch is loaded."""
    out = {"machine": machine(), "commit": commit(), "uncommitted": uncommitted(), "date": time.strftime("%Y-%m-%d")}
    if (torch := sys.modules.get("torch")) is not None:
        out["torch_threads"] = torch.get_num_threads()
    return out


def write_result(path: str | os.PathLike, record: dict, *, indent: int = 2) -> Path:
    """Write ``record`` as JSON to ``path`` (its folder created); returns the path. The file is replaced whole: the
    JSON goes to a temporary file beside it, which is renamed over it, so a run killed while writing leaves the
    previous file (every record trained before) intact, and no temporary file behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(record, indent=indent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


@contextmanager
def results_file(path: str | os.PathLike):
    """The JSON results file at ``path`` as a dict (empty if there is none yet), read under an exclusive lock on its
    folder and written whole (:func:`write_result`) when the block ends without an error. Processes that add records
    to one file side by side each read it again under the lock, so each keeps the others' records."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        store = json.loads(path.read_text()) if path.exists() else {}
        yield store
        write_result(path, store)
    finally:
        os.close(folder)  # releases the lock


def add_record(path: str | os.PathLike, name: str, setting: dict, record: dict, key) -> dict:
    """Add ``record`` to the entry ``name`` of the results file at ``path`` (:func:`results_file`, under its lock), in
    place of any record with the same ``key(record)``; returns the file as written, with what processes beside this
    one wrote (their records in this entry and in others). An entry there with another ``setting`` (one a process
    beside this one started) is a ValueError naming it, and the file is left as it was."""
    with results_file(path) as store:
        entry = store.setdefault(name, {"name": name, "records": []})
        if entry.setdefault("setting", setting) != setting:
            raise ValueError(f"--name {name}: its records were trained with {entry['setting']}")
        entry["records"] = [r for r in entry["records"] if key(r) != key(record)] + [record]
        return store


def forked(fn, *args):
    """``fn(*args)`` in a child forked from this process, its result (JSON-serialisable) returned here: each
    measurement gets a process of its own (its own peak memory and I/O counters) without paying the imports
    again. Fork before this process has started any thread pool (no torch op with several threads yet)."""
    import tempfile
    import traceback

    with tempfile.NamedTemporaryFile("r", suffix=".json") as out:
        pid = os.fork()
        if pid == 0:  # the child: run, write the result, leave without the parent's exit handlers
            code = 1
            try:
                Path(out.name).write_text(json.dumps(fn(*args)))
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status):
            raise RuntimeError(f"{getattr(fn, '__name__', fn)} failed in its process (exit {status}); see above")
        return json.loads(Path(out.name).read_text())
