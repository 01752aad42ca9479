"""Evaluating an assembled run: every routing mode under aligned inference, per-expert quality, router accuracy.

Aligned inference (the paper's comparisons): every routing mode samples the same held-out prompts from the same
noise with the same sampler, steps and CFG. For each mode: FID and KID against the dataset's images (features of
the configured network, named and fingerprinted in every result; with ``evaluation.prompt_sampling: stratified`` the
prompts are the same number per cluster, the reference has their cluster mix and a real-vs-real floor is scored
beside the modes), intra-prompt diversity (LPIPS, or the named fallback), CLIP score
when a CLIP folder is configured, how often the DDPM → velocity conversion's guards fired, the router's mixing
weights over t and each expert's usage. Per expert: the expert alone on captions of its own cluster, against that
cluster's images. Outputs go to the run directory: PNG grids per prompt (rows: routing modes) and PNG plots, drawn by
:mod:`hddm_flower.evaluation.report`.

Its length is one protocol: the prompts, every routing mode's sampling, the feature network, the (stratified)
reference with its floor and the per-expert quality share the same prompts, noise and reference, so they are read in
one place.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..config.rules import ConfigError
from ..config.schema import Config
from ..counts import read_counts
from ..data import Dataset
from ..devices import autocast, resolve_device
from ..ensemble import Ensemble, euler_sample, routing_weights, sample_ensemble
from ..experts import DDPMExpert, map_cond
from ..models import TextCond, router_conditioning
from ..rundir import EXPERT_USAGE_PLOT, FEATURE_NET, GRIDS, ROUTER_WEIGHTS_PLOT
from ..text import pooled_caption
from . import metrics as M
from .adherence import classify
from .feature_sums import FeatureSums, frechet_distance_from_sums
from .reference import DEFAULT_KID_RESERVOIR, ReferenceStats, leave_out, matched_reference, pooled, reference_statistics
from .report import plot_router_weights, plot_usage, save_prompt_grids

log = logging.getLogger(__name__)


VSCALE_SUFFIX = "+vscale"


def parse_mode(mode: str) -> dict[str, Any]:
    """``top2`` → ``{"routing": "top_k", "k": 2}``; ``full``, ``threshold``, ``sample``, ``oracle`` as they are.

    A ``+vscale`` suffix (``top2+vscale``) turns the adaptive velocity scaling of converted DDPM velocities on
    for that mode (``"velocity_scaling": True``; its threshold and prior from ``sampling``): the ablation of that
    option next to the same mode without it. Without the suffix a mode samples as ``sampling.velocity_scaling``
    says."""
    base, vscale = (mode[: -len(VSCALE_SUFFIX)], True) if mode.endswith(VSCALE_SUFFIX) else (mode, False)
    extra = {"velocity_scaling": True} if vscale else {}
    m = re.fullmatch(r"top(\d+)", base)
    if m and int(m.group(1)) >= 1:
        return {"routing": "top_k", "k": int(m.group(1))} | extra
    if base in ("full", "threshold", "sample", "oracle"):
        return {"routing": base} | extra
    raise ValueError(
        f"unknown routing mode {mode!r}; expected top1, top2, …, full, threshold, sample or oracle, "
        f"optionally with {VSCALE_SUFFIX}"
    )


@dataclass
class Prompts:
    """Held-out captions with their text states and the cluster of the image they describe (for oracle)."""

    captions: list[str]
    cond: TextCond
    labels: Tensor


def choose_prompts(dataset: Dataset, n: int, seed: int, clusters: list[int] | None = None) -> Prompts:
    """``n`` distinct captions, held-out ones first (then training ones if the validation split is short), from
    seeded caption streams (:meth:`~hddm_flower.data.Dataset.captions`): only as many samples are read as it takes
    to find them, and no image. The streams' shuffle buffers hold ``n`` captions in all: the split is selected before
    the buffer, so a buffer that must fill with held-out captions would read the whole dataset."""
    picked: dict[str, tuple] = {}
    for split in ("val", "train"):
        for caption, states, mask, k in dataset.captions(clusters, split=split, seed=seed, shuffle_buffer=n):
            if len(picked) >= n:
                break
            picked.setdefault(caption, (states, mask, k))
    if not picked:
        raise ValueError(f"no captions in clusters {clusters} of {dataset.root}")
    rows = list(picked.values())
    return Prompts(
        list(picked),
        TextCond(
            torch.from_numpy(np.stack([r[0] for r in rows])), torch.from_numpy(np.stack([r[1] for r in rows])).float()
        ),
        torch.tensor([r[2] for r in rows]),
    )


def stratified_prompts(dataset: Dataset, n: int, seed: int) -> Prompts:
    """``n / K`` captions of each of the dataset's K clusters, cluster by cluster (each as :func:`choose_prompts`:
    distinct, held-out first, from the cluster's seeded caption stream): ``evaluation.prompt_sampling: stratified``.

    Why: prompts drawn over all captions give each seed its own cluster mix, and a row's FID against a fixed
    reference moves with that mix, for every row of the seed alike; the paired differences cancel it, the rows' own
    values do not.
    With the same number per cluster every seed has one mix, and every cluster, i.e. every expert, counts equally. The
    reference is weighted to that mix (:func:`~hddm_flower.evaluation.reference.matched_reference`). A prompt-matched reference
    (the prompts' own images) was not chosen: a caption of these datasets has one or a few images, so 32 prompts
    would give about 32 reference images, fewer than the features' dimensions (FID's covariance is singular); the
    prompts' clusters keep the reference's mix equal to the samples' with each cluster's hundreds of images."""
    k = dataset.num_clusters
    if n % k:
        raise ValueError(f"evaluation.num_prompts: {n} prompts cannot be split equally among {k} clusters")
    parts = [choose_prompts(dataset, n // k, seed, clusters=[c]) for c in range(k)]
    short = {c: len(p.captions) for c, p in enumerate(parts) if len(p.captions) < n // k}
    if short:
        raise ValueError(f"stratified prompts: {n // k} captions per cluster asked, clusters {short} have fewer")
    return Prompts(
        [c for p in parts for c in p.captions],
        TextCond(torch.cat([p.cond.states for p in parts]), torch.cat([p.cond.mask for p in parts])),
        torch.cat([p.labels for p in parts]),
    )


def config_prompts(cfg: Config, dataset: Dataset) -> Prompts:
    """The evaluation's prompts when the coordinator holds no caption: the first ``evaluation.num_prompts`` of
    ``sampling.prompts``, encoded by the coordinator's text encoder (the one the nodes declared). No cluster is
    known for them (label −1: oracle routing is not available)."""
    from ..text import TextEncoder

    captions = list(dict.fromkeys(cfg.sampling.prompts))[: cfg.evaluation.num_prompts]
    cond, _ = TextEncoder(cfg.data.text_encoder or None, max_length=dataset.max_caption_tokens).encode(captions)
    return Prompts(captions, cond, torch.full((len(captions),), -1))


class _TracedRouter(nn.Module):
    """Passes the router through and keeps the posterior it produced at every call, with the time."""

    def __init__(self, router: nn.Module, present: Tensor):
        super().__init__()
        self.inner, self.present, self.trace, self.labels = router, present, [], None
        self.conditioning = router_conditioning(router)

    def forward(self, x_t: Tensor, t: Tensor, *caption: Tensor) -> Tensor:
        logits = self.inner(x_t, t, *caption)
        probs = logits.float().masked_fill(~self.present, float("-inf")).softmax(-1)
        self.trace.append((t[0].detach(), probs.detach(), self.labels))  # no host sync while sampling
        return logits


def _ddpm_experts(experts) -> list[DDPMExpert]:
    return [e for e in experts if isinstance(e, DDPMExpert)]


@torch.no_grad()
def sample_mode(
    ensemble: Ensemble,
    mode: str,
    prompts: Prompts,
    uncond: TextCond,
    *,
    samples_per_prompt: int,
    num_steps: int,
    cfg_scale: float,
    threshold: float,
    seed: int,
    batch_size: int = 256,
    progress: bool = False,
    consume: Callable[[Tensor], None] | None = None,
) -> tuple[Tensor | None, dict]:
    """Samples (P, S, C, H, W) of one routing mode, plus its trace: mean mixing weight and usage per expert and
    step, and the conversion's clamp counts. The noise depends only on ``seed``: every mode sees the same.
    ``consume``: each batch of samples (rows prompt-major, S per prompt) is handed to it as it is generated and
    not kept (then None is returned in place of the samples)."""
    spec = parse_mode(mode)
    experts = {int(k): e for k, e in ensemble.experts.items()}
    traced = _TracedRouter(ensemble.router, ensemble.present)
    scaling = ensemble.velocity_scaling
    if spec.get("velocity_scaling"):
        scaling = dataclasses.replace(scaling, mode="fm_rms")
    ens = Ensemble(
        experts,
        traced,
        ensemble.num_experts,
        routing=spec["routing"],
        k=spec.get("k", 1),
        threshold=threshold,
        velocity_scaling=scaling,
        handover_t=ensemble.handover_t,
        mixed_precision=ensemble.mixed_precision,
    ).to(ensemble.device)
    P, S = len(prompts.captions), samples_per_prompt
    cfg = ensemble.router.config
    noise = torch.randn(
        P * S, cfg.in_channels, cfg.sample_size, cfg.sample_size, generator=torch.Generator().manual_seed(seed)
    )
    cond = map_cond(lambda c: c.repeat_interleave(S, 0), prompts.cond)
    labels = prompts.labels.repeat_interleave(S, 0)
    counts = {}
    for e in _ddpm_experts(experts.values()):
        e.clamp_counts = counts
    ens.handover_counts = {} if ens.handover_t < 1 else None
    g = torch.Generator().manual_seed(seed + 1)  # for routing mode "sample"
    start, out = time.perf_counter(), []
    try:
        for i in tqdm(range(0, P * S, batch_size), desc=f"sampling {mode}", disable=not progress):
            rows = slice(i, i + batch_size)
            n = len(noise[rows])
            traced.labels = labels[rows]
            un = TextCond(uncond.states.expand(n, -1, -1), uncond.mask.expand(n, -1))
            batch = sample_ensemble(
                ens,
                noise[rows],
                map_cond(lambda c: c[rows], cond),
                un,
                num_steps=num_steps,
                cfg_scale=cfg_scale,
                labels=labels[rows],
                generator=g,
            )
            if consume is None:
                out.append(batch)
            else:
                consume(batch)
    finally:
        for e in _ddpm_experts(experts.values()):
            e.clamp_counts = None
    seconds = time.perf_counter() - start
    # the router's posterior per step → mixing weights of this mode (sample mode: expected weights)
    steps = {}
    for t, probs, chunk_labels in traced.trace:
        t, probs = float(t), probs.cpu()  # the trace stayed on the device while sampling
        if spec["routing"] == "sample":
            w = probs
        else:
            w = routing_weights(
                probs.double(), spec["routing"], k=spec.get("k", 1), threshold=threshold, labels=chunk_labels
            )
        steps.setdefault(round(t, 6), []).append((w.sum(0), (w > 0).double().sum(0), len(w)))
    times = sorted(steps, reverse=True)
    weights = [(sum(s[0] for s in steps[t]) / sum(s[2] for s in steps[t])).tolist() for t in times]
    usage = [(sum(s[1] for s in steps[t]) / sum(s[2] for s in steps[t])).tolist() for t in times]
    trace = {
        "times": times,
        "mean_weight": weights,
        "usage": np.mean(usage, axis=0).tolist(),  # fraction of (row, step) pairs each expert evaluated
        "clamps": read_counts(counts),  # the device counts, read once for the whole mode
        "handover": read_counts(ens.handover_counts),
        "seconds": round(seconds, 2),
    }
    return (torch.cat(out).reshape(P, S, *noise.shape[1:]) if consume is None else None), trace


class StreamedSamples:
    """One mode's samples consumed batch by batch as :func:`sample_mode` generates them (rows prompt-major,
    ``samples_per_prompt`` per prompt): each batch is decoded to pixels and featurised, and only what the metrics
    and the grids need is kept: the features (N, d), the adherence hits, each prompt's diversity once its samples
    are in (at most S − 1 images carried to the next batch), the CLIP scores, and the pixels of the first
    ``grid_prompts`` prompts (``grid``, (G, S, C, H, W))."""

    def __init__(
        self,
        fx,
        classifier,
        distance,
        prompts: Prompts,
        samples_per_prompt: int,
        grid_prompts: int,
        *,
        decode=None,
        labels: bool = True,
        clip: M.ClipScorer | None = None,
    ):
        self.fx, self.classifier, self.distance, self.decode = fx, classifier, distance, decode
        self.prompts, self.S, self.G, self.labels, self.clip = prompts, samples_per_prompt, grid_prompts, labels, clip
        self.rows, self.hits, self.feats, self.per_prompt, self.clip_scores = 0, 0, [], [], []
        self.pending: Tensor | None = None
        self.grid_rows: list[Tensor] = []

    def __call__(self, batch: Tensor) -> None:
        flat = self.decode(batch) if self.decode is not None else batch
        prompt = torch.arange(self.rows, self.rows + len(flat)) // self.S
        self.rows += len(flat)
        self.feats.append(self.fx(flat))
        if self.labels:
            self.hits += int((classify(self.classifier, flat) == self.prompts.labels[prompt]).sum())
        if self.clip is not None:
            self.clip_scores.append(self.clip(flat, [self.prompts.captions[p] for p in prompt.tolist()]))
        if (prompt < self.G).any():
            self.grid_rows.append(flat[prompt < self.G])
        buf = flat if self.pending is None else torch.cat([self.pending, flat])  # starts at a prompt's first row
        whole = len(buf) // self.S * self.S
        if whole:
            groups = buf[:whole].reshape(-1, self.S, *buf.shape[1:])
            self.per_prompt += M.intra_prompt_diversity(groups, self.distance)["per_prompt"]
        self.pending = buf[whole:].clone() if whole < len(buf) else None  # not a view that holds the batch

    @property
    def grid(self) -> Tensor | None:
        if not self.grid_rows:
            return None
        rows = torch.cat(self.grid_rows)
        return rows.reshape(-1, self.S, *rows.shape[1:])

    def features(self) -> Tensor:
        return torch.cat(self.feats)

    def diversity(self) -> dict:
        return M.diversity_summary(self.per_prompt, self.S * (self.S - 1) // 2, self.distance.name)


def feature_network(
    cfg: Config, dataset: Dataset, folder: Path, *, decode: Callable[[Tensor], Tensor], progress: bool = False
):
    """(FeatureExtractor, classifier or None, description): Inception from ``evaluation.inception_weights`` if
    set, else the classifier in ``folder`` (trained on the dataset and saved there on first use). ``decode``: the
    dataset's images → pixels (:meth:`hddm_flower.data.Dataset.decoder`, or the run pipeline's VAE), so that a
    latent dataset's classifier reads the pixels its samples decode to."""
    ev = cfg.evaluation
    device = resolve_device(cfg.coordinator.device)
    desc = dataset.description()
    if dataset.data_free and not (folder / "config.json").exists():
        raise ValueError(
            f"{folder} holds no feature classifier and the coordinator holds no images to train one: train it "
            "federatedly first (strategies/router_rounds.py) or set evaluation.inception_weights"
        )
    if (folder / "config.json").exists():
        info = json.loads((folder / "hddm_feature_net.json").read_text())
        if (info.get("steps"), info.get("seed"), info.get("trained_on")) != (ev.feature_steps, ev.seed, desc):
            raise ConfigError(
                f"{folder} holds a feature network trained with other settings ({info.get('steps')} "
                f"steps, seed {info.get('seed')}, {info.get('trained_on')}); remove it or set "
                f"evaluation.feature_steps/seed to match"
            )
        net = M.FeatureClassifier.from_pretrained(folder, low_cpu_mem_usage=False).eval()
    else:
        num_train = dataset.size(None, "train")
        pixels = decode  # pixels, also for latent data (the classifier reads what the samples decode to)
        batches = (
            (pixels(x), y, pooled_caption(*cond))
            for x, y, cond in dataset.images(
                None, batch_size=64, split="train", seed=ev.seed, shuffle_buffer=4096, text=True
            )
        )
        net, stats = M.train_feature_classifier_stream(
            batches,
            dataset.num_clusters,
            in_channels=dataset.pixel_channels,
            text_dim=dataset.text_dim,
            steps=ev.feature_steps,
            seed=ev.seed,
            device=device,
            progress=progress,
        )
        net.save_pretrained(folder)
        (folder / "hddm_feature_net.json").write_text(
            json.dumps(
                {
                    **stats,
                    "batch_size": 64,
                    "trained_on": desc,
                    "num_images": num_train,
                    "data": "streamed (train split)",
                    "reference_images": dataset.size(None, None),
                },
                indent=2,
            )
        )
    net.to(device)
    classifier_fx = M.classifier_features(net, desc)
    fx = M.inception_features(ev.inception_weights, device) if ev.inception_weights else classifier_fx
    return fx, net, desc


