"""Truth metrics against closed forms, and ``hddm reproduce`` end to end on a tiny Gaussian-mixture dataset."""

import math

import pytest
import torch
from scipy import stats

from hddm_flower.config.io import config_from_dict
from hddm_flower.gmm.mixture import GaussianMixture
from hddm_flower.gmm.truth import CaptionTargets, interval, median_bandwidth, mmd2, truth_metrics, tv_distance

F64 = torch.float64


def test_mmd2_matches_the_gaussian_closed_form():
    """For N(0, σ²I) vs N(μ, σ²I) in d dimensions and kernel exp(−‖a−b‖²/2h²):
    MMD² = 2c(1 − exp(−‖μ‖²/(2(h² + 2σ²)))) with c = (h²/(h² + 2σ²))^{d/2}."""
    g = torch.Generator().manual_seed(0)
    d, sigma, h, n = 3, 1.0, 1.5, 1500
    mu = torch.tensor([0.8, 0.0, 0.0], dtype=F64)
    x = sigma * torch.randn(n, d, generator=g, dtype=F64)
    y = mu + sigma * torch.randn(n, d, generator=g, dtype=F64)
    c = (h**2 / (h**2 + 2 * sigma**2)) ** (d / 2)
    want = 2 * c * (1 - math.exp(-float(mu @ mu) / (2 * (h**2 + 2 * sigma**2))))
    assert abs(mmd2(x, y, h) - want) < 0.15 * want
    # unbiased: equal distributions give values spread around 0
    same = [
        mmd2(torch.randn(300, d, generator=g, dtype=F64), torch.randn(300, d, generator=g, dtype=F64), h)
        for _ in range(8)
    ]
    assert abs(sum(same) / len(same)) < 3 * torch.tensor(same).std() / math.sqrt(len(same)) + 1e-4
    with pytest.raises(ValueError, match="two samples"):
        mmd2(x[:1], y, h)


def test_tv_bandwidth_and_interval():
    assert tv_distance(torch.tensor([0, 0, 1, 1]), torch.tensor([0.5, 0.5, 0.0])) == 0.0
    assert tv_distance(torch.tensor([0, 0, 0, 0]), torch.tensor([0.25, 0.25, 0.5])) == pytest.approx(0.75)
    pts = torch.tensor([[0.0], [1.0], [3.0]], dtype=F64)  # distances 1, 3, 2
    assert median_bandwidth(pts) == 2.0
    v = [1.0, 2.0, 4.0]
    got = interval(v)
    lo, hi = stats.t.interval(0.95, 2, loc=sum(v) / 3, scale=stats.sem(v))
    assert got["lo"] == pytest.approx(lo) and got["hi"] == pytest.approx(hi) and got["n"] == 3
    assert interval([2.0])["half"] == 0.0


