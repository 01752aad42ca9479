"""The coordinator's streams: images or latents and cluster labels (with the ``pooled`` caption embedding for a
router that reads the caption; the per-token text states only in the evaluation's ``text`` batches), and the
evaluation's caption stream, read from a prepared dataset's per-cluster shards (:mod:`hddm_flower.data`) with
memory that does not grow with the dataset.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import torch
from torch import Tensor

from ..models import TextCond
from ..text import pooled_caption
from .dataset import Dataset, as_dataset, decode_image, decode_text, resumed_seed
from .shards import open_shards

IMAGE_MEMBERS = (".latent.npy", ".png", ".json")
"""The only shard members :func:`stream_images` reads: the image or latent, and the sample's json (its split).
Captions (``.txt``) and text states (``.emb.npy``, up to 118 KiB a sample at paper scale) are skipped unread."""


def _image_member(name: str) -> bool:
    return name.endswith(IMAGE_MEMBERS)


def _image_and_text_member(name: str) -> bool:
    return name.endswith((*IMAGE_MEMBERS, ".emb.npy"))


def _pooled(emb: np.ndarray) -> np.ndarray:
    """One caption's pooled embedding (dim,) from its token states (tokens, dim): :func:`text.pooled_caption`."""
    states = torch.from_numpy(np.ascontiguousarray(emb, np.float32))[None]
    return pooled_caption(states, torch.ones(states.shape[:2]))[0].numpy()


def _image_stream(
    dataset: Dataset,
    cluster: int,
    split: str | None,
    *,
    shuffle: bool,
    seed: int,
    buffer: int,
    text: bool,
    pooled: bool = False,
):
    """One cluster's samples as ``(x (C, H, W) float32, label)`` (``text``: ``+ (states, mask)``; ``pooled``:
    ``+ (pooled caption embedding (dim,),)``), reading the image/latent and json members only, and the text states
    only when asked. ``pooled`` reduces each sample's states to ``dim`` numbers as it is read (before the shuffle
    buffer): the token states are never held."""
    urls = dataset.shards(cluster)
    select = _image_and_text_member if text or pooled else _image_member
    ds = open_shards(
        urls,
        shuffle=shuffle,
        seed=seed,
        select_files=select,
        split=split,
        buffer=buffer if shuffle and not pooled else 0,
    )
    if pooled:  # each sample's states reduced as it is read, then the same seeded buffer as open_shards'
        L = dataset.max_caption_tokens
        ds = ds.map(lambda s: {k: v for k, v in s.items() if k != "emb.npy"} | {"pooled": _pooled(s["emb.npy"][:L])})
        if shuffle:
            ds = ds.shuffle(buffer, rng=random.Random(seed))
    for s in ds:
        x = decode_image(s)
        if pooled:
            yield x, cluster, s["pooled"]
            continue
        if not text:
            yield x, cluster
            continue
        yield x, cluster, *decode_text(s, dataset.max_caption_tokens, dataset.text_dim)