def _quality(fx: M.FeatureExtractor, ref_feats: Tensor | FeatureSums | ReferenceStats, images: Tensor, ev) -> dict:
    return _quality_of_features(ref_feats, fx(images), ev)


def _quality_of_features(ref_feats: Tensor | FeatureSums | ReferenceStats, feats: Tensor, ev) -> dict:
    """FID and KID of generated features ``feats`` (N, d) against the reference."""
    if isinstance(ref_feats, ReferenceStats):  # cached statistics: exact FID sums, KID on the reservoir sample
        kid, kid_std, size = M.kernel_distance(
            ref_feats.kid_features, feats, subset_size=ev.kid_subset_size, subsets=ev.kid_subsets, seed=ev.seed
        )
        return {
            "fid": frechet_distance_from_sums(ref_feats.sums, feats),
            "kid": kid,
            "kid_std": kid_std,
            "kid_subset_size": size,
            "num_samples": len(feats),
            "num_reference": ref_feats.count,
            "num_kid_reference": len(ref_feats.kid_features),
        }
    if isinstance(ref_feats, FeatureSums):  # federated reference statistics: FID only (KID needs the features)
        return {
            "fid": frechet_distance_from_sums(ref_feats, feats),
            "kid": None,
            "kid_std": None,
            "kid_note": "not computed: the reference is federated sums (n, Σf, Σffᵀ); KID needs its features",
            "num_samples": len(feats),
            "num_reference": ref_feats.count,
        }
    kid, kid_std, size = M.kernel_distance(
        ref_feats, feats, subset_size=ev.kid_subset_size, subsets=ev.kid_subsets, seed=ev.seed
    )
    return {
        "fid": M.frechet_distance(ref_feats, feats),
        "kid": kid,
        "kid_std": kid_std,
        "kid_subset_size": size,
        "num_samples": len(feats),
        "num_reference": len(ref_feats),
    }


