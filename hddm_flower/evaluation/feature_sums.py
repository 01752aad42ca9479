"""FID reference statistics as sums, ``(n, Σf, Σffᵀ)`` in float64 (:class:`FeatureSums`), what a node sends instead
of its images. Sums of disjoint sets add, so the server's total equals the statistics of the pooled images exactly
(up to float64 rounding), and :func:`frechet_distance_from_sums` gives the same FID as
:func:`hddm_flower.evaluation.metrics.frechet_distance` on the pooled features (both go through torchmetrics' FID;
only its reference state is set from the sums).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..data import Dataset


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

    from .metrics import GivenFeatures

    if fake.ndim != 2 or fake.shape[1] != reference.dim:
        raise ValueError(f"generated features must be (N, {reference.dim}), got {tuple(fake.shape)}")
    if reference.count < 2 or len(fake) < 2:
        raise ValueError(f"need at least 2 samples per set, got {reference.count} reference and {len(fake)} generated")
    m = FrechetInceptionDistance(feature=GivenFeatures(reference.dim)).double()
    m.real_features_sum = reference.total.clone()
    m.real_features_cov_sum = reference.outer.clone()
    m.real_features_num_samples = torch.tensor(reference.count)
    m.update(fake.double(), real=False)
    return float(m.compute())
