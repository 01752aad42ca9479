"""Routing, the DDM decomposition and the Euler sampler against closed-form answers, in float64."""

import pytest
import torch

from hddm_flower.counts import read_counts
from hddm_flower.ensemble import Ensemble, VelocityScaling, euler_sample, routing_weights, sample_ensemble
from hddm_flower.experts import DDPMExpert, FlowMatchingExpert
from hddm_flower.objectives import cap_velocity_rms, ddpm_alpha_bar, fm_interpolate, velocity_rms, velocity_rms_prior

from .gmm import GaussianMixture, three_blobs

F64 = torch.float64


def _oracle_experts(gmm: GaussianMixture, objectives, t_eps=1e-12, x0_clamp=1e12):
    """Expert j knows component j exactly, as an FM (v*) or a DDPM (ε*, converted) network."""
    experts = {}
    for j, objective in enumerate(objectives):
        comp = gmm.component(j)
        if objective == "fm":
            experts[j] = FlowMatchingExpert(lambda x, ts, c, comp=comp: comp.fm_velocity_star(x, ts / 999))
        else:
            ab = ddpm_alpha_bar(objective)
            experts[j] = DDPMExpert(
                lambda z, tau, c, comp=comp, ab=ab: comp.ddpm_eps_star(z, tau, ab),
                objective,
                t_eps=t_eps,
                x0_clamp=x0_clamp,
            )
    return experts


@pytest.mark.parametrize("objectives", [("fm", "fm", "fm"), ("linear", "fm", "cosine")])
def test_ddm_decomposition_with_exact_posterior_gives_global_velocity(objectives):
    """Σ_k p(k | x_t)·v_k*(x_t) = v*(x_t): per-component oracle experts (homogeneous or heterogeneous) weighted by
    the exact posterior reproduce the mixture's velocity field."""
    gmm = three_blobs()
    router = lambda x_t, t: torch.log(gmm.fm_posterior(x_t, t))  # noqa: E731  exact posterior as logits
    ens = Ensemble(_oracle_experts(gmm, objectives), router, 3, routing="full")
    g = torch.Generator().manual_seed(0)
    for t in torch.linspace(0.05, 0.95, 19, dtype=F64):
        x_t = fm_interpolate(gmm.sample(128, g), torch.randn(128, 2, generator=g, dtype=F64), t)
        torch.testing.assert_close(ens.velocity(x_t, t, None), gmm.fm_velocity_star(x_t, t), rtol=0, atol=1e-6)


def test_routing_modes():
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.1, 0.1, 0.2, 0.6]], dtype=F64)
    torch.testing.assert_close(
        routing_weights(p, "top_k", k=2), torch.tensor([[0.625, 0.375, 0, 0], [0, 0, 0.25, 0.75]], dtype=F64)
    )
    torch.testing.assert_close(
        routing_weights(p, "top_k", k=1), torch.tensor([[1.0, 0, 0, 0], [0, 0, 0, 1.0]], dtype=F64)
    )
    torch.testing.assert_close(routing_weights(p, "full"), p)
    torch.testing.assert_close(
        routing_weights(p, "threshold", threshold=0.2),
        torch.tensor([[0.625, 0.375, 0, 0], [0, 0, 0.25, 0.75]], dtype=F64),
    )
    torch.testing.assert_close(
        routing_weights(p, "threshold", threshold=0.9),  # arg-max always kept
        torch.tensor([[1.0, 0, 0, 0], [0, 0, 0, 1.0]], dtype=F64),
    )
    torch.testing.assert_close(
        routing_weights(p, "oracle", labels=torch.tensor([2, 0])),
        torch.tensor([[0, 0, 1.0, 0], [1.0, 0, 0, 0]], dtype=F64),
    )
    # sampling: one-hot rows, frequencies follow the probabilities
    rows = p[:1].expand(20000, 4)
    w = routing_weights(rows, "sample", generator=torch.Generator().manual_seed(0))
    assert torch.all(w.sum(-1) == 1) and torch.all((w == 0) | (w == 1))
    torch.testing.assert_close(w.mean(0), p[0], atol=0.015, rtol=0)
    with pytest.raises(ValueError, match="unknown routing mode 'best'"):
        routing_weights(p, "best")
    with pytest.raises(ValueError, match="labels"):
        routing_weights(p, "oracle")


