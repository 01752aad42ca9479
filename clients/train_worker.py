"""Train one expert in a child process of the ClientApp (:func:`run`).

In simulation every ClientApp of a Ray actor shares its process: a hard crash (the kernel's OOM killer, a
segfault in a kernel) would kill the actor and fail other nodes' experts with it. Trained here, the crash takes
down only this process; the ClientApp turns it into an error reply for this expert alone. The ClientApp forks it
from a fork server that has :data:`PRELOAD` imported. Imports the core only (no Flower); writes
``weights.safetensors`` and ``result.json`` (model config and metadata) into the spec's ``out`` directory, its
pid to ``pid`` when it starts, and the last line of an error to ``error.txt``. It ends when the ClientApp that
started it (the spec's ``owner`` pid) ends — a stopped run, a killed actor or SuperNode: no training outlives the
process that waits for it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

PRELOAD = ("torch", "diffusers", "hddm_flower.stages.expert", "hddm_flower.checkpoints", "hddm_flower.config.io")
ERROR = "error.txt"


def run(spec_path: str) -> None:
    """:func:`main` in a forked child: exit code 1 and the error's last line in ``out/error.txt`` if it raises."""
    spec = json.loads(Path(spec_path).read_text())
    if spec.get("owner"):
        _end_with(int(spec["owner"]))
    out = Path(spec["out"])
    (out / "pid").write_text(str(os.getpid()))
    try:
        main(spec_path)
    except BaseException as e:
        lines = str(e).strip().splitlines()
        (out / ERROR).write_text(f"{type(e).__name__}: {lines[-1] if lines else ''}"[:500])
        raise


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (signal 0 checks without signalling; a process of another user exists too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


def _end_with(pid: int, interval: float = 2.0) -> None:
    """Exit when process ``pid`` (the ClientApp waiting for this training) has ended: a daemon thread checks
    every ``interval`` seconds. (The fork server cannot do it: every child it forks holds its liveness pipe, so it
    outlives the ClientApp as long as a training runs.)"""

    def watch() -> None:
        while _alive(pid):
            time.sleep(interval)
        os._exit(1)

    threading.Thread(target=watch, name="hddm-end-with-clientapp", daemon=True).start()


def main(spec_path: str) -> None:
    import torch

    from hddm_flower.logs import log_to_stderr, quiet_libraries

    quiet_libraries()
    log_to_stderr()  # the fork server has no logging set up: without this the progress lines are lost

    from hddm_flower.checkpoints import weights_bytes
    from hddm_flower.config.io import config_from_dict
    from hddm_flower.data import Dataset
    from hddm_flower.safeio import write_atomic
    from hddm_flower.stages.expert import train_one_expert

    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(int(spec["threads"]))
    cfg = config_from_dict(spec["experiment"], source="train message")
    state, model_config, meta = train_one_expert(
        cfg,
        Dataset.open(spec["dataset_dir"]),  # a worker process: the dataset opened here
        int(spec["expert_id"]),
        spec["objective"],
        device=spec["device"],
        checkpoint=Path(spec["checkpoint"]) if spec["checkpoint"] else None,
    )
    out = Path(spec["out"])
    (out / "weights.safetensors").write_bytes(weights_bytes(state, cfg.expert.weights_dtype))
    write_atomic(out / "result.json", json.dumps({"model_config": model_config, "meta": meta}))
