"""The run directory: its layout, which experts it holds, and when a run may write into an existing one.

A run directory is what a run leaves behind and what every later stage reads::

    config.yaml                  the resolved configuration the experts were trained with
    experts/expert-<k>/          one folder per expert: safetensors weights, config.json, hddm_expert.json
    router/                      the router (safetensors + hddm_router.json)
    report.json, report.md       metrics, per-expert metadata, missing experts and why, versions
    samples.png                  the sample grid of the configured prompts (rows: prompts)
    grids/                       one PNG per evaluation prompt (rows: routing modes)
    router-weights.png           mean mixing weight of each expert over t, per routing mode
    expert-usage.png             how often each expert ran, per routing mode
    feature_net/                 the run's own feature classifier (when no Inception weights are configured)
    model_index.json, pipeline.py  the run as a diffusers pipeline (``hddm_flower.hddm_pipeline.HDDMPipeline``)
    text_encoder.json            the text encoder reference and token count (also in every expert folder)
    uncond.safetensors           the empty caption's text states, the CFG baseline (also in every expert folder)
    README.md                    the model card (every expert folder has its own)
    dataset-<K+1>/               the data view of a run grown by a late expert (``hddm add-expert``)

Every file name of that layout is spelled here and only here. "Which experts are present, which are missing
and why" is computed by :func:`present_experts` and :func:`missing_experts`, for the ServerApp and the command
line alike, and :func:`check_rerun` is the one rule for writing experts into a directory that already holds some.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from .config.io import load_config
from .config.rules import ConfigError
from .config.schema import TRAINING_SECTIONS, Config
from .safeio import write_atomic

CONFIG = "config.yaml"
EXPERTS = "experts"
ROUTER = "router"
REPORT_JSON = "report.json"
REPORT_MD = "report.md"
SAMPLES = "samples.png"
GRIDS = "grids"
ROUTER_WEIGHTS_PLOT = "router-weights.png"
EXPERT_USAGE_PLOT = "expert-usage.png"
MODEL_INDEX = "model_index.json"  # the run directory as a diffusers pipeline folder
FEATURE_NET = "feature_net"  # also the diffusers pipeline component of that name
EXPERT_PREFIX = "expert-"
PIPELINE_FILE = "pipeline.py"  # for DiffusionPipeline.from_pretrained(run_dir, custom_pipeline="pipeline")
TEXT_ENCODER_REF = "text_encoder.json"
UNCOND = "uncond.safetensors"
MODEL_CARD = "README.md"
INCOMING_PREFIX = ".incoming-"  # a partly received or copied file inside experts/: never an expert

_EXPERT_FOLDER = re.compile(rf"{re.escape(EXPERT_PREFIX)}(0|[1-9][0-9]{{0,8}})")


def experts_dir(run_dir: Path) -> Path:
    return Path(run_dir) / EXPERTS


def expert_dir(run_dir: Path, expert_id: int) -> Path:
    return experts_dir(run_dir) / f"{EXPERT_PREFIX}{int(expert_id)}"


def incoming_name(expert_id: int) -> str:
    """The file-name prefix of an expert's weights while they are received or copied, before validation."""
    return f"{INCOMING_PREFIX}{EXPERT_PREFIX}{int(expert_id)}"


def dataset_view(run_dir: Path, num_experts: int) -> Path:
    """The data view of a run grown to ``num_experts`` experts by a late one."""
    return Path(run_dir) / f"dataset-{int(num_experts)}"


def config_before_expert(run_dir: Path, expert_id: int) -> Path:
    """Where the config of a run is kept when a late expert ``expert_id`` grows it."""
    return Path(run_dir) / f"config.before-expert-{int(expert_id)}.yaml"


def features_before_expert(run_dir: Path, expert_id: int) -> Path:
    """Where the run's feature network is kept when a late expert ``expert_id`` adds a cluster."""
    return Path(run_dir) / f"{FEATURE_NET}.before-expert-{int(expert_id)}"


