"""The federated core against closed forms and the pooled computation (float64): feature sums, FID from sums, the
router's local update (one step averaged = one central step) and confusion counts."""

import numpy as np
import pytest
import torch

from hddm_flower.data import Dataset
from hddm_flower.evaluation import metrics as M
from hddm_flower.evaluation.feature_sums import FeatureSums, cluster_feature_sums, frechet_distance_from_sums
from hddm_flower.federation.local import (
    accuracy_from_confusion,
    restricted_logits,
    router_confusion,
    router_local_update,
    router_loss_local,
)
from hddm_flower.models import Router
from hddm_flower.objectives import fm_interpolate
from tests.test_metrics import _sqrtm, _with_moments

F64 = torch.float64


def test_sums_of_disjoint_parts_equal_the_pooled_statistics():
    g = torch.Generator().manual_seed(0)
    f = torch.randn(1000, 16, generator=g, dtype=F64) * 3 + 5  # a large mean: the cancellation in Σffᵀ − nμμᵀ
    cuts = [0, 1, 130, 600, 1000]  # one part holds a single sample
    parts = [FeatureSums.of(f[a:b]) for a, b in zip(cuts, cuts[1:])]
    total = sum(parts[1:], parts[0])
    pooled = FeatureSums.of(f)
    assert total.count == 1000
    mu, cov = total.mean_cov()
    torch.testing.assert_close(mu, f.mean(0), rtol=0, atol=1e-12)
    torch.testing.assert_close(cov, torch.cov(f.T), rtol=0, atol=1e-9)
    torch.testing.assert_close(total.outer, pooled.outer, rtol=1e-12, atol=0)
    # the wire form round-trips exactly
    back = FeatureSums.from_numpy(total.to_numpy())
    assert back.count == total.count and torch.equal(back.outer, total.outer) and torch.equal(back.total, total.total)


def test_fid_from_sums_equals_the_pooled_fid_and_the_closed_form():
    g = torch.Generator().manual_seed(1)
    A, B = torch.randn(4, 4, generator=g, dtype=F64), torch.randn(4, 4, generator=g, dtype=F64)
    s1, s2 = A @ A.T + 0.5 * torch.eye(4, dtype=F64), B @ B.T + 0.1 * torch.eye(4, dtype=F64)
    m1, m2 = torch.randn(4, generator=g, dtype=F64), torch.randn(4, generator=g, dtype=F64)
    r1 = _sqrtm(s1)
    expected = ((m1 - m2).square().sum() + torch.trace(s1 + s2 - 2 * _sqrtm(r1 @ s2 @ r1))).item()
    x = _with_moments(torch.randn(300, 4, generator=g, dtype=F64), m1, s1)
    y = _with_moments(torch.randn(400, 4, generator=g, dtype=F64), m2, s2)
    nodes = [FeatureSums.of(x[:50]), FeatureSums.of(x[50:51]), FeatureSums.of(x[51:])]  # three institutions
    ref = nodes[0] + nodes[1] + nodes[2]
    assert frechet_distance_from_sums(ref, y) == pytest.approx(expected, rel=1e-9)
    assert frechet_distance_from_sums(ref, y) == pytest.approx(M.frechet_distance(x, y), abs=1e-6)


