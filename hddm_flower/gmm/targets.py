"""What the truth rows of a Gaussian mixture prompt, and the true draws they are scored against.

A caption c selects the components whose caption it is, ``C(c) = {j : c_j = c}``; its target is the conditional
mixture ``p(x | c) = Σ_{j ∈ C(c)} p(j | c) N(x; μ_j, Σ_j)`` with ``p(j | c) = π_j / Σ_{i ∈ C(c)} π_i``. With
pattern captions ("red ring") ``C(c)`` is one component; with colour captions ("red") it is one component per
cluster, so the caption does not fix the cluster: ``p(k | c) = Σ_{j ∈ C(c) ∩ k} p(j | c)``.

Every distinct caption is prompted ``samples_per_prompt × |C(c)|`` times (as many samples per row as one caption per
component gives), one prompt per sample in caption order. The true draws for a sample take their component from
``p(j | c)``, fixed when ``C(c)`` is one component (then no random number is spent on it, so captions that name
one component each draw exactly what a fixed component per prompt draws). Oracle routing needs each sample's
cluster: it is drawn from ``p(k | c)`` the same way, from its own seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..evaluation.evaluate import Prompts
from ..models import TextCond
from .dataset import GMMReference
from .truth import CaptionTargets


@dataclass(frozen=True)
class Captions:
    """The distinct captions of a mixture and their conditional mixtures."""

    texts: list[str]  # in order of first appearance
    states_of: Tensor  # (C,) long: a component with that caption (its row of GMMReference.cond: the text states)
    p_component: Tensor  # (C, J) float64: p(j | c)
    per_caption: Tensor  # (C,) long: |C(c)|

    @property
    def one_per_component(self) -> bool:
        return bool((self.per_caption == 1).all())


def captions_of(ref: GMMReference) -> Captions:
    """The :class:`Captions` of a mixture's reference."""
    texts = list(dict.fromkeys(ref.captions))
    has = torch.tensor([[c == d for d in ref.captions] for c in texts], dtype=torch.float64)  # (C, J)
    joint = has * ref.mixture.weights[None]
    states_of = torch.tensor([ref.captions.index(c) for c in texts], dtype=torch.long)
    return Captions(texts, states_of, joint / joint.sum(-1, keepdim=True), has.sum(-1).long())


def caption_targets(captions: Captions, samples_per_prompt: int) -> CaptionTargets:
    """Sample i's caption for ``samples_per_prompt`` samples per component, captions in order."""
    caption_of = torch.arange(len(captions.texts)).repeat_interleave(samples_per_prompt * captions.per_caption)
    return CaptionTargets(captions.p_component, caption_of)


def draw_components(p: Tensor, generator: torch.Generator) -> Tensor:
    """One component per row of ``p`` (N, J): the row's only component where every row is one-hot (no random
    number drawn), else a draw from each row."""
    if bool((p.max(-1).values == 1).all()):
        return p.argmax(-1)
    return torch.multinomial(p, 1, replacement=True, generator=generator)[:, 0]


def true_draws(ref: GMMReference, targets: CaptionTargets | None, n: int, seed: int) -> Tensor:
    """``n`` true samples (n, d): from each sample's ``p(x | c)``, or from the whole mixture (``targets`` None)."""
    g = torch.Generator().manual_seed(seed)
    components = None if targets is None else draw_components(targets.per_sample, g)
    return ref.mixture.sample(n, g, components)[0]


def sample_prompts(ref: GMMReference, captions: Captions, targets: CaptionTargets, seed: int) -> Prompts:
    """One prompt per sample: its caption's text states and, for oracle routing, a cluster drawn from ``p(k | c)``
    (the caption's cluster where it fixes one)."""
    rows = captions.states_of[targets.caption_of]
    components = draw_components(targets.per_sample, torch.Generator().manual_seed(seed))
    return Prompts(
        [captions.texts[c] for c in targets.caption_of.tolist()],
        TextCond(ref.cond.states[rows], ref.cond.mask[rows]),
        ref.cluster_of[components].clone(),
    )
