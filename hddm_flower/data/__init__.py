"""Reading prepared datasets: ``meta.json``, per-cluster webdataset shards, in memory or streamed.

A prepared dataset is one shard set per cluster plus ``meta.json``, written by
:func:`hddm_flower.embedded.prepare_embedded` (the embedded Twemoji dataset), :mod:`hddm_flower.ingest` and
:mod:`hddm_flower.cluster` (data at scale: webdataset or folder input, VAE latents, DINOv2 hierarchical k-means),
or :mod:`hddm_flower.gmm_data`. ``load_split`` reads one cluster (or all, or one institution's ``cluster-k``
folder) back into memory as tensors; ``stream_batches`` streams one cluster for data larger than RAM; the
coordinator's image streams are in :mod:`hddm_flower.data.streams`.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..models import TextCond
from ..safeio import read_text
from . import layout
from .shards import open_shards

DATASET_VERSION = 4  # 4: each cluster-k folder carries meta.json and uncond.safetensors


def default_cache_dir() -> Path:
    return Path(os.environ.get("HDDM_CACHE", Path.home() / ".cache" / "hddm-flower"))


MAX_META_BYTES = 256 * 2**20  # a dataset's meta.json (a prepared dataset may come from elsewhere: data.prepared)


def read_meta(dataset_dir: str | os.PathLike) -> dict:
    """A prepared dataset's ``meta.json``, opened as a file from outside (:mod:`~hddm_flower.safeio`: a regular
    file of bounded size, JSON whose nesting the parser can hold, an object)."""
    path = Path(dataset_dir) / layout.META
    if not path.exists():
        raise FileNotFoundError(f"{dataset_dir} is not a prepared dataset (no meta.json)")
    text = read_text(path, "dataset metadata", MAX_META_BYTES)
    try:
        meta = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"dataset metadata {path} is not valid JSON ({str(e).splitlines()[0][:100]})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"dataset metadata {path} is not a JSON object")
    return meta


@dataclass
class Split:
    """A split held in memory: images in [−1, 1] (N, C, H, W), text condition, cluster labels, captions."""

    images: Tensor
    cond: TextCond
    labels: Tensor
    captions: list[str]

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, idx: Tensor) -> tuple[Tensor, TextCond]:
        return self.images[idx], TextCond(self.cond.states[idx], self.cond.mask[idx])


def cluster_shards(dataset_dir: str | os.PathLike, cluster: int, meta: dict | None = None) -> list[str]:
    """The shard paths of one cluster: ``dataset_dir/cluster-k/shard-*.tar``, or, when ``dataset_dir`` is itself
    one cluster's shard set (its ``meta.json`` has ``cluster_set``), that folder's shards."""
    meta = meta or read_meta(dataset_dir)
    if meta.get("institution"):  # one institution's own data: its single cluster is whichever expert it trains
        folder = layout.cluster_dir(dataset_dir, 0)
    elif not 0 <= cluster < meta["num_clusters"]:
        raise ValueError(f"cluster {cluster} does not exist in {dataset_dir} (it has {meta['num_clusters']})")
    elif "cluster_set" in meta:
        if meta["cluster_set"] != cluster:
            raise ValueError(
                f"{dataset_dir} is the shard set of cluster {meta['cluster_set']}, not of cluster {cluster}"
            )
        folder = Path(dataset_dir)
    else:
        folder = layout.cluster_dir(dataset_dir, cluster)
    urls = sorted(str(p) for p in folder.glob(layout.SHARD_GLOB))
    if not urls:
        raise ValueError(f"cluster {cluster} of {dataset_dir} is empty (no shards in {folder})")
    for url in urls:  # a link to a FIFO or a device would hang or never end the reader
        mode = os.stat(url).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"shard {url} of cluster {cluster} is not a regular file")
    return urls


def _decode_sample(s: dict, L: int, dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(image or latent (C, H, W) float32, padded text states (L, dim), mask (L,)) of one decoded sample."""
    if "latent.npy" in s:
        x = np.asarray(s["latent.npy"], np.float32)  # already scaled by the VAE's scaling factor
    else:
        x = np.asarray(s["png"], np.float32).transpose(2, 0, 1) / 127.5 - 1
    emb = np.asarray(s["emb.npy"], np.float32)[:L]
    pad = np.zeros((L, dim), np.float32)
    pad[: len(emb)] = emb
    return x, pad, np.arange(L) < len(emb)


