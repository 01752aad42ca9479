"""``hddm reproduce``: the paper's two comparison tables, at whatever scale the config sets, with one command.

1. Experts for 8FM, 2DDPM:6FM and 4DDPM:4FM. An expert is fixed by (cluster, objective) and the training config
   (seeded by expert id), so it is identical across configurations: each unique (cluster, objective) is trained
   once into ``OUT/experts/cluster-K-OBJ`` and reused (also by a second run with the same config). DDPM goes to
   the most detailed clusters (``auto``), so 2DDPM's clusters are among 4DDPM's: 8 FM + 4 DDPM experts in all.
2. One router (it depends only on the clusters) and one monolith of equal training compute: an FM expert of the
   same size trained on all clusters for K × the expert steps at the same batch size.
3. Each configuration is assembled in ``OUT/runs/NAME`` (links to the shared experts and router) and evaluated
   under aligned inference (same prompts, noise, sampler, steps, CFG) for every routing mode; the monolith too.
   With ``evaluation.training_seeds`` = N > 1 all of 1–2 is repeated for trainings 1 … N−1 with seeds moved
   (:func:`~hddm_flower.training_seeds.training_config`) in ``OUT/trainings/training-i`` (each cached by its
   fingerprint), and every row is evaluated for each training on the same sampling seeds (gmm data:
   :mod:`hddm_flower.gmm.compare`; otherwise ``OUT/trainings/training-i/runs/NAME``, one feature network and
   reference for all): intervals over trainings (outer) with the one over sampling seeds within a training (inner).
   With ``evaluation.prompt_sampling: stratified`` the prompts are the same number per cluster, the reference has
   their mix, and a real-vs-real floor row (real images at the samples' count) is scored beside the others.
4. ``OUT/tables.md`` puts the results beside the paper's numbers (KID first, FID, adherence and diversity per row;
   paired differences by training and seed in Table 3); ``OUT/manifest.json`` records configs, versions, seeds,
   the feature network's fingerprints and sha256 of every artefact so that a second run can be compared.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import os
import resource
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import yaml
from torch import Tensor, nn

from .budget import budget_of
from .budget import describe as describe_budget
from .budget import expert_config as budget_expert_config
from .checkpoints import META, ROUTER_META, WEIGHTS, load_expert, read_expert_meta, save_expert, sha256_file
from .config.io import config_from_dict
from .config.rules import ConfigError
from .config.schema import Config
from .data import Dataset, StreamingAllClusters
from .data.layout import META as DATASET_META
from .devices import resolve_device, resolve_precision
from .ensemble import Ensemble
from .evaluation.evaluate import evaluate_run, feature_network
from .gmm.truth import interval
from .provenance import now, versions
from .rundir import CONFIG, FEATURE_NET, ROUTER, expert_dir, experts_dir, write_atomic
from .stages.assemble import evaluate_and_report, load_ensemble
from .stages.expert import build_expert, train_one_expert
from .stages.router import fit_router
from .training import train_expert
from .training_seeds import TRAINING_SEED_STRIDE, nested_interval, training_config

log = logging.getLogger(__name__)


def default_configs(k: int, ddpm_counts: list[int] | None = None) -> dict[str, int]:
    """Name → number of DDPM experts for each count of ``ddpm_counts`` (``reproduce.ddpm_counts``; by default 0, 2
    and K/2: 8FM, 2DDPM:6FM, 4DDPM:4FM at K = 8)."""
    counts = ddpm_counts or [0] + [n for n in dict.fromkeys((2, k // 2)) if 0 < n < k]
    return {_mix_name(k, n): n for n in counts}


def _mix_name(k: int, n: int) -> str:
    """``8FM``, ``2DDPM:6FM`` or ``8DDPM`` for ``n`` DDPM experts out of ``k``."""
    return f"{k}FM" if n == 0 else f"{k}DDPM" if n == k else f"{n}DDPM:{k - n}FM"


# The paper's numbers (arXiv 2603.06741): HDDM table 1 (DiT-XL/2 experts, LAION-Aesthetics 11M, top-2, CFG 7.5,
# 50 steps, FID-50K; LPIPS mean ± std), HDDM table 2 (DiT-B/2 experts, LAION-Art 3.9M, FID-50K) and DDM's
# ImageNet table 1 (8 experts, FID).
PAPER_HETERO = {"8FM": (12.45, "0.617 ± 0.074"), "2DDPM:6FM": (11.88, "0.631 ± 0.078")}
PAPER_ROUTING = {
    "monolith": (29.64, 12.81),
    "top1": (30.60, 9.84),
    "top2": (22.60, 10.31),
    "full": (47.89, 10.52),
    "threshold": (None, 10.46),
    "oracle": (None, 10.46),
}


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


def _fingerprint(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def config_for(cfg: Config, num_ddpm: int) -> Config:
    """``cfg`` with ``num_ddpm`` DDPM experts on the most detailed clusters and FM elsewhere."""
    d = copy.deepcopy(cfg.to_dict())
    d["objectives"] = {"ddpm": num_ddpm, "fm": cfg.num_experts - num_ddpm, "ddpm_clusters": "auto", "per_expert": None}
    return config_from_dict(d, "reproduce")


class _OneExpertRouter(nn.Module):
    """The monolith's "router": a single expert always gets weight 1."""

    def __init__(self, in_channels: int, sample_size: int):
        super().__init__()
        self.config = SimpleNamespace(in_channels=in_channels, sample_size=sample_size)

    def forward(self, x_t: Tensor, t: Tensor) -> Tensor:
        return torch.zeros(x_t.shape[0], 1, dtype=x_t.dtype, device=x_t.device)


