"""Trained DDPM experts against the exact velocity on ``configs/reproduce-gmm.yaml``: the velocity-error profile of
every conversion option and the per-expert sampler ablation with oracle routing.

    python -m benchmarks.ddpm_profile [--out DIR] [--jobs 2] [--samples 512] [--seeds 3] [--per-prompt 64]

1. Trains (or reuses, in ``--out``, the layout and fingerprint of ``hddm reproduce``) an FM and a DDPM expert on
   each cluster that ``4DDPM:4FM`` gives DDPM (``ddpm_clusters: auto``), with the config's budget, and the monolith.
2. Profile: per cluster and t, the excess error ``E‖v̂ − v*‖²`` per dimension on the cluster's own ``x_t`` with its
   captions (on support) and on the other clusters' ``x_t`` weighted by the exact router's ``p(k | x_t, t)`` (off
   support: what full routing would add), for the FM expert, the DDPM expert under every conversion option and the
   monolith (on support). ``v*`` is the cluster's exact velocity for the caption (:mod:`hddm_flower.gmm.exact`).
3. Ablation: each expert alone on its cluster's captions and on the empty caption, FM Euler on the converted
   velocity (every option) or diffusers' schedulers on the ε-network (DDPM ancestral, DDIM η = 0 and 1, with and
   without clipping the predicted x0 at ``sampling.x0_clamp``), the FM sibling and the monolith; scored against the
   cluster's exact density: Δlog p (mean and median, vs fresh true samples), MMD², in-cluster rate; the same
   noise for every arm; ``--seeds`` seeds; differences to the FM sibling paired by seed with Student-t intervals
   (they cover sampling seeds of one training, not trainings).

Writes ``benchmarks/results/ddpm_profile.{json,md,png}`` with the command, machine, load and date.

Its length is one experiment with its runs, measurements and write-up.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from hddm_flower.checkpoints import load_expert, read_expert_meta, scheduler_config
from hddm_flower.config.io import load_config
from hddm_flower.data import Dataset
from hddm_flower.ensemble import euler_sample
from hddm_flower.evaluation.report import PALETTE, draw_axes
from hddm_flower.gmm.dataset import load_reference
from hddm_flower.gmm.exact import ExactNet, ExactRouter
from hddm_flower.gmm.truth import interval, median_bandwidth, mmd2
from hddm_flower.models import TextCond
from hddm_flower.objectives import cap_velocity_rms, velocity_rms, velocity_rms_prior
from hddm_flower.reproduce.training import (
    NotTrained,
    config_for,
    dataset_id,
    fingerprint_of,
    run_jobs,
    train_job,
    train_or_reuse,
)
from hddm_flower.stages.prepare import prepare_data

log = logging.getLogger("ddpm_profile")
ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
TIMES = (0.05, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 0.99, 0.999, 1.0)
NO_GUARDS = {"t_eps": 1e-6, "x0_clamp": 1e6}
VSCALE_T = 0.85


def _options(cfg) -> dict[str, dict]:
    """DDPM conversion arms: load_expert options plus the velocity cap (None, "sibling" or "prior")."""
    base = cfg.sampling.conversion_options()
    return {
        "clamp": base | {"cap": None},
        "no guards": base | NO_GUARDS | {"cap": None},
        "clamp + fm_rms (FM sibling)": base | {"cap": "sibling"},
        "clamp + fm_rms (prior)": base | {"cap": "prior"},
        "naive timestep, clamp": base | {"conversion": "naive", "cap": None},
        "shrink": base | {"clean_estimate": "shrink", "cap": None},
        "shrink_naive": base | {"clean_estimate": "shrink_naive", "cap": None},
    }


# --------------------------------------------------------------------------------------------------------------
# experts


def train_or_reuse_all(cfg, dataset: Dataset, out: Path, clusters: list[int], jobs: int) -> dict[str, Path]:
    """FM and DDPM experts on ``clusters`` and the monolith, in ``hddm reproduce``'s layout and fingerprint."""
    data_id = dataset_id(dataset)
    fp = fingerprint_of(cfg.expert, cfg.ddpm, data_id)
    todo = [("monolith", None, "fm")] + [(f"cluster-{k}-{o}", k, o) for k in clusters for o in ("fm", "ddpm")]
    folders = {name: out / ("monolith" if k is None else f"experts/{name}") for name, k, _ in todo}
    pending = []
    for name, k, obj in todo:
        try:
            train_or_reuse(folders[name], fp, None)
        except NotTrained:
            pending.append((name, k, obj))
    args = [(cfg.to_dict(), str(dataset.root), k, o, str(folders[n]), fp, jobs > 1, False) for n, k, o in pending]
    run_jobs(train_job, args, jobs, False, "training")
    for name, _, obj in todo:
        if obj == "ddpm" and "clean_prior" not in read_expert_meta(folders[name]):
            raise SystemExit(f"{folders[name]} has no measured clean prior (trained by older code); use a new --out")
    return {name: folders[name] for name, _, _ in todo} | {"trained": [n for n, _, _ in pending]}


