"""Clustering (`hddm cluster`): encoded shards → K per-cluster shard sets, one per institution.

Four streaming passes over the encoded shards of `hddm prepare` (memory plan in docs/data.md):

1. **Features**: an image feature model (DINOv2 through transformers from a local folder, CLS token after the
   final layer norm) or ``caption`` (the mean of the stored text states), L2-normalised, or ``pixels`` (the pixels
   area-averaged to at most 16×16, as the embedded dataset clusters them), written row by row to a float16
   memory-mapped file (N × D on disk), with a per-sample detail score (mean squared Laplacian of the grey image).
   ``pixels`` are then reduced to their first 32 principal components (PCA fitted on the k-means fit subsample).
2. **Fine k-means**: scikit-learn ``MiniBatchKMeans`` with ``fine_clusters`` centroids (1024 in the paper), fitted
   on a uniform random subsample of at most ``fit_samples`` rows read from the memory map (256 per centroid by
   default: 262,144 × 1024 float32 ≈ 1 GiB of RAM whatever N is).
3. **Assignment**: every row to its nearest fine centroid, in chunks; then ``KMeans`` (n_init=10) on the fine
   centroids weighted by their counts gives K coarse clusters; a sample's cluster is its fine centroid's.
   Cluster ids are ordered by size (0 = largest). An empty cluster is an error here, before any training.
4. **Shard sets**: the encoded samples are copied, unchanged but for their ``json`` (cluster, fine centroid,
   split), into ``cluster-k/shard-NNNNNN.tar``; each ``cluster-k`` folder also holds ``meta.json`` and
   ``uncond.safetensors``, so an institution needs only its own folder. ``assignments.csv`` maps every sample key
   to its cluster; ``clusters.png`` shows samples per cluster and ``report.md`` the sizes and detail scores.

Its length is the four passes above, which share one clustering's manifest, feature model and labels.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from .data import SAME_ENCODING
from .data.layout import is_prepared
from .data.writer import DatasetWriter
from .embedded import PIXEL_FEATURES, PIXEL_SIDE, pixel_pca, pixel_vectors
from .ingest import read_manifest

log = logging.getLogger(__name__)

FEATURES = ("dinov2", "pixels", "caption")
CLUSTER_FORMAT_VERSION = 1
_STOP = set(
    "a an the of in on at with and or to for from by is are this that it its as over under near into "
    "out up down off - & his her their our your my".split()
)


# ----------------------------------------------------------------------------------------------------------------
# Feature models


class Dinov2Features:
    """DINOv2 from a local folder (e.g. facebook/dinov2-large: ViT-L/14, 1024-d) with its image processor."""

    normalize = True

    def __init__(self, path: str | os.PathLike, device: str = "cpu"):
        from transformers import AutoImageProcessor, AutoModel

        self.path = Path(path)
        if not (self.path / "config.json").exists():
            raise FileNotFoundError(f"DINOv2 directory {self.path} does not hold a transformers model (no config.json)")
        self.processor = AutoImageProcessor.from_pretrained(self.path)
        self.model = AutoModel.from_pretrained(self.path).to(device).eval()
        self.device = device
        self.dim = int(self.model.config.hidden_size)
        self.name = f"{self.model.config.model_type}:{self.path.name} (CLS after layer norm, {self.dim}-d)"

    @torch.no_grad()
    def __call__(self, images: np.ndarray, texts: list[np.ndarray]) -> np.ndarray:
        inputs = self.processor(images=list(images), return_tensors="pt").to(self.device)
        return self.model(**inputs).pooler_output.float().cpu().numpy()


class PixelFeatures:
    """Offline, visual: :func:`hddm_flower.embedded.pixel_vectors` (the pixels, area-averaged to at most 16×16); the
    principal components follow in :func:`pixel_components`. Not normalised: PCA needs the pixels' own scale."""

    normalize = False

    def __init__(self, pixel_size: int):
        side = min(pixel_size, PIXEL_SIDE)
        self.dim = side * side * 3
        self.name = f"pixels: {PIXEL_FEATURES}"

    def __call__(self, images: np.ndarray, texts: list[np.ndarray]) -> np.ndarray:
        return pixel_vectors(images)


class CaptionFeatures:
    """Offline, semantic: the mean of the stored per-token text states (the text encoder's pooled embedding)."""

    name = "caption: mean of the stored text-encoder states"
    normalize = True

    def __init__(self, dim: int):
        self.dim = dim

    def __call__(self, images: np.ndarray, texts: list[np.ndarray]) -> np.ndarray:
        return np.stack([t.astype(np.float32).mean(0) for t in texts])


