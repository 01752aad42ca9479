"""Capacity with trained features: the width floor (hddm_flower.gmm.yardsticks.width_floor) against its objective
evaluated by hand at its minimiser and at other gains and spans, against the normal equations and against draws, in
float64 over a grid of t with both endpoints; and benchmarks/gmm_trained_floor.py: a record starts from the class
floor's fit and scores on its draws, training goes below that start held out, a monolith too narrow for every
cluster's subspace is trained to near its width floor while a wide one falls by more than 95 %; the summary's
arithmetic; the command's files and refusals."""

import math
from types import SimpleNamespace

import pytest
import torch

from hddm_flower.gmm.mixture import GaussianMixture
from hddm_flower.gmm.yardsticks import affine_floor, velocity_gain, width_floor

from .test_gmm_class_floor import _mixture

TIMES = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)
f64 = torch.float64


def _objective(m: GaussianMixture, fitted: torch.Tensor, t: float, A: torch.Tensor, P: torch.Tensor) -> float:
    # Σ_j π_j tr((I − P)(M_j − A) S_j (M_j − A)ᵀ(I − P)) / d: what the span of P cannot hold of each component
    w = m.weights[fitted] / m.weights[fitted].sum()
    cov, eye = m.covariance(), torch.eye(m.dim, dtype=f64)
    total = 0.0
    for wj, j in zip(w.tolist(), fitted.tolist()):
        D = (eye - P) @ (velocity_gain(cov[j], t) - A)
        total += wj * float(torch.trace(D @ ((1 - t) ** 2 * cov[j] + t * t * eye) @ D.T))
    return total / m.dim


@pytest.mark.parametrize("t", TIMES)
def test_the_width_floor_is_the_least_of_the_objective_over_gains_and_spans_of_that_width(t):
    m, fitted = _mixture(d=6), torch.tensor([0, 1, 3, 4])
    d, g = m.dim, torch.Generator().manual_seed(1)
    floors = [width_floor(m, fitted, (t,), n)[0] for n in range(d + 2)]
    assert floors[0] == pytest.approx(affine_floor(m, fitted, fitted, (t,))[0], rel=1e-10, abs=1e-14)
    assert floors[d] == floors[d + 1] == 0  # a span of every direction holds everything
    assert all(a >= b - 1e-15 for a, b in zip(floors, floors[1:]))  # wider is never worse
    if t in (0.0, 1.0):  # M = −I and I for every covariance: one gain is exact
        assert max(floors) < 1e-20
        return
    assert floors[2] > 1e-4
    pooled = torch.einsum("j,jde->de", m.weights[fitted] / m.weights[fitted].sum(), m.covariance()[fitted])
    A = velocity_gain(pooled, t)
    w = m.weights[fitted] / m.weights[fitted].sum()
    # A* solves the normal equations Σ_j π_j (M_j − A) S_j = 0, so the objective's gradient in A,
    # −2 (I − P) Σ_j π_j (M_j − A) S_j, is 0 at A* whatever the span P: the best gain does not depend on the span
    normal = sum(
        wj
        * (velocity_gain(m.covariance()[j], t) - A)
        @ ((1 - t) ** 2 * m.covariance()[j] + t * t * torch.eye(d, dtype=f64))
        for wj, j in zip(w.tolist(), fitted.tolist())
    )
    assert float(normal.abs().max()) < 1e-12
    for n in (1, 2, 4):
        # the span of the top n eigenvectors of C attains the floor; no other span or gain goes below it
        C = sum(
            wj
            * (velocity_gain(m.covariance()[j], t) - A)
            @ ((1 - t) ** 2 * m.covariance()[j] + t * t * torch.eye(d, dtype=f64))
            @ (velocity_gain(m.covariance()[j], t) - A).T
            for wj, j in zip(w.tolist(), fitted.tolist())
        )
        U = torch.linalg.eigh(C).eigenvectors[:, -n:]
        assert _objective(m, fitted, t, A, U @ U.T) == pytest.approx(floors[n], rel=1e-9)
        for _ in range(5):
            Q = torch.linalg.qr(torch.randn(d, n, generator=g, dtype=f64))[0]
            B = A + 0.1 * torch.randn(d, d, generator=g, dtype=f64)
            assert _objective(m, fitted, t, B, Q @ Q.T) >= floors[n] * (1 - 1e-12)
            assert _objective(m, fitted, t, B, U @ U.T) >= floors[n] * (1 - 1e-12)


