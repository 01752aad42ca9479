"""Stage 4, assemble and evaluate (on the server): the experts of a run directory with its router, evaluated
(diagnostics, every routing mode, per expert), sampled, and reported."""

from __future__ import annotations

from pathlib import Path

from ..checkpoints import load_router
from ..config.schema import Config
from ..data import Dataset
from ..devices import resolve_device
from ..ensemble import Ensemble
from ..evaluation.adherence import prompt_adherence, prompt_clusters
from ..evaluation.evaluate import evaluate_run
from ..evaluation.metrics import FeatureClassifier
from ..evaluation.report import save_grid, write_report
from ..hddm_pipeline import (
    HDDMExperts,
    assemble_pipeline,
    build_ensemble,
    sample_images,
    sampling_defaults,
    write_run_index,
)
from ..models import Router, router_conditioning
from ..rundir import FEATURE_NET, ROUTER, SAMPLES, expert_folders
from .diagnostics import evaluate, heldout_batches, skipped_diagnostics
from .router import fit_router


def load_ensemble(cfg: Config, run_dir: Path, router: Router | None = None) -> tuple[Ensemble, list[dict]]:
    """Assemble the experts found in ``run_dir/experts`` with ``router`` (else the one of ``run_dir/router``) and
    the config's sampling settings (:func:`~hddm_flower.hddm_pipeline.build_ensemble`); also their metadata."""
    experts = HDDMExperts.from_folders(expert_folders(run_dir).values(), cfg.num_experts)
    router = router if router is not None else load_router(run_dir / ROUTER)
    ensemble = build_ensemble(experts, router, sampling_defaults(cfg), resolve_device(cfg.coordinator.device))
    return ensemble, [experts.metas[k] for k in experts.ids]


def finish_run(
    cfg: Config,
    run_dir: Path,
    dataset: Dataset,
    missing: list[dict],
    *,
    extra: dict | None = None,
    progress: bool = False,
) -> dict:
    """After the experts arrived in ``run_dir/experts``: router, then :func:`evaluate_and_report`."""
    router = fit_router(cfg, dataset, run_dir, progress=progress)
    return evaluate_and_report(cfg, run_dir, dataset, missing, router=router, extra=extra, progress=progress)


def evaluate_and_report(
    cfg: Config,
    run_dir: Path,
    dataset: Dataset,
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
    reference statistics per cluster (see :func:`hddm_flower.evaluation.evaluate.evaluate_run`)."""
    s = cfg.sampling
    # the run's components loaded once: the ensemble evaluated and the pipeline that samples the grid
    pipe = assemble_pipeline(cfg, run_dir, dataset, router=router, progress=progress)
    ensemble, metas = pipe.ensemble(), [pipe.experts.metas[k] for k in pipe.experts.ids]
    if dataset.data_free:  # institution-owned data: no held-out image on the coordinator
        metrics = skipped_diagnostics(cfg, (extra or {}).get("router", {}).get("heldout"))
    else:
        ev = cfg.evaluation
        batches = heldout_batches(dataset, ev.diagnostic_images, ev.batch_size, s.seed)
        metrics = evaluate(ensemble, batches, seed=s.seed, times=tuple(ev.times))
    metrics["evaluation"] = evaluate_run(
        cfg,
        ensemble,
        dataset,
        run_dir,
        decode=pipe.pixels,  # the pipeline's VAE: one copy in stage 4
        modes=modes,
        feature_dir=feature_dir,
        reference=reference,
        progress=progress,
    )
    write_run_index(cfg, run_dir, dataset)  # the run directory is now a diffusers pipeline folder
    images = sample_images(pipe, s.prompts, samples_per_prompt=s.samples_per_prompt, seed=s.seed)
    save_grid(images, len(s.prompts), run_dir / SAMPLES)
    classifier = FeatureClassifier.from_pretrained(feature_dir or run_dir / FEATURE_NET, low_cpu_mem_usage=False).eval()
    # a coordinator without data knows no prompt's cluster (that needs the captions): adherence None, said so
    clusters = [[] for _ in s.prompts] if dataset.data_free else prompt_clusters(dataset, s.prompts)
    adherence = prompt_adherence(classifier, images, clusters, s.samples_per_prompt)
    metrics["sampling"] = {
        "grid": SAMPLES,
        "prompts": s.prompts,
        "samples_per_prompt": s.samples_per_prompt,
        "num_steps": s.num_steps,
        "cfg_scale": s.cfg_scale,
        "routing": s.routing,
        "top_k": s.top_k,
        # what the run's router reads (a router saved without the key reads (x_t, t) only: "none")
        "router_conditioning": router_conditioning(ensemble.router),
        "conversion": s.conversion,
        "t_eps": s.t_eps,
        "x0_clamp": s.x0_clamp,
        "clean_estimate": s.clean_estimate,
        "handover_t": s.handover_t,
        "sampler": "FM Euler, t from 1 to 0, CFG per expert before mixing",
        "adherence": adherence | {"classifier": metrics["evaluation"]["adherence_classifier"]},
    }
    metrics["feature_network"] = metrics["evaluation"]["feature_network"]
    return write_report(cfg, run_dir, dataset, metas, missing, metrics, extra or {})
