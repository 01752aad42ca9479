"""Checkpoints on disk: safetensors weights with their metadata, written atomically.

An expert folder is what diffusers ``PixArtTransformer2DModel.from_pretrained(folder)`` loads (``config.json`` +
``diffusion_pytorch_model.safetensors``) plus ``hddm_expert.json``, the metadata that says how to use it
(objective, schedule, time convention, preset, provenance and compute). The server reads the objective from
there, never from a name or a position. Nothing is ever unpickled.

Every diffusers load in the project passes ``low_cpu_mem_usage=False`` (a pipeline's through
``hddm_pipeline.eager_loading``, which leaves a ``device_map`` load lazy): the weights are read into initialised
modules (``accelerate``, which the lazy path needs, is not a dependency), and diffusers then has nothing to warn
about at each of a run's dozens of loads.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import diffusers
import torch
from diffusers import PixArtTransformer2DModel
from safetensors import SafetensorError, safe_open
from safetensors.torch import save, save_file
from torch import Tensor

from .choices import T_EPS, WIRE_DTYPES, X0_CLAMP
from .clean_prior import parse_clean_prior
from .experts import DDPMExpert, Expert, FlowMatchingExpert
from .models import ExpertNet, Router
from .objectives import FM_TIME_SCALE

WEIGHTS = "diffusion_pytorch_model.safetensors"
META = "hddm_expert.json"
MODEL_CONFIG = "config.json"  # the diffusers model config of an expert folder
SCHEDULER = "scheduler_config.json"  # the diffusers scheduler that drives this expert on its own
ROUTER_META = "hddm_router.json"
TIME_CONVENTION = "fm: t in [0,1], t=1 noise, x_t=(1-t)x0+t*eps, v=eps-x0, net timestep=999t; ddpm: tau in 0..T-1"
REQUIRED_META = (
    "expert_id",
    "cluster_id",
    "objective",
    "preset",
    "time_convention",
    "steps",
    "images_seen",
    "device_seconds",
)
_SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


class CheckpointRejected(ValueError):
    """A received checkpoint failed validation; the message is the reason recorded in the report."""


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _atomic_folder(folder: Path):
    """A temporary sibling folder that replaces ``folder`` on success and vanishes on failure."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))


def _commit(tmp: Path, folder: Path) -> None:
    tmp.chmod(0o755)  # mkdtemp makes it private
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)


def time_convention(meta: dict[str, Any]) -> dict[str, Any]:
    """The machine-readable time convention of an expert (``hddm_expert.json``'s ``time``), from its objective.

    FM: time ``t ∈ [0, 1]`` with t = 1 pure noise, path ``x_t = (1 − t)·x0 + t·eps``, the network predicts the
    velocity ``eps − x0`` and sees the timestep ``999·t``. DDPM: integer timesteps ``tau ∈ {0, …, T − 1}`` of a VP
    schedule, ``z = sqrt(alpha_bar)·x0 + sqrt(1 − alpha_bar)·eps``, the network predicts eps at timestep tau.
    """
    if meta["objective"] == "fm":
        return {
            "variable": "t",
            "range": [0.0, 1.0],
            "noise_at": 1.0,
            "path": "x_t = (1 - t) * x0 + t * eps",
            "prediction": "velocity",
            "target": "eps - x0",
            "net_timestep": "t * 999",
            "net_timestep_scale": FM_TIME_SCALE,
        }
    if meta["objective"] == "ddpm":
        T = int(meta["num_train_timesteps"])
        return {
            "variable": "tau",
            "range": [0, T - 1],
            "noise_at": T - 1,
            "path": "z = sqrt(alpha_bar[tau]) * x0 + sqrt(1 - alpha_bar[tau]) * eps",
            "prediction": "epsilon",
            "target": "eps",
            "net_timestep": "tau",
            "schedule": meta["schedule"],
            "num_train_timesteps": T,
        }
    raise ValueError(f"unknown objective {meta['objective']!r} in expert {meta.get('expert_id')}")