def test_the_width_floor_is_attained_on_draws_by_a_network_whose_hidden_part_is_free():
    # v̂(x, j) = A*·x + b_j + P·(M_j − A*)(x − E[x | j]), b_j making each component's mean right: its excess on
    # draws against the exact velocity is the floor; and a network of that width but another span is above it
    from benchmarks.ddpm_profile import draw_x0
    from benchmarks.gmm_class_floor import component_velocity

    m, fitted, t, n = _mixture(d=6), torch.tensor([0, 1, 3, 4]), 0.3, 2
    ref = SimpleNamespace(mixture=m)
    cov, mu, a, eye = m.covariance(), m.means, 1 - t, torch.eye(m.dim, dtype=f64)
    pooled = torch.einsum("j,jde->de", m.weights[fitted] / m.weights[fitted].sum(), cov[fitted])
    A = velocity_gain(pooled, t)
    C = sum(
        float(w) * (velocity_gain(cov[j], t) - A) @ (a * a * cov[j] + t * t * eye) @ (velocity_gain(cov[j], t) - A).T
        for w, j in zip(m.weights[fitted] / m.weights[fitted].sum(), fitted.tolist())
    )
    g = torch.Generator().manual_seed(3)
    x0, comps = draw_x0(ref, fitted, 400_000, g)
    x = a * x0 + t * torch.randn(x0.shape, generator=g, dtype=f64)
    v = component_velocity(ref, t, fitted)(x, comps)
    for P, exact in (
        ((lambda U: U @ U.T)(torch.linalg.eigh(C).eigenvectors[:, -n:]), True),
        (
            (lambda Q: Q @ Q.T)(torch.linalg.qr(torch.randn(m.dim, n, generator=g, dtype=f64))[0]),
            False,
        ),
    ):
        out = torch.empty_like(x)
        for j in fitted.tolist():
            rows = comps == j
            M, centred = velocity_gain(cov[j], t), x[rows] - a * mu[j]
            out[rows] = -mu[j] + centred @ (A + P @ (M - A)).T  # E[v* | j] = −μ_j, plus the gains
        excess = float(((out - v) ** 2).mean())
        floor = width_floor(m, fitted, (t,), n)[0]
        if exact:
            assert excess == pytest.approx(floor, rel=0.02)
        else:
            assert excess > 1.2 * floor


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    from hddm_flower.data import Dataset
    from hddm_flower.gmm.dataset import GMMSpec, load_reference, prepare_gmm

    # 3 clusters of 2 components in d = 16, each cluster its own rank-2 subspace: K·r = 6 units hold all three
    spec = GMMSpec(3, 2, image_size=4, channels=1, rank=2, num_samples=90, covariance="cluster")
    return load_reference(Dataset.open(prepare_gmm(tmp_path_factory.mktemp("trained"), spec, max_caption_tokens=8)))


