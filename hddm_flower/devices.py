"""Where the coordinator's stages run: one device name resolved the same way everywhere, and when bf16 is used.

``auto`` is CUDA when present, else the CPU. bf16 autocast is used where it is safe (router training, the experts'
and router's forward passes in sampling) and never for statistics (FID/KID sums stay float64 on the CPU).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os

import torch

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 * 2**20  # the largest glibc allows on 64-bit systems
TRIM_THRESHOLD = 512 * 2**20
_SETTINGS = ((_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def glibc_version() -> tuple[int, int] | None:
    """(major, minor) of the glibc this process runs on; None on another C library (musl, macOS, Windows), where
    ``os.confstr`` lacks the name (ValueError), returns None, or does not exist."""
    name = "CS_GNU_LIBC_VERSION"
    if not hasattr(os, "confstr") or name not in os.confstr_names:
        return None
    text = os.confstr(name)  # "glibc 2.36"
    if not text or not text.startswith("glibc "):
        return None
    major, minor = text.split()[1].split(".")[:2]
    return int(major), int(minor)


def keep_freed_memory() -> bool:
    """Let glibc's malloc serve blocks up to :data:`MMAP_THRESHOLD` from its heap and keep up to
    :data:`TRIM_THRESHOLD` of free memory at each arena's top instead of returning it to the kernel. By default glibc
    maps a large block anew (it raises that threshold only to the largest block freed so far, and trims the heap
    at twice it), so a CPU process whose tensors vary in size call after call (a batch's activations, the (B, J, d)
    moments of a mixture) keeps page-faulting fresh zeroed pages in. What is computed does not change, only where
    the memory comes from. The cost: up to :data:`TRIM_THRESHOLD` of free memory held per arena, and blocks up to
    :data:`MMAP_THRESHOLD` now in the heap, where fragmentation can hold them. ``benchmarks/freed_memory.py``
    measures an expert's forward passes at a sampling batch both ways (page faults, kernel and wall time, peak
    memory, and that the outputs are bit-identical). Changes the whole process for good: ``hddm reproduce`` calls it
    at its start and in each worker of :func:`~hddm_flower.reproduce.training.run_jobs`. Returns False (and changes
    nothing) where the C library is not glibc; a malloc preloaded in glibc's place (jemalloc, tcmalloc) is not
    affected either."""
    if glibc_version() is None:
        log.info("keep_freed_memory: the C library is not glibc; malloc left as it is")
        return False
    mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = [bool(mallopt(param, value)) for param, value in _SETTINGS]  # both, even if one is refused
    return all(done)


def resolve_device(name: str | torch.device | None = "auto") -> torch.device:
    """``auto``/None/"" → ``cuda`` when available, else ``cpu``; anything else as torch reads it. A CUDA device
    asked for on a machine without one is an error, not a silent fallback."""
    if isinstance(name, torch.device):
        return name
    if name in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ValueError(f"unknown device {name!r}: {e}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r}: CUDA is not available on this machine")
    return device


def resolve_precision(mixed_precision: str, device: torch.device) -> str:
    """``auto`` → ``bf16`` on CUDA, ``no`` elsewhere (CPU bf16 autocast is slow on most CPUs)."""
    if mixed_precision == "auto":
        return "bf16" if device.type == "cuda" else "no"
    return mixed_precision


def autocast(device: torch.device, mixed_precision: str):
    """A bf16 autocast context for ``device`` when ``mixed_precision`` is ``bf16``, else a null context."""
    if mixed_precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; a container's or ``taskset``'s share of the machine)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def coordinator_threads(threads: int = 0) -> int:
    """Set torch's CPU threads for the coordinator's stages: ``threads``, or (0) the CPUs available to the process
    rather than torch's default of every core of the machine. Returns the number set."""
    n = threads or available_cpus()
    torch.set_num_threads(n)
    return n
