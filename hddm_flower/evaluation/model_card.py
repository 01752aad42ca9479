"""Model cards (``README.md``) for a run directory and each of its expert folders, written from ``report.json``.

A card says what the folder is, how it was trained (objective, cluster, steps, images seen, device-hours), how to
sample it (with :class:`~hddm_flower.hddm_pipeline.HDDMPipeline`, the ``hddm`` command line, or one expert with
diffusers' own scheduler from its ``scheduler_config.json``), and where its training data came from under which
licence. The front matter is the Hugging Face model-card metadata block.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..rundir import MODEL_CARD as README
from ..rundir import expert_dir
from ..safeio import write_atomic

CODE_LICENSE = "apache-2.0"  # the code; the weights are trained on the dataset named in each card
DATA_LICENSES = {"twemoji": "cc-by-4.0"}  # Hugging Face licence ids of the data the weights are derived from


def _front_matter(license_id: str, tags: list[str]) -> list[str]:
    return ["---", f"license: {license_id}", "library_name: diffusers", "pipeline_tag: text-to-image", "tags:"] + [
        f"- {t}" for t in tags
    ] + ["---", ""]  # fmt: skip


def _hours(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds / 3600:.3f}"


def _categories(cluster: dict, n: int = 3) -> str:
    return ", ".join(list(cluster.get("categories", {}))[:n]) or "–"


def _time_sampling(ts: dict) -> str:
    if ts.get("kind") == "logit_normal":
        return f"logit-normal, t = sigmoid({ts.get('mean')} + {ts.get('std')}·z), z ~ N(0, 1)"
    return "uniform on (0, 1)"


def _objective(e: dict) -> str:
    return "Flow Matching (velocity ε − x0)" if e["objective"] == "fm" else f"DDPM ε-prediction ({e.get('schedule')})"


def _data_section(record: dict) -> list[str]:
    return [
        "## Training data and licence",
        "",
        f"- Data: {record['name']} (version {record.get('version')}), {record.get('num_images')} images at "
        f"{record.get('image_size')}² ({record.get('cluster_features')}).",
        f"- Data licence and attribution: {record.get('license', 'not recorded')}. The weights are derived from "
        "these images; keep this attribution when you share them or their samples.",
        f"- Captions encoded by {record.get('text_encoder')} (see `text_encoder.json`).",
        "- Code: hddm-flower, Apache-2.0.",
        "",
    ]


def run_card(report: dict) -> str:
    """The run directory's card: the ensemble, its experts and router, how to sample, data and licence."""
    d, experts = report["dataset"], report["experts"]
    clusters = {c["id"]: c for c in d["clusters"]}
    license_id = DATA_LICENSES.get(d["name"], "other")
    s = report["metrics"].get("sampling", {})
    ev = report["metrics"].get("evaluation") or {}
    lines = _front_matter(license_id, ["hddm-flower", "flower", "federated-learning", "flow-matching", "ddpm"])
    lines += [
        f"# HDDM ensemble: {len(experts)} of {report['num_experts']} experts on {d['name']}",
        "",
        "A heterogeneous decentralized diffusion model (HDDM): each expert was trained in isolation on one data "
        "cluster with its own objective (DDPM ε-prediction or Flow Matching), a router weighs the experts at every "
        "step from the noisy sample and the time, and DDPM experts are converted into the Flow-Matching velocity "
        "space without retraining. Sampling is FM Euler from t = 1 (noise) to t = 0 with classifier-free guidance "
        "per expert before mixing.",
        "",
        "| expert | objective | cluster (top categories) | steps | images seen | device-hours | folder |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in experts:
        c = clusters.get(e["cluster_id"], {})
        lines.append(
            f"| {e['expert_id']} | {_objective(e)} | {e['cluster_id']} ({_categories(c)}) | {e['steps']} "
            f"| {e['images_seen']} | {_hours(e.get('device_seconds'))} | `experts/expert-{e['expert_id']}` |"
        )
    if report.get("missing"):
        lines += ["", "Missing experts: " + "; ".join(f"{m['expert_id']} ({m['reason']})" for m in report["missing"])]
    router = report.get("router", {})
    dropped = sum(map(len, (router.get("dropped_replies") or {}).values()))
    how = (
        f", trained federatedly in {router['rounds']} rounds over {len(router['nodes'])} nodes"
        f" ({dropped} replies dropped, named in `report.md`)"
        if router.get("training") == "federated"
        else ""
    )
    lines += [
        "",
        f"Router: `router/` (a DiT-style classifier on (x_t, t) only{how}). Feature network: `feature_net/` (the "
        "run's own classifier, the features of its FID/KID).",
        "",
        "## Sampling",
        "",
        "```python",
        "from hddm_flower.hddm_pipeline import HDDMPipeline",
        "",
        'pipe = HDDMPipeline.from_pretrained("path/to/this/folder")',
        f'image = pipe("{(s.get("prompts") or ["red apple"])[0]}", num_inference_steps={s.get("num_steps", 50)}, '
        f"guidance_scale={s.get('cfg_scale', 7.5)}).images[0]",
        "```",
        "",
        f"The defaults (`model_index.json` → `sampling`) are the run's: {s.get('num_steps')} steps, CFG "
        f'{s.get("cfg_scale")}, routing {s.get("routing")} (k = {s.get("top_k")}). Also `routing="full"`, '
        '`"threshold"`, `"sample"`; `output_type="pil" | "np" | "pt" | "latent"`. '
        "`HDDMPipeline.from_pretrained` runs no code from the folder: it reads `model_index.json`, checks that "
        "its components are the classes a run holds (experts, a router over as many experts, the feature "
        "network), loads weights from safetensors only and names any missing expert. Diffusers' generic route, "
        '`DiffusionPipeline.from_pretrained(folder, custom_pipeline="pipeline", trust_remote_code=True)`, '
        "*executes* the folder's `pipeline.py`: with a folder someone else wrote, that is their code running "
        "with your rights. Use `hddm_flower.hddm_pipeline.load_with_diffusers(folder)` for that route: it "
        "refuses a `pipeline.py` that is missing or is not the one this package writes. From the command line: "
        '`hddm sample --run-dir FOLDER --prompt "red apple"` (the run\'s `config.yaml`; `--set` overrides it).',
        "",
        "Each expert also samples on its own with diffusers' schedulers: see the card in its folder.",
        "",
    ]
    if ev.get("modes"):
        lines += [
            f"## Evaluation (features: {ev.get('feature_network')})",
            "",
            "| routing | FID ↓ | KID ↓ |",
            "|---|---|---|",
        ] + [
            f"| {m} | {x['fid']:.2f} | {'–' if x['kid'] is None else format(x['kid'], '.4f')} |"
            for m, x in ev["modes"].items()
        ]
        lines += ["", "Values compare only with runs that share the feature network; details in `report.md`.", ""]
    return "\n".join(lines + _data_section(d))


def expert_card(report: dict, expert: dict) -> str:
    """One expert folder's card: what it is, how it was trained, how to sample it with diffusers alone."""
    d = report["dataset"]
    c = {c["id"]: c for c in d["clusters"]}.get(expert["cluster_id"], {})
    fm = expert["objective"] == "fm"
    lines = _front_matter(DATA_LICENSES.get(d["name"], "other"), ["hddm-flower", "pixart", expert["objective"]])
    lines += [
        f"# HDDM expert {expert['expert_id']}: {_objective(expert)}",
        "",
        f"A PixArt-α AdaLN-Single transformer (preset `{expert.get('preset')}`) trained in isolation on cluster "
        f"{expert['cluster_id']} of {d['name']} ({c.get('size', '?')} images; {_categories(c)}), one expert of an "
        "HDDM ensemble (the run's card is in the folder two levels up).",
        "",
        f"- Objective: {_objective(expert)}; time convention in `hddm_expert.json` → `time`.",
        f"- Steps: {expert['steps']}, images seen: {expert['images_seen']}, device-hours: "
        f"{_hours(expert.get('device_seconds'))} on {expert.get('device', '?')}; EMA weights: {expert.get('ema')}"
        + (f"; training times: {_time_sampling(expert['time_sampling'])}." if expert.get("time_sampling") else "."),
        f"- Weights sha256: `{expert.get('sha256', '?')}`.",
        "",
        "## Sampling with diffusers alone",
        "",
        "Text states: the encoder named in `text_encoder.json`, per-token `last_hidden_state` × attention mask, "
        "padded to its `max_length`; the empty caption's states (for guidance) are in `uncond.safetensors`.",
        "",
        "```python",
        "import numpy as np, torch",
        "from diffusers import " + ("FlowMatchEulerDiscreteScheduler" if fm else "DDPMScheduler")
        + ", PixArtTransformer2DModel",
        "",
        'net = PixArtTransformer2DModel.from_pretrained("path/to/this/folder")',
    ]  # fmt: skip
    if fm:
        lines += [
            'scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained("path/to/this/folder")  # timestep = 999·t',
            "n = 50",
            "scheduler.set_timesteps(sigmas=np.linspace(1, 0, n + 1)[:-1])  # the project's grid t = 1 … 1/n, then 0",
        ]
    else:
        lines += [
            'scheduler = DDPMScheduler.from_pretrained("path/to/this/folder")  # its schedule, ε, clip_sample',
            "scheduler.set_timesteps(50)",
        ]
    lines += [
        "x = torch.randn(1, net.config.in_channels, net.config.sample_size, net.config.sample_size)",
        "for t in scheduler.timesteps:",
        "    out = net(x, encoder_hidden_states=states, encoder_attention_mask=mask, timestep=t.expand(1),",
        '              added_cond_kwargs={"resolution": None, "aspect_ratio": None}).sample',
        "    x = scheduler.step(out, t, x).prev_sample",
        "```",
        "",
    ]
    if fm:
        lines += [
            "With this grid diffusers' Euler steps reproduce the project's sampler (tested to 1e-5). The output "
            "is the velocity ε − x0; the model is not a `v_prediction` model.",
            "",
        ]
    else:
        lines += [
            "Keep `clip_sample` on (the clean estimate clipped to the data range, `clip_sample_range`): without it "
            "the ancestral sampler of a small ε-model drifts out of range at the noisiest steps. In the ensemble "
            "this expert is converted into the Flow-Matching velocity space (SNR-matched timestep, input rescaled).",
            "",
        ]
    return "\n".join(lines + _data_section(d))


def write_model_cards(run_dir: str | os.PathLike, report: dict[str, Any]) -> None:
    """``README.md`` in the run directory and in every present expert folder."""
    run_dir = Path(run_dir)
    write_atomic(run_dir / README, run_card(report))
    for e in report["experts"]:
        folder = expert_dir(run_dir, e["expert_id"])
        if folder.is_dir():
            write_atomic(folder / README, expert_card(report, e))
