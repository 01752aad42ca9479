"""Stage 3, train the router (on the server): a classifier of the cluster from (x_t, t) only, trained on a stream of
the clusters' shard sets (image or latent and cluster label only; memory independent of the dataset size) on the
coordinator's device."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from ..checkpoints import TIME_CONVENTION, save_router
from ..config import Config
from ..config_sections import RouterConfig
from ..data import read_meta, split_size
from ..data.streams import stream_images
from ..devices import resolve_device, resolve_precision
from ..models import Router, router_config
from ..rundir import ROUTER
from ..training import train_router


def router_steps(r: RouterConfig, num_images: int) -> int:
    """The router's optimiser steps: ``⌈epochs × N / batch_size⌉`` when ``router.epochs`` > 0, else ``steps``."""
    return max(1, math.ceil(r.epochs * num_images / r.batch_size)) if r.epochs > 0 else r.steps


def fit_router(
    cfg: Config, dataset_dir: Path, run_dir: Path, *, device: str | None = None, progress: bool = False
) -> Router:
    """Train the router on a seeded stream of all clusters' training split on ``device`` (default
    ``coordinator.device``) and save it to ``run_dir/router`` with its budget and where it ran."""
    dataset_meta = read_meta(dataset_dir)
    torch.manual_seed(cfg.router.seed)
    router = Router(
        **router_config(
            cfg.router.preset,
            num_experts=cfg.num_experts,
            sample_size=dataset_meta["image_size"],
            in_channels=dataset_meta["channels"],
        )
    )
    r = cfg.router
    dev = resolve_device(device or cfg.coordinator.device)
    precision = resolve_precision(cfg.coordinator.mixed_precision, dev)
    num_images = split_size(dataset_meta, None, "train")
    steps = router_steps(r, num_images)
    batches = stream_images(
        dataset_dir, None, batch_size=r.batch_size, split="train", seed=r.seed, shuffle_buffer=r.shuffle_buffer
    )
    stats = train_router(router, batches, r, steps=steps, device=dev, mixed_precision=precision, progress=progress)
    router.cpu()
    save_router(
        run_dir / ROUTER,
        router,
        {
            "preset": r.preset,
            "steps": stats.steps,
            "epochs": round(stats.images_seen / num_images, 4),
            "epochs_asked": r.epochs,
            "training_images": num_images,
            "images_seen": stats.images_seen,
            "device_seconds": round(stats.device_seconds, 3),
            "device": str(dev),
            "mixed_precision": precision,
            "final_loss": stats.final_loss,
            "inputs": "x_t and t only",
            "data": "streamed from the clusters' shard sets: image or latent and cluster label only",
            "time_convention": TIME_CONVENTION,
        },
    )
    return router
