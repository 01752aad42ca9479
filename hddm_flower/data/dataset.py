"""A prepared dataset, opened once: :class:`Dataset` reads ``meta.json`` once and answers everything the stages ask
of the dataset (its clusters, latent space, text, sizes, shards, the splits in memory, the training stream, the
empty caption, the streams of images and captions, the decoder to pixels). It is opened where a dataset enters a process (the command line, the
ServerApp, a node's handler or worker process) or where a stage makes a new one (a dataset extended by a late
cluster), and passed down from there.

Its length is one class over one ``meta.json`` read once: what the metadata says, the shards, the splits in memory,
the streams of samples, images and captions, the decoder, and the node's rule (:meth:`Dataset.for_node`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..config.schema import Config
from ..models import TextCond
from ..safeio import read_text
from .layout import META, SHARD_GLOB, UNCOND, cluster_dir
from .shards import cluster_captions, cluster_samples, decode_image, decode_text, open_shards

MAX_META_BYTES = 256 * 2**20  # a dataset's meta.json (a prepared dataset may come from elsewhere: data.prepared)
DATA_FREE = "data_free"
"""``meta.json`` key that marks a descriptor: the dataset's shape without any sample (institution-owned data)."""


def read_meta(root: str | os.PathLike) -> dict:
    """A prepared dataset's ``meta.json``, opened as a file from outside (:mod:`~hddm_flower.safeio`: a regular
    file of bounded size, JSON whose nesting the parser can hold, an object). :meth:`Dataset.open` reads it."""
    path = Path(root) / META
    if not path.exists():
        raise FileNotFoundError(f"{root} is not a prepared dataset (no meta.json)")
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

    @classmethod
    def for_node(
        cls,
        node: Mapping[str, Any],
        cfg: Config,
        prepare: Callable[[Config, str | None], Dataset],
        *,
        cache_dir: str | None = None,
        clusters: Iterable[int] = (),
    ) -> Dataset:
        """A node's prepared data, by the one rule every node-side handler follows (``node``: the node's config):

        * ``data.partition: institution``: the node's own data is its cluster, whatever its expert id: ``data-dir``
          (a one-cluster dataset, `hddm prepare` with ``data.partition: institution``) or ``shard-set`` (a
          ``cluster-k`` folder of `hddm cluster`); in simulation (``partition-id`` p and no data path) cluster p of
          the run's dataset prepared as central data in the node's own ``cache-dir`` (else ``$HDDM_CACHE``), never
          in ``cache_dir``, the coordinator's; its own cluster's shards must exist;
        * else the node's ``shard-set`` (one cluster's folder) or ``data-dir`` (a prepared dataset), whose shards of
          ``clusters`` must exist;
        * else the run's dataset, built or found by ``prepare`` in the node's ``cache-dir``, else ``cache_dir``.

        ``prepare(cfg, cache_dir)``: the dataset of a config
        (:func:`hddm_flower.stages.prepare.prepare_data`; passed in, since the data package builds no dataset from a
        config). Fails early, naming the path, when the folder chosen holds no shards of a cluster it must serve.
        """
        own_cache = str(node.get("cache-dir", "")) or None
        if cfg.data.partition == "institution":
            if node.get("data-dir") or node.get("shard-set"):
                folder = Path(str(node.get("data-dir") or node["shard-set"]))
            elif "partition-id" in node:
                p = int(node["partition-id"])
                if not 0 <= p < cfg.num_experts:
                    raise ValueError(f"simulated institution {p} has no cluster among the run's {cfg.num_experts}")
                central = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, partition="central"))
                folder = cluster_dir(prepare(central, own_cache).root, p)
            else:
                raise ValueError("data.partition is institution but this node's config names no data-dir or shard-set")
            dataset = cls.open(folder)
            dataset.shards(dataset.own_cluster)  # its own cluster: no shards, a wrong folder
            return dataset
        if node.get("shard-set") or node.get("data-dir"):
            dataset = cls.open(Path(str(node.get("shard-set") or node["data-dir"])))
            for k in clusters:
                dataset.shards(k)
            return dataset
        return prepare(cfg, own_cache or cache_dir or None)

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
    def own_cluster(self) -> int:
        """The cluster of a node's own data folder: a ``cluster-k`` shard set's k, else 0 (an institution's
        one-cluster dataset)."""
        return int(self.meta.get("cluster_set", 0))

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

    def images(
        self,
        clusters: list[int] | None = None,
        *,
        batch_size: int,
        split: str | None = "train",
        seed: int = 0,
        shuffle: bool = True,
        shuffle_buffer: int = 1000,
        loop: bool = True,
        text: bool = False,
        pooled: bool = False,
    ) -> Iterator[tuple]:
        """Batches ``(x0 (B, C, H, W) float32, cluster labels (B,) int64)`` streamed from the shard sets of
        ``clusters`` (default all), reading only each sample's image or latent and json (:data:`.shards.IMAGE_MEMBERS`).

        Memory does not grow with the dataset: one batch plus the shuffle buffers. With ``shuffle`` every cluster
        is its own seeded stream (shard order reshuffled each epoch, a buffer of ``shuffle_buffer / K`` samples)
        and each sample is drawn from cluster k with probability ∝ the samples k has left in the epoch, so every
        batch mixes the clusters as the whole split does and an epoch visits every sample once. Without
        ``shuffle``: the clusters in order, shards in order. ``loop``: endless epochs; else one pass, the last batch
        partial. ``split`` None reads train and val. ``text`` (the evaluation's feature classifier; never the
        router): batches also carry the caption states, ``(x0, labels, TextCond)``. ``pooled`` (a router that
        reads the caption): batches carry each caption's pooled embedding instead, ``(x0, labels, captions (B,
        dim))``; the shards store token states, so those are read, but each is reduced to its ``dim`` numbers as
        it is read.
        """
        if text and pooled:
            raise ValueError("Dataset.images: text and pooled are exclusive (states or their pooled embedding)")
        clusters = self.cluster_ids if clusters is None else clusters
        sizes = {k: self.size([k], split) for k in clusters}
        if not sum(sizes.values()):
            raise ValueError(f"no {split or 'train/val'!r} samples in clusters {clusters} of {self.root}")
        urls = {k: self.shards(k) for k in clusters if sizes[k]}
        buffer = max(1, shuffle_buffer // len(clusters))
        text_shape = (self.max_caption_tokens, self.text_dim)
        epoch = 0
        items = []  # a batch may span epochs: a split smaller than a batch still yields batches when looping
        while True:
            rng = random.Random(f"{seed}-{epoch}")
            streams = {
                k: cluster_samples(
                    urls[k],
                    k,
                    split,
                    text_shape=text_shape,
                    shuffle=shuffle,
                    seed=seed + 7919 * epoch + k,
                    buffer=buffer,
                    text=text,
                    pooled=pooled,
                )
                for k in clusters
                if sizes[k]
            }
            left = {k: sizes[k] for k in streams}

            def samples():
                while streams:
                    k = rng.choices(list(left), weights=list(left.values()))[0] if shuffle else next(iter(streams))
                    item = next(streams[k], None)
                    if item is None or left[k] <= 1:  # cluster exhausted (meta sizes are exact; stop on either)
                        if item is not None:
                            yield item
                        del streams[k], left[k]
                        continue
                    left[k] -= 1
                    yield item

            def collate(items):
                x, y = torch.from_numpy(np.stack([i[0] for i in items])), torch.tensor([i[1] for i in items])
                if pooled:
                    return x, y, torch.from_numpy(np.stack([i[2] for i in items]))
                if not text:
                    return x, y
                states, mask = (torch.from_numpy(np.stack([i[j] for i in items])) for j in (2, 3))
                return x, y, TextCond(states, mask.float())

            for item in samples():
                items.append(item)
                if len(items) == batch_size:
                    yield collate(items)
                    items = []
            if items and not loop:
                yield collate(items)
            if not loop:
                return
            epoch += 1

    def captions(
        self, clusters: list[int] | None = None, *, split: str | None = "val", seed: int = 0, shuffle_buffer: int = 1000
    ) -> Iterator[tuple[str, np.ndarray, np.ndarray, int]]:
        """One seeded, shuffled pass over the captions of ``split`` (None: train and val) in ``clusters`` (default
        all), interleaved at random: ``(caption, padded text states (L, dim), mask (L,), cluster)``. Reads the text
        and json members only (no image), so picking prompts costs what the prompts need, not the split."""
        clusters = self.cluster_ids if clusters is None else clusters
        text_shape, buffer = (self.max_caption_tokens, self.text_dim), max(1, shuffle_buffer // len(clusters))
        rng = random.Random(seed)

        def one(k: int):  # a cluster's shards are listed when its stream is first drawn from
            yield from cluster_captions(self.shards(k), k, split, text_shape=text_shape, seed=seed + k, buffer=buffer)

        streams = {k: one(k) for k in clusters}
        while streams:
            k = rng.choice(sorted(streams))
            item = next(streams[k], None)
            if item is None:
                del streams[k]
                continue
            yield item

    @property
    def uncond_file(self) -> Path:
        """The file of the empty caption's states (a run directory keeps a copy beside its experts)."""
        return self.root / UNCOND

    @cached_property
    def uncond(self) -> TextCond:
        """The empty caption's states (1, L, dim): the unconditional input for caption dropout and CFG."""
        from safetensors.torch import load_file

        t = load_file(self.uncond_file)
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