class _Missing(Exception):
    pass


def _run_jobs(fn, args: list[tuple], jobs: int, progress: bool, what: str) -> list:
    """``[fn(a) for a in args]``, in ``jobs`` spawned processes when ``jobs`` > 1 (results in order)."""
    if jobs <= 1 or len(args) <= 1:
        return [fn(a) for a in args]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from tqdm.auto import tqdm

    with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
        futures = [pool.submit(fn, a) for a in args]
        for f in tqdm(
            as_completed(futures),
            total=len(futures),
            disable=not progress,
            desc=f"{what}: {len(args)} jobs in {jobs} processes",
        ):
            f.result()
        return [f.result() for f in futures]


def _eval_job(a: tuple) -> tuple[str, dict]:
    """Evaluate one configuration (its run directory) or, with ``objectives`` None, the monolith."""
    cfg_dict, name, run_dir, dataset_root, feature_dir, objectives, in_worker, progress = a
    if in_worker:
        torch.set_num_threads(1)
    progress = progress and not in_worker
    cfg, run_dir = config_from_dict(cfg_dict, "reproduce"), Path(run_dir)
    dataset = Dataset.open(dataset_root)  # a worker process: the dataset opened here
    if objectives is None:
        meta = dataset.meta
        mono, _ = load_expert(run_dir.parent.parent / "monolith", **cfg.sampling.conversion_options())
        dev = resolve_device(cfg.coordinator.device)
        ens = Ensemble(
            {0: mono},
            _OneExpertRouter(meta["channels"], meta["image_size"]),
            1,
            routing="top_k",
            k=1,
            mixed_precision=resolve_precision(cfg.coordinator.mixed_precision, dev),
        ).to(dev)
        run_dir.mkdir(parents=True, exist_ok=True)
        result = evaluate_run(
            cfg,
            ens,
            dataset,
            run_dir,
            feature_dir=Path(feature_dir),
            modes=["top1"],
            per_expert=False,
            progress=progress,
        )
        return name, _more_seeds(cfg, result, ens, dataset, run_dir, Path(feature_dir), progress)
    report = evaluate_and_report(
        cfg,
        run_dir,
        dataset,
        [],
        feature_dir=Path(feature_dir),
        progress=progress,
        extra={"reproduce": {"config": name, "objectives": objectives}},
    )
    result = report["metrics"]["evaluation"]
    result["router_top1_accuracy"] = dict(
        zip(map(str, report["metrics"]["times"]), report["metrics"]["router_top1_accuracy"])
    )
    ens = load_ensemble(cfg, run_dir)[0] if cfg.evaluation.seeds > 1 else None
    return name, _more_seeds(cfg, result, ens, dataset, run_dir, Path(feature_dir), progress)


SEED_METRICS = ("kid", "fid", "adherence", "diversity")
"""The per-seed values of every row (KID first: at a few hundred samples it is unbiased, FID is not)."""


def _more_seeds(
    cfg: Config,
    result: dict,
    ens: Ensemble | None,
    dataset: Dataset,
    run_dir: Path,
    feature_dir: Path,
    progress: bool,
) -> dict:
    """Evaluate the same modes again with seeds ``evaluation.seed + 1 …`` (other prompts and noise; the same
    feature network and reference statistics) into ``run_dir/seeds/``, and add ``per_seed`` values and their
    Student-t ``intervals`` to ``result`` (and ``floor_per_seed`` when the evaluation has a floor). The seeds are
    the same for every configuration: inference stays aligned. ``ens`` may be None with one seed."""
    ev = cfg.evaluation
    runs = [result]
    for i in range(1, ev.seeds):
        seed = ev.seed + i
        runs.append(
            evaluate_run(
                cfg,
                ens,
                dataset,
                run_dir / "seeds" / f"seed-{seed}",
                feature_dir=feature_dir,
                modes=list(result["modes"]),
                per_expert=False,
                seed=seed,
                progress=progress,
            )
        )
    result["per_seed"] = {
        mode: [{"seed": r["protocol"]["seed"]} | _seed_values(r["modes"][mode]) for r in runs]
        for mode in result["modes"]
    }
    result["intervals"] = {mode: _intervals(values) for mode, values in result["per_seed"].items()}
    if "floor" in result:
        result["floor_per_seed"] = [{"seed": r["protocol"]["seed"]} | _seed_values(r["floor"]) for r in runs]
    return result


