"""``data.name: gmm``: a synthetic image dataset whose density is known in closed form.

Small images (``channels × image_size × image_size``, 3 × 8 × 8 by default) drawn from a Gaussian mixture
(:class:`~hddm_flower.gmm.mixture.GaussianMixture`): K clusters, one per expert, each a pattern ("horizontal stripes",
"checkerboard", "ring", …) in a few colours. A component is one (pattern, colour) pair with its caption
("red horizontal stripes"); its mean is the pattern painted in that colour on a dark background and its covariance
is low rank (pattern contrast, per-channel brightness, one smooth random direction) plus a diagonal. Mixture
weights are drawn from a Dirichlet, so clusters and components have unequal sizes.

The dataset has the layout of every other dataset (:mod:`hddm_flower.data`): one webdataset shard set per cluster,
captions encoded by the configured text encoder (MiniLM by default), ``meta.json`` and ``uncond.safetensors``, so
the whole pipeline (Flower simulation included) runs on it unchanged. Images are stored as float32 arrays
(``latent.npy`` in pixel space: PNG would quantise the density away; ``meta["latent"]`` stays empty). The mixture
itself, the cluster of each component and the captions' encoded states are kept in ``gmm.safetensors`` for the
exact references (:mod:`hddm_flower.gmm.exact`) and the truth metrics (:mod:`hddm_flower.gmm.truth`).
"""

from __future__ import annotations

import fcntl
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..data import Dataset
from ..data.layout import GMM_FILE, is_prepared
from ..data.writer import DatasetWriter
from ..models import TextCond
from .mixture import GaussianMixture

log = logging.getLogger(__name__)

GMM_VERSION = 1
PATTERNS = (
    "horizontal stripes",
    "vertical stripes",
    "diagonal stripes",
    "checkerboard",
    "blob",
    "ring",
    "left-to-right gradient",
    "top-to-bottom gradient",
)
COLOURS = {
    "red": (1.0, 0.15, 0.15),
    "green": (0.15, 0.9, 0.2),
    "blue": (0.2, 0.3, 1.0),
    "yellow": (1.0, 0.9, 0.1),
    "purple": (0.7, 0.2, 0.9),
    "cyan": (0.1, 0.85, 0.9),
}
CAPTION_KINDS = ("pattern", "colour")
COVARIANCE_KINDS = ("pattern", "cluster")
BACKGROUND, CONTRAST = -0.7, 1.4  # mean = BACKGROUND + CONTRAST·pattern·colour ∈ [−0.7, 0.7]


@dataclass(frozen=True)
class GMMSpec:
    """What fixes the mixture and the dataset drawn from it."""

    num_clusters: int = 8
    components_per_cluster: int = 4
    image_size: int = 8
    channels: int = 3
    rank: int = 4
    num_samples: int = 8000
    seed: int = 0
    captions: str = "pattern"  # "pattern": "red ring" (one component each); "colour": "red" (shared by every cluster)
    # "pattern": each component's directions are its pattern's contrast, the channel brightnesses (the same in every
    # cluster) and smooth random ones; "cluster": each cluster draws its own random rank-r subspace, which its
    # components share and no other cluster's does (the clusters share no structure beyond the background)
    covariance: str = "pattern"

    def check(self) -> None:
        if not 1 <= self.num_clusters <= len(PATTERNS):
            raise ValueError(
                f"gmm: num_experts must be 1..{len(PATTERNS)} (one pattern per cluster), got {self.num_clusters}"
            )
        if not 1 <= self.components_per_cluster <= len(COLOURS):
            raise ValueError(
                f"gmm: components per cluster must be 1..{len(COLOURS)}, got {self.components_per_cluster}"
            )
        if self.channels not in (1, 3):
            raise ValueError(f"gmm: channels must be 1 or 3, got {self.channels}")
        if self.image_size < 4:
            raise ValueError(f"gmm: image_size must be ≥ 4, got {self.image_size}")
        if not 1 <= self.rank <= self.channels * self.image_size**2:
            raise ValueError(f"gmm: rank must be 1..d, got {self.rank}")
        if self.captions not in CAPTION_KINDS:
            raise ValueError(f"gmm: captions must be one of {CAPTION_KINDS}, got {self.captions!r}")
        if self.covariance not in COVARIANCE_KINDS:
            raise ValueError(f"gmm: covariance must be one of {COVARIANCE_KINDS}, got {self.covariance!r}")
        if self.num_samples < 2 * self.num_clusters:
            raise ValueError(f"gmm: num_samples must be ≥ 2 per cluster, got {self.num_samples}")


