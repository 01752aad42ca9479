"""What a node computes on its own data so that the router and the evaluation need no pooled data (framework-free).

Three pieces, each a pure function of one node's data; the Flower adapters (``clients/round_handlers.py``,
``strategies/router_rounds.py``) move only their results:

* :class:`FeatureSums`: FID reference statistics as sums, ``(n, Σf, Σffᵀ)`` in float64. Sums of disjoint sets add,
  so the server's total equals the statistics of the pooled images exactly (up to float64 rounding), and
  :func:`frechet_distance_from_sums` gives the same FID as :func:`hddm_flower.evaluation.metrics.frechet_distance` on the
  pooled features (both go through torchmetrics' FID; only its reference state is set from the sums).
* :func:`router_local_update`: a few SGD steps of the router on one node's clusters (often a single cluster: every
  label the same, the hardest non-IID case), returning the new weights for the server to average, weighted by
  the node's number of training images (FedAvg's n_k), so that the average follows the pooled data's loss.
* :func:`feature_net_local_update`: the same for the evaluation's feature classifier (offline FID features).
* :func:`router_confusion`: the router's confusion counts on one node's held-out images at given times; counts
  add across nodes, so the server's accuracy is exactly the pooled accuracy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..data import Dataset
from ..models import Router
from ..objectives import fm_interpolate
from ..training import drop_pooled_captions

# ----------------------------------------------------------------------------------------------------------------
# Reference statistics as sums


@dataclass
class FeatureSums:
    """Sufficient statistics of a feature set: ``count`` = n, ``total`` = Σf (d,), ``outer`` = Σffᵀ (d, d),
    float64. ``a + b`` is the statistics of the union of two disjoint sets."""

    count: int
    total: Tensor
    outer: Tensor

    @classmethod
    def of(cls, features: Tensor) -> FeatureSums:
        """The sums of a feature matrix (N, d)."""
        if features.ndim != 2:
            raise ValueError(f"features must be (N, d), got {tuple(features.shape)}")
        f = features.double()
        return cls(len(f), f.sum(0), f.T @ f)

    @classmethod
    def zeros(cls, dim: int) -> FeatureSums:
        return cls(0, torch.zeros(dim, dtype=torch.float64), torch.zeros(dim, dim, dtype=torch.float64))

    @property
    def dim(self) -> int:
        return int(self.total.shape[0])

    def __add__(self, other: FeatureSums) -> FeatureSums:
        if self.dim != other.dim:
            raise ValueError(f"cannot add feature sums of dimension {self.dim} and {other.dim}")
        return FeatureSums(self.count + other.count, self.total + other.total, self.outer + other.outer)

    def mean_cov(self) -> tuple[Tensor, Tensor]:
        """μ = Σf / n and the unbiased covariance (Σffᵀ − n μμᵀ) / (n − 1)."""
        if self.count < 2:
            raise ValueError(f"need at least 2 samples for a covariance, got {self.count}")
        mu = self.total / self.count
        return mu, (self.outer - self.count * torch.outer(mu, mu)) / (self.count - 1)

    def to_numpy(self) -> dict[str, np.ndarray]:
        """Plain arrays (for the wire): ``count`` (1,) int64, ``total`` (d,), ``outer`` (d, d) float64."""
        return {
            "count": np.array([self.count], dtype=np.int64),
            "total": self.total.numpy(),
            "outer": self.outer.numpy(),
        }

    @classmethod
    def from_numpy(cls, arrays: dict[str, np.ndarray], source: str = "feature sums") -> FeatureSums:
        """The inverse of :meth:`to_numpy`, checking what a peer sent: shapes, dtype, finiteness, symmetry, and
        sums that ``count`` vectors can have (:func:`check_moments`: a valid covariance)."""
        try:
            count, total, outer = (np.asarray(arrays[k]) for k in ("count", "total", "outer"))
        except KeyError as e:
            raise ValueError(f"{source}: missing array {e.args[0]!r}") from None
        if count.shape != (1,) or count.dtype.kind not in "iu" or int(count[0]) < 0:
            raise ValueError(f"{source}: count must be one non-negative integer, got {count!r}")
        d = total.shape[0] if total.ndim == 1 else -1
        if total.ndim != 1 or outer.shape != (d, d):
            raise ValueError(f"{source}: expected total (d,) and outer (d, d), got {total.shape} and {outer.shape}")
        if total.dtype != np.float64 or outer.dtype != np.float64:
            raise ValueError(f"{source}: sums must be float64, got {total.dtype} and {outer.dtype}")
        if not (np.isfinite(total).all() and np.isfinite(outer).all()):
            raise ValueError(f"{source}: sums are not finite")
        if not np.allclose(outer, outer.T, rtol=1e-9, atol=1e-9 * max(1.0, float(np.abs(outer).max(initial=0)))):
            raise ValueError(f"{source}: Σffᵀ is not symmetric")
        check_moments(int(count[0]), total, outer, source)
        return cls(int(count[0]), torch.from_numpy(total.copy()), torch.from_numpy(outer.copy()))


MOMENT_RTOL = 1e-9  # eigenvalues below −MOMENT_RTOL × the largest one are negative, not float64 rounding


def check_moments(n: int, total: np.ndarray, outer: np.ndarray, source: str = "feature sums") -> None:
    """Sums that some n feature vectors can have: the scatter Σffᵀ − (Σf)(Σf)ᵀ / n (n − 1 times the covariance)
    positive semi-definite, of rank at most n − 1 (n vectors span at most n − 1 directions around their mean), and
    all zero for n = 0. Raises ``ValueError`` naming ``source``."""
    if n == 0:
        if np.abs(total).max(initial=0) or np.abs(outer).max(initial=0):
            raise ValueError(f"{source}: count 0 with non-zero sums")
        return
    scatter = outer - np.outer(total, total) / n
    eig = np.linalg.eigvalsh((scatter + scatter.T) / 2)
    tol = MOMENT_RTOL * max(1.0, float(np.abs(eig).max(initial=0)), float(np.abs(outer).max(initial=0)))
    if eig[0] < -tol:
        raise ValueError(f"{source}: the covariance is not positive semi-definite (eigenvalue {eig[0]:.3g})")
    rank = int((eig > tol * 1e3).sum())  # rounding leaves eigenvalues ~tol where n vectors leave none
    if rank > n - 1:
        raise ValueError(f"{source}: the covariance has rank {rank}, more than count − 1 = {n - 1} vectors allow")


def cluster_feature_sums(fx, dataset: Dataset, cluster: int, *, decode=None, batch_size: int = 256) -> FeatureSums:
    """Sums of ``fx``'s features over every image of one cluster (train and val, as the central reference),
    streamed from its shards (:meth:`~hddm_flower.data.Dataset.images`: images or latents only) one batch
    at a time, each decoded to pixels by ``decode`` (None: the identity) and featurised; the cluster is never held
    in memory."""

    out = FeatureSums.zeros(fx.num_features)
    for x, _ in dataset.images([cluster], batch_size=batch_size, split=None, shuffle=False, loop=False):
        out = out + FeatureSums.of(fx(decode(x) if decode is not None else x))
    return out


def frechet_distance_from_sums(reference: FeatureSums, fake: Tensor) -> float:
    """FID between the reference given by its sums and a generated feature set (N, d): torchmetrics' FID with its
    reference state set from the sums (the same float64 computation as :func:`metrics.frechet_distance`)."""
    from torchmetrics.image.fid import FrechetInceptionDistance

    from ..evaluation.metrics import _Given

    if fake.ndim != 2 or fake.shape[1] != reference.dim:
        raise ValueError(f"generated features must be (N, {reference.dim}), got {tuple(fake.shape)}")
    if reference.count < 2 or len(fake) < 2:
        raise ValueError(f"need at least 2 samples per set, got {reference.count} reference and {len(fake)} generated")
    m = FrechetInceptionDistance(feature=_Given(reference.dim)).double()
    m.real_features_sum = reference.total.clone()
    m.real_features_cov_sum = reference.outer.clone()
    m.real_features_num_samples = torch.tensor(reference.count)
    m.update(fake.double(), real=False)
    return float(m.compute())


# ----------------------------------------------------------------------------------------------------------------
# The router on one node

FEATURE_BATCH = 64  # the central feature classifier's batch (hddm_flower.evaluation.evaluate.feature_network)


def restricted_logits(logits: Tensor, local: Tensor, alpha: float) -> Tensor:
    """Restricted softmax (FedRS, Li & Zhan 2021): the logits of classes absent from this node scaled by ``alpha``
    (1 = plain softmax), so that a node with one class does not push the other classes' logits down as hard."""
    if alpha == 1.0:
        return logits
    scale = torch.full((logits.shape[-1],), float(alpha), dtype=logits.dtype, device=logits.device)
    scale[local] = 1.0
    return logits * scale


