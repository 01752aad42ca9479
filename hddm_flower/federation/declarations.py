"""Institution-owned data (``data.partition: institution``): what a node declares about its data, how the
coordinator checks the declarations, and the data-free description of the run's data the coordinator works from
(framework-free; the Flower adapters are ``clients/declare.py`` and ``strategies/gather_declarations.py``).

Each node's own prepared data is its cluster. A node declares the properties every expert and the router must share
(image shape, channels, latent space, text encoder and its token count) and two statistics of its own data (the
number of images and the mean detail score that ``objectives.ddpm_clusters: auto`` ranks). Nothing else leaves
the node at this stage: no image, latent, caption or text state. The coordinator parses every declaration with
bounds (a malformed one costs only its node), leaves out a node whose data cannot join the others' (naming the
field; :func:`disagreements`), and writes a *descriptor*: a ``meta.json`` with the shape of a prepared dataset but
no shard, plus the empty caption's text states computed by its own copy of the text encoder. The descriptor is what the coordinator's
code reads where it would otherwise read the dataset's metadata.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from ..config.schema import Config
from ..data import Dataset
from ..data.dataset import DATA_FREE
from ..data.writer import DatasetWriter
from ..wire import WireError, as_float, as_int, as_str, loads

DECLARATION_VERSION = 1
MAX_DECLARATION_BYTES = 8192
AGREED_FIELDS = ("image_size", "channels", "latent", "text_encoder", "text_dim", "max_caption_tokens")
"""Fields every node's declaration must share: the experts' input shape and latent space, the text encoder and its
token count (a node that differs would train an expert the ensemble cannot mix)."""
DECLARATION = "declaration"  # the declare reply's ConfigRecord …
DECLARATION_JSON = "declaration-json"  # … holding the declaration as JSON text
CLAIM = "expert-id"  # … and the expert id the node claims


def latent_fingerprint(meta: dict) -> str:
    """The latent space of a prepared dataset as one comparable string: ``pixels``, or the VAE's name, scaling
    factor, latent channels and downsampling (its local path differs between nodes and is left out)."""
    latent = meta.get("latent")
    if not latent:
        return "pixels"
    return f"{latent['name']} scale={latent['scaling_factor']:g} channels={latent['channels']} /{latent['downsample']}"


def declaration(dataset: Dataset) -> dict[str, Any]:
    """What a node declares about its prepared data (``dataset``: an institution's one-cluster dataset or a
    ``cluster-k`` shard set): the shared properties of :data:`AGREED_FIELDS`, its number of images (train + val)
    and its cluster's mean detail score. Statistics only, read from its ``meta.json``."""
    meta = dataset.meta
    k = dataset.own_cluster
    cluster = next(c for c in meta["clusters"] if int(c["id"]) == k)
    return {
        "version": DECLARATION_VERSION,
        "dataset": f"{meta['name']} v{meta['version']}",
        "image_size": int(meta["image_size"]),
        "channels": int(meta["channels"]),
        "latent": latent_fingerprint(meta),
        "text_encoder": str(meta["text_encoder"]),
        "text_dim": int(meta["text_dim"]),
        "max_caption_tokens": int(meta["max_caption_tokens"]),
        "num_train": dataset.size([k], "train"),
        "num_val": dataset.size([k], "val"),
        "detail": float(cluster["detail"]),
    }


def parse_declaration(text: Any, node: int) -> dict[str, Any]:
    """A node's declaration (JSON text) checked field by field with bounds; :class:`~hddm_flower.wire.WireError`
    names the node and the field."""
    where = f"node {node} declaration"
    d = loads(text, where, max_bytes=MAX_DECLARATION_BYTES, max_depth=2, max_elements=64)
    if not isinstance(d, dict):
        raise WireError(f"{where}: not a JSON object")
    if d.get("version") != DECLARATION_VERSION:
        raise WireError(f"{where}: version {d.get('version')!r}, expected {DECLARATION_VERSION}")
    out = {
        "dataset": as_str(d.get("dataset"), f"{where}.dataset", max_len=128),
        "image_size": as_int(d.get("image_size"), f"{where}.image_size", 1, 4096),
        "channels": as_int(d.get("channels"), f"{where}.channels", 1, 64),
        "latent": as_str(d.get("latent"), f"{where}.latent", max_len=256),
        "text_encoder": as_str(d.get("text_encoder"), f"{where}.text_encoder", max_len=256),
        "text_dim": as_int(d.get("text_dim"), f"{where}.text_dim", 1, 65536),
        "max_caption_tokens": as_int(d.get("max_caption_tokens"), f"{where}.max_caption_tokens", 1, 4096),
        "num_train": as_int(d.get("num_train"), f"{where}.num_train", 1),
        "num_val": as_int(d.get("num_val"), f"{where}.num_val", 0),
        "detail": as_float(d.get("detail"), f"{where}.detail", 0.0, 1e6),
    }
    extra = sorted(set(d) - set(out) - {"version"})
    if extra:
        raise WireError(f"{where}: unknown fields {extra[:3]}")
    return out


