"""A late expert: added to an assembled run, validated like one received over Flower, then the router is
retrained and the run re-evaluated."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from ..accept import accept_expert, parse_expert_meta, parse_model_config
from ..checkpoints import META, MODEL_CONFIG, WEIGHTS, CheckpointRejected
from ..config.io import config_from_dict, load_config
from ..config.schema import Config
from ..data import Dataset, check_clusters, extend_dataset
from ..provenance import now
from ..rundir import (
    CONFIG,
    FEATURE_NET,
    config_before_expert,
    dataset_view,
    expert_dir,
    experts_dir,
    features_before_expert,
    incoming_name,
    missing_experts,
    read_report,
    trained_objectives,
    write_config,
)
from ..safeio import copy_file, read_text
from ..wire import MAX_META_BYTES, MAX_MODEL_CONFIG_BYTES
from .assemble import finish_run
from .expert import expert_spec
from .prepare import assign_objectives, prepare_data

log = logging.getLogger(__name__)


def add_expert(
    run_dir: Path,
    checkpoint: Path,
    *,
    cfg: Config | None = None,
    cache_dir: str | Path | None = None,
    replace: bool = False,
    cluster_data: str | Path | None = None,
    progress: bool = False,
) -> dict:
    """Add a late expert to an assembled run: validate it, install it, retrain the router, re-evaluate.

    ``checkpoint`` is an expert folder (``hddm train-expert --out``: safetensors weights + ``hddm_expert.json``),
    e.g. a replacement for a lost expert, or a new institution that trained later on data the run never had. It
    goes through the path every expert received over Flower takes (:func:`~hddm_flower.accept.accept_expert`:
    bounded metadata, the run's model config, size, sha256, safetensors, shapes, finite values); its files are
    opened as files from outside (:mod:`~hddm_flower.safeio`: regular files only, the weights copied with the size
    limit enforced while they stream, nothing left on failure); no other expert is touched or retrained. ``cfg``
    defaults to the run's ``config.yaml``. Returns the new report.

    An expert id equal to ``num_experts`` grows the run by one expert: ``cluster_data`` must then be its
    cluster's shard set (a ``cluster-k`` folder of a dataset prepared like the run's), which becomes cluster K of
    a dataset view in ``run_dir/dataset-<K+1>`` (:func:`~hddm_flower.data.extend_dataset`); the run's
    ``config.yaml`` gets ``num_experts`` K+1, the objectives with the new one appended and ``data.prepared`` set to
    the view (the old one is kept as ``config.before-expert-<K>.yaml``); the router is retrained with K+1 classes.
    """
    run_dir, checkpoint = Path(run_dir), Path(checkpoint)
    cfg = cfg or load_config(run_dir / CONFIG)
    # the folder comes from outside: its files are opened (regular files only, sizes bounded), never trusted
    if not (checkpoint / META).exists():
        raise FileNotFoundError(f"{checkpoint} is not an expert folder (no {META})")
    try:
        meta = parse_expert_meta(read_text(checkpoint / META, "expert metadata", MAX_META_BYTES))
    except CheckpointRejected as e:
        raise CheckpointRejected(f"{checkpoint / META}: {e}") from None
    declared = read_text(checkpoint / MODEL_CONFIG, "expert model config", MAX_MODEL_CONFIG_BYTES)
    expert_id = meta["expert_id"]
    grow = expert_id == cfg.num_experts
    if not 0 <= expert_id <= cfg.num_experts:
        raise CheckpointRejected(
            f"{checkpoint}: expert id {expert_id} is outside this run's 0..{cfg.num_experts - 1}"
            f" and is not the next one ({cfg.num_experts}); expert ids have no gaps"
        )
    if grow and cluster_data is None:
        raise CheckpointRejected(
            f"{checkpoint}: expert {expert_id} is new to this run (0..{cfg.num_experts - 1}); "
            f"pass --cluster-data with its cluster's shard set, for the router and the "
            f"evaluation"
        )
    if not grow and cluster_data is not None:
        raise CheckpointRejected(
            f"{checkpoint}: expert {expert_id} already has its cluster in this run's dataset; "
            f"--cluster-data is only for a new expert id ({cfg.num_experts})"
        )
    folder = expert_dir(run_dir, expert_id)
    existed = folder.exists()
    if existed and not replace:
        raise FileExistsError(f"{folder} already exists; pass --replace to replace that expert")
    dataset = prepare_data(cfg, cache_dir)
    spec = expert_spec(cfg, dataset)
    try:
        parse_model_config(declared, spec.model_config, spec.preset)  # refused before any byte is copied
    except CheckpointRejected as e:
        raise CheckpointRejected(f"{checkpoint}: {e}") from None
    view, old_config = dataset_view(run_dir, expert_id + 1), config_before_expert(run_dir, expert_id)
    old_features = features_before_expert(run_dir, expert_id)
    if grow:
        if view.exists():
            raise FileExistsError(
                f"{view} already exists (left by an earlier attempt?); remove it to add expert {expert_id}"
            )
        objectives = trained_objectives(run_dir, assign_objectives(cfg, dataset)) + [meta["objective"]]
        grown = config_from_dict(
            cfg.to_dict()
            | {
                "num_experts": expert_id + 1,
                "objectives": {
                    "ddpm": objectives.count("ddpm"),
                    "fm": objectives.count("fm"),
                    "ddpm_clusters": [k for k, o in enumerate(objectives) if o == "ddpm"],
                    "per_expert": None,
                },
                "data": cfg.to_dict()["data"] | {"prepared": str(view.resolve())},
                # the new expert is pinned to no node (a pinned run keeps one entry per expert)
                "federation": cfg.to_dict()["federation"]
                | {"expert_nodes": cfg.federation.expert_nodes + [0] if cfg.federation.expert_nodes else []},
            },
            f"{run_dir} + expert {expert_id}",
        )
    done: list[str] = []

    def grow_run(m: dict) -> None:
        """After the expert passed every check: the data view and the grown config (undone below on failure)."""
        extended = extend_dataset(dataset.root, Path(cluster_data), view)
        done.append("view")
        check_clusters(Dataset.open(extended).meta, grown.num_experts, str(extended))
        shutil.copyfile(run_dir / CONFIG, old_config)
        write_config(
            run_dir / CONFIG, grown, f"{run_dir} grown by expert {expert_id} ({m['objective']}) from {checkpoint}"
        )
        done.append("config")
        if (run_dir / FEATURE_NET).exists():  # trained on the old clusters: the new evaluation trains its own
            os.replace(run_dir / FEATURE_NET, old_features)

    experts_dir(run_dir).mkdir(parents=True, exist_ok=True)
    tmp = experts_dir(run_dir) / f"{incoming_name(expert_id)}.safetensors"
    tmp.unlink(missing_ok=True)  # left by a process killed mid-copy
    try:
        copy_file(checkpoint / WEIGHTS, tmp, "expert weights", spec.max_bytes)
        meta = accept_expert(
            run_dir,
            tmp,
            meta,
            declared,
            spec,
            grow=grow,
            replace=replace,
            note={"added_at": now()},
            before_install=grow_run if grow else None,
        )
    except BaseException:
        if "config" in done:
            os.replace(old_config, run_dir / CONFIG)
            if old_features.exists():
                os.replace(old_features, run_dir / FEATURE_NET)
        if "view" in done:
            shutil.rmtree(view, ignore_errors=True)
        raise
    finally:
        tmp.unlink(missing_ok=True)
    if grow:
        dataset = Dataset.open(view)
    cfg = grown if grow else cfg
    before = read_report(run_dir)
    missing = missing_experts(run_dir, cfg.num_experts)
    added = before.get("added_experts", []) + [
        {
            "expert_id": expert_id,
            "objective": meta["objective"],
            "sha256": meta["sha256"],
            "source": str(checkpoint),
            "replaced": existed,
            "new_cluster": str(cluster_data) if grow else None,
            "added_at": now(),
        }
    ]
    if grow and old_features.exists():  # FID/KID before and after are in different feature spaces
        added[-1]["feature_network_retrained"] = f"the old one is in {old_features.name}"
    extra = {k: before[k] for k in ("flower",) if k in before} | {"added_experts": added}
    log.info(
        "expert %d (%s) added to %s; retraining the router and re-evaluating", expert_id, meta["objective"], run_dir
    )
    return finish_run(cfg, run_dir, dataset, missing, extra=extra, progress=progress)