def _seed_values(x: dict) -> dict:
    """A row's per-seed values (:data:`SEED_METRICS`); the floor's images have no adherence and no diversity."""
    return {
        "kid": x["kid"],
        "fid": x["fid"],
        "adherence": x.get("adherence"),
        "diversity": x["lpips"]["mean"] if "lpips" in x else None,
    }


def _intervals(values: list[dict]) -> dict:
    """Per metric of :data:`SEED_METRICS` that every seed has, the Student-t interval over the seeds."""
    return {m: interval([v[m] for v in values]) for m in SEED_METRICS if None not in [v.get(m) for v in values]}


def training_state(folder: Path, fingerprint: str) -> Path:
    """The training-state file of the expert or monolith trained into ``folder`` (saved every
    ``expert.checkpoint_every`` steps, resumed from by a later ``hddm reproduce`` with the same ``--out``, removed
    once ``folder`` is written): beside ``folder``, named by the training's fingerprint, so that a training of
    another config never resumes from it."""
    return folder.with_name(f".{folder.name}.{fingerprint}.train-state.pt")


def _train_job(a: tuple) -> None:
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
    _train_or_reuse(Path(folder), fingerprint, fn, dtype=cfg.expert.weights_dtype)
    state.unlink(missing_ok=True)


def _train_or_reuse(folder: Path, fingerprint: str, train, *, dtype: str | None = None) -> dict:
    """Reuse ``folder`` if it was trained with the same fingerprint; refuse if with another; else train (with
    ``train=None``: raise :class:`_Missing`)."""
    if (folder / META).exists():
        meta = read_expert_meta(folder)
        if meta.get("reproduce_fingerprint") != fingerprint:
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
        raise _Missing(folder)
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
    gradient accumulation, precision, optimiser) for the steps and batch of ``reproduce.budget``
    (:mod:`hddm_flower.budget`: K × ``expert.steps`` at the experts' batch under equal_images, ``expert.steps``
    at ``expert.batch_size`` under equal_steps): as many images seen as all K experts together. With
    ``data.stream`` the training split is streamed from the shards
    (:class:`~hddm_flower.data.streams.StreamingAllClusters`, seeded), not loaded. ``checkpoint``: the training-state
    file saved every ``expert.checkpoint_every`` steps and resumed from, as an expert's
    (:func:`~hddm_flower.stages.expert.train_one_expert`)."""
    budget = budget_of(cfg)
    e = dataclasses.replace(cfg.expert, batch_size=budget.monolith_batch)
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


def expert_fingerprint(cfg: Config, data_id: dict) -> str:
    """The training cache key of a training's experts and monolith: the expert and DDPM sections, the dataset,
    and the budget protocol where it is not the default (so that equal_images caches stay valid)."""
    protocol = cfg.reproduce.budget
    return _fingerprint(cfg.expert, cfg.ddpm, data_id, *([protocol] if protocol != "equal_images" else []))


def _train_experts(
    cfgs: list[Config],
    roots: list[Path],
    dataset: Dataset,
    unique: list[tuple[int, str]],
    data_id: dict,
    jobs: int,
    progress: bool,
) -> list[dict]:
    """Every training's unique (cluster, objective) experts and its monolith, reused when their fingerprint (the
    training's expert config, seeds included, and the dataset) matches, else trained, all pending jobs of all
    trainings in one pool of ``jobs`` processes. Returns per training ``{"fingerprint", "monolith", "experts"}``."""
    plans, pending = [], []
    for cfg, root in zip(cfgs, roots):
        fp = expert_fingerprint(cfg, data_id)
        todo = [("monolith", None, "fm", root / "monolith")]
        todo += [(f"cluster-{k}-{o}", k, o, root / "experts" / f"cluster-{k}-{o}") for k, o in unique]
        for _, k, obj, folder in todo:
            try:
                _train_or_reuse(folder, fp, None)
            except _Missing:
                c = cfg if k is None else budget_expert_config(cfg)  # the monolith applies the budget itself
                pending.append((c.to_dict(), str(dataset.root), k, obj, str(folder), fp, jobs > 1, progress))
        plans.append((fp, todo))
    _run_jobs(_train_job, pending, jobs, progress, "training")
    trained = {a[4] for a in pending}
    out = []
    for fp, todo in plans:
        entry: dict[str, Any] = {"fingerprint": fp, "experts": {}}
        for name, k, _, folder in todo:
            info = _train_or_reuse(folder, fp, None) | {"reused": str(folder) not in trained}
            if k is None:
                entry["monolith"] = info
            else:
                entry["experts"][name] = info
        out.append(entry)
    return out


def _train_router(cfg: Config, root: Path, dataset: Dataset, data_id: dict, progress: bool) -> dict:
    """The training's router (it depends only on the clusters) in ``root/router``, reused when its fingerprint
    matches."""
    fp = _fingerprint(cfg.router, data_id)
    router_meta = root / ROUTER / ROUTER_META
    if not router_meta.exists() or json.loads(router_meta.read_text()).get("reproduce_fingerprint") != fp:
        fit_router(cfg, dataset, root, progress=progress)
        router_meta.write_text(
            json.dumps(json.loads(router_meta.read_text()) | {"reproduce_fingerprint": fp}, indent=2)
        )
    return {"fingerprint": fp, "tensor_sha256": tensor_sha256(root / ROUTER / WEIGHTS)}


def _config_eval_args(
    c: Config, name: str, objectives: list[str], root: Path, dataset: Dataset, feature_dir: Path
) -> tuple:
    """Assemble configuration ``name`` of the training kept in ``root`` in ``root/runs/NAME`` (links to that
    training's experts and router, its config written) and return the start of its evaluation job's arguments."""
    run_dir = root / "runs" / name.replace(":", "-")
    experts_dir(run_dir).mkdir(parents=True, exist_ok=True)
    for k, obj in enumerate(objectives):
        _symlink(expert_dir(run_dir, k), root / "experts" / f"cluster-{k}-{obj}")
    _symlink(run_dir / ROUTER, root / ROUTER)
    (run_dir / CONFIG).write_text(f"# hddm reproduce: {name}\n" + yaml.safe_dump(c.to_dict(), sort_keys=False))
    return c.to_dict(), name, str(run_dir), str(dataset.root), str(feature_dir), objectives


FLOOR = "real (floor)"
"""The results' row of the real-vs-real floor (``evaluation.prompt_sampling: stratified``)."""


def _with_trainings(done: dict[tuple[int, str], dict], trainings: int, names: list[str]) -> dict[str, dict]:
    """Each row's result (training 0's, as with one training) and, with several trainings, ``per_training`` (per
    mode, ``[training][seed]`` values) and ``nested`` (per mode and metric,
    :func:`~hddm_flower.training_seeds.nested_interval`: over trainings, outer; sampling seeds, inner). The floor,
    when the evaluation has one, becomes its own row (it does not depend on a training: its interval is over the
    sampling seeds)."""
    results = {n: done[0, n] for n in names}
    if trainings > 1:
        for n, r in results.items():
            r["per_training"] = {m: [done[i, n]["per_seed"][m] for i in range(trainings)] for m in r["per_seed"]}
            r["nested"] = {
                m: {
                    k: nested_interval([[v[k] for v in seeds] for seeds in per])
                    for k in SEED_METRICS
                    if all(v[k] is not None for seeds in per for v in seeds)
                }
                for m, per in r["per_training"].items()
            }
    mono = results["monolith"]
    if "floor_per_seed" in mono:
        results[FLOOR] = {
            k: mono[k] for k in ("feature_network", "feature_fingerprint", "diversity_distance", "protocol")
        } | {
            "modes": {"real": mono["floor"]},
            "per_seed": {"real": mono["floor_per_seed"]},
            "intervals": {"real": _intervals(mono["floor_per_seed"])},
        }
    return results


def reproduce(
    cfg: Config,
    out: Path,
    dataset: Dataset,
    *,
    configs: dict[str, int] | None = None,
    jobs: int = 1,
    command: str = "",
    progress: bool = False,
) -> dict:
    """Train or reuse everything, evaluate every configuration and the monolith, write tables and manifest.

    ``jobs`` > 1 trains the experts and the monolith, then evaluates the configurations and the monolith, in that
    many processes (one torch thread each)."""
    start, load_start = time.perf_counter(), os.getloadavg()
    configs = configs or default_configs(cfg.num_experts, cfg.reproduce.ddpm_counts)
    out.mkdir(parents=True, exist_ok=True)
    meta = dataset.meta
    details = [c["detail"] for c in meta["clusters"]]
    plans = {name: config_for(cfg, n) for name, n in configs.items()}
    objectives = {name: c.objective_of(details) for name, c in plans.items()}
    data_id = dataset_id(dataset)
    truth = meta.get("name") == "gmm"
    trainings = cfg.evaluation.training_seeds
    tcfgs = [training_config(cfg, i) for i in range(trainings)]
    roots = [training_root(out, i) for i in range(trainings)]
    timings: dict[str, float] = {}

    # 1–2. per training: the unique (cluster, objective) experts, the monolith and the router, reused or trained
    t0 = time.perf_counter()
    unique = sorted({(k, o) for objs in objectives.values() for k, o in enumerate(objs)})
    per_training = _train_experts(tcfgs, roots, dataset, unique, data_id, jobs, progress)
    timings["training"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for c, root, artefacts_i in zip(tcfgs, roots, per_training):
        artefacts_i["router"] = _train_router(c, root, dataset, data_id, progress)
    timings["router"] = time.perf_counter() - t0
    artefacts: dict[str, Any] = per_training[0] | (
        {"trainings": [{"root": str(r.relative_to(out))} | a for r, a in zip(roots, per_training)]}
        if trainings > 1
        else {}
    )

    # 3. evaluation: on a gmm dataset every row against the true density; otherwise the feature network once,
    #    then each configuration and the monolith
    t0 = time.perf_counter()
    if truth:
        from .gmm.evaluate import evaluate_truth

        results = evaluate_truth(
            cfg,
            roots,
            dataset,
            objectives,
            in_worker=jobs > 1,
            run_jobs=lambda fn, args: _run_jobs(fn, args, jobs, progress, "truth evaluation"),
        )
    else:
        feature_dir = out / FEATURE_NET
        fx, _, _ = feature_network(cfg, dataset, feature_dir, decode=dataset.decoder(cfg), progress=progress)
        artefacts["feature_net"] = {
            "name": fx.name,
            "state_fingerprint": fx.fingerprint,
            "tensor_sha256": tensor_sha256(feature_dir / WEIGHTS),
        }
        keys, eval_args = [], []
        for i, (c_i, root) in enumerate(zip(tcfgs, roots)):
            for name, n in configs.items():
                keys.append((i, name))
                eval_args.append(
                    _config_eval_args(config_for(c_i, n), name, objectives[name], root, dataset, feature_dir)
                )
            keys.append((i, "monolith"))
            eval_args.append(
                (c_i.to_dict(), "monolith", str(root / "runs" / "monolith"), str(dataset.root), str(feature_dir), None)
            )
        eval_args = [a + (jobs > 1, progress) for a in eval_args]
        done = dict(zip(keys, (r for _, r in _run_jobs(_eval_job, eval_args, jobs, progress, "evaluating"))))
        results = _with_trainings(done, trainings, [*configs, "monolith"])
    timings["evaluation"] = time.perf_counter() - t0
    seconds = time.perf_counter() - start

    manifest = {
        "created_at": now(),
        "command": command or "hddm " + " ".join(sys.argv[1:]),
        "seconds": round(seconds, 1),
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "torch_threads": torch.get_num_threads(),
        "training_processes": jobs,
        "device": str(resolve_device(cfg.coordinator.device)),
        "mixed_precision": resolve_precision(cfg.coordinator.mixed_precision, resolve_device(cfg.coordinator.device)),
        "cpu_seconds": round(
            sum(resource.getrusage(resource.RUSAGE_SELF)[:2]) + sum(resource.getrusage(resource.RUSAGE_CHILDREN)[:2]), 1
        ),  # user + system
        "load_average": {"start": [round(x, 2) for x in load_start], "end": [round(x, 2) for x in os.getloadavg()]},
        "config": cfg.to_dict(),
        "configurations": {n: {"ddpm": configs[n], "objectives": objectives[n]} for n in plans},
        "seeds": {
            "data": cfg.data.seed,
            "experts": f"expert.seed + expert id ({cfg.expert.seed} + k)",
            "monolith": cfg.expert.seed + 1000,
            "router": cfg.router.seed,
            "evaluation": cfg.evaluation.seed,
            "sampling": cfg.sampling.seed,
            "trainings": trainings,
            "training_stride": f"training i moves the expert, monolith and router seeds by i × {TRAINING_SEED_STRIDE}",
        },
        "fingerprints": {"experts": artefacts["fingerprint"], "router": artefacts["router"]["fingerprint"]}
        | ({} if truth else {"feature_net": artefacts["feature_net"]["state_fingerprint"]}),
        "dataset": data_id,
        "budget": dataclasses.asdict(budget_of(cfg)),
        "artefacts": artefacts,
        "versions": versions(),
        "results": results if truth else {n: _summary(r) for n, r in results.items()},
    }
    if truth:
        from .gmm.compare import paired_truth

        manifest["paired"] = paired_truth(results)
    else:
        manifest["paired"] = paired_differences(results)
    write_atomic(out / "manifest.json", json.dumps(manifest, indent=2))
    if truth:
        from .gmm.evaluate import render_truth_tables

        write_atomic(out / "tables.md", render_truth_tables(manifest, results))
    else:
        write_atomic(out / "tables.md", render_tables(manifest, results))
    return manifest


def _symlink(link: Path, target: Path) -> None:
    """A relative symbolic link ``link`` → ``target`` (replacing an old link)."""
    if link.is_symlink():
        link.unlink()
    elif link.exists():
        raise FileExistsError(f"{link} exists and is not a link; use a new --out")
    link.symlink_to(os.path.relpath(target, link.parent))


def _summary(r: dict) -> dict:
    """A row's entry in the manifest: per mode its values (training 0, seed 0), per-seed values and intervals, and
    with several trainings the per-training values and the nested intervals."""
    out = {}
    for mode, x in r["modes"].items():
        entry = {k: x[k] for k in ("kid", "kid_std", "fid")} | {"adherence": x.get("adherence")}
        if "lpips" in x:
            entry |= {"diversity": x["lpips"]["mean"], "diversity_std": x["lpips"]["std"]}
        for key in ("per_seed", "intervals", "per_training", "nested"):
            if key in r:
                entry[key] = r[key][mode]
        out[mode] = entry
    return out


SHOWN = (("kid", ".4f"), ("fid", ".2f"), ("adherence", ".3f"), ("diversity", ".3f"))
"""The tables' metrics in their order (KID first) and formats."""


def _cells(r: dict, mode: str) -> list[str]:
    """KID, FID, adherence and diversity of one row's ``mode``: over trainings (``mean ± half [inner half]``) when
    there are several, else the mean over seeds ± its 95 % half-width when there are several seeds, else the one
    seed's value (KID ± its spread over subsets, diversity ± its spread over prompts). "–" where a row has none."""
    if "nested" in r or ("intervals" in r and r["intervals"][mode].get("kid", {}).get("n", 1) > 1):
        iv = r["nested"][mode] if "nested" in r else r["intervals"][mode]

        def cell(m: str, spec: str) -> str:
            if m not in iv:
                return "–"
            inner = f" [{iv[m]['inner_half']:{spec}}]" if "inner_half" in iv[m] else ""
            return f"{iv[m]['mean']:{spec}} ± {iv[m]['half']:{spec}}{inner}"

        return [cell(m, spec) for m, spec in SHOWN]
    x = r["modes"][mode]
    kid = "–" if x["kid"] is None else f"{x['kid']:.4f} ± {x['kid_std']:.4f}"
    div = f"{x['lpips']['mean']:.3f} ± {x['lpips']['std']:.3f}" if "lpips" in x else "–"
    return [kid, f"{x['fid']:.2f}", _f(x.get("adherence"), ".3f"), div]


def _f(x: float | None, spec: str = ".2f") -> str:
    return "–" if x is None else format(x, spec)


PAIRED_METRICS = ("kid", "fid", "adherence")


def _layout(r: dict, mode: str, metric: str, trainings: int) -> list[list[float]]:
    """``values[i][j]`` of a row's metric for training i and sampling seed j; a row that does not depend on a
    training (the floor) has the same values in every training."""
    per = r["per_training"][mode] if "per_training" in r else [r["per_seed"][mode]] * trainings
    return [[v[metric] for v in seeds] for seeds in per]


def paired_differences(results: dict) -> list[dict]:
    """The paper's comparisons as differences paired by training and seed (every row of a seed shares its prompts,
    noise and reference, and every row of training i that training's experts, router and monolith, so what moves
    every row of a seed together cancels): per configuration, top-2 − each other mode and top-2 − the monolith;
    across configurations, each pair at top-2; with a floor row, top-2 and the monolith − the floor. Each entry:
    ``what``, ``a``, ``b`` and per metric of :data:`PAIRED_METRICS` that both rows have
    :func:`~hddm_flower.gmm.compare.paired_summary` (over trainings with the inner half-width when there are
    several, else over the sampling seeds of the one training; ``covers`` says which; ``resolved`` = the interval
    excludes 0). Empty with one training and one seed."""
    from .gmm.compare import paired_summary

    trainings = max(
        (len(next(iter(r["per_training"].values()))) for r in results.values() if "per_training" in r), default=1
    )
    if any("per_seed" not in r for r in results.values()):
        return []
    seeds = min(len(v) for r in results.values() for v in r["per_seed"].values())
    if trainings == 1 and seeds < 2:
        return []
    names = [n for n in results if n not in ("monolith", FLOOR) and "top2" in results[n]["per_seed"]]
    pairs = [((n, "top2"), (n, m)) for n in names for m in results[n]["per_seed"] if m != "top2"]
    pairs += [((n, "top2"), ("monolith", "top1")) for n in names if "monolith" in results]
    pairs += [((b, "top2"), (a, "top2")) for i, a in enumerate(names) for b in names[i + 1 :]]
    if FLOOR in results:
        pairs += [((n, "top2"), (FLOOR, "real")) for n in names]
        pairs += [(("monolith", "top1"), (FLOOR, "real"))] if "monolith" in results else []
    out = []
    for (na, ma), (nb, mb) in pairs:
        if na == nb:
            what = f"{na}: {ma} − {mb}"
        elif nb == FLOOR:
            what = f"{na if na == 'monolith' else na + ': ' + ma} − {FLOOR}"
        elif nb == "monolith":
            what = f"{na}: {ma} − monolith"
        else:
            what = f"{ma}: {na} − {nb}"
        entry: dict[str, Any] = {"what": what, "a": [na, ma], "b": [nb, mb]}
        ra, rb = results[na], results[nb]
        for m in PAIRED_METRICS:
            if all(v.get(m) is not None for r, mode in ((ra, ma), (rb, mb)) for v in r["per_seed"][mode]):
                entry[m] = paired_summary(_layout(ra, ma, m, trainings), _layout(rb, mb, m, trainings))
        out.append(entry)
    return out


def _covers(trainings: int, seeds: int) -> str:
    """What a cell's ± covers."""
    if trainings > 1:
        return (
            f"Trainings: {trainings} (`evaluation.training_seeds`: experts, router and monolith retrained with moved "
            f"seeds) × Seeds: {seeds} (`evaluation.seed` + 0 … {seeds - 1}: other prompts and noise, the same feature "
            "network and reference statistics); each cell is the mean over trainings ± the half-width of the 95 % "
            "Student-t interval over trainings of the per-training means over seeds [the mean half-width over seeds "
            "within one training]. The floor does not depend on a training: its ± is over the seeds."
        )
    if seeds > 1:
        return (
            f"Seeds: {seeds} (`evaluation.seed` + 0 … {seeds - 1}: other prompts and noise, the same feature network "
            "and reference statistics); each cell is the mean over seeds ± the half-width of its 95 % Student-t "
            "interval, over sampling seeds of **one** training: it says nothing about another training of the same "
            "config (`evaluation.training_seeds` > 1 for that)."
        )
    return (
        "One seed: KID ± its standard deviation over subsets, diversity ± its standard deviation over prompts; "
        "nothing here is an interval across seeds or trainings."
    )


def _feature_line(manifest: dict, r: dict) -> str:
    """The feature network of every FID/KID, KID and adherence value, with its fingerprints."""
    fn = manifest["artefacts"]["feature_net"]
    return (
        f"FID/KID features and adherence classifier: **{r['feature_network']}**, weights state fingerprint "
        f"`{fn['state_fingerprint']}`, tensor sha256 `{fn['tensor_sha256']}`; reference statistics cache key "
        f"`{r.get('reference_key', '–')}`. Diversity: {r['diversity_distance']}."
    )


def _floor_line(results: dict) -> list[str]:
    if FLOOR not in results:
        return [
            "No real-vs-real floor (`evaluation.prompt_sampling: random`): the prompts' cluster mix changes with the "
            "seed and the reference is every image."
        ]
    f = results[FLOOR]["modes"]["real"]
    return [
        f"Prompts: `evaluation.prompt_sampling: stratified`, {results[FLOOR]['protocol']['prompt_source']}; every "
        "row of a seed is scored against one reference of the same cluster mix. "
        f"**{FLOOR}**: {f['num_samples']} real images ({f['per_cluster']} per cluster, the samples' count), drawn "
        "per seed out of that reference and scored against it with the same features: what a sampler that drew "
        "real images would score at this count (the yardstick of the KID/FID values above it)."
    ]


def render_tables(manifest: dict, results: dict) -> str:
    """The two tables (markdown), each beside the paper's numbers, and the paired differences (Table 3), with how
    they were produced: KID first (unbiased at these sample counts; FID is biased upwards by ~1/N), FID beside it,
    adherence (the feature classifier puts a sample in its prompt's cluster) and diversity per row, the real-vs-real
    floor when the prompts are stratified."""
    cfg = manifest["config"]
    anyr = results["monolith"]
    p = anyr["protocol"]
    names = [n for n in results if n not in ("monolith", FLOOR)]
    seeds = len(next(iter(anyr["per_seed"].values()))) if "per_seed" in anyr else 1
    trainings = manifest["seeds"]["trainings"]
    floor = FLOOR in results
    lines = [
        f"Produced by `{manifest['command'] or 'hddm reproduce'}` on {manifest['created_at']} in "
        f"{manifest['seconds'] / 60:.1f} min wall, {manifest['cpu_seconds'] / 60:.1f} min CPU ({manifest['device']}, "
        f"{manifest['torch_threads']} torch threads, load average {manifest['load_average']['start'][0]} at the "
        f"start, {manifest['load_average']['end'][0]} at the end; training {manifest['timings_s']['training']:.0f} "
        f"s in {manifest['training_processes']} process(es), router {manifest['timings_s']['router']:.0f} s, "
        f"evaluation {manifest['timings_s']['evaluation']:.0f} s).",
        f"Scale: {cfg['num_experts']} experts `{cfg['expert']['preset']}` on {manifest['dataset']['dataset']}; "
        f"monolith: the same network on all clusters; {describe_budget(manifest['budget'])}. Router "
        f"`{cfg['router']['preset']}` × {cfg['router']['steps']} steps.",
        f"Aligned inference: {p['prompts']} prompts × {p['samples_per_prompt']} samples, the same noise for every "
        f"row, {p['sampler']}, {p['num_steps']} steps, CFG {p['cfg_scale']}, threshold {p['threshold']}; "
        f"reference: {p['reference']}.",
        *_floor_line(results),
        _feature_line(manifest, anyr),
        _covers(trainings, seeds),
        "",
        "**Table 1 — heterogeneous vs homogeneous (top-2 routing).** KID is the primary metric at these counts.",
        "",
        "| configuration | KID ↓ | FID ↓ | adherence ↑ | intra-prompt diversity ↑ | paper FID-50K "
        "| paper intra-prompt LPIPS |",
        "|---|---|---|---|---|---|---|",
    ]
    for n in names:
        if "top2" not in results[n]["modes"]:
            continue
        paper = PAPER_HETERO.get(n, (None, "–"))
        lines.append(f"| {n} | " + " | ".join(_cells(results[n], "top2")) + f" | {_f(paper[0])} | {paper[1]} |")
    lines.append("| monolith (equal compute) | " + " | ".join(_cells(results["monolith"], "top1")) + " | – | – |")
    if floor:
        lines.append(f"| {FLOOR} | " + " | ".join(_cells(results[FLOOR], "real")) + " | – | – |")
    lines += [
        "",
        "**Table 2 — routing vs a monolith of equal compute (KID ↓; FID in brackets; adherence ↑ after the slash).**",
        "",
        "| inference | " + " | ".join(names) + " | paper HDDM (DiT-B/2, FID-50K) | paper DDM (ImageNet, FID) |",
        "|---" * (len(names) + 3) + "|",
    ]

    def kfa(r: dict, mode: str) -> str:
        if mode not in r["modes"]:
            return "–"
        kid, fid, adh, _ = _cells(r, mode)
        return f"{kid} ({fid}) / {adh}"

    paper = PAPER_ROUTING["monolith"]
    mono_cell = kfa(results["monolith"], "top1")
    lines.append("| monolith | " + " | ".join(mono_cell for _ in names) + f" | {_f(paper[0])} | {_f(paper[1])} |")
    for mode in results[names[0]]["modes"]:
        paper = PAPER_ROUTING.get(mode, (None, None))
        cells = [kfa(results[n], mode) for n in names]
        lines.append(f"| {mode} | " + " | ".join(cells) + f" | {_f(paper[0])} | {_f(paper[1])} |")
    if floor:
        floor_cell = kfa(results[FLOOR], "real")
        lines.append(f"| {FLOOR} | " + " | ".join(floor_cell for _ in names) + " | – | – |")
    paired = paired_differences(results)
    if paired:
        covers = next(iter(e[m]["covers"] for e in paired for m in PAIRED_METRICS if m in e))
        lines += [
            "",
            f"**Table 3 — paired differences (row a − row b by training and seed; every row of a seed shares its "
            f"prompts, noise and reference).** Each cell: mean ± 95 % half-width over {covers}"
            + (" [the mean half-width over seeds within one training]" if trainings > 1 else "")
            + "; resolved = the interval excludes 0. KID first.",
            "",
            "| comparison | KID difference | FID difference | adherence difference | resolved |",
            "|---|---|---|---|---|",
        ]

        def cell(iv: dict | None, spec: str) -> str:
            if iv is None:
                return "–"
            inner = f" [{iv['inner_half']:{spec}}]" if "inner_half" in iv else ""
            return f"{iv['mean']:+{spec}} ± {iv['half']:{spec}}{inner}"

        for e in paired:
            res = [m.upper() if m != "adherence" else m for m in PAIRED_METRICS if e.get(m) and e[m]["resolved"]]
            lines.append(
                f"| {e['what']} | {cell(e.get('kid'), '.4f')} | {cell(e.get('fid'), '.2f')} | "
                f"{cell(e.get('adherence'), '.3f')} | {', '.join(res) or 'no'} |"
            )
    acc = results[names[0]]["router_top1_accuracy"]
    lines += [
        "",
        "Paper columns: HDDM's routing table has no threshold/oracle rows (its threshold ablation, at "
        "another scale, gives FID 38.28 at 0.2); DDM's threshold row is Threshold-0.01. The paper's numbers "
        "come from 50K samples of 256² LAION/ImageNet images with Inception features: compare orderings, "
        "not values.",
        "",
        "Router top-1 accuracy against the cluster labels by t (held-out images; the router is shared by "
        "all configurations"
        + ("; training 0's" if trainings > 1 else "")
        + "): "
        + ", ".join(f"t={t}: {a:.2f}" for t, a in acc.items()),
        "",
    ]
    return "\n".join(lines)