def feature_model(kind: str, *, dinov2: str = "", text_dim: int = 0, pixel_size: int = 0, device: str = "cpu"):
    if kind == "dinov2":
        if not dinov2:
            raise ValueError("cluster features dinov2 need data.dinov2, a local DINOv2 folder")
        return Dinov2Features(dinov2, device)
    if kind == "pixels":
        return PixelFeatures(pixel_size)
    if kind == "caption":
        return CaptionFeatures(text_dim)
    raise ValueError(f"unknown cluster features {kind!r}; expected one of {FEATURES}")


# ----------------------------------------------------------------------------------------------------------------
# Reading encoded shards


def encoded_urls(encoded_dir: str | os.PathLike) -> list[str]:
    m = read_manifest(encoded_dir)
    return [str(Path(encoded_dir) / s["name"]) for s in m["shards"]]


def merge_manifests(encoded_dirs: list[Path]) -> dict:
    """One manifest for several `hddm prepare` outputs (e.g. one per machine, each over its own shard range): they
    must agree on resolution, VAE and text encoder; counts add up."""
    manifests = [read_manifest(d) for d in encoded_dirs]
    first = manifests[0]
    for d, m in zip(encoded_dirs[1:], manifests[1:]):
        for key in SAME_ENCODING:
            a = {k: v for k, v in (m[key] or {}).items() if k != "path"} if isinstance(m[key], dict) else m[key]
            b = (
                {k: v for k, v in (first[key] or {}).items() if k != "path"}
                if isinstance(first[key], dict)
                else first[key]
            )
            if a != b:
                raise ValueError(
                    f"{d} was prepared with another {key} than {encoded_dirs[0]}; "
                    "cluster only outputs of the same settings together"
                )
    skipped = Counter()
    for m in manifests:
        skipped.update(m["skipped"])
    return first | {
        "num_samples": sum(m["num_samples"] for m in manifests),
        "skipped": dict(skipped),
        "skipped_shards": [x for m in manifests for x in m["skipped_shards"]],
        "sources": [m["source"] for m in manifests],
    }


def iter_raw(urls: list[str]) -> Iterator[dict]:
    """Encoded samples as raw bytes per field, in shard order (webdataset, no shuffling, no node splitting)."""
    from .data.shards import open_shards

    return iter(open_shards(urls, decode=None))


def sample_image(sample: dict) -> np.ndarray:
    from PIL import Image

    data = sample.get("png") or sample.get("jpg")
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))


def detail_scores(images: np.ndarray) -> np.ndarray:
    """Per image: mean squared discrete Laplacian of the grey-level image in [0, 1] (fine detail)."""
    g = images.astype(np.float64).mean(-1) / 255.0
    lap = g[:, 1:-1, :-2] + g[:, 1:-1, 2:] + g[:, :-2, 1:-1] + g[:, 2:, 1:-1] - 4 * g[:, 1:-1, 1:-1]
    return (lap**2).mean((1, 2))


# ----------------------------------------------------------------------------------------------------------------
# The passes


def compute_features(
    urls: list[str], n: int, model, path: Path, *, batch_size: int = 64, progress: bool = False
) -> tuple[np.memmap, np.ndarray]:
    """Pass 1: features (float16 memmap at ``path``, N × D; L2-normalised if the model says so) and detail scores
    (N,)."""
    from tqdm.auto import tqdm

    feats = np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=(n, model.dim))
    detail = np.zeros(n, np.float32)
    row = 0
    images, texts = [], []

    def flush():
        nonlocal row
        if not images:
            return
        ims = np.stack(images)
        f = np.asarray(model(ims, texts), np.float32)
        if model.normalize:
            f /= np.maximum(np.linalg.norm(f, axis=1, keepdims=True), 1e-12)
        feats[row : row + len(f)] = f
        detail[row : row + len(f)] = detail_scores(ims)
        row += len(f)
        images.clear()
        texts.clear()

    for s in tqdm(iter_raw(urls), total=n, desc="features", unit="img", disable=not progress):
        if row + len(images) >= n:
            raise ValueError(f"the encoded shards hold more samples than their manifest says ({n})")
        images.append(sample_image(s))
        texts.append(np.load(io.BytesIO(s["emb.npy"])))
        if len(images) >= batch_size:
            flush()
    flush()
    if row != n:
        raise ValueError(f"the encoded shards hold {row} samples but their manifest says {n}")
    feats.flush()
    return feats, detail


