"""The raw inputs of ``hddm prepare`` (:mod:`hddm_flower.ingest`), as units of image + caption samples:
webdataset tar shards as img2dataset writes them (``00000.jpg`` + ``00000.txt`` and/or ``00000.json`` with a
``caption`` field; local paths or brace patterns), a folder of images with ``.txt`` captions beside them, or the
embedded Twemoji dataset; each image decoded, resized and centre-cropped (:func:`load_rgb`). Bad input is counted
by reason (:data:`SKIP_REASONS`); a missing or unreadable shard is a :class:`ShardError` that names it.
"""

from __future__ import annotations

import io
import json
import logging
import os
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)


IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")


SKIP_REASONS = ("corrupt_image", "missing_image", "missing_caption", "empty_caption", "truncated_member")


class ShardError(OSError):
    """A missing or unreadable input shard."""


@dataclass
class RawSample:
    """One input sample before decoding: image bytes (or an RGB array), caption, and why it is unusable."""

    key: str
    image: bytes | np.ndarray | None
    caption: str | None
    skip: str | None = None
    extra: dict | None = None


@dataclass
class Unit:
    """A resumable piece of input: a name (unique and stable across runs) and a way to read its samples."""

    name: str
    read: Callable[[], Iterator[RawSample]]


def expand_shards(patterns: str | Iterable[str]) -> list[str]:
    """Brace patterns (``/data/{00000..00099}.tar``; several separated by spaces) → shard paths, in order."""
    import braceexpand

    if isinstance(patterns, str):
        patterns = patterns.split()
    out = []
    for p in patterns:
        out += list(braceexpand.braceexpand(p))
    if not out:
        raise ValueError("data.shards: no shard paths given")
    return out


def _caption_of(parts: dict[str, bytes]) -> tuple[str | None, str | None]:
    """The caption from ``txt`` (preferred) or the ``caption`` field of ``json``; (caption, skip reason)."""
    text = None
    if "txt" in parts:
        text = parts["txt"].decode("utf-8", errors="replace")
    elif "json" in parts:
        try:
            text = json.loads(parts["json"]).get("caption")
        except (ValueError, AttributeError):
            text = None
    if text is None:
        return None, "missing_caption"
    text = " ".join(str(text).split())
    return (text, None) if text else (None, "empty_caption")


def _group(key: str, parts: dict[str, bytes], truncated: bool = False) -> RawSample:
    if truncated:
        return RawSample(key, None, None, "truncated_member")
    image = next((parts[e] for e in IMAGE_EXTS if e in parts), None)
    caption, why = _caption_of(parts)
    if image is None:
        return RawSample(key, None, caption, "missing_image")
    return RawSample(key, image, caption, why)


def read_tar_shard(path: str) -> Iterator[RawSample]:
    """Samples of one webdataset tar, streamed (members grouped by key, webdataset's naming rule).

    A member cut off by the end of the file ends the shard: the samples before it are yielded, the cut one is
    yielded as ``truncated_member``. A cut inside a member's header (which ``tarfile`` reads as the end) is found
    from the non-zero bytes after the last member; the cut member is then counted as one truncated sample (when
    the sample before it is complete, the cut member is taken to begin the next one). A file that is missing or
    not a tar raises :class:`ShardError`.
    """
    from webdataset.tariterators import base_plus_ext

    if not os.path.isfile(path):
        raise ShardError(f"shard {path} does not exist")
    try:
        tf = tarfile.open(path, mode="r|*")
    except (tarfile.TarError, OSError, EOFError) as e:
        raise ShardError(f"shard {path} is not a readable tar file ({e})") from e
    key, parts = None, {}
    with tf:
        try:
            for member in tf:
                if not member.isfile():
                    continue
                prefix, ext = base_plus_ext(member.name)
                if prefix is None or os.path.basename(prefix).startswith("_"):
                    continue
                if prefix != key:
                    if key is not None:
                        yield _group(key, parts)
                    key, parts = prefix, {}
                parts[ext.lower()] = tf.extractfile(member).read()
        except (tarfile.TarError, EOFError, OSError):
            if key is not None:
                yield _group(key, parts, truncated=True)
            return
        end = tf.offset
    if key is None:
        return
    last = _group(key, parts)
    if not _cut_after(path, end):
        yield last
    elif last.skip is None:  # a header cut off after a complete sample: the cut member began the next one
        yield last
        yield RawSample(f"{key}+next", None, None, "truncated_member")
    else:  # the last sample lost the member that was cut off
        yield _group(key, parts, truncated=True)