def expert_folders(run_dir: Path) -> dict[int, Path]:
    """Expert id → folder, for every expert folder (``experts/expert-<k>``, a directory), by id. Folders are only
    ever installed whole (:func:`~hddm_flower.checkpoints.install_expert`); a damaged one is refused when it is
    loaded, and still counts as present so that no run writes over it."""
    out = {}
    root = experts_dir(run_dir)
    if root.is_dir():
        for folder in root.iterdir():
            m = _EXPERT_FOLDER.fullmatch(folder.name)
            if m and folder.is_dir():
                out[int(m.group(1))] = folder
    return dict(sorted(out.items()))


def present_experts(run_dir: Path) -> set[int]:
    """The ids of the experts installed in ``run_dir``."""
    return set(expert_folders(run_dir))


def read_report(run_dir: Path) -> dict[str, Any]:
    """The run's ``report.json`` ({} when there is none)."""
    path = Path(run_dir) / REPORT_JSON
    return json.loads(path.read_text()) if path.is_file() else {}


def missing_experts(
    run_dir: Path, num_experts: int, lost: dict[int, str] | None = None, *, default: str = "no expert folder"
) -> list[dict]:
    """``report.json``'s ``missing``: every expert id in 0..K−1 that ``run_dir`` lacks, with its reason — from
    ``lost`` (this run's reasons), else from the run directory's previous report, else ``default``."""
    lost = lost or {}
    before = {int(m["expert_id"]): str(m["reason"]) for m in read_report(run_dir).get("missing", [])}
    present = present_experts(run_dir)
    return [
        {"expert_id": k, "reason": lost.get(k) or before.get(k, default)}
        for k in range(num_experts)
        if k not in present
    ]


def check_rerun(run_dir: Path, cfg: Config, targets: list[int] | None) -> None:
    """The rule for training experts into ``run_dir`` (``targets``: the expert ids to train, None = all).

    A run of all experts needs a directory without experts. A targeted run (the ids an earlier run lost) needs
    the earlier run's training configuration (:data:`~hddm_flower.config.schema.TRAINING_SECTIONS`) and ids that are
    not present yet. Raises :class:`~hddm_flower.config.rules.ConfigError` naming the conflict.
    """
    present = present_experts(run_dir)
    if targets is None and present:
        raise ConfigError(
            f"run-dir {run_dir} already holds experts from another run; choose a new run-dir, or "
            f"train only the missing ones with --run-config 'experts=\"…\"'"
        )
    if targets is not None:
        check_same_training(run_dir, cfg)
        if set(targets) & present:
            raise ConfigError(
                f"experts {sorted(set(targets) & present)} are already in {experts_dir(run_dir)}; "
                f"remove their folders to train them again"
            )


def check_same_training(run_dir: Path, cfg: Config) -> None:
    """Raise :class:`ConfigError` when ``run_dir/config.yaml`` exists and was trained with another configuration
    of the sections experts depend on: experts of one run must share it."""
    path = Path(run_dir) / CONFIG
    if not path.is_file():
        return
    earlier = load_config(path).to_dict()
    diff = [k for k in TRAINING_SECTIONS if earlier[k] != cfg.to_dict()[k]]
    if diff:
        raise ConfigError(
            f"run-dir {run_dir} was trained with another {', '.join(diff)} configuration "
            f"(see its {CONFIG}); experts of one run must share it"
        )


def trained_objectives(run_dir: Path, assigned: list[str]) -> list[str]:
    """The objective of each expert id: what a present expert's metadata says it trained with, else
    ``assigned`` (the config's assignment)."""
    from .checkpoints import read_expert_meta

    objectives = list(assigned)
    for k, folder in expert_folders(run_dir).items():
        if k < len(objectives):
            objectives[k] = read_expert_meta(folder)["objective"]
    return objectives


def write_config(path: Path, cfg: Config, origin: str) -> None:
    """Write ``cfg`` as YAML (atomically), headed by a comment that says where it came from."""
    write_atomic(Path(path), f"# {origin}\n" + yaml.safe_dump(cfg.to_dict(), sort_keys=False))