def load_eval_expert(folder: Path, options: dict):
    """The expert saved in ``folder`` in eval mode, with the sampling ``options`` it takes (``cap`` left out)."""
    expert, _ = load_expert(folder, **{k: v for k, v in options.items() if k != "cap"})
    return expert.eval()


# --------------------------------------------------------------------------------------------------------------
# profile


def draw_x0(ref, members: torch.Tensor, n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` clean samples from the components ``members`` (by their mixture weights) and their components."""
    w = ref.mixture.weights[members]
    comps = members[torch.multinomial(w / w.sum(), n, replacement=True, generator=g)]
    x0, _ = ref.mixture.sample(n, g, components=comps)
    return x0, comps


def caption_cond(ref, comps: torch.Tensor | None, n: int) -> TextCond:
    """The captions of components ``comps`` of the mixture ``ref`` (None: ``n`` empty captions)."""
    if comps is None:
        return TextCond(ref.uncond.states.expand(n, -1, -1), ref.uncond.mask.expand(n, -1))
    return TextCond(ref.cond.states[comps], ref.cond.mask[comps])


@torch.no_grad()
def profile(cfg, ref, folders, clusters, n: int, seed: int) -> dict:
    router = ExactRouter(ref)
    C, S, _ = ref.shape
    shape = (C, S, S)
    options = _options(cfg)
    prior_rms = velocity_rms_prior(cfg.sampling.x0_variance)
    mono = load_eval_expert(folders["monolith"], {})
    out = {}
    for k in clusters:
        truth = ExactNet(ref, k, "fm")
        fm = load_eval_expert(folders[f"cluster-{k}-fm"], {})
        ddpm = {name: load_eval_expert(folders[f"cluster-{k}-ddpm"], o) for name, o in options.items()}
        members = (ref.cluster_of == k).nonzero().squeeze(1)
        others = (ref.cluster_of != k).nonzero().squeeze(1)
        rows = {"FM": {}, "monolith": {}} | {f"DDPM {name}": {} for name in options}
        for support, comps_of in (("on", members), ("off", others)):
            for i, t in enumerate(TIMES):
                g = torch.Generator().manual_seed(seed + 1000 * k + 17 * i + (0 if support == "on" else 7))
                x0, comps = draw_x0(ref, comps_of, n, g)
                x_t = ((1 - t) * x0 + t * torch.randn(x0.shape, generator=g, dtype=torch.float64)).reshape(n, *shape)
                tt = torch.full((n,), t, dtype=torch.float64)
                cond = caption_cond(ref, comps, n)
                v_star = truth(x_t, 999.0 * tt, cond).double()
                weight = (
                    torch.ones(n, dtype=torch.float64)
                    if support == "on"
                    else router(x_t.double(), tt).softmax(-1)[:, k].double()
                )
                x32, t32 = x_t.float(), tt.float()

                def err(v):
                    e = ((v.double() - v_star) ** 2).flatten(1).mean(1)
                    return float((weight * e).mean())

                v_fm = fm.velocity(x32, t32, cond)
                rows["FM"].setdefault(support, []).append(err(v_fm))
                if support == "on":
                    rows["monolith"].setdefault(support, []).append(err(mono.velocity(x32, t32, cond)))
                for name, expert in ddpm.items():
                    v = expert.velocity(x32, t32, cond)
                    cap = options[name]["cap"]
                    if cap is not None and t > VSCALE_T:
                        ref_rms = velocity_rms(v_fm) if cap == "sibling" else torch.full((n,), prior_rms)
                        v, _ = cap_velocity_rms(v, ref_rms)
                    rows[f"DDPM {name}"].setdefault(support, []).append(err(v))
        out[str(k)] = rows
        log.info("profile: cluster %d done", k)
    return out


# --------------------------------------------------------------------------------------------------------------
# ablation


def _native(expert, meta: dict, noise: torch.Tensor, cond, kind: str, clip: bool, clamp: float, steps: int, g):
    """diffusers' DDPM ancestral or DDIM (η 0 / 1) sampling of the ε-network from ``noise`` (VP, t = T − 1)."""
    from diffusers import DDIMScheduler

    base = scheduler_config(meta)
    if kind == "ddpm":
        sched = type(base).from_config(base.config, clip_sample=clip, clip_sample_range=clamp)
    else:
        sched = DDIMScheduler.from_config(base.config, clip_sample=clip, clip_sample_range=clamp)
    sched.set_timesteps(steps)
    z = noise.clone()
    for tau in sched.timesteps:
        eps = expert.net(z, torch.full((len(z),), float(tau)), cond)
        if kind == "ddpm":
            z = sched.step(eps, tau, z, generator=g).prev_sample
        else:
            z = sched.step(eps, tau, z, eta=1.0 if kind == "ddim1" else 0.0, generator=g).prev_sample
    return z


def _score(cluster_mix, members_global, ref, x: torch.Tensor, true: torch.Tensor, bandwidth: float) -> dict:
    x, y = x.double().flatten(1), true.double().flatten(1)
    if not torch.isfinite(x).all():
        return {"finite": False}
    lp, lp_true = cluster_mix.log_prob(x), cluster_mix.log_prob(y)
    comp = ref.mixture.component_of(x)
    return {
        "finite": True,
        "delta_log_p": float(lp.mean() - lp_true.mean()),
        "delta_log_p_median": float(lp.median() - lp_true.median()),
        "mmd2": mmd2(x, y, bandwidth),
        "in_cluster": float(torch.isin(comp, members_global).double().mean()),
    }


@torch.no_grad()
def ablation(cfg, ref, folders, clusters, per_prompt: int, seeds: int, steps: int) -> dict:
    C, S, _ = ref.shape
    options = _options(cfg)
    prior_rms = velocity_rms_prior(cfg.sampling.x0_variance)
    clamp = cfg.sampling.x0_clamp
    mono = load_eval_expert(folders["monolith"], {})
    out = {}
    for k in clusters:
        members = (ref.cluster_of == k).nonzero().squeeze(1)
        cluster_mix = ref.mixture.subset(members)
        fm = load_eval_expert(folders[f"cluster-{k}-fm"], {})
        ddpm_folder = folders[f"cluster-{k}-ddpm"]
        ddpm_meta = read_expert_meta(ddpm_folder)
        ddpm = {  # the FM-sibling cap needs an FM expert in the mix; the naive timestep is a profile row only
            name: load_eval_expert(ddpm_folder, o)
            for name, o in options.items()
            if o["cap"] != "sibling" and o["conversion"] == "schedule_aware"
        }
        bw = median_bandwidth(cluster_mix.sample(1000, torch.Generator().manual_seed(99))[0])
        res: dict[str, dict] = {}
        for caption in ("captions", "empty"):
            for seed in range(seeds):
                g = torch.Generator().manual_seed(10_000 * (k + 1) + seed)
                if caption == "captions":
                    comps = members.repeat_interleave(per_prompt)
                    true, _ = ref.mixture.sample(len(comps), g, components=comps)
                else:
                    true, _ = draw_x0(ref, members, len(members) * per_prompt, g)
                    comps = None
                n = len(true)
                cond = caption_cond(ref, comps, n)
                noise = torch.randn(n, C, S, S, generator=g)
                arms = {}
                arms["FM sibling"] = euler_sample(lambda x, t: fm.velocity(x, t, cond), noise, steps)
                arms["monolith"] = euler_sample(lambda x, t: mono.velocity(x, t, cond), noise, steps)
                for name, e in ddpm.items():
                    cap = options[name]["cap"]

                    def v(x, t, e=e, cap=cap):
                        out_v = e.velocity(x, t, cond)
                        if cap == "prior" and float(t[0]) > VSCALE_T:
                            out_v, _ = cap_velocity_rms(out_v, torch.full((len(x),), prior_rms))
                        return out_v

                    arms[f"DDPM {name}"] = euler_sample(v, noise, steps)
                e0 = ddpm["clamp"]
                for kind, label in (("ddpm", "DDPMScheduler ancestral"), ("ddim0", "DDIM η=0"), ("ddim1", "DDIM η=1")):
                    for clip in (True, False):
                        gn = torch.Generator().manual_seed(20_000 + seed)
                        arms[f"DDPM native {label}{' clip' if clip else ''}"] = _native(
                            e0, ddpm_meta, noise, cond, kind, clip, clamp, steps, gn
                        )
                for name, x in arms.items():
                    res.setdefault(caption, {}).setdefault(name, []).append(
                        _score(cluster_mix, members, ref, x, true, bw)
                    )
        out[str(k)] = _summarise(res)
        log.info("ablation: cluster %d done", k)
    return out


METRICS = ("delta_log_p", "delta_log_p_median", "mmd2", "in_cluster")


def _summarise(res: dict) -> dict:
    """Per caption set and arm: per-seed values, intervals over seeds, and the paired difference to the FM sibling."""
    out = {}
    for caption, arms in res.items():
        base = arms["FM sibling"]
        out[caption] = {}
        for name, runs in arms.items():
            entry = {"per_seed": runs, "finite_seeds": sum(r["finite"] for r in runs)}
            if all(r["finite"] for r in runs):
                entry["intervals"] = {m: interval([r[m] for r in runs]) for m in METRICS}
                entry["minus_fm"] = {m: interval([r[m] - b[m] for r, b in zip(runs, base)]) for m in METRICS}
            out[caption][name] = entry
    return out


# --------------------------------------------------------------------------------------------------------------
# output


def _range(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    f = lambda v: f"{v:.3g}"  # noqa: E731
    return f(lo) if f(lo) == f(hi) else f"{f(lo)}–{f(hi)}"


def profile_table(prof: dict, support: str) -> list[str]:
    names = list(next(iter(prof.values())))
    lines = ["| expert / option | " + " | ".join(f"{t:g}" for t in TIMES) + " |", "|---" * (len(TIMES) + 1) + "|"]
    for name in names:
        if support not in prof[next(iter(prof))][name]:
            continue
        cells = [_range([prof[k][name][support][i] for k in prof]) for i in range(len(TIMES))]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def ablation_table(abl: dict, caption: str) -> list[str]:
    lines = [
        "| cluster | arm | Δlog p mean | Δlog p median | MMD² ×10³ | in-cluster | Δlog p − FM (paired) | in-cluster − FM |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for k, per in abl.items():
        for name, e in per[caption].items():
            if "intervals" not in e:
                lines.append(
                    f"| {k} | {name} | non-finite on {len(e['per_seed']) - e['finite_seeds']} seeds | | | | | |"
                )
                continue
            iv, d = e["intervals"], e["minus_fm"]
            c = lambda x, s=1, f=".1f": f"{x['mean'] * s:{f}} ± {x['half'] * s:{f}}"  # noqa: E731
            lines.append(
                f"| {k} | {name} | {c(iv['delta_log_p'])} | {c(iv['delta_log_p_median'])} | {c(iv['mmd2'], 1e3, '.2f')} "
                f"| {c(iv['in_cluster'], 1, '.3f')} | {c(d['delta_log_p'])} | {c(d['in_cluster'], 1, '.3f')} |"
            )
    return lines


def plot(prof: dict, path: Path) -> None:
    """Excess error against t (log scale), on support, the mean over clusters of each row."""
    names = list(next(iter(prof.values())))
    pw, ph, m = 520, 320, 60
    img = Image.new("RGB", (pw + 2 * m + 230, ph + 2 * m + 20), "white")
    draw = ImageDraw.Draw(img)
    means = {n: np.mean([prof[k][n]["on"] for k in prof], axis=0) for n in names}
    lo, hi = -2.0, 3.0  # log10 range
    draw_axes(
        draw,
        (m, m, m + pw, m + ph),
        "t (index of the grid: " + ", ".join(f"{t:g}" for t in TIMES) + ")",
        "E|v - v*|^2 per dim (log10), on support, mean over clusters",
        [(i / (len(TIMES) - 1), f"{t:g}") for i, t in enumerate(TIMES)],
        [((v - lo) / (hi - lo), f"1e{v:g}") for v in range(int(lo), int(hi) + 1)],
    )
    for j, name in enumerate(names):
        ys = np.log10(np.clip(means[name], 10**lo, 10**hi))
        pts = [(m + i / (len(TIMES) - 1) * pw, m + ph - (y - lo) / (hi - lo) * ph) for i, y in enumerate(ys)]
        color = PALETTE[j % len(PALETTE)]
        draw.line(pts, fill=color, width=2)
        draw.text((m + pw + 10, m + 14 * j), name, fill=color)
    img.save(path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / ".cache" / "ddpm_profile"), help="experts (reused when present)")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--samples", type=int, default=512, help="x_t per cluster, t and support in the profile")
    p.add_argument("--per-prompt", type=int, default=64, help="ablation samples per caption (and ×4 empty)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads (the machine is shared)")
    p.add_argument("--skip-ablation", action="store_true")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    load0, start = os.getloadavg(), time.time()
    cfg = load_config(ROOT / "configs" / "reproduce-gmm.yaml")
    dataset = prepare_data(cfg, args.cache_dir)
    details = [c["detail"] for c in dataset.meta["clusters"]]
    clusters = [k for k, o in enumerate(config_for(cfg, 4).objective_of(details)) if o == "ddpm"]
    auto2 = [k for k, o in enumerate(config_for(cfg, 2).objective_of(details)) if o == "ddpm"]
    t0 = time.time()
    folders = train_or_reuse_all(cfg, dataset, Path(args.out), clusters, args.jobs)
    timings = {"training": round(time.time() - t0, 1)}
    ref = load_reference(dataset)
    t0 = time.time()
    prof = profile(cfg, ref, folders, clusters, args.samples, seed=0)
    timings["profile"] = round(time.time() - t0, 1)
    steps = cfg.evaluation.num_steps or cfg.sampling.num_steps
    lambdas = {}
    for k in clusters:
        tt = torch.tensor(TIMES, dtype=torch.float64)
        lambdas[str(k)] = {
            kind: load_eval_expert(
                folders[f"cluster-{k}-ddpm"], cfg.sampling.conversion_options() | {"clean_estimate": kind}
            )
            .shrink_lambda(tt)
            .tolist()
            for kind in ("shrink", "shrink_naive")
        }
    out = {
        "command": "python " + " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {args.threads} torch "
        "threads, shared with other processes (load below)",
        "load_average": {"start": load0},
        "timings_s": timings,
        "trained": folders.pop("trained"),
        "config": "configs/reproduce-gmm.yaml",
        "clusters": clusters,
        "auto_2ddpm_clusters": auto2,
        "times": list(TIMES),
        "samples": args.samples,
        "euler_steps": steps,
        "seeds": args.seeds,
        "per_prompt": args.per_prompt,
        "lambda": lambdas,
        "profile": prof,
        "ablation": None,
    }
    write(out, start)  # the profile first: the ablation takes longer
    if not args.skip_ablation:
        t0 = time.time()
        out["ablation"] = ablation(cfg, ref, folders, clusters, args.per_prompt, args.seeds, steps)
        timings["ablation"] = round(time.time() - t0, 1)
        write(out, start)


def write(out: dict, start: float) -> None:
    out["seconds"] = round(time.time() - start, 1)
    out["load_average"]["end"] = os.getloadavg()
    load0, clusters, prof, abl = out["load_average"]["start"], out["clusters"], out["profile"], out["ablation"]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "ddpm_profile.json").write_text(json.dumps(out, indent=1))
    plot(prof, RESULTS / "ddpm_profile.png")
    lines = [
        f"`{out['command']}` on {out['date']}, {out['machine']}, {out['seconds']} s "
        f"(load {load0[0]:.1f} at start, {out['load_average']['end'][0]:.1f} at the end), config "
        f"`configs/reproduce-gmm.yaml`, clusters {clusters} (4DDPM:4FM's auto; 2DDPM:6FM's auto: "
        f"{out['auto_2ddpm_clusters']}), {out['samples']} x_t per cluster, t and support",
        "",
        "## Excess error E‖v̂ − v*‖² per dimension, on support (the cluster's x_t and captions), range over clusters",
        "",
        *profile_table(prof, "on"),
        "",
        "## Off support: other clusters' x_t, weighted by the exact p(k | x_t, t) (what full routing adds)",
        "",
        *profile_table(prof, "off"),
        "",
        "## lambda(t) of the shrink options, per cluster",
        "",
        "| cluster | option | " + " | ".join(f"{t:g}" for t in TIMES) + " |",
        "|---" * (len(TIMES) + 2) + "|",
    ]
    for k, lam in out["lambda"].items():
        for name, values in lam.items():
            lines.append(f"| {k} | {name} | " + " | ".join(f"{v:.3f}" for v in values) + " |")
    if abl is not None:
        for caption in ("captions", "empty"):
            lines += [
                "",
                f"## Oracle-routed, each expert alone, {caption} ({out['euler_steps']} steps; ± = 95 % Student-t "
                f"over {out['seeds']} sampling seeds of one training; differences paired by seed)",
                "",
                *ablation_table(abl, caption),
            ]
    (RESULTS / "ddpm_profile.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
