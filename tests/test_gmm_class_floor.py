"""Capacity at convergence of a class with a known optimum (hddm_flower.gmm.yardsticks.affine_floor and
benchmarks/gmm_class_floor.py): the affine floor against the normal equations solved by hand and against the mean-only
pooled level, in float64 over a grid of t with both endpoints; the least-squares fit recovers it from draws; the
summary's arithmetic."""

import pytest
import torch

from hddm_flower.gmm.mixture import GaussianMixture
from hddm_flower.gmm.yardsticks import affine_floor, mean_only_levels, velocity_gain

TIMES = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)
f64 = torch.float64


def _mixture(j: int = 5, d: int = 4, seed: int = 0) -> GaussianMixture:
    g = torch.Generator().manual_seed(seed)
    return GaussianMixture(
        torch.softmax(torch.randn(j, generator=g, dtype=f64), 0),
        torch.randn(j, d, generator=g, dtype=f64),
        torch.randn(j, d, 2, generator=g, dtype=f64),
        0.05 + torch.rand(j, d, generator=g, dtype=f64),
    )


@pytest.mark.parametrize("t", TIMES)
def test_the_affine_floor_is_the_minimum_of_the_shared_gain_objective_solved_by_hand(t):
    # Σ_j π_j tr((A − M_j) S_j (A − M_j)ᵀ) is minimised by A = (Σ π_j M_j S_j)(Σ π_j S_j)⁻¹ (the normal equations,
    # no commuting assumed); its value there, per dimension and weighted over the evaluated components, is the floor
    m, fitted, evaluated = _mixture(), torch.tensor([0, 1, 3, 4]), torch.tensor([1, 3])
    cov, d, a, s = m.covariance(), m.dim, 1 - t, t
    S = {j: a * a * cov[j] + s * s * torch.eye(d, dtype=f64) for j in range(5)}
    M = {j: velocity_gain(cov[j], t) for j in range(5)}
    w = m.weights[fitted] / m.weights[fitted].sum()
    num = sum(float(wj) * M[j] @ S[j] for wj, j in zip(w, fitted.tolist()))
    den = sum(float(wj) * S[j] for wj, j in zip(w, fitted.tolist()))
    A = torch.linalg.solve(den.T, num.T).T
    we = m.weights[evaluated] / m.weights[evaluated].sum()

    def objective(B):
        return sum(
            float(wj) * float(torch.trace((B - M[j]) @ S[j] @ (B - M[j]).T)) / d
            for wj, j in zip(we, evaluated.tolist())
        )

    floor = affine_floor(m, fitted, evaluated, (t,))[0]
    assert floor == pytest.approx(objective(A), rel=1e-10, abs=1e-14)
    if t in (0.0, 1.0):  # M = −I and I for every covariance: the class is exact
        assert abs(floor) < 1e-20
    else:
        assert floor > 1e-4

        # and A is the minimiser over fitted: no direction lowers the fitted components' objective
        def fit_obj(B):
            return sum(
                float(wj) * float(torch.trace((B - M[j]) @ S[j] @ (B - M[j]).T)) for wj, j in zip(w, fitted.tolist())
            )

        D = torch.randn(d, d, generator=torch.Generator().manual_seed(1), dtype=f64)
        assert min(fit_obj(A + e * D) for e in (-1e-3, 1e-3)) > fit_obj(A)


def test_the_affine_floor_over_all_components_is_the_pooled_level_and_one_covariance_has_none():
    m = _mixture()
    every, members = torch.arange(5), torch.tensor([0, 2])
    pooled = mean_only_levels(m, members, TIMES)["pooled"]
    assert affine_floor(m, every, members, TIMES) == pytest.approx(pooled, rel=1e-12, abs=1e-20)
    assert max(abs(x) for x in affine_floor(m, torch.tensor([0]), torch.tensor([0]), TIMES)) < 1e-12  # one: exact
    with pytest.raises(ValueError, match="not within fitted_on"):
        affine_floor(m, members, every, TIMES)
    same = GaussianMixture(m.weights, m.means, m.factors[:1].expand(5, -1, -1), m.diag[:1].expand(5, -1))
    assert max(abs(x) for x in affine_floor(same, every, members, TIMES)) < 1e-12


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    from hddm_flower.data import Dataset
    from hddm_flower.gmm.dataset import GMMSpec, load_reference, prepare_gmm

    spec = GMMSpec(3, 2, image_size=4, channels=1, rank=2, num_samples=90, covariance="cluster")
    return load_reference(Dataset.open(prepare_gmm(tmp_path_factory.mktemp("floor"), spec, max_caption_tokens=8)))