# diffusers' names of the project's DDPM schedules (same betas: linear 1e-4 → 0.02; Nichol & Dhariwal cosine)
DIFFUSERS_BETA_SCHEDULES = {"linear": "linear", "cosine": "squaredcos_cap_v2"}


def scheduler_config(meta: dict[str, Any]):
    """The diffusers scheduler that samples this expert on its own (saved as ``scheduler_config.json``).

    FM: ``FlowMatchEulerDiscreteScheduler`` with ``num_train_timesteps=999``, so that its timestep ``σ·999`` is
    the ``999·t`` the network was trained with (σ = t). The project's time grid is
    ``set_timesteps(sigmas=linspace(1, 0, n + 1)[:-1])``; with it, diffusers' Euler steps equal the project's.
    DDPM: ``DDPMScheduler`` with the expert's schedule, ε prediction and ``clip_sample`` on the data range
    (``sample_range`` in the metadata, 1 for pixels): without clipping the predicted x0 the ancestral sampler
    drifts out of range at the noisiest steps.
    """
    from diffusers import DDPMScheduler, FlowMatchEulerDiscreteScheduler

    if meta["objective"] == "fm":
        return FlowMatchEulerDiscreteScheduler(num_train_timesteps=int(FM_TIME_SCALE), shift=1.0)
    if meta["objective"] == "ddpm":
        if meta["schedule"] not in DIFFUSERS_BETA_SCHEDULES:
            raise ValueError(f"unknown DDPM schedule {meta['schedule']!r} in expert {meta.get('expert_id')}")
        return DDPMScheduler(
            num_train_timesteps=int(meta["num_train_timesteps"]),
            beta_schedule=DIFFUSERS_BETA_SCHEDULES[meta["schedule"]],
            beta_start=1e-4,
            beta_end=0.02,
            prediction_type="epsilon",
            clip_sample=True,
            clip_sample_range=float(meta.get("sample_range", 1.0)),
            timestep_spacing="trailing",
        )
    raise ValueError(f"unknown objective {meta['objective']!r} in expert {meta.get('expert_id')}")


def _wire_state(state_dict: dict[str, Tensor], dtype: str | None) -> dict[str, Tensor]:
    """``state_dict`` on the CPU, contiguous, its floating tensors cast to ``dtype`` (None: each keeps its own)."""
    if dtype is not None and dtype not in WIRE_DTYPES:
        raise ValueError(f"unknown weights dtype {dtype!r}; expected one of {WIRE_DTYPES}")
    cast = getattr(torch, dtype) if dtype else None
    return {
        k: (v.to(cast) if cast is not None and v.is_floating_point() else v).detach().contiguous().cpu()
        for k, v in state_dict.items()
    }


def weights_bytes(state_dict: dict[str, Tensor], dtype: str | None = None) -> bytes:
    """The safetensors serialisation of ``state_dict`` (what a client sends): every tensor kept in its own dtype
    (bf16 stays bf16) unless ``dtype`` casts the floating ones (e.g. ``"bfloat16"`` halves the upload)."""
    return save(_wire_state(state_dict, dtype), metadata={"format": "pt"})


