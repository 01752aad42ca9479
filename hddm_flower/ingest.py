"""Ingestion (`hddm prepare`): image + caption samples → encoded webdataset shards and a manifest.

Inputs (:mod:`hddm_flower.sources`): webdataset tar shards, a folder of images with ``.txt`` captions beside them,
or the embedded Twemoji dataset (repeated ``repeat`` times, for benchmarks). Each image is resized and centre-cropped to
the pixel resolution, encoded by the VAE (scaled latents, float16) or kept as pixels (PNG); each caption is
encoded by the text encoder into per-token states (float16, padding dropped).

Streaming and resumable: the input is processed one **unit** at a time (one input shard, or a fixed-size chunk of
a folder or of the embedded data), with at most ``batch_size`` decoded samples in memory. Each unit becomes one
output shard, written to ``*.partial`` and renamed when complete, then recorded in ``progress.jsonl``. A restart
skips the recorded units and redoes an interrupted one from scratch, so no sample is ever written twice.

Bad input is skipped and counted by reason (:data:`hddm_flower.sources.SKIP_REASONS`); a missing or unreadable shard is an error that
names it, or — with ``skip_bad_shards`` — is listed in the manifest's ``skipped_shards``.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from .data.layout import SHARD_PATTERN, UNCOND
from .provenance import versions
from .safeio import write_atomic
from .sources import SKIP_REASONS, RawSample, ShardError, Unit, folder_units, jpeg, tar_units, try_load, twemoji_units

log = logging.getLogger(__name__)


FORMAT = "hddm-encoded"


FORMAT_VERSION = 1


class Encoders:
    """The text encoder and (optionally) the VAE, loaded once from local folders."""

    def __init__(self, *, text_encoder: str | None, max_caption_tokens: int, vae: str | None, device: str = "cpu"):
        from .encoders import LatentCodec
        from .text import TextEncoder

        self.text = TextEncoder(text_encoder or None, max_caption_tokens)
        self.text.model.to(device)
        self.device = device
        self.codec = LatentCodec(vae, device=device) if vae else None

    def describe(self) -> dict:
        t = self.text
        d = {
            "text_encoder": {
                "name": t.name,
                "path": str(t.path),
                "dim": t.dim,
                "max_tokens": t.max_length,
                "states": "last_hidden_state, padding dropped, float16",
            }
        }
        if self.codec is not None:
            c = self.codec.vae.config
            d["latent"] = {
                "name": self.codec.name,
                "path": str(self.codec.path),
                "scaling_factor": self.codec.scaling_factor,
                "channels": int(c.latent_channels),
                "downsample": self.codec.downsample,
                "stored": "posterior mean × scaling_factor, float16",
            }
        else:
            d["latent"] = None
        return d

    @torch.no_grad()
    def encode_text(self, captions: list[str]) -> list[np.ndarray]:
        tok = self.text.tokenizer(
            captions, padding="longest", truncation=True, max_length=self.text.max_length, return_tensors="pt"
        ).to(self.device)
        h = self.text.model(**tok).last_hidden_state.float().cpu()
        lengths = tok["attention_mask"].sum(1).tolist()
        return [h[i, :n].numpy().astype(np.float16) for i, n in enumerate(lengths)]

    @torch.no_grad()
    def encode_images(self, images: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 127.5 - 1
        return self.codec.encode(x, sample=False).float().cpu().numpy().astype(np.float16)


def _read_progress(out: Path) -> dict[str, dict]:
    path = out / "progress.jsonl"
    done = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                if (out / rec["output"]).exists():
                    done[rec["unit"]] = rec
    return done


def _settings_check(out: Path, settings: dict) -> None:
    path = out / "settings.json"
    if path.exists():
        old = json.loads(path.read_text())
        if old != settings:
            diff = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
            raise ValueError(
                f"{out} was prepared with other settings ({', '.join(diff)} differ); use another output folder"
            )
    else:
        path.write_text(json.dumps(settings, indent=2))


def prepare_shards(
    units: list[Unit],
    out: str | os.PathLike,
    *,
    pixel_size: int,
    encoders: Encoders,
    source: dict,
    batch_size: int = 64,
    skip_bad_shards: bool = False,
    decode_threads: int = 4,
    progress: bool = False,
    stop_after_units: int | None = None,
) -> dict:
    """Encode ``units`` into ``out``: one ``shard-NNNNNN.tar`` per unit, ``progress.jsonl``, ``uncond.safetensors``
    and, when every unit is done, ``manifest.json`` (returned).

    ``stop_after_units`` stops after that many newly written units (for tests of resumption).
    """
    import webdataset as wds
    from safetensors.torch import save_file
    from tqdm.auto import tqdm

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    enc_desc = encoders.describe()
    _settings_check(out, {"source": source, "pixel_size": pixel_size, **enc_desc, "units": [u.name for u in units]})
    for partial in out.glob("*.partial"):  # an interrupted unit: redone from scratch below
        partial.unlink()
    done = _read_progress(out)
    latent = encoders.codec is not None
    written = 0
    # image decoding in threads (PIL releases the GIL), so the encoders on a GPU are not waiting for one core;
    # the bar is a context: an error closes it first, so the error is the last line printed
    with (
        tqdm(total=len(units), desc="prepare", unit="shard", disable=not progress, initial=len(done)) as bar,
        open(out / "progress.jsonl", "a") as progress_file,
        ThreadPoolExecutor(max(1, decode_threads)) as pool,
    ):
        for index, unit in enumerate(units):
            if unit.name in done:
                continue
            if stop_after_units is not None and written >= stop_after_units:
                break
            name = SHARD_PATTERN % index
            skipped, count = Counter(), 0
            try:
                samples = unit.read()
                first = next(samples, None)
            except ShardError as e:
                if not skip_bad_shards:
                    raise
                log.warning("skipping %s", e)  # not recorded in progress.jsonl: a rerun tries the shard again
                done[unit.name] = {"unit": unit.name, "output": None, "count": 0, "skipped": {}, "error": str(e)}
                bar.update(1)
                continue
            with wds.TarWriter(str(out / (name + ".partial"))) as sink:
                pending: list[RawSample] = []

                def flush():
                    nonlocal count
                    decoded = list(pool.map(lambda s: try_load(s.image, pixel_size), pending))
                    batch = []
                    for s, img in zip(pending, decoded):
                        if img is None:
                            skipped["corrupt_image"] += 1
                        else:
                            batch.append((s, img))
                    pending.clear()
                    if not batch:
                        return
                    images = np.stack([img for _, img in batch])
                    states = encoders.encode_text([s.caption for s, _ in batch])
                    latents = encoders.encode_images(images) if latent else None
                    for i, (s, img) in enumerate(batch):
                        rec = {
                            "__key__": f"{index:06d}-{count:07d}",
                            "txt": s.caption,
                            "emb.npy": states[i],
                            "json": {"source_key": s.key, "unit": unit.name, **(s.extra or {})},
                        }
                        if latent:
                            rec["latent.npy"] = latents[i]
                            rec["jpg"] = jpeg(img)
                        else:
                            rec["png"] = img
                        sink.write(rec)
                        count += 1

                for s in _chain(first, samples) if first is not None else ():
                    if s.skip is not None:
                        skipped[s.skip] += 1
                        continue
                    pending.append(s)
                    if len(pending) >= batch_size:
                        flush()
                flush()
            os.replace(out / (name + ".partial"), out / name)
            rec = {"unit": unit.name, "output": name, "count": count, "skipped": dict(skipped)}
            progress_file.write(json.dumps(rec) + "\n")
            progress_file.flush()
            done[unit.name] = rec
            written += 1
            bar.set_postfix(
                samples=sum(r["count"] for r in done.values()),
                skipped=sum(sum(r["skipped"].values()) for r in done.values()),
                refresh=False,
            )
            bar.update(1)
    if len(done) < len(units):
        return {"complete": False, "units_done": len(done), "units": len(units)}
    uncond = encoders.text.encode([""])[0]
    save_file({"states": uncond.states[0].contiguous(), "mask": uncond.mask[0].contiguous()}, out / UNCOND)
    records = [done[u.name] for u in units]
    skipped = Counter()
    for r in records:
        skipped.update(r["skipped"])
    manifest = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "created_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "source": source,
        "num_samples": sum(r["count"] for r in records),
        "skipped": {k: skipped.get(k, 0) for k in SKIP_REASONS},
        "skipped_shards": [{"shard": r["unit"], "error": r["error"]} for r in records if r.get("error")],
        "pixel_size": pixel_size,
        "channels": enc_desc["latent"]["channels"] if latent else 3,
        "image_size": pixel_size // enc_desc["latent"]["downsample"] if latent else pixel_size,
        "stored": ("latent.npy (C, h, w) float16 + jpg preview" if latent else "png") + " + txt + emb.npy + json",
        **enc_desc,
        "versions": versions(),
        "shards": [{"name": r["output"], "count": r["count"], "unit": r["unit"]} for r in records if r["output"]],
    }
    write_atomic(out / "manifest.json", json.dumps(manifest, indent=2))  # its presence means: complete
    return manifest


def _chain(first: RawSample, rest: Iterator[RawSample]) -> Iterator[RawSample]:
    yield first
    yield from rest


def read_manifest(encoded_dir: str | os.PathLike) -> dict:
    path = Path(encoded_dir) / "manifest.json"
    if not path.exists():
        raise FileNotFoundError(f"{encoded_dir} holds no finished `hddm prepare` output (no manifest.json)")
    m = json.loads(path.read_text())
    if m.get("format") != FORMAT:
        raise ValueError(f"{path} is not an {FORMAT} manifest")
    return m


def default_device(device: str = "") -> str:
    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def units_for(data, pixel_size: int, repeat: int = 1) -> tuple[list[Unit], dict]:
    """The input units and a description of the source for a :class:`~hddm_flower.config.sections.DataConfig`."""
    if data.name == "webdataset":
        return (
            tar_units(data.shards, data.skip_bad_shards),
            {"kind": "webdataset", "shards": data.shards, "license": "see the source shards"},
        )
    if data.name == "folder":
        return (
            folder_units(data.folder, data.shard_size),
            {"kind": "folder", "folder": str(data.folder), "license": "see the source folder"},
        )
    if data.name == "twemoji":
        return (
            twemoji_units(pixel_size, data.shard_size, repeat, data.skin_tones, data.limit, data.seed),
            {
                "kind": "twemoji",
                "repeat": repeat,
                "limit": data.limit,
                "skin_tones": data.skin_tones,
                "license": "Twemoji graphics (c) Twitter, Inc. and other contributors, CC-BY 4.0",
            },
        )
    raise ValueError(f"unknown dataset {data.name!r}")


def prepare_from_config(
    data, out: str | os.PathLike, *, repeat: int = 1, progress: bool = False, stop_after_units: int | None = None
) -> dict:
    """`hddm prepare` for a data config: load the encoders, list the input, encode (resuming) into ``out``."""
    if data.vae and not (Path(data.vae) / "config.json").exists():
        raise FileNotFoundError(f"data.vae: {data.vae} does not hold a diffusers AutoencoderKL (no config.json)")
    downsample = (
        2 ** (len(json.loads((Path(data.vae) / "config.json").read_text())["block_out_channels"]) - 1)
        if data.vae
        else 1
    )
    pixel_size = data.image_size * downsample
    units, source = units_for(data, pixel_size, repeat)  # a missing shard fails here, before loading models
    encoders = Encoders(
        text_encoder=data.text_encoder or None,
        max_caption_tokens=data.max_caption_tokens,
        vae=data.vae or None,
        device=default_device(data.device),
    )
    return prepare_shards(
        units,
        out,
        pixel_size=pixel_size,
        encoders=encoders,
        source=source,
        batch_size=data.encode_batch_size,
        skip_bad_shards=data.skip_bad_shards,
        decode_threads=data.decode_threads,
        progress=progress,
        stop_after_units=stop_after_units,
    )
