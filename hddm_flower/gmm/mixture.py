"""A Gaussian mixture with low-rank plus diagonal covariances: density, sampling and exact denoisers in closed form.

Data ``x0 ~ Σ_j π_j N(μ_j, Σ_j)`` with ``Σ_j = U_j U_jᵀ + diag(D_j)`` (``U_j``: d × r, ``D_j > 0``). On any affine
path ``x = a·x0 + s·ε`` (FM: ``a = 1 − t``, ``s = t``; VP: ``a = √ᾱ``, ``s = √(1 − ᾱ)``), component j gives
``x | j ~ N(a·μ_j, S_j)`` with ``S_j = a²Σ_j + s²I``, hence

* responsibilities ``r_j(x) ∝ π_j N(x; aμ_j, S_j)``,
* ``E[ε | x, j] = s·S_j⁻¹(x − aμ_j)`` and ``E[x0 | x, j] = μ_j + a·Σ_j S_j⁻¹(x − aμ_j)``,
* ``ε* = Σ_j r_j E[ε | x, j]``, ``x0* = Σ_j r_j E[x0 | x, j]`` and the FM velocity ``v* = ε* − x0*``.

Both conditional means are computed from ``w = S_j⁻¹(x − aμ_j)`` without dividing by ``a`` or ``s``, so the
endpoints are exact: at t = 1 (``a = 0``) ``x0*`` is the prior mean and ``ε* = x``; at t = 0 (``s = 0``) ``ε* = 0``
and ``x0* = x``. ``S_j = Δ + a²U_jU_jᵀ`` with ``Δ = a²D_j + s²`` diagonal is inverted by the Woodbury identity
through an r × r Cholesky factor (``torch.linalg``), so d of a few hundred stays cheap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class _PathMoments:
    log_joint: Tensor  # (B, J): log π_j + log N(x; aμ_j, S_j)
    eps: Tensor | None  # (B, J, d): E[ε | x, j]
    x0: Tensor | None  # (B, J, d): E[x0 | x, j]


class GaussianMixture:
    """``weights`` (J,), ``means`` (J, d), ``factors`` (J, d, r), ``diag`` (J, d); float64 throughout."""

    def __init__(self, weights: Tensor, means: Tensor, factors: Tensor, diag: Tensor):
        f64 = torch.float64
        self.weights = torch.as_tensor(weights, dtype=f64)
        self.means = torch.as_tensor(means, dtype=f64)
        self.factors = torch.as_tensor(factors, dtype=f64)
        self.diag = torch.as_tensor(diag, dtype=f64)
        J, d = self.means.shape
        if self.weights.shape != (J,) or self.diag.shape != (J, d) or self.factors.shape[:2] != (J, d):
            raise ValueError(
                f"inconsistent mixture shapes: weights {tuple(self.weights.shape)}, means {tuple(self.means.shape)}, "
                f"factors {tuple(self.factors.shape)}, diag {tuple(self.diag.shape)}"
            )
        if (self.weights <= 0).any() or (self.diag <= 0).any():
            raise ValueError("mixture weights and diagonal variances must be positive")

    @property
    def num_components(self) -> int:
        return self.means.shape[0]

    @property
    def dim(self) -> int:
        return self.means.shape[1]

    def subset(self, idx: list[int] | Tensor) -> GaussianMixture:
        """The components ``idx`` with their weights renormalised."""
        idx = torch.as_tensor(idx, dtype=torch.long)
        w = self.weights[idx]
        return GaussianMixture(w / w.sum(), self.means[idx], self.factors[idx], self.diag[idx])

    def covariance(self) -> Tensor:
        """Dense covariances (J, d, d) (for tests and small d)."""
        return self.factors @ self.factors.transpose(1, 2) + torch.diag_embed(self.diag)

    # ------------------------------------------------------------------------------------------------------------
    # the path moments

    def _moments(self, x: Tensor, a: Tensor, s: Tensor, means: bool = True) -> _PathMoments:
        """Per-component log joint and (with ``means``) the conditional means of ``ε`` and ``x0`` at
        ``x = a·x0 + s·ε`` (x: (B, d))."""
        x = x.to(torch.float64)
        B = x.shape[0]
        a = torch.as_tensor(a, dtype=torch.float64).reshape(-1).expand(B)
        s = torch.as_tensor(s, dtype=torch.float64).reshape(-1).expand(B)
        if B and bool((a == a[0]).all() and (s == s[0]).all()):  # one (a, s) for the batch: factor once
            a_f, s_f = a[:1], s[:1]
        else:
            a_f, s_f = a, s
        U, D, mu = self.factors, self.diag, self.means  # (J, d, r), (J, d), (J, d)
        r, shared = U.shape[-1], len(a_f) == 1
        a2 = (a_f**2)[:, None, None]
        delta = a2 * D[None] + (s_f**2)[:, None, None]  # (b, J, d), b ∈ {1, B}
        Ud = U[None] / delta[..., None]  # Δ⁻¹U: (b, J, d, r)
        cap = torch.eye(r, dtype=torch.float64) + a2[..., None] * (U[None].transpose(-1, -2) @ Ud)  # (b, J, r, r)
        chol = torch.linalg.cholesky(cap)
        logdet = torch.log(delta).sum(-1) + 2 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(-1)  # (b, J)
        # w = S⁻¹ resid = Δ⁻¹resid − a²Δ⁻¹U cap⁻¹ Uᵀ Δ⁻¹ resid (one factorisation for the batch when shared)
        cap_inv = torch.cholesky_inverse(chol)  # (b, J, r, r)
        resid = x[:, None, :] - a[:, None, None] * mu[None]  # (B, J, d)
        u = torch.einsum("jdr,bjd->bjr", Ud[0], resid) if shared else torch.einsum("bjdr,bjd->bjr", Ud, resid)
        c = a2 * (cap_inv[0] @ u[..., None])[..., 0] if shared else a2 * (cap_inv @ u[..., None])[..., 0]  # (B, J, r)
        # resid·S⁻¹resid = resid·Δ⁻¹resid − a²·uᵀ cap⁻¹ u, with u = UᵀΔ⁻¹resid
        quad = (resid**2 / delta).sum(-1) - (u * c).sum(-1)
        d = x.shape[-1]
        log_joint = torch.log(self.weights)[None] - 0.5 * (quad + logdet + d * math.log(2 * math.pi))
        if not means:
            return _PathMoments(log_joint, None, None)
        # w = S⁻¹resid = Δ⁻¹resid − a²Δ⁻¹U cap⁻¹ u
        w = resid / delta - (torch.einsum("jdr,bjr->bjd", Ud[0], c) if shared else torch.einsum("bjdr,bjr->bjd", Ud, c))
        sigma_w = torch.einsum("jdr,bjr->bjd", U, torch.einsum("jdr,bjd->bjr", U, w)) + D[None] * w  # Σ_j w
        return _PathMoments(log_joint, s[:, None, None] * w, mu[None] + a[:, None, None] * sigma_w)

    def log_prob_path(self, x: Tensor, a: Tensor, s: Tensor) -> Tensor:
        """``log p(x)`` of ``x = a·x0 + s·ε`` (B,)."""
        return torch.logsumexp(self._moments(x, a, s, means=False).log_joint, -1)

    def log_prob(self, x0: Tensor) -> Tensor:
        """``log p(x0)`` under the mixture (B,)."""
        return self.log_prob_path(x0, 1.0, 0.0)

    def log_prob_components(self, x0: Tensor) -> Tensor:
        """``log N(x0; μ_j, Σ_j)`` of every component (B, J): the component densities without their weights."""
        return self._moments(x0, 1.0, 0.0, means=False).log_joint - torch.log(self.weights)[None]

    def log_responsibilities(self, x: Tensor, a: Tensor, s: Tensor, mask: Tensor | None = None) -> Tensor:
        """``log p(j | x)`` at ``x = a·x0 + s·ε`` (B, J); ``mask`` (B, J) bool restricts each row to some components
        (``log p(j | x, j ∈ mask)``: −inf outside the mask)."""
        log_joint = self._moments(x, a, s, means=False).log_joint
        return (log_joint if mask is None else log_joint.masked_fill(~mask, float("-inf"))).log_softmax(-1)

    def component_of(self, x0: Tensor) -> Tensor:
        """The most probable component of each clean sample (B,)."""
        return self._moments(x0, 1.0, 0.0, means=False).log_joint.argmax(-1)

    def denoise(self, x: Tensor, a: Tensor, s: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``(E[ε | x], E[x0 | x])`` (B, d) at ``x = a·x0 + s·ε``; ``mask`` (B, J) bool restricts each row to some
        components (the mixture conditioned on "x0 came from one of these")."""
        m = self._moments(x, a, s)
        logits = m.log_joint if mask is None else m.log_joint.masked_fill(~mask, float("-inf"))
        r = logits.softmax(-1)[..., None]
        return (r * m.eps).sum(1), (r * m.x0).sum(1)

    def fm_velocity(self, x_t: Tensor, t: Tensor, mask: Tensor | None = None) -> Tensor:
        """The exact FM velocity ``v* = E[ε − x0 | x_t]`` on ``x_t = (1 − t)·x0 + t·ε`` (B, d)."""
        t = torch.as_tensor(t, dtype=torch.float64)
        eps, x0 = self.denoise(x_t, 1 - t, t, mask)
        return eps - x0

    def vp_eps(self, z: Tensor, alpha_bar: Tensor, mask: Tensor | None = None) -> Tensor:
        """The exact ε-prediction on the VP path ``z = √ᾱ·x0 + √(1 − ᾱ)·ε`` (B, d)."""
        ab = torch.as_tensor(alpha_bar, dtype=torch.float64)
        return self.denoise(z, ab.sqrt(), (1 - ab).sqrt(), mask)[0]

    # ------------------------------------------------------------------------------------------------------------
    # sampling

    def sample(self, n: int, generator: torch.Generator, components: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``n`` draws (n, d) and their components (n,); ``components`` fixes each draw's component."""
        j = (
            torch.multinomial(self.weights, n, replacement=True, generator=generator)
            if components is None
            else torch.as_tensor(components, dtype=torch.long)
        )
        r = self.factors.shape[-1]
        z_r = torch.randn(len(j), r, generator=generator, dtype=torch.float64)
        z_d = torch.randn(len(j), self.dim, generator=generator, dtype=torch.float64)
        x = self.means[j] + (self.factors[j] @ z_r[..., None])[..., 0] + self.diag[j].sqrt() * z_d
        return x, j

    # ------------------------------------------------------------------------------------------------------------
    # storage

    def state_dict(self) -> dict[str, Tensor]:
        return {"weights": self.weights, "means": self.means, "factors": self.factors, "diag": self.diag}

    @classmethod
    def from_state_dict(cls, state: dict[str, Tensor]) -> GaussianMixture:
        return cls(state["weights"], state["means"], state["factors"], state["diag"])
