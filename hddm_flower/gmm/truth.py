"""Metrics against a known density (a ``data.name: gmm`` dataset), with confidence intervals across seeds.

For samples drawn for given prompts (each prompt a caption c, whose target is the conditional mixture
``p(x | c) = Σ_j p(j | c) N(x; μ_j, Σ_j)`` over the components with that caption (:class:`CaptionTargets`: one
component for a caption that names it, one per cluster for a colour shared by every cluster), or the empty
caption, whose target is the whole mixture):

* ``log_density``: mean ``log p(x)`` under the true mixture, and ``delta_log_density``: that minus the same mean
  over fresh true samples for the same prompts (0 when the sampler is exact; negative when samples fall between
  or off the modes, positive when they collapse onto the densest regions);
* ``delta_log_density_cond``: the same with each sample's own target ``log p(x | c)`` (a sample outside its
  caption's components costs its distance to them, not only its distance to the nearest mode);
* ``mmd2``: the unbiased squared maximum mean discrepancy to fresh true samples for the same prompts, with a
  Gaussian kernel of a fixed bandwidth (the median pairwise distance of true samples, fixed once per dataset);
  its expectation is 0 exactly when the two distributions are equal and both sets are i.i.d.; with stratified
  prompts (a fixed number per component, as in aligned inference) it is slightly negative for every row alike,
  so an exact sampler's interval should cover the true-vs-true value, not 0;
* ``delta_log_density_median`` and ``log_deficit_p90``: the median difference and the 90th-percentile difference
  of the per-sample deficit ``−log p`` (:func:`log_density_quantiles`): Δ log p is heavy-tailed;
* ``mmd2_bw0.25`` and ``mmd2_bw4``: the same MMD² at 0.25× and 4× the bandwidth (local and global structure);
* ``mode_tv``: the total-variation distance between the histogram of the components the samples fall in (their
  most probable component under the true mixture) and the expected one, ``mean_i p(j | c_i)`` (the mixture
  weights for the empty caption); finite samples make it positive even for true samples: compare with that row;
* ``cluster_tv``: per caption, the TV distance between the clusters its samples fall in and the true
  ``p(k | c)``, weighted by the captions' shares (:func:`cluster_tv`; ``p(k)`` for the empty caption);
* ``adherence``: the fraction of samples whose most probable component has their caption, and, where every
  caption fixes its cluster, ``cluster_adherence``: the fraction that fall in their caption's cluster
  (``1 − cluster_tv`` there).

``interval`` turns per-seed values into a mean with a Student-t 95 % interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .mixture import GaussianMixture


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


METRICS = (
    "delta_log_density",
    "delta_log_density_median",
    "log_deficit_p90",
    "delta_log_density_cond",
    "mmd2_bw0.25",
    "mmd2",
    "mmd2_bw4",
    "mode_tv",
    "cluster_tv",
    "adherence",
    "cluster_adherence",
    "log_density",
)
"""Every metric :func:`truth_metrics` may report, in table order (a row has those that apply to its prompts)."""

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


@dataclass(frozen=True)
class CaptionTargets:
    """What N samples were prompted for: sample i for caption ``caption_of[i]``, whose target is the conditional
    mixture ``p(x | c) = Σ_j p(j | c) N(x; μ_j, Σ_j)`` with ``p_component[c] = p(j | c)`` (C, J) float64.

    A caption that names one component has a one-hot row; a caption shared by several components (a colour shared
    by every cluster) spreads its row over them by their weights."""

    p_component: Tensor  # (C, J)
    caption_of: Tensor  # (N,) long

    @classmethod
    def one_per_component(cls, components: Tensor, num_components: int) -> CaptionTargets:
        """Every component its own caption: sample i prompted for component ``components[i]``."""
        return cls(torch.eye(num_components, dtype=torch.float64), torch.as_tensor(components, dtype=torch.long))

    @property
    def per_sample(self) -> Tensor:
        """``p(j | c_i)`` of every sample (N, J)."""
        return self.p_component.double()[self.caption_of]

    def caption_of_component(self) -> Tensor:
        """The caption of each component (J,): the one caption whose row gives it weight."""
        return self.p_component.argmax(0)

    def p_cluster(self, cluster_of: Tensor) -> Tensor:
        """``p(k | c) = Σ_{j ∈ k} p(j | c)`` (C, K)."""
        member = torch.nn.functional.one_hot(cluster_of, int(cluster_of.max()) + 1).double()
        return self.p_component.double() @ member


def log_prob_given(mixture: GaussianMixture, x0: Tensor, targets: CaptionTargets | None) -> Tensor:
    """``log p(x_i | c_i)`` of every sample (N,) under its caption's conditional mixture; the mixture's own
    ``log p(x_i)`` for the empty caption (``targets`` None)."""
    if targets is None:
        return mixture.log_prob(x0)
    return torch.logsumexp(mixture.log_prob_components(x0) + torch.log(targets.per_sample), -1)


def cluster_tv(clusters: Tensor, targets: CaptionTargets, cluster_of: Tensor) -> float:
    """``Σ_c (n_c / N) · ½ Σ_k |hist_k(c) − p(k | c)|``: per caption, the TV distance between the clusters its samples
    fall in and the true ``p(k | c)``, weighted by the caption's share of the samples. For a caption that fixes its
    cluster k it is ``1 − hist_k(c)``, one minus the cluster adherence."""
    p = targets.p_cluster(cluster_of)
    out, n = 0.0, len(clusters)
    for c in targets.caption_of.unique():
        mine = targets.caption_of == c
        out += float(mine.sum()) / n * tv_distance(clusters[mine], p[c])
    return out


def truth_metrics(
    mixture: GaussianMixture,
    cluster_of: Tensor,
    samples: Tensor,
    true_samples: Tensor,
    targets: CaptionTargets | None,
    bandwidth: float,
) -> dict[str, float]:
    """All metrics of one set of samples (N, d) against fresh true samples for the same prompts (``targets``: what
    each sample was prompted for; ``None`` means the empty caption, whose target is the whole mixture)."""
    x, y = samples.double().flatten(1), true_samples.double().flatten(1)
    if not torch.isfinite(x).all():
        raise ValueError("samples contain non-finite values")
    log_p, log_p_true = mixture.log_prob(x), mixture.log_prob(y)
    log_c, log_c_true = log_prob_given(mixture, x, targets), log_prob_given(mixture, y, targets)
    comp = mixture.component_of(x)
    clusters = cluster_of[comp]
    if targets is None:
        mode_target = mixture.weights
        everything = CaptionTargets(mixture.weights[None], torch.zeros(len(x), dtype=torch.long))
    else:
        mode_target = targets.per_sample.mean(0)
    out = {
        "log_density": float(log_p.mean()),
        "delta_log_density": float(log_p.mean() - log_p_true.mean()),
        "delta_log_density_cond": float(log_c.mean() - log_c_true.mean()),
        **log_density_quantiles(log_p, log_p_true),
        **dict(zip(MMD_SCALES, mmd2_at(x, y, [s * bandwidth for s in MMD_SCALES.values()]))),
        "mode_tv": tv_distance(comp, mode_target),
        "cluster_tv": cluster_tv(clusters, everything if targets is None else targets, cluster_of),
    }
    if targets is not None:
        out["adherence"] = float((targets.caption_of_component()[comp] == targets.caption_of).double().mean())
        p_cluster = targets.p_cluster(cluster_of)
        if bool((p_cluster.max(-1).values == 1).all()):  # every caption fixes its cluster
            prompted = p_cluster.argmax(-1)[targets.caption_of]
            out["cluster_adherence"] = float((clusters == prompted).double().mean())
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