def _cut_after(path: str, offset: int) -> bool:
    """Whether an uncompressed tar holds non-zero bytes after its last member (a header cut off mid-way)."""
    with open(path, "rb") as f:
        if f.read(6)[:2] in (b"\x1f\x8b", b"BZ", b"\xfd7"):  # compressed: offsets are not file positions
            return False
        f.seek(offset)
        while block := f.read(1 << 16):
            if block.count(0) != len(block):
                return True
    return False


def tar_units(patterns: str, skip_bad_shards: bool = False) -> list[Unit]:
    paths = expand_shards(patterns)
    if not skip_bad_shards:
        for p in paths:
            if not os.path.isfile(p):
                raise ShardError(f"shard {p} does not exist (set data.skip_bad_shards: true to skip it)")
    return [Unit(p, lambda p=p: read_tar_shard(p)) for p in paths]


def folder_units(folder: str | os.PathLike, unit_size: int) -> list[Unit]:
    """Images under ``folder`` (recursive, sorted) with captions in a ``.txt`` beside each, in chunks."""
    root = Path(folder)
    if not root.is_dir():
        raise ShardError(f"image folder {root} does not exist")
    files = sorted(p for p in root.rglob("*") if p.suffix.lower().lstrip(".") in IMAGE_EXTS and p.is_file())
    if not files:
        raise ValueError(f"image folder {root} holds no jpg/png/webp images")

    def read(chunk: list[Path]) -> Iterator[RawSample]:
        for p in chunk:
            key = str(p.relative_to(root).with_suffix(""))
            txt = p.with_suffix(".txt")
            parts = {"img": p.read_bytes()}
            if txt.exists():
                parts["txt"] = txt.read_bytes()
            caption, why = _caption_of(parts)
            yield RawSample(key, parts["img"], caption, why)

    return [
        Unit(f"{root}#{i // unit_size:06d}", lambda c=files[i : i + unit_size]: read(c))
        for i in range(0, len(files), unit_size)
    ]


def twemoji_units(
    pixel_size: int, unit_size: int, repeat: int = 1, skin_tones: bool = False, limit: int = 0, seed: int = 0
) -> list[Unit]:
    """The embedded dataset as input (already RGB arrays at ``pixel_size``), repeated ``repeat`` times."""
    from .embedded import load_twemoji

    images, captions, categories = load_twemoji(pixel_size, skin_tones)
    order = np.arange(len(images))
    if limit:
        order = np.random.default_rng(seed).permutation(len(images))[:limit]
    n = len(order)

    def read(start: int, stop: int) -> Iterator[RawSample]:
        for j in range(start, stop):
            rep, i = divmod(j, n)
            i = order[i]
            yield RawSample(f"twemoji-r{rep:03d}-{i:05d}", images[i], captions[i], extra={"category": categories[i]})

    total = n * repeat
    return [
        Unit(f"twemoji-{pixel_size}px#{s // unit_size:06d}", lambda s=s: read(s, min(s + unit_size, total)))
        for s in range(0, total, unit_size)
    ]


def load_rgb(image: bytes | np.ndarray, size: int) -> np.ndarray:
    """Decode (if bytes), composite transparency on white, resize the short side to ``size`` and centre-crop:
    (size, size, 3) uint8. Raises ``ValueError`` for anything that is not a decodable image."""
    from PIL import Image, ImageOps

    if isinstance(image, np.ndarray):
        im = Image.fromarray(image)
    else:
        try:
            im = Image.open(io.BytesIO(image))
            im.load()
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
            raise ValueError(f"undecodable image: {e}") from e
    if im.mode in ("RGBA", "LA", "P"):
        rgba = im.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        canvas.alpha_composite(rgba)
        im = canvas
    im = im.convert("RGB")
    if im.size != (size, size):
        im = ImageOps.fit(im, (size, size), Image.BICUBIC, centering=(0.5, 0.5))
    return np.asarray(im, dtype=np.uint8)


def try_load(image: bytes | np.ndarray, size: int) -> np.ndarray | None:
    try:
        return load_rgb(image, size)
    except ValueError:
        return None


def jpeg(image: np.ndarray, quality: int = 95) -> bytes:
    """The preview stored beside a latent (for cluster features and grids): JPEG at high quality."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()
