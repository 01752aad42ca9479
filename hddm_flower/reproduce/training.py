"""What ``hddm reproduce`` trains and reuses: the experts, the router and the monolith of each training, each
cached by the fingerprint of what it depends on (config, objective, data) and resumed from its training state;
the process pool the trainings and evaluations run in (:func:`run_jobs`)."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor, nn

from ..budget import budget_of
from ..budget import expert_config as budget_expert_config
from ..checkpoints import META, ROUTER_META, WEIGHTS, read_expert_meta, save_expert, sha256_file
from ..config.io import config_from_dict
from ..config.rules import ConfigError
from ..config.schema import Config, ExpertConfig
from ..data import Dataset, StreamingAllClusters
from ..data.layout import META as DATASET_META
from ..devices import keep_freed_memory, resolve_device
from ..rundir import ROUTER
from ..stages.expert import build_expert, train_one_expert
from ..stages.router import fit_router
from ..training import train_expert

log = logging.getLogger(__name__)


def tensor_sha256(path: str | os.PathLike) -> str:
    """sha256 over a safetensors file's tensors (names, dtypes, shapes, bytes in name order): equal for equal
    weights, unlike the file's own sha256, whose header metadata order varies from one save to the next."""
    from safetensors.torch import load_file

    h = hashlib.sha256()
    for name, t in sorted(load_file(path).items()):
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def dataset_id(dataset: Dataset) -> dict:
    """What the training caches key a dataset by: its folder name, version and the hash of its ``meta.json``."""
    return {
        "dataset": dataset.root.name,
        "version": dataset.meta["version"],
        "meta_sha256": sha256_file(dataset.root / DATASET_META),
    }


def fingerprint_of(*parts: Any) -> str:
    """The cache key of a training: a short hash of ``parts`` (config sections, the dataset's id) as JSON."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def config_for(cfg: Config, num_ddpm: int) -> Config:
    """``cfg`` with ``num_ddpm`` DDPM experts on the most detailed clusters and FM elsewhere."""
    d = copy.deepcopy(cfg.to_dict())
    d["objectives"] = {"ddpm": num_ddpm, "fm": cfg.num_experts - num_ddpm, "ddpm_clusters": "auto", "per_expert": None}
    return config_from_dict(d, "reproduce")


class OneExpertRouter(nn.Module):
    """The monolith's "router": a single expert always gets weight 1."""

    def __init__(self, in_channels: int, sample_size: int):
        super().__init__()
        self.config = SimpleNamespace(in_channels=in_channels, sample_size=sample_size)

    def forward(self, x_t: Tensor, t: Tensor) -> Tensor:
        return torch.zeros(x_t.shape[0], 1, dtype=x_t.dtype, device=x_t.device)


class NotTrained(Exception):
    """:func:`train_or_reuse` asked only to reuse (``train=None``) a folder that holds no training yet."""


def run_jobs(fn, args: list[tuple], jobs: int, progress: bool, what: str) -> list:
    """``[fn(a) for a in args]``, in ``jobs`` spawned processes when ``jobs`` > 1 (results in order; each process
    keeps the memory it frees for its next job's tensors: :func:`~hddm_flower.devices.keep_freed_memory`)."""
    if jobs <= 1 or len(args) <= 1:
        return [fn(a) for a in args]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from tqdm.auto import tqdm

    with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn"), initializer=keep_freed_memory) as pool:
        futures = [pool.submit(fn, a) for a in args]
        for f in tqdm(
            as_completed(futures),
            total=len(futures),
            disable=not progress,
            desc=f"{what}: {len(args)} jobs in {jobs} processes",
        ):
            f.result()
        return [f.result() for f in futures]


def training_state(folder: Path, fingerprint: str) -> Path:
    """The training-state file of the expert or monolith trained into ``folder`` (saved every
    ``expert.checkpoint_every`` steps, resumed from by a later ``hddm reproduce`` with the same ``--out``, removed
    once ``folder`` is written): beside ``folder``, named by the training's fingerprint, so that a training of
    another config never resumes from it."""
    return folder.with_name(f".{folder.name}.{fingerprint}.train-state.pt")


