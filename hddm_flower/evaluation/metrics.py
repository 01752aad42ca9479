"""Sample-quality metrics, with feature extraction kept apart from the statistics.

Feature networks (each carries the ``name`` every result reports):

* :func:`inception_features`: the standard FID Inception-v3 (torch-fidelity's port, through torchmetrics) from a
  local weights file (``weights-inception-2015-12-05-6726825d.pth``); the only way to a *standard* FID.
* :class:`FeatureClassifier` (:func:`classifier_features`): the project's own small image network, trained on the
  evaluation data (cluster labels + caption embeddings) and saved with the run. Offline, FID/KID use its features:
  the numbers are "FID with features of our classifier", comparable only between runs that share that network.

Statistics over feature matrices (N, d): :func:`frechet_distance` and :func:`kernel_distance` (torchmetrics' FID
and KID on precomputed features, float64). Diversity: :func:`intra_prompt_diversity` with an LPIPS distance
(:func:`lpips_distance`: the ``lpips`` package with AlexNet when its torchvision weights are present locally;
otherwise a named fallback on the classifier's features, never a random backbone). :func:`clip_score` when a
local CLIP folder is configured.

Its length is the feature networks and the statistics computed on their features, kept side by side so that each
result and the network it names are read together.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import Tensor, nn

ALEXNET_FILE = "alexnet-owt-7be5be79.pth"  # torchvision's AlexNet_Weights.IMAGENET1K_V1 file name
LPIPS_MIN_SIZE = 64  # AlexNet's stride-4 stem and three max-pools need at least this many pixels per side


@dataclass
class FeatureExtractor:
    """A named image → feature map: ``fn(images in [−1, 1], (N, C, H, W)) → (N, d)``."""

    name: str
    num_features: int
    fn: Callable[[Tensor], Tensor]
    batch_size: int = 256
    device: torch.device = torch.device("cpu")  # where ``fn`` runs; the features come back to the CPU
    fingerprint: str = ""  # identifies the weights (cache key of reference statistics)

    @torch.no_grad()
    def __call__(self, images: Tensor) -> Tensor:
        """Features (N, d) in float64 on the CPU, computed in batches on ``device``."""
        if not len(images):
            return torch.zeros(0, self.num_features, dtype=torch.float64)
        return torch.cat(
            [
                self.fn(images[i : i + self.batch_size].to(self.device)).double().cpu()
                for i in range(0, len(images), self.batch_size)
            ]
        )


# ----------------------------------------------------------------------------------------------------------------
# Feature networks


def inception_features(weights_path: str | os.PathLike, device: str | torch.device = "cpu") -> FeatureExtractor:
    """The FID Inception-v3 pool features (2048-d) from a local torch-fidelity weights file."""
    from torchmetrics.image.fid import NoTrainInceptionV3

    path = Path(weights_path)
    if not path.is_file():
        raise FileNotFoundError(f"Inception weights file {path} does not exist")
    torch.load(path, map_location="cpu", weights_only=True)  # refuse a pickle with code before torch-fidelity loads it
    net = NoTrainInceptionV3(
        name="inception-v3-compat", features_list=["2048"], feature_extractor_weights_path=str(path)
    ).eval()
    net.to(device)

    def fn(images: Tensor) -> Tensor:
        x = ((images.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        return net(x).reshape(len(x), -1)

    return FeatureExtractor(
        f"inception-v3 pool3 2048-d ({path.name})",
        2048,
        fn,
        batch_size=64,
        device=torch.device(device),
        fingerprint=f"{path.name}:{path.stat().st_size}",
    )


class FeatureClassifier(ModelMixin, ConfigMixin):
    """A small CNN trained on the evaluation data: cluster logits and the caption's sentence embedding from a
    ``feature_dim`` embedding that FID/KID use. ``layers`` returns the activations the LPIPS-style fallback uses."""

    @register_to_config
    def __init__(
        self,
        in_channels: int = 3,
        num_classes: int = 8,
        text_dim: int = 384,
        feature_dim: int = 64,
        widths: tuple[int, ...] = (32, 64, 128),
    ):
        super().__init__()
        blocks, c = [], in_channels
        for w in widths:
            blocks.append(
                nn.Sequential(
                    nn.Conv2d(c, w, 3, padding=1),
                    nn.GroupNorm(8, w),
                    nn.SiLU(),
                    nn.Conv2d(w, w, 3, padding=1, stride=2),
                    nn.GroupNorm(8, w),
                    nn.SiLU(),
                )
            )
            c = w
        self.blocks = nn.ModuleList(blocks)
        self.embed = nn.Linear(c, feature_dim)
        self.cls_head = nn.Linear(feature_dim, num_classes)
        self.text_head = nn.Linear(feature_dim, text_dim)

    def layers(self, x: Tensor) -> list[Tensor]:
        out = []
        for block in self.blocks:
            x = block(x)
            out.append(x)
        return out

    def features(self, x: Tensor) -> Tensor:
        return self.embed(self.layers(x)[-1].mean((2, 3)))  # (B, feature_dim)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        f = F.silu(self.features(x))
        return self.cls_head(f), self.text_head(f)


def feature_classifier_loss(
    net: FeatureClassifier, x: Tensor, labels: Tensor, caption_emb: Tensor, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """The feature classifier's objective on one batch: cross-entropy on the cluster labels plus the cosine
    distance of its text head to the caption embedding, on images flipped horizontally at random. Returns
    (loss, logits)."""
    flip = (torch.rand(len(x), generator=generator) < 0.5).to(x.device)
    x = torch.where(flip[:, None, None, None], x.flip(-1), x)
    logits, e = net(x)
    return F.cross_entropy(logits, labels) + (1 - F.cosine_similarity(e, caption_emb)).mean(), logits


def train_feature_classifier_stream(
    batches,
    num_classes: int,
    *,
    in_channels: int,
    text_dim: int,
    steps: int = 600,
    lr: float = 2e-3,
    seed: int = 0,
    device: str | torch.device = "cpu",
    progress: bool = False,
) -> tuple[FeatureClassifier, dict]:
    """Train :class:`FeatureClassifier` on ``(images, cluster labels, caption embeddings)`` batches (a stream: the
    data never has to fit in memory) on ``device``: cross-entropy on the labels plus cosine distance to the caption
    embedding, with random horizontal flips. Returns (net, stats); ``train_accuracy`` is measured on the batches of
    the last tenth of the steps."""
    from ..config.sections import OptimConfig
    from ..training import fit

    device = torch.device(device)
    torch.manual_seed(seed)
    net = FeatureClassifier(in_channels=in_channels, num_classes=num_classes, text_dim=text_dim).to(device)
    hits = torch.zeros(2, device=device)  # correct, seen over the last tenth (stays on the device)
    step = [0]

    def loss_fn(g: torch.Generator) -> Tensor:
        x, y, emb = (t.to(device, non_blocking=True) for t in next(batches))
        loss, logits = feature_classifier_loss(net, x, y, emb, g)
        step[0] += 1
        if step[0] > steps - max(1, steps // 10):
            hits[0] += (logits.argmax(-1) == y).sum()
            hits[1] += len(y)
        return loss

    net.train()
    with torch.enable_grad():
        stats, _ = fit(
            net,
            loss_fn,
            OptimConfig(lr=lr, warmup_steps=min(50, steps)),
            steps=steps,
            seed=seed,
            log_every=max(1, steps // 5),
            name="feature classifier",
            progress=progress,
        )
    net.eval()
    return net, {
        "steps": steps,
        "lr": lr,
        "seed": seed,
        "final_loss": stats.final_loss,
        "train_accuracy": (hits[0] / hits[1].clamp(min=1)).item(),
        "device_seconds": round(stats.device_seconds, 3),
    }


def classifier_features(net: FeatureClassifier, description: str) -> FeatureExtractor:
    return FeatureExtractor(
        f"hddm feature classifier {net.config.feature_dim}-d ({description})",
        net.config.feature_dim,
        lambda x: net.features(x),
        device=next(net.parameters()).device,
        fingerprint=state_fingerprint(net),
    )


def state_fingerprint(net: nn.Module) -> str:
    """sha256 (16 hex digits) of a network's state: names, shapes, dtypes and values."""
    h = hashlib.sha256()
    for name, t in sorted(net.state_dict().items()):
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------------------------------------------
# Statistics over features