def test_missing_experts_are_masked_and_renormalised():
    """An expert lost in the federation never receives weight; the others' posterior is renormalised."""
    calls = []

    def expert(j):
        return FlowMatchingExpert(lambda x, ts, c, j=j: (calls.append(j), torch.full_like(x, float(j)))[1])

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]], dtype=F64)).expand(4, 3)
    ens = Ensemble({0: expert(0), 2: expert(2)}, lambda x, t: logits, 3, routing="full")  # expert 1 missing
    torch.testing.assert_close(
        ens.posterior(torch.zeros(4, 1, dtype=F64), torch.zeros(4, dtype=F64)),
        torch.tensor([[5 / 7, 0, 2 / 7]], dtype=F64).expand(4, 3),
    )
    v = ens.velocity(torch.zeros(4, 1, dtype=F64), torch.full((4,), 0.5, dtype=F64), None)
    torch.testing.assert_close(v, torch.full((4, 1), 4 / 7, dtype=F64))
    assert 1 not in calls
    with pytest.raises(ValueError, match="outside"):
        Ensemble({5: expert(0)}, lambda x, t: logits, 3)


def test_top_k_only_evaluates_selected_experts_and_cfg_is_per_expert():
    """Each row calls only its top-k experts; guidance is applied inside each expert before mixing."""
    seen = {j: 0 for j in range(3)}

    def expert(j):
        def net(x, ts, c):
            seen[j] += x.shape[0]
            return c.expand_as(x) + j  # conditional output c + j, unconditional u + j

        return FlowMatchingExpert(net)

    logits = torch.log(torch.tensor([[0.6, 0.3, 0.1], [0.1, 0.3, 0.6]], dtype=F64))
    ens = Ensemble({j: expert(j) for j in range(3)}, lambda x, t: logits, 3, routing="top_k", k=2)
    cond, uncond = torch.ones(2, 1, dtype=F64), torch.zeros(2, 1, dtype=F64)
    v = ens.velocity(torch.zeros(2, 1, dtype=F64), torch.full((2,), 0.5, dtype=F64), cond, uncond, cfg_scale=3.0)
    # guided v_j = (0 + j) + 3·((1 + j) − (0 + j)) = 3 + j; mixed with renormalised top-2 weights
    torch.testing.assert_close(
        v, torch.tensor([[3 + (0.6 * 0 + 0.3 * 1) / 0.9], [3 + (0.3 * 1 + 0.6 * 2) / 0.9]], dtype=F64)
    )
    assert seen == {0: 2, 1: 4, 2: 2}  # rows × (cond + uncond)


def test_euler_sampler_on_analytic_fields():
    # constant velocity c: x_0 = x_1 − c exactly, for any number of steps
    x1 = torch.randn(5, 3, dtype=F64, generator=torch.Generator().manual_seed(0))
    c = torch.tensor([0.5, -1.0, 2.0], dtype=F64)
    torch.testing.assert_close(euler_sample(lambda x, t: c.expand_as(x), x1, 7), x1 - c)
    # v = 3t²: x_0 = x_1 − 1 exactly in the limit; Euler's error is first order in the step size
    errs = [
        (euler_sample(lambda x, t: 3 * t[:, None] ** 2 * torch.ones_like(x), x1, n) - (x1 - 1)).abs().max()
        for n in (100, 200)
    ]
    assert errs[1] < 1e-2 and 1.9 < errs[0] / errs[1] < 2.1