def pixel_components(
    feats: np.ndarray, path: Path, *, seed: int, fit_samples: int = 262144, chunk: int = 65536
) -> np.ndarray:
    """``pixels`` features → their principal components (float32 memmap at ``path``): the PCA of
    :func:`hddm_flower.embedded.pixel_pca`, fitted on a seeded subsample of at most ``fit_samples`` rows (all rows on
    the embedded dataset's scale), then applied in chunks."""
    n = len(feats)
    take = np.sort(np.random.default_rng(seed).choice(n, size=min(n, fit_samples), replace=False))
    sample = np.asarray(feats[take], np.float64)
    pca = pixel_pca(sample.shape).fit(sample)
    del sample
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, pca.n_components_))
    for s in range(0, n, chunk):
        out[s : s + chunk] = pca.transform(np.asarray(feats[s : s + chunk], np.float64))
    out.flush()
    return out


def fit_hierarchical(
    feats: np.ndarray,
    *,
    num_clusters: int,
    fine_clusters: int,
    seed: int,
    fit_samples: int = 262144,
    chunk: int = 65536,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray, dict]:
    """Passes 2–3: fine MiniBatchKMeans on a subsample, chunked assignment, count-weighted coarse KMeans.

    Returns (cluster per sample ordered by size with 0 = largest, fine centroid per sample, info).
    """
    from sklearn.cluster import KMeans, MiniBatchKMeans
    from threadpoolctl import threadpool_limits
    from tqdm.auto import tqdm

    n = len(feats)
    if n < num_clusters:
        raise ValueError(f"{n} samples cannot make {num_clusters} clusters")
    f = min(fine_clusters, n)
    rng = np.random.default_rng(seed)
    take = np.sort(rng.choice(n, size=min(n, max(fit_samples, f)), replace=False))
    sample = np.asarray(feats[take], np.float32)
    with threadpool_limits(limits=max(1, torch.get_num_threads())):
        fine = MiniBatchKMeans(
            f, batch_size=min(len(sample), 4096), n_init=3, max_iter=100, random_state=seed, reassignment_ratio=0.0
        ).fit(sample)
        del sample
        fine_labels = np.empty(n, np.int32)
        for s in tqdm(range(0, n, chunk), desc="assign", unit="chunk", disable=not progress):
            fine_labels[s : s + chunk] = fine.predict(np.asarray(feats[s : s + chunk], np.float32))
        counts = np.bincount(fine_labels, minlength=f)
        used = np.flatnonzero(counts)
        if len(used) < num_clusters:
            raise ValueError(
                f"the features form only {len(used)} distinct fine clusters, fewer than the "
                f"{num_clusters} clusters asked for (too few or too similar images)"
            )
        coarse = (
            KMeans(num_clusters, n_init=10, random_state=seed)
            .fit(fine.cluster_centers_[used], sample_weight=counts[used])
            .labels_
        )
    fine_to_coarse = np.full(f, -1, np.int64)
    fine_to_coarse[used] = coarse
    raw = fine_to_coarse[fine_labels]
    sizes = np.bincount(raw, minlength=num_clusters)
    if (sizes == 0).any():
        raise ValueError(
            f"cluster(s) {np.flatnonzero(sizes == 0).tolist()} of {num_clusters} are empty; "
            "lower num_experts or add data"
        )
    order = np.argsort(-sizes, kind="stable")
    labels = np.argsort(order)[raw].astype(np.int16)
    info = {
        "fine_clusters": int(f),
        "fine_clusters_used": int(len(used)),
        "fit_samples": int(len(take)),
        "fine": "MiniBatchKMeans(n_init=3, batch_size=4096)",
        "coarse": "KMeans(n_init=10) weighted by counts",
    }
    return labels, fine_labels, info


def split_of(labels: np.ndarray, num_clusters: int, val_fraction: float, seed: int) -> np.ndarray:
    """Stratified held-out split (True = val): every cluster of ≥ 2 samples keeps at least one val sample."""
    val = np.zeros(len(labels), bool)
    rng = np.random.default_rng(seed + 1)
    for k in range(num_clusters):
        idx = rng.permutation(np.flatnonzero(labels == k))
        n_val = max(1, round(val_fraction * len(idx))) if len(idx) >= 2 and val_fraction > 0 else 0
        val[idx[:n_val]] = True
    return val