def test_truth_metrics_of_true_and_of_wrong_samples():
    g = torch.Generator().manual_seed(1)
    m = GaussianMixture(
        torch.tensor([0.5, 0.5], dtype=F64),
        torch.tensor([[-2.0, 0.0], [2.0, 0.0]], dtype=F64),
        torch.zeros(2, 2, 1, dtype=F64) + 0.1,
        torch.full((2, 2), 0.2, dtype=F64),
    )
    cluster_of = torch.tensor([0, 1])
    comps = torch.arange(2).repeat_interleave(500)
    ref = m.sample(1000, g, comps)[0]
    prompted = CaptionTargets.one_per_component(comps, 2)
    true = truth_metrics(m, cluster_of, m.sample(1000, g, comps)[0], ref, prompted, 1.0)
    assert abs(true["delta_log_density"]) < 0.2 and abs(true["mmd2"]) < 0.01
    assert true["adherence"] == 1.0 and true["mode_tv"] == 0.0
    assert true["cluster_adherence"] == 1.0 and true["cluster_tv"] == 0.0
    swapped = truth_metrics(m, cluster_of, m.sample(1000, g, 1 - comps)[0], ref, prompted, 1.0)  # every prompt wrong
    assert swapped["adherence"] == 0.0 and swapped["mode_tv"] == 0.0  # the histogram alone cannot see it
    assert swapped["cluster_tv"] == 1.0  # the caption's cluster distribution does
    # the marginal log p cannot see it either (the swapped modes are as dense); log p(x | c) pays the distance:
    # E_{x ~ N(μ₁, Σ)} log N(x; μ₀, Σ) − E_{y ~ N(μ₀, Σ)} log N(y; μ₀, Σ) = −½ ΔᵀΣ⁻¹Δ, Δ = μ₁ − μ₀
    delta = m.means[1] - m.means[0]
    want = -0.5 * float(delta @ torch.linalg.solve(m.covariance()[0], delta))
    assert abs(swapped["delta_log_density"]) < 0.2
    assert swapped["delta_log_density_cond"] == pytest.approx(want, rel=0.05)
    collapsed = truth_metrics(m, cluster_of, m.means[comps], ref, prompted, 1.0)  # only the modes' centres
    assert collapsed["delta_log_density"] > 0.5 and collapsed["mmd2"] > 0.01
    assert collapsed["delta_log_density_cond"] == pytest.approx(collapsed["delta_log_density"], abs=1e-6)
    uncond = truth_metrics(m, cluster_of, m.sample(1000, g, torch.zeros(1000, dtype=torch.long))[0], ref, None, 1.0)
    assert uncond["mode_tv"] == pytest.approx(0.5) and "adherence" not in uncond  # one mode of two
    assert (
        uncond["cluster_tv"] == pytest.approx(0.5) and uncond["delta_log_density_cond"] == uncond["delta_log_density"]
    )
    with pytest.raises(ValueError, match="non-finite"):
        truth_metrics(m, cluster_of, torch.full((4, 2), float("nan"), dtype=F64), ref[:4], prompted, 1.0)