def test_ensemble_sampler_transports_noise_to_the_mixture():
    """Exact heterogeneous experts + exact router + Euler: samples land on the mixture (means and weights)."""
    gmm = GaussianMixture([0.7, 0.3], [[-2.0, 0.0], [2.0, 1.0]], [0.2, 0.3])
    router = lambda x_t, t: torch.log(gmm.fm_posterior(x_t, t))  # noqa: E731
    ens = Ensemble(_oracle_experts(gmm, ("cosine", "fm"), t_eps=0.01, x0_clamp=20.0), router, 2, routing="full")
    noise = torch.randn(4000, 2, dtype=F64, generator=torch.Generator().manual_seed(1))
    x0 = sample_ensemble(ens, noise, None, num_steps=200)
    left = x0[:, 0] < 0
    assert abs(left.double().mean().item() - 0.7) < 0.03
    torch.testing.assert_close(x0[left].mean(0), gmm.mu[0], atol=0.03, rtol=0)
    torch.testing.assert_close(x0[~left].mean(0), gmm.mu[1], atol=0.05, rtol=0)
    assert abs(x0[left].std(0).mean().item() - 0.2) < 0.03


@pytest.mark.parametrize("mode", ["top_k", "full", "threshold", "sample", "oracle"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_every_mode_gives_rows_summing_to_one(mode, k):
    """On hand-made router outputs: rows sum to 1; top-k keeps exactly k; threshold keeps the arg-max and every
    expert at or above the threshold; sample and oracle are one-hot; weights are the renormalised posterior."""
    g = torch.Generator().manual_seed(k)
    probs = torch.rand(64, 5, generator=g, dtype=F64) ** 3
    probs = probs / probs.sum(-1, keepdim=True)
    labels = torch.randint(0, 5, (64,), generator=g)
    w = routing_weights(probs, mode, k=k, threshold=0.25, labels=labels, generator=g)
    torch.testing.assert_close(w.sum(-1), torch.ones(64, dtype=F64))
    assert torch.all(w >= 0)
    kept = w > 0
    if mode == "top_k":
        assert torch.all(kept.sum(-1) == k)
        assert torch.all(probs.masked_fill(~kept, 2).amin(-1) >= probs.masked_fill(kept, -1).amax(-1))
    if mode == "threshold":
        assert torch.all(kept == ((probs >= 0.25) | (probs == probs.amax(-1, keepdim=True))))
    if mode in ("top_k", "threshold", "full"):  # the kept experts' probabilities, renormalised
        torch.testing.assert_close(w, torch.where(kept, probs, 0) / torch.where(kept, probs, 0).sum(-1, keepdim=True))
    if mode in ("sample", "oracle"):
        assert torch.all(kept.sum(-1) == 1) and torch.all(w[kept] == 1)
    if mode == "oracle":
        assert torch.equal(w.argmax(-1), labels)


def _tiny_ensemble(routing: str, k: int):
    from hddm_flower.models import ExpertNet, TextCond, expert_config

    torch.manual_seed(0)
    mc = expert_config("test", sample_size=8, in_channels=3, caption_channels=12)
    nets = [ExpertNet.from_config(mc).double().eval() for _ in range(3)]
    experts = {
        0: FlowMatchingExpert(nets[0]),
        1: DDPMExpert(nets[1], "cosine", x0_clamp=1.0),
        2: FlowMatchingExpert(nets[2]),
    }
    # a router whose posterior depends on x_t and t (an untrained Router's does not: its blocks start as identities)
    proj = torch.randn(3 * 8 * 8, 4, generator=torch.Generator().manual_seed(2), dtype=F64)
    router = lambda x_t, t: (x_t.flatten(1) @ proj) * (1 + t[:, None])  # noqa: E731
    ens = Ensemble(experts, router, 4, routing=routing, k=k, threshold=0.3)  # expert 3 missing
    g = torch.Generator().manual_seed(1)
    cond = TextCond(torch.randn(6, 5, 12, generator=g, dtype=F64), torch.ones(6, 5, dtype=F64))
    uncond = TextCond(torch.zeros(6, 5, 12, dtype=F64), torch.ones(6, 5, dtype=F64))
    return ens, cond, uncond, torch.randn(6, 3, 8, 8, generator=g, dtype=F64)


@pytest.mark.parametrize("routing,k", [("top_k", 1), ("top_k", 2), ("threshold", 1), ("full", 1)])
def test_grouped_sampling_equals_the_naive_per_sample_loop(routing, k):
    """The ensemble runs each selected expert once per step on the rows routed to it; a loop that samples one row
    at a time and evaluates every selected expert on it gives the same samples (tiny real experts, float64)."""
    from hddm_flower.experts import map_cond

    ens, cond, uncond, noise = _tiny_ensemble(routing, k)
    steps, cfg_scale = 4, 3.0
    with torch.no_grad():  # the batch really is split between experts
        w0 = routing_weights(ens.posterior(noise, torch.ones(len(noise), dtype=F64)), routing, k=k, threshold=0.3)
    assert (w0 > 0).any(0).sum() >= 2 and w0[:, 3].eq(0).all()
    grouped = sample_ensemble(ens, noise, cond, uncond, num_steps=steps, cfg_scale=cfg_scale)
    naive = []
    with torch.no_grad():
        for i in range(len(noise)):
            c_i, u_i = (map_cond(lambda c: c[i : i + 1], x) for x in (cond, uncond))

            def velocity(x, t):
                w = routing_weights(ens.posterior(x, t), routing, k=k, threshold=0.3)[0]
                return sum(
                    w[j] * e.velocity(x, t, c_i, u_i, cfg_scale)
                    for j, e in ((int(key), e) for key, e in ens.experts.items())
                    if w[j] > 0
                )

            naive.append(euler_sample(velocity, noise[i : i + 1], steps))
    torch.testing.assert_close(grouped, torch.cat(naive), rtol=0, atol=1e-6)
    assert not torch.allclose(grouped, noise)


def test_cap_velocity_rms_closed_form():
    v = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]], dtype=F64)  # RMS √12.5, √0.125, 0
    capped, fired = cap_velocity_rms(v, torch.tensor([1.0, 1.0, 1.0], dtype=F64))
    assert fired.tolist() == [True, False, False]
    torch.testing.assert_close(
        velocity_rms(capped), torch.tensor([1.0, 0.125**0.5, 0.0], dtype=F64), rtol=0, atol=1e-15
    )
    torch.testing.assert_close(capped[0] / capped[0].norm(), v[0] / v[0].norm(), rtol=0, atol=1e-15)  # same direction
    torch.testing.assert_close(capped[1:], v[1:], rtol=0, atol=0)
    # the prior: E‖ε − x0‖²/d = 1 + Var x0 for ε ~ N(0, I) independent of zero-mean x0
    g = torch.Generator().manual_seed(0)
    x0 = 0.7 * torch.randn(400_000, generator=g, dtype=F64)
    eps = torch.randn(400_000, generator=g, dtype=F64)
    assert abs((eps - x0).pow(2).mean().sqrt().item() - velocity_rms_prior(0.49)) < 3e-3