def test_training_starts_at_the_least_squares_fit_and_goes_below_it(ref):
    from benchmarks.ddpm_profile import draw_x0
    from benchmarks.gmm_class_floor import component_velocity, fit
    from benchmarks.gmm_trained_floor import train

    every = torch.arange(6)
    args = SimpleNamespace(lr=1e-2, batch=256, draws_per_feature=32, samples=4096, eval_seed=0)
    start, trained, loss = train(ref, every, 0.3, 8, seed=7, steps=600, args=args)
    lsq, _ = fit(ref, every, 0.3, 8, 7, 32)
    assert torch.equal(start.W, lsq.W) and torch.equal(start.features.R, lsq.features.R)  # the class floor's fit
    assert not torch.equal(trained.features.R, start.features.R)  # the first layer is trained (a copy, not the start)
    g = torch.Generator().manual_seed(11)  # held out: draws neither the fit nor the training saw
    x0, comps = draw_x0(ref, every, 8192, g)
    x = 0.7 * x0 + 0.3 * torch.randn(x0.shape, generator=g, dtype=torch.float64)
    v = component_velocity(ref, 0.3, every)(x, comps)
    before, after = (float(((net(x, comps) - v) ** 2).mean()) for net in (start, trained))
    assert after < 0.5 * before, (before, after)
    assert 0 < loss < before


def test_a_monolith_too_narrow_for_every_subspace_stays_near_its_width_floor_and_a_wide_one_falls(ref):
    # the monolith's floor is mostly the three clusters' rank-2 subspaces (K·r = 6 units hold them); with 1 unit it
    # cannot go below its width floor and training takes it close to it; with 24 it falls by more than 95 %
    from benchmarks.gmm_trained_floor import record

    args = SimpleNamespace(lr=1e-2, batch=256, draws_per_feature=32, samples=1024, eval_seed=0)
    small = record(ref, [0, 1, 2], 1, 0.3, 500, 0, args)
    big = record(ref, [0, 1, 2], 24, 0.3, 500, 0, args)
    every = torch.arange(6)
    floor = width_floor(ref.mixture, every, (0.3,), 1)[0]
    assert floor > 0.5 * width_floor(ref.mixture, every, (0.3,), 0)[0] > 0  # one unit holds little
    assert floor * 0.98 < small["training_loss"]["monolith"] < 1.3 * floor  # trained to near its floor, not below
    for k in "012":
        members = (ref.cluster_of == int(k)).nonzero().squeeze(1)
        assert small["training_loss"][k] > 0.98 * width_floor(ref.mixture, members, (0.3,), 1)[0]

    def mean(r, who):
        return sum(c[who] for c in r["per_cluster"].values()) / 3

    assert mean(small, "monolith") > 100 * mean(small, "expert")
    assert mean(big, "monolith") < 0.05 * mean(big, "monolith_start")  # units enough: it falls by more than 95 %
    assert mean(big, "expert") < mean(big, "expert_start")  # the experts are trained too
    assert set(big["training_loss"]) == {"monolith", "0", "1", "2"} and big["steps"] == 500


def test_a_record_starts_from_the_class_floors_fit_and_scores_on_its_draws(ref):
    # the same seeds and scoring draws as benchmarks/gmm_class_floor.py: the start's excess is the class floor's
    from benchmarks.gmm_class_floor import INNER
    from benchmarks.gmm_class_floor import record as floor_record
    from benchmarks.gmm_trained_floor import record

    args = SimpleNamespace(lr=1e-2, batch=64, draws_per_feature=16, samples=512, eval_seed=3)
    mine = record(ref, [0, 2], 4, 0.5, 5, 1, args)
    theirs = floor_record(ref, [0, 2], 4, 1, SimpleNamespace(**vars(args), input_scale=1.0))
    for k in ("0", "2"):
        for who in ("monolith", "expert"):
            start = theirs["per_cluster"][k][who][INNER.index(0.5)]  # a mean over draws of per-draw means here
            assert mine["per_cluster"][k][f"{who}_start"] == pytest.approx(start, rel=1e-12, abs=0)
        assert mine["per_cluster"][k]["monolith_se"] > 0 and set(mine["per_cluster"][k]) == {
            f"{who}{what}" for who in ("monolith", "expert") for what in ("", "_start", "_se", "_start_se")
        }
    with pytest.raises(ValueError, match="width"):
        width_floor(ref.mixture, torch.arange(6), (0.5,), -1)


