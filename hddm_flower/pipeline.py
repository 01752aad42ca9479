"""The stages of a run, framework-free: the Flower apps and the ``hddm`` command line both call these.

prepare data → train one expert (per client) → [server] train the router → assemble the ensemble → evaluate and
sample → write the run directory (docs/design.md, "The run directory").
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import hashlib
import json
import logging
import os
import platform
import shutil
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from PIL import Image

from .checkpoints import (
    META,
    REQUIRED_META,
    TIME_CONVENTION,
    WEIGHTS,
    CheckpointRejected,
    install_expert,
    load_expert,
    load_router,
    make_expert,
    read_expert_meta,
    save_router,
    validate_weights_file,
)
from .cluster import cluster_encoded
from .config import OBJECTIVES, Config, config_from_dict, load_config
from .convert import load_init
from .data import (
    Split,
    StreamingSplit,
    TextEncoder,
    check_clusters,
    default_cache_dir,
    extend_dataset,
    load_split,
    load_uncond,
    prepare_embedded,
    read_meta,
)
from .encoders import LatentCodec
from .ensemble import Ensemble, VelocityScaling, sample_ensemble
from .evaluate import FEATURE_NET
from .experts import map_cond
from .gmm_data import GMMSpec, prepare_gmm
from .hddm_pipeline import write_run_index
from .ingest import default_device, prepare_from_config
from .models import ExpertNet, Router, TextCond, expert_config, router_config
from .objectives import fm_interpolate
from .training import train_expert, train_router

log = logging.getLogger(__name__)


def prepare_data(cfg: Config, cache_dir: str | Path | None = None, *, progress: bool = False) -> Path:
    """The prepared (clustered) dataset directory for this config, built on first use and cached.

    The embedded Twemoji dataset in pixel space with pixel or caption clusters is built by
    :func:`~hddm_flower.data.prepare_embedded`; everything else (webdataset shards, an image folder, VAE latents,
    DINOv2 clusters) goes through `hddm prepare` (:mod:`~hddm_flower.ingest`) then `hddm cluster`
    (:mod:`~hddm_flower.cluster`) into ``cache/encoded-<hash>`` and ``cache/clusters-<hash>``. Either way every
    cluster is checked to hold training samples before anything trains.
    """
    d = cfg.data
    cache = Path(cache_dir or d.cache_dir or default_cache_dir())
    if d.prepared:  # made beforehand by `hddm prepare` + `hddm cluster --out`
        out = Path(d.prepared)
        if not (out / "meta.json").exists():
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
            if not (out / "meta.json").exists():
                if not (encoded / "manifest.json").exists():
                    manifest = prepare_from_config(d, encoded, progress=progress)
                    if not manifest.get("num_samples"):
                        raise ValueError(
                            f"no usable samples in the input of data.{d.name} (skipped: {manifest.get('skipped')})"
                        )
                cluster_encoded(
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
    check_clusters(read_meta(out), cfg.num_experts, str(out))
    return out


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


def pixel_decoder(cfg: Config, dataset_dir: Path):
    """``decode(x)``: samples or images in the experts' space → images in [−1, 1]; the identity for a pixel
    dataset, the dataset's VAE (loaded once, decoding in chunks of 64) for a latent one."""
    latent = read_meta(dataset_dir).get("latent")
    if not latent:
        return lambda x: x
    codec = LatentCodec(cfg.data.vae or latent["path"])

    @torch.no_grad()
    def decode(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([codec.decode(x[i : i + 64]) for i in range(0, len(x), 64)]) if len(x) else x

    return decode


def to_pixels(cfg: Config, dataset_dir: Path, x: torch.Tensor) -> torch.Tensor:
    """Samples in the experts' space → images in [−1, 1]: decoded by the dataset's VAE when it has latents."""
    return pixel_decoder(cfg, dataset_dir)(x)


def assign_objectives(cfg: Config, dataset_dir: Path) -> list[str]:
    """Objective per expert id; ``auto`` uses the clusters' detail scores from the dataset metadata."""
    return cfg.objective_of([c["detail"] for c in read_meta(dataset_dir)["clusters"]])


def expected_model_config(cfg: Config, dataset_dir: Path) -> dict:
    """The expert model config every checkpoint of this run must have: the preset at the dataset's shapes."""
    m = read_meta(dataset_dir)
    return expert_config(
        cfg.expert.preset, sample_size=m["image_size"], in_channels=m["channels"], caption_channels=m["text_dim"]
    )


def checkpoint_limit(cfg: Config, model_config: dict) -> int:
    """The upload size limit in bytes: ``federation.max_checkpoint_mb``, or the preset's float32 size + 5 %."""
    if cfg.federation.max_checkpoint_mb:
        return int(cfg.federation.max_checkpoint_mb * 2**20)
    with torch.device("meta"):
        n = sum(p.numel() for p in ExpertNet.from_config(model_config).parameters())
    return int(n * 4 * 1.05) + 2**20


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


def train_one_expert(
    cfg: Config,
    dataset_dir: Path,
    expert_id: int,
    objective: str,
    *,
    device: str = "cpu",
    checkpoint: Path | None = None,
    progress: bool = False,
    cluster: int | None = None,
) -> tuple[dict, dict, dict]:
    """Train expert ``expert_id`` on cluster ``cluster`` (default: ``expert_id``) of ``dataset_dir`` with
    ``objective``, in isolation.

    ``checkpoint``: where the training state is saved every ``expert.checkpoint_every`` steps and resumed from.
    Returns the transformer's state dict, its diffusers config and the checkpoint metadata (docs/design.md).
    """
    dataset_meta = read_meta(dataset_dir)
    source = {} if cluster is None else {"data_cluster": cluster, "data_dir": str(dataset_dir)}
    cluster = expert_id if cluster is None else cluster
    data = (
        StreamingSplit(dataset_dir, cluster, seed=cfg.expert.seed + expert_id)
        if cfg.data.stream
        else load_split(dataset_dir, [cluster], "train")
    )
    torch.manual_seed(cfg.expert.seed + expert_id)  # weight init
    expert, model_config, meta = build_expert(cfg, dataset_meta, objective, expert_id=expert_id)
    e = cfg.expert
    stats = train_expert(
        expert,
        data,
        load_uncond(dataset_dir),
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
        "dataset": f"{dataset_meta['name']} v{dataset_meta['version']} ({dataset_dir.name})",
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
        "created_at": _now(),
        "hddm_flower": _version("hddm-flower"),
    }
    state = {k: v.detach().cpu() for k, v in expert.net.transformer.state_dict().items()}
    return state, model_config, meta


# ----------------------------------------------------------------------------------------------------------------
# Server side: router, ensemble, evaluation, report


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
        run_dir / "router",
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


def load_ensemble(cfg: Config, run_dir: Path, router: Router | None = None) -> tuple[Ensemble, list[dict]]:
    """Assemble the experts found in ``run_dir/experts`` with the router of ``run_dir/router``."""
    s = cfg.sampling
    experts, metas = {}, []
    for folder in sorted((run_dir / "experts").glob("expert-*")):
        expert, meta = load_expert(folder, conversion=s.conversion, t_eps=s.t_eps, x0_clamp=s.x0_clamp)
        experts[int(meta["expert_id"])] = expert
        metas.append(meta)
    router = router if router is not None else load_router(run_dir / "router")
    scaling = VelocityScaling(s.velocity_scaling, s.velocity_scaling_t, s.x0_variance)
    ensemble = Ensemble(
        experts, router, cfg.num_experts, routing=s.routing, k=s.top_k, threshold=s.threshold, velocity_scaling=scaling
    )
    return ensemble, metas


def add_expert(
    run_dir: Path,
    checkpoint: Path,
    *,
    cfg: Config | None = None,
    cache_dir: str | Path | None = None,
    replace: bool = False,
    cluster_data: str | Path | None = None,
    progress: bool = False,
) -> dict:
    """Add a late expert to an assembled run: validate it, install it, retrain the router, re-evaluate.

    ``checkpoint`` is an expert folder (``hddm train-expert --out``: safetensors weights + ``hddm_expert.json``),
    e.g. a replacement for a lost expert, or a new institution that trained later on data the run never had. It
    goes through the same checks as an expert received over Flower (:func:`validate_weights_file` against the
    run's preset, with the sha256 its metadata declares); no other expert is touched or retrained. ``cfg``
    defaults to the run's ``config.yaml``. Returns the new report.

    An expert id equal to ``num_experts`` grows the run by one expert: ``cluster_data`` must then be its
    cluster's shard set (a ``cluster-k`` folder of a dataset prepared like the run's), which becomes cluster K of
    a dataset view in ``run_dir/dataset-<K+1>`` (:func:`~hddm_flower.data.extend_dataset`); the run's
    ``config.yaml`` gets ``num_experts`` K+1, the objectives with the new one appended and ``data.prepared`` set to
    the view (the old one is kept as ``config.before-expert-<K>.yaml``); the router is retrained with K+1 classes.
    """
    run_dir, checkpoint = Path(run_dir), Path(checkpoint)
    cfg = cfg or load_config(run_dir / "config.yaml")
    meta = read_expert_meta(checkpoint)
    lacks = [k for k in (*REQUIRED_META, "sha256") if k not in meta]
    if lacks:
        raise CheckpointRejected(f"{checkpoint / META} lacks {lacks}")
    expert_id = int(meta["expert_id"])
    grow = expert_id == cfg.num_experts
    if not 0 <= expert_id <= cfg.num_experts:
        raise CheckpointRejected(
            f"{checkpoint}: expert id {expert_id} is outside this run's 0..{cfg.num_experts - 1}"
            f" and is not the next one ({cfg.num_experts}); expert ids have no gaps"
        )
    if grow and cluster_data is None:
        raise CheckpointRejected(
            f"{checkpoint}: expert {expert_id} is new to this run (0..{cfg.num_experts - 1}); "
            f"pass --cluster-data with its cluster's shard set, for the router and the "
            f"evaluation"
        )
    if not grow and cluster_data is not None:
        raise CheckpointRejected(
            f"{checkpoint}: expert {expert_id} already has its cluster in this run's dataset; "
            f"--cluster-data is only for a new expert id ({cfg.num_experts})"
        )
    if meta["objective"] not in OBJECTIVES:
        raise CheckpointRejected(f"{checkpoint}: unknown objective {meta['objective']!r}")
    folder = run_dir / "experts" / f"expert-{expert_id}"
    existed = folder.exists()
    if existed and not replace:
        raise FileExistsError(f"{folder} already exists; pass --replace to replace that expert")
    dataset_dir = prepare_data(cfg, cache_dir)
    view, old_config = run_dir / f"dataset-{expert_id + 1}", run_dir / f"config.before-expert-{expert_id}.yaml"
    old_features = run_dir / f"{FEATURE_NET}.before-expert-{expert_id}"
    config_grown = False
    if grow:
        if view.exists():
            raise FileExistsError(
                f"{view} already exists (left by an earlier attempt?); remove it to add expert {expert_id}"
            )
        objectives = _trained_objectives(cfg, dataset_dir, run_dir) + [meta["objective"]]
        grown = config_from_dict(
            cfg.to_dict()
            | {
                "num_experts": expert_id + 1,
                "objectives": {
                    "ddpm": objectives.count("ddpm"),
                    "fm": objectives.count("fm"),
                    "ddpm_clusters": [k for k, o in enumerate(objectives) if o == "ddpm"],
                    "per_expert": None,
                },
                "data": cfg.to_dict()["data"] | {"prepared": str(view.resolve())},
            },
            f"{run_dir} + expert {expert_id}",
        )
    model_config = expected_model_config(cfg, dataset_dir)
    declared = {k: v for k, v in json.loads((checkpoint / "config.json").read_text()).items() if not k.startswith("_")}
    if declared != model_config:
        diff = sorted(k for k in set(declared) | set(model_config) if declared.get(k) != model_config.get(k))
        raise CheckpointRejected(
            f"{checkpoint}: model config differs from the run's preset {cfg.expert.preset!r} in {diff[:4]}"
        )
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".incoming-expert-{expert_id}.safetensors"
    try:
        shutil.copyfile(checkpoint / WEIGHTS, tmp)
        validate_weights_file(
            tmp,
            model_config,
            sha256=str(meta["sha256"]),
            dtype=meta.get("weights_dtype"),
            max_bytes=checkpoint_limit(cfg, model_config),
        )
        if grow:  # the data view and the grown config, then the expert; all undone if anything fails
            dataset_dir = extend_dataset(dataset_dir, Path(cluster_data), view)
            check_clusters(read_meta(dataset_dir), grown.num_experts, str(dataset_dir))
            shutil.copyfile(run_dir / "config.yaml", old_config)
            write_config(
                run_dir / "config.yaml",
                grown,
                f"{run_dir} grown by expert {expert_id} ({meta['objective']}) from {checkpoint}",
            )
            config_grown = True
            if (run_dir / FEATURE_NET).exists():  # trained on the old clusters: the new evaluation trains its own
                os.replace(run_dir / FEATURE_NET, old_features)
        install_expert(folder, tmp, model_config, meta | {"added_at": _now()})
    except BaseException:
        if config_grown:
            os.replace(old_config, run_dir / "config.yaml")
            if old_features.exists():
                os.replace(old_features, run_dir / FEATURE_NET)
        if grow:
            shutil.rmtree(view, ignore_errors=True)
        raise
    finally:
        tmp.unlink(missing_ok=True)
    cfg = grown if grow else cfg
    before = json.loads((run_dir / "report.json").read_text()) if (run_dir / "report.json").exists() else {}
    reasons = {m["expert_id"]: m["reason"] for m in before.get("missing", [])}
    present = {int(read_expert_meta(f)["expert_id"]) for f in (run_dir / "experts").glob("expert-*")}
    missing = [
        {"expert_id": k, "reason": reasons.get(k, "no expert folder")}
        for k in range(cfg.num_experts)
        if k not in present
    ]
    added = before.get("added_experts", []) + [
        {
            "expert_id": expert_id,
            "objective": meta["objective"],
            "sha256": meta["sha256"],
            "source": str(checkpoint),
            "replaced": existed,
            "new_cluster": str(cluster_data) if grow else None,
            "added_at": _now(),
        }
    ]
    if grow and old_features.exists():  # FID/KID before and after are in different feature spaces
        added[-1]["feature_network_retrained"] = f"the old one is in {old_features.name}"
    extra = {k: before[k] for k in ("flower",) if k in before} | {"added_experts": added}
    log.info(
        "expert %d (%s) added to %s; retraining the router and re-evaluating", expert_id, meta["objective"], run_dir
    )
    return finish_run(cfg, run_dir, dataset_dir, missing, extra=extra, progress=progress)


def _trained_objectives(cfg: Config, dataset_dir: Path, run_dir: Path) -> list[str]:
    """The objective of each of the run's expert ids: what a present expert's metadata says it trained with, else
    the config's assignment."""
    objectives = assign_objectives(cfg, dataset_dir)
    for folder in (run_dir / "experts").glob("expert-*"):
        m = read_expert_meta(folder)
        if 0 <= int(m["expert_id"]) < len(objectives):
            objectives[int(m["expert_id"])] = m["objective"]
    return objectives


def write_config(path: Path, cfg: Config, origin: str) -> None:
    """Write ``cfg`` as YAML (atomically), headed by a comment that says where it came from."""
    tmp = path.with_suffix(".yaml.tmp")
    tmp.write_text(f"# {origin}\n" + yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    os.replace(tmp, path)


@torch.no_grad()
def evaluate(
    ensemble: Ensemble, data: Split, *, seed: int = 0, times: tuple[float, ...] = (0.1, 0.3, 0.5, 0.7, 0.9)
) -> dict[str, Any]:
    """Held-out diagnostics in velocity space (no feature network involved).

    * ``router_top1_accuracy`` / ``router_top2_accuracy`` per t: the router's cluster prediction from ``(x_t, t)``.
    * ``expert_velocity_mse``: each expert on its own cluster's held-out images, ``‖v̂ − (eps − x0)‖²``.
    * ``ensemble_velocity_mse``: the ensemble with its routing mode on all held-out images, and
      ``oracle_velocity_mse``: oracle routing (the true cluster's expert) on the images whose expert is present;
      with every expert present the gap is what routing errors cost.
    """
    g = torch.Generator().manual_seed(seed)
    out: dict[str, Any] = {
        "times": list(times),
        "num_images": len(data),
        "router_top1_accuracy": [],
        "router_top2_accuracy": [],
        "ensemble_velocity_mse": [],
        "oracle_velocity_mse": [],
    }
    present = [int(k) for k in ensemble.experts]
    per_expert = {k: [] for k in present}
    for t in times:
        eps = torch.randn(data.images.shape, generator=g)
        x_t = fm_interpolate(data.images, eps, torch.tensor(t))
        target = eps - data.images
        tt = torch.full((len(data),), t)
        probs = ensemble.posterior(x_t, tt)
        top2 = probs.topk(2, -1).indices
        out["router_top1_accuracy"].append((top2[:, 0] == data.labels).float().mean().item())
        out["router_top2_accuracy"].append((top2 == data.labels[:, None]).any(-1).float().mean().item())
        v = ensemble.velocity(x_t, tt, data.cond)
        out["ensemble_velocity_mse"].append(((v - target) ** 2).mean().item())
        mine = torch.isin(data.labels, torch.tensor(present))
        v_oracle = ensemble.velocity(
            x_t[mine], tt[mine], map_cond(lambda c: c[mine], data.cond), routing="oracle", labels=data.labels[mine]
        )
        out["oracle_velocity_mse"].append(((v_oracle - target[mine]) ** 2).mean().item())
        for k in present:
            rows = data.labels == k
            if rows.any():
                v_k = ensemble.experts[str(k)].velocity(x_t[rows], tt[rows], map_cond(lambda c: c[rows], data.cond))
                per_expert[k].append(((v_k - target[rows]) ** 2).mean().item())
    out["expert_velocity_mse"] = {str(k): float(np.mean(v)) if v else None for k, v in per_expert.items()}
    return out


@torch.no_grad()
def sample_grid(
    ensemble: Ensemble,
    encoder: TextEncoder,
    prompts: list[str],
    uncond: TextCond,
    *,
    samples_per_prompt: int,
    num_steps: int,
    cfg_scale: float,
    seed: int,
) -> torch.Tensor:
    """Samples (P·S, C, H, W) in [−1, 1], prompt-major, from the ensemble with per-expert CFG."""
    cond, _ = encoder.encode(prompts)
    cond = TextCond(
        cond.states.repeat_interleave(samples_per_prompt, 0), cond.mask.repeat_interleave(samples_per_prompt, 0)
    )
    n = len(prompts) * samples_per_prompt
    un = TextCond(uncond.states.expand(n, -1, -1), uncond.mask.expand(n, -1))
    size = ensemble.router.config.sample_size
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(n, ensemble.router.config.in_channels, size, size, generator=g)
    return sample_ensemble(ensemble, noise, cond, un, num_steps=num_steps, cfg_scale=cfg_scale, generator=g)


def save_grid(images: torch.Tensor, rows: int, path: Path, scale: int = 4) -> None:
    """Save images in [−1, 1] as one PNG grid (``rows`` rows), upscaled with nearest neighbours."""
    x = ((images.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    n, h, w, c = x.shape
    cols = n // rows
    pad = 2
    grid = np.full((rows * (h + pad) + pad, cols * (w + pad) + pad, c), 255, np.uint8)
    for i in range(n):
        r, col = divmod(i, cols)
        grid[pad + r * (h + pad) : pad + r * (h + pad) + h, pad + col * (w + pad) : pad + col * (w + pad) + w] = x[i]
    img = Image.fromarray(grid)
    img.resize((img.width * scale, img.height * scale), Image.NEAREST).save(path)


def finish_run(
    cfg: Config,
    run_dir: Path,
    dataset_dir: Path,
    missing: list[dict],
    *,
    extra: dict | None = None,
    progress: bool = False,
) -> dict:
    """After the experts arrived in ``run_dir/experts``: router, then :func:`evaluate_and_report`."""
    router = fit_router(cfg, dataset_dir, run_dir, progress=progress)
    return evaluate_and_report(cfg, run_dir, dataset_dir, missing, router=router, extra=extra, progress=progress)


def evaluate_and_report(
    cfg: Config,
    run_dir: Path,
    dataset_dir: Path,
    missing: list[dict],
    *,
    router: Router | None = None,
    extra: dict | None = None,
    modes: list[str] | None = None,
    feature_dir: Path | None = None,
    reference: dict | None = None,
    progress: bool = False,
) -> dict:
    """Evaluate the assembled run (diagnostics, every routing mode, per expert), sample the configured prompts and
    write report.json, report.md, the grids and the plots into ``run_dir``. ``reference``: federated FID
    reference statistics per cluster (see :func:`hddm_flower.evaluate.evaluate_run`)."""
    from .evaluate import evaluate_run

    ensemble, metas = load_ensemble(cfg, run_dir, router)
    s = cfg.sampling
    metrics = evaluate(ensemble, load_split(dataset_dir, None, "val"), seed=s.seed, times=tuple(cfg.evaluation.times))
    metrics["evaluation"] = evaluate_run(
        cfg,
        ensemble,
        dataset_dir,
        run_dir,
        modes=modes,
        feature_dir=feature_dir,
        reference=reference,
        progress=progress,
    )
    write_run_index(cfg, run_dir, dataset_dir)  # the run directory is now a diffusers pipeline folder
    encoder = TextEncoder(cfg.data.text_encoder or None, read_meta(dataset_dir)["max_caption_tokens"])
    images = sample_grid(
        ensemble,
        encoder,
        s.prompts,
        load_uncond(dataset_dir),
        samples_per_prompt=s.samples_per_prompt,
        num_steps=s.num_steps,
        cfg_scale=s.cfg_scale,
        seed=s.seed,
    )
    save_grid(to_pixels(cfg, dataset_dir, images), len(s.prompts), run_dir / "samples.png")
    metrics["sampling"] = {
        "grid": "samples.png",
        "prompts": s.prompts,
        "samples_per_prompt": s.samples_per_prompt,
        "num_steps": s.num_steps,
        "cfg_scale": s.cfg_scale,
        "routing": s.routing,
        "top_k": s.top_k,
        "conversion": s.conversion,
        "t_eps": s.t_eps,
        "x0_clamp": s.x0_clamp,
        "sampler": "FM Euler, t from 1 to 0, CFG per expert before mixing",
    }
    metrics["feature_network"] = metrics["evaluation"]["feature_network"]
    return write_report(cfg, run_dir, dataset_dir, metas, missing, metrics, extra or {})


def write_report(
    cfg: Config, run_dir: Path, dataset_dir: Path, metas: list[dict], missing: list[dict], metrics: dict, extra: dict
) -> dict:
    dataset_meta = read_meta(dataset_dir)
    keep = (
        "expert_id",
        "cluster_id",
        "objective",
        "schedule",
        "num_train_timesteps",
        "preset",
        "steps",
        "images_seen",
        "device_seconds",
        "peak_memory_bytes",
        "final_loss",
        "cluster_size",
        "ema",
        "sha256",
        "node_id",
        "objective_assigned",
        "device",
        "resumed_steps",
        "weights_dtype",
        "weights_bytes",
    )
    experts = [{k: m[k] for k in keep if k in m} for m in sorted(metas, key=lambda m: m["expert_id"])]
    report = {
        "created_at": _now(),
        "run_dir": str(run_dir),
        "num_experts": cfg.num_experts,
        "experts": experts,
        "missing": sorted(missing, key=lambda m: m["expert_id"]),
        "metrics": metrics,
        "dataset": {
            k: dataset_meta[k]
            for k in ("name", "version", "image_size", "num_images", "text_encoder", "cluster_features", "license")
        }
        | {"clusters": [{k: c[k] for k in ("id", "size", "detail", "categories")} for c in dataset_meta["clusters"]]},
        "config": cfg.to_dict(),
        "versions": versions(),
        **extra,
    }
    _write_atomic(run_dir / "report.json", json.dumps(report, indent=2))
    _write_atomic(run_dir / "report.md", render_report_md(report))
    return report


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _fmt(x: Any, spec: str = ".3f") -> str:
    return "–" if x is None else format(x, spec)


def _kid(x: dict) -> str:
    return "–" if x.get("kid") is None else f"{x['kid']:.4f} ± {x['kid_std']:.4f}"


def render_report_md(r: dict) -> str:
    m = r["metrics"]
    ev = m.get("evaluation")
    lines = [
        f"# hddm-flower run — {r['created_at']}",
        "",
        f"{len(r['experts'])} of {r['num_experts']} experts; run directory `{r['run_dir']}`.",
        "",
        "| expert | cluster | objective | top categories | steps | images seen | device s | velocity MSE "
        "| FID (own cluster) | KID (own cluster) | x̂0 clamps |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    clusters = {c["id"]: c for c in r["dataset"]["clusters"]}
    per_expert = (ev or {}).get("per_expert", {})
    for e in r["experts"]:
        cats = ", ".join(list(clusters[e["cluster_id"]]["categories"])[:2])
        obj = e["objective"] + (f" ({e['schedule']})" if e["objective"] == "ddpm" else "")
        mse = m["expert_velocity_mse"].get(str(e["expert_id"]))
        pe = per_expert.get(str(e["expert_id"]), {})
        c = pe.get("clamps") or {}
        clamps = f"{c['x0_clamp_elements'] / c['elements']:.2%}" if c.get("elements") else "–"
        lines.append(
            f"| {e['expert_id']} | {e['cluster_id']} | {obj} | {cats} | {e['steps']} | {e['images_seen']} "
            f"| {e['device_seconds']:.0f} | {_fmt(mse, '.4f')} | {_fmt(pe.get('fid'), '.2f')} "
            f"| {_fmt(pe.get('kid'), '.4f')} | {clamps} |"
        )
    if r["missing"]:
        lines += ["", "Missing experts:", ""] + [f"- expert {x['expert_id']}: {x['reason']}" for x in r["missing"]]
    if ev:
        p = ev["protocol"]
        lines += [
            "",
            f"## Routing modes (aligned inference: {p['prompts']} prompts × {p['samples_per_prompt']} "
            f"samples, same noise, {p['num_steps']} steps, CFG {p['cfg_scale']}, seed {p['seed']})",
            "",
            f"- FID/KID features: **{ev['feature_network']}**; reference: {p['reference']}",
            f"- diversity: {ev['diversity_distance']}",
            "",
            "| routing | FID ↓ | KID ↓ | intra-prompt diversity ↑ | CLIP ↑ | experts per step | x̂0 clamps "
            "| 1−t<t_eps rows | s |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for mode, x in ev["modes"].items():
            c = x["clamps"]
            clamps = f"{c['x0_clamp_elements'] / c['elements']:.2%}" if c.get("elements") else "–"
            eps_rows = f"{c['t_eps_rows']}/{c['rows']}" if c.get("rows") else "–"
            clip = _fmt(x["clip_score"]["value"], ".2f") if "clip_score" in x else "–"
            lines.append(
                f"| {mode} | {x['fid']:.2f} | {_kid(x)} | {x['lpips']['mean']:.3f}"
                f" ± {x['lpips']['std']:.3f} | {clip} | {sum(x['usage']):.2f} | {clamps} | {eps_rows} "
                f"| {x['seconds']:.0f} |"
            )
        lines += [
            "",
            f"![router weights over t]({ev['plots']['router_weights']}) ![expert usage]({ev['plots']['expert_usage']})",
            "",
            "Grids per prompt (rows: routing modes): "
            + ", ".join(f"[{g['prompt']}]({g['file']})" for g in ev["grids"]),
        ]
    t = m["times"]
    lines += [
        "",
        "## Held-out diagnostics (velocity space, no feature network)",
        "",
        "| t | " + " | ".join(f"{x:g}" for x in t) + " |",
        "|---" * (len(t) + 1) + "|",
    ]
    for key in ("router_top1_accuracy", "router_top2_accuracy", "ensemble_velocity_mse", "oracle_velocity_mse"):
        lines.append(f"| {key} | " + " | ".join(f"{x:.3f}" for x in m[key]) + " |")
    s = m["sampling"]
    lines += [
        "",
        f"Samples ({s['sampler']}; {s['num_steps']} steps, CFG {s['cfg_scale']}, routing {s['routing']}"
        f" k={s['top_k']}, conversion {s['conversion']}); rows are the prompts:",
        "",
    ]
    lines += [f"{i + 1}. {p}" for i, p in enumerate(s["prompts"])] + ["", f"![samples]({s['grid']})", ""]
    return "\n".join(lines)


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in (
        "hddm-flower",
        "torch",
        "diffusers",
        "transformers",
        "flwr",
        "webdataset",
        "safetensors",
        "torchmetrics",
        "torch-fidelity",
        "lpips",
        "torchvision",
    ):
        out[pkg] = _version(pkg)
    return out


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "not installed"


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