def validate_weights_file(
    path: str | os.PathLike,
    model_config: dict,
    *,
    sha256: str | None = None,
    dtype: str | None = None,
    max_bytes: int = 0,
) -> str:
    """Check a received weights file before anything uses or keeps it; returns its sha256.

    In this order (cheapest first, nothing loaded before the header is trusted): size ≤ ``max_bytes`` (0 = no
    limit); sha256 equal to the declared one; a safetensors file (a pickle or anything else is refused, never
    unpickled); exactly the tensor names and shapes of ``model_config``'s model; every tensor of one floating dtype
    in :data:`WIRE_DTYPES` (the declared ``dtype`` when given); all values finite (read one tensor at a time
    from the memory-mapped file). Raises :class:`CheckpointRejected` with the reason.
    """
    path = Path(path)
    size = path.stat().st_size
    if max_bytes and size > max_bytes:
        raise CheckpointRejected(f"size {size} bytes exceeds the limit of {max_bytes} bytes")
    digest = sha256_file(path)
    if sha256 is not None and digest != sha256:
        raise CheckpointRejected(
            f"sha256 mismatch: the metadata says {sha256[:12]}…, the weights hash to {digest[:12]}…"
        )
    try:
        with safe_open(path, framework="pt") as f:
            names = list(f.keys())
            ref = _reference_shapes(json.dumps(model_config, sort_keys=True))
            missing, extra = sorted(set(ref) - set(names)), sorted(set(names) - set(ref))
            if missing or extra:
                raise CheckpointRejected(
                    f"tensor names do not match the {model_config.get('num_layers')}-layer "
                    f"preset: missing {missing[:3]}, unexpected {extra[:3]}"
                )
            dtypes = set()
            for k in names:
                sl = f.get_slice(k)
                shape, kind = tuple(sl.get_shape()), sl.get_dtype()
                if shape != ref[k]:
                    raise CheckpointRejected(f"tensor {k} has shape {shape}, expected {ref[k]}")
                if kind not in _SAFETENSORS_DTYPES:
                    raise CheckpointRejected(f"tensor {k} has dtype {kind}; expected one of {WIRE_DTYPES}")
                dtypes.add(_SAFETENSORS_DTYPES[kind])
            if len(dtypes) > 1 or (dtype is not None and dtypes != {dtype}):
                raise CheckpointRejected(
                    f"tensor dtypes {sorted(dtypes)} do not match the declared {dtype or 'single dtype'}"
                )
    except SafetensorError as e:
        raise CheckpointRejected(f"not a valid safetensors file ({_first_line(e)}); nothing was unpickled") from e
    _check_finite(path)
    return digest


@functools.lru_cache(maxsize=16)
def _reference_shapes(model_config_json: str) -> dict[str, tuple[int, ...]]:
    """Tensor name → shape of the model a config describes (built on the meta device once per config)."""
    with torch.device("meta"):
        ref = PixArtTransformer2DModel.from_config(json.loads(model_config_json)).state_dict()
    return {k: tuple(v.shape) for k, v in ref.items()}