def test_reproduce_on_a_gmm_scores_every_row_against_the_truth(tmp_path, monkeypatch):
    """Two independent trainings (evaluation.training_seeds: 2): experts, monolith and router retrained per
    training, the trained rows sampled for both on the same seeds, nested intervals and the paired Table 3."""
    from hddm_flower.reproduce.run import reproduce
    from hddm_flower.reproduce.training import dataset_id, train_or_reuse_experts, training_root
    from hddm_flower.stages.prepare import prepare_data
    from hddm_flower.training_seeds import training_config

    cfg = config_from_dict(
        {
            "num_experts": 2,
            "objectives": {"ddpm": 1, "fm": 1},
            "data": {
                "name": "gmm",
                "image_size": 4,
                "gmm_channels": 1,
                "gmm_components": 2,
                "gmm_samples": 60,
                "max_caption_tokens": 8,
            },
            "expert": {"preset": "test", "steps": 2, "batch_size": 4, "warmup_steps": 1},
            "router": {"preset": "test", "steps": 2, "batch_size": 8},
            "sampling": {"cfg_scale": 1.0, "x0_clamp": 3.0},
            "evaluation": {
                "routing_modes": ["top1", "top2"],
                "samples_per_prompt": 2,
                "seeds": 2,
                "num_steps": 3,
                "training_seeds": 2,
            },
            "federation": {"min_nodes": 2, "min_experts": 1},
        },
        "gmm-test",
    )
    dataset = prepare_data(cfg, tmp_path / "cache")
    out = tmp_path / "out"
    manifest = reproduce(cfg, out, dataset)
    rows = manifest["results"]
    assert list(rows)[0] == "true samples (fresh draws)" and "monolith (equal compute)" in rows
    # the config's own mix (1DDPM:1FM) under every routing mode, the other under top2; both with the exact router
    assert {"1DDPM:1FM · top2", "1DDPM:1FM · top1", "2FM · top2", "2FM · top2 · exact router"} <= set(rows)
    assert "2FM · top1" not in rows
    # the exact prompt-aware router routes each caption to its cluster; the text-free one cannot at high noise
    aware = rows["exact FM experts · exact prompt-aware router · top2"]["metrics"]["cluster_adherence"]["mean"]
    free = rows["exact FM experts · exact router · top2"]["metrics"]["cluster_adherence"]["mean"]
    assert aware > 0.9 and aware > free
    assert "1DDPM:1FM · top2 · exact prompt-aware router" in rows
    true = rows["true samples (fresh draws)"]
    assert true["samples_per_seed"] == 4 * 2 and true["seeds"] == 2 and len(true["per_seed"]) == 2
    assert true["metrics"]["adherence"]["mean"] > 0.7
    # exact DDPM experts: the schedule-aware conversion stays near the truth, the naive one does not
    aware = rows["exact DDPM experts · schedule_aware · oracle"]["metrics"]["delta_log_density"]["mean"]
    naive = rows["exact DDPM experts · naive · oracle"]["metrics"]["delta_log_density"]["mean"]
    assert naive < aware - 5
    tables = (out / "tables.md").read_text()
    assert "Exact references" in tables and "± " in tables and "bandwidth" in tables
    # training 1 retrained everything from its own seeds, in its own folder; its trained rows have their own values
    a = manifest["artefacts"]
    assert [t["root"] for t in a["trainings"]] == [".", "trainings/training-1"]
    t0, t1 = a["trainings"]
    assert t0["monolith"]["tensor_sha256"] != t1["monolith"]["tensor_sha256"]
    assert t0["router"]["tensor_sha256"] != t1["router"]["tensor_sha256"]
    assert all(t0["experts"][n]["tensor_sha256"] != t1["experts"][n]["tensor_sha256"] for n in t0["experts"])
    mono = rows["monolith (equal compute)"]
    assert len(mono["per_training"]) == 2 and mono["per_training"][0] == mono["per_seed"]
    assert mono["per_training"][0] != mono["per_training"][1]
    d = [[s["delta_log_density"] for s in seeds] for seeds in mono["per_training"]]
    assert mono["nested"]["delta_log_density"]["per_training"] == pytest.approx([sum(v) / 2 for v in d], abs=1e-12)
    assert "per_training" not in true  # the exact rows do not depend on a training: sampled once
    # Table 3: paired by training and seed, over trainings
    pairs = {e["what"]: e for e in manifest["paired"]}
    e = pairs["1DDPM:1FM: top2 − monolith"]["delta_log_density"]
    top2 = [[s["delta_log_density"] for s in seeds] for seeds in rows["1DDPM:1FM · top2"]["per_training"]]
    want = [sum(x - y for x, y in zip(u, v)) / 2 for u, v in zip(top2, d)]
    assert e["covers"] == "trainings" and e["per_training"] == pytest.approx(want, abs=1e-12)
    assert {"1DDPM:1FM: top2 − top1", "1DDPM:1FM: top2, trained − exact router", "top2: 1DDPM:1FM − 2FM"} <= set(pairs)
    assert "Table 3" in tables and "over 2 trainings" in tables
    # relative to the exact row of the same mode and steps (exact rows paired on their seeds in every training)
    rel = pairs["1DDPM:1FM · top2 − exact (top2)"]["delta_log_density"]
    ex = [s["delta_log_density"] for s in rows["exact FM experts · exact router · top2"]["per_seed"]]
    assert rel["per_training"] == pytest.approx([sum(u) / 2 - sum(ex) / 2 for u in top2], abs=1e-12)
    assert "monolith (equal compute) − exact (oracle)" in pairs
    # the attribution factorial on the empty caption: exact·exact rows sampled once, the others per training (the
    # trained router and experts are training i's), and the gap split exactly into router and experts shares
    exact_tr = rows["exact FM experts · trained router · top2 · empty caption"]
    assert "per_training" not in rows["exact FM experts · exact router · top1 · empty caption"]
    assert exact_tr["row"]["group"] == "1DDPM:1FM" and exact_tr["per_training"][0] != exact_tr["per_training"][1]
    assert "1DDPM:1FM experts · exact router · full · empty caption" in rows
    att = {e["what"]: e["delta_log_density"] for e in manifest["paired"] if e["table"] == "attribution"}
    for mode in ("top1", "top2", "full"):
        gap = att[f"empty caption · {mode}: gap, trained experts · trained router − exact · exact"]
        for a, b in (
            ("router share at exact experts (ET − EE)", "experts share under the trained router (TT − ET)"),
            ("experts share under the exact router (TE − EE)", "router share with trained experts (TT − TE)"),
        ):
            parts = [
                x + y
                for x, y in zip(
                    att[f"empty caption · {mode}: {a}"]["per_training"],
                    att[f"empty caption · {mode}: {b}"]["per_training"],
                )
            ]
            assert gap["covers"] == "trainings" and gap["per_training"] == pytest.approx(parts, abs=1e-9)
    assert "empty caption · exact · exact: top2 − full" in att and "Table 4" in tables
    assert not any("empty caption" in e["what"] for e in manifest["paired"] if e["table"] == "paired")
    # the trained router probed on its ensemble's own trajectories against the exact posterior, per step from t = 1
    top2_row = rows["1DDPM:1FM · top2"]
    assert len(top2_row["router_steps"]) == 2 and top2_row["router_steps"][0]["times"][0] == 1.0
    assert len(top2_row["router_steps"][0]["kl"]) == 3  # evaluation.num_steps
    assert 0 <= top2_row["per_seed"][0]["router_kl"] and 0 <= top2_row["per_seed"][0]["router_prior_tv"] <= 1
    assert top2_row["nested"]["router_kl"]["trainings"] == 2
    assert "router_kl" not in rows["1DDPM:1FM · top2 · exact router"]["per_seed"][0]
    assert "router_kl" in exact_tr["per_seed"][0] and "sampler's own trajectories" in tables
    # the per-sample log-densities behind the mean, median and p90 are stored per row and seed
    from safetensors.torch import load_file

    ps = load_file(out / mono["per_sample_file"])
    seed0 = mono["per_seed"][0]
    diff = float(ps["seed-0.log_p"].double().mean() - ps["seed-0.true_log_p"].double().mean())
    assert diff == pytest.approx(seed0["delta_log_density"], abs=1e-3) and len(ps["seed-0.log_p"]) == 8
    assert {"mmd2_bw0.25", "mmd2_bw4", "delta_log_density_median", "log_deficit_p90"} <= set(seed0)
    # cached by fingerprint: a second pass over both trainings reuses every expert and monolith
    again = train_or_reuse_experts(
        [training_config(cfg, i) for i in range(2)],
        [training_root(out, i) for i in range(2)],
        dataset,
        sorted((int(n.split("-")[1]), n.split("-")[2]) for n in t0["experts"]),
        dataset_id(dataset),
        1,
        False,
    )
    assert all(x["reused"] for t in again for x in [t["monolith"], *t["experts"].values()])
    assert [t["monolith"]["tensor_sha256"] for t in again] == [
        t0["monolith"]["tensor_sha256"],
        t1["monolith"]["tensor_sha256"],
    ]
    # another rung: equal_steps at twice the batch trains its experts as equal_images did (batch 4, 2 steps), so
    # with --reuse it adopts both trainings' experts and routers and their rows, and trains and samples only its
    # monolith (2 steps × 8 instead of 4 × 4)
    es = config_from_dict(
        cfg.to_dict() | {"expert": cfg.to_dict()["expert"] | {"batch_size": 8}, "reproduce": {"budget": "equal_steps"}},
        "gmm-test-equal-steps",
    )
    rung = reproduce(es, tmp_path / "rung", dataset, reuse=[out])
    b = rung["artefacts"]["trainings"]
    for i, (mine, theirs) in enumerate(zip(b, manifest["artefacts"]["trainings"])):
        assert (
            mine["fingerprint"] == theirs["fingerprint"]
            and mine["router"]["fingerprint"] == theirs["router"]["fingerprint"]
        )
        for name, e in mine["experts"].items():
            assert e["reused"] and e["tensor_sha256"] == theirs["experts"][name]["tensor_sha256"], (i, name)
            assert e["reused_from"] == str(training_root(out, i) / "experts" / name)
        assert mine["router"]["tensor_sha256"] == theirs["router"]["tensor_sha256"] and "reused_from" in mine["router"]
        assert (
            not mine["monolith"]["reused"] and mine["monolith"]["tensor_sha256"] != theirs["monolith"]["tensor_sha256"]
        )
    reused = {n for n, r in rung["results"].items() if "reused_from" in r}
    assert reused == set(rows) - {"monolith (equal compute)"}
    for n in reused:  # the same numbers, training by training, and the per-sample files beside them
        assert rung["results"][n]["per_seed"] == rows[n]["per_seed"], n
        assert rung["results"][n].get("per_training") == rows[n].get("per_training"), n
        assert (tmp_path / "rung" / rung["results"][n]["per_sample_file"]).is_file()
    assert rung["results"]["monolith (equal compute)"]["per_training"] != mono["per_training"]
    assert rung["budget"]["monolith_steps"] == 2 and rung["reused_from"] == [str(out)]
    # what benchmarks/gmm_ladder_cost reads from the two: only the monolith's row differs
    from benchmarks.gmm_ladder_cost import largest_difference, summary

    worst, where = largest_difference(rung, manifest, "delta_log_density")
    assert worst > 0 and where.startswith("monolith (equal compute), training ")
    s = summary("rung", tmp_path / "rung")
    assert (s["experts_adopted"], s["experts"], s["routers_adopted"], s["monoliths_adopted"]) == (6, 6, 2, 0)
    assert (s["rows_reused"], s["rows"]) == (len(rows) - 1, len(rows))
    # the same rung again in its own folder: every row is its own stored result (nothing sampled again)
    import hddm_flower.gmm.evaluate as gmm_evaluate

    def no_sampling(_):
        raise AssertionError("a stored row was sampled again")

    monkeypatch.setattr(gmm_evaluate, "evaluate_group", no_sampling)
    again_rung = reproduce(es, tmp_path / "rung", dataset)
    assert all("reused_from" not in r for r in again_rung["results"].values())
    assert again_rung["results"] == {
        n: {k: v for k, v in r.items() if k != "reused_from"} for n, r in rung["results"].items()
    }
    assert largest_difference(again_rung, rung) == (0.0, "")