class GivenFeatures(nn.Module):
    """Feeds precomputed features to torchmetrics' FID/KID (the statistics without their feature extraction)."""

    def __init__(self, num_features: int):
        super().__init__()
        self.num_features = num_features

    def forward(self, features: Tensor) -> Tensor:
        return features


def _check(real: Tensor, fake: Tensor, need: int) -> None:
    if real.ndim != 2 or fake.ndim != 2 or real.shape[1] != fake.shape[1]:
        raise ValueError(f"features must be (N, d) with the same d, got {tuple(real.shape)} and {tuple(fake.shape)}")
    if min(len(real), len(fake)) < need:
        raise ValueError(f"need at least {need} samples per set, got {len(real)} real and {len(fake)} generated")


def frechet_distance(real: Tensor, fake: Tensor) -> float:
    """FID statistic: ``‖μ_r − μ_f‖² + Tr(Σ_r + Σ_f − 2(Σ_r Σ_f)^½)`` of the features' Gaussian fits (float64)."""
    from torchmetrics.image.fid import FrechetInceptionDistance

    _check(real, fake, 2)
    m = FrechetInceptionDistance(feature=GivenFeatures(real.shape[1])).double()
    m.update(real.double(), real=True)
    m.update(fake.double(), real=False)
    return float(m.compute())


