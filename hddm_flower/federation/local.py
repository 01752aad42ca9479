"""What a node computes on its own data so that the router and the evaluation need no pooled data (framework-free;
the FID statistics a node sends are :mod:`hddm_flower.evaluation.feature_sums`).

Each a pure function of one node's data; the Flower adapters (``clients/round_handlers.py``,
``strategies/router_rounds.py``) move only their results:

* :func:`router_local_update`: a few SGD steps of the router on one node's clusters (often a single cluster: every
  label the same, the hardest non-IID case), returning the new weights for the server to average, weighted by
  the node's number of training images (FedAvg's n_k), so that the average follows the pooled data's loss.
* :func:`feature_net_local_update`: the same for the evaluation's feature classifier (offline FID features).
* :func:`router_confusion`: the router's confusion counts on one node's held-out images at given times; counts
  add across nodes, so the server's accuracy is exactly the pooled accuracy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..models import Router
from ..objectives import fm_interpolate
from ..training import drop_pooled_captions

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
