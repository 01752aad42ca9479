"""Stage 1, prepare the data: the clustered dataset a config names, built on first use and cached."""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
from pathlib import Path

from ..cluster import cluster_encoded
from ..config.schema import Config
from ..data import Dataset, check_clusters, default_cache_dir
from ..data.layout import is_prepared
from ..data.writer import rewrite_meta
from ..embedded import prepare_embedded
from ..gmm.dataset import GMMSpec, prepare_gmm
from ..ingest import default_device, prepare_from_config


def prepare_data(cfg: Config, cache_dir: str | Path | None = None, *, progress: bool = False) -> Dataset:
    """The prepared (clustered) dataset of this config, built on first use, cached, and opened.

    The embedded Twemoji dataset in pixel space with pixel or caption clusters is built by
    :func:`~hddm_flower.embedded.prepare_embedded`; everything else (webdataset shards, an image folder, VAE latents,
    DINOv2 clusters) goes through `hddm prepare` (:mod:`~hddm_flower.ingest`) then `hddm cluster`
    (:mod:`~hddm_flower.cluster`) into ``cache/encoded-<hash>`` and ``cache/clusters-<hash>``. Either way every
    cluster is checked to hold training samples before anything trains.
    """
    d = cfg.data
    cache = Path(cache_dir or d.cache_dir or default_cache_dir())
    if d.prepared:  # made beforehand by `hddm prepare` + `hddm cluster --out`
        out = Path(d.prepared)
        if not is_prepared(out):
            raise FileNotFoundError(f"data.prepared: {out} is not a clustered dataset (no meta.json)")
    elif d.name == "gmm":
        out = prepare_gmm(
            cache,
            GMMSpec(
                num_clusters=cfg.num_experts,
                components_per_cluster=d.gmm_components,
                image_size=d.image_size,
                channels=d.gmm_channels,
                rank=d.gmm_rank,
                num_samples=d.gmm_samples,
                captions=d.gmm_captions,
                covariance=d.gmm_covariance,
                seed=d.seed,
            ),
            val_fraction=d.val_fraction,
            max_caption_tokens=d.max_caption_tokens,
            encoder_path=d.text_encoder or None,
        )
    elif d.name == "twemoji" and not d.vae and d.cluster_features != "dinov2":
        out = prepare_embedded(
            cache,
            image_size=d.image_size,
            num_clusters=cfg.num_experts,
            seed=d.seed,
            skin_tones=d.skin_tones,
            val_fraction=d.val_fraction,
            max_caption_tokens=d.max_caption_tokens,
            limit=d.limit,
            encoder_path=d.text_encoder or None,
            features=d.cluster_features,
        )
    else:
        encoded, out = scaled_data_dirs(cfg, cache)
        cache.mkdir(parents=True, exist_ok=True)
        with open(cache / f".{out.name}.lock", "w") as lock:  # simulated nodes share the cache: one builds
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not is_prepared(out):
                if not (encoded / "manifest.json").exists():
                    manifest = prepare_from_config(d, encoded, progress=progress)
                    if not manifest.get("num_samples"):
                        raise ValueError(
                            f"no usable samples in the input of data.{d.name} (skipped: {manifest.get('skipped')})"
                        )
                cluster_with_config(cfg, encoded, out, progress=progress)
    dataset = Dataset.open(out)
    check_clusters(dataset.meta, cfg.num_experts, str(out))
    return dataset


def prepare_institution(cfg: Config, cache_dir: str | Path | None = None, *, progress: bool = False) -> Dataset:
    """One institution's own data (``data.partition: institution``) as a one-cluster dataset: the data section's
    input prepared as usual (`hddm prepare`: encoded, text states, detail scores) without clustering it into
    ``num_experts`` (a one-cluster dataset), marked ``institution`` in its ``meta.json`` so that its single
    cluster trains whichever expert id the federation assigns (:meth:`~hddm_flower.data.Dataset.shards`)."""
    one = dataclasses.replace(
        cfg, num_experts=1, data=dataclasses.replace(cfg.data, partition="central", fine_clusters=1)
    )
    dataset = prepare_data(one, cache_dir, progress=progress)
    if dataset.meta.get("institution"):
        return dataset
    rewrite_meta(dataset.root, dataset.meta | {"institution": True})
    return Dataset.open(dataset.root)


def cluster_with_config(cfg: Config, encoded, out: Path, *, progress: bool = False) -> Path:
    """``hddm cluster`` with the run's data section: encoded samples → ``num_experts`` shard sets in ``out``."""
    d = cfg.data
    return cluster_encoded(
        encoded,
        out,
        num_clusters=cfg.num_experts,
        features=d.cluster_features,
        dinov2=d.dinov2,
        fine_clusters=d.fine_clusters,
        seed=d.seed,
        val_fraction=d.val_fraction,
        shard_size=d.shard_size,
        batch_size=d.encode_batch_size,
        fit_samples=d.kmeans_fit_samples,
        device=default_device(d.device),
        progress=progress,
    )


def scaled_data_dirs(cfg: Config, cache: Path) -> tuple[Path, Path]:
    """Where `prepare_data` keeps the encoded shards and the clustered dataset of a non-embedded config: names
    derived from the settings that change their content."""
    d = cfg.data
    enc = {
        k: getattr(d, k)
        for k in (
            "name",
            "shards",
            "folder",
            "vae",
            "text_encoder",
            "max_caption_tokens",
            "image_size",
            "limit",
            "skin_tones",
            "skip_bad_shards",
            "shard_size",
        )
    }
    clu = (
        enc
        | {
            k: getattr(d, k)
            for k in ("cluster_features", "dinov2", "fine_clusters", "kmeans_fit_samples", "seed", "val_fraction")
        }
        | {"num_experts": cfg.num_experts}
    )

    def digest(x: dict) -> str:
        return hashlib.sha256(json.dumps(x, sort_keys=True).encode()).hexdigest()[:12]

    return cache / f"encoded-{d.name}-{digest(enc)}", cache / f"clusters-{d.name}-k{cfg.num_experts}-{digest(clu)}"


def assign_objectives(cfg: Config, dataset: Dataset) -> list[str]:
    """Objective per expert id; ``auto`` uses the clusters' detail scores from the dataset metadata."""
    return cfg.objective_of([c["detail"] for c in dataset.meta["clusters"]])