def train_job(a: tuple) -> None:
    """Train one expert (``k``) or the monolith (``k is None``) into ``folder`` (a separate process when jobs > 1:
    one torch thread each, no progress bars), resuming from its :func:`training_state` if one is there."""
    cfg_dict, dataset_root, k, obj, folder, fingerprint, in_worker, progress = a
    if in_worker:
        torch.set_num_threads(1)
    cfg, dataset = config_from_dict(cfg_dict, "reproduce"), Dataset.open(dataset_root)  # the worker opens it
    progress = progress and not in_worker
    state = training_state(Path(folder), fingerprint)
    if k is None:
        fn = lambda: train_monolith(cfg, dataset, checkpoint=state, progress=progress)  # noqa: E731
    else:
        device = resolve_device(cfg.coordinator.device)
        fn = lambda: train_one_expert(cfg, dataset, k, obj, device=device, checkpoint=state, progress=progress)  # noqa: E731
    train_or_reuse(Path(folder), fingerprint, fn, dtype=cfg.expert.weights_dtype)
    state.unlink(missing_ok=True)


def train_or_reuse(
    folder: Path, fingerprint: str, train, *, dtype: str | None = None, also: Iterable[str] = ()
) -> dict:
    """Reuse ``folder`` if it was trained with the same fingerprint (or one of ``also``: an older key of the same
    training); refuse if with another; else train (with ``train=None``: raise :class:`NotTrained`)."""
    if (folder / META).exists():
        meta = read_expert_meta(folder)
        if meta.get("reproduce_fingerprint") not in {fingerprint, *also}:
            raise ConfigError(
                f"{folder} was trained with another config (fingerprint "
                f"{meta.get('reproduce_fingerprint')} ≠ {fingerprint}); use a new --out"
            )
        return {
            "sha256": meta["sha256"],
            "tensor_sha256": tensor_sha256(folder / WEIGHTS),
            "reused": True,
            "device_seconds": meta["device_seconds"],
            "final_loss": meta.get("final_loss"),
        }
    if train is None:
        raise NotTrained(folder)
    state, model_config, meta = train()
    meta["reproduce_fingerprint"] = fingerprint
    digest = save_expert(folder, state, model_config, meta, dtype=dtype)
    return {
        "sha256": digest,
        "tensor_sha256": tensor_sha256(folder / WEIGHTS),
        "reused": False,
        "device_seconds": meta["device_seconds"],
        "final_loss": meta.get("final_loss"),
    }


def train_monolith(
    cfg: Config, dataset: Dataset, *, checkpoint: Path | None = None, progress: bool = False
) -> tuple[dict, dict, dict]:
    """An FM expert of the experts' size on all clusters, trained exactly as the experts are (micro-batches,
    gradient accumulation, precision, optimiser; its learning rate ``reproduce.monolith_lr`` where that is set:
    :func:`monolith_section`) for the steps and batch of ``reproduce.budget``
    (:mod:`hddm_flower.budget`: K × ``expert.steps`` at the experts' batch under equal_images, ``expert.steps``
    at ``expert.batch_size`` under equal_steps): as many images seen as all K experts together. With
    ``data.stream`` the training split is streamed from the shards
    (:class:`~hddm_flower.data.streams.StreamingAllClusters`, seeded), not loaded. ``checkpoint``: the training-state
    file saved every ``expert.checkpoint_every`` steps and resumed from, as an expert's
    (:func:`~hddm_flower.stages.expert.train_one_expert`)."""
    budget = budget_of(cfg)
    e = dataclasses.replace(monolith_section(cfg), batch_size=budget.monolith_batch)
    steps = budget.monolith_steps
    dataset_meta = dataset.meta
    data = StreamingAllClusters(dataset, seed=e.seed + 1000) if cfg.data.stream else dataset.split(None, "train")
    torch.manual_seed(e.seed + 1000)
    expert, model_config, meta = build_expert(cfg, dataset_meta, "fm")
    stats = train_expert(
        expert,
        data,
        dataset.uncond,
        dataclasses.replace(e, steps=steps),
        seed=e.seed + 1000,
        checkpoint=checkpoint,
        name="monolith [fm]",
        device=resolve_device(cfg.coordinator.device),
        progress=progress,
    )
    meta |= {
        "expert_id": 0,
        "cluster_id": "all",
        "monolith": True,
        "steps": stats.steps,
        "resumed_steps": stats.resumed_steps,
        "grad_accumulation": e.grad_accumulation,
        "mixed_precision": e.mixed_precision,
        "images_seen": stats.images_seen,
        "device_seconds": round(stats.device_seconds, 3),
        "final_loss": stats.final_loss,
        "loss_curve": stats.loss_curve,
        "seed": e.seed + 1000,
        "cluster_size": len(data),
        "batch_size": e.batch_size,
        "budget": budget.protocol,
        "lr": e.optim.lr,
    }
    state = {k: v.detach().cpu() for k, v in expert.net.transformer.state_dict().items()}
    return state, model_config, meta