def router_loss_local(
    router: Router,
    x0: Tensor,
    labels: Tensor,
    generator: torch.Generator,
    local: Tensor,
    alpha: float,
    caption: Tensor | None = None,
) -> Tensor:
    """:func:`hddm_flower.training.router_loss` (cross-entropy of the cluster from ``(x_t, t)``, t ~ U(0, 1), and the
    pooled ``caption`` (B, dim) for a router that reads it) with the restricted softmax of
    :func:`restricted_logits` over the node's classes ``local``."""
    t = torch.rand(len(x0), generator=generator, dtype=x0.dtype)
    x_t = fm_interpolate(x0, torch.randn(x0.shape, generator=generator, dtype=x0.dtype), t)
    logits = router(x_t, t) if caption is None else router(x_t, t, caption)
    return F.cross_entropy(restricted_logits(logits, local, alpha), labels)


def _caption_batch(
    captions: Tensor | None, idx: Tensor, uncond: Tensor | None, p: float, generator: torch.Generator
) -> Tensor | None:
    """The batch's pooled captions, each replaced by the empty caption's with probability ``p`` (drawn from the
    same generator after the batch's indices, before its times and noise); None for a router that reads no caption."""
    if captions is None:
        return None
    return drop_pooled_captions(captions[idx], uncond, p, generator)