def claim_refusal(expert_nodes: list[int], node: int, expert: int) -> str | None:
    """Why ``node`` may not train ``expert`` under ``federation.expert_nodes`` (expert id → the only node id that may
    train it, 0: any), or None when it may: a pinned expert goes to its node alone, and a pinned node trains only
    the experts pinned to it, whatever its node config claims."""
    if not expert_nodes:
        return None
    pinned = expert_nodes[expert] if 0 <= expert < len(expert_nodes) else 0
    if pinned and pinned != node:
        return f"claims expert {expert}, which federation.expert_nodes gives to node {pinned}"
    if not pinned and node in expert_nodes:
        mine = [k for k, n in enumerate(expert_nodes) if n == node]
        return f"claims expert {expert}, but federation.expert_nodes gives this node experts {mine} only"
    return None


class CoordinatorReference:
    """What the coordinator holds before any node answers: the :data:`AGREED_FIELDS` values it knows (``fields``:
    its text encoder's name and width from ``data.text_encoder``, which encodes the empty caption; its latent space
    and latent channels from ``data.vae``, else ``pixels``; every field of an earlier run's descriptor ``earlier``,
    so that a late joiner joins the run as it is), and whether its text encoder takes a declared token count."""

    def __init__(self, cfg: Config, earlier: Dataset | None = None):
        from ..text import TextEncoder

        self.encoder = TextEncoder(cfg.data.text_encoder or None)
        self.fields: dict[str, Any] = {"text_encoder": self.encoder.name, "text_dim": self.encoder.dim}
        self.fields["latent"] = "pixels"
        if cfg.data.vae:
            from ..encoders import LatentCodec

            codec = LatentCodec(cfg.data.vae)
            channels = int(codec.vae.config.latent_channels)
            latent = {"name": codec.name, "scaling_factor": codec.scaling_factor, "channels": channels}
            self.fields |= {"latent": latent_fingerprint({"latent": latent | {"downsample": codec.downsample}})}
            self.fields |= {"channels": channels}
        if earlier is not None:
            meta = earlier.meta
            self.fields |= {f: meta[f] for f in AGREED_FIELDS if f != "latent"} | {"latent": latent_fingerprint(meta)}
        self._tokens: dict[int, str | None] = {}

    def token_error(self, n: int) -> str | None:
        """Why the coordinator's text encoder cannot encode the empty caption at ``n`` tokens (what the descriptor
        needs), or None when it can: tried once per count, since the usable length is not always the model's
        position count."""
        if n not in self._tokens:
            self.encoder.max_length = n
            try:
                self.encoder.encode([""])
                self._tokens[n] = None
            except Exception as e:  # whatever the model raises at a length it cannot take: kept as the reason
                self._tokens[n] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        return self._tokens[n]


def disagreements(
    declarations: dict[int, dict], reference: dict | None = None, claims: dict[int, int] | None = None
) -> dict[int, str]:
    """The nodes whose declaration (node id → parsed declaration) cannot join the run, each with why. A node must
    match ``reference`` (the :data:`AGREED_FIELDS` values the coordinator already holds: its text encoder and latent
    space, an earlier run's descriptor) on every field it names; among the nodes that do, the group that agrees on
    all of :data:`AGREED_FIELDS` with the most votes is the run's (
    on a tie the group of the lowest node id), and every other node is left out, costing only its own expert. The
    reason names the first field that differs and both values. ``claims`` (node id → the expert id it claims): one
    vote per expert id, shared by the matching nodes that claim it; without it every node has a vote."""
    reference, claims = reference or {}, claims or {}
    key = lambda d: tuple(d[f] for f in AGREED_FIELDS)  # noqa: E731
    fits = {n: d for n, d in sorted(declarations.items()) if all(d[f] == v for f, v in reference.items())}
    groups: dict[tuple, list[int]] = {}
    for n, d in fits.items():
        groups.setdefault(key(d), []).append(n)
    claimants = Counter(claims[n] for n in fits if n in claims)  # over the matching nodes only
    votes = lambda nodes: round(sum(1 / claimants[claims[n]] if n in claims else 1.0 for n in nodes), 9)  # noqa: E731
    run = max(groups.values(), key=lambda nodes: (votes(nodes), -nodes[0]), default=[])
    agreed = reference | (dict(zip(AGREED_FIELDS, key(declarations[run[0]]))) if run else {})
    out: dict[int, str] = {}
    for n, d in sorted(declarations.items()):
        if n not in run:  # the coordinator's fields first: the reason names what rules the node out
            order = [*(f for f in AGREED_FIELDS if f in reference), *(f for f in AGREED_FIELDS if f not in reference)]
            f = next(f for f in order if f in agreed and d[f] != agreed[f])
            whose = "the coordinator's" if f in reference else "the run's"
            out[n] = (
                f"declares {f} {d[f]!r}, {whose} is {agreed[f]!r}: the experts of one run must share it (prepare "
                "that node's data like the others')"
            )
    return out


