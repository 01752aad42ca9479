"""Closed-form yardsticks for a trained network's excess loss over Bayes on a Gaussian mixture: the excess of a
denoiser that knows each caption's mean but not its covariance.

A caption that names component j fixes its target ``N(μ_j, Σ_j)``. On the FM path ``x = a·x0 + s·ε`` (``a = 1 − t``,
``s = t``) the exact velocity is affine in x (:mod:`hddm_flower.gmm.mixture` with one component):
``v*(x) = M_Σ (x − aμ_j) − μ_j`` with ``M_Σ = (s·I − a·Σ) S⁻¹`` and ``S = a²Σ + s²I`` (Σ and S commute). A denoiser
with the right mean and another covariance Σ' errs by ``(M_Σ' − M_Σ)(x − aμ_j)``, and ``x − aμ_j ~ N(0, S)``, so its
excess loss per dimension is ``tr(ΔM S ΔMᵀ) / d``. No division by a or s: at t = 0 (``M = −I``) and t = 1
(``M = I``) every such denoiser is exact, and the excess is 0.

Two levels, each with one covariance for every caption (:func:`mean_only_covariances`, :func:`mean_only_levels`):

* ``isotropic``: ``σ̄²·I``, σ̄² the mixture's average within-component variance per dimension — one scalar shrink
  towards the caption's mean for every pixel, the best such denoiser over the whole mixture;
* ``pooled``: the mixture's average within-component covariance ``Σ̄ = Σ_j π_j Σ_j``, the best affine denoiser over
  the whole mixture that knows the caption's mean and takes one gain for every caption.

Both are evaluated on one cluster's components at a time (:func:`mean_only_levels`), with the whole mixture's
covariance: what one network that serves every caption would reach there.

They locate a trained network's excess; an equal excess does not say how the network got there (errors in the
means and in the covariances add, and differ by t).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .mixture import GaussianMixture


def velocity_gain(cov: Tensor, t: float) -> Tensor:
    """``M_Σ = (t·I − (1 − t)·Σ) S⁻¹``, ``S = (1 − t)²Σ + t²I``: the exact FM velocity of ``N(μ, Σ)`` is
    ``M_Σ (x − (1 − t)μ) − μ``."""
    a, s = 1.0 - t, t
    eye = torch.eye(cov.shape[0], dtype=cov.dtype)
    return torch.linalg.solve(a * a * cov + s * s * eye, s * eye - a * cov)


def covariance_excess(true_cov: Tensor, used_cov: Tensor, t: float) -> float:
    """The excess loss per dimension, on ``x_t`` of ``N(μ, true_cov)``, of the velocity that takes ``used_cov`` for
    the covariance (and the right mean) against the exact one."""
    a, s = 1.0 - t, t
    delta = velocity_gain(used_cov, t) - velocity_gain(true_cov, t)
    S = a * a * true_cov + s * s * torch.eye(true_cov.shape[0], dtype=true_cov.dtype)
    return float(torch.einsum("ij,jk,ik->", delta, S, delta)) / true_cov.shape[0]


def mean_only_covariances(mixture: GaussianMixture) -> dict[str, Tensor]:
    """The one covariance each level takes for every caption: ``pooled`` ``Σ_j π_j Σ_j`` and ``isotropic`` its
    average variance per dimension times I."""
    pooled = torch.einsum("j,jde->de", mixture.weights, mixture.covariance())
    return {"isotropic": torch.eye(mixture.dim, dtype=pooled.dtype) * torch.diagonal(pooled).mean(), "pooled": pooled}


def mean_only_levels(mixture: GaussianMixture, members: Tensor, times: Sequence[float]) -> dict[str, list[float]]:
    """Per t of ``times``: the excess loss per dimension of the ``isotropic`` and ``pooled`` denoisers (module
    docstring) on the components ``members`` (one cluster's), weighted as the mixture weighs them within them."""
    cov = mixture.covariance()
    w = mixture.weights[members] / mixture.weights[members].sum()
    return {
        name: [sum(float(wi) * covariance_excess(cov[j], used, t) for wi, j in zip(w, members.tolist())) for t in times]
        for name, used in mean_only_covariances(mixture).items()
    }


def affine_floor(
    mixture: GaussianMixture, fitted_on: Tensor, evaluated_on: Tensor, times: Sequence[float]
) -> list[float]:
    """Per t of ``times``: the excess loss per dimension, on the components ``evaluated_on`` (weighted as the mixture
    weighs them within them), of the best velocity over the components ``fitted_on`` (weighted alike) among those
    affine in x with one gain for every caption and a shift of each caption's own (a caption naming one component).

    For a gain A the best shift of component j is ``E[v* − A x | j]``, which leaves ``tr((A − M_j) S_j (A − M_j)ᵀ)``;
    its minimum over A solves ``Σ_j π_j (A − M_j) S_j = 0``, and since ``M_j S_j = s·I − a·Σ_j`` that is
    ``A = (s·I − a·Σ̄)(a²Σ̄ + s²I)⁻¹ = M_Σ̄`` with Σ̄ the ``fitted_on`` components' weighted covariance: the
    ``pooled`` level of those components. ``fitted_on`` = all components is what one network for every caption
    reaches at best in this class; ``fitted_on`` = ``evaluated_on`` = one cluster's, what that cluster's expert does."""
    cov = mixture.covariance()
    fitted_on, evaluated_on = torch.as_tensor(fitted_on), torch.as_tensor(evaluated_on)
    if not set(evaluated_on.tolist()) <= set(fitted_on.tolist()):  # a caption the network never had has no shift
        raise ValueError(f"affine_floor: evaluated_on {evaluated_on.tolist()} is not within fitted_on")
    wf = mixture.weights[fitted_on] / mixture.weights[fitted_on].sum()
    pooled = torch.einsum("j,jde->de", wf, cov[fitted_on])
    we = mixture.weights[evaluated_on] / mixture.weights[evaluated_on].sum()
    return [
        sum(float(w) * covariance_excess(cov[j], pooled, t) for w, j in zip(we, evaluated_on.tolist())) for t in times
    ]


def width_floor(mixture: GaussianMixture, fitted_on: Tensor, times: Sequence[float], width: int) -> list[float]:
    """Per t of ``times``: a lower bound on the excess loss per dimension, over the components ``fitted_on``
    (weighted as the mixture weighs them within them), of every velocity ``v̂(x, c) = A·x + b_c + W·h(x, c)`` whose W
    has ``width`` columns, whatever h is: any first layers, activation or training (a caption naming one component).

    The part of v̂ that depends on x beyond one gain A for every caption lies in the span of W; off it, with P the
    projector onto that span, the residual of component j is at least ``(I − P)(M_j − A)(x − E[x | j])``, whose mean
    square ``tr((I − P)(M_j − A) S_j (M_j − A)ᵀ)`` is the whole bound. Over A its weighted sum is least at the same
    gain for every P, ``A* = M_Σ̄`` (:func:`affine_floor`), and over P of rank ``width`` it is the sum of all but the
    ``width`` largest eigenvalues of ``C = Σ_j π_j (M_j − A*) S_j (M_j − A*)ᵀ`` (Ky Fan). With ``width`` = 0 it is
    :func:`affine_floor` over ``fitted_on``; an h free to be any function of x and c attains it."""
    if width < 0:
        raise ValueError(f"width_floor: width {width} must be ≥ 0")
    cov, d = mixture.covariance(), mixture.dim
    fitted_on = torch.as_tensor(fitted_on)
    wf = mixture.weights[fitted_on] / mixture.weights[fitted_on].sum()
    pooled = torch.einsum("j,jde->de", wf, cov[fitted_on])
    eye = torch.eye(d, dtype=cov.dtype)
    out = []
    for t in times:
        A = velocity_gain(pooled, t)
        C = torch.zeros(d, d, dtype=cov.dtype)
        for w, j in zip(wf.tolist(), fitted_on.tolist()):
            D = velocity_gain(cov[j], t) - A
            C += w * D @ ((1 - t) ** 2 * cov[j] + t * t * eye) @ D.T
        eig = torch.linalg.eigvalsh((C + C.T) / 2)  # ascending: the d − width smallest are what P cannot hold
        out.append(float(eig[: max(d - width, 0)].clamp(min=0).sum()) / d)
    return out
