"""Where a result came from: the time it was made and the versions of the packages that made it."""

from __future__ import annotations

import datetime as _dt
import platform
from importlib import metadata

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
