"""Cluster-stratified evaluation: prompts per cluster, the reference weighted to their mix, the real-vs-real floor
drawn out of it; ``hddm reproduce`` on the embedded data with it and with independent trainings (KID first,
adherence per row, the feature network's fingerprint in every result file)."""

import copy
import json

import pytest
import torch
import yaml
from torch import Tensor

from hddm_flower.config.io import load_config
from hddm_flower.config.rules import ConfigError
from hddm_flower.data import Dataset
from hddm_flower.evaluation.evaluate import stratified_prompts
from hddm_flower.evaluation.feature_sums import FeatureSums
from hddm_flower.evaluation.reference import ReferenceStats, leave_out, matched_reference

from .conftest import TINY


def test_stratified_prompts_are_equal_per_cluster_seeded_and_deterministic(dataset_dir):
    k = Dataset.open(dataset_dir).num_clusters
    a = stratified_prompts(Dataset.open(dataset_dir), 2 * k, seed=0)
    assert a.labels.tolist() == [c for c in range(k) for _ in range(2)]  # cluster by cluster, 2 each
    assert a.cond.states.shape[0] == a.cond.mask.shape[0] == 2 * k
    again = stratified_prompts(Dataset.open(dataset_dir), 2 * k, seed=0)
    assert again.captions == a.captions and torch.equal(again.cond.states, a.cond.states)
    others = [stratified_prompts(Dataset.open(dataset_dir), 2 * k, seed=s) for s in range(1, 5)]
    assert all(o.labels.tolist() == a.labels.tolist() for o in others)  # one cluster mix for every seed …
    assert any(o.captions != a.captions for o in others)  # … and other captions
    with pytest.raises(ValueError, match="evaluation.num_prompts: 7 prompts cannot be split equally among"):
        stratified_prompts(Dataset.open(dataset_dir), 7, seed=0)


def test_stratified_prompts_are_checked_with_the_config(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"evaluation": {"prompt_sampling": "by_cluster"}}))
    with pytest.raises(ConfigError, match="evaluation.prompt_sampling: unknown value 'by_cluster'"):
        load_config(path)
    path.write_text(yaml.safe_dump({"evaluation": {"prompt_sampling": "stratified", "num_prompts": 12}}))
    with pytest.raises(ConfigError, match=r"c.yaml: evaluation.num_prompts: .* 12 is not a multiple of num_experts 8"):
        load_config(path)
    path.write_text(yaml.safe_dump({"evaluation": {"prompt_sampling": "stratified", "reference": "federated"}}))
    with pytest.raises(ConfigError, match="evaluation.prompt_sampling: stratified needs evaluation.reference: central"):
        load_config(path)


def _clusters(sizes: list[int], d: int = 3) -> tuple[dict[int, Tensor], dict[int, ReferenceStats]]:
    """Features of clusters of the given sizes (float64; cluster k's first coordinate within ±20 of 100·k, so that a
    row tells its cluster) and their reference statistics with every image in the KID reservoir."""
    g = torch.Generator().manual_seed(0)
    feats = {}
    for k, n in enumerate(sizes):
        f = (torch.rand(n, d, generator=g, dtype=torch.float64) - 0.5) * 10 * (1 + k)
        f[:, 0] += 100 * k
        feats[k] = f
    return feats, {k: ReferenceStats(FeatureSums.of(f), f.clone()) for k, f in feats.items()}


