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
    x, y = x.double(), y.double()
    n, m = len(x), len(y)
    if n < 2 or m < 2:
        raise ValueError("MMD needs at least two samples on each side")
    gamma = 1 / (2 * bandwidth**2)
    kxx = torch.exp(-gamma * torch.cdist(x, x) ** 2)
    kyy = torch.exp(-gamma * torch.cdist(y, y) ** 2)
    kxy = torch.exp(-gamma * torch.cdist(x, y) ** 2)
    return float(
        (kxx.sum() - kxx.diagonal().sum()) / (n * (n - 1))
        + (kyy.sum() - kyy.diagonal().sum()) / (m * (m - 1))
        - 2 * kxy.mean()
    )


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
        "mmd2": mmd2(x, y, bandwidth),
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
