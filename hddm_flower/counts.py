"""Event counts kept where the sampler runs: added on the device at every step, read once per sample batch.

The conversion's guards, the velocity scaling and the hand-over count rows and elements at every sampling step;
turning each count into a Python number there would stall the device once per count per step. :func:`add_count` keeps
a tensor count a tensor (on its device, no host read); :func:`read_counts` turns a whole dict into numbers with one
host read, after the batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

Counts = dict  # key → int, float or a 0-dim tensor (a count not yet read)


def add_count(counts: Counts | None, key: str, value: int | float | Tensor) -> None:
    """``counts[key] += value`` without reading ``value`` (nothing when ``counts`` is None)."""
    if counts is not None:
        counts[key] = counts.get(key, 0) + value


def read_counts(counts: Counts | None) -> dict[str, int | float] | None:
    """The counts as Python numbers (integer counts as int, sums of floats as float): one host read in all."""
    if counts is None:
        return None
    tensors = {k: v for k, v in counts.items() if isinstance(v, Tensor)}
    values = dict(counts)
    if tensors:
        device = next(iter(tensors.values())).device
        numbers = torch.stack([v.detach().to(device, torch.float64).reshape(()) for v in tensors.values()]).tolist()
        for (k, v), x in zip(tensors.items(), numbers):
            values[k] = x if v.is_floating_point() else int(x)
    return values
