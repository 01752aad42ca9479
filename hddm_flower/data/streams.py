"""Training data read as a stream, for data larger than RAM: :class:`StreamingSplit` (one cluster, an expert) and
:class:`StreamingAllClusters` (every cluster, the monolith baseline) stand in for a :class:`~.dataset.Split` held
in memory, drawing their batches from :meth:`.dataset.Dataset.batches` and :meth:`.dataset.Dataset.images`.
"""

from __future__ import annotations

import random

import torch
from torch import Tensor

from ..models import TextCond
from .dataset import Dataset


def resumed_seed(seed: int, step: int) -> int:
    """The seed of a stream that a training starts at ``step``: ``seed`` itself at step 0, else one drawn from
    (``seed``, ``step``), so that a resumed training reads a stream of its own instead of the first batches again."""
    return seed if step == 0 else random.Random(f"{seed}-resumed-at-{step}").getrandbits(31)


class _ResumableStream:
    """What both streams share: ``len()`` is the training-set size, :meth:`resume_at` reseeds the stream for a
    training that starts at ``step``, and ``batch(idx)`` is the next ``len(idx)`` samples of :meth:`_open`'s stream
    (reopened when the batch size changes)."""

    size: int
    seed: int
    _stream = None
    _batch_size = None
    start_step = 0

    def __len__(self) -> int:
        return self.size

    def resume_at(self, step: int) -> None:
        """Start the stream for a training that starts at ``step`` (0: the stream of ``seed``)."""
        self.start_step, self._stream = step, None

    def _next(self, batch_size: int):
        if self._stream is None or self._batch_size != batch_size:
            self._batch_size = batch_size
            self._stream = self._open(batch_size, resumed_seed(self.seed, self.start_step))
        return next(self._stream)


class StreamingSplit(_ResumableStream):
    """One cluster's training data read as a stream (:meth:`Dataset.batches`), for clusters larger than RAM.

    It stands in for :class:`~.dataset.Split` in expert training: ``batch(idx)`` returns the next ``len(idx)`` samples of the
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
        self.labels = torch.full((self.size,), cluster)

    def _open(self, batch_size: int, seed: int):
        return self.dataset.batches(self.cluster, batch_size=batch_size, seed=seed, shuffle_buffer=self.shuffle_buffer)

    def batch(self, idx: Tensor) -> tuple[Tensor, TextCond]:
        return self._next(len(idx))


class StreamingAllClusters(_ResumableStream):
    """Every cluster's training data as one seeded stream, for the monolith baseline where they do not fit in RAM:
    :meth:`~.dataset.Dataset.images` with the text states (clusters mixed as the whole split is, shard order and
    buffers from ``seed``). It stands in for :class:`~.dataset.Split` as :class:`StreamingSplit` does:
    ``batch(idx)`` is the next ``len(idx)`` samples, ``len()`` the training-set size from ``meta.json``, and a
    training resumed at step s reads the stream of :func:`resumed_seed` (seed, s)."""

    def __init__(self, dataset: Dataset, *, seed: int = 0, shuffle_buffer: int = 1000):
        self.dataset = dataset
        self.size = self.dataset.size(None, "train")
        self.seed, self.shuffle_buffer = seed, shuffle_buffer

    def _open(self, batch_size: int, seed: int):
        return self.dataset.images(
            None, batch_size=batch_size, split="train", seed=seed, shuffle_buffer=self.shuffle_buffer, text=True
        )

    def batch(self, idx: Tensor) -> tuple[Tensor, TextCond]:
        x, _, cond = self._next(len(idx))
        return x, cond
