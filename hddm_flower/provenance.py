"""Where a result came from: the time it was made, the versions of the packages that made it and, when it ran from a
git checkout of this project, that checkout's commit."""

from __future__ import annotations

import datetime as _dt
import platform
import subprocess
from importlib import metadata
from pathlib import Path

PACKAGES = (
    "hddm-flower",
    "torch",
    "diffusers",
    "transformers",
    "flwr",
    "webdataset",
    "safetensors",
    "torchmetrics",
    "torch-fidelity",
    "lpips",
    "torchvision",
)


def now() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def package_version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "not installed"


def versions() -> dict[str, str]:
    """Python's version and those of the packages a result depends on."""
    return {"python": platform.python_version()} | {pkg: package_version(pkg) for pkg in PACKAGES}


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout


def source(package_dir: Path | None = None) -> dict:
    """The commit of the git checkout this package runs from (``commit``, the short hash) and the tracked files that
    differ from it (``uncommitted``; the code that ran is the commit only where that list is empty). ``{}`` when
    the package is not the top of a git checkout of its own (an installed release: its version is in
    :func:`versions`), or git is missing. ``package_dir``: the package folder, this one unless given."""
    package_dir = Path(package_dir or Path(__file__).resolve().parent)
    root = package_dir.parent
    try:  # a checkout whose top holds this package, not some repository a site-packages folder happens to sit in
        if Path(_git(root, "rev-parse", "--show-toplevel").strip()).resolve() != root.resolve():
            return {}
        commit = _git(root, "rev-parse", "--short", "HEAD").strip()
        status = _git(root, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return {}
    return {"commit": commit, "uncommitted": sorted(line[3:] for line in status.splitlines() if line.strip())}
