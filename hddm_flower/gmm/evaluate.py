"""``hddm reproduce`` on a ``data.name: gmm`` dataset: every row scored against the true density.

Aligned inference as in :mod:`hddm_flower.evaluation.evaluate`: for each seed every row samples the same prompts (every
distinct caption, ``evaluation.samples_per_prompt`` times per component with that caption) from the same noise
with the same sampler, steps and CFG, and is compared with fresh true samples for the same prompts, each drawn from
its caption's conditional mixture ``p(x | c)`` (:mod:`hddm_flower.gmm.targets`, :mod:`hddm_flower.gmm.truth`): one
component for a pattern caption, that colour's component in every cluster for a colour caption. Seeds
``evaluation.seed + i`` for ``i < evaluation.seeds`` change the noise and the true samples; intervals are
across seeds.

Rows: true samples against true samples (what "indistinguishable" means at this sample size); exact experts
(:mod:`hddm_flower.gmm.exact`) with the exact router under oracle routing (also with 8× the Euler steps: what remains
at the evaluation's step count is the sampler's discretisation error), top-2 and full routing, and full routing on
the empty caption (the one text-free case where a text-free router is exact); exact FM experts with the exact
prompt-aware router ``p(k | x_t, t, c)`` under top-2 and full routing; exact DDPM experts through the
``schedule_aware`` and the ``naive`` conversion; the config's own objective mix under every routing mode of
``evaluation.routing_modes`` with its trained router (prompt-aware when ``router.conditioning: text``), the other
mixes under top-2; every mix under top-2 with the exact router and with the exact prompt-aware router instead of
the trained one; and the monolith.

Its length is the rows of one protocol (every configuration and mode, the monolith, the exact and oracle rows) scored
on the same prompts, noise and true draws, and their tables.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..budget import describe as describe_budget
from ..budget import describe_rates
from ..checkpoints import load_expert, load_router
from ..config.io import config_from_dict
from ..config.schema import Config
from ..data import Dataset
from ..ensemble import Ensemble, VelocityScaling
from ..evaluation.evaluate import Prompts, sample_mode
from ..models import router_conditioning
from ..rundir import ROUTER
from .compare import TABLE_4, nested_by_metric, paired_truth, render_paired, trainings_of
from .dataset import GMMReference, load_reference
from .exact import ExactRouter, exact_expert
from .router_probe import ROUTER_METRICS, RouterProbe
from .row_cache import cached_row, row_key, slug, store_row
from .targets import Captions, caption_targets, captions_of, sample_prompts, true_draws
from .truth import METRICS, CaptionTargets, interval, log_prob_given, median_bandwidth, truth_metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Row:
    name: str  # what the table shows
    group: str  # "exact", a configuration name, or "monolith": the rows one evaluation job samples
    mode: str = "oracle"  # routing mode (evaluate.parse_mode)
    router: str = "trained"  # "trained", "exact" (p(k | x_t, t)) or "exact-text" (p(k | x_t, t, c))
    experts: str = "trained"  # "trained", "exact-fm", "exact-ddpm-schedule_aware", "exact-ddpm-naive", "true"
    prompts: str = "captions"  # "captions" or "empty" (the empty caption: the target is the whole mixture)
    steps_factor: int = 1  # × the evaluation's Euler steps (separates the sampler's discretisation error)


def truth_rows(configs: list[str], modes: list[str], main: str) -> list[Row]:
    """The rows in table order: ``main`` (the config's own objective mix) gets every routing mode of ``modes``,
    the other configurations top2 (the paper's mode) only."""
    rows = [
        Row("true samples (fresh draws)", "exact", experts="true"),
        Row("exact FM experts · exact router · oracle", "exact", "oracle", "exact", "exact-fm"),
        Row(
            "exact FM experts · exact router · oracle · 8× Euler steps",
            "exact",
            "oracle",
            "exact",
            "exact-fm",
            steps_factor=8,
        ),
        Row("exact FM experts · exact router · full · empty caption", "exact", "full", "exact", "exact-fm", "empty"),
        Row("exact FM experts · exact router · top2", "exact", "top2", "exact", "exact-fm"),
        Row("exact FM experts · exact router · full", "exact", "full", "exact", "exact-fm"),
        Row("exact FM experts · exact prompt-aware router · top2", "exact", "top2", "exact-text", "exact-fm"),
        Row("exact FM experts · exact prompt-aware router · full", "exact", "full", "exact-text", "exact-fm"),
        Row("exact DDPM experts · schedule_aware · oracle", "exact", "oracle", "exact", "exact-ddpm-schedule_aware"),
        Row("exact DDPM experts · naive · oracle", "exact", "oracle", "exact", "exact-ddpm-naive"),
    ]
    for name in configs:
        rows += [Row(f"{name} · {mode}", name, mode) for mode in (modes if name == main else ["top2"])]
        rows.append(Row(f"{name} · top2 · exact router", name, "top2", "exact"))
        rows.append(Row(f"{name} · top2 · exact prompt-aware router", name, "top2", "exact-text"))
    rows.append(Row("monolith (equal compute)", "monolith", "top1"))
    if main in configs:
        rows += [r for r in attribution_rows(main) if r.name not in {x.name for x in rows}]
    return rows


ATTRIBUTION_MODES = ("top1", "top2", "full")


def attribution_rows(main: str) -> list[Row]:
    """The attribution factorial on the empty caption, where full routing of exact parts is the truth:
    {exact FM experts, ``main``'s trained experts} × {exact router, trained router} × :data:`ATTRIBUTION_MODES`.
    A row with a trained part belongs to ``main``'s group (sampled for every training: the trained router is
    training i's, from its root); exact experts with the exact router are in the exact group (sampled once)."""
    out = []
    for experts, e_name in (("exact-fm", "exact FM experts"), ("trained", f"{main} experts")):
        for router, r_name in (("exact", "exact router"), ("trained", "trained router")):
            group = "exact" if experts == "exact-fm" and router == "exact" else main
            out += [
                Row(f"{e_name} · {r_name} · {mode} · empty caption", group, mode, router, experts, "empty")
                for mode in ATTRIBUTION_MODES
            ]
    return out


def _targets(captions: Captions, row: Row, samples_per_prompt: int) -> CaptionTargets | None:
    """What each of a row's samples is prompted for; ``None`` for the empty caption (the whole mixture)."""
    return None if row.prompts == "empty" else caption_targets(captions, samples_per_prompt)


def _prompts(
    ref: GMMReference, captions: Captions, targets: CaptionTargets | None, n: int, seed: int
) -> tuple[Prompts, int]:
    """(prompts, samples per prompt) of one row and seed: the empty caption for all ``n`` samples, else one prompt
    per sample (:func:`~hddm_flower.gmm.targets.sample_prompts`: its cluster for oracle routing drawn from
    ``seed``)."""
    if targets is None:
        return Prompts([""], ref.uncond, torch.zeros(1, dtype=torch.long)), n
    return sample_prompts(ref, captions, targets, seed), 1


class _OneExpert(torch.nn.Module):
    """The monolith's router: its single expert always gets weight 1."""

    def __init__(self, ref: GMMReference):
        super().__init__()
        self.config = ExactRouter(ref).config

    def forward(self, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return torch.zeros(x_t.shape[0], 1, dtype=x_t.dtype, device=x_t.device)


def _ensemble(cfg: Config, row: Row, ref: GMMReference, out: Path, objectives: list[str] | None) -> Ensemble:
    s, K = cfg.sampling, ref.num_clusters
    conv = {"t_eps": s.t_eps, "x0_clamp": s.x0_clamp}
    if row.experts == "exact-fm":
        experts = {k: exact_expert(ref, k, "fm") for k in range(K)}
    elif row.experts.startswith("exact-ddpm-"):
        conversion = row.experts.removeprefix("exact-ddpm-")
        experts = {
            k: exact_expert(
                ref,
                k,
                "ddpm",
                schedule=cfg.ddpm.schedule,
                num_train_timesteps=cfg.ddpm.num_train_timesteps,
                conversion=conversion,
                **conv,
            )
            for k in range(K)
        }
    elif row.group == "monolith":
        mono, _ = load_expert(out / "monolith", **s.conversion_options())
        return Ensemble({0: mono}, _OneExpert(ref), 1, routing="top_k", k=1)
    else:
        experts = {
            k: load_expert(out / "experts" / f"cluster-{k}-{obj}", **s.conversion_options())[0]
            for k, obj in enumerate(objectives)
        }
    if row.router == "trained":  # probed against the exact posterior on the sampler's own trajectories
        trained = load_router(out / ROUTER)
        router = RouterProbe(trained, ExactRouter(ref, router_conditioning(trained)))
    else:
        router = ExactRouter(ref, "text" if row.router == "exact-text" else "none")
    scaling = VelocityScaling(s.velocity_scaling, s.velocity_scaling_t, s.x0_variance)
    return Ensemble(
        experts,
        router,
        K,
        routing="top_k",
        k=2,
        threshold=s.threshold,
        velocity_scaling=scaling,
        handover_t=s.handover_t,
    )


PER_SAMPLE_DIR = "truth-per-sample"


def save_per_sample(out: Path, row: Row, values: dict[str, torch.Tensor]) -> Path:
    """Every sample's ``log p`` (and its seed's true samples') of one row, ``OUT/truth-per-sample/ROW.safetensors``
    (keys ``seed-S.log_p``, ``seed-S.true_log_p``): the per-sample values behind the means and quantiles."""
    from safetensors.torch import save_file

    path = out / PER_SAMPLE_DIR / f"{slug(row.name)}.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in values.items()}, path)
    return path


def evaluate_group(a: tuple) -> dict[str, Any]:
    """Sample and score the rows of one group for every seed (a separate process when jobs > 1)."""
    cfg_dict, out, dataset_root, rows, objectives, in_worker = a
    if in_worker:
        torch.set_num_threads(1)
    cfg, out = config_from_dict(cfg_dict, "reproduce"), Path(out)
    ev, s = cfg.evaluation, cfg.sampling
    ref = load_reference(Dataset.open(dataset_root))  # a worker process: the dataset opened here
    bandwidth = median_bandwidth(true_draws(ref, None, 1000, 999_999))  # fixed once per dataset
    steps = ev.num_steps or s.num_steps
    captions = captions_of(ref)
    n = ref.mixture.num_components * ev.samples_per_prompt  # every row: samples_per_prompt per component
    results, ensembles = {}, {}
    for row in rows:
        targets = _targets(captions, row, ev.samples_per_prompt)
        key = (row.experts, row.router)  # rows that differ only in routing share their ensemble
        if row.experts != "true" and key not in ensembles:
            ensembles[key] = _ensemble(cfg, row, ref, out, objectives)
        ens = ensembles.get(key)
        per_seed, seconds, per_sample, router_steps = [], 0.0, {}, []
        probe = ens.router if ens is not None and isinstance(ens.router, RouterProbe) else None
        for i in range(ev.seeds):
            seed = ev.seed + i
            reference = true_draws(ref, targets, n, 1_000_000 + seed)  # the truth every row of this seed is scored on
            prompts, per_prompt = _prompts(ref, captions, targets, n, 3_000_000 + seed)
            start = time.perf_counter()
            if probe is not None:
                probe.reset()
            if ens is None:
                x = true_draws(ref, targets, n, 2_000_000 + seed)
            else:
                x, _ = sample_mode(
                    ens,
                    row.mode,
                    prompts,
                    ref.uncond,
                    samples_per_prompt=per_prompt,
                    num_steps=steps * row.steps_factor,
                    cfg_scale=s.cfg_scale,
                    threshold=s.threshold,
                    seed=seed,
                    batch_size=ev.batch_size,
                )
            seconds += time.perf_counter() - start
            x = x.flatten(0, 1) if ens is not None else x  # (P, S, C, H, W) → (N, C, H, W)
            x = x.flatten(1).double()
            per_seed.append(truth_metrics(ref.mixture, ref.cluster_of, x, reference, targets, bandwidth))
            probed = None if probe is None else probe.summary()
            if probed is not None:
                per_seed[-1] |= probed[0]
                router_steps.append(probed[1])
            per_sample[f"seed-{seed}.log_p"] = ref.mixture.log_prob(x).float()
            per_sample[f"seed-{seed}.true_log_p"] = ref.mixture.log_prob(reference.double()).float()
            per_sample[f"seed-{seed}.log_p_cond"] = log_prob_given(ref.mixture, x, targets).float()
            per_sample[f"seed-{seed}.true_log_p_cond"] = log_prob_given(ref.mixture, reference, targets).float()
        summary = {k: interval([m[k] for m in per_seed]) for k in METRICS + ROUTER_METRICS if k in per_seed[0]}
        samples_file = save_per_sample(out, row, per_sample)
        results[row.name] = {
            "row": row.__dict__,
            "per_sample_file": str(samples_file.relative_to(out)),
            "samples_per_seed": n,
            "seeds": ev.seeds,
            "per_seed": per_seed,
            "metrics": summary,
            "sampling_seconds": round(seconds, 1),
            "bandwidth": bandwidth,
        } | ({"router_steps": router_steps} if router_steps else {})
        log.info(
            "%s: Δlog p %.2f, MMD² %.4f (%.0f s)",
            row.name,
            summary["delta_log_density"]["mean"],
            summary["mmd2"]["mean"],
            seconds,
        )
    return results


def _cost(row: Row, num_experts: int) -> float:
    """A row's rough sampling cost per sample and Euler step, for scheduling only: the router (a trained one costs
    about two expert evaluations here, the closed-form one one, oracle routing none) plus the experts each sample
    runs (every expert under full routing, about three under threshold, k under top-k)."""
    if row.experts == "true":
        return 0.0
    mode = row.mode.split("+")[0]
    router = 0 if mode == "oracle" else (2 if row.router == "trained" else 1)
    experts = {"full": num_experts, "threshold": 3}.get(mode, int(mode[3:]) if mode.startswith("top") else 1)
    return (router + experts) * row.steps_factor


def evaluate_truth(
    cfg: Config,
    roots: list[Path],
    dataset: Dataset,
    objectives: dict[str, list[str]],
    *,
    in_worker: bool,
    run_jobs: Callable[[Callable, list[tuple]], list],
    weights: list[dict],
    data_id: dict,
    donors: list[list[Path]] | None = None,
) -> dict[str, Any]:
    """Every row of :func:`truth_rows`, one job per row through ``run_jobs(fn, args)`` (the caller's process pool;
    ``args[i][-1]`` says whether job i runs in a worker); returns the rows in table order.

    ``roots[i]`` holds training i's experts, monolith and router (:func:`hddm_flower.reproduce.training.training_root`),
    ``weights[i]`` the sha256 of their folders (see :func:`~hddm_flower.gmm.row_cache.row_key`). The exact rows do not depend on a training and are
    sampled once; each trained row is sampled for every training on the same sampling seeds. A row's ``per_seed``
    and ``metrics`` are training 0's; with several trainings a trained row also has ``per_training``
    (``[training][seed]`` metric dicts) and ``nested`` (per metric,
    :func:`~hddm_flower.training_seeds.nested_interval`: over trainings, outer; sampling seeds, inner).

    Each job's result is kept in ``roots[i]/truth-rows/`` under its :func:`row_key` and not sampled again while the
    key holds, nor when ``donors[i]`` (other outputs of training i) holds it: a rung that changes only the monolith's
    budget samples only the monolith's row."""

    o = cfg.objectives
    main = f"{o.ddpm}DDPM:{o.fm}FM" if o.ddpm and o.fm else f"{cfg.num_experts}{'DDPM' if o.ddpm else 'FM'}"
    main = main if main in objectives else next(iter(objectives))
    rows = truth_rows(list(objectives), list(cfg.evaluation.routing_modes), main)
    donors = donors or [[] for _ in roots]
    # one job per row and training, the most expensive first: the pool's processes then finish close together (a
    # job per group left one process sampling the main mix's five routing modes long after the other was done)
    K = cfg.num_experts
    done: dict[tuple[str, int], Any] = {}
    jobs, keys = [], {}
    for r in rows:
        for i in range(1 if r.group == "exact" else len(roots)):
            keys[r.name, i] = row_key(cfg, r, objectives.get(r.group), weights[i], data_id)
            cached = cached_row(roots[i], r, keys[r.name, i], donors[i])
            if cached is not None:
                done[r.name, i] = cached
            else:
                jobs.append((r, i))
    jobs.sort(key=lambda job: -_cost(job[0], K))
    args = [(cfg.to_dict(), str(roots[i]), str(dataset.root), [r], objectives.get(r.group), in_worker) for r, i in jobs]
    for (r, i), part in zip(jobs, run_jobs(evaluate_group, args) if args else []):
        done[r.name, i] = part[r.name]
        store_row(roots[i], r, keys[r.name, i], part[r.name])
    results = {}
    for r in rows:
        results[r.name] = done[r.name, 0]
        if r.group != "exact" and len(roots) > 1:
            per_training = [done[r.name, i]["per_seed"] for i in range(len(roots))]
            results[r.name]["per_training"] = per_training
            keys = [k for k in METRICS + ROUTER_METRICS if k in per_training[0][0]]
            results[r.name]["nested"] = nested_by_metric(per_training, keys)
    return results


def _cell(m: dict[str, float] | None, spec: str, scale: float = 1.0) -> str:
    """``mean ± half`` (with ``[inner_half]`` for an interval over trainings), times ``scale``."""
    if m is None:
        return "–"
    inner = f" [{format(m['inner_half'] * scale, spec)}]" if "inner_half" in m else ""
    return f"{format(m['mean'] * scale, spec)} ± {format(m['half'] * scale, spec)}{inner}"


def render_router(results: dict[str, Any], trainings: int) -> list[str]:
    """Markdown lines: every trained router on its ensemble's own sampler trajectories against the exact posterior
    (:mod:`hddm_flower.gmm.router_probe`); nothing when no row has a probed router."""
    probed = [n for n, r in results.items() if "router_kl" in r["per_seed"][0]]
    if not probed:
        return []
    covers = f"over {trainings} trainings [sampling seeds within one]" if trainings > 1 else "over sampling seeds"
    missing = any("router_steps" not in results[n] for n in probed)
    by_step_note = "; – in a reading that does not start with training 0" if missing else ""
    lines = [
        "**The trained router on the sampler's own trajectories** (every router call at the x_t the ensemble "
        "visits, against the exact posterior there: p(k | x_t, t), or p(k | x_t, t, c) for a caption-reading "
        f"router). KL(exact ‖ router) and agreement are means over the Euler steps and samples, ± {covers}; the "
        f"per-step KL of training 0 (mean over seeds{by_step_note}) at t = 1, the middle step and the last step; prior "
        "TV: the router's TV distance to the exact prior at t = 1 (the cluster weights).",
        "",
        "| row | KL(exact ‖ router) | KL at t = 1 / middle / last step | top-1 agreement | top-2 agreement "
        "| prior TV at t = 1 |",
        "|---|---|---|---|---|---|",
    ]
    for n in probed:
        r = results[n]
        m = r.get("nested", r["metrics"])
        steps = r.get("router_steps")  # training 0's (absent from a reading that leaves training 0 out)
        kl = [sum(s["kl"][i] for s in steps) / len(steps) for i in range(len(steps[0]["kl"]))] if steps else None
        by_step = f"{kl[0]:.3f} / {kl[len(kl) // 2]:.3f} / {kl[-1]:.3f}" if kl else "–"
        lines.append(
            f"| {n} | {_cell(m['router_kl'], '.3f')} | {by_step} | "
            f"{_cell(m['router_top1_agreement'], '.3f')} | {_cell(m['router_top2_agreement'], '.3f')} | "
            f"{_cell(m.get('router_prior_tv'), '.3f')} |"
        )
    return [*lines, ""]


def _prompt_protocol(caption_kind: str, samples_per_prompt: int) -> str:
    """How the rows are prompted, in words."""
    if caption_kind == "colour":
        return (
            f"every colour caption (shared by every cluster: its target is p(x | c), the mixture of that colour's "
            f"components, whose cluster is drawn from p(k | c) for oracle routing) × {samples_per_prompt} samples "
            "per component of that colour"
        )
    return f"every component's caption × {samples_per_prompt} samples"


def render_truth_tables(manifest: dict, results: dict[str, Any]) -> str:
    """Markdown: the exact references, then the trained configurations, each metric as mean ± 95 % half-width."""
    cfg = manifest["config"]
    ev = cfg["evaluation"]
    anyr = next(iter(results.values()))
    head = (
        "| row | Δ log p (vs true) | median | deficit p90 | Δ log p(x \\| c) | MMD² ×10³ | at 0.25× / 4× bandwidth "
        "| mode TV | cluster TV vs p(k \\| c) | adherence | cluster adherence |\n|---|---|---|---|---|---|---|---|---|---|---|"
    )

    def line(name: str, r: dict) -> str:
        m = r.get("nested", r["metrics"])  # over trainings where there are several
        return (
            f"| {name} | {_cell(m['delta_log_density'], '.2f')} | {_cell(m.get('delta_log_density_median'), '.2f')} | "
            f"{_cell(m.get('log_deficit_p90'), '.2f')} | {_cell(m.get('delta_log_density_cond'), '.2f')} | "
            f"{_cell(m['mmd2'], '.2f', 1e3)} | "
            f"{_cell(m.get('mmd2_bw0.25'), '.2f', 1e3)} / {_cell(m.get('mmd2_bw4'), '.2f', 1e3)} | "
            f"{_cell(m['mode_tv'], '.3f')} | {_cell(m.get('cluster_tv'), '.3f')} | {_cell(m.get('adherence'), '.3f')} | "
            f"{_cell(m.get('cluster_adherence'), '.3f')} |"
        )

    trainings = trainings_of(results)
    paired = paired_truth(results)
    trained_cells = (
        f"Each cell: the mean over {trainings} independent trainings (experts, router and monolith retrained, "
        "`evaluation.training_seeds`) ± the half-width of the 95 % Student-t interval over trainings of the "
        "per-training means over sampling seeds [the mean half-width over sampling seeds within one training]."
        if trainings > 1
        else "Each cell: the mean over sampling seeds of **one** training ± the half-width of its 95 % Student-t "
        "interval; it does not cover another training of the same config ("
        + (
            f"the run has {ran}: read over several, `hddm tables`)."
            if (ran := manifest.get("seeds", {}).get("trainings", 1)) > 1
            else "`evaluation.training_seeds` > 1)."
        )
    )

    exact = [n for n, r in results.items() if r["row"]["group"] == "exact"]
    trained = [n for n in results if n not in exact]
    lines = [
        f"Produced by `{manifest['command'] or 'hddm reproduce'}` on {manifest['created_at']} in "
        f"{manifest['seconds'] / 60:.1f} min wall, {manifest['cpu_seconds'] / 60:.1f} min CPU ({manifest['device']}, "
        f"load average {manifest['load_average']['start'][0]} at the start, {manifest['load_average']['end'][0]} at "
        f"the end; training {manifest['timings_s']['training']:.0f} s in {manifest['training_processes']} "
        f"process(es), router {manifest['timings_s']['router']:.0f} s, evaluation "
        f"{manifest['timings_s']['evaluation']:.0f} s).",
        f"Data: {manifest['dataset']['dataset']} (a Gaussian mixture, {cfg['num_experts']} clusters × "
        f"{cfg['data']['gmm_components']} components, {cfg['data']['gmm_channels']}×{cfg['data']['image_size']}²). "
        f"Experts `{cfg['expert']['preset']}`, {describe_budget(manifest['budget'])}, {describe_rates(cfg)}; router `{cfg['router']['preset']}` × "
        f"{cfg['router']['steps']} steps.",
        f"Aligned inference: {_prompt_protocol(cfg['data'].get('gmm_captions', 'pattern'), ev['samples_per_prompt'])}"
        f" = {anyr['samples_per_seed']} samples per row and seed, {ev['seeds']} seeds "
        f"({anyr['samples_per_seed'] * ev['seeds']} samples per row), the same noise in every row, FM Euler "
        f"{ev['num_steps'] or cfg['sampling']['num_steps']} steps, CFG {cfg['sampling']['cfg_scale']}, DDPM schedule "
        f"{cfg['ddpm']['schedule']}. Exact rows: mean over seeds ± the half-width of its 95 % Student-t interval. "
        f"MMD: Gaussian kernel, bandwidth {anyr['bandwidth']:.3f} (median distance of true samples). The truth: "
        "fresh true samples for the same prompts.",
        "",
        "**Exact references** (closed-form experts and router: the upper bound of the sampling stack).",
        "",
        head,
        *[line(n, results[n]) for n in exact],
        "",
        f"**Trained experts** (routing modes with the trained router, conditioning "
        f"`{cfg['router'].get('conditioning', 'none')}`; top2 with the exact router and the exact prompt-aware "
        "router; the monolith). " + trained_cells,
        "",
        head,
        *[line(n, results[n]) for n in trained],
        "",
        *render_router(results, trainings),
        *render_paired([e for e in paired if e["table"] == "paired"], trainings, ev["seeds"]),
        "",
        *(
            render_paired([e for e in paired if e["table"] == "attribution"], trainings, ev["seeds"], TABLE_4) + [""]
            if any(e["table"] == "attribution" for e in paired)
            else []
        ),
        "The `empty caption` row is scored against the whole mixture (adherence does not apply; its cluster TV is "
        "against the cluster weights). Finite samples make mode TV and cluster TV positive even for true samples and "
        "spread MMD² around 0: the true-samples row is the yardstick.",
        "",
    ]
    return "\n".join(lines)