def kernel_distance(
    real: Tensor, fake: Tensor, *, subset_size: int = 100, subsets: int = 100, seed: int = 0
) -> tuple[float, float, int]:
    """KID (unbiased squared MMD, cubic polynomial kernel) averaged over random subsets; returns (mean, std,
    subset size used = min(subset_size, both set sizes)). Seeded: the subsets do not depend on global state."""
    from torchmetrics.image.kid import KernelInceptionDistance

    _check(real, fake, 2)
    size = min(subset_size, len(real), len(fake))
    m = KernelInceptionDistance(feature=GivenFeatures(real.shape[1]), subsets=subsets, subset_size=size)
    m.update(real.double(), real=True)
    m.update(fake.double(), real=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        mean, std = m.compute()
    return float(mean), float(std), size


# ----------------------------------------------------------------------------------------------------------------
# Diversity: intra-prompt LPIPS


@dataclass
class Distance:
    """A named perceptual distance ``fn(a, b) → (N,)`` between image batches in [−1, 1]."""

    name: str
    fn: Callable[[Tensor, Tensor], Tensor]
    device: torch.device = torch.device("cpu")  # where ``fn`` runs; the distances come back to the CPU

    @torch.no_grad()
    def __call__(self, a: Tensor, b: Tensor) -> Tensor:
        return self.fn(a.to(self.device), b.to(self.device)).reshape(len(a)).double().cpu()


def find_alexnet_weights(path: str | os.PathLike | None = None) -> Path | None:
    """The AlexNet weights file: ``path`` if given (must exist), else torchvision's cache under TORCH_HOME."""
    if path:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"AlexNet weights file {p} does not exist")
        return p
    cached = Path(torch.hub.get_dir()) / "checkpoints" / ALEXNET_FILE
    return cached if cached.is_file() else None


