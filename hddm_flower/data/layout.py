"""The prepared dataset's directory, spelled once.

::

    DATASET/
      meta.json               the dataset's metadata (clusters, sizes, latent space, text encoder, ...)
      uncond.safetensors      the empty caption's text states (caption dropout, CFG)
      cluster-k/              one shard set per cluster, standing alone (an institution needs only its own):
        shard-000000.tar        webdataset shards (``png`` or ``latent.npy``, ``txt``, ``emb.npy``, ``json``)
        meta.json               the dataset's metadata with ``cluster_set: k``
        uncond.safetensors      a copy of the empty caption's states

      gmm.safetensors         a Gaussian-mixture dataset only: the mixture itself (also in every cluster-k)
      reference-stats/        caches written beside the dataset by the evaluation: FID/KID reference statistics
      prompt-clusters/        ... and each set of prompts' clusters

A descriptor (institution-owned data) has ``meta.json`` and ``uncond.safetensors`` only.
"""

from __future__ import annotations

import os
from pathlib import Path

META = "meta.json"
UNCOND = "uncond.safetensors"
SHARD_PATTERN = "shard-%06d.tar"  # webdataset's ShardWriter pattern
SHARD_GLOB = "shard-*.tar"
GMM_FILE = "gmm.safetensors"
REFERENCE_STATS = "reference-stats"
PROMPT_CLUSTERS = "prompt-clusters"


def cluster_name(k: int) -> str:
    """The folder name of cluster ``k``'s shard set."""
    return f"cluster-{k}"


def cluster_dir(root: str | os.PathLike, k: int) -> Path:
    """``root/cluster-k``: cluster ``k``'s shard set inside the dataset directory ``root``."""
    return Path(root) / cluster_name(k)


def is_prepared(root: str | os.PathLike) -> bool:
    """Whether ``root`` holds a finished dataset (its ``meta.json`` is written last, by a rename)."""
    return (Path(root) / META).exists()
