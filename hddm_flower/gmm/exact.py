"""Exact experts and the exact router of a Gaussian-mixture dataset: the upper bound of the whole sampling stack.

An exact expert is a network ``net(x, timestep, cond)`` computed in closed form from the mixture
(:mod:`hddm_flower.gmm.mixture`), wrapped in the same adapters as a trained expert (:mod:`hddm_flower.experts`):

* as FM it returns the exact velocity ``v*`` of its cluster at ``t = timestep / FM_TIME_SCALE``;
* as DDPM it returns the exact ``ε*`` of its cluster on the VP path at (fractional) ``timestep`` of its discrete
  schedule, so the ``schedule_aware`` and ``naive`` conversions can be compared on an exact network.

The caption selects the components: a caption of the cluster's components conditions on them (one component for
a pattern caption, the cluster's component of that colour for a colour caption shared by every cluster); the
empty caption, and a caption of another cluster (never seen by an expert trained on this cluster), give the
cluster's unconditional density. The caption is recognised by the nearest pooled text embedding.

The exact router returns ``log p(k | x_t, t)``: the responsibilities of the mixture summed over cluster k's
components. It sees ``(x_t, t)`` only, as the paper's router does. The exact prompt-aware router
(``conditioning="text"``) returns ``log p(k | x_t, t, c)``: the responsibilities over the components compatible
with the caption c (those whose caption it is), summed over cluster k's; for the empty caption every component is
compatible and it equals the text-free posterior. It reads the caption as a trained prompt-aware router does, by
its pooled text embedding.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor, nn

from ..experts import DDPMExpert, Expert, FlowMatchingExpert
from ..models import TextCond
from ..objectives import FM_TIME_SCALE, alpha_bar_at, ddpm_alpha_bar
from ..text import pooled_caption
from .dataset import GMMReference


class CaptionIndex(nn.Module):
    """Maps text conditions to component ids by the nearest pooled embedding; −1 for the empty caption."""

    def __init__(self, reference: GMMReference):
        super().__init__()
        keys = torch.cat([pooled_caption(*reference.cond), pooled_caption(*reference.uncond)]).float()
        self.register_buffer("keys", keys, persistent=False)

    def forward(self, cond: TextCond) -> Tensor:
        return self.of_pooled(pooled_caption(cond.states.float(), cond.mask.float()))

    def of_pooled(self, pooled: Tensor) -> Tensor:
        """The component id (B,) of pooled caption embeddings (B, dim); −1 for the empty caption."""
        j = (pooled.float() @ self.keys.T).argmax(-1)
        return torch.where(j == len(self.keys) - 1, -1, j)

    def compatible(self, pooled: Tensor) -> Tensor:
        """(B, J) bool: the components whose caption a pooled embedding is (every component for the empty
        caption; several where components share a caption)."""
        keys = self.keys[:-1]
        j = self.of_pooled(pooled)
        same = (keys[j.clamp(min=0)] @ keys.T) >= (keys[j.clamp(min=0)] ** 2).sum(-1, keepdim=True) - 1e-6
        return same | (j[:, None] < 0)


class ExactNet(nn.Module):
    """The closed-form network of one cluster: ``v*`` (``objective="fm"``) or ``ε*`` (``"ddpm"``, on ``alpha_bar``)."""

    def __init__(self, reference: GMMReference, cluster: int, objective: str, alpha_bar: Tensor | None = None):
        super().__init__()
        if objective not in ("fm", "ddpm") or (objective == "ddpm") != (alpha_bar is not None):
            raise ValueError("an exact net is 'fm', or 'ddpm' with its alpha_bar table")
        members = (reference.cluster_of == cluster).nonzero().squeeze(1)
        if members.numel() == 0:
            raise ValueError(f"cluster {cluster} has no components")
        self.mixture = reference.mixture.subset(members)
        self.objective, self.cluster, self.alpha_bar = objective, cluster, alpha_bar
        local = torch.full((reference.mixture.num_components,), -1, dtype=torch.long)
        local[members] = torch.arange(len(members))
        self.register_buffer("local", local, persistent=False)
        self.captions = CaptionIndex(reference)

    def component_mask(self, cond: TextCond) -> Tensor:
        """(B, J_k) bool: the cluster's components whose caption it is (one for a caption that names a component,
        one per cluster for a colour caption shared by every cluster), or all of the cluster's components for the
        empty caption and a caption none of them has."""
        pooled = pooled_caption(cond.states.float(), cond.mask.float())
        mask = self.captions.compatible(pooled)[:, self.local >= 0]  # (B, J_k), in the cluster's component order
        return mask | ~mask.any(-1, keepdim=True)

    def forward(self, x: Tensor, timestep: Tensor, cond: TextCond) -> Tensor:
        flat = x.reshape(x.shape[0], -1)
        mask = self.component_mask(cond)
        tau = torch.as_tensor(timestep, dtype=torch.float64).reshape(-1).expand(x.shape[0])
        if self.objective == "fm":
            out = self.mixture.fm_velocity(flat, tau / FM_TIME_SCALE, mask)
        else:
            out = self.mixture.vp_eps(flat, alpha_bar_at(tau, self.alpha_bar), mask)
        return out.reshape(x.shape).to(x.dtype)


class ExactRouter(nn.Module):
    """``router(x_t, t) → log p(k | x_t, t)`` (B, K) on the FM path, from the mixture in closed form; with
    ``conditioning="text"``, ``router(x_t, t, caption) → log p(k | x_t, t, c)`` given the caption's pooled
    embedding (B, dim): the responsibilities restricted to the components compatible with the caption."""

    def __init__(self, reference: GMMReference, conditioning: str = "none"):
        super().__init__()
        if conditioning not in ("none", "text"):
            raise ValueError(f"unknown router conditioning {conditioning!r}; expected 'none' or 'text'")
        self.mixture, self.num_clusters, self.conditioning = reference.mixture, reference.num_clusters, conditioning
        one_hot = nn.functional.one_hot(reference.cluster_of, self.num_clusters).double()
        self.register_buffer("member", one_hot, persistent=False)  # (J, K)
        self.captions = CaptionIndex(reference) if conditioning == "text" else None
        C, S, _ = reference.shape
        self.config = SimpleNamespace(in_channels=C, sample_size=S)  # what the samplers read off a router

    def forward(self, x_t: Tensor, t: Tensor, caption: Tensor | None = None) -> Tensor:
        if (caption is not None) != (self.conditioning == "text"):
            raise ValueError(
                f"the exact router with conditioning {self.conditioning!r} got caption={caption is not None}"
            )
        t = torch.as_tensor(t, dtype=torch.float64).reshape(-1).expand(x_t.shape[0])
        mask = None if caption is None else self.captions.compatible(caption)
        log_r = self.mixture.log_responsibilities(x_t.reshape(x_t.shape[0], -1), 1 - t, t, mask)
        log_member = torch.log(self.member)  # 0 for members, −inf elsewhere
        return torch.logsumexp(log_r[:, :, None] + log_member[None], 1).to(x_t.dtype)


def caption_cluster_prior(reference: GMMReference) -> Tensor:
    """``p(k | c)`` (C, K) for each distinct caption c of the mixture (in order of first appearance): the weight of
    cluster k's components with caption c over that of every component with caption c. One-hot when a caption
    names one component; the clusters' shares of a colour when every cluster has a component of that colour."""
    captions = list(dict.fromkeys(reference.captions))
    member = nn.functional.one_hot(reference.cluster_of, reference.num_clusters).double()  # (J, K)
    has = torch.tensor([[c == d for d in reference.captions] for c in captions], dtype=torch.float64)  # (C, J)
    joint = (has * reference.mixture.weights[None]) @ member  # (C, K): Σ_{j ∈ k, caption j = c} π_j
    return joint / joint.sum(-1, keepdim=True)


def exact_expert(
    reference: GMMReference,
    cluster: int,
    objective: str,
    *,
    schedule: str = "cosine",
    num_train_timesteps: int = 1000,
    **ddpm_options: Any,
) -> Expert:
    """The exact expert of ``cluster`` behind the adapter of ``objective`` (``ddpm_options``: conversion, t_eps,
    x0_clamp of :class:`~hddm_flower.experts.DDPMExpert`)."""
    if objective == "fm":
        return FlowMatchingExpert(ExactNet(reference, cluster, "fm"))
    alpha_bar = ddpm_alpha_bar(schedule, num_train_timesteps)
    net = ExactNet(reference, cluster, "ddpm", alpha_bar)
    return DDPMExpert(net, schedule, num_train_timesteps, **ddpm_options)
