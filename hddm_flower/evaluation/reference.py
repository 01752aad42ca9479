"""FID/KID reference statistics of a dataset: one streaming pass, cached beside the dataset.

The reference of every evaluation (and of ``hddm reproduce``) is the dataset's images, train and val. They are
never held in memory: :func:`reference_statistics` streams them once (image or latent and cluster label only,
:meth:`hddm_flower.data.Dataset.images`), decodes and featurises them batch by batch, and keeps per cluster

* the FID sufficient statistics ``(n, Σf, Σffᵀ)`` in float64 (:class:`~hddm_flower.evaluation.feature_sums.FeatureSums`), exact
  for every image, and
* a seeded uniform reservoir sample of features for KID (whose cubic kernel has no finite sufficient statistics).

Memory is ``K × (d² + R·d)`` whatever the dataset size. The result is cached in ``DATASET/reference-stats/`` under
a key of (dataset fingerprint, feature network name and weights fingerprint, reservoir size, seed) and reused by
every later evaluation with the same key.

From the per-cluster statistics an evaluation builds the reference it scores against: :func:`pooled` (the dataset's
own cluster mix), or, for cluster-stratified prompts, :func:`matched_reference` (the prompts' cluster mix) after
:func:`leave_out` has drawn the real-vs-real floor's images out of it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from dataclasses import dataclass

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..data import Dataset
from ..data.layout import REFERENCE_STATS
from ..safeio import atomic_path, write_atomic
from .feature_sums import FeatureSums
from .metrics import FeatureExtractor

log = logging.getLogger(__name__)

DEFAULT_KID_RESERVOIR = 10_000


@dataclass
class ReferenceStats:
    """One reference set: exact FID sums and a uniform sample of its features for KID (float64)."""

    sums: FeatureSums
    kid_features: Tensor

    @property
    def count(self) -> int:
        return self.sums.count


def pooled(stats: dict[int, ReferenceStats], seed: int = 0) -> ReferenceStats:
    """The reference of the union of clusters: sums add; the KID sample takes from each cluster's reservoir a
    share ∝ its image count (a uniform sample of the union, as large as the largest reservoir allows)."""
    sums = sum((s.sums for s in stats.values()), FeatureSums.zeros(next(iter(stats.values())).sums.dim))
    total = sum(s.count for s in stats.values())
    size = min(
        (len(s.kid_features) * total // s.count for s in stats.values() if s.count), default=0
    )  # largest R with every cluster able to contribute its share
    g = torch.Generator().manual_seed(seed)
    parts = []
    for k in sorted(stats):
        s = stats[k]
        take = round(size * s.count / total) if total else 0
        parts.append(s.kid_features[torch.randperm(len(s.kid_features), generator=g)[:take]])
    return ReferenceStats(sums, torch.cat(parts))


def matched_reference(stats: dict[int, ReferenceStats], weights: dict[int, float], seed: int = 0) -> ReferenceStats:
    """The reference of the cluster mixture ``Σ_k w_k p_k`` (``weights``: cluster id → weight ≥ 0, normalised
    here), not of the dataset's own mix: each cluster's FID sums are rescaled to carry the share ``w_k`` of the
    images (mean ``Σ_k w_k μ_k``, second moment ``Σ_k w_k E_k[ffᵀ]``; ``count`` stays the number of images, so the
    covariance keeps its n − 1), and the KID sample takes ``w_k · R`` rows of cluster k's reservoir, R the largest
    size every weighted cluster can fill. With weights ∝ the clusters' image counts this is :func:`pooled`'s
    mixture. Used with the prompts' cluster counts as weights (``evaluation.prompt_sampling: stratified``): the
    reference then has the cluster mix of the samples it is compared with, whatever clusters dominate the data."""
    total_w = sum(weights.values())
    w = {k: v / total_w for k, v in sorted(weights.items()) if v > 0}
    short = [k for k in w if k not in stats or stats[k].count < 2 or not len(stats[k].kid_features)]
    if short:
        raise ValueError(
            f"a reference weighted to clusters {sorted(w)} needs ≥ 2 images of each; clusters {short} lack them"
        )
    n = sum(stats[k].count for k in w)
    scale = {k: w[k] * n / stats[k].count for k in w}
    dim = stats[next(iter(w))].sums.dim
    sums = FeatureSums(
        n,
        sum((stats[k].sums.total * scale[k] for k in w), torch.zeros(dim, dtype=torch.float64)),
        sum((stats[k].sums.outer * scale[k] for k in w), torch.zeros(dim, dim, dtype=torch.float64)),
    )
    size = min(int(len(stats[k].kid_features) / w[k]) for k in w)
    g = torch.Generator().manual_seed(seed)
    parts = [
        stats[k].kid_features[torch.randperm(len(stats[k].kid_features), generator=g)[: round(size * w[k])]] for k in w
    ]
    return ReferenceStats(sums, torch.cat(parts))


def leave_out(
    stats: dict[int, ReferenceStats], counts: dict[int, int], seed: int
) -> tuple[dict[int, ReferenceStats], dict[int, Tensor]]:
    """Draw ``counts[k]`` real images of cluster k out of the reference: ``counts[k]`` rows of its reservoir
    (seeded; the reservoir is a uniform sample of the cluster's images, all of them when the cluster is smaller than
    the reservoir), removed from its KID sample and subtracted from its FID sums (exact: the reservoir rows are the
    very features summed). Returns (the statistics without them, their features per cluster): the real-vs-real
    floor's images and a reference disjoint from them, which every row it is compared with is scored against."""
    g = torch.Generator().manual_seed(seed)
    rest, drawn = dict(stats), {}
    for k in sorted(counts):
        n = counts[k]
        if n <= 0:
            continue
        s = stats.get(k)
        have = 0 if s is None else len(s.kid_features)
        if have < n + 2:
            raise ValueError(
                f"the real-vs-real floor draws {n} images of cluster {k} out of its reference, which holds {have} "
                "(it needs 2 more to stay a reference)"
            )
        perm = torch.randperm(have, generator=g)
        f = s.kid_features[perm[:n]]
        part = FeatureSums.of(f)
        rest[k] = ReferenceStats(
            FeatureSums(s.count - n, s.sums.total - part.total, s.sums.outer - part.outer),
            s.kid_features[perm[n:].sort().values],
        )
        drawn[k] = f
    return rest, drawn