def _check_finite(path: Path) -> None:
    """All values finite, reading one tensor at a time with plain reads (not a memory map, whose pages would stay
    resident: the server's memory stays at about one tensor). The header was validated by safetensors before."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            start, end = info["data_offsets"]
            f.seek(8 + n + start)
            dtype = getattr(torch, _SAFETENSORS_DTYPES[info["dtype"]])
            values = torch.frombuffer(bytearray(f.read(end - start)), dtype=dtype) if end > start else None
            if values is not None and not torch.isfinite(values).all():
                raise CheckpointRejected(f"tensor {name} has non-finite values (NaN or inf)")


def install_expert(
    folder: str | os.PathLike, weights_file: str | os.PathLike, model_config: dict, meta: dict[str, Any]
) -> None:
    """Move an already validated weights file into a new expert folder (atomically) with its config and
    metadata; the file is moved, never loaded or re-serialised."""
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise CheckpointRejected(f"expert metadata lacks {missing}")
    folder = Path(folder)
    tmp = _atomic_folder(folder)
    try:
        os.replace(weights_file, tmp / WEIGHTS)
        config = {
            "_class_name": "PixArtTransformer2DModel",
            "_diffusers_version": diffusers.__version__,
            **model_config,
        }
        (tmp / MODEL_CONFIG).write_text(json.dumps(config, indent=2))
        (tmp / META).write_text(json.dumps(meta | {"time": time_convention(meta)}, indent=2))
        scheduler_config(meta).save_config(tmp)
        _commit(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def save_expert(
    folder: str | os.PathLike,
    state_dict: dict[str, Tensor],
    model_config: dict,
    meta: dict[str, Any],
    *,
    dtype: str | None = None,
) -> str:
    """Write an expert folder atomically (safetensors weights, then :func:`install_expert`); returns the sha256
    of the weights file. ``dtype`` casts the floating tensors (``expert.weights_dtype``; None keeps each one's),
    and is recorded as ``weights_dtype`` in the metadata."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    fd, weights = tempfile.mkstemp(prefix=f".{folder.name}-", suffix=".safetensors", dir=folder.parent)
    os.close(fd)
    try:
        save_file(
            _wire_state(state_dict, dtype),
            weights,
            metadata={"format": "pt", "objective": str(meta.get("objective", ""))},
        )
        digest = sha256_file(weights)
        install_expert(
            folder, weights, model_config, {**meta, **({"weights_dtype": dtype} if dtype else {}), "sha256": digest}
        )
    finally:
        Path(weights).unlink(missing_ok=True)
    return digest


def read_expert_meta(folder: str | os.PathLike) -> dict[str, Any]:
    path = Path(folder) / META
    if not path.exists():
        raise FileNotFoundError(f"{folder} is not an expert folder (no {META})")
    return json.loads(path.read_text())


def make_expert(
    net: ExpertNet,
    meta: dict[str, Any],
    *,
    conversion: str = "schedule_aware",
    t_eps: float = T_EPS,
    x0_clamp: float = X0_CLAMP,
    clean_estimate: str = "clamp",
) -> Expert:
    """Wrap a network in the adapter its metadata names: the one place the objective is read. A DDPM expert's
    ``clean_prior`` (measured by its node, :mod:`hddm_flower.clean_prior`) is checked here; experts without one
    load as before."""
    if meta["objective"] == "fm":
        return FlowMatchingExpert(net, meta.get("time_sampling"))
    if meta["objective"] == "ddpm":
        prior = None
        if meta.get("clean_prior") is not None:
            prior = parse_clean_prior(meta["clean_prior"])
        return DDPMExpert(
            net,
            meta["schedule"],
            meta["num_train_timesteps"],
            conversion=conversion,
            t_eps=t_eps,
            x0_clamp=x0_clamp,
            clean_estimate=clean_estimate,
            clean_prior=prior,
        )
    raise ValueError(f"unknown objective {meta['objective']!r} in expert {meta.get('expert_id')}")


def load_expert_model(
    folder: str | os.PathLike, torch_dtype: torch.dtype | None = None
) -> tuple[PixArtTransformer2DModel, dict[str, Any]]:
    """The diffusers transformer of an expert folder and its metadata, after checking the weights' sha256."""
    folder = Path(folder)
    meta = read_expert_meta(folder)
    if "sha256" in meta and sha256_file(folder / WEIGHTS) != meta["sha256"]:
        raise ValueError(f"{folder / WEIGHTS} does not match the sha256 in its metadata (corrupt or altered)")
    return PixArtTransformer2DModel.from_pretrained(
        folder, torch_dtype=torch_dtype, low_cpu_mem_usage=False
    ).eval(), meta


def load_expert(folder: str | os.PathLike, **conversion: Any) -> tuple[Expert, dict[str, Any]]:
    """Load an expert folder, verify its checksum, and return the velocity adapter and its metadata."""
    transformer, meta = load_expert_model(folder)
    return make_expert(ExpertNet(transformer), meta, **conversion), meta


def save_router(folder: str | os.PathLike, router: Router, meta: dict[str, Any]) -> None:
    folder = Path(folder)
    tmp = _atomic_folder(folder)
    try:
        router.save_pretrained(tmp)
        (tmp / ROUTER_META).write_text(json.dumps(meta, indent=2, allow_nan=False))
        _commit(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_router(folder: str | os.PathLike) -> Router:
    return Router.from_pretrained(folder, low_cpu_mem_usage=False).eval()
