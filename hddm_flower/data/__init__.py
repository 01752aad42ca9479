"""Prepared datasets: one shard set per cluster plus ``meta.json`` (:mod:`.layout` spells the directory).

They are written through :class:`.writer.DatasetWriter` by :func:`hddm_flower.embedded.prepare_embedded` (the
embedded Twemoji dataset), :mod:`hddm_flower.cluster` (data at scale, after :mod:`hddm_flower.ingest`),
:mod:`hddm_flower.gmm.dataset`, :func:`extend_dataset` and the institution descriptor; read through a
:class:`.dataset.Dataset` opened once where a dataset enters a process (splits in memory, the expert's stream),
with its image and caption streams (:meth:`.dataset.Dataset.images`, :meth:`.dataset.Dataset.captions`), whose
shards :mod:`.shards` opens and decodes; :mod:`.streams` holds the streamed stand-ins for a split in memory.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from . import layout
from .dataset import MAX_META_BYTES, Dataset, Split, read_meta, split_size
from .streams import StreamingAllClusters, StreamingSplit

__all__ = [
    "DATASET_VERSION",
    "MAX_META_BYTES",
    "SAME_ENCODING",
    "Dataset",
    "Split",
    "StreamingAllClusters",
    "StreamingSplit",
    "check_clusters",
    "default_cache_dir",
    "extend_dataset",
    "read_meta",
    "split_size",
    "stratified_split",
]

DATASET_VERSION = 4  # 4: each cluster-k folder carries meta.json and uncond.safetensors


def default_cache_dir() -> Path:
    return Path(os.environ.get("HDDM_CACHE", Path.home() / ".cache" / "hddm-flower"))


# what two encoded datasets must share to be used together (their manifests, or their clustered metas)
SAME_ENCODING = ("pixel_size", "image_size", "channels", "latent", "text_encoder")


def extend_dataset(base: str | os.PathLike, cluster_dir: str | os.PathLike, out: str | os.PathLike) -> Path:
    """A dataset with one more cluster: ``base``'s clusters 0..K−1 and the shard set ``cluster_dir`` as cluster K
    (e.g. the data of an institution that joined after the run; the router and the evaluation need its cluster).

    Nothing is copied: ``out/cluster-k`` link to ``base``'s folders and ``out/cluster-K`` holds links to the new
    shards, with its own ``meta.json``; both sources must stay where they are. The new shard set must match
    ``base`` in image size, channels, latent space and text encoder. Written atomically; returns ``out``.
    """
    base, cluster_dir, out = Path(base).resolve(), Path(cluster_dir).resolve(), Path(out)
    new = Dataset.open(cluster_dir)
    bmeta, cmeta = Dataset.open(base).meta, new.meta
    if "cluster_set" in bmeta:
        raise ValueError(f"{base} is one cluster's shard set; expected the whole clustered dataset")
    if "cluster_set" not in cmeta:
        raise ValueError(
            f"{cluster_dir} is not one cluster's shard set (its meta.json has no cluster_set): pass "
            f"a cluster-k folder of a prepared dataset"
        )
    diff = [k for k in (*SAME_ENCODING, "text_dim", "max_caption_tokens") if bmeta.get(k) != cmeta.get(k)]
    if diff:
        raise ValueError(
            f"{cluster_dir} does not match the run's dataset {base} in {diff}: "
            + ", ".join(f"{k} {cmeta.get(k)!r} ≠ {bmeta.get(k)!r}" for k in diff[:2])
        )
    k_new, source = bmeta["num_clusters"], cmeta["cluster_set"]
    entry = next(c for c in cmeta["clusters"] if c["id"] == source)
    entry = entry | {"id": k_new, "source": str(cluster_dir), "source_cluster": source}
    meta = bmeta | {
        "num_clusters": k_new + 1,
        "num_images": bmeta["num_images"] + entry["size"],
        "clusters": bmeta["clusters"] + [entry],
        "extended": bmeta.get("extended", []) + [{"cluster": k_new, "from": str(cluster_dir)}],
    }
    from .writer import DatasetWriter

    with DatasetWriter(out) as writer:
        for k in range(k_new):
            writer.link_cluster(k, layout.cluster_dir(base, k))
        for url in new.shards(source):
            writer.link_shard(k_new, url)
        writer.copy_uncond(base)
        writer.write_meta(meta, clusters=[k_new])  # the linked clusters keep their own
    return out


def stratified_split(
    labels: np.ndarray, num_clusters: int, val_fraction: float, rng: np.random.Generator
) -> np.ndarray:
    """ "train"/"val" per sample, stratified: ``val_fraction`` of each cluster (rounded) is held out, and every
    cluster of ≥ 2 samples keeps at least one validation sample."""
    split = np.full(len(labels), "train", dtype=object)
    for k in range(num_clusters):
        idx = rng.permutation(np.flatnonzero(labels == k))
        n_val = max(1, round(val_fraction * len(idx))) if len(idx) >= 2 and val_fraction > 0 else 0
        split[idx[:n_val]] = "val"
    return split


def check_clusters(meta: dict, num_experts: int, source: str = "") -> None:
    """Before any training: the dataset has one non-empty cluster per expert."""
    where = f" in {source}" if source else ""
    if meta["num_clusters"] != num_experts:
        raise ValueError(f"the dataset{where} has {meta['num_clusters']} clusters but num_experts is {num_experts}")
    empty = [c["id"] for c in meta["clusters"] if c["size"] - c.get("val", 0) <= 0]
    if empty:
        raise ValueError(f"cluster(s) {empty}{where} have no training samples; re-cluster with fewer experts")