def test_a_matched_reference_is_the_weighted_mixture_of_the_clusters():
    """FID moments of Σ_k w_k p_k in closed form (mean Σ w_k μ_k, covariance n/(n − 1) · (Σ w_k E_k[ffᵀ] − μμᵀ)),
    KID rows per cluster ∝ w_k; with weights ∝ the clusters' sizes the plain pooled sums."""
    feats, stats = _clusters([10, 20, 40])
    w = {0: 1.0, 1: 1.0, 2: 2.0}
    ref = matched_reference(stats, w, seed=0)
    n = 70
    p = {k: v / 4 for k, v in w.items()}
    mu = sum(p[k] * feats[k].mean(0) for k in feats)
    second = sum(p[k] * feats[k].T @ feats[k] / len(feats[k]) for k in feats)
    got_mu, got_cov = ref.sums.mean_cov()
    assert ref.count == n
    torch.testing.assert_close(got_mu, mu, rtol=0, atol=1e-12)
    torch.testing.assert_close(got_cov, (second - torch.outer(mu, mu)) * n / (n - 1), rtol=0, atol=1e-10)
    per = torch.bincount((ref.kid_features[:, 0] / 100).round().long(), minlength=3).tolist()
    assert per == [10, 10, 20]  # R = 40: the smallest cluster fills its quarter
    pooled = matched_reference(stats, {k: len(f) for k, f in feats.items()})
    everything = torch.cat(list(feats.values()))
    for a, b in zip(pooled.sums.mean_cov(), FeatureSums.of(everything).mean_cov()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    with pytest.raises(ValueError, match=r"clusters \[3\] lack them"):
        matched_reference(stats, {0: 1, 3: 1})


def test_the_floor_draws_real_reference_images_out_of_the_reference():
    """leave_out takes ``counts[k]`` of cluster k's own feature rows (seeded) and leaves a reference of exactly the
    other rows: its FID sums are those of the remaining images, its KID sample is them, nothing is shared."""
    feats, stats = _clusters([10, 20, 40])
    rest, drawn = leave_out(stats, {0: 3, 2: 5}, seed=1)
    assert sorted(drawn) == [0, 2] and rest[1] is stats[1]
    for k, n in ((0, 3), (2, 5)):
        rows = {tuple(r.tolist()) for r in feats[k]}
        got = [tuple(r.tolist()) for r in drawn[k]]
        kept = [tuple(r.tolist()) for r in rest[k].kid_features]
        assert len(got) == n and set(got) <= rows  # real images of that cluster …
        assert not set(got) & set(kept) and set(got) | set(kept) == rows  # … out of the reference
        remaining = torch.tensor(sorted(kept), dtype=torch.float64)
        assert rest[k].count == len(feats[k]) - n
        for a, b in zip(rest[k].sums.mean_cov(), FeatureSums.of(remaining).mean_cov()):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    again = leave_out(stats, {0: 3, 2: 5}, seed=1)[1]
    assert all(torch.equal(again[k], drawn[k]) for k in drawn)
    assert not torch.equal(leave_out(stats, {0: 3, 2: 5}, seed=2)[1][2], drawn[2])
    with pytest.raises(ValueError, match="draws 9 images of cluster 0 out of its reference, which holds 10"):
        leave_out(stats, {0: 9}, seed=0)


@pytest.fixture(scope="module")
def stratified_run(tmp_path_factory, dataset_dir):
    """A tiny ``hddm reproduce`` on the embedded test data with stratified prompts and two trainings."""
    from hddm_flower.reproduce.run import reproduce

    d = copy.deepcopy(TINY)
    d["evaluation"] |= {
        "routing_modes": ["top2"],
        "num_prompts": 4,
        "prompt_sampling": "stratified",
        "seeds": 1,
        "training_seeds": 2,
    }
    d["reproduce"] = {"ddpm_counts": [0]}
    path = tmp_path_factory.mktemp("strat") / "tiny.yaml"
    path.write_text(yaml.safe_dump(d))
    cfg = load_config(path)
    out = tmp_path_factory.mktemp("strat-out")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny networks: a second thread only waits (3× slower on a busy machine)
    try:
        return cfg, out, reproduce(cfg, out, Dataset.open(dataset_dir), command="hddm reproduce (test)")
    finally:
        torch.set_num_threads(threads)


def test_the_tables_put_kid_first_with_adherence_per_row_and_the_floor(stratified_run):
    cfg, out, manifest = stratified_run
    tables = (out / "tables.md").read_text().splitlines()
    assert (
        "| configuration | KID ↓ | FID ↓ | adherence ↑ | intra-prompt diversity ↑ |"
        in tables[
            tables.index(
                "**Table 1 — heterogeneous vs homogeneous (top-2 routing).** KID is the primary metric at these counts."
            )
            + 2
        ]
    )
    assert "| comparison | KID difference | FID difference | adherence difference | resolved |" in tables
    floor_rows = [line for line in tables if line.startswith("| real (floor) |")]
    assert len(floor_rows) == 2  # Table 1 and Table 2
    assert any(line.startswith("| 4FM: top2 − real (floor) |") for line in tables)
    top2 = manifest["results"]["4FM"]["top2"]
    assert top2["adherence"] is not None and "adherence" in top2["nested"]
    table1_4fm = next(line for line in tables if line.startswith("| 4FM |"))
    assert table1_4fm.split(" | ")[1].startswith(f"{top2['nested']['kid']['mean']:.4f} ± ")
    assert table1_4fm.split(" | ")[3].startswith(f"{top2['nested']['adherence']['mean']:.3f} ± ")


def test_the_floor_is_real_images_at_the_samples_count_the_same_for_every_row(stratified_run):
    """The floor's count per cluster is the samples' (prompts per cluster × samples per prompt), and it is the same
    in every evaluation of the seed — every configuration, the monolith, both trainings: it does not depend on what
    was sampled (its images are the reference's own, :func:`test_the_floor_draws_real_reference_images_out_of_the_reference`)."""
    cfg, out, manifest = stratified_run
    ev = cfg.evaluation
    k = cfg.num_experts
    reports = [
        json.loads((out / p / "report.json").read_text())["metrics"]["evaluation"]
        for p in ("runs/4FM", "trainings/training-1/runs/4FM")
    ]
    floors = [r["floor"] for r in reports]
    assert floors[0] == floors[1]
    per = ev.num_prompts // k * ev.samples_per_prompt
    assert floors[0]["per_cluster"] == {str(c): per for c in range(k)} and floors[0]["num_samples"] == per * k
    row = manifest["results"]["real (floor)"]["real"]
    assert row["fid"] == floors[0]["fid"] and row["kid"] == floors[0]["kid"] and row["adherence"] is None
    assert all(r["protocol"]["prompt_sampling"] == "stratified" for r in reports)
    assert reports[0]["prompts"] == reports[1]["prompts"]  # aligned across trainings
    assert floors[0]["fid"] not in {m["fid"] for r in reports for m in r["modes"].values()}


def test_the_feature_network_is_fingerprinted_in_the_manifest_tables_and_reports(stratified_run):
    from hddm_flower.checkpoints import WEIGHTS
    from hddm_flower.evaluation.metrics import FeatureClassifier, state_fingerprint
    from hddm_flower.reproduce.training import tensor_sha256

    cfg, out, manifest = stratified_run
    fn = manifest["artefacts"]["feature_net"]
    net = FeatureClassifier.from_pretrained(out / "feature_net")
    assert fn["state_fingerprint"] == state_fingerprint(net) == manifest["fingerprints"]["feature_net"]
    assert fn["tensor_sha256"] == tensor_sha256(out / "feature_net" / WEIGHTS)
    assert fn["name"].startswith("hddm feature classifier")
    tables = (out / "tables.md").read_text()
    assert fn["state_fingerprint"] in tables and fn["tensor_sha256"] in tables
    report = json.loads((out / "runs" / "4FM" / "report.json").read_text())
    assert report["metrics"]["evaluation"]["feature_fingerprint"] == fn["state_fingerprint"]
    assert fn["state_fingerprint"] in (out / "runs" / "4FM" / "report.md").read_text()


def test_training_seeds_retrain_and_nest_the_embedded_intervals(stratified_run):
    """evaluation.training_seeds: 2 on the embedded data: training 1's experts, router and monolith (other seeds,
    cached by their fingerprint) in trainings/training-1, each row evaluated per training on the same seeds, cells
    and paired differences over trainings."""
    from hddm_flower.reproduce.training import train_or_reuse

    cfg, out, manifest = stratified_run
    t0, t1 = manifest["artefacts"]["trainings"]
    assert t1["root"] == "trainings/training-1" and t0["fingerprint"] != t1["fingerprint"]
    assert t0["experts"]["cluster-0-fm"]["tensor_sha256"] != t1["experts"]["cluster-0-fm"]["tensor_sha256"]
    assert t0["monolith"]["tensor_sha256"] != t1["monolith"]["tensor_sha256"]
    assert t0["router"]["tensor_sha256"] != t1["router"]["tensor_sha256"]
    again = train_or_reuse(
        out / "trainings" / "training-1" / "experts" / "cluster-0-fm",
        t1["fingerprint"],
        lambda: pytest.fail("retrained"),
    )
    assert again["reused"]
    for name, mode in (("4FM", "top2"), ("monolith", "top1")):
        r = manifest["results"][name][mode]
        assert len(r["per_training"]) == 2 and r["nested"]["kid"]["trainings"] == 2
        assert r["nested"]["kid"]["per_training"] == [s[0]["kid"] for s in r["per_training"]]
    paired = {e["what"]: e for e in manifest["paired"]}
    assert paired["4FM: top2 − monolith"]["kid"]["covers"] == "trainings"
    assert "Trainings: 2" in (out / "tables.md").read_text()
