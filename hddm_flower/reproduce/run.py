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

Its length is the one command's orchestration of those four steps (the trainings, the evaluation jobs over
configurations, trainings and sampling seeds, and the manifest); the training, the GMM's rows and the tables live in
:mod:`.training`, :mod:`hddm_flower.gmm.evaluate` and :mod:`.tables`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import Tensor

from ..budget import budget_of
from ..checkpoints import WEIGHTS, load_expert
from ..config.io import config_from_dict
from ..config.rules import ConfigError
from ..config.schema import Config
from ..data import Dataset
from ..devices import resolve_device, resolve_precision
from ..ensemble import Ensemble
from ..evaluation.evaluate import evaluate_run, feature_network
from ..gmm.truth import interval
from ..provenance import now, source, source_since, versions
from ..rundir import CONFIG, FEATURE_NET, ROUTER, expert_dir, experts_dir
from ..safeio import write_atomic
from ..stages.assemble import evaluate_and_report, load_ensemble
from ..training_seeds import TRAINING_SEED_STRIDE, nested_interval, training_config
from .tables import FLOOR, paired_differences, render_tables, row_summary
from .training import (
    OneExpertRouter,
    config_for,
    dataset_id,
    run_jobs,
    tensor_sha256,
    train_or_reuse_experts,
    train_or_reuse_router,
    training_root,
)

log = logging.getLogger(__name__)