def stream_images(
    dataset: Dataset,
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
    ``clusters`` (default all), reading only each sample's image or latent and json (:data:`IMAGE_MEMBERS`).

    Memory does not grow with the dataset: one batch plus the shuffle buffers. With ``shuffle`` every cluster is
    its own seeded stream (shard order reshuffled each epoch, a buffer of ``shuffle_buffer / K`` samples) and each
    sample is drawn from cluster k with probability ∝ the samples k has left in the epoch, so every batch mixes
    the clusters as the whole split does and an epoch visits every sample once. Without ``shuffle``: the clusters
    in order, shards in order. ``loop``: endless epochs; else one pass, the last batch partial. ``split`` None
    reads train and val. ``text`` (the evaluation's feature classifier; never the router): batches also carry
    the caption states, ``(x0, labels, TextCond)``. ``pooled`` (a router that reads the caption): batches carry
    each caption's pooled embedding instead, ``(x0, labels, captions (B, dim))``; the shards store token states,
    so those are read, but each is reduced to its ``dim`` numbers as it is read.
    """
    if text and pooled:
        raise ValueError("stream_images: text and pooled are exclusive (states or their pooled embedding)")
    dataset = as_dataset(dataset)
    clusters = dataset.cluster_ids if clusters is None else clusters
    sizes = {k: dataset.size([k], split) for k in clusters}
    if not sum(sizes.values()):
        raise ValueError(f"no {split or 'train/val'!r} samples in clusters {clusters} of {dataset.root}")
    buffer = max(1, shuffle_buffer // len(clusters))
    epoch = 0
    items = []  # a batch may span epochs: a split smaller than a batch still yields batches when looping
    while True:
        rng = random.Random(f"{seed}-{epoch}")
        streams = {
            k: _image_stream(
                dataset,
                k,
                split,
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


def stream_captions(
    dataset: Dataset,
    clusters: list[int] | None = None,
    *,
    split: str | None = "val",
    seed: int = 0,
    shuffle_buffer: int = 1000,
) -> Iterator[tuple[str, np.ndarray, np.ndarray, int]]:
    """One seeded, shuffled pass over the captions of ``split`` (None: train and val) in ``clusters`` (default
    all), interleaved at random: ``(caption, padded text states (L, dim), mask (L,), cluster)``. Reads the text and json members only
    (no image), so picking prompts costs what the prompts need, not the split."""
    dataset = as_dataset(dataset)
    clusters = dataset.cluster_ids if clusters is None else clusters
    L, dim = dataset.max_caption_tokens, dataset.text_dim
    rng = random.Random(seed)

    def one(k: int):
        urls = dataset.shards(k)
        ds = open_shards(
            urls,
            shuffle=True,
            seed=seed + k,
            select_files=lambda name: name.endswith((".txt", ".emb.npy", ".json")),
            decode="",  # webdataset's default decoders (no image member is read)
            split=split,
            buffer=max(1, shuffle_buffer // len(clusters)),
        )
        for s in ds:
            yield s["txt"], *decode_text(s, L, dim), k

    streams = {k: one(k) for k in clusters}
    while streams:
        k = rng.choice(sorted(streams))
        item = next(streams[k], None)
        if item is None:
            del streams[k]
            continue
        yield item


class StreamingAllClusters:
    """Every cluster's training data as one seeded stream, for the monolith baseline where they do not fit in RAM:
    :func:`~hddm_flower.data.streams.stream_images` with the text states (clusters mixed as the whole split is,
    shard order and buffers from ``seed``). It stands in for :class:`Split` as :class:`StreamingSplit` does:
    ``batch(idx)`` is the next ``len(idx)`` samples, ``len()`` the training-set size from ``meta.json``, and a
    training resumed at step s reads the stream of :func:`~hddm_flower.data.dataset.resumed_seed` (seed, s)."""

    def __init__(self, dataset: Dataset, *, seed: int = 0, shuffle_buffer: int = 1000):
        self.dataset = as_dataset(dataset)
        self.size = self.dataset.size(None, "train")
        self.seed, self.shuffle_buffer = seed, shuffle_buffer
        self._stream, self._batch_size = None, None
        self.start_step = 0

    def __len__(self) -> int:
        return self.size

    def resume_at(self, step: int) -> None:
        """Start the stream for a training that starts at ``step`` (0: the stream of ``seed``)."""
        self.start_step, self._stream = step, None

    def batch(self, idx: Tensor) -> tuple[Tensor, TextCond]:
        if self._stream is None or self._batch_size != len(idx):
            self._batch_size = len(idx)
            self._stream = stream_images(
                self.dataset,
                None,
                batch_size=len(idx),
                split="train",
                seed=resumed_seed(self.seed, self.start_step),
                shuffle_buffer=self.shuffle_buffer,
                text=True,
            )
        x, _, cond = next(self._stream)
        return x, cond