def test_truth_rows_are_scheduled_longest_first():
    from hddm_flower.gmm.evaluate import _cost, truth_rows

    rows = truth_rows(["8FM", "2DDPM:6FM"], ["top1", "top2", "full", "threshold", "oracle"], "2DDPM:6FM")
    order = sorted(rows, key=lambda r: -_cost(r, 8))
    assert order[0].name == "2DDPM:6FM · full" and order[-1].experts == "true"
    eight = next(r for r in rows if r.steps_factor == 8)
    assert _cost(eight, 8) == 8  # oracle routing runs no router and one expert, at 8× the steps
    assert order.index(eight) < order.index(next(r for r in rows if r.name == "2DDPM:6FM · top2"))


def test_mmd2_at_three_bandwidths_matches_the_gaussian_closed_form():
    """mmd2_at at 0.25×, 1× and 4× a bandwidth: each the closed form for N(0, σ²I) vs N(μ, σ²I) at that bandwidth,
    and equal to mmd2 computed alone (float64)."""
    from hddm_flower.gmm.truth import MMD_SCALES, mmd2_at

    g = torch.Generator().manual_seed(1)
    d, sigma, h0, n = 2, 1.0, 2.0, 1500
    mu = torch.tensor([1.0, 0.0], dtype=F64)
    x = sigma * torch.randn(n, d, generator=g, dtype=F64)
    y = mu + sigma * torch.randn(n, d, generator=g, dtype=F64)
    hs = [s * h0 for s in MMD_SCALES.values()]
    assert list(MMD_SCALES.values()) == [0.25, 1.0, 4.0]
    got = mmd2_at(x, y, hs)
    for h, v in zip(hs, got):
        c = (h**2 / (h**2 + 2 * sigma**2)) ** (d / 2)
        want = 2 * c * (1 - math.exp(-float(mu @ mu) / (2 * (h**2 + 2 * sigma**2))))
        assert abs(v - want) < 0.2 * want + 2e-3
        assert v == pytest.approx(mmd2(x, y, h), rel=1e-12, abs=1e-15)


