"""A node's kept experts: the training state and the final checkpoint of each expert it trains, in its work
directory, under a name made of the expert id and a hash of what the weights depend on (:func:`work_name`), so that
a restarted node resumes a training, and a node whose reply was lost sends the kept expert again instead of
training it again (:func:`finished`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from hddm_flower.config.schema import TRAINING_SECTIONS
from hddm_flower.data import Dataset, default_cache_dir
from hddm_flower.data.layout import META as DATASET_META
from hddm_flower.safeio import atomic_path, write_atomic

log = logging.getLogger("hddm_flower.client")


def work_dir(cfg, node, expert_id: int, objective: str, dataset: Dataset, *, keep: bool = False) -> Path | None:
    """Where a restarted node finds this expert's training state and kept result (``expert.checkpoint_every`` >
    0, a node config that names a ``work-dir``, or ``keep``: a node given several experts keeps each one as it
    ends; named by :func:`work_name`), or None."""
    if not cfg.expert.checkpoint_every and not node.get("work-dir") and not keep:
        return None
    return Path(str(node.get("work-dir", "")) or default_cache_dir() / "work") / work_name(
        cfg, expert_id, objective, dataset
    )


def work_name(cfg, expert_id: int, objective: str, dataset: Dataset) -> str:
    """The name of an expert's training state and kept result in the node's work directory: the expert id and a
    hash of what its weights depend on — the training sections of the experiment (not federation or sampling:
    they change per run), the objective this node trains, and the data (the prepared dataset's ``meta.json``:
    source, sizes, clusters). Another experiment, objective or dataset never picks up this expert."""
    what = {k: cfg.to_dict()[k] for k in TRAINING_SECTIONS}
    data = hashlib.sha256((dataset.root / DATASET_META).read_bytes()).hexdigest()
    digest = hashlib.sha256(f"{json.dumps(what, sort_keys=True)}|{objective}|{data}".encode()).hexdigest()[:16]
    return f"expert-{expert_id}-{digest}"


def keep(work: Path, blob: bytes, model_config: dict, meta: dict) -> None:
    """Keep the final checkpoint next to the training state (weights first, then the JSON that marks it done)."""
    weights, info = work.with_suffix(".safetensors"), work.with_suffix(".json")
    weights.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(weights) as tmp:
        tmp.write_bytes(blob)
    write_atomic(info, json.dumps({"meta": meta, "model_config": model_config}))


def finished(work: Path | None) -> tuple[bytes, dict, dict] | None:
    """The kept final checkpoint of this expert and experiment, if it exists and its hash still matches."""
    if work is None or not work.with_suffix(".json").exists():
        return None
    try:
        info = json.loads(work.with_suffix(".json").read_text())
        blob = work.with_suffix(".safetensors").read_bytes()
        if hashlib.sha256(blob).hexdigest() != info["meta"]["sha256"]:
            raise ValueError("its sha256 does not match its metadata")
        return blob, info["model_config"], info["meta"]
    except (OSError, ValueError, KeyError, TypeError) as e:  # a damaged copy costs a training, not the expert
        log.warning("kept checkpoint %s is unusable (%s); training again", work, str(e).splitlines()[0][:200])
        return None
