"""Reading a prepared dataset's webdataset shards: the one place they are opened (:func:`open_shards`), how one
sample's members are decoded, and one cluster's samples as a stream (:func:`cluster_samples`) that reads only the
members it is asked for."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch

from ..text import pooled_caption

IMAGE_MEMBERS = (".latent.npy", ".png", ".json")
"""The only shard members an image stream reads: the image or latent, and the sample's json (its split). Captions
(``.txt``) and text states (``.emb.npy``, up to 116 KiB a sample at paper scale) are skipped unread."""
CAPTION_MEMBERS = (".txt", ".emb.npy", ".json")
"""The members a caption stream reads (no image)."""


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


def _image_member(name: str) -> bool:
    return name.endswith(IMAGE_MEMBERS)


def _image_and_text_member(name: str) -> bool:
    return name.endswith((*IMAGE_MEMBERS, ".emb.npy"))


def _caption_member(name: str) -> bool:
    return name.endswith(CAPTION_MEMBERS)


def _pooled(emb: np.ndarray) -> np.ndarray:
    """One caption's pooled embedding (dim,) from its token states (tokens, dim): :func:`~hddm_flower.text.pooled_caption`."""
    states = torch.from_numpy(np.ascontiguousarray(emb, np.float32))[None]
    return pooled_caption(states, torch.ones(states.shape[:2]))[0].numpy()


def cluster_samples(
    urls: Sequence[str],
    cluster: int,
    split: str | None,
    *,
    text_shape: tuple[int, int],
    shuffle: bool,
    seed: int,
    buffer: int,
    text: bool,
    pooled: bool = False,
) -> Iterator[tuple]:
    """One cluster's samples from its shards ``urls`` as ``(x (C, H, W) float32, label)`` (``text``:
    ``+ (states, mask)`` padded to ``text_shape`` (L, dim); ``pooled``: ``+ (pooled caption embedding (dim,),)``),
    reading the image/latent and json members only, and the text states only when asked. ``pooled`` reduces each
    sample's states to ``dim`` numbers as it is read (before the shuffle buffer): the token states are never held."""
    select = _image_and_text_member if text or pooled else _image_member
    ds = open_shards(
        urls,
        shuffle=shuffle,
        seed=seed,
        select_files=select,
        split=split,
        buffer=buffer if shuffle and not pooled else 0,
    )
    L, dim = text_shape
    if pooled:  # each sample's states reduced as it is read, then the same seeded buffer as open_shards'
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
        yield x, cluster, *decode_text(s, L, dim)


def cluster_captions(
    urls: Sequence[str], cluster: int, split: str | None, *, text_shape: tuple[int, int], seed: int, buffer: int
) -> Iterator[tuple[str, np.ndarray, np.ndarray, int]]:
    """One cluster's captions from its shards ``urls``, shard order and buffer seeded: ``(caption, padded text
    states (L, dim), mask (L,), cluster)``. Reads the text and json members only (no image)."""
    ds = open_shards(
        urls,
        shuffle=True,
        seed=seed,
        select_files=_caption_member,
        decode="",  # webdataset's default decoders (no image member is read)
        split=split,
        buffer=buffer,
    )
    for s in ds:
        yield s["txt"], *decode_text(s, *text_shape), cluster
