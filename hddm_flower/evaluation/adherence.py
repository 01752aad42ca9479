"""Prompt adherence: does a prompt's sample land in the prompt's cluster?

The run's feature classifier (:class:`hddm_flower.evaluation.metrics.FeatureClassifier`, trained on the dataset's cluster
labels) assigns every sample to a cluster; a prompt's cluster is the cluster of the image(s) whose caption the
prompt is. Adherence of a prompt is the fraction of its samples the classifier puts in that cluster (or one of
them, if the caption describes images of several clusters); a prompt that is no caption of the dataset has none.
It measures what FID cannot: FID compares the whole sample set with the whole dataset, and a sampler that drew
perfect images of the wrong cluster for every prompt would still score well.
"""

from __future__ import annotations

import hashlib
import json
import logging

import torch
from torch import Tensor, nn

from ..data import Dataset
from ..data.layout import PROMPT_CLUSTERS
from ..safeio import write_atomic

log = logging.getLogger(__name__)


def prompt_clusters(dataset: Dataset, prompts: list[str], *, cache: bool = True) -> list[list[int]]:
    """For each prompt, the sorted clusters of the dataset images whose caption it is (empty: not a caption).

    Reads the captions of both splits (text and json members only, no image) in one pass per (dataset, prompts): the
    answer is cached in ``DATASET/prompt-clusters/`` and every later report with the same prompts reads one small
    file (a read-only dataset folder: computed each time). Memory: the prompts, whatever the dataset's size."""
    meta = dataset.meta
    identity = {k: meta.get(k) for k in ("name", "version", "num_images", "num_clusters")}
    identity["clusters"] = [(c["id"], c["size"], c.get("val", 0)) for c in meta["clusters"]]
    key = hashlib.sha256(json.dumps([identity, list(prompts)], sort_keys=True, default=str).encode()).hexdigest()[:20]
    path = dataset.root / PROMPT_CLUSTERS / f"{key}.json"
    if cache and path.is_file():
        stored = json.loads(path.read_text())
        if stored.get("prompts") == list(prompts):
            return stored["clusters"]
    found: dict[str, set[int]] = {p: set() for p in prompts}
    # one pass over both splits; the order does not matter here, so the buffers hold one caption per cluster
    for caption, _, _, k in dataset.captions(None, split=None, seed=0, shuffle_buffer=1):
        if caption in found:
            found[caption].add(int(k))
    clusters = [sorted(found[p]) for p in prompts]
    if cache:
        try:
            path.parent.mkdir(exist_ok=True)
            write_atomic(path, json.dumps({"prompts": list(prompts), "clusters": clusters}), shared=True)
        except OSError as e:  # a read-only dataset: the answer without the cache
            log.warning("prompt clusters not cached beside %s: %s", dataset.root, e)
    return clusters


@torch.no_grad()
def classify(classifier: nn.Module, images: Tensor, batch_size: int = 256) -> Tensor:
    """The classifier's cluster for each image (pixels in [−1, 1], as the classifier was trained)."""
    device = next(classifier.parameters()).device
    out = [
        classifier(images[i : i + batch_size].to(device))[0].argmax(-1).cpu() for i in range(0, len(images), batch_size)
    ]
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


def prompt_adherence(classifier: nn.Module, images: Tensor, clusters: list[list[int]], samples_per_prompt: int) -> dict:
    """Adherence of prompt-major ``images`` (P·S, C, H, W): ``per_prompt`` (fraction of each prompt's samples
    classified into one of its ``clusters``; None for a prompt without one), ``mean`` over the prompts that have
    one (None if none has), and ``predicted`` (the classifier's cluster of every sample, per prompt)."""
    p, s = len(clusters), samples_per_prompt
    if len(images) != p * s:
        raise ValueError(f"prompt adherence: {len(images)} images for {p} prompts × {s} samples")
    predicted = classify(classifier, images).view(p, s)
    per_prompt = [
        float(torch.isin(row, torch.tensor(ks)).double().mean()) if ks else None for row, ks in zip(predicted, clusters)
    ]
    known = [a for a in per_prompt if a is not None]
    return {
        "per_prompt": per_prompt,
        "mean": sum(known) / len(known) if known else None,
        "clusters": clusters,
        "predicted": predicted.tolist(),
    }