def test_the_held_out_excess_is_a_mean_over_draws_with_its_standard_error():
    # a network off by s_i in every dimension of draw i: excess s_i² per draw, its mean and std / √n, in float64
    from benchmarks.gmm_trained_floor import held_out

    g = torch.Generator().manual_seed(0)
    x, v, s = (torch.randn(shape, generator=g, dtype=f64) for shape in ((500, 6), (500, 6), (500,)))
    mean, se = held_out(lambda x_, c: v + s[:, None], x, torch.zeros(500, dtype=torch.long), v)
    assert mean == pytest.approx(float((s**2).mean()), rel=1e-12)
    assert se == pytest.approx(float((s**2).std() / 500**0.5), rel=1e-12)
    assert held_out(lambda x_, c: v + 0.5, x, None, v) == pytest.approx((0.25, 0.0), abs=1e-15)


def _rec(n, t, steps, training, expert, monolith):
    cl = {
        k: {"expert": expert, "monolith": monolith + d, "expert_start": 1.0, "monolith_start": 2.0}
        for k, d in (("0", 0.0), ("3", 0.2))
    }
    loss = {"monolith": monolith + 0.05 * training, "0": expert, "3": expert + 0.02}
    return {"features": n, "t": t, "steps": steps, "training": training, "per_cluster": cl, "training_loss": loss}


def test_the_summary_pairs_each_budget_with_the_one_half_as_large_by_training():
    from benchmarks.gmm_trained_floor import render, summarise

    records = [_rec(64, 0.1, 1000, i, 0.1, 0.4 + 0.01 * i) for i in range(3)]
    records += [_rec(64, 0.1, 2000, i, 0.05, 0.2 + 0.005 * i) for i in range(3)]
    records += [_rec(64, 0.1, 3000, 0, 0.04, 0.2)]  # no budget half as large: no change per doubling
    entry = {"name": "x", "records": records, "meta": dict.fromkeys(("command", "machine", "commit", "date"), "?")}
    entry["width_floor"] = {"64@0.1": {"monolith": 0.3, "0": 0.01, "3": 0.03}}
    rows = {r["steps"]: r for r in summarise(entry)["rows"]}
    assert rows[1000]["monolith"]["mean"] == pytest.approx(0.51) and rows[1000]["monolith"]["n"] == 3
    assert rows[1000]["gap"]["mean"] == pytest.approx(0.41) and rows[1000]["expert_start"]["mean"] == 1.0
    assert rows[1000]["ratio"]["mean"] == pytest.approx(sum((0.5 + 0.01 * i) / 0.1 for i in range(3)) / 3)
    assert "change_per_doubling_pct" not in rows[1000] and "change_per_doubling_pct" not in rows[3000]
    change = rows[2000]["change_per_doubling_pct"]
    assert change["expert"]["mean"] == pytest.approx(-50) and change["expert"]["half"] == pytest.approx(0, abs=1e-9)
    # per training: (0.3 + 0.005 i) / (0.5 + 0.01 i) − 1, averaged over i = 0, 1, 2
    expected = sum(100 * ((0.3 + 0.005 * i) / (0.5 + 0.01 * i) - 1) for i in range(3)) / 3
    assert change["monolith"]["mean"] == pytest.approx(expected)
    assert rows[2000]["width_floor"] == {"monolith": 0.3, "expert": pytest.approx(0.02)}
    assert rows[1000]["monolith_training_loss"]["mean"] == pytest.approx(0.41 + 0.05)
    assert rows[1000]["expert_training_loss"]["mean"] == pytest.approx(0.11)
    assert "| 64 | 0.1 | 2000 | 3 |" in render(entry, summarise(entry)) and "(0.3) |" in render(entry, summarise(entry))
    assert "every_component" not in rows[1000]  # no cluster weights: not every cluster known to be scored

    # every cluster scored: each weighted by its share of the mixture, the monolith's floor over the experts'
    entry["cluster_weights"] = {"0": 0.25, "3": 0.75}
    rows = {r["steps"]: r for r in summarise(entry)["rows"]}
    every = rows[2000]["every_component"]
    assert every["expert"]["mean"] == pytest.approx(0.05)
    assert every["monolith"]["mean"] == pytest.approx(sum(0.2 + 0.005 * i + 0.75 * 0.2 for i in range(3)) / 3)
    assert every["ratio"]["mean"] == pytest.approx(sum((0.35 + 0.005 * i) / 0.05 for i in range(3)) / 3)
    assert every["monolith_floor_over_expert"]["mean"] == pytest.approx(0.3 / 0.05)
    assert rows[2000]["width_floor"]["experts_weighted"] == pytest.approx(0.25 * 0.01 + 0.75 * 0.03)
    assert " (0.025) | 0.355 ± 0.012 (0.3) | 7.1 ± 0.25 | 6" in render(entry, summarise(entry))
    del entry["width_floor"]  # no floor stored: the weighted values without it
    assert "monolith_floor_over_expert" not in summarise(entry)["rows"][0]["every_component"]
    entry["width_floor"] = {"64@0.1": {"monolith": 0.3, "0": 0.01, "3": 0.03}}
    per = summarise(entry)["rows"][1]["every_component"]["per_training"]
    assert per["2"]["floor_over_expert"] == pytest.approx(6) and per["2"]["expert_se"] is None  # no errors kept
    assert "floor_over_expert_plus_2se" not in per["2"]
    for r in entry["records"]:  # standard errors kept: in quadrature over the clusters, weighted
        for k, c in r["per_cluster"].items():
            c["expert_se"], c["monolith_se"] = (0.001, 0.002) if k == "0" else (0.003, 0.004)
    per = summarise(entry)["rows"][1]["every_component"]["per_training"]
    se = (0.25**2 * 0.001**2 + 0.75**2 * 0.003**2) ** 0.5
    assert per["1"]["expert_se"] == pytest.approx(se)
    assert per["1"]["floor_over_expert_plus_2se"] == pytest.approx(0.3 / (0.05 + 2 * se))
    largest = (0.25**2 * 0.002**2 + 0.75**2 * 0.004**2) ** 0.5 / (0.2 + 0.15)  # the monolith's, training 0
    assert f"| 6, 6, 6 | {0.3 / (0.05 + 2 * se):.3g}, " in render(entry, summarise(entry))
    assert f" | {100 * max(se / 0.05, largest):.2g} |" in render(entry, summarise(entry))
    entry["records"][0]["per_cluster"].pop("3")  # a training without a cluster: no weighted row
    assert "every_component" not in summarise(entry)["rows"][0]
    entry["cluster_weights"] = {"0": 0.2, "3": 0.3, "5": 0.5}  # a cluster not scored: no weighted row
    assert all("every_component" not in r for r in summarise(entry)["rows"])