def test_log_density_quantiles_against_closed_forms():
    """Median difference and the 90th-percentile deficit difference of per-sample log-densities: for samples at
    known points of N(0, 1) the values are the Gaussian log-density at the order statistics (linear interpolation)."""
    from hddm_flower.gmm.truth import log_density_quantiles

    log_n = lambda z: -0.5 * z**2 - 0.5 * math.log(2 * math.pi)  # noqa: E731
    x = torch.tensor([0.0, 0.5, 1.0, 2.0, 3.0], dtype=F64)  # log p decreasing in |x|
    y = torch.tensor([0.0, 0.0, 0.5, 1.0, 1.0], dtype=F64)
    got = log_density_quantiles(log_n(x), log_n(y))
    assert got["delta_log_density_median"] == pytest.approx(log_n(1.0) - log_n(0.5), abs=1e-12)
    # −log p sorted: x → 0.5·z² + c at z = 0, .5, 1, 2, 3; the 0.9 quantile at position 3.6: 0.4·q(2) + 0.6·q(3)
    qx = 0.4 * -log_n(2.0) + 0.6 * -log_n(3.0)
    qy = 0.4 * -log_n(1.0) + 0.6 * -log_n(1.0)
    assert got["log_deficit_p90"] == pytest.approx(qx - qy, abs=1e-12)
    same = log_density_quantiles(log_n(x), log_n(x))
    assert same == {"delta_log_density_median": 0.0, "log_deficit_p90": 0.0}