def pattern(name: str, size: int) -> np.ndarray:
    """A pattern (size, size) with values in [0, 1]."""
    h, w = np.meshgrid(np.arange(size) + 0.5, np.arange(size) + 0.5, indexing="ij")
    u, v = h / size, w / size  # rows, columns in (0, 1)
    period = 4 / size  # a stripe pair every 4 pixels
    table = {
        "horizontal stripes": 0.5 + 0.5 * np.cos(2 * np.pi * u / period),
        "vertical stripes": 0.5 + 0.5 * np.cos(2 * np.pi * v / period),
        "diagonal stripes": 0.5 + 0.5 * np.cos(2 * np.pi * (u + v) / (period * 1.5)),
        "checkerboard": ((np.floor(h / 2) + np.floor(w / 2)) % 2).astype(np.float64),
        "blob": np.exp(-((u - 0.5) ** 2 + (v - 0.5) ** 2) / (2 * 0.18**2)),
        "ring": np.exp(-((np.hypot(u - 0.5, v - 0.5) - 0.32) ** 2) / (2 * 0.08**2)),
        "left-to-right gradient": v,
        "top-to-bottom gradient": u,
    }
    return table[name]


def make_mixture(spec: GMMSpec) -> tuple[GaussianMixture, list[str], list[int]]:
    """The mixture (components in cluster order), each component's caption and cluster."""
    spec.check()
    rng = np.random.default_rng(spec.seed)
    C, S, r = spec.channels, spec.image_size, spec.rank
    d = C * S * S
    colours = list(COLOURS)[: spec.components_per_cluster]
    means, factors, diags, captions, cluster_of = [], [], [], [], []
    cluster_w = rng.dirichlet(np.full(spec.num_clusters, 4.0))
    weights = []
    for k in range(spec.num_clusters):
        p = pattern(PATTERNS[k], S)
        within = rng.dirichlet(np.full(len(colours), 3.0))
        # "cluster": one orthonormal basis per cluster (QR of a Gaussian d × r), drawn before its components
        basis = np.linalg.qr(rng.standard_normal((d, r)))[0] if spec.covariance == "cluster" else None
        for c_i, colour in enumerate(colours):
            rgb = np.asarray(COLOURS[colour])[:C] if C == 3 else np.asarray([np.mean(COLOURS[colour])])
            mu = BACKGROUND + CONTRAST * p[None] * rgb[:, None, None]  # (C, S, S)
            if basis is None:
                dirs = [(p[None] - p.mean()) * rgb[:, None, None]]  # pattern contrast
                for ch in range(C):  # per-channel brightness
                    e = np.zeros((C, S, S))
                    e[ch] = 1.0
                    dirs.append(e)
                while len(dirs) < r:  # smooth random directions
                    g = rng.standard_normal((C, 3, 3))
                    dirs.append(
                        np.stack([np.kron(g[ch], np.ones((S // 3 + 1, S // 3 + 1)))[:S, :S] for ch in range(C)])
                    )
                U = np.stack([x.reshape(-1) / np.linalg.norm(x) for x in dirs[:r]], 1)  # unit columns (d, r)
            else:  # the cluster's basis, turned by a random rotation of its own: the same span, other axes
                U = basis @ np.linalg.qr(rng.standard_normal((r, r)))[0]
            U = U * rng.uniform(0.8, 1.6, size=r)  # per-direction std ≈ 0.06–0.11 per pixel at d = 192
            means.append(mu.reshape(-1))
            factors.append(U)
            diags.append(np.full(d, rng.uniform(0.06, 0.1) ** 2))
            captions.append(f"{colour} {PATTERNS[k]}" if spec.captions == "pattern" else colour)
            cluster_of.append(k)
            weights.append(cluster_w[k] * within[c_i])
    mixture = GaussianMixture(
        torch.tensor(np.asarray(weights)),
        torch.tensor(np.stack(means)),
        torch.tensor(np.stack(factors)),
        torch.tensor(np.stack(diags)),
    )
    return mixture, captions, cluster_of


def gmm_dataset_dir(cache_dir: str | os.PathLike, spec: GMMSpec, max_caption_tokens: int) -> Path:
    name = (
        f"gmm-v{GMM_VERSION}-{spec.channels}x{spec.image_size}px-k{spec.num_clusters}-j{spec.components_per_cluster}"
        f"-r{spec.rank}-n{spec.num_samples}-L{max_caption_tokens}-seed{spec.seed}"
        + ("" if spec.captions == "pattern" else f"-captions-{spec.captions}")
        + ("" if spec.covariance == "pattern" else f"-cov-{spec.covariance}")
    )
    return Path(cache_dir) / name


@dataclass
class GMMReference:
    """What the exact references and the truth metrics need: the mixture, the cluster and caption of each component
    and the captions' text states exactly as the dataset stores them (float16-rounded)."""

    mixture: GaussianMixture
    cluster_of: Tensor  # (J,) long
    captions: list[str]
    cond: TextCond  # (J, L, dim), (J, L)
    uncond: TextCond  # (1, L, dim), (1, L)
    shape: tuple[int, int, int]  # (C, S, S)

    @property
    def num_clusters(self) -> int:
        return int(self.cluster_of.max()) + 1


def load_reference(dataset: Dataset) -> GMMReference:
    """The :class:`GMMReference` of a dataset prepared with ``data.name: gmm`` (or one of its cluster folders)."""
    from safetensors.torch import load_file

    meta = dataset.meta
    if meta.get("name") != "gmm":
        raise ValueError(f"{dataset.root} is not a gmm dataset (its name is {meta.get('name')!r})")
    t = load_file(dataset.root / GMM_FILE)
    return GMMReference(
        GaussianMixture.from_state_dict(t),
        t["cluster_of"],
        list(meta["gmm"]["captions"]),
        TextCond(t["caption_states"], t["caption_mask"]),
        TextCond(t["uncond_states"], t["uncond_mask"]),
        tuple(meta["gmm"]["shape"]),
    )


def _padded(states: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Text states as a dataset stores and loads them: float16-rounded, zero past the mask."""
    return (states.half().float() * mask[..., None]), mask.float()


def prepare_gmm(
    cache_dir: str | os.PathLike,
    spec: GMMSpec,
    *,
    val_fraction: float = 0.05,
    max_caption_tokens: int = 16,
    encoder_path: str | None = None,
) -> Path:
    """Build (once) the GMM dataset's per-cluster shards; returns the dataset directory. Safe to call from many
    processes at once (a file lock; the result is renamed into place when complete)."""
    from safetensors.torch import save_file

    from ..embedded import detail_score
    from ..text import TextEncoder

    spec.check()
    if encoder_path and not Path(encoder_path).is_dir():
        raise FileNotFoundError(f"text encoder directory {encoder_path} does not exist")
    out = gmm_dataset_dir(cache_dir, spec, max_caption_tokens)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_prepared(out):
            return out
        log.info("preparing the Gaussian-mixture dataset in %s", out)
        mixture, captions, cluster_of = make_mixture(spec)
        encoder = TextEncoder(encoder_path, max_caption_tokens)
        cond, pooled = encoder.encode(captions)
        uncond, _ = encoder.encode([""])
        same = torch.tensor([[a == b for b in captions] for a in captions])
        sims = (pooled @ pooled.T).masked_fill(same, -2.0)  # equal captions (colour captions) share an embedding
        if float(sims.max()) > 0.999:
            raise ValueError(
                "two gmm captions have the same text embedding; the exact experts could not tell them apart"
            )
        states, mask = _padded(cond.states, cond.mask)
        u_states, u_mask = _padded(uncond.states, uncond.mask)
        x, comp = mixture.sample(spec.num_samples, torch.Generator().manual_seed(spec.seed + 1))
        images = x.float().reshape(-1, spec.channels, spec.image_size, spec.image_size).numpy()
        labels = torch.as_tensor(cluster_of)[comp].numpy()
        from ..data import stratified_split

        split = stratified_split(labels, spec.num_clusters, val_fraction, np.random.default_rng(spec.seed + 2))
        with DatasetWriter(out) as writer:
            clusters = []
            for k in range(spec.num_clusters):
                idx = np.flatnonzero(labels == k)
                with writer.shard_writer(k, maxcount=5000) as w:
                    for i in idx:
                        j, n = int(comp[i]), int(cond.mask[comp[i]].sum())
                        w.write(
                            {
                                "__key__": f"{i:06d}",
                                "latent.npy": images[i],
                                "txt": captions[j],
                                "emb.npy": cond.states[j, :n].numpy().astype(np.float16),
                                "json": {"component": j, "cluster": k, "split": str(split[i])},
                            }
                        )
                hwc = (np.clip(images[idx].transpose(0, 2, 3, 1), -1, 1) + 1) * 127.5
                clusters.append(
                    {
                        "id": k,
                        "size": int(len(idx)),
                        "val": int((split[idx] == "val").sum()),
                        "detail": detail_score(hwc if spec.channels == 3 else np.repeat(hwc, 3, -1)),
                        "pattern": PATTERNS[k],
                        "weight": float(mixture.weights[torch.as_tensor(cluster_of) == k].sum()),
                        "examples": [c for c, kk in zip(captions, cluster_of) if kk == k],
                    }
                )
            save_file(
                mixture.state_dict()
                | {
                    "cluster_of": torch.as_tensor(cluster_of),
                    "caption_states": states.contiguous(),
                    "caption_mask": mask.contiguous(),
                    "uncond_states": u_states.contiguous(),
                    "uncond_mask": u_mask.contiguous(),
                },
                writer.path(GMM_FILE),
            )
            writer.write_uncond(uncond.states[0], uncond.mask[0])
            meta = {
                "name": "gmm",
                "version": GMM_VERSION,
                "image_size": spec.image_size,
                "channels": spec.channels,
                "latent": None,
                "num_images": len(images),
                "num_clusters": spec.num_clusters,
                "seed": spec.seed,
                "text_encoder": encoder.name,
                "text_dim": encoder.dim,
                "max_caption_tokens": max_caption_tokens,
                "cluster_features": "none: the clusters are the mixture's patterns (known by construction)",
                "license": "synthetic (generated from the seed)",
                "gmm": {
                    "file": GMM_FILE,
                    "shape": [spec.channels, spec.image_size, spec.image_size],
                    "components_per_cluster": spec.components_per_cluster,
                    "rank": spec.rank,
                    "captions": captions,
                    "caption_kind": spec.captions,
                    "cluster_of": cluster_of,
                    "weights": mixture.weights.tolist(),
                    "covariance_kind": spec.covariance,
                    "covariance": (
                        "low rank (pattern contrast, per-channel brightness, smooth random) + diagonal"
                        if spec.covariance == "pattern"
                        else "low rank (a random subspace per cluster, rotated per component) + diagonal"
                    ),
                },
                "clusters": clusters,
            }
            writer.write_meta(meta, also=(GMM_FILE,))  # each cluster folder stands alone
        return out
