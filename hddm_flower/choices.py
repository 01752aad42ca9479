"""The named choices of the configuration schema and the defaults the math layer shares with it.

Torch-free on purpose: the schema (:mod:`hddm_flower.config.schema`), the command line's parser and the Flower apps read
these names without importing the tensor code that implements them. The modules that implement a choice
(:mod:`hddm_flower.objectives`, :mod:`hddm_flower.ensemble`, :mod:`hddm_flower.training`,
:mod:`hddm_flower.checkpoints`) import the tuple from here, so each list of names exists once.
"""

OBJECTIVES = ("fm", "ddpm")
"""Training objectives of an expert: Flow Matching (velocity ``eps − x0``) or DDPM (eps prediction)."""

SCHEDULES = ("linear", "cosine")
"""DDPM noise schedules (``linear``: β 1e-4 → 0.02, the ImageNet DiT checkpoint's; ``cosine``)."""

CONVERSIONS = ("schedule_aware", "naive")
"""DDPM → velocity conversions: SNR-matched timestep and input rescale, or the paper's ``round(999·t)``."""

VELOCITY_SCALINGS = ("off", "fm_rms")
"""Adaptive velocity scaling of converted DDPM velocities at high noise: ``off``, or ``fm_rms`` (cap each
converted velocity's per-sample RMS at that of the FM experts mixed into the same sample at the same step, else at
:func:`hddm_flower.objectives.velocity_rms_prior`)."""

CLEAN_ESTIMATES = ("clamp", "shrink", "shrink_naive")
"""A converted DDPM expert's clean estimate: ``clamp`` (``x0_hat`` clamped to ``±x0_clamp``), ``shrink``
(``mu + lambda(t)·(x0_hat − mu)`` with ``lambda = C/V`` measured by the node on its held-out split: an exact
network keeps its velocity) or ``shrink_naive`` (``lambda = s²/(s² + e_eps·t²/(1 − t)²)`` from the data variance and
the network's eps error: shrinks even an exact network). Experts without the measured table keep ``clamp``."""

ROUTING_MODES = ("top_k", "full", "threshold", "sample", "oracle")
"""How router probabilities become mixing weights."""

DATASETS = ("twemoji", "webdataset", "folder", "gmm")
CLUSTER_FEATURES = ("pixels", "caption", "dinov2")
WIRE_DTYPES = ("float32", "bfloat16", "float16")
"""Dtypes an expert's weights may be stored and sent in."""
OPTIMIZERS = ("auto", "fused", "foreach", "default")
"""AdamW implementations: ``auto`` picks the fused kernel where torch has one."""
LR_SCHEDULES = ("constant", "cosine")
"""Learning rate after the warm-up: constant, or a cosine decay to ``optim.min_lr_ratio`` × lr at the last step."""
FM_TIME_SAMPLINGS = ("uniform", "logit_normal")
"""How an FM expert draws its training times: uniform on (0, 1), or logit-normal (SD3: more steps at intermediate
noise, fewer at the ends)."""
PRECISIONS = ("no", "bf16")
ROUTER_CONDITIONINGS = ("none", "text")
"""What the router reads besides ``(x_t, t)``: nothing (the paper's router), or the caption's pooled text embedding
(the masked mean of its token states, :func:`hddm_flower.text.pooled_caption`)."""
ROUTER_TRAINING = ("central", "federated")
"""Where the router is trained: on the coordinator's copy of all clusters, or in rounds over the nodes."""
SERVER_OPTIMIZERS = ("adam", "avg", "median", "trimmed_avg", "krum")
"""Federated router training: Flower's FedAdam (Adam on the averaged update), FedAvg, or a robust aggregation
(FedMedian, FedTrimmedAvg, Krum) that bounds what ``router.robust_f`` hostile nodes can do to a round."""
DP_CLIPPING = ("server", "client")
"""Differential privacy of the federated router (``router.dp_noise_multiplier`` > 0): who clips each node's update,
the coordinator (Flower's ``DifferentialPrivacyServerSideFixedClipping``) or the node itself (Flower's
``DifferentialPrivacyClientSideFixedClipping`` with the ClientApp's ``fixedclipping_mod``)."""
PARTITIONS = ("central", "institution")
"""Whose data is whose: the coordinator clusters one dataset into the experts' clusters, or each node's own
prepared data is its cluster (the coordinator holds none)."""
REFERENCES = ("central", "federated")
"""FID reference statistics: the coordinator's images, or sums the nodes send."""
PROMPT_SAMPLINGS = ("random", "stratified")
"""How the evaluation draws its held-out prompts: uniformly over the dataset's captions (the cluster mix varies with
the seed and the reference is every image), or the same number per cluster, with the reference weighted to that mix
and a real-vs-real floor row (:func:`hddm_flower.evaluation.evaluate.stratified_prompts`)."""

T_EPS = 0.01
"""Guard of ``1 − t`` in the DDPM → velocity conversion: ``x0_hat = (x_t − t·eps_hat) / max(1 − t, T_EPS)``."""

X0_CLAMP = 1.0
"""Bound on a DDPM expert's clean estimate ``x0_hat`` in the conversion. Pixels live in [−1, 1], so clamping to
±1 projects the estimate onto the data's range and can only bring it closer to any clean image, elementwise.
Latent data (VAE latents, roughly unit variance with tails past ±4) need a larger bound, set in their config."""

ESTIMATE_GUARD = 1e-6
"""Guard of ``t`` and ``1 − t`` in the shrunk conversion; it only meets terms that vanish at the endpoints."""

SHRINK_BRANCH_T = 0.5
"""The shrunk velocity is ``(x_t − x0_tilde)/t`` from this t up and the equal eps form below it."""

MAX_SEED = 2**31 - 1
"""Largest seed a config may give (numpy, scikit-learn and torch all accept it, with room for per-expert offsets)."""