def reference_key(dataset: Dataset, fx: FeatureExtractor, reservoir: int, seed: int) -> str:
    """Cache key of (dataset, feature network, reservoir size, seed)."""
    meta = dataset.meta
    dataset = {k: meta.get(k) for k in ("name", "version", "num_images", "image_size", "channels", "latent")}
    dataset["clusters"] = [(c["id"], c["size"], c.get("val", 0)) for c in meta["clusters"]]
    text = json.dumps([dataset, fx.name, fx.fingerprint, reservoir, seed], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


@torch.no_grad()
def compute_reference(
    dataset: Dataset,
    fx: FeatureExtractor,
    *,
    decode=None,
    reservoir: int = DEFAULT_KID_RESERVOIR,
    seed: int = 0,
    batch_size: int = 256,
    progress: bool = False,
) -> dict[int, ReferenceStats]:
    """Per-cluster reference statistics of every image (train + val) in one streaming pass."""
    total = dataset.size(None, None)
    d = fx.num_features
    sums: dict[int, FeatureSums] = {}
    kept: dict[int, list[Tensor]] = {}
    seen: dict[int, int] = {}
    rng = random.Random(seed)
    batches = dataset.images(None, batch_size=batch_size, split=None, shuffle=False, loop=False)
    with tqdm(total=total, desc="reference statistics", disable=not progress, unit="img") as bar:
        for x, labels in batches:
            feats = fx(decode(x) if decode is not None else x)  # (B, d) float64 on the CPU
            for k in labels.unique().tolist():
                f = feats[labels == k]
                sums[k] = sums.get(k, FeatureSums.zeros(d)) + FeatureSums.of(f)
                pool = kept.setdefault(k, [])
                for row in f:  # Algorithm R: every image of cluster k is kept with probability R / n_k
                    n = seen[k] = seen.get(k, 0) + 1
                    if len(pool) < reservoir:
                        pool.append(row.clone())
                    else:
                        j = rng.randrange(n)
                        if j < reservoir:
                            pool[j] = row.clone()
            bar.update(len(x))
    return {
        k: ReferenceStats(sums[k], torch.stack(kept[k]) if kept[k] else torch.zeros(0, d, dtype=torch.float64))
        for k in sorted(sums)
    }


def reference_statistics(
    dataset: Dataset,
    fx: FeatureExtractor,
    *,
    decode=None,
    reservoir: int = DEFAULT_KID_RESERVOIR,
    seed: int = 0,
    batch_size: int = 256,
    cache: bool = True,
    progress: bool = False,
) -> tuple[dict[int, ReferenceStats], dict]:
    """Per-cluster reference statistics, from the cache beside the dataset or computed (and cached) in one
    streaming pass. Returns (statistics, provenance: cache file, whether it was reused, key)."""
    from safetensors.torch import load_file, save_file

    key = reference_key(dataset, fx, reservoir, seed)
    folder = dataset.root / REFERENCE_STATS
    path, info_path = folder / f"{key}.safetensors", folder / f"{key}.json"
    if cache and path.is_file() and info_path.is_file():
        arrays = load_file(path)
        clusters = json.loads(info_path.read_text())["clusters"]
        stats = {
            int(k): ReferenceStats(
                FeatureSums(int(n), arrays[f"{k}.total"], arrays[f"{k}.outer"]), arrays[f"{k}.kid_features"]
            )
            for k, n in clusters.items()
        }
        return stats, {"file": str(path), "reused": True, "key": key}
    stats = compute_reference(
        dataset, fx, decode=decode, reservoir=reservoir, seed=seed, batch_size=batch_size, progress=progress
    )
    provenance = {"file": None, "reused": False, "key": key}
    if cache:
        arrays = {}
        for k, s in stats.items():
            arrays |= {f"{k}.total": s.sums.total, f"{k}.outer": s.sums.outer, f"{k}.kid_features": s.kid_features}
        info = {
            "feature_network": fx.name,
            "feature_fingerprint": fx.fingerprint,
            "dataset": str(dataset.root.resolve()),
            "kid_reservoir": reservoir,
            "seed": seed,
            "clusters": {str(k): s.count for k, s in stats.items()},
            "statistics": "per cluster: n, Σf, Σffᵀ (float64, every image, train + val) and a uniform reservoir "
            "sample of features for KID",
        }
        try:
            folder.mkdir(exist_ok=True)
            # the weights file is renamed last: its presence means the pair is complete
            with atomic_path(path, shared=True) as tmp:
                save_file({k: v.contiguous() for k, v in arrays.items()}, tmp)
                write_atomic(info_path, json.dumps(info, indent=2), shared=True)
            provenance["file"] = str(path)
        except OSError as e:  # a read-only dataset: use the statistics without caching them
            log.warning("reference statistics not cached beside %s: %s", dataset.root, e)
    return stats, provenance