def training_root(out: Path, i: int) -> Path:
    """Where training ``i`` keeps its experts, monolith and router: ``OUT`` itself for training 0 (the layout of a
    run with one training, so its caches stay valid) and ``OUT/trainings/training-i`` for the others."""
    return out if i == 0 else out / "trainings" / f"training-{i}"


def monolith_section(cfg: Config) -> ExpertConfig:
    """The expert section the monolith trains with: ``cfg.expert``, its learning rate ``reproduce.monolith_lr``
    where that is set (a baseline at its own tuned rate; 0 = the experts' rate)."""
    lr = cfg.reproduce.monolith_lr
    if not lr or lr == cfg.expert.optim.lr:
        return cfg.expert
    return dataclasses.replace(cfg.expert, optim=dataclasses.replace(cfg.expert.optim, lr=lr))


def monolith_fingerprint(cfg: Config, data_id: dict) -> str:
    """The training cache key of a training's monolith: its expert section (:func:`monolith_section`), the DDPM
    section, the dataset, and the budget protocol where it is not the default (so that equal_images caches stay
    valid). A ``reproduce.monolith_lr`` equal to the experts' rate keys as 0 does."""
    protocol = cfg.reproduce.budget
    return fingerprint_of(monolith_section(cfg), cfg.ddpm, data_id, *([protocol] if protocol != "equal_images" else []))


def expert_fingerprint(cfg: Config, data_id: dict) -> str:
    """The training cache key of a training's experts: the expert section each expert is trained with under the
    budget (:func:`hddm_flower.budget.expert_config`), the DDPM section and the dataset. Two protocols whose experts
    train alike (equal_steps at batch B·K and equal_images at batch B, the same steps) share their experts; under
    equal_images the key is the monolith's, as it always was."""
    return fingerprint_of(budget_expert_config(cfg).expert, cfg.ddpm, data_id)


def adopt(folder: Path, fingerprint: str, donors: list[Path], read_fingerprint) -> Path | None:
    """Copy into ``folder`` (absent) the first ``donor / folder.name`` whose ``read_fingerprint(donor_folder)`` is
    ``fingerprint``: a finished training of another ``hddm reproduce`` output (``--reuse``), its files hard-linked
    where the file system allows it (every file of a training is written whole and renamed, never changed in
    place). Returns the donor folder, or None."""
    if folder.exists():
        return None
    for donor in donors:
        source = donor / folder.name
        try:
            found = source.is_dir() and read_fingerprint(source) == fingerprint
        except (OSError, ValueError, KeyError):
            found = False
        if found:
            tmp = folder.with_name(f".{folder.name}.adopting")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(source, tmp, copy_function=link_or_copy)
            os.replace(tmp, folder)
            log.info("%s: reused from %s (fingerprint %s)", folder, source, fingerprint)
            return source
    return None