@pytest.mark.parametrize("t", (0.1, 0.5, 0.9))
def test_the_fit_without_features_recovers_the_closed_form_floor_and_gain(ref, t):
    from benchmarks.gmm_class_floor import fit

    every, members = torch.arange(6), (ref.cluster_of == 1).nonzero().squeeze(1)
    for fitted_on in (every, members):
        net, in_sample = fit(ref, fitted_on, t, 0, seed=3, draws_per_feature=5000)
        d = ref.mixture.dim
        A = net.W[:d].T  # the readout of x is the shared gain
        pooled = torch.einsum(
            "j,jde->de",
            ref.mixture.weights[fitted_on] / ref.mixture.weights[fitted_on].sum(),
            ref.mixture.covariance()[fitted_on],
        )
        closed = affine_floor(ref.mixture, fitted_on, fitted_on, (t,))[0]
        # the fitted gain's own cost over the optimum, tr(ΔA S̄ ΔAᵀ)/d with S̄ the draws' average x covariance about
        # each caption's mean: a few per cent of the floor (a gain is poorly determined only where x barely varies)
        delta = A - velocity_gain(pooled, t)
        S = (1 - t) ** 2 * pooled + t * t * torch.eye(d, dtype=f64)
        assert float(torch.trace(delta @ S @ delta.T)) / d < 0.05 * closed
        assert in_sample == pytest.approx(closed, rel=0.03)
        # scored on fresh draws of one cluster: the closed form for that cluster
        g = torch.Generator().manual_seed(11)
        from benchmarks.ddpm_profile import draw_x0
        from benchmarks.gmm_class_floor import component_velocity

        x0, comps = draw_x0(ref, members, 200_000, g)
        x = (1 - t) * x0 + t * torch.randn(x0.shape, generator=g, dtype=f64)
        held = float(((net(x, comps) - component_velocity(ref, t, members)(x, comps)) ** 2).mean())
        assert held == pytest.approx(affine_floor(ref.mixture, fitted_on, members, (t,))[0], rel=0.03)


def test_random_features_lower_the_monoliths_floor_and_a_foreign_caption_is_refused(ref):
    from benchmarks.gmm_class_floor import fit

    every, members = torch.arange(6), (ref.cluster_of == 0).nonzero().squeeze(1)
    _, none = fit(ref, every, 0.3, 0, seed=5, draws_per_feature=64)
    _, some = fit(ref, every, 0.3, 64, seed=5, draws_per_feature=64)
    assert some < 0.8 * none  # the features hold what one shared gain cannot
    net, _ = fit(ref, members, 0.3, 8, seed=5, draws_per_feature=16)
    with pytest.raises(ValueError, match="not fitted on"):
        net(torch.zeros(1, ref.mixture.dim, dtype=f64), torch.tensor([5]))


def test_a_record_scores_each_side_on_its_cluster_against_its_own_closed_form(ref):
    from types import SimpleNamespace

    from benchmarks.gmm_class_floor import record

    args = SimpleNamespace(draws_per_feature=1000, samples=10_000, eval_seed=0, input_scale=1.0)
    r = record(ref, [0, 2], 0, 0, args)
    assert r["coefficients"] == {"monolith": 16 + 6 + 0, "experts_together": 3 * (16 + 2)}
    for k, c in r["per_cluster"].items():
        for who in ("expert", "monolith"):
            assert len(c[who]) == 5
            assert c[who] == pytest.approx(c[f"{who}_closed_form"], rel=0.06), (k, who)
        members = (ref.cluster_of == int(k)).nonzero().squeeze(1)
        assert c["expert_closed_form"] == affine_floor(ref.mixture, members, members, (0.1, 0.3, 0.5, 0.7, 0.9))
        assert sum(c["expert_closed_form"]) < sum(c["monolith_closed_form"])
    alone = record(ref, [0, 2], 0, 0, args, experts=False)
    assert all(set(c) == {"monolith"} for c in alone["per_cluster"].values()) and set(alone["in_sample"]) == {
        "monolith"
    }
    assert alone["per_cluster"]["0"]["monolith"] == r["per_cluster"]["0"]["monolith"]  # the same seeds: the same fit


def test_the_caption_offsets_of_the_features_matter(ref, monkeypatch):
    import benchmarks.gmm_class_floor as floor

    every = torch.arange(6)
    _, with_q = floor.fit(ref, every, 0.3, 32, seed=5, draws_per_feature=64)
    init = floor.Features.__init__

    def no_offsets(self, *a, **k):
        init(self, *a, **k)
        self.q.zero_()

    monkeypatch.setattr(floor.Features, "__init__", no_offsets)
    _, without = floor.fit(ref, every, 0.3, 32, seed=5, draws_per_feature=64)
    assert with_q < 0.95 * without


def test_the_input_scale_moves_only_the_features(ref):
    from benchmarks.gmm_class_floor import fit

    every = torch.arange(6)
    affine = [fit(ref, every, 0.3, 0, seed=5, draws_per_feature=64, input_scale=s)[1] for s in (1.0, 3.0)]
    assert affine[0] == pytest.approx(affine[1], rel=1e-9)  # no features: the scale is not used
    net, e1 = fit(ref, every, 0.3, 32, seed=5, draws_per_feature=64)
    wide, e3 = fit(ref, every, 0.3, 32, seed=5, draws_per_feature=64, input_scale=3.0)
    assert wide.features.scale == pytest.approx(net.features.scale / 3) and e1 != e3