def cluster_details(cfg: Config, declarations: dict[int, dict]) -> list[float]:
    """Detail score per expert id (expert id → declaration); an expert no node declared ranks last (-inf)."""
    return [declarations[k]["detail"] if k in declarations else -math.inf for k in range(cfg.num_experts)]


def institution_objectives(cfg: Config, declarations: dict[int, dict], fixed: dict[int, str]) -> list[str]:
    """The objective of every expert id from the declared detail scores (``objectives.ddpm_clusters: auto``: DDPM
    to the most detailed) with the experts already trained into the run (``fixed``: expert id → objective)
    kept as they are: a late institution gets one of the DDPM places its predecessors left, if its detail ranks."""
    o = cfg.objectives
    if o.per_expert is not None or o.ddpm == 0 or o.ddpm_clusters != "auto":
        return [fixed.get(k, obj) for k, obj in enumerate(cfg.objective_of(cluster_details(cfg, declarations)))]
    details = cluster_details(cfg, declarations)
    free = sorted((k for k in range(cfg.num_experts) if k not in fixed), key=lambda k: -details[k])
    ddpm = set(free[: max(0, o.ddpm - sum(v == "ddpm" for v in fixed.values()))])
    return [fixed.get(k, "ddpm" if k in ddpm else "fm") for k in range(cfg.num_experts)]


def descriptor_meta(cfg: Config, declarations: dict[int, dict]) -> dict[str, Any]:
    """The descriptor's ``meta.json`` from the accepted declarations (expert id → declaration): the fields of a
    prepared dataset's metadata the coordinator reads, no sample and no caption."""
    first = declarations[min(declarations)]
    latent = None
    if first["latent"] != "pixels":
        if not cfg.data.vae:
            raise ValueError(
                f"the nodes declare latents ({first['latent']}): set data.vae to the coordinator's copy of that VAE"
            )
        from ..encoders import LatentCodec

        codec = LatentCodec(cfg.data.vae)
        c = codec.vae.config
        latent = {
            "name": codec.name,
            "path": str(codec.path),
            "scaling_factor": codec.scaling_factor,
            "channels": int(c.latent_channels),
            "downsample": codec.downsample,
        }
        if latent_fingerprint({"latent": latent}) != first["latent"]:
            raise ValueError(
                f"data.vae is {latent_fingerprint({'latent': latent})}; the nodes declare {first['latent']}"
            )
    clusters = [
        {"id": k, "size": d["num_train"] + d["num_val"], "val": d["num_val"], "detail": d["detail"], "categories": {}}
        for k, d in sorted(declarations.items())
    ]
    return {
        "name": first["dataset"].split(" v")[0],
        "version": int(v) if (v := first["dataset"].rsplit(" v", 1)[-1]).isdigit() else v,
        "image_size": first["image_size"],
        "channels": first["channels"],
        "latent": latent,
        "num_images": sum(c["size"] for c in clusters),
        "num_clusters": cfg.num_experts,
        "text_encoder": first["text_encoder"],
        "text_dim": first["text_dim"],
        "max_caption_tokens": first["max_caption_tokens"],
        "cluster_features": "institution-owned: each node's own data is its cluster (no clustering)",
        "license": "held by the institutions (the coordinator holds no sample)",
        "clusters": clusters,
        DATA_FREE: True,
        "declared_by": {str(k): "node declaration" for k in sorted(declarations)},
    }


def write_descriptor(out: Path, cfg: Config, declarations: dict[int, dict]) -> Path:
    """Write the descriptor into ``out`` (``meta.json`` and the empty caption's ``uncond.safetensors``, encoded by
    the coordinator's text encoder ``data.text_encoder``, whose name must be the one the nodes declared)."""
    from ..text import TextEncoder

    meta = descriptor_meta(cfg, declarations)
    encoder = TextEncoder(cfg.data.text_encoder or None, max_length=meta["max_caption_tokens"])
    if encoder.name != meta["text_encoder"] or encoder.dim != meta["text_dim"]:
        raise ValueError(
            f"the coordinator's text encoder is {encoder.name} ({encoder.dim}-d); the nodes declare "
            f"{meta['text_encoder']} ({meta['text_dim']}-d): set data.text_encoder to the same model"
        )
    uncond, _ = encoder.encode([""])
    with DatasetWriter(out, replace=True) as writer:  # a resumed run writes it again
        writer.write_uncond(uncond.states[0], uncond.mask[0])
        writer.write_meta(meta, clusters=())  # no shard set: no cluster folder
    return out
