"""The report of a run: ``report.json``, ``report.md``, the sample grids and the plots (PIL only).

The evaluation computes numbers and images; this module lays them out. File names come from
:mod:`hddm_flower.rundir`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch import Tensor

from ..config.schema import Config
from ..data import Dataset
from ..provenance import now, source, versions
from ..rundir import REPORT_JSON, REPORT_MD
from ..safeio import write_atomic
from .model_card import write_model_cards


def save_grid(images: torch.Tensor, rows: int, path: Path, scale: int = 4) -> None:
    """Save images in [−1, 1] as one PNG grid (``rows`` rows), upscaled with nearest neighbours."""
    x = _to_uint8(images)
    n, h, w, c = x.shape
    cols = n // rows
    pad = 2
    grid = np.full((rows * (h + pad) + pad, cols * (w + pad) + pad, c), 255, np.uint8)
    for i in range(n):
        r, col = divmod(i, cols)
        grid[pad + r * (h + pad) : pad + r * (h + pad) + h, pad + col * (w + pad) : pad + col * (w + pad) + w] = x[i]
    img = Image.fromarray(grid)
    img.resize((img.width * scale, img.height * scale), Image.NEAREST).save(path)


def write_report(
    cfg: Config, run_dir: Path, dataset: Dataset, metas: list[dict], missing: list[dict], metrics: dict, extra: dict
) -> dict:
    """Write ``report.json`` (machine-readable) and ``report.md`` into ``run_dir``; returns the report."""
    dataset_meta = dataset.meta
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
        "time_sampling",
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
        "created_at": now(),
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
        "source": source(),
        **extra,
    }
    write_atomic(run_dir / REPORT_JSON, json.dumps(report, indent=2))
    write_atomic(run_dir / REPORT_MD, render_report_md(report))
    write_model_cards(run_dir, report)
    return report


def federated_router_lines(x: dict) -> list[str]:
    """The federated router's rounds in report.md: strategy, rounds, nodes, bytes, and every dropped reply with
    its round and reason (never averaged)."""
    dropped = x.get("dropped_replies") or {}
    lines = [
        f"Router: trained federatedly ({x['strategy']}, {x['rounds']} rounds over {len(x['nodes'])} nodes, "
        f"{x['bytes_sent'] + x['bytes_received']} bytes); "
        + (f"{sum(map(len, dropped.values()))} replies dropped, not averaged:" if dropped else "no reply dropped.")
    ]
    if dropped:
        lines += [""] + [f"- round {rnd}: {why}" for rnd, whys in dropped.items() for why in whys]
    return lines


def _fmt(x: Any, spec: str = ".3f") -> str:
    return "–" if x is None else format(x, spec)


def _kid(x: dict) -> str:
    return "–" if x.get("kid") is None else f"{x['kid']:.4f} ± {x['kid_std']:.4f}"


def render_report_md(r: dict) -> str:
    """The markdown of a report (``report.md``): experts, routing modes, diagnostics, samples."""
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
        cats = ", ".join(list(clusters.get(e["cluster_id"], {}).get("categories", ["(not a cluster of the data)"]))[:2])
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
    if r.get("router", {}).get("training") == "federated":
        lines += ["", *federated_router_lines(r["router"])]
    if ev:
        p = ev["protocol"]
        lines += [
            "",
            f"## Routing modes (aligned inference: {p['prompts']} prompts × {p['samples_per_prompt']} "
            f"samples, same noise, {p['num_steps']} steps, CFG {p['cfg_scale']}, seed {p['seed']})",
            "",
            f"- FID/KID features: **{ev['feature_network']}** (weights fingerprint "
            f"`{ev.get('feature_fingerprint') or '–'}`); reference: {p['reference']}",
            f"- adherence: the fraction of samples that {ev.get('adherence_classifier', 'the feature classifier')} "
            "puts in the cluster of their prompt's image",
            f"- diversity: {ev['diversity_distance']}",
            "",
            "| routing | FID ↓ | KID ↓ | adherence ↑ | intra-prompt diversity ↑ | CLIP ↑ | experts per step "
            "| x̂0 clamps | 1−t<t_eps rows | s |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for mode, x in ev["modes"].items():
            c = x["clamps"]
            clamps = f"{c['x0_clamp_elements'] / c['elements']:.2%}" if c.get("elements") else "–"
            eps_rows = f"{c['t_eps_rows']}/{c['rows']}" if c.get("rows") else "–"
            clip = _fmt(x["clip_score"]["value"], ".2f") if "clip_score" in x else "–"
            lines.append(
                f"| {mode} | {x['fid']:.2f} | {_kid(x)} | {_fmt(x.get('adherence'), '.3f')} | {x['lpips']['mean']:.3f}"
                f" ± {x['lpips']['std']:.3f} | {clip} | {sum(x['usage']):.2f} | {clamps} | {eps_rows} "
                f"| {x['seconds']:.0f} |"
            )
        if "floor" in ev:  # stratified prompts: real images at the samples' count, against the same reference
            f = ev["floor"]
            lines.append(
                f"| real images (floor: {f['num_samples']}, the samples' count per cluster) | {f['fid']:.2f} "
                f"| {_kid(f)} | – | – | – | – | – | – | – |"
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
        lines.append(f"| {key} | " + " | ".join(_fmt(x) for x in m[key]) + " |")
    lines += [f"- {what}: {why}" for what, why in m.get("skipped", {}).items()]
    s = m["sampling"]
    a = s.get("adherence")
    rows = "rows are the prompts" + (
        f", with their adherence (the fraction of a row's samples that {a['classifier']} puts in the cluster of "
        f"the prompt's image; mean {_fmt(a['mean'], '.3f')})"
        if a
        else ""
    )
    lines += [
        "",
        f"Samples ({s['sampler']}; {s['num_steps']} steps, CFG {s['cfg_scale']}, routing {s['routing']}"
        f" k={s['top_k']}, conversion {s['conversion']}); {rows}:",
        "",
    ]
    if a:
        lines += [
            f"{i + 1}. {p}: {_fmt(x, '.3f')} (cluster {', '.join(map(str, k)) or 'none: not a caption'})"
            for i, (p, x, k) in enumerate(zip(s["prompts"], a["per_prompt"], a["clusters"]))
        ]
    else:
        lines += [f"{i + 1}. {p}" for i, p in enumerate(s["prompts"])]
    lines += ["", f"![samples]({s['grid']})", ""]
    return "\n".join(lines)


PALETTE = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
]


def _to_uint8(images: Tensor) -> np.ndarray:
    return ((images.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()


def save_prompt_grids(samples: dict[str, Tensor], captions: list[str], folder: Path, scale: int = 4) -> list[dict]:
    """One PNG per prompt: a row per routing mode (labelled), the prompt's samples across."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for p, caption in enumerate(captions):
        rows = {mode: _to_uint8(x[p]) for mode, x in samples.items()}
        S, h, w, c = next(iter(rows.values())).shape
        label_w, pad = 80, 2
        W, H = label_w + S * (w * scale + pad), 16 + len(rows) * (h * scale + pad)
        img = Image.new("RGB", (W, H), "white")
        draw = ImageDraw.Draw(img)
        draw.text((2, 2), caption[:80], fill="black")
        for r, (mode, x) in enumerate(rows.items()):
            y = 16 + r * (h * scale + pad)
            draw.text((2, y + h * scale // 2 - 5), mode, fill="black")
            for j in range(S):
                tile = Image.fromarray(x[j].squeeze(-1) if c == 1 else x[j]).resize(
                    (w * scale, h * scale), Image.NEAREST
                )
                img.paste(tile, (label_w + j * (w * scale + pad), y))
        name = f"prompt-{p:02d}-{re.sub(r'[^a-z0-9]+', '-', caption.lower()).strip('-')[:40]}.png"
        img.save(folder / name)
        out.append({"prompt": caption, "file": f"{folder.name}/{name}"})
    return out


def draw_axes(draw: ImageDraw.ImageDraw, box, xlabel: str, ylabel: str, xticks, yticks) -> None:
    x0, y0, x1, y1 = box
    draw.rectangle(box, outline="black")
    for v, label in xticks:
        x = x0 + v * (x1 - x0)
        draw.line([(x, y1), (x, y1 + 4)], fill="black")
        draw.text((x - 8, y1 + 6), label, fill="black")
    for v, label in yticks:
        y = y1 - v * (y1 - y0)
        draw.line([(x0 - 4, y), (x0, y)], fill="black")
        draw.text((x0 - 34, y - 5), label, fill="black")
    draw.text(((x0 + x1) // 2 - 40, y1 + 20), xlabel, fill="black")
    draw.text((4, y0 - 14), ylabel, fill="black")


def plot_router_weights(modes: dict[str, dict], num_experts: int, path: Path) -> str:
    """One panel per routing mode: the mean mixing weight of each expert against t (t = 1 noise on the left)."""
    pw, ph, m = 300, 200, 50
    img = Image.new("RGB", (len(modes) * (pw + m + 10) + m, ph + 2 * m + 40), "white")
    draw = ImageDraw.Draw(img)
    for i, (mode, r) in enumerate(modes.items()):
        x0, y0 = m + i * (pw + m + 10), m
        box = (x0, y0, x0 + pw, y0 + ph)
        draw_axes(
            draw, box, "t (1 = noise)", "", [(0, "1"), (0.5, "0.5"), (1, "0")], [(0, "0"), (0.5, "0.5"), (1, "1")]
        )
        draw.text((x0 + 4, y0 - 14), f"{mode}: mean weight", fill="black")
        ts, w = r["times"], np.array(r["mean_weight"])
        for k in range(num_experts):
            pts = [(x0 + (1 - t) * pw, y0 + ph - w[j, k] * ph) for j, t in enumerate(ts)]
            if len(pts) > 1:
                draw.line(pts, fill=PALETTE[k % len(PALETTE)], width=2)
    for k in range(num_experts):
        draw.text((m + k * 60, ph + 2 * m + 20), f"expert {k}", fill=PALETTE[k % len(PALETTE)])
    img.save(path)
    return path.name


def plot_usage(modes: dict[str, dict], num_experts: int, path: Path) -> str:
    """Grouped bars: for each expert, the fraction of (sample, step) pairs on which it ran, per routing mode."""
    bw, gap, ph, m = 10, 14, 200, 50
    group = len(modes) * bw + gap
    img = Image.new("RGB", (m + num_experts * group + 2 * m, ph + 2 * m + 40), "white")
    draw = ImageDraw.Draw(img)
    box = (m, m, m + num_experts * group, m + ph)
    draw_axes(
        draw,
        box,
        "expert",
        "fraction of (sample, step) pairs evaluated",
        [((k + 0.5) / num_experts, str(k)) for k in range(num_experts)],
        [(0, "0"), (0.5, "0.5"), (1, "1")],
    )
    for i, (mode, r) in enumerate(modes.items()):
        for k, u in enumerate(r["usage"]):
            x = m + k * group + gap // 2 + i * bw
            draw.rectangle((x, m + ph - u * ph, x + bw - 2, m + ph), fill=PALETTE[i % len(PALETTE)])
        draw.text((m + i * 70, ph + 2 * m + 20), mode, fill=PALETTE[i % len(PALETTE)])
    img.save(path)
    return path.name