@pytest.mark.parametrize("routing", ["full", "top_k"])
def test_velocity_scaling_caps_converted_velocities_at_high_noise(routing):
    """fm_rms: above t_min each converted velocity's per-sample RMS is capped at the weighted RMS of the FM experts
    mixed into the same sample; below it, and with the option off, the ensemble is unchanged. Exact experts on a
    Gaussian mixture, float64, a grid of t with both endpoints."""
    gmm = three_blobs()
    experts = _oracle_experts(gmm, ("linear", "fm", "cosine"), t_eps=0.01, x0_clamp=20.0)
    router = lambda x_t, t: torch.log(gmm.fm_posterior(x_t, t).clamp(min=1e-300))  # noqa: E731
    vs = VelocityScaling("fm_rms", t_min=0.85, x0_variance=0.5)
    plain = Ensemble(experts, router, 3, routing=routing)
    scaled = Ensemble(experts, router, 3, routing=routing, velocity_scaling=vs)
    counts = {}
    experts[0].clamp_counts = experts[2].clamp_counts = counts
    g = torch.Generator().manual_seed(0)
    fired_somewhere = False
    for t in [0.0, 0.3, 0.85, 0.86, 0.9, 0.95, 0.99, 1.0]:
        t = torch.tensor(t, dtype=F64)
        x_t = fm_interpolate(gmm.sample(256, g), 3 * torch.randn(256, 2, generator=g, dtype=F64), t)
        w = routing_weights(gmm.fm_posterior(x_t, t.expand(256)), routing, k=2)
        v = {k: e.velocity(x_t, t, None) for k, e in experts.items()}
        fm_w = w[:, 1]
        ref = torch.where(fm_w > 0, velocity_rms(v[1]), torch.full_like(fm_w, 1.5**0.5))
        expected = torch.zeros_like(x_t)
        for k in range(3):
            v_k = v[k]
            if k != 1 and t > 0.85:
                factor = (ref / velocity_rms(v_k)).clamp(max=1)
                fired_somewhere |= bool((factor < 1).any())
                v_k = v_k * factor[:, None]
            expected += w[:, k : k + 1] * v_k
        torch.testing.assert_close(scaled.velocity(x_t, t, None), expected, rtol=0, atol=1e-10)
        torch.testing.assert_close(plain.velocity(x_t, t, None), sum(w[:, k : k + 1] * v[k] for k in range(3)))
    counts = read_counts(counts)
    assert fired_somewhere and counts["velocity_scaled_rows"] > 0
    assert counts["velocity_scaling_rows"] >= counts["velocity_scaled_rows"]
    if routing == "top_k":  # some samples were routed to the two DDPM experts only: capped at the prior
        assert counts["velocity_scaled_by_prior_rows"] > 0
    with pytest.raises(ValueError, match="unknown velocity scaling 'rms'"):
        VelocityScaling("rms")


