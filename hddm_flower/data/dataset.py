"""A prepared dataset, opened once: :class:`Dataset` reads ``meta.json`` once and answers everything the stages ask
of the dataset (its clusters, latent space, text, sizes, shards, the splits in memory, the training stream, the
empty caption, the decoder to pixels). It is opened where a dataset enters a process (the command line, the
ServerApp, a node's handler or worker process) or where a stage makes a new one (a dataset extended by a late
cluster), and passed down from there.
"""

from __future__ import annotations

import json
import os
import random
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..config.schema import Config
from ..models import TextCond
from ..safeio import read_text
from .layout import META, SHARD_GLOB, UNCOND, cluster_dir
from .shards import open_shards

MAX_META_BYTES = 256 * 2**20  # a dataset's meta.json (a prepared dataset may come from elsewhere: data.prepared)
DATA_FREE = "data_free"
"""``meta.json`` key that marks a descriptor: the dataset's shape without any sample (institution-owned data)."""


def read_meta(dataset_dir: str | os.PathLike) -> dict:
    """A prepared dataset's ``meta.json``, opened as a file from outside (:mod:`~hddm_flower.safeio`: a regular
    file of bounded size, JSON whose nesting the parser can hold, an object). :meth:`Dataset.open` reads it."""
    path = Path(dataset_dir) / META
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


def split_size(meta: dict, clusters: list[int] | None = None, split: str | None = "train") -> int:
    """Number of samples of ``split`` (``"train"``, ``"val"``, or None for both) in ``clusters`` (default all),
    from ``meta.json`` (no shard is read)."""
    every = clusters is None or meta.get("institution")  # an institution's one cluster answers to any id
    infos = [c for c in meta["clusters"] if every or c["id"] in clusters]
    val = sum(c.get("val", 0) for c in infos)
    return {"train": sum(c["size"] for c in infos) - val, "val": val, None: sum(c["size"] for c in infos)}[split]


