"""Accepting an expert into a run: the one path every checkpoint from outside goes through.

An expert arrives as a weights file this process owns (received over Flower and spooled, or copied from a folder
by ``hddm add-expert``) plus two peer-written JSON documents: its metadata and its model config. :func:`accept_expert`
checks them in this order, cheapest first, and installs the expert only when all hold:

1. the metadata: bounded JSON (:func:`hddm_flower.wire.loads`), then every field the run relies on, with its type
   and range (:func:`parse_expert_meta`): expert id within the run, a known objective (with its schedule and
   timestep count for DDPM), the time convention of this code, finite compute figures, a sha256; then
   cross-checked against the run (:func:`check_against_run`: cluster k for expert k, the assigned objective, the
   run's FM time sampling);
2. the model config: bounded JSON, equal to the run's (the preset at the dataset's shapes);
3. the weights file (:func:`~hddm_flower.checkpoints.validate_weights_file`): size limit, sha256, a safetensors
   file (never unpickled), the names, shapes and dtype of the run's model, finite values;
4. install: moved into ``experts/expert-<k>`` atomically with its config and metadata.

Any refusal raises :class:`~hddm_flower.checkpoints.CheckpointRejected` (a ``ValueError``) with a one-line reason;
the weights file is consumed either way (moved into the expert folder, or deleted).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checkpoints import REQUIRED_META, TIME_CONVENTION, CheckpointRejected, install_expert, validate_weights_file
from .choices import FM_TIME_SAMPLINGS, OBJECTIVES, WIRE_DTYPES
from .clean_prior import parse_clean_prior
from .objectives import SCHEDULES
from .rundir import expert_dir, experts_dir
from .wire import (
    MAX_META_BYTES,
    MAX_MODEL_CONFIG_BYTES,
    WireError,
    as_float,
    as_int,
    as_str,
    loads,
)

_SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_EXPERT_ID = 2**20


@dataclass(frozen=True)
class ExpertSpec:
    """What every expert of a run must be.

    Attributes
    ----------
    num_experts : int
        Expert ids are 0..num_experts−1 (``grow``: num_experts is allowed too, for a late expert on a new cluster).
    model_config : dict
        The diffusers model config every checkpoint must declare and match (the preset at the dataset's shapes).
    max_bytes : int
        The size limit of the weights file (0 = none).
    preset : str
        The preset's name, for messages.
    time_sampling : dict | None
        How the run's FM experts draw their training times (``{"kind": "uniform"}`` or the logit-normal with its
        mean and std); an FM expert that declares another is refused. None: not checked.
    """

    num_experts: int
    model_config: dict
    max_bytes: int
    preset: str = ""
    time_sampling: dict | None = None


def parse_expert_meta(meta: Any, *, max_id: int = MAX_EXPERT_ID) -> dict[str, Any]:
    """Checkpoint metadata from a peer (a JSON string or an already parsed dict) checked field by field.

    Returns the metadata with the checked fields normalised (ints as int, figures as float); other fields are kept
    as sent (bounded in size and depth by the JSON parse). Raises :class:`CheckpointRejected`.
    """
    try:
        m = loads(meta, "metadata", max_bytes=MAX_META_BYTES) if isinstance(meta, (str, bytes)) else meta
        if not isinstance(m, dict):
            raise WireError(f"metadata: expected a JSON object, got {type(m).__name__}")
        lacks = [k for k in _REQUIRED if k not in m]
        if lacks:
            raise WireError(f"metadata lacks {lacks}")
        out = dict(m)
        out["expert_id"] = as_int(m["expert_id"], "metadata expert_id", 0, max_id)
        out["cluster_id"] = as_int(m["cluster_id"], "metadata cluster_id", 0, max_id)
        out["objective"] = as_str(m["objective"], "metadata objective", choices=OBJECTIVES)
        out["preset"] = as_str(m["preset"], "metadata preset", max_len=64)
        if as_str(m["time_convention"], "metadata time_convention", max_len=512) != TIME_CONVENTION:
            raise WireError(f"metadata time_convention {m['time_convention'][:60]!r}… is not this code's")
        out["steps"] = as_int(m["steps"], "metadata steps")
        out["images_seen"] = as_int(m["images_seen"], "metadata images_seen")
        out["device_seconds"] = as_float(m["device_seconds"], "metadata device_seconds")
        sha = as_str(m["sha256"], "metadata sha256", max_len=64)
        if not _SHA256.fullmatch(sha):
            raise WireError(f"metadata sha256 {sha[:20]!r} is not 64 lowercase hex digits")
        if out["objective"] == "ddpm":
            for k in ("schedule", "num_train_timesteps"):
                if k not in m:
                    raise WireError(f"metadata of a ddpm expert lacks {k!r}")
            out["schedule"] = as_str(m["schedule"], "metadata schedule", choices=SCHEDULES)
            out["num_train_timesteps"] = as_int(m["num_train_timesteps"], "metadata num_train_timesteps", 2, 100_000)
        if out["objective"] == "ddpm" and m.get("clean_prior") is not None:  # the node's measured clean prior
            parse_clean_prior(m["clean_prior"])
        if out["objective"] == "fm" and m.get("time_sampling") is not None:  # how training drew t
            out["time_sampling"] = _time_sampling(m["time_sampling"])
        if m.get("weights_dtype") is not None:
            out["weights_dtype"] = as_str(m["weights_dtype"], "metadata weights_dtype", choices=WIRE_DTYPES)
        for k in ("resumed_steps", "peak_memory_bytes"):
            if m.get(k) is not None:
                out[k] = as_int(m[k], f"metadata {k}")
        if m.get("final_loss") is not None:
            out["final_loss"] = as_float(m["final_loss"], "metadata final_loss", -1e30, 1e30)
    except WireError as e:
        raise CheckpointRejected(str(e)) from None
    return out


def _time_sampling(value: Any) -> dict[str, Any]:
    """An FM expert's ``time_sampling`` metadata, checked: what :class:`~hddm_flower.experts.FlowMatchingExpert`
    accepts, nothing else."""
    if not isinstance(value, dict):
        raise WireError(f"metadata time_sampling: expected an object, got {type(value).__name__}")
    kind = as_str(value.get("kind"), "metadata time_sampling kind", choices=FM_TIME_SAMPLINGS)
    if kind == "uniform":
        return {"kind": kind}
    mean = as_float(value.get("mean"), "metadata time_sampling mean", -100.0, 100.0)
    return {"kind": kind, "mean": mean, "std": as_float(value.get("std"), "metadata time_sampling std", 1e-6, 100.0)}


_REQUIRED = (*REQUIRED_META, "sha256")  # what a checkpoint's own metadata must hold, plus its hash on the wire


def check_against_run(meta: dict[str, Any], spec: ExpertSpec, objective_assigned: str | None = None) -> None:
    """Parsed metadata cross-checked against the run: expert k is trained on cluster k (the report, the model
    cards and the evaluation look the cluster up by this id), the objective the run assigned, and an FM expert's
    training-time sampling against the run's. Raises :class:`CheckpointRejected`."""
    if meta["cluster_id"] != meta["expert_id"]:
        raise CheckpointRejected(
            f"metadata cluster_id {meta['cluster_id']} is not expert {meta['expert_id']}'s cluster (expert k is "
            "trained on cluster k)"
        )
    if objective_assigned is not None and meta.get("objective_assigned", objective_assigned) != objective_assigned:
        raise CheckpointRejected(
            f"metadata objective_assigned {str(meta['objective_assigned'])[:20]!r} is not the {objective_assigned!r} "
            "the run assigned"
        )
    ts = meta.get("time_sampling")
    if spec.time_sampling is not None and meta["objective"] == "fm" and ts is not None and ts != spec.time_sampling:
        raise CheckpointRejected(f"metadata time_sampling {ts} is not the run's {spec.time_sampling}")