def _floor_and_reference(
    stats: dict[int, ReferenceStats], prompts: Prompts, ev, seed: int
) -> tuple[ReferenceStats, dict]:
    """The stratified evaluation's reference and its real-vs-real floor for sampling seed ``seed``: as many real
    images of each cluster as the generated rows have samples of it, drawn out of the reference
    (:func:`~hddm_flower.evaluation.reference.leave_out`), and the reference without them weighted to the prompts' cluster mix
    (:func:`~hddm_flower.evaluation.reference.matched_reference`). The floor's FID/KID against that reference — the one every
    row of the seed is scored against — is what a sampler that drew real images would score at this sample count."""
    counts = {int(k): int(n) * ev.samples_per_prompt for k, n in zip(*prompts.labels.unique(return_counts=True))}
    rest, drawn = leave_out(stats, counts, seed)
    ref = matched_reference(rest, counts, ev.seed)
    floor = _quality_of_features(ref, torch.cat([drawn[k] for k in sorted(drawn)]), ev) | {
        "per_cluster": {str(k): n for k, n in counts.items()},
        "source": "real images of the dataset (train + val), the samples' count per cluster, drawn per sampling "
        "seed out of the reference",
        "adherence": None,  # real images: the classifier's accuracy on images it mostly trained on, not adherence
    }
    return ref, floor


