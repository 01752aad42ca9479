"""Metrics against a known density (a ``data.name: gmm`` dataset), with confidence intervals across seeds.

For samples drawn for given prompts (each prompt = one mixture component, or the empty caption):

* ``log_density``: mean ``log p(x)`` under the true mixture, and ``delta_log_density``: that minus the same mean
  over fresh true samples for the same prompts (0 when the sampler is exact; negative when samples fall between
  or off the modes, positive when they collapse onto the densest regions);
* ``mmd2``: the unbiased squared maximum mean discrepancy to fresh true samples for the same prompts, with a
  Gaussian kernel of a fixed bandwidth (the median pairwise distance of true samples, fixed once per dataset);
  its expectation is 0 exactly when the two distributions are equal and both sets are i.i.d.; with stratified
  prompts (a fixed number per component, as in aligned inference) it is slightly negative for every row alike,
  so an exact sampler's interval should cover the true-vs-true value, not 0;
* ``delta_log_density_median`` and ``log_deficit_p90``: the median difference and the 90th-percentile difference
  of the per-sample deficit ``−log p`` (:func:`log_density_quantiles`): Δ log p is heavy-tailed;
* ``mmd2_bw0.25`` and ``mmd2_bw4``: the same MMD² at 0.25× and 4× the bandwidth (local and global structure);
* ``mode_tv``: the total-variation distance between the histogram of the components the samples fall in (their
  most probable component under the true mixture) and the target weights (the prompts' components, or the mixture
  weights for the empty caption); finite samples make it positive even for true samples: compare with that row;
* ``adherence``: the fraction of a caption's samples whose most probable component is that caption's, and
  ``cluster_adherence`` the same for the cluster.

``interval`` turns per-seed values into a mean with a Student-t 95 % interval.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .gmm import GaussianMixture


def median_bandwidth(x: Tensor) -> float:
    """The median pairwise Euclidean distance of the rows of ``x`` (the kernel bandwidth, fixed once)."""
    d = torch.cdist(x.double(), x.double())
    return float(d[torch.triu_indices(len(x), len(x), 1).unbind()].median())


def mmd2(x: Tensor, y: Tensor, bandwidth: float) -> float:
    """Unbiased MMD² between samples ``x`` (n, d) and ``y`` (m, d), kernel ``exp(−‖a − b‖² / (2·bandwidth²))``."""
    return mmd2_at(x, y, [bandwidth])[0]


def mmd2_at(x: Tensor, y: Tensor, bandwidths: list[float]) -> list[float]:
    """:func:`mmd2` at each of ``bandwidths``, the squared distances computed once."""
    x, y = x.double(), y.double()
    n, m = len(x), len(y)
    if n < 2 or m < 2:
        raise ValueError("MMD needs at least two samples on each side")
    dxx, dyy, dxy = torch.cdist(x, x) ** 2, torch.cdist(y, y) ** 2, torch.cdist(x, y) ** 2
    out = []
    for h in bandwidths:
        gamma = 1 / (2 * h**2)
        kxx, kyy, kxy = torch.exp(-gamma * dxx), torch.exp(-gamma * dyy), torch.exp(-gamma * dxy)
        out.append(
            float(
                (kxx.sum() - kxx.diagonal().sum()) / (n * (n - 1))
                + (kyy.sum() - kyy.diagonal().sum()) / (m * (m - 1))
                - 2 * kxy.mean()
            )
        )
    return out


MMD_SCALES = {"mmd2_bw0.25": 0.25, "mmd2": 1.0, "mmd2_bw4": 4.0}
"""MMD² at these multiples of the median bandwidth (the 1× one keeps its name ``mmd2``)."""


def log_density_quantiles(log_p: Tensor, log_p_true: Tensor) -> dict[str, float]:
    """The heavy-tailed log-density difference beyond its mean: the median of ``log p`` over the samples minus
    that over the true samples (``delta_log_density_median``), and the 90th percentile of the per-sample deficit
    ``−log p`` minus that of the true samples (``log_deficit_p90``: > 0 when the worst tenth of the samples is
    worse than the truth's worst tenth). Quantiles by linear interpolation (``torch.quantile``)."""
    a, b = log_p.double(), log_p_true.double()
    return {
        "delta_log_density_median": float(a.quantile(0.5) - b.quantile(0.5)),
        "log_deficit_p90": float((-a).quantile(0.9) - (-b).quantile(0.9)),
    }


def tv_distance(components: Tensor, target: Tensor) -> float:
    """``½ Σ_j |hist_j − target_j|`` between the component histogram of ``components`` and weights ``target``."""
    hist = torch.bincount(components, minlength=len(target)).double() / len(components)
    return float(0.5 * (hist - target.double()).abs().sum())


def truth_metrics(
    mixture: GaussianMixture,
    cluster_of: Tensor,
    samples: Tensor,
    true_samples: Tensor,
    prompt_components: Tensor | None,
    bandwidth: float,
) -> dict[str, float]:
    """All metrics of one set of samples (N, d) against fresh true samples for the same prompts; ``None`` prompts
    means the empty caption (the target is the whole mixture)."""
    x, y = samples.double().flatten(1), true_samples.double().flatten(1)
    if not torch.isfinite(x).all():
        raise ValueError("samples contain non-finite values")
    log_p, log_p_true = mixture.log_prob(x), mixture.log_prob(y)
    comp = mixture.component_of(x)
    if prompt_components is None:
        target = mixture.weights
    else:
        target = torch.bincount(prompt_components, minlength=mixture.num_components).double() / len(x)
    out = {
        "log_density": float(log_p.mean()),
        "delta_log_density": float(log_p.mean() - log_p_true.mean()),
        **log_density_quantiles(log_p, log_p_true),
        **dict(zip(MMD_SCALES, mmd2_at(x, y, [s * bandwidth for s in MMD_SCALES.values()]))),
        "mode_tv": tv_distance(comp, target),
    }
    if prompt_components is not None:
        out["adherence"] = float((comp == prompt_components).double().mean())
        out["cluster_adherence"] = float((cluster_of[comp] == cluster_of[prompt_components]).double().mean())
    return out


def interval(values: list[float], level: float = 0.95) -> dict[str, float]:
    """Mean and the Student-t interval of the mean across seeds (``half`` = half-width; 0 for one seed)."""
    from scipy import stats

    v = torch.tensor(values, dtype=torch.float64)
    mean = float(v.mean())
    if len(v) < 2:
        return {"mean": mean, "lo": mean, "hi": mean, "half": 0.0, "n": len(v)}
    half = float(stats.t.ppf(0.5 + level / 2, len(v) - 1) * v.std(unbiased=True) / math.sqrt(len(v)))
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "half": half, "n": len(v)}