def test_a_stored_rows_key_holds_every_source_file_of_the_package(monkeypatch):
    """What docs/evaluation.md says of the truth-row store: any change to the package's code samples every row again.
    The code digest is the sha256 over every ``.py`` file of ``hddm_flower`` (path and bytes), and a row's key
    changes with it and with the weights of the parts it samples with."""
    import hashlib
    from pathlib import Path

    import hddm_flower
    from hddm_flower.config.io import load_config
    from hddm_flower.gmm import row_cache
    from hddm_flower.gmm.evaluate import Row

    root = Path(hddm_flower.__file__).resolve().parent
    files = sorted(root.rglob("*.py"))
    assert len(files) > 40 and root / "gmm" / "row_cache.py" in files
    h = hashlib.sha256()
    for path in files:
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    assert row_cache.code_digest() == h.hexdigest()
    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "reproduce-gmm.yaml")
    row, weights = (
        Row("8FM · top2", "8FM", "top2"),
        {"experts": {f"cluster-{k}-fm": str(k) for k in range(8)}, "router": "r"},
    )
    key = row_cache.row_key(cfg, row, ["fm"] * 8, weights, {"dataset": "d"})
    assert key == row_cache.row_key(cfg, row, ["fm"] * 8, weights, {"dataset": "d"})
    assert key != row_cache.row_key(cfg, row, ["fm"] * 8, weights | {"router": "other"}, {"dataset": "d"})
    monkeypatch.setattr(row_cache, "code_digest", lambda: "another version of the code")
    assert key != row_cache.row_key(cfg, row, ["fm"] * 8, weights, {"dataset": "d"})


def test_a_damaged_stored_row_is_said_and_not_reused(tmp_path, caplog):
    """The truth-row store: a missing entry is the usual case (nothing said), a damaged one is named with its reason
    and not reused; a sound one with its per-sample file is."""
    import logging
    import types

    from hddm_flower.gmm.row_cache import ROW_CACHE_DIR, cached_row, slug, store_row

    row = types.SimpleNamespace(name="8FM · top2")
    with caplog.at_level(logging.WARNING, logger="hddm_flower.gmm.row_cache"):
        assert cached_row(tmp_path, row, "k", []) is None
    assert not caplog.records
    (tmp_path / "rows.npz").write_bytes(b"per-sample values")
    store_row(tmp_path, row, "k", {"per_sample_file": "rows.npz", "delta_log_density": 1.0})
    assert cached_row(tmp_path, row, "k", [])["delta_log_density"] == 1.0
    entry = tmp_path / ROW_CACHE_DIR / f"{slug(row.name)}.json"
    entry.write_text('{"key": "k", "per_sample')  # cut short, as by a full disk
    with caplog.at_level(logging.WARNING, logger="hddm_flower.gmm.row_cache"):
        assert cached_row(tmp_path, row, "k", []) is None
    assert "unreadable (JSONDecodeError" in caplog.text and str(entry) in caplog.text
