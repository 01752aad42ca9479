"""Stage 2, train one expert (on a client): the expert network of the run's preset, trained in isolation on
its own cluster with its own objective; plus the model config and size limit every expert of a run must meet."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from ..accept import ExpertSpec
from ..checkpoints import TIME_CONVENTION, make_expert
from ..clean_prior import measure_clean_prior
from ..config.schema import Config
from ..convert import load_init
from ..data import Dataset, Split, StreamingSplit
from ..models import ExpertNet, expert_config
from ..provenance import now, package_version
from ..training import train_expert

log = logging.getLogger(__name__)


def expected_model_config(cfg: Config, dataset: Dataset) -> dict:
    """The expert model config every checkpoint of this run must have: the preset at the dataset's shapes."""
    m = dataset.meta
    return expert_config(
        cfg.expert.preset, sample_size=m["image_size"], in_channels=m["channels"], caption_channels=m["text_dim"]
    )


def checkpoint_limit(cfg: Config, model_config: dict) -> int:
    """The upload size limit in bytes: ``federation.max_checkpoint_mb``, or the preset's float32 size + 5 % + 1 MiB."""
    if cfg.federation.max_checkpoint_mb:
        return int(cfg.federation.max_checkpoint_mb * 2**20)
    with torch.device("meta"):
        n = sum(p.numel() for p in ExpertNet.from_config(model_config).parameters())
    return int(n * 4 * 1.05) + 2**20


def expert_spec(cfg: Config, dataset: Dataset) -> ExpertSpec:
    """What every expert of this run must be (:class:`~hddm_flower.accept.ExpertSpec`): the preset at the dataset's
    shapes, the upload size limit and the FM experts' training-time sampling."""
    model_config = expected_model_config(cfg, dataset)
    limit = checkpoint_limit(cfg, model_config)
    return ExpertSpec(cfg.num_experts, model_config, limit, cfg.expert.preset, fm_time_sampling(cfg))


def fm_time_sampling(cfg: Config) -> dict:
    """How this run's FM experts draw their training times, as their metadata records it."""
    e = cfg.expert
    return {"kind": e.fm_time_sampling} | (
        {"mean": e.fm_logit_mean, "std": e.fm_logit_std} if e.fm_time_sampling == "logit_normal" else {}
    )


def build_expert(cfg: Config, dataset_meta: dict, objective: str, expert_id: int = 0):
    """A new expert network (random or ``expert.init``) wrapped in the adapter of ``objective``; returns
    (adapter, model_config, meta)."""
    model_config = expert_config(
        cfg.expert.preset,
        sample_size=dataset_meta["image_size"],
        in_channels=dataset_meta["channels"],
        caption_channels=dataset_meta["text_dim"],
    )
    meta = {"objective": objective, "preset": cfg.expert.preset, "time_convention": TIME_CONVENTION}
    meta["sample_range"] = cfg.sampling.x0_clamp  # |x0| bound of the data: diffusers' clip_sample_range
    if objective == "ddpm":
        meta |= {"schedule": cfg.ddpm.schedule, "num_train_timesteps": cfg.ddpm.num_train_timesteps}
    else:  # how training drew t (sampling does not depend on it)
        meta["time_sampling"] = fm_time_sampling(cfg)
    net = ExpertNet.from_config(model_config)
    init = cfg.init_for(expert_id, objective)
    meta["init"] = init
    if init != "random":  # a convert-dit output or a diffusers PixArt transformer folder
        state, notes = load_init(init, model_config)
        net.transformer.load_state_dict(state)
        init_meta = Path(init) / "hddm_init.json"
        converted_for = json.loads(init_meta.read_text())["objective"] if init_meta.exists() else objective
        if converted_for != objective:
            notes.append(f"converted for {converted_for}, trained as {objective}")
        meta["init_notes"] = notes
    return make_expert(net, meta), model_config, meta


CLEAN_PRIOR_HELDOUT = 256
"""Held-out images (each with 4 noise draws per time) a node uses to measure a DDPM expert's clean prior."""
CLEAN_PRIOR_MIN_HELDOUT = 2
"""Fewest held-out images (per ``meta.json``) for which a node measures the table; with fewer it ships none."""