def parse_model_config(config: Any, expected: dict, preset: str = "") -> dict:
    """A peer's model config (JSON string or dict; keys starting with ``_`` ignored), equal to ``expected``."""
    try:
        c = (
            loads(config, "model config", max_bytes=MAX_MODEL_CONFIG_BYTES)
            if isinstance(config, (str, bytes))
            else config
        )
    except WireError as e:
        raise CheckpointRejected(str(e)) from None
    if not isinstance(c, dict):
        raise CheckpointRejected(f"model config: expected a JSON object, got {type(c).__name__}")
    declared = {k: v for k, v in c.items() if not k.startswith("_")}
    if declared != expected:
        diff = sorted(k for k in set(declared) | set(expected) if declared.get(k) != expected.get(k))
        raise CheckpointRejected(
            f"model config differs from the run's preset {preset!r} in {[d[:40] for d in diff[:4]]}"
        )
    return dict(expected)


def accept_expert(
    run_dir: Path,
    weights_file: Path,
    meta: Any,
    model_config: Any,
    spec: ExpertSpec,
    *,
    expert_id: int | None = None,
    grow: bool = False,
    note: dict | None = None,
    replace: bool = False,
    before_install: Callable[[dict], None] | None = None,
    objective_assigned: str | None = None,
) -> dict[str, Any]:
    """Check an expert and install it as ``run_dir/experts/expert-<id>``; returns its installed metadata.

    ``weights_file`` is a file this process owns (it is moved into the expert folder or deleted, whatever
    happens); ``meta`` and ``model_config`` are as the peer sent them (JSON strings or dicts). ``expert_id``: the id
    the reply must claim (the one its train message asked for); ``grow``: ``spec.num_experts`` is a valid id too
    (a late expert on a new cluster). ``note`` is added to the metadata (e.g. when it was added). An existing
    expert folder is refused unless ``replace``. ``before_install(meta)`` runs after every check passed and
    before the expert is installed (e.g. to grow the run for it); if it raises, nothing is installed.
    ``objective_assigned``: the objective the run asked this expert for (the metadata's own
    ``objective_assigned`` must say the same; the objective trained may differ, a node may force its own).
    """
    try:
        m = parse_expert_meta(meta)
        limit = spec.num_experts if grow else spec.num_experts - 1
        if expert_id is not None and m["expert_id"] != expert_id:
            raise CheckpointRejected(f"reply claims expert {m['expert_id']}, expected {expert_id}")
        if m["expert_id"] > limit:
            raise CheckpointRejected(f"expert id {m['expert_id']} is outside this run's 0..{spec.num_experts - 1}")
        check_against_run(m, spec, objective_assigned)
        config = parse_model_config(model_config, spec.model_config, spec.preset)
        folder = expert_dir(run_dir, m["expert_id"])
        if folder.exists() and not replace:
            raise FileExistsError(f"{folder} already exists; pass --replace to replace that expert")
        m["sha256"] = validate_weights_file(
            weights_file, config, sha256=m["sha256"], dtype=m.get("weights_dtype"), max_bytes=spec.max_bytes
        )
        m["weights_bytes"] = os.path.getsize(weights_file)
        m |= note or {}
        if before_install is not None:
            before_install(m)
        install_expert(folder, weights_file, config, m)
    finally:
        Path(weights_file).unlink(missing_ok=True)
    return m


class ExpertStore:
    """The run directory's experts as the Flower strategy sees them: where replies are spooled, and
    :meth:`accept`, which hands each reply to :func:`accept_expert`. The ServerApp owns it and gives it to the
    strategy, as Flower's own strategies leave saving to the ServerApp."""

    def __init__(self, run_dir: Path, spec: ExpertSpec):
        self.run_dir, self.spec = Path(run_dir), spec

    @property
    def incoming(self) -> Path:
        """Where received weights are written before they are accepted (inside ``experts/``, so that
        accepting is a rename)."""
        path = experts_dir(self.run_dir)
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def max_bytes(self) -> int:
        return self.spec.max_bytes

    def accept(
        self, expert_id: int, weights_file: Path, meta: Any, model_config: Any, objective: str | None = None
    ) -> dict[str, Any]:
        """Accept the expert ``expert_id`` a node sent (``objective``: the one the run assigned it); raises
        :class:`CheckpointRejected` (or another exception for a file-system failure) when it is refused, consuming
        ``weights_file`` either way."""
        return accept_expert(
            self.run_dir, weights_file, meta, model_config, self.spec, expert_id=expert_id, objective_assigned=objective
        )