def _record(n, training, expert, monolith, experts=True):
    cl = {
        "0": {"expert": [expert] * 5, "monolith": [monolith] * 5},
        "1": {"expert": [expert] * 5, "monolith": [monolith + 0.2] * 5},
    }
    if not experts:
        cl = {k: {"monolith": v["monolith"]} for k, v in cl.items()}
    d, per_expert = 192, 4  # 8 clusters of 4 components: the coefficients the benchmark records
    coefficients = {"monolith": d + 32 + n, "experts_together": 8 * (d + per_expert + n)}
    return {"features": n, "training": training, "per_cluster": cl, "experts": experts, "coefficients": coefficients}


def test_the_summary_is_over_trainings_and_pairs_a_monolith_with_the_experts_of_no_more_coefficients():
    from benchmarks.gmm_class_floor import render, summarise

    records = [_record(8, i, 0.1 + 0.01 * i, 0.3 + 0.01 * i) for i in range(3)]
    records += [_record(64, i, 0.05, 0.1 + 0.02 * i) for i in range(3)]
    records += [_record(0, i, 0.2, 0.4) for i in range(3)]
    for r in records[-3:]:
        for c in r["per_cluster"].values():
            c |= {"expert_closed_form": [0.19] * 5, "monolith_closed_form": [0.39] * 5}
    records += [_record(2048, i, None, 0.07 + 0.01 * i, experts=False) for i in range(3)]
    entry = {
        "name": "x",
        "clusters": [0, 1],
        "records": records,
        "meta": dict.fromkeys(("command", "machine", "commit", "date"), "?"),
    }
    summary = summarise(entry)
    rows = summary["rows"]
    assert sorted(rows, key=int) == ["0", "8", "64"]  # the monolith-only N has no row with experts
    assert rows["8"]["expert"]["mean"] == pytest.approx(0.11) and rows["8"]["expert"]["n"] == 3
    assert rows["8"]["gap"]["mean"] == pytest.approx(0.3) and rows["8"]["gap"]["half"] == pytest.approx(0, abs=1e-12)
    assert rows["8"]["monolith"]["mean"] == pytest.approx(0.41)
    assert rows["0"]["closed_form"] == pytest.approx({"expert": 0.19, "monolith": 0.39})
    assert summary["monolith"]["2048"]["mean"] == pytest.approx(0.18)  # (0.07 + 0.01i and +0.2 on cluster 1)/2
    # 2048 + 224 = 2272 coefficients ≥ the experts' 8 × (196 + 64) = 2080 at N = 64 (not 8 × 196 + … at more);
    # N = 0, 8 and 64 monoliths have fewer than any experts' together, so only the one pair
    (pair,) = summary["equal_coefficients"]
    assert (pair["monolith_features"], pair["expert_features"]) == (2048, 64)
    assert (pair["monolith_coefficients"], pair["experts_coefficients"]) == (2272, 2080)
    assert pair["monolith_minus_expert"]["mean"] == pytest.approx(0.18 - 0.05)
    assert "| 8 | 3 |" in render(entry, summary) and "N = 2048 (2272 coefficients" in render(entry, summary)


def test_the_command_writes_records_and_summaries_beside_results_and_refuses_colour_captions(tmp_path, monkeypatch):
    import benchmarks.gmm_class_floor as floor
    from hddm_flower.data import Dataset
    from hddm_flower.gmm.dataset import GMMSpec, load_reference, prepare_gmm

    spec = GMMSpec(3, 2, image_size=4, channels=1, rank=2, num_samples=90, covariance="cluster")
    small = load_reference(Dataset.open(prepare_gmm(tmp_path / "cache", spec, max_caption_tokens=8)))
    monkeypatch.setattr(floor, "prepare_data", lambda cfg: None)
    monkeypatch.setattr(floor, "load_reference", lambda dataset: small)
    out = tmp_path / "out" / "floor.json"
    argv = ["--config", "configs/reproduce-gmm-nano.yaml", "--clusters", "0", "2", "--features", "0", "4"]
    argv += [
        "--training",
        "0",
        "1",
        "--draws-per-feature",
        "8",
        "--samples",
        "64",
        "--name",
        "x",
        "--results",
        str(out),
    ]
    summary = floor.main(argv)
    assert sorted(p.name for p in out.parent.iterdir()) == [
        "floor.json",
        "gmm_class_floor-x.json",
        "gmm_class_floor-x.md",
    ]
    assert set(summary["rows"]) == {"0", "4"} and summary["rows"]["4"]["expert"]["n"] == 2
    with pytest.raises(SystemExit):
        floor.main([*argv[:2], "--set", "data.gmm_captions=colour", *argv[2:]])
    with pytest.raises(SystemExit):  # another setting under the same name
        floor.main([*argv[:-4], "--samples", "32", "--name", "x", "--results", str(out)])
