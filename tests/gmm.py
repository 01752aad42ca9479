"""An isotropic Gaussian mixture in D dimensions, whose optimal denoisers are closed-form.

Data ``x0 ~ Σ_j pi_j N(mu_j, s_j² I)``. On any affine path ``x = a·x0 + b·eps`` (a, b per sample), component j
gives ``x | j ~ N(a·mu_j, (a²s_j² + b²) I)``, hence closed-form posteriors and conditional means.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from hddm_flower.objectives import alpha_bar_at


class GaussianMixture:
    def __init__(self, pi, mu, s):
        self.pi = torch.as_tensor(pi, dtype=torch.float64)
        self.mu = torch.as_tensor(mu, dtype=torch.float64)  # (J, D)
        self.s = torch.as_tensor(s, dtype=torch.float64)  # (J,)

    def component(self, j: int) -> GaussianMixture:
        return GaussianMixture([1.0], self.mu[j : j + 1], self.s[j : j + 1])

    def _moments(self, x: Tensor, a: Tensor, b: Tensor):
        """Per-component posterior r (B, J), E[eps | x, j] and E[x0 | x, j] (B, J, D)."""
        a, b = a.reshape(-1, 1, 1), b.reshape(-1, 1, 1)
        var = a**2 * self.s.reshape(1, -1, 1) ** 2 + b**2  # (B, J, 1)
        resid = x[:, None, :] - a * self.mu[None]  # (B, J, D)
        D = x.shape[-1]
        log_p = (
            torch.log(self.pi)[None]
            - 0.5 * (resid**2).sum(-1) / var[..., 0]
            - 0.5 * D * torch.log(2 * math.pi * var[..., 0])
        )
        r = log_p.softmax(-1)
        e_eps = b / var * resid
        e_x0 = self.mu[None] + a * self.s.reshape(1, -1, 1) ** 2 / var * resid
        return r, e_eps, e_x0

    def posterior(self, x: Tensor, a: Tensor, b: Tensor) -> Tensor:
        return self._moments(x, a, b)[0]

    def fm_posterior(self, x_t: Tensor, t: Tensor) -> Tensor:
        return self.posterior(x_t, 1 - t, t)

    def eps_star(self, x: Tensor, a: Tensor, b: Tensor) -> Tensor:
        r, e_eps, _ = self._moments(x, a, b)
        return (r[..., None] * e_eps).sum(1)

    def ddpm_eps_star(self, z: Tensor, tau: Tensor, alpha_bar: Tensor) -> Tensor:
        """The exact ε-prediction of a DDPM network at (fractional) timestep tau on the schedule ``alpha_bar``."""
        ab = alpha_bar_at(tau, alpha_bar).expand(z.shape[0])
        return self.eps_star(z, ab.sqrt(), (1 - ab).sqrt())

    def fm_velocity_star(self, x_t: Tensor, t: Tensor) -> Tensor:
        """The exact FM velocity ``E[eps − x0 | x_t]``."""
        t = t.expand(x_t.shape[0])
        r, e_eps, e_x0 = self._moments(x_t, 1 - t, t)
        return (r[..., None] * (e_eps - e_x0)).sum(1)

    def sample(self, n: int, generator: torch.Generator) -> Tensor:
        j = torch.multinomial(self.pi, n, replacement=True, generator=generator)
        z = torch.randn(n, self.mu.shape[1], generator=generator, dtype=torch.float64)
        return self.mu[j] + self.s[j, None] * z


def three_blobs() -> GaussianMixture:
    return GaussianMixture([0.5, 0.3, 0.2], [[-1.0, 0.5], [0.8, 0.8], [0.3, -1.2]], [0.3, 0.2, 0.5])
