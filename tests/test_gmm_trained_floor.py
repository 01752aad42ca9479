"""Capacity with trained features (benchmarks/gmm_trained_floor.py): training starts at the class floor's
least-squares fit and goes below it; a monolith with units enough for every cluster's subspace comes down to the
experts and one with too few does not; the summary's arithmetic; the command's files and refusals."""

from types import SimpleNamespace

import pytest
import torch


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
    args = SimpleNamespace(steps_now=600, lr=1e-2, batch=256, draws_per_feature=32, samples=4096, eval_seed=0)
    start, trained, loss = train(ref, every, 0.3, 8, seed=7, args=args)
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


def test_a_monolith_with_units_for_every_subspace_comes_down_and_one_with_too_few_does_not(ref):
    # given its caption the exact velocity is affine in x_t with its cluster's gain: an expert holds its rank-2
    # subspace in ~2 units, the monolith all three in ~6. With 1 unit the monolith must leave clusters out.
    from benchmarks.gmm_trained_floor import record

    args = SimpleNamespace(steps_now=0, lr=1e-2, batch=256, draws_per_feature=32, samples=1024, eval_seed=0)
    small = record(ref, [0, 1, 2], 1, 0.3, 500, 0, args)
    big = record(ref, [0, 1, 2], 24, 0.3, 500, 0, args)

    def mean(r, who):
        return sum(c[who] for c in r["per_cluster"].values()) / 3

    assert mean(small, "monolith") > 0.6 * mean(small, "monolith_start")  # too few units: most of the gap stays
    assert mean(small, "monolith") > 100 * mean(small, "expert")
    assert mean(big, "monolith") < 0.05 * mean(big, "monolith_start")  # enough: it falls by more than 95 %
    assert mean(big, "expert") < mean(big, "expert_start")  # the experts are trained too
    assert set(big["training_loss"]) == {"monolith", "0", "1", "2"} and big["steps"] == 500


def _rec(n, t, steps, training, expert, monolith):
    cl = {
        k: {"expert": expert, "monolith": monolith + d, "expert_start": 1.0, "monolith_start": 2.0}
        for k, d in (("0", 0.0), ("3", 0.2))
    }
    return {"features": n, "t": t, "steps": steps, "training": training, "per_cluster": cl}


def test_the_summary_pairs_each_budget_with_the_one_half_as_large_by_training():
    from benchmarks.gmm_trained_floor import render, summarise

    records = [_rec(64, 0.1, 1000, i, 0.1, 0.4 + 0.01 * i) for i in range(3)]
    records += [_rec(64, 0.1, 2000, i, 0.05, 0.2 + 0.005 * i) for i in range(3)]
    records += [_rec(64, 0.1, 3000, 0, 0.04, 0.2)]  # no budget half as large: no change per doubling
    entry = {"name": "x", "records": records, "meta": dict.fromkeys(("command", "machine", "commit", "date"), "?")}
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
    assert "| 64 | 0.1 | 2000 | 3 |" in render(entry, summarise(entry))


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
    records = trained.json.loads(out.read_text())["x"]["records"]
    assert trained.main(argv) == summary and trained.json.loads(out.read_text())["x"]["records"] == records  # kept
    for bad in (["--times", "0.2"], ["--set", "data.gmm_captions=colour"], ["--lr", "0"], ["--clusters", "7"]):
        with pytest.raises(SystemExit):
            trained.main([*argv, *bad])
    with pytest.raises(SystemExit):  # another setting under the same name
        trained.main([*argv, "--batch", "16"])