def evaluate_run(
    cfg: Config,
    ensemble: Ensemble,
    dataset: Dataset,
    out_dir: Path,
    *,
    decode: Callable[[Tensor], Tensor],
    feature_dir: Path | None = None,
    modes: list[str] | None = None,
    per_expert: bool = True,
    reference: dict[int, FeatureSums] | None = None,
    seed: int | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """All metrics of one ensemble; writes grids and plots into ``out_dir``. Returns the ``evaluation`` block of
    report.json (the feature network and the distance are named in it).

    ``decode``: samples and images in the experts' space → pixels in [−1, 1], on the input's device (every metric,
    plot and grid works on pixels): :meth:`hddm_flower.data.Dataset.decoder`, or the VAE its caller already holds
    (:meth:`hddm_flower.hddm_pipeline.HDDMPipeline.pixels`).

    ``seed``: the seed of the prompts and the noise (default ``evaluation.seed``, which also seeds the feature
    classifier, the KID reference reservoir and KID's subsets: those stay fixed across seeds).

    ``reference``: federated FID reference statistics per cluster (:mod:`hddm_flower.federation.local`, summed from the
    nodes' replies) instead of the coordinator's images: FID from the sums, no KID.

    ``evaluation.prompt_sampling: stratified``: the prompts are the same number per cluster
    (:func:`stratified_prompts`), the reference is weighted to their cluster mix and the result has a ``floor``: real
    images at the samples' count per cluster, scored against the same reference (drawn out of it), the yardstick of
    FID/KID at this sample count (:func:`_floor_and_reference`)."""
    ev, s = cfg.evaluation, cfg.sampling
    modes = modes or ev.routing_modes
    steps = ev.num_steps or s.num_steps
    seed = ev.seed if seed is None else seed
    fx, classifier, desc = feature_network(
        cfg, dataset, feature_dir or out_dir / FEATURE_NET, decode=decode, progress=progress
    )
    distance = M.lpips_distance(ev.alexnet_weights or None, fallback=classifier, fallback_description=desc)
    stratified = ev.prompt_sampling == "stratified"
    if stratified and (reference is not None or dataset.data_free):
        raise ValueError(
            "evaluation.prompt_sampling: stratified needs the coordinator's captions and images (its reference and "
            "floor are features of them); this evaluation has "
            + ("federated reference sums" if reference is not None else "no caption (institution-owned data)")
        )
    if reference is not None:
        ref_feats = sum(reference.values(), FeatureSums.zeros(fx.num_features))
        reference_text = (
            f"{ref_feats.count} images of clusters {sorted(reference)}, as sums of their features computed by "
            f"the nodes that hold them (federated)"
        )
    else:
        stats, cached = reference_statistics(
            dataset,
            fx,
            decode=decode,
            reservoir=ev.reference_images or DEFAULT_KID_RESERVOIR,
            seed=ev.seed,
            progress=progress,
        )
        where = ("reused from" if cached["reused"] else "computed in one streaming pass, cached in") + (
            f" {cached['file'] or 'nowhere (the dataset folder is read-only)'}"
        )
        if not stratified:
            ref_feats = pooled(stats, ev.seed)
            reference_text = (
                f"{ref_feats.count} images of the dataset (train + val): exact FID statistics of every image, KID on "
                f"a seeded uniform sample of {len(ref_feats.kid_features)}; {where}"
            )
    data_free = dataset.data_free
    floor = None
    if data_free:  # no caption on the coordinator: the config's prompts; oracle routing needs captions' clusters
        prompts = config_prompts(cfg, dataset)
        skipped = {m: "oracle routing needs the cluster of each prompt's image" for m in modes if "oracle" in m}
        modes = [m for m in modes if m not in skipped]
        prompt_source = (
            "sampling.prompts: the coordinator holds no caption (institution-owned data), and captions are data"
        )
    elif stratified:
        prompts, skipped = stratified_prompts(dataset, ev.num_prompts, seed), {}
        prompt_source = (
            f"{ev.num_prompts // dataset.num_clusters} captions per cluster (stratified), held-out first (val split)"
        )
        ref_feats, floor = _floor_and_reference(stats, prompts, ev, seed)
        reference_text = (
            f"the dataset's images (train + val) weighted to the prompts' cluster mix (equal per cluster), without "
            f"the floor's {floor['num_samples']} images of this seed: FID statistics of {ref_feats.count} images, "
            f"KID on {len(ref_feats.kid_features)} of them; statistics {where}"
        )
    else:
        prompts, skipped = choose_prompts(dataset, ev.num_prompts, seed), {}
        prompt_source = "held-out captions first (val split), then training captions"
    uncond = dataset.uncond
    result: dict[str, Any] = {
        "feature_network": fx.name,
        "feature_fingerprint": fx.fingerprint,  # the weights' state fingerprint (Inception: file name and size)
        "adherence_classifier": M.classifier_features(classifier, desc).name,  # the cluster of every sample
        "diversity_distance": distance.name,
        "protocol": {
            "prompts": len(prompts.captions),
            "samples_per_prompt": ev.samples_per_prompt,
            "num_steps": steps,
            "cfg_scale": s.cfg_scale,
            "threshold": s.threshold,
            "seed": seed,
            "sampler": "FM Euler, t from 1 to 0, CFG per expert before mixing",
            "conversion": s.conversion,
            "reference": reference_text,
            "prompt_source": prompt_source,
            "prompt_sampling": ev.prompt_sampling,
        },
        "prompts": prompts.captions,
        "modes": {},
    }
    if reference is None:
        result["reference_key"] = cached["key"]  # the cached statistics' key: dataset, feature weights, reservoir, seed
    if floor is not None:
        result["floor"] = floor
    if skipped:
        result["skipped_modes"] = skipped
    samples = {}
    clip = M.ClipScorer(ev.clip) if ev.clip else None
    for mode in modes:
        streamed = StreamedSamples(
            fx,
            classifier,
            distance,
            prompts,
            ev.samples_per_prompt,
            ev.grid_prompts,
            decode=decode,
            labels=not data_free,
            clip=clip,
        )
        _, trace = sample_mode(
            ensemble,
            mode,
            prompts,
            uncond,
            samples_per_prompt=ev.samples_per_prompt,
            num_steps=steps,
            cfg_scale=s.cfg_scale,
            threshold=s.threshold,
            seed=seed,
            batch_size=ev.batch_size,
            progress=progress,
            consume=streamed,
        )
        if streamed.grid is not None:  # what the grids show; the rest of the mode's samples is not kept
            samples[mode] = streamed.grid
        r = _quality_of_features(ref_feats, streamed.features(), ev) | {"lpips": streamed.diversity()} | trace
        # the fraction of samples the run's feature classifier puts in the cluster of their prompt's image
        r["adherence"] = (
            None  # the config's prompts have no known cluster on a coordinator without data
            if data_free
            else streamed.hits / streamed.rows
        )
        r["lpips"].pop("distance")
        if clip is not None:
            scores = torch.cat(streamed.clip_scores)
            r["clip_score"] = {"value": scores.mean().item(), "model": str(clip.path), "num_images": len(scores)}
        result["modes"][mode] = r
        log.info(
            "%s: FID %.2f KID %s adherence %s %s %.3f (%.0f s; features: %s)",
            mode,
            r["fid"],
            "–" if r["kid"] is None else f"{r['kid']:.4f}",
            "–" if r["adherence"] is None else f"{r['adherence']:.3f}",
            "LPIPS" if distance.name.startswith("LPIPS") else "diversity (fallback distance, not LPIPS)",
            r["lpips"]["mean"],
            r["seconds"],
            fx.name,
        )
    result["grids"] = save_prompt_grids(samples, prompts.captions[: ev.grid_prompts], out_dir / GRIDS)
    result["plots"] = {
        "router_weights": plot_router_weights(result["modes"], ensemble.num_experts, out_dir / ROUTER_WEIGHTS_PLOT),
        "expert_usage": plot_usage(result["modes"], ensemble.num_experts, out_dir / EXPERT_USAGE_PLOT),
    }
    if per_expert and data_free:
        result["per_expert_skipped"] = "each expert alone needs captions of its own cluster; the coordinator has none"
    elif per_expert:
        if reference is not None:
            per_cluster = {k: (sums.count, sums) for k, sums in reference.items()}
        else:
            per_cluster = {k: (st.count, st) for k, st in stats.items()}
        result["per_expert"] = per_expert_quality(
            cfg, ensemble, dataset, fx, per_cluster, uncond, steps, decode=decode, progress=progress
        )
    return result


@torch.no_grad()
def per_expert_quality(
    cfg: Config,
    ensemble: Ensemble,
    dataset: Dataset,
    fx: M.FeatureExtractor,
    per_cluster: dict[int, tuple[int, Tensor | FeatureSums]],
    uncond: TextCond,
    steps: int,
    *,
    decode=None,
    progress: bool = False,
) -> dict:
    """Each expert alone, one sample for each of ``per_expert_samples`` captions of its own cluster, against the
    images of that cluster (FID/KID with few samples: compare experts of one run, not to the paper).
    ``per_cluster``: cluster id → (number of reference images, their features or federated feature sums)."""
    ev, s = cfg.evaluation, cfg.sampling
    out = {}
    for key, expert in tqdm(list(ensemble.experts.items()), desc="per-expert", disable=not progress):
        k = int(key)
        prompts = choose_prompts(dataset, ev.per_expert_samples, ev.seed + 1 + k, clusters=[k])
        n, (n_ref, ref_k) = len(prompts.captions), per_cluster.get(k, (0, None))
        if min(n, n_ref) < 2:  # FID/KID need two samples on each side
            out[key] = {
                "objective": expert.objective,
                "clamps": {},
                "skipped": f"cluster {k} has {n} held-out captions and {n_ref} reference images "
                f"(FID/KID need ≥ 2 of each)",
            }
            continue
        cfg_r = ensemble.router.config
        noise = torch.randn(
            n,
            cfg_r.in_channels,
            cfg_r.sample_size,
            cfg_r.sample_size,
            generator=torch.Generator().manual_seed(ev.seed + 1 + k),
        )
        un = TextCond(uncond.states.expand(n, -1, -1), uncond.mask.expand(n, -1))
        counts = {}
        if isinstance(expert, DDPMExpert):
            expert.clamp_counts = counts
        try:
            dev = ensemble.device
            cond, un = map_cond(lambda c: c.to(dev), prompts.cond), map_cond(lambda c: c.to(dev), un)
            with autocast(dev, ensemble.mixed_precision), torch.no_grad():
                images = euler_sample(lambda x, t: expert.velocity(x, t, cond, un, s.cfg_scale), noise.to(dev), steps)
            images = images.float().cpu()
            images = decode(images) if decode is not None else images
        finally:
            if isinstance(expert, DDPMExpert):
                expert.clamp_counts = None
        ev_small = dataclasses.replace(ev, kid_subset_size=min(ev.kid_subset_size, n))
        out[key] = _quality(fx, ref_k, images, ev_small) | {
            "objective": expert.objective,
            "clamps": read_counts(counts),
        }
    return out