def _upsample(x: Tensor) -> Tensor:
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    if min(x.shape[-2:]) >= LPIPS_MIN_SIZE:
        return x
    scale = -(-LPIPS_MIN_SIZE // min(x.shape[-2:]))
    return F.interpolate(x, scale_factor=scale, mode="bilinear", align_corners=False)


def lpips_alexnet(weights_path: str | os.PathLike) -> Distance:
    """LPIPS v0.1 (``lpips`` package: its learned linear layers) on torchvision AlexNet from a local file."""
    import lpips
    import torchvision

    alex = torchvision.models.alexnet()
    alex.load_state_dict(torch.load(weights_path, map_location="cpu", weights_only=True))
    model = lpips.LPIPS(net="alex", version="0.1", pretrained=True, pnet_rand=True, verbose=False).eval()
    for name in ("slice1", "slice2", "slice3", "slice4", "slice5"):  # the slices hold AlexNet's features by index
        for idx, module in getattr(model.net, name).named_children():
            module.load_state_dict(alex.features[int(idx)].state_dict())
    return Distance(
        f"LPIPS v0.1 AlexNet ({Path(weights_path).name}; inputs upsampled to ≥{LPIPS_MIN_SIZE} px)",
        lambda a, b: model(_upsample(a), _upsample(b)),
    )


def classifier_distance(net: FeatureClassifier, description: str) -> Distance:
    """LPIPS-style fallback on the project's classifier: channel-normalised activations of each block, squared
    differences averaged over space, summed over blocks with equal (unlearned) weights. Not LPIPS: its values are
    comparable only between runs that share the same classifier."""

    def fn(a: Tensor, b: Tensor) -> Tensor:
        d = 0
        for fa, fb in zip(net.layers(a), net.layers(b)):
            d = d + (F.normalize(fa, dim=1) - F.normalize(fb, dim=1)).square().sum(1).mean((1, 2))
        return d

    return Distance(
        f"FALLBACK (not LPIPS; no AlexNet weights): LPIPS-style distance on the hddm feature classifier "
        f"({description})",
        fn,
        device=next(net.parameters()).device,
    )


def lpips_distance(
    alexnet_weights: str | os.PathLike | None = None,
    *,
    fallback: FeatureClassifier | None = None,
    fallback_description: str = "",
) -> Distance:
    """LPIPS-AlexNet when its weights are found (a given file or torchvision's cache); otherwise the named
    classifier fallback; with neither, an error (never a silently random backbone)."""
    path = find_alexnet_weights(alexnet_weights)
    if path is not None:
        return lpips_alexnet(path)
    if fallback is None:
        raise FileNotFoundError(
            f"no AlexNet weights for LPIPS ({Path(torch.hub.get_dir()) / 'checkpoints' / ALEXNET_FILE}"
            f" is absent) and no fallback network given"
        )
    return classifier_distance(fallback, fallback_description)


def intra_prompt_diversity(images: Tensor, distance: Distance) -> dict:
    """Mean pairwise distance between the samples of each prompt. ``images``: (P, S, C, H, W), S ≥ 2.
    Returns mean ± std over prompts (the paper's "0.631 ± 0.078" form) and the per-prompt values."""
    P, S = images.shape[:2]
    if S < 2:
        raise ValueError(f"intra-prompt diversity needs ≥ 2 samples per prompt, got {S}")
    i, j = torch.triu_indices(S, S, offset=1)
    per_prompt = []
    for p in range(P):
        per_prompt.append(distance(images[p, i], images[p, j]).mean().item())
    return diversity_summary(per_prompt, len(i), distance.name)


def diversity_summary(per_prompt: list[float], pairs_per_prompt: int, distance_name: str) -> dict:
    """:func:`intra_prompt_diversity`'s result from its per-prompt values (mean ± std over prompts)."""
    v = torch.tensor(per_prompt, dtype=torch.float64)
    return {
        "mean": v.mean().item(),
        "std": v.std(unbiased=False).item(),
        "per_prompt": per_prompt,
        "pairs_per_prompt": pairs_per_prompt,
        "distance": distance_name,
    }


# ----------------------------------------------------------------------------------------------------------------
# Text alignment


def _embedding(out) -> Tensor:
    """transformers ≥ 5 returns the projected embedding as ``pooler_output`` of an output object; older, a tensor."""
    return out if isinstance(out, Tensor) else out.pooler_output


@torch.no_grad()
def clip_score(images: Tensor, prompts: list[str], clip_path: str | os.PathLike, batch_size: int = 64) -> dict:
    """CLIP score with a local transformers CLIP folder: ``100 · max(cos(image, text), 0)`` averaged over the
    images (torchmetrics' definition; its own ``CLIPScore`` accepts only hub names and predates transformers 5)."""
    scorer = ClipScorer(clip_path, batch_size)
    scores = scorer(images, prompts)
    return {"value": scores.mean().item(), "model": str(scorer.path), "num_images": len(images)}


class ClipScorer:
    """The per-image CLIP scores ``100 · max(cos(image, text), 0)`` of :func:`clip_score`, the model loaded once
    (for images scored batch by batch as they are generated)."""

    def __init__(self, clip_path: str | os.PathLike, batch_size: int = 64):
        from transformers import CLIPModel, CLIPProcessor

        path = Path(clip_path)
        if not path.is_dir():
            raise FileNotFoundError(f"CLIP folder {path} does not exist")
        self.path, self.batch_size = path, batch_size
        self.model, self.processor = CLIPModel.from_pretrained(path).eval(), CLIPProcessor.from_pretrained(path)

    @torch.no_grad()
    def __call__(self, images: Tensor, prompts: list[str]) -> Tensor:
        if len(prompts) != len(images):
            raise ValueError(f"{len(images)} images but {len(prompts)} prompts")
        x = ((images.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
        scores, b = [], self.batch_size
        for i in range(0, len(x), b):
            pix = self.processor(images=list(x[i : i + b]), return_tensors="pt")["pixel_values"]
            txt = self.processor(text=prompts[i : i + b], return_tensors="pt", padding=True, truncation=True)
            img_emb = F.normalize(_embedding(self.model.get_image_features(pixel_values=pix)), dim=-1)
            txt_emb = F.normalize(
                _embedding(
                    self.model.get_text_features(input_ids=txt["input_ids"], attention_mask=txt["attention_mask"])
                ),
                dim=-1,
            )
            scores.append((100 * (img_emb * txt_emb).sum(-1)).clamp(min=0))
        return torch.cat(scores) if scores else torch.zeros(0)