@pytest.mark.parametrize("routing, k", [("top_k", 1), ("top_k", 2), ("threshold", 2), ("sample", 2), ("full", 3)])
def test_dense_and_gathered_dispatch_mix_the_same_velocity(routing, k):
    """Every expert on every row with zero weights (dense, no host read) equals each expert on its gathered rows,
    counts included, with velocity scaling and the hand-over on; float64 on a t grid with both endpoints."""
    gmm = three_blobs()
    router = lambda x_t, t: torch.log(gmm.fm_posterior(x_t, t).clamp(min=1e-300))  # noqa: E731
    vs = VelocityScaling("fm_rms", t_min=0.5)
    got = {}
    for dispatch in ("dense", "gather"):
        experts = _oracle_experts(gmm, ("linear", "fm", "cosine"), t_eps=0.01, x0_clamp=20.0)
        counts = {}
        experts[0].clamp_counts = experts[2].clamp_counts = counts
        ens = Ensemble(experts, router, 3, routing=routing, k=k, velocity_scaling=vs, handover_t=0.9, dispatch=dispatch)
        ens.handover_counts = {}
        g, draw = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)
        vs_t = []
        for t in (0.0, 0.3, 0.6, 0.95, 1.0):
            t = torch.tensor(t, dtype=F64)
            x_t = fm_interpolate(gmm.sample(64, g)[0], torch.randn(64, 2, generator=g, dtype=F64), t)
            vs_t.append(ens.velocity(x_t, t, None, generator=draw))
        got[dispatch] = (torch.stack(vs_t), read_counts(counts), read_counts(ens.handover_counts))
    torch.testing.assert_close(got["dense"][0], got["gather"][0], rtol=0, atol=1e-12)
    assert got["dense"][1:] == got["gather"][1:] and got["dense"][1]["rows"] > 0
    with pytest.raises(ValueError, match="unknown dispatch 'sparse'"):
        Ensemble(_oracle_experts(gmm, ("fm",)), router, 1, dispatch="sparse")
