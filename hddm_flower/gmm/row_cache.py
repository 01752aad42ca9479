"""The GMM rows' results kept and reused: each (row, training) job of :func:`hddm_flower.gmm.evaluate.evaluate_truth`
is stored in ``ROOT/truth-rows/ROW.json`` (``ROOT``: the training's folder, beside its ``truth-per-sample/``) under
:func:`row_key`, and a later job with the same key, in this output or in a ``hddm reproduce --reuse`` output, takes
it instead of sampling again."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..safeio import atomic_path, write_atomic

if TYPE_CHECKING:
    from ..config.schema import Config

Row = Any  # a :class:`hddm_flower.gmm.evaluate.Row` (not imported: evaluate imports this module)

log = logging.getLogger(__name__)

ROW_CACHE_DIR = "truth-rows"


def slug(name: str) -> str:
    """A row's name as a file name."""
    return "".join(c if c.isalnum() else "-" for c in name).strip("-")


@functools.cache
def code_digest() -> str:
    """sha256 of the package's Python sources: a stored row is reused only by the code that computed it."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def row_key(cfg: Config, row: Row, objectives: list[str] | None, weights: dict, data_id: dict) -> str:
    """What a row's result depends on, hashed: the row, the evaluation's sampling and scoring settings (not
    how many trainings or which other modes are evaluated), the sampling and DDPM sections, the dataset, the
    sha256 of the folders of the trained parts it samples with (weights, model config, metadata; (``weights``: one training's ``{"experts": {folder name:
    sha}, "monolith": sha, "router": sha}``)), and the code (:func:`code_digest`). Equal keys give equal results: the
    job is seeded by these alone."""
    ev = {k: v for k, v in dataclasses.asdict(cfg.evaluation).items() if k not in ("training_seeds", "routing_modes")}
    parts: list[Any] = [row.__dict__, ev, dataclasses.asdict(cfg.sampling), dataclasses.asdict(cfg.ddpm), data_id]
    parts.append(code_digest())
    if row.group == "monolith":
        parts.append(weights["monolith"])
    else:
        if row.experts == "trained":
            parts.append([weights["experts"][f"cluster-{k}-{o}"] for k, o in enumerate(objectives)])
        if row.router == "trained":
            parts.append(weights["router"])
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cached_row(root: Path, row: Row, key: str, donors: list[Path]) -> dict | None:
    """Row ``row``'s stored result in ``root/truth-rows/`` if its key is ``key``, else one of ``donors``' (other
    outputs' folders of the same training, ``hddm reproduce --reuse``) copied in with its per-sample file."""
    for where in (root, *donors):
        entry = where / ROW_CACHE_DIR / f"{slug(row.name)}.json"
        try:
            stored = json.loads(entry.read_text())
        except FileNotFoundError:  # no stored row there: the usual case
            continue
        except (OSError, ValueError) as e:  # a damaged entry: said, then computed afresh
            log.warning("%s: stored row %s unreadable (%s: %s); not reused", row.name, entry, type(e).__name__, e)
            continue
        samples = where / stored.get("result", {}).get("per_sample_file", "")
        # the per-sample file must be the one the result was stored with (a later job of another key rewrites it)
        if stored.get("key") != key or not samples.is_file() or _sha256(samples) != stored.get("per_sample_sha256"):
            continue
        if where != root:
            (root / ROW_CACHE_DIR / entry.name).unlink(missing_ok=True)  # no old entry beside the new file
            for name in (stored["result"]["per_sample_file"], entry.relative_to(where)):  # the entry last
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                with atomic_path(root / name) as tmp:
                    shutil.copy2(where / name, tmp)
            log.info("%s: reused from %s", row.name, where)
        return stored["result"] | {"reused_from": str(where)} if where != root else stored["result"]
    return None


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def store_row(root: Path, row: Row, key: str, result: dict) -> None:
    """Keep ``result`` under ``key``, with the sha256 of its per-sample file (checked when it is reused)."""
    entry = root / ROW_CACHE_DIR / f"{slug(row.name)}.json"
    entry.parent.mkdir(parents=True, exist_ok=True)
    digest = _sha256(root / result["per_sample_file"])
    write_atomic(entry, json.dumps({"key": key, "per_sample_sha256": digest, "result": result}, indent=1))