def _grid(images_per_cluster: list[list[np.ndarray]], path: Path, scale: int = 1) -> None:
    from PIL import Image

    shapes = [im.shape for ims in images_per_cluster for im in ims]
    h, w = shapes[0][:2]
    cols = max(len(ims) for ims in images_per_cluster)
    pad = 2
    grid = np.full((len(images_per_cluster) * (h + pad) + pad, cols * (w + pad) + pad, 3), 255, np.uint8)
    for r, ims in enumerate(images_per_cluster):
        for c, im in enumerate(ims):
            grid[pad + r * (h + pad) : pad + r * (h + pad) + h, pad + c * (w + pad) : pad + c * (w + pad) + w] = im
    img = Image.fromarray(grid)
    if scale > 1:
        img = img.resize((img.width * scale, img.height * scale), Image.NEAREST)
    img.save(path)


def _words(caption: str) -> list[str]:
    return [w for w in re.findall(r"[a-z][a-z']+", caption.lower()) if w not in _STOP]


def write_shard_sets(
    urls: list[str],
    writer: DatasetWriter,
    labels: np.ndarray,
    fine_labels: np.ndarray,
    val: np.ndarray,
    num_clusters: int,
    *,
    shard_size: int,
    grid_per_cluster: int = 8,
    key_prefix: dict | None = None,
    progress: bool = False,
) -> dict:
    """Pass 4: copy each sample into its cluster's shard set; assignments.csv; examples for the grid."""
    from tqdm.auto import tqdm

    writers = [writer.shard_writer(k, maxcount=shard_size) for k in range(num_clusters)]
    grid = [[] for _ in range(num_clusters)]
    words = [Counter() for _ in range(num_clusters)]
    categories = [Counter() for _ in range(num_clusters)]
    examples = [[] for _ in range(num_clusters)]
    try:
        with open(writer.path("assignments.csv"), "w", newline="") as fh:
            out = csv.writer(fh)
            out.writerow(["key", "source_key", "cluster", "fine", "split"])
            for i, s in enumerate(
                tqdm(iter_raw(urls), total=len(labels), desc="shard sets", unit="img", disable=not progress)
            ):
                k = int(labels[i])
                info = json.loads(s["json"])
                info |= {"cluster": k, "fine": int(fine_labels[i]), "split": "val" if val[i] else "train"}
                rec = {key: value for key, value in s.items() if not key.startswith("__") or key == "__key__"}
                if key_prefix:  # several prepare outputs: keys are unique within each, made unique across them
                    rec["__key__"] = key_prefix[s["__url__"]] + s["__key__"]
                rec["json"] = json.dumps(info).encode()
                writers[k].write(rec)
                out.writerow([rec["__key__"], info.get("source_key", ""), k, int(fine_labels[i]), info["split"]])
                caption = s["txt"].decode("utf-8", errors="replace")
                if len(grid[k]) < grid_per_cluster:
                    grid[k].append(sample_image(s))
                if len(examples[k]) < 5:
                    examples[k].append(caption)
                if "category" in info:
                    categories[k][info["category"]] += 1
                elif sum(words[k].values()) < 200_000:  # a bounded sample of each cluster's vocabulary
                    words[k].update(_words(caption))
    finally:
        for w in writers:
            w.close()
    return {
        "grid": grid,
        "examples": examples,
        "categories": [
            dict(categories[k].most_common()) or {f"'{w}'": n for w, n in words[k].most_common(5)}
            for k in range(num_clusters)
        ],
    }