def link_or_copy(src: str, dst: str) -> None:
    """A hard link ``dst`` to ``src``, or a copy where the two are on different file systems."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _expert_fingerprint_in(folder: Path) -> str | None:
    return read_expert_meta(folder).get("reproduce_fingerprint")


def train_or_reuse_experts(
    cfgs: list[Config],
    roots: list[Path],
    dataset: Dataset,
    unique: list[tuple[int, str]],
    data_id: dict,
    jobs: int,
    progress: bool,
    donors: list[list[Path]] | None = None,
) -> list[dict]:
    """Every training's unique (cluster, objective) experts and its monolith, reused when their fingerprint (the
    training's expert config, seeds included, and the dataset) matches, else trained, all pending jobs of all
    trainings in one pool of ``jobs`` processes. ``donors[i]``: the folders of training i in other outputs whose
    finished experts and monolith are copied in when their fingerprints match (:func:`adopt`). Returns per
    training ``{"fingerprint", "monolith_fingerprint", "monolith", "experts"}``."""
    plans, pending = [], []
    donors = donors or [[] for _ in cfgs]
    for cfg, root, given in zip(cfgs, roots, donors):
        fp, mono_fp = expert_fingerprint(cfg, data_id), monolith_fingerprint(cfg, data_id)
        todo = [("monolith", None, "fm", root / "monolith", mono_fp, ())]
        # equal_steps experts trained before the key followed the experts' own section carry the monolith's key,
        # the monolith at the experts' rate (a monolith at a rate of its own is another training)
        at_experts_rate = dataclasses.replace(cfg, reproduce=dataclasses.replace(cfg.reproduce, monolith_lr=0.0))
        legacy = {monolith_fingerprint(at_experts_rate, data_id)} - {fp}
        todo += [(f"cluster-{k}-{o}", k, o, root / "experts" / f"cluster-{k}-{o}", fp, legacy) for k, o in unique]
        adopted = {}
        for name, k, obj, folder, key, legacy in todo:
            where = [d if k is None else d / "experts" for d in given]
            if (source := adopt(folder, key, where, _expert_fingerprint_in)) is not None:
                adopted[name] = str(source)
            try:
                train_or_reuse(folder, key, None, also=legacy)
            except NotTrained:
                c = cfg if k is None else budget_expert_config(cfg)  # the monolith applies the budget itself
                pending.append((c.to_dict(), str(dataset.root), k, obj, str(folder), key, jobs > 1, progress))
        plans.append((fp, mono_fp, todo, adopted))
    run_jobs(train_job, pending, jobs, progress, "training")
    trained = {a[4] for a in pending}
    out = []
    for fp, mono_fp, todo, adopted in plans:
        entry: dict[str, Any] = {"fingerprint": fp, "monolith_fingerprint": mono_fp, "experts": {}}
        for name, k, _, folder, key, legacy in todo:
            info = train_or_reuse(folder, key, None, also=legacy) | {"reused": str(folder) not in trained}
            if name in adopted:
                info["reused_from"] = adopted[name]
            if k is None:
                entry["monolith"] = info
            else:
                entry["experts"][name] = info
        out.append(entry)
    return out


def train_or_reuse_router(
    cfg: Config, root: Path, dataset: Dataset, data_id: dict, progress: bool, donors: list[Path] = ()
) -> dict:
    """The training's router (it depends only on the clusters) in ``root/router``, reused when its fingerprint
    matches, or copied from one of ``donors`` (other outputs' folders of this training) whose router's does."""
    fp = fingerprint_of(cfg.router, data_id)
    router_meta = root / ROUTER / ROUTER_META
    source = adopt(root / ROUTER, fp, list(donors), _router_fingerprint_in)
    if not router_meta.exists() or _router_fingerprint_in(root / ROUTER) != fp:
        fit_router(cfg, dataset, root, progress=progress)
        router_meta.write_text(
            json.dumps(json.loads(router_meta.read_text()) | {"reproduce_fingerprint": fp}, indent=2)
        )
    info = {"fingerprint": fp, "tensor_sha256": tensor_sha256(root / ROUTER / WEIGHTS)}
    return info | ({"reused_from": str(source)} if source is not None else {})


def _router_fingerprint_in(folder: Path) -> str | None:
    return json.loads((folder / ROUTER_META).read_text()).get("reproduce_fingerprint")