def test_the_command_writes_records_and_summaries_beside_results_and_refuses_bad_input(ref, tmp_path, monkeypatch):
    import benchmarks.gmm_trained_floor as trained

    monkeypatch.setattr(trained, "prepare_data", lambda cfg: None)
    monkeypatch.setattr(trained, "load_reference", lambda dataset: ref)
    out = tmp_path / "out" / "t.json"
    argv = ["--config", "configs/reproduce-gmm-nano.yaml", "--clusters", "0", "--features", "2", "--times", "0.5"]
    argv += ["--steps", "20", "40", "--samples", "64", "--batch", "32", "--name", "x", "--results", str(out)]
    summary = trained.main(argv)
    assert sorted(p.name for p in out.parent.iterdir()) == [
        "gmm_trained_floor-x.json",
        "gmm_trained_floor-x.md",
        "t.json",
    ]
    assert [r["steps"] for r in summary["rows"]] == [20, 40] and "change_per_doubling_pct" in summary["rows"][1]
    stored = trained.json.loads(out.read_text())["x"]
    records, members = stored["records"], (ref.cluster_of == 0).nonzero().squeeze(1)
    assert stored["width_floor"] == {  # the closed forms for the N and t trained
        "2@0.5": {
            "monolith": width_floor(ref.mixture, torch.arange(6), (0.5,), 2)[0],
            "0": width_floor(ref.mixture, members, (0.5,), 2)[0],
        }
    }
    assert trained.main(argv) == summary and trained.json.loads(out.read_text())["x"]["records"] == records  # kept
    assert "cluster_weights" not in stored  # one cluster of three scored
    every = ["--clusters", "0", "1", "2", "--steps", "20", "--name", "every"]
    weighted = trained.main([*argv, *every])["rows"][0]["every_component"]
    stored = trained.json.loads(out.read_text())["every"]
    shares = [float(ref.mixture.weights[ref.cluster_of == k].sum()) for k in range(3)]
    assert stored["cluster_weights"] == {str(k): pytest.approx(w) for k, w in enumerate(shares)}
    (r,) = stored["records"]
    assert weighted["expert"]["mean"] == pytest.approx(
        sum(w * r["per_cluster"][str(k)]["expert"] for k, w in enumerate(shares))
    )
    for bad in (
        ["--times", "0.2"],
        ["--set", "data.gmm_captions=colour"],
        ["--lr", "0"],
        ["--clusters", "7"],
        ["--samples", "1"],
    ):
        with pytest.raises(SystemExit):
            trained.main([*argv, *bad])
    with pytest.raises(SystemExit):  # another setting under the same name
        trained.main([*argv, "--batch", "16"])


