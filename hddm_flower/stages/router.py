"""Stage 3, train the router (on the server): a classifier of the cluster from (x_t, t) only, trained on the
coordinator's copy of the data."""

from __future__ import annotations

from pathlib import Path

import torch

from ..checkpoints import TIME_CONVENTION, save_router
from ..config import Config
from ..data import load_split, read_meta
from ..models import Router, router_config
from ..rundir import ROUTER
from ..training import train_router


def fit_router(cfg: Config, dataset_dir: Path, run_dir: Path, *, progress: bool = False) -> Router:
    """Train the router on the coordinator's copy of the data and save it to ``run_dir/router``."""
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
    stats = train_router(router, load_split(dataset_dir, None, "train"), r, progress=progress)
    save_router(
        run_dir / ROUTER,
        router,
        {
            "preset": r.preset,
            "steps": stats.steps,
            "images_seen": stats.images_seen,
            "device_seconds": round(stats.device_seconds, 3),
            "final_loss": stats.final_loss,
            "inputs": "x_t and t only",
            "time_convention": TIME_CONVENTION,
        },
    )
    return router