def cluster_encoded(
    encoded_dir: str | os.PathLike | list,
    out: str | os.PathLike,
    *,
    num_clusters: int,
    features: str = "dinov2",
    dinov2: str = "",
    fine_clusters: int = 1024,
    seed: int = 0,
    val_fraction: float = 0.05,
    shard_size: int = 1000,
    batch_size: int = 64,
    fit_samples: int = 262144,
    device: str = "cpu",
    progress: bool = False,
) -> Path:
    """Cluster the output of `hddm prepare` in ``encoded_dir`` (or a list of such folders, e.g. one per machine)
    into ``out`` (a dataset directory that :class:`hddm_flower.data.Dataset` opens). Written to a temporary
    folder beside ``out`` and renamed when complete; an existing finished ``out`` is an error."""
    dirs = [Path(d) for d in encoded_dir] if isinstance(encoded_dir, (list, tuple)) else [Path(encoded_dir)]
    encoded_dir, out = dirs[0], Path(out)
    manifest = merge_manifests(dirs)
    if is_prepared(out):
        raise FileExistsError(f"{out} already holds a clustered dataset")
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty")
    n = manifest["num_samples"]
    model = feature_model(
        features,
        dinov2=dinov2,
        text_dim=manifest["text_encoder"]["dim"],
        pixel_size=manifest["pixel_size"],
        device=device,
    )
    urls = [u for d in dirs for u in encoded_urls(d)]
    key_prefix = {u: f"{i:03d}-" for i, d in enumerate(dirs) for u in encoded_urls(d)} if len(dirs) > 1 else None
    clock = {"start": time.perf_counter()}
    with DatasetWriter(out) as writer:
        tmp = writer.tmp
        feats, detail = compute_features(urls, n, model, tmp / "features.npy", batch_size=batch_size, progress=progress)
        if features == "pixels":
            feats = pixel_components(feats, tmp / "components.npy", seed=seed, fit_samples=fit_samples)
            (tmp / "features.npy").unlink()
            os.replace(tmp / "components.npy", tmp / "features.npy")
        clock["features"] = time.perf_counter()
        labels, fine_labels, info = fit_hierarchical(
            feats,
            num_clusters=num_clusters,
            fine_clusters=fine_clusters,
            seed=seed,
            fit_samples=fit_samples,
            progress=progress,
        )
        del feats
        (tmp / "features.npy").unlink()
        clock["kmeans"] = time.perf_counter()
        val = split_of(labels, num_clusters, val_fraction, seed)
        written = write_shard_sets(
            urls,
            writer,
            labels,
            fine_labels,
            val,
            num_clusters,
            shard_size=shard_size,
            key_prefix=key_prefix,
            progress=progress,
        )
        clock["shards"] = time.perf_counter()
        clusters = []
        for k in range(num_clusters):
            rows = labels == k
            clusters.append(
                {
                    "id": k,
                    "size": int(rows.sum()),
                    "val": int((val & rows).sum()),
                    "detail": float(detail[rows].mean()),
                    "categories": written["categories"][k],
                    "examples": written["examples"][k],
                    "shards": writer.shard_names(k),
                }
            )
        latent = manifest.get("latent")
        meta = {
            "name": manifest["source"]["kind"],
            "version": CLUSTER_FORMAT_VERSION,
            "image_size": manifest["image_size"],
            "channels": manifest["channels"],
            "pixel_size": manifest["pixel_size"],
            "latent": latent,
            "num_images": n,
            "num_clusters": num_clusters,
            "seed": seed,
            "text_encoder": manifest["text_encoder"]["name"],
            "text_dim": manifest["text_encoder"]["dim"],
            "max_caption_tokens": manifest["text_encoder"]["max_tokens"],
            "cluster_features": (
                f"hierarchical k-means ({info['fine_clusters']} fine → {num_clusters} coarse) on "
                f"{'L2-normalised ' if model.normalize else ''}{model.name}"
            ),
            "feature_model": model.name,
            "kmeans": info,
            "license": manifest["source"].get("license", "see source"),
            "encoded_from": [str(d) for d in dirs] if len(dirs) > 1 else str(encoded_dir),
            "source": manifest["sources"] if len(dirs) > 1 else manifest["source"],
            "skipped": manifest["skipped"],
            "clusters": clusters,
            "seconds": {
                "features": round(clock["features"] - clock["start"], 3),
                "kmeans": round(clock["kmeans"] - clock["features"], 3),
                "shard_sets": round(clock["shards"] - clock["kmeans"], 3),
            },
        }
        writer.copy_uncond(encoded_dir)
        writer.write_meta(meta)  # each shard set stands alone: its institution needs only this folder
        _grid(written["grid"], tmp / "clusters.png", scale=max(1, 64 // written["grid"][0][0].shape[0]))
        (tmp / "report.md").write_text(render_report(meta))
    return out


def render_report(meta: dict) -> str:
    ranked = sorted(meta["clusters"], key=lambda c: -c["detail"])
    source = meta["encoded_from"]
    lines = [
        f"# Clusters of {', '.join(source) if isinstance(source, list) else source}",
        "",
        f"{meta['num_images']} samples, {meta['num_clusters']} clusters: {meta['cluster_features']}.",
        "",
        "Detail = mean squared Laplacian of the grey images (higher = more fine detail); the paper gave its "
        "DDPM experts to the most detail-heavy clusters (`objectives.ddpm_clusters: auto` does the same).",
        "",
        "| cluster | size | val | detail | detail rank | top categories / words | example |",
        "|---|---|---|---|---|---|---|",
    ]
    rank = {c["id"]: i + 1 for i, c in enumerate(ranked)}
    for c in meta["clusters"]:
        cats = ", ".join(list(c["categories"])[:3])
        ex = (c["examples"] or [""])[0].replace("|", "/")[:60]
        lines.append(f"| {c['id']} | {c['size']} | {c['val']} | {c['detail']:.4f} | {rank[c['id']]} | {cats} | {ex} |")
    lines += ["", "![samples per cluster, one row each](clusters.png)", ""]
    return "\n".join(lines)