def load_split(dataset_dir: str | os.PathLike, clusters: list[int] | None = None, split: str = "train") -> Split:
    """Read the shards of the given clusters (default all) and keep the samples of one split.

    Images are pixels in [−1, 1], or the VAE's scaled latents when the dataset was prepared with one
    (``meta["latent"]``). ``dataset_dir`` may be one cluster's shard set (then ``clusters`` must name it).
    """
    meta = read_meta(dataset_dir)
    if clusters is None:
        clusters = [meta["cluster_set"]] if "cluster_set" in meta else list(range(meta["num_clusters"]))
    L, dim = meta["max_caption_tokens"], meta["text_dim"]
    images, states, masks, labels, captions = [], [], [], [], []
    for k in clusters:  # the label is the cluster folder's id (a late cluster keeps its samples' original ids)
        urls = cluster_shards(dataset_dir, k, meta)
        for s in open_shards(urls):
            if s["json"]["split"] != split:
                continue
            x, pad, mask = _decode_sample(s, L, dim)
            images.append(x)
            states.append(pad)
            masks.append(mask)
            labels.append(k)
            captions.append(s["txt"])
    if not images:
        raise ValueError(f"no {split!r} samples in clusters {clusters} of {dataset_dir}")
    x = torch.from_numpy(np.stack(images))
    cond = TextCond(torch.from_numpy(np.stack(states)), torch.from_numpy(np.stack(masks)).float())
    return Split(x, cond, torch.tensor(labels), captions)


def stream_batches(
    dataset_dir: str | os.PathLike,
    cluster: int,
    *,
    batch_size: int,
    seed: int = 0,
    split: str = "train",
    shuffle_buffer: int = 1000,
) -> Iterator[tuple[Tensor, TextCond]]:
    """An endless stream of ``(x0, cond)`` batches from one cluster's shards, for data that does not fit in RAM.

    webdataset with explicit shard shuffling (seeded, reshuffled each epoch), a sample shuffle buffer, and no
    rank-based node splitting: the node reads its whole shard set (an institution = one cluster).
    """
    meta = read_meta(dataset_dir)
    urls = cluster_shards(dataset_dir, cluster, meta)
    L, dim = meta["max_caption_tokens"], meta["text_dim"]
    ds = open_shards(urls, shuffle=True, seed=seed, split=split, buffer=shuffle_buffer)
    xs, sts, ms = [], [], []
    while True:  # epochs: each pass reshuffles the shard order (deterministically, from seed and epoch)
        n = 0
        for s in ds:
            x, pad, mask = _decode_sample(s, L, dim)
            xs.append(x)
            sts.append(pad)
            ms.append(mask)
            n += 1
            if len(xs) == batch_size:
                yield (
                    torch.from_numpy(np.stack(xs)),
                    TextCond(torch.from_numpy(np.stack(sts)), torch.from_numpy(np.stack(ms)).float()),
                )
                xs, sts, ms = [], [], []
        if n == 0:
            raise ValueError(f"no {split!r} samples in cluster {cluster} of {dataset_dir}")


def split_size(meta: dict, clusters: list[int] | None = None, split: str | None = "train") -> int:
    """Number of samples of ``split`` (``"train"``, ``"val"``, or None for both) in ``clusters`` (default all),
    from ``meta.json`` (no shard is read)."""
    every = clusters is None or meta.get("institution")  # an institution's one cluster answers to any id
    infos = [c for c in meta["clusters"] if every or c["id"] in clusters]
    val = sum(c.get("val", 0) for c in infos)
    return {"train": sum(c["size"] for c in infos) - val, "val": val, None: sum(c["size"] for c in infos)}[split]


class StreamingSplit:
    """One cluster's training data read as a stream (:func:`stream_batches`), for clusters larger than RAM.

    It stands in for :class:`Split` in expert training: ``batch(idx)`` returns the next ``len(idx)`` samples of the
    shuffled stream (the indices themselves are not used) and ``len()`` is the cluster's training-set size from
    ``meta.json``. Sample order comes from ``seed`` (shard shuffle per epoch + shuffle buffer), so a training resumed
    from a checkpoint sees a freshly shuffled stream rather than the exact continuation.
    """

    def __init__(self, dataset_dir: str | os.PathLike, cluster: int, *, seed: int = 0, shuffle_buffer: int = 1000):
        meta = read_meta(dataset_dir)
        info = next(c for c in meta["clusters"] if c["id"] == cluster)
        self.size = info["size"] - info.get("val", 0)
        self.dataset_dir, self.cluster, self.seed, self.shuffle_buffer = dataset_dir, cluster, seed, shuffle_buffer
        self._stream, self._batch_size = None, None
        self.labels = torch.full((self.size,), cluster)

    def __len__(self) -> int:
        return self.size

    def batch(self, idx: Tensor) -> tuple[Tensor, TextCond]:
        if self._stream is None or self._batch_size != len(idx):
            self._batch_size = len(idx)
            self._stream = stream_batches(
                self.dataset_dir, self.cluster, batch_size=len(idx), seed=self.seed, shuffle_buffer=self.shuffle_buffer
            )
        return next(self._stream)


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
    bmeta, cmeta = read_meta(base), read_meta(cluster_dir)
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
        for url in cluster_shards(cluster_dir, source, cmeta):
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


def load_uncond(dataset_dir: str | os.PathLike) -> TextCond:
    """The empty caption's states (1, L, dim): the unconditional input for caption dropout and CFG."""
    from safetensors.torch import load_file

    t = load_file(Path(dataset_dir) / layout.UNCOND)
    return TextCond(t["states"][None].float(), t["mask"][None].float())