def clean_prior_meta(expert, train: Split | StreamingSplit, heldout: Split, seed: int) -> dict:
    """A DDPM expert's measured clean prior (:mod:`hddm_flower.clean_prior`) as metadata: the mean of its training
    images (of the held-out split when the training data streams) and the table on up to ``CLEAN_PRIOR_HELDOUT``
    held-out images (at least ``CLEAN_PRIOR_MIN_HELDOUT``)."""
    if len(heldout) < CLEAN_PRIOR_MIN_HELDOUT:
        raise ValueError(f"{len(heldout)} held-out images; the clean prior needs {CLEAN_PRIOR_MIN_HELDOUT}")
    images = train.images if isinstance(train, Split) else heldout.images
    mean = images.double().mean(0)
    n = min(len(heldout), CLEAN_PRIOR_HELDOUT)
    x0, cond = heldout.batch(torch.arange(n))
    was_training = expert.training
    expert.eval()
    try:
        prior = measure_clean_prior(
            expert.net, expert.alpha_bar, mean, x0, cond, generator=torch.Generator().manual_seed(seed)
        )
    finally:
        expert.train(was_training)
    return prior.to_meta()


def train_one_expert(
    cfg: Config,
    dataset: Dataset,
    expert_id: int,
    objective: str,
    *,
    device: str = "cpu",
    checkpoint: Path | None = None,
    progress: bool = False,
    cluster: int | None = None,
) -> tuple[dict, dict, dict]:
    """Train expert ``expert_id`` on cluster ``cluster`` (default: ``expert_id``) of ``dataset`` with
    ``objective``, in isolation.

    ``checkpoint``: where the training state is saved every ``expert.checkpoint_every`` steps and resumed from.
    Returns the transformer's state dict, its diffusers config and the checkpoint metadata (docs/design.md).
    """
    dataset_meta = dataset.meta
    source = {} if cluster is None else {"data_cluster": cluster, "data_dir": str(dataset.root)}
    cluster = expert_id if cluster is None else cluster
    data = (
        StreamingSplit(dataset, cluster, seed=cfg.expert.seed + expert_id)
        if cfg.data.stream
        else dataset.split([cluster], "train")
    )
    torch.manual_seed(cfg.expert.seed + expert_id)  # weight init
    expert, model_config, meta = build_expert(cfg, dataset_meta, objective, expert_id=expert_id)
    e = cfg.expert
    stats = train_expert(
        expert,
        data,
        dataset.uncond,
        e,
        seed=e.seed + expert_id,
        checkpoint=checkpoint,
        name=f"expert {expert_id} [{objective}]",
        device=device,
        progress=progress,
    )
    meta |= {
        "expert_id": expert_id,
        "cluster_id": expert_id,
        "ema": stats.ema,
        "ema_decay": e.ema_decay,
        "mixed_precision": e.mixed_precision,
        "grad_accumulation": e.grad_accumulation,
        "dataset": f"{dataset_meta['name']} v{dataset_meta['version']} ({dataset.root.name})",
        "cluster_size": len(data),
        "steps": stats.steps,
        "resumed_steps": stats.resumed_steps,
        **source,
        "images_seen": stats.images_seen,
        "device_seconds": round(stats.device_seconds, 3),
        "device": str(device),
        "cpu_threads": torch.get_num_threads(),
        "peak_memory_bytes": stats.peak_memory_bytes,
        "final_loss": stats.final_loss,
        "loss_curve": stats.loss_curve,
        "batch_size": e.batch_size,
        "lr": e.optim.lr,
        "caption_dropout": e.caption_dropout,
        "created_at": now(),
        "hddm_flower": package_version("hddm-flower"),
    }
    if objective == "ddpm":  # measured on the node's held-out split, shipped with the weights
        heldout = dataset.size([cluster], "val")
        if heldout < CLEAN_PRIOR_MIN_HELDOUT:  # no table: the expert keeps the clamp, as an older checkpoint does
            meta["clean_prior"] = None
            meta["clean_prior_note"] = (
                f"not measured: cluster {cluster} has {heldout} held-out sample(s), "
                f"{CLEAN_PRIOR_MIN_HELDOUT} needed; the conversion clamps x0"
            )
            log.warning("expert %d [ddpm]: clean prior %s", expert_id, meta["clean_prior_note"])
        else:
            val = dataset.split([cluster], "val")
            meta["clean_prior"] = clean_prior_meta(expert, data, val, e.seed + expert_id + 7919)
    state = {k: v.detach().cpu() for k, v in expert.net.transformer.state_dict().items()}
    return state, model_config, meta
