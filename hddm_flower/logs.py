"""What reaches a Flower log: the project's own progress lines, and no third-party progress bars or warnings.

The ServerApp, the ClientApp and the training process call :func:`quiet_libraries` (diffusers' and transformers'
progress bars and info/warning chatter off, known harmless library warnings filtered), and the training process,
forked from a fork server that has no logging configured, calls :func:`log_to_stderr` so that its
``expert k step s/N loss …`` lines (every ``expert.log_every`` steps) reach the node's output and, in
simulation, Ray's forwarded log.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

FORMAT = "%(levelname)s :      %(message)s"  # the layout of Flower's own console lines
_WARNINGS = (
    r"Metric `Kernel Inception Distance` will save all extracted features",  # torchmetrics, by design here
    r".*`resume_download` is deprecated",
    r".*torch\.utils\._pytree\._register_pytree_node is deprecated",
)


def quiet_libraries() -> None:
    """No progress bars from diffusers/transformers/huggingface_hub and only their errors; known harmless
    warnings filtered. Idempotent; imports the libraries only if already imported or importable cheaply."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
    for message in _WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    if "transformers" in sys.modules:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
        transformers_logging.set_verbosity_error()
    if "diffusers" in sys.modules:
        from diffusers.utils import logging as diffusers_logging

        diffusers_logging.disable_progress_bar()
        diffusers_logging.set_verbosity_error()


def log_to_stderr(level: int = logging.INFO) -> None:
    """Send the project's log records (``hddm_flower.*``) to stderr in Flower's console layout, once."""
    core = logging.getLogger("hddm_flower")
    if not any(getattr(h, "_hddm_stderr", False) for h in core.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(FORMAT))
        handler._hddm_stderr = True
        core.addHandler(handler)
    core.setLevel(level)
    core.propagate = False