def _beside(ref, tmp_path, monkeypatch):
    """A run of one cluster and budget, and the record its training 1 makes (made here and set aside), which another
    process writes while this one trains (training 0). Returns the module, the options, the results file, the other
    process's record and the trainings this process trains."""
    import benchmarks.gmm_trained_floor as trained
    from benchmarks.common import results_file

    monkeypatch.setattr(trained, "prepare_data", lambda cfg: None)
    monkeypatch.setattr(trained, "load_reference", lambda dataset: ref)
    out = tmp_path / "t.json"
    argv = ["--config", "configs/reproduce-gmm-nano.yaml", "--clusters", "0", "--features", "2", "--times", "0.5"]
    argv += ["--steps", "20", "--samples", "64", "--batch", "32", "--name", "x", "--results", str(out)]
    trained.main([*argv, "--training", "1"])  # what the other process writes, made here and set aside
    (theirs,) = trained.json.loads(out.read_text())["x"]["records"]
    out.unlink()
    record, calls = trained.record, []

    def beside(*args):  # while this process trains, the other writes its training 1
        calls.append(args[5])
        with results_file(out) as store:
            store.setdefault("x", {"name": "x", "records": []})["records"].append(theirs)
        return record(*args)

    monkeypatch.setattr(trained, "record", beside)
    return trained, argv, out, theirs, calls


def test_two_processes_adding_to_one_entry_side_by_side_keep_each_others_records(ref, tmp_path, monkeypatch):
    trained, argv, out, theirs, _ = _beside(ref, tmp_path, monkeypatch)
    summary = trained.main([*argv, "--training", "0"])
    stored = trained.json.loads(out.read_text())["x"]
    assert sorted(r["training"] for r in stored["records"]) == [0, 1] and theirs in stored["records"]
    assert summary == trained.summarise(stored) and summary["rows"][0]["trainings"] == [0, 1]  # over both


def test_the_fit_the_training_and_the_scoring_draw_from_generators_of_their_own(ref, monkeypatch):
    import benchmarks.gmm_class_floor as floor
    import benchmarks.gmm_ladder as ladder
    import benchmarks.gmm_trained_floor as trained
    from benchmarks.ddpm_profile import draw_x0

    seeds: dict[str, set] = {"fit": set(), "train": set(), "score": set()}

    def spy(kind):
        def draw(ref, members, n, g):
            seeds[kind].add(g.initial_seed())
            return draw_x0(ref, members, n, g)

        return draw

    for module, kind in ((floor, "fit"), (trained, "train"), (ladder, "score")):
        monkeypatch.setattr(module, "draw_x0", spy(kind))
    args = SimpleNamespace(lr=1e-2, batch=64, draws_per_feature=16, samples=256, eval_seed=0)
    for training in (0, 1):
        trained.record(ref, [0, 2], 4, 0.5, 3, training, args)
    assert all(seeds.values())
    assert not (seeds["fit"] & seeds["train"] or seeds["fit"] & seeds["score"] or seeds["train"] & seeds["score"])
    assert len(seeds["train"]) == 2 * 3  # each network of each training: its own training draws