def decode_text(s: dict, L: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(padded text states (L, dim) float32, mask (L,)) of one decoded sample's ``emb.npy``."""
    emb = np.asarray(s["emb.npy"], np.float32)[:L]
    pad = np.zeros((L, dim), np.float32)
    pad[: len(emb)] = emb
    return pad, np.arange(L) < len(emb)


def decode_image(s: dict) -> np.ndarray:
    """The image in [−1, 1] or the (already scaled) latent, (C, H, W) float32, of one decoded sample."""
    if "latent.npy" in s:
        return np.asarray(s["latent.npy"], np.float32)  # already scaled by the VAE's scaling factor
    return np.asarray(s["png"], np.float32).transpose(2, 0, 1) / 127.5 - 1


class Dataset:
    """A prepared dataset directory ``root`` with its metadata ``meta`` (read once, by :meth:`open`).

    ``root`` is one of: a clustered dataset (one ``cluster-k`` shard set per cluster), one cluster's shard set
    (``meta["cluster_set"]``), one institution's own one-cluster dataset (``meta["institution"]``: its cluster
    trains whichever expert it is assigned), or a descriptor of institution-owned data (``meta["data_free"]``: no
    sample at all). Splits read into memory are kept (:meth:`split`), so a stage that asks twice reads once.
    """

    def __init__(self, root: str | os.PathLike, meta: dict):
        self.root, self.meta = Path(root), meta
        self._splits: dict[tuple, Split] = {}

    @classmethod
    def open(cls, root: str | os.PathLike) -> Dataset:
        """The dataset in ``root`` (its ``meta.json`` read and checked)."""
        return cls(root, read_meta(root))

    def __repr__(self) -> str:
        return f"Dataset({str(self.root)!r})"

    # ---------------------------------------------------------------------------------------------------------
    # what meta.json says

    @property
    def num_clusters(self) -> int:
        return int(self.meta["num_clusters"])

    @property
    def cluster_ids(self) -> list[int]:
        """The clusters this folder holds: its own for one shard set, else all."""
        return [self.meta["cluster_set"]] if "cluster_set" in self.meta else list(range(self.num_clusters))

    @property
    def data_free(self) -> bool:
        """A descriptor: the dataset's shape, no sample (the coordinator of institution-owned data)."""
        return bool(self.meta.get(DATA_FREE))

    @property
    def latent(self) -> dict | None:
        """The latent space (the VAE's path, scaling factor, channels) when the samples are VAE latents."""
        return self.meta.get("latent")

    @property
    def channels(self) -> int:
        return int(self.meta["channels"])

    @property
    def pixel_channels(self) -> int:
        """Channels of the dataset's images as pixels (3 when the samples are latents)."""
        return 3 if self.latent else self.channels

    @property
    def text_dim(self) -> int:
        return int(self.meta["text_dim"])

    @property
    def max_caption_tokens(self) -> int:
        return int(self.meta["max_caption_tokens"])

    def size(self, clusters: list[int] | None = None, split: str | None = "train") -> int:
        """Samples of ``split`` (None: train and val) in ``clusters`` (default all), from the metadata."""
        return split_size(self.meta, clusters, split)

    def description(self) -> str:
        """What a network trained on this dataset was trained on (part of every FID's feature-network name)."""
        if self.data_free:
            return f"trained federatedly on the institutions' {self.meta['name']} v{self.meta['version']} images"
        return f"trained on {self.meta['name']} v{self.meta['version']} ({self.root.name})"

    # ---------------------------------------------------------------------------------------------------------
    # the samples

    def shards(self, cluster: int) -> list[str]:
        """The shard paths of one cluster: ``root/cluster-k/shard-*.tar``, or, when ``root`` is itself one cluster's
        shard set, that folder's shards (an institution's own data: its single cluster, whatever ``cluster``)."""
        meta, root = self.meta, self.root
        if meta.get("institution"):
            folder = cluster_dir(root, 0)
        elif not 0 <= cluster < meta["num_clusters"]:
            raise ValueError(f"cluster {cluster} does not exist in {root} (it has {meta['num_clusters']})")
        elif "cluster_set" in meta:
            if meta["cluster_set"] != cluster:
                raise ValueError(f"{root} is the shard set of cluster {meta['cluster_set']}, not of cluster {cluster}")
            folder = root
        else:
            folder = cluster_dir(root, cluster)
        urls = sorted(str(p) for p in folder.glob(SHARD_GLOB))
        if not urls:
            raise ValueError(f"cluster {cluster} of {root} is empty (no shards in {folder})")
        for url in urls:  # a link to a FIFO or a device would hang or never end the reader
            if not stat.S_ISREG(os.stat(url).st_mode):
                raise ValueError(f"shard {url} of cluster {cluster} is not a regular file")
        return urls

    def split(self, clusters: list[int] | None = None, split: str = "train") -> Split:
        """The samples of one split of ``clusters`` (default all) in memory, read once and kept.

        Images are pixels in [−1, 1], or the VAE's scaled latents when the dataset was prepared with one. The label
        is the cluster folder's id (a late cluster keeps its samples' original ids)."""
        clusters = self.cluster_ids if clusters is None else list(clusters)
        key = (tuple(clusters), split)
        if key not in self._splits:
            self._splits[key] = self._read_split(clusters, split)
        return self._splits[key]

    def _read_split(self, clusters: list[int], split: str) -> Split:
        L, dim = self.max_caption_tokens, self.text_dim
        images, states, masks, labels, captions = [], [], [], [], []
        for k in clusters:
            for s in open_shards(self.shards(k)):
                if s["json"]["split"] != split:
                    continue
                pad, mask = decode_text(s, L, dim)
                images.append(decode_image(s))
                states.append(pad)
                masks.append(mask)
                labels.append(k)
                captions.append(s["txt"])
        if not images:
            raise ValueError(f"no {split!r} samples in clusters {clusters} of {self.root}")
        x = torch.from_numpy(np.stack(images))
        cond = TextCond(torch.from_numpy(np.stack(states)), torch.from_numpy(np.stack(masks)).float())
        return Split(x, cond, torch.tensor(labels), captions)

    def batches(
        self, cluster: int, *, batch_size: int, seed: int = 0, split: str = "train", shuffle_buffer: int = 1000
    ) -> Iterator[tuple[Tensor, TextCond]]:
        """An endless stream of ``(x0, cond)`` batches from one cluster's shards, for data that does not fit in RAM:
        shards reshuffled each epoch (seeded), a sample shuffle buffer, the node's whole shard set."""
        urls = self.shards(cluster)
        L, dim = self.max_caption_tokens, self.text_dim
        ds = open_shards(urls, shuffle=True, seed=seed, split=split, buffer=shuffle_buffer)
        xs, sts, ms = [], [], []
        while True:  # epochs: each pass reshuffles the shard order (deterministically, from seed and epoch)
            n = 0
            for s in ds:
                pad, mask = decode_text(s, L, dim)
                xs.append(decode_image(s))
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
                raise ValueError(f"no {split!r} samples in cluster {cluster} of {self.root}")

    @cached_property
    def uncond(self) -> TextCond:
        """The empty caption's states (1, L, dim): the unconditional input for caption dropout and CFG."""
        from safetensors.torch import load_file

        t = load_file(self.root / UNCOND)
        return TextCond(t["states"][None].float(), t["mask"][None].float())

    def decoder(self, cfg: Config):
        """``decode(x)``: samples or images in the experts' space → images in [−1, 1]; the identity for a pixel
        dataset, its VAE for a latent one (``data.vae``, else the one it was encoded with; loaded once, decoding on
        ``coordinator.device`` in chunks of 64, fp32, results on ``x``'s device)."""
        if not self.latent:
            return lambda x: x
        from ..devices import resolve_device
        from ..encoders import LatentCodec

        device = resolve_device(cfg.coordinator.device)
        codec = LatentCodec(cfg.data.vae or self.latent["path"], device=device)

        @torch.no_grad()
        def decode(x: torch.Tensor) -> torch.Tensor:
            if not len(x):
                return x
            return torch.cat([codec.decode(x[i : i + 64].to(device)).to(x.device) for i in range(0, len(x), 64)])

        return decode


def as_dataset(dataset: Dataset | str | os.PathLike) -> Dataset:
    """``dataset`` itself, or the dataset in the folder ``dataset`` opened (for callers that still hold a path)."""
    return dataset if isinstance(dataset, Dataset) else Dataset.open(dataset)


def resumed_seed(seed: int, step: int) -> int:
    """The seed of a stream that a training starts at ``step``: ``seed`` itself at step 0, else one drawn from
    (``seed``, ``step``), so that a resumed training reads a stream of its own instead of the first batches again."""
    return seed if step == 0 else random.Random(f"{seed}-resumed-at-{step}").getrandbits(31)


class StreamingSplit:
    """One cluster's training data read as a stream (:meth:`Dataset.batches`), for clusters larger than RAM.

    It stands in for :class:`Split` in expert training: ``batch(idx)`` returns the next ``len(idx)`` samples of the
    shuffled stream (the indices themselves are not used) and ``len()`` is the cluster's training-set size from
    ``meta.json``. Sample order comes from ``seed`` (shard shuffle per epoch + shuffle buffer). The training loop
    calls :meth:`resume_at` with the step it starts from: a training resumed from a checkpoint at step s reads the
    stream seeded by :func:`resumed_seed` (seed, s), a fresh order, not the exact continuation (the samples seen
    before the stop may come round again before the epoch ends) and not the fresh stream's first batches again.
    """

    def __init__(self, dataset: Dataset, cluster: int, *, seed: int = 0, shuffle_buffer: int = 1000):
        info = next(c for c in dataset.meta["clusters"] if c["id"] == cluster)
        self.size = info["size"] - info.get("val", 0)
        self.dataset, self.cluster, self.seed, self.shuffle_buffer = dataset, cluster, seed, shuffle_buffer
        self._stream, self._batch_size = None, None
        self.start_step = 0
        self.labels = torch.full((self.size,), cluster)

    def __len__(self) -> int:
        return self.size

    def resume_at(self, step: int) -> None:
        """Start the stream for a training that starts at ``step`` (0: the stream of ``seed``)."""
        self.start_step, self._stream = step, None

    def batch(self, idx: Tensor) -> tuple[Tensor, TextCond]:
        if self._stream is None or self._batch_size != len(idx):
            self._batch_size = len(idx)
            self._stream = self.dataset.batches(
                self.cluster,
                batch_size=len(idx),
                seed=resumed_seed(self.seed, self.start_step),
                shuffle_buffer=self.shuffle_buffer,
            )
        return next(self._stream)