def default_configs(k: int, ddpm_counts: list[int] | None = None) -> dict[str, int]:
    """Name → number of DDPM experts for each count of ``ddpm_counts`` (``reproduce.ddpm_counts``; by default 0, 2
    and K/2: 8FM, 2DDPM:6FM, 4DDPM:4FM at K = 8)."""
    counts = ddpm_counts or [0] + [n for n in dict.fromkeys((2, k // 2)) if 0 < n < k]
    return {_mix_name(k, n): n for n in counts}


def _mix_name(k: int, n: int) -> str:
    """``8FM``, ``2DDPM:6FM`` or ``8DDPM`` for ``n`` DDPM experts out of ``k``."""
    return f"{k}FM" if n == 0 else f"{k}DDPM" if n == k else f"{n}DDPM:{k - n}FM"


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
            OneExpertRouter(meta["channels"], meta["image_size"]),
            1,
            routing="top_k",
            k=1,
            mixed_precision=resolve_precision(cfg.coordinator.mixed_precision, dev),
        ).to(dev)
        run_dir.mkdir(parents=True, exist_ok=True)
        decode = dataset.decoder(cfg)  # one VAE for every seed of the monolith
        result = evaluate_run(
            cfg,
            ens,
            dataset,
            run_dir,
            decode=decode,
            feature_dir=Path(feature_dir),
            modes=["top1"],
            per_expert=False,
            progress=progress,
        )
        return name, _more_seeds(cfg, result, ens, dataset, run_dir, Path(feature_dir), progress, decode=decode)
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
    *,
    decode: Callable[[Tensor], Tensor] | None = None,
) -> dict:
    """Evaluate the same modes again with seeds ``evaluation.seed + 1 …`` (other prompts and noise; the same
    feature network and reference statistics) into ``run_dir/seeds/``, and add ``per_seed`` values and their
    Student-t ``intervals`` to ``result`` (and ``floor_per_seed`` when the evaluation has a floor). The seeds are
    the same for every configuration: inference stays aligned. ``ens`` may be None with one seed; ``decode``: the
    caller's decoder (else the dataset's, built once)."""
    ev = cfg.evaluation
    runs = [result]
    if decode is None and ev.seeds > 1:  # one decoder for every further seed
        decode = dataset.decoder(cfg)
    for i in range(1, ev.seeds):
        seed = ev.seed + i
        runs.append(
            evaluate_run(
                cfg,
                ens,
                dataset,
                run_dir / "seeds" / f"seed-{seed}",
                decode=decode,
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


def _config_eval_args(
    c: Config, name: str, objectives: list[str], root: Path, dataset: Dataset, feature_dir: Path
) -> tuple:
    """Assemble configuration ``name`` of the training kept in ``root`` in ``root/runs/NAME`` (links to that
    training's experts and router, its config written) and return the start of its evaluation job's arguments."""
    run_dir = root / "runs" / name.replace(":", "-")
    experts_dir(run_dir).mkdir(parents=True, exist_ok=True)
    for k, obj in enumerate(objectives):
        relative_symlink(expert_dir(run_dir, k), root / "experts" / f"cluster-{k}-{obj}")
    relative_symlink(run_dir / ROUTER, root / ROUTER)
    (run_dir / CONFIG).write_text(f"# hddm reproduce: {name}\n" + yaml.safe_dump(c.to_dict(), sort_keys=False))
    return c.to_dict(), name, str(run_dir), str(dataset.root), str(feature_dir), objectives


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
    reuse: list[Path] = (),
) -> dict:
    """Train or reuse everything, evaluate every configuration and the monolith, write tables and manifest.

    ``jobs`` > 1 trains the experts and the monolith, then evaluates the configurations and the monolith, in that
    many processes (one torch thread each). ``reuse``: other outputs whose finished experts, monoliths and routers
    are copied in where their fingerprints match this run's (and, on a gmm dataset, whose rows are where the rows'
    keys match): another rung of a ladder that trains its experts alike trains and samples only what differs."""
    start, load_start, code = time.perf_counter(), os.getloadavg(), source()  # the checkout as the run begins
    configs = configs or default_configs(cfg.num_experts, cfg.reproduce.ddpm_counts)
    reuse = [Path(d) for d in reuse]
    for d in reuse:
        if not d.is_dir() or d.resolve() == out.resolve():
            raise ConfigError(f"--reuse {d}: not another hddm reproduce output folder")
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
    donors = [[training_root(d, i) for d in reuse] for i in range(trainings)]
    timings: dict[str, float] = {}

    # 1–2. per training: the unique (cluster, objective) experts, the monolith and the router, reused or trained
    t0 = time.perf_counter()
    unique = sorted({(k, o) for objs in objectives.values() for k, o in enumerate(objs)})
    per_training = train_or_reuse_experts(tcfgs, roots, dataset, unique, data_id, jobs, progress, donors)
    timings["training"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for c, root, artefacts_i, given in zip(tcfgs, roots, per_training, donors):
        artefacts_i["router"] = train_or_reuse_router(c, root, dataset, data_id, progress, given)
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
        from ..gmm.evaluate import evaluate_truth

        results = evaluate_truth(
            cfg,
            roots,
            dataset,
            objectives,
            in_worker=jobs > 1,
            run_jobs=lambda fn, args: run_jobs(fn, args, jobs, progress, "truth evaluation"),
            weights=[
                {
                    "experts": {n: folder_sha256(root / "experts" / n) for n in a["experts"]},
                    "monolith": folder_sha256(root / "monolith"),
                    "router": folder_sha256(root / ROUTER),
                }
                for root, a in zip(roots, per_training)
            ],
            data_id=data_id,
            donors=donors,
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
        done = dict(zip(keys, (r for _, r in run_jobs(_eval_job, eval_args, jobs, progress, "evaluating"))))
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
        "fingerprints": {
            "experts": artefacts["fingerprint"],
            "monolith": artefacts["monolith_fingerprint"],
            "router": artefacts["router"]["fingerprint"],
        }
        | ({} if truth else {"feature_net": artefacts["feature_net"]["state_fingerprint"]}),
        "dataset": data_id,
        "reused_from": [str(d) for d in reuse],
        "budget": dataclasses.asdict(budget_of(cfg)),
        "artefacts": artefacts,
        "versions": versions(),
        "source": source_since(code),
        "results": results if truth else {n: row_summary(r) for n, r in results.items()},
    }
    if truth:
        from ..gmm.compare import paired_truth

        manifest["paired"] = paired_truth(results)
    else:
        manifest["paired"] = paired_differences(results)
    write_atomic(out / "manifest.json", json.dumps(manifest, indent=2))
    if truth:
        from ..gmm.evaluate import render_truth_tables

        write_atomic(out / "tables.md", render_truth_tables(manifest, results))
    else:
        write_atomic(out / "tables.md", render_tables(manifest, results))
    return manifest


def folder_sha256(folder: Path) -> str:
    """sha256 over every file of a trained part's folder (weights, model config, metadata): what a stored GMM row is
    keyed by, so that equal weights with other metadata (a DDPM schedule, a clean prior) do not share a row."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def relative_symlink(link: Path, target: Path) -> None:
    """A relative symbolic link ``link`` → ``target`` (replacing an old link)."""
    if link.is_symlink():
        link.unlink()
    elif link.exists():
        raise FileExistsError(f"{link} exists and is not a link; use a new --out")
    link.symlink_to(os.path.relpath(target, link.parent))
