"""A late expert: added to an assembled run, validated like one received over Flower, then the router is
retrained and the run re-evaluated."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from ..checkpoints import (
    META,
    REQUIRED_META,
    WEIGHTS,
    CheckpointRejected,
    install_expert,
    read_expert_meta,
    validate_weights_file,
)
from ..config import OBJECTIVES, Config, config_from_dict, load_config
from ..data import check_clusters, extend_dataset, read_meta
from ..provenance import now
from ..rundir import (
    CONFIG,
    FEATURE_NET,
    config_before_expert,
    dataset_view,
    expert_dir,
    features_before_expert,
    incoming_name,
    missing_experts,
    read_report,
    trained_objectives,
    write_config,
)
from .assemble import finish_run
from .expert import checkpoint_limit, expected_model_config
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
    goes through the same checks as an expert received over Flower (:func:`validate_weights_file` against the
    run's preset, with the sha256 its metadata declares); no other expert is touched or retrained. ``cfg``
    defaults to the run's ``config.yaml``. Returns the new report.

    An expert id equal to ``num_experts`` grows the run by one expert: ``cluster_data`` must then be its
    cluster's shard set (a ``cluster-k`` folder of a dataset prepared like the run's), which becomes cluster K of
    a dataset view in ``run_dir/dataset-<K+1>`` (:func:`~hddm_flower.data.extend_dataset`); the run's
    ``config.yaml`` gets ``num_experts`` K+1, the objectives with the new one appended and ``data.prepared`` set to
    the view (the old one is kept as ``config.before-expert-<K>.yaml``); the router is retrained with K+1 classes.
    """
    run_dir, checkpoint = Path(run_dir), Path(checkpoint)
    cfg = cfg or load_config(run_dir / CONFIG)
    meta = read_expert_meta(checkpoint)
    lacks = [k for k in (*REQUIRED_META, "sha256") if k not in meta]
    if lacks:
        raise CheckpointRejected(f"{checkpoint / META} lacks {lacks}")
    expert_id = int(meta["expert_id"])
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
    if meta["objective"] not in OBJECTIVES:
        raise CheckpointRejected(f"{checkpoint}: unknown objective {meta['objective']!r}")
    folder = expert_dir(run_dir, expert_id)
    existed = folder.exists()
    if existed and not replace:
        raise FileExistsError(f"{folder} already exists; pass --replace to replace that expert")
    dataset_dir = prepare_data(cfg, cache_dir)
    view, old_config = dataset_view(run_dir, expert_id + 1), config_before_expert(run_dir, expert_id)
    old_features = features_before_expert(run_dir, expert_id)
    config_grown = False
    if grow:
        if view.exists():
            raise FileExistsError(
                f"{view} already exists (left by an earlier attempt?); remove it to add expert {expert_id}"
            )
        objectives = trained_objectives(run_dir, assign_objectives(cfg, dataset_dir)) + [meta["objective"]]
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
            },
            f"{run_dir} + expert {expert_id}",
        )
    model_config = expected_model_config(cfg, dataset_dir)
    declared = {k: v for k, v in json.loads((checkpoint / "config.json").read_text()).items() if not k.startswith("_")}
    if declared != model_config:
        diff = sorted(k for k in set(declared) | set(model_config) if declared.get(k) != model_config.get(k))
        raise CheckpointRejected(
            f"{checkpoint}: model config differs from the run's preset {cfg.expert.preset!r} in {diff[:4]}"
        )
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f"{incoming_name(expert_id)}.safetensors"
    try:
        shutil.copyfile(checkpoint / WEIGHTS, tmp)
        validate_weights_file(
            tmp,
            model_config,
            sha256=str(meta["sha256"]),
            dtype=meta.get("weights_dtype"),
            max_bytes=checkpoint_limit(cfg, model_config),
        )
        if grow:  # the data view and the grown config, then the expert; all undone if anything fails
            dataset_dir = extend_dataset(dataset_dir, Path(cluster_data), view)
            check_clusters(read_meta(dataset_dir), grown.num_experts, str(dataset_dir))
            shutil.copyfile(run_dir / CONFIG, old_config)
            write_config(
                run_dir / CONFIG,
                grown,
                f"{run_dir} grown by expert {expert_id} ({meta['objective']}) from {checkpoint}",
            )
            config_grown = True
            if (run_dir / FEATURE_NET).exists():  # trained on the old clusters: the new evaluation trains its own
                os.replace(run_dir / FEATURE_NET, old_features)
        install_expert(folder, tmp, model_config, meta | {"added_at": now()})
    except BaseException:
        if config_grown:
            os.replace(old_config, run_dir / CONFIG)
            if old_features.exists():
                os.replace(old_features, run_dir / FEATURE_NET)
        if grow:
            shutil.rmtree(view, ignore_errors=True)
        raise
    finally:
        tmp.unlink(missing_ok=True)
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
    return finish_run(cfg, run_dir, dataset_dir, missing, extra=extra, progress=progress)