def router_local_update(
    router: Router,
    images: Tensor,
    labels: Tensor,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    alpha: float = 1.0,
    grad_clip: float | None = None,
    captions: Tensor | None = None,
    uncond_caption: Tensor | None = None,
    caption_dropout: float = 0.0,
) -> dict:
    """``steps`` plain SGD steps of ``router`` (in place) on one node's images and cluster labels (and, for a router
    that reads the caption, the node's own ``captions``: their pooled embeddings (N, dim), each replaced by
    ``uncond_caption`` (1, dim) with probability ``caption_dropout``).

    SGD without momentum keeps no state between rounds, so with one local step the average of the nodes' new
    weights, weighted by each node's number of training images n_k, is exactly one central SGD step on the
    pooled loss Σ_k (n_k / n) · (node k's batch loss): in expectation the loss of batches drawn from all the data,
    whose cluster frequencies are the router's prior. (Equal weights would train the router towards a uniform
    prior instead: wrong at t → 1, where the exact posterior is the prior.) A server optimiser (FedAdam) then
    turns these averaged steps into central Adam. Returns ``{"loss": mean loss, "images-seen": steps × batch}``.
    """
    if len(images) == 0:
        raise ValueError("no training images on this node")
    if (captions is not None) != (router.conditioning == "text") or (captions is not None and uncond_caption is None):
        raise ValueError(
            f"router conditioning {router.conditioning!r}: the node's pooled captions and the empty caption's are "
            "needed exactly when the router reads the caption"
        )
    local = torch.unique(labels)
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(router.parameters(), lr=lr)
    router.train()
    losses = []
    with torch.enable_grad():
        for _ in range(steps):
            idx = torch.randint(0, len(images), (batch_size,), generator=g)
            caption = _caption_batch(captions, idx, uncond_caption, caption_dropout, g)
            loss = router_loss_local(router, images[idx], labels[idx], g, local, alpha, caption)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if grad_clip:
                torch.nn.utils.clip_grad_norm_(router.parameters(), grad_clip)
            opt.step()
            losses.append(loss.item())
    router.eval()
    return {"loss": float(np.mean(losses)), "images-seen": steps * batch_size}


def feature_net_local_update(
    net, images: Tensor, labels: Tensor, caption_emb: Tensor, *, steps: int, batch_size: int, lr: float, seed: int
) -> dict:
    """``steps`` plain SGD steps of the evaluation's feature classifier (:class:`hddm_flower.evaluation.metrics.FeatureClassifier`,
    in place) on one node's clean images (pixels), cluster labels and caption embeddings, with the central
    classifier's objective (:func:`hddm_flower.evaluation.metrics.feature_classifier_loss`). The same machinery as
    :func:`router_local_update`: with one step per round, the server's average weighted by the nodes' training-set
    sizes is one central SGD step on the pooled loss. Returns ``{"loss", "images-seen"}``."""
    from ..evaluation.metrics import feature_classifier_loss

    if len(images) == 0:
        raise ValueError("no training images on this node")
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    net.train()
    losses = []
    with torch.enable_grad():
        for _ in range(steps):
            idx = torch.randint(0, len(images), (batch_size,), generator=g)
            loss, _ = feature_classifier_loss(net, images[idx], labels[idx], caption_emb[idx], g)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    net.eval()
    return {"loss": float(np.mean(losses)), "images-seen": steps * batch_size}


@torch.no_grad()
def router_confusion(
    router: Router,
    images: Tensor,
    labels: Tensor,
    times: Sequence[float],
    *,
    seed: int,
    batch_size: int = 256,
    captions: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Confusion counts of the router's top-1 prediction, (T, K, K) int64 (row: true cluster, column:
    predicted), and top-2 hits per time (T,), on ``images`` noised to each t with seeded noise (a router that
    reads the caption gets each image's own pooled caption, ``captions`` (N, dim))."""
    k = router.config.num_experts
    g = torch.Generator().manual_seed(seed)
    conf = torch.zeros(len(times), k, k, dtype=torch.int64)
    top2 = torch.zeros(len(times), dtype=torch.int64)
    router.eval()
    for i, t in enumerate(times):
        for j in range(0, len(images), batch_size):
            x0, y = images[j : j + batch_size], labels[j : j + batch_size]
            x_t = fm_interpolate(x0, torch.randn(x0.shape, generator=g, dtype=x0.dtype), torch.tensor(float(t)))
            tt = torch.full((len(x0),), float(t))
            logits = router(x_t, tt) if captions is None else router(x_t, tt, captions[j : j + batch_size])
            pred = logits.topk(min(2, k), -1).indices
            conf[i] += torch.bincount(y * k + pred[:, 0], minlength=k * k).reshape(k, k)
            top2[i] += (pred == y[:, None]).any(-1).sum()
    return conf, top2


def accuracy_from_confusion(conf: Tensor) -> list[float]:
    """Top-1 accuracy per time from summed confusion counts (T, K, K)."""
    n = conf.sum((1, 2)).clamp(min=1).double()
    return (conf.diagonal(dim1=1, dim2=2).sum(-1).double() / n).tolist()
