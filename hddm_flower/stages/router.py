"""Stage 3, train the router (on the server): a classifier of the cluster from (x_t, t) (``router.conditioning:
text``: and the caption's pooled text embedding), trained on a stream of the clusters' shard sets (image or latent
and cluster label, plus the pooled caption when the router reads it; memory independent of the dataset size) on
the coordinator's device."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from ..checkpoints import TIME_CONVENTION, save_router
from ..config.schema import Config
from ..config.sections import RouterConfig
from ..data import Dataset
from ..devices import resolve_device, resolve_precision
from ..models import Router, router_config
from ..rundir import ROUTER
from ..text import pooled_caption
from ..training import train_router


def router_steps(r: RouterConfig, num_images: int) -> int:
    """The router's optimiser steps: ``⌈epochs × N / batch_size⌉`` when ``router.epochs`` > 0, else ``steps``."""
    return max(1, math.ceil(r.epochs * num_images / r.batch_size)) if r.epochs > 0 else r.steps


def router_model_config(cfg: Config, dataset_meta: dict) -> dict:
    """The :class:`~hddm_flower.models.Router` config of a run: preset, experts, input shape, conditioning (and the
    text encoder's width when the router reads the caption)."""
    return router_config(
        cfg.router.preset,
        num_experts=cfg.num_experts,
        sample_size=dataset_meta["image_size"],
        in_channels=dataset_meta["channels"],
        conditioning=cfg.router.conditioning,
        caption_dim=int(dataset_meta["text_dim"]),
    )


def router_record(r: RouterConfig) -> dict:
    """What the router's record (``hddm_router.json``) and report.json say about its inputs."""
    if r.conditioning == "text":
        return {
            "conditioning": "text",
            "caption_dropout": r.caption_dropout,
            "inputs": "x_t, t and the caption's pooled text embedding (masked mean of its token states)",
            "cfg_weights": "one set for both CFG branches, computed on the conditional caption",
        }
    return {"conditioning": "none", "inputs": "x_t and t only"}


def uncond_pooled(dataset: Dataset) -> torch.Tensor:
    """The empty caption's pooled text embedding (1, dim), the router's input when a caption is dropped."""
    return pooled_caption(*dataset.uncond)


def fit_router(
    cfg: Config, dataset: Dataset, run_dir: Path, *, device: str | None = None, progress: bool = False
) -> Router:
    """Train the router on a seeded stream of all clusters' training split on ``device`` (default
    ``coordinator.device``) and save it to ``run_dir/router`` with its budget and where it ran."""
    dataset_meta = dataset.meta
    torch.manual_seed(cfg.router.seed)
    router = Router(**router_model_config(cfg, dataset_meta))
    r = cfg.router
    reads_caption = r.conditioning == "text"
    dev = resolve_device(device or cfg.coordinator.device)
    precision = resolve_precision(cfg.coordinator.mixed_precision, dev)
    num_images = dataset.size(None, "train")
    steps = router_steps(r, num_images)
    batches = dataset.images(
        None,
        batch_size=r.batch_size,
        split="train",
        seed=r.seed,
        shuffle_buffer=r.shuffle_buffer,
        pooled=reads_caption,
    )
    stats = train_router(
        router,
        batches,
        r,
        steps=steps,
        uncond_caption=uncond_pooled(dataset) if reads_caption else None,
        device=dev,
        mixed_precision=precision,
        progress=progress,
    )
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
            **router_record(r),
            "data": "streamed from the clusters' shard sets: image or latent and cluster label"
            + (", and each caption's pooled text embedding" if reads_caption else " only"),
            "time_convention": TIME_CONVENTION,
        },
    )
    return router
