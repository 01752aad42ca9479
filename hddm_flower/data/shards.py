"""The one place a prepared dataset's webdataset shards are opened for reading."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence


def open_shards(
    urls: Sequence[str],
    *,
    shuffle: bool = False,
    seed: int = 0,
    select_files: Callable[[str], bool] | None = None,
    decode: str | None = "rgb8",
    split: str | None = None,
    buffer: int = 0,
):
    """A webdataset pipeline over ``urls``: every shard of the node (no rank-based node splitting), shards in
    order or, with ``shuffle``, reshuffled each epoch from ``seed``; only the members ``select_files`` keeps;
    decoded with ``decode`` (None: raw bytes, as written); only the samples of ``split`` (None: all); and, when
    ``buffer`` > 0, a seeded sample shuffle buffer of that size."""
    import webdataset as wds

    ds = wds.WebDataset(
        list(urls),
        shardshuffle=len(urls) if shuffle else False,
        detshuffle=shuffle,
        nodesplitter=None,
        empty_check=False,
        seed=seed,
        select_files=select_files,
    )
    if decode is not None:
        ds = ds.decode(decode) if decode else ds.decode()
    if split is not None:
        ds = ds.select(lambda s: s["json"]["split"] == split)
    if buffer:
        ds = ds.shuffle(buffer, rng=random.Random(seed))
    return ds