def test_node_feature_sums_stream_bounded_batches_and_equal_the_whole_cluster(dataset_dir):
    """A node's sums of one cluster, streamed from its shards, equal (float64) the sums of the whole cluster
    (train + val) featurised at once, and no call decodes or featurises more than one batch."""

    whole = torch.cat([Dataset.open(dataset_dir).split([2], split).images for split in ("train", "val")])
    proj = torch.randn(whole[0].numel(), 5, dtype=F64, generator=torch.Generator().manual_seed(2))
    net = lambda x: x.flatten(1).double() @ proj  # noqa: E731  a float64 feature map
    fx = M.FeatureExtractor("projection", 5, net)
    seen = []

    def decode(x):
        seen.append(len(x))
        return x

    got = cluster_feature_sums(fx, Dataset.open(dataset_dir), 2, decode=decode, batch_size=16)
    want = FeatureSums.of(fx(whole))
    assert got.count == want.count == len(whole) == sum(seen) and max(seen) == 16
    assert len(seen) == -(-len(whole) // 16)
    torch.testing.assert_close(got.total, want.total, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got.outer, want.outer, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "bad, what",
    [
        ({"count": np.array([-1]), "total": np.zeros(2), "outer": np.zeros((2, 2))}, "count"),
        ({"count": np.array([3]), "total": np.zeros(2), "outer": np.zeros((3, 3))}, "expected total"),
        ({"count": np.array([3]), "total": np.zeros(2, np.float32), "outer": np.zeros((2, 2))}, "float64"),
        ({"count": np.array([3]), "total": np.array([np.nan, 0]), "outer": np.zeros((2, 2))}, "finite"),
        ({"count": np.array([3]), "total": np.zeros(2), "outer": np.array([[0, 1.0], [0, 0]])}, "symmetric"),
        ({"count": np.array([3]), "total": np.zeros(2)}, "outer"),
    ],
)
def test_a_peers_malformed_sums_are_refused_with_a_reason(bad, what):
    with pytest.raises(ValueError, match=what):
        FeatureSums.from_numpy(bad, source="node 7")


def _router(seed=0):
    torch.manual_seed(seed)
    return Router(num_experts=3, sample_size=4, in_channels=1, patch_size=2, hidden_size=8, depth=1, num_heads=2)


def test_one_local_step_averaged_over_nodes_is_one_central_step():
    """Single-class nodes, one SGD step each, averaged with FedAvg's weights (each node's number of training
    images) = one SGD step on the pooled loss, each node's batch loss weighted by its share of the data."""
    g = torch.Generator().manual_seed(3)
    sizes = (10, 20, 40)
    nodes = [(torch.randn(n, 1, 4, 4, generator=g, dtype=F64), torch.full((n,), k)) for k, n in enumerate(sizes)]
    base = _router().double()
    w0 = {k: v.clone() for k, v in base.state_dict().items()}
    lr, batch = 0.5, (4, 4, 8)
    updated = []
    for (x, y), b, seed in zip(nodes, batch, (10, 11, 12)):
        r = _router().double()
        r.load_state_dict(w0)
        assert router_local_update(r, x, y, steps=1, batch_size=b, lr=lr, seed=seed)["images-seen"] == b
        updated.append(r.state_dict())
    avg = {k: sum(n * s[k] for n, s in zip(sizes, updated)) / sum(sizes) for k in w0}
    # the central step: the same batches and noise (same generators), each batch's mean loss weighted by n_k / n
    central = _router().double()
    central.load_state_dict(w0)
    central.train()
    total = 0
    for (x, y), b, seed in zip(nodes, batch, (10, 11, 12)):
        gen = torch.Generator().manual_seed(seed)
        idx = torch.randint(0, len(x), (b,), generator=gen)
        total = total + len(x) * router_loss_local(central, x[idx], y[idx], gen, torch.arange(3), 1.0)
    (total / sum(sizes)).backward()
    with torch.no_grad():
        for name, p in central.named_parameters():
            torch.testing.assert_close(avg[name], p - lr * p.grad, rtol=1e-10, atol=1e-12)


def _text_router(seed=0):
    torch.manual_seed(seed)
    return Router(
        num_experts=3, sample_size=4, in_channels=1, patch_size=2, hidden_size=8, depth=1, num_heads=2,
        conditioning="text", caption_dim=5,
    )  # fmt: skip


def test_one_local_step_of_a_prompt_aware_router_averaged_over_nodes_is_one_central_step():
    """As above with ``conditioning: text``: every node trains on its own captions' pooled embeddings with caption
    dropout; the weighted average is one central step on the pooled loss over the same batches, noise and dropped
    captions (drawn by the central :func:`hddm_flower.training.drop_pooled_captions`)."""
    from hddm_flower.training import drop_pooled_captions

    g = torch.Generator().manual_seed(5)
    sizes = (10, 20, 40)
    nodes = [
        (torch.randn(n, 1, 4, 4, generator=g, dtype=F64), torch.full((n,), k), torch.randn(n, 5, generator=g, dtype=F64))
        for k, n in enumerate(sizes)
    ]  # fmt: skip
    uncond = torch.randn(1, 5, generator=g, dtype=F64)
    base = _text_router().double()
    with torch.no_grad():  # off adaLN-Zero's start, where no conditioning (time or caption) reaches the logits yet
        for block in base.blocks:
            block.adaLN_modulation[1].weight.normal_(0, 0.3, generator=g)
    w0 = {k: v.clone() for k, v in base.state_dict().items()}
    lr, batch, p = 0.5, (4, 4, 8), 0.4
    updated = []
    for (x, y, c), b, seed in zip(nodes, batch, (10, 11, 12)):
        r = _text_router().double()
        r.load_state_dict(w0)
        router_local_update(
            r, x, y, steps=1, batch_size=b, lr=lr, seed=seed, captions=c, uncond_caption=uncond, caption_dropout=p
        )
        updated.append(r.state_dict())
    avg = {k: sum(n * s[k] for n, s in zip(sizes, updated)) / sum(sizes) for k in w0}
    central = _text_router().double()
    central.load_state_dict(w0)
    central.train()
    total, dropped = 0, 0
    for (x, y, c), b, seed in zip(nodes, batch, (10, 11, 12)):
        gen = torch.Generator().manual_seed(seed)
        idx = torch.randint(0, len(x), (b,), generator=gen)
        caption = drop_pooled_captions(c[idx], uncond, p, gen)
        dropped += int((caption == uncond).all(-1).sum())
        total = total + len(x) * router_loss_local(central, x[idx], y[idx], gen, torch.arange(3), 1.0, caption)
    (total / sum(sizes)).backward()
    assert 0 < dropped < sum(batch)  # the dropout did replace some captions, not all
    assert central.caption_embed[0].weight.grad.abs().sum() > 0  # the captions reach the loss
    with torch.no_grad():
        for name, q in central.named_parameters():
            torch.testing.assert_close(avg[name], q - lr * q.grad, rtol=1e-10, atol=1e-12)


def test_restricted_softmax_scales_only_absent_classes():
    logits = torch.tensor([[1.0, 2.0, -3.0, 4.0]], dtype=F64)
    out = restricted_logits(logits, torch.tensor([1]), 0.25)
    torch.testing.assert_close(out, torch.tensor([[0.25, 2.0, -0.75, 1.0]], dtype=F64))
    assert restricted_logits(logits, torch.tensor([1]), 1.0) is logits


def test_confusion_counts_add_up_to_the_pooled_accuracy():
    router = _router(1).double().eval()
    g = torch.Generator().manual_seed(4)
    x = torch.randn(30, 1, 4, 4, generator=g, dtype=F64)
    y = torch.randint(0, 3, (30,), generator=g)
    times = (0.0, 0.5, 1.0)
    conf, top2 = router_confusion(router, x, y, times, seed=5, batch_size=7)
    assert conf.dtype == torch.int64 and conf.shape == (3, 3, 3)
    assert conf.sum((1, 2)).tolist() == [30, 30, 30]
    torch.testing.assert_close(conf.sum(1 + 1), torch.bincount(y, minlength=3).expand(3, 3))  # rows: true cluster
    # the same seeded noise, computed in one batch, gives the accuracy directly
    gen = torch.Generator().manual_seed(5)
    direct = []
    with torch.no_grad():
        for t in times:
            chunks = [torch.randn(x[j : j + 7].shape, generator=gen, dtype=F64) for j in range(0, 30, 7)]
            x_t = (1 - t) * x + t * torch.cat(chunks)
            direct.append((router(x_t, torch.full((30,), t)).argmax(-1) == y).double().mean().item())
    assert accuracy_from_confusion(conf) == pytest.approx(direct, abs=1e-12)
    assert (top2 >= conf.diagonal(dim1=1, dim2=2).sum(-1)).all()


def _fedavg_rounds(nodes, weights, rounds: int, lr: float = 1.0) -> Router:
    """FedAvg with one local SGD step (batch 32) per node and round, the updates averaged with ``weights``; the
    step size decays linearly to 0 so that the last rounds settle."""
    router = _router(2).double()
    for rnd in range(rounds):
        w0, updated = {k: v.clone() for k, v in router.state_dict().items()}, []
        for k, (x, y) in enumerate(nodes):
            router.load_state_dict(w0)
            router_local_update(router, x, y, steps=1, batch_size=32, lr=lr * (1 - rnd / rounds), seed=rnd * 10 + k)
            updated.append({k: v.clone() for k, v in router.state_dict().items()})
        router.load_state_dict({k: sum(w * s[k] for w, s in zip(weights, updated)) / sum(weights) for k in w0})
    return router.eval()


def test_single_class_nodes_weighted_by_their_data_learn_the_cluster_frequencies():
    """The pooled cross-entropy's minimiser has a known property: its mean predicted probability over the pooled
    noised data equals each cluster's frequency (the loss's gradient in the output bias is E[p] − π), and so does its
    posterior at t = 1, where x_t is pure noise. FedAvg over single-class nodes reaches it when each node's update is
    weighted by its number of training images (what the ClientApp reports); equal weights train towards equal
    frequencies instead."""
    g = torch.Generator().manual_seed(0)
    sizes = (60, 30, 10)
    nodes = [
        ((k - 1.0) + 0.1 * torch.randn(n, 1, 4, 4, generator=g, dtype=F64), torch.full((n,), k))
        for k, n in enumerate(sizes)
    ]
    pooled = torch.cat([x for x, _ in nodes])[torch.randint(0, sum(sizes), (8192,), generator=g)]
    t = torch.rand(len(pooled), generator=g, dtype=F64)
    x_t = fm_interpolate(pooled, torch.randn(pooled.shape, generator=g, dtype=F64), t)
    prior = torch.tensor(sizes, dtype=F64) / sum(sizes)

    def gap(weights) -> float:
        with torch.no_grad():
            mean = _fedavg_rounds(nodes, weights, 150)(x_t, t).softmax(-1).mean(0)
        return 0.5 * float((mean - prior).abs().sum())

    assert gap(sizes) < 0.03  # measured 0.003–0.018 over seeds and 100–200 rounds
    assert gap((1, 1, 1)) > 0.05  # measured 0.068–0.081