def test_a_stamp_names_the_files_that_differed_from_the_commit_and_the_torch_threads(tmp_path, monkeypatch):
    # the code that made a record is its commit only where nothing tracked had changed: a git repository of two files
    import subprocess

    import benchmarks.common as common

    def git(*a):
        subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("y = 1\n")
    git("add", "a.py", "b.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    monkeypatch.setattr(common, "ROOT", tmp_path)
    clean = common.stamp()
    assert (
        clean["uncommitted"] == [] and len(clean["commit"]) >= 7 and clean["torch_threads"] == torch.get_num_threads()
    )
    (tmp_path / "b.py").write_text("y = 2\n")
    (tmp_path / "new.py").write_text("")  # untracked: not code the commit names, not listed
    assert common.stamp()["uncommitted"] == ["b.py"] and common.stamp()["commit"] == clean["commit"]
    monkeypatch.setattr(common, "ROOT", tmp_path / "nowhere")
    assert common.uncommitted() == "unknown"


def test_every_network_is_trained_by_adam_with_its_rate_decayed_to_zero_by_a_cosine(ref, monkeypatch):
    import benchmarks.gmm_equal_compute as eq
    import benchmarks.gmm_trained_floor as trained

    rates, step, made, init = [], torch.optim.Adam.step, [], torch.optim.Adam.__init__

    def spy(self, *args, **kwargs):  # the rate each Adam step is taken at
        rates.append(self.param_groups[0]["lr"])
        return step(self, *args, **kwargs)

    def construct(self, *args, **kwargs):  # the optimiser each network gets, and the weights it trains
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(torch.optim.Adam, "step", spy)
    monkeypatch.setattr(torch.optim.Adam, "__init__", construct)
    args = SimpleNamespace(lr=1e-2, batch=64, draws_per_feature=16, samples=256, eval_seed=0)
    steps = 8
    cosine = [pytest.approx(0.5 * args.lr * (1 + math.cos(math.pi * i / steps)), rel=1e-12) for i in range(steps)]
    trained.record(ref, [0, 2], 4, 0.5, steps, 0, args)  # the monolith, then the two experts
    assert rates == cosine * 3 and 0 < rates[steps - 1] < 0.04 * args.lr  # near 0 at the last step, never constant
    rates.clear()
    eq.record(ref, 4, 0.5, steps, 0, args)  # the equal-compute monolith: the same training
    assert rates == cosine
    assert len(made) == 4 and {type(o) for o in made} == {torch.optim.Adam}  # plain Adam, not AdamW or another
    assert all(g["weight_decay"] == 0 and not g["amsgrad"] for o in made for g in o.param_groups)
    made.clear()
    _, net, _ = trained.train(ref, torch.tensor([0, 1]), 0.5, 4, 7, steps, args)
    (opt,) = made
    R, q, beta, W = opt.param_groups[0]["params"]  # what is returned is the last iterate, not an average
    assert torch.equal(net.W, W.detach().double()) and torch.equal(net.features.R, R.detach().double())
    assert torch.equal(net.features.q, q.detach().double()) and torch.equal(net.features.beta, beta.detach().double())


def test_a_record_another_process_wrote_while_this_one_trained_is_not_trained_again(ref, tmp_path, monkeypatch):
    trained, argv, out, theirs, calls = _beside(ref, tmp_path, monkeypatch)
    trained.main([*argv, "--training", "0", "1"])
    assert calls == [0]  # training 1 was there when its turn came
    assert theirs in trained.json.loads(out.read_text())["x"]["records"]
