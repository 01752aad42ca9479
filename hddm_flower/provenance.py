"""Where a result came from: the time it was made, the versions of the packages that made it and, when it ran from a
git checkout of this project, that checkout's commit."""

from __future__ import annotations

import datetime as _dt
import os
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
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}  # not a hook's or a caller's repository
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=True, env=env, timeout=30
    ).stdout


def source(package_dir: Path | None = None) -> dict:
    """The commit of the git checkout this package runs from (``commit``, the short hash) and the files of the
    checkout that differ from it (``uncommitted``: tracked files changed, and untracked files inside the package,
    which run too; the code that ran is the commit only where that list is empty). ``{}`` when the package is not
    at the top of a checkout of its own (an installed release: its version is in :func:`versions`); ``{"error":
    …}`` when it is but git could not say (git missing, a refused repository). ``package_dir``: the package folder,
    this one unless given."""
    package_dir = Path(package_dir or Path(__file__).resolve().parent)
    root = package_dir.parent
    if not (root / ".git").exists():
        return {}
    try:  # a checkout whose top holds this package, not some repository a site-packages folder happens to sit in
        if Path(_git(root, "rev-parse", "--show-toplevel").strip()).resolve() != root.resolve():
            return {}
        commit = _git(root, "rev-parse", "--short", "HEAD").strip()
        changed = _git(root, "status", "--porcelain=v1", "-z", "--untracked-files=no")
        untracked = _git(root, "ls-files", "-z", "--others", "--exclude-standard", "--", package_dir.name)
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", None) or str(e)
        return {"error": f"git: {detail.strip().splitlines()[0] if detail.strip() else type(e).__name__}"}
    return {"commit": commit, "uncommitted": sorted(_porcelain_paths(changed) + untracked.split("\0")[:-1])}


def source_since(at_start: dict) -> dict:
    """``at_start`` (:func:`source` as a run began), with ``at_the_end`` added where the checkout moved while it ran
    (another commit checked out, files changed): the result is then not the start's commit alone."""
    end = source()
    return at_start | ({"at_the_end": end} if end != at_start else {})


def _porcelain_paths(z: str) -> list[str]:
    """The paths of ``git status --porcelain=v1 -z``: ``XY path``, a rename or copy followed by its origin."""
    fields, out, i = z.split("\0"), [], 0
    while i < len(fields) and fields[i]:
        out.append(fields[i][3:])
        i += 2 if fields[i][0] in "RC" else 1
    return out
