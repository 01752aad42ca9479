"""``hddm reproduce`` and ``hddm evaluate`` end to end on a tiny config; report contents; CLI errors."""

import json
import os

import pytest
import torch
import yaml
from PIL import Image

from hddm_flower.cli import main
from hddm_flower.config.io import load_config
from hddm_flower.config.rules import ConfigError
from hddm_flower.data import Dataset
from hddm_flower.evaluation.evaluate import choose_prompts, parse_mode
from hddm_flower.reproduce.run import default_configs, reproduce
from hddm_flower.reproduce.tables import paired_differences

from .conftest import TINY
from .test_provenance import expected_source_commit


def test_parse_mode_and_default_configurations():
    assert parse_mode("top2") == {"routing": "top_k", "k": 2}
    assert parse_mode("oracle") == {"routing": "oracle"}
    assert parse_mode("top2+vscale") == {"routing": "top_k", "k": 2, "velocity_scaling": True}
    with pytest.raises(ValueError, match="unknown routing mode 'top0'"):
        parse_mode("top0")
    with pytest.raises(ValueError, match="unknown routing mode 'top'"):
        parse_mode("top")
    assert default_configs(8) == {"8FM": 0, "2DDPM:6FM": 2, "4DDPM:4FM": 4}
    assert default_configs(4) == {"4FM": 0, "2DDPM:2FM": 2}
    assert default_configs(8, [0, 2]) == {"8FM": 0, "2DDPM:6FM": 2}  # reproduce.ddpm_counts
    assert default_configs(8, [8, 0]) == {"8DDPM": 8, "8FM": 0}


def test_evaluation_config_is_checked(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"evaluation": {"routing_modes": ["top2", "best"]}}))
    with pytest.raises(ConfigError, match=r"evaluation.routing_modes\[1\]: unknown mode 'best'"):
        load_config(path)
    path.write_text(yaml.safe_dump({"evaluation": {"samples_per_prompt": 1}}))
    with pytest.raises(ConfigError, match="evaluation.samples_per_prompt"):
        load_config(path)


def test_prompts_are_distinct_held_out_first_and_seeded(tiny_config, dataset_dir):
    a = choose_prompts(Dataset.open(dataset_dir), 5, seed=0)
    assert len(set(a.captions)) == 5 and a.cond.states.shape[0] == 5 and a.labels.shape == (5,)
    assert a.captions == choose_prompts(Dataset.open(dataset_dir), 5, seed=0).captions
    mine = choose_prompts(Dataset.open(dataset_dir), 4, seed=1, clusters=[2])
    assert torch.all(mine.labels == 2)


def test_prompt_choice_reads_what_the_prompts_need_not_the_dataset(tmp_path, monkeypatch):
    """Every sample the caption streams read passes webdataset's member filter once with its ``.json``: counted
    there. 2 prompts of a 2-cluster dataset (half held out) read a few samples, not a cluster's worth."""
    from hddm_flower.data import read_meta, shards
    from hddm_flower.gmm.dataset import GMMSpec, prepare_gmm

    spec = GMMSpec(num_clusters=2, components_per_cluster=4, image_size=4, channels=1, rank=1, num_samples=800)
    d = prepare_gmm(tmp_path, spec, val_fraction=0.5, max_caption_tokens=4)
    meta = read_meta(d)
    val_fraction = sum(c["val"] for c in meta["clusters"]) / meta["num_images"]
    read = []
    real = shards.open_shards

    def counted(urls, *, select_files, **kw):
        def keep(name):
            if name.endswith(".json"):
                read.append(name)
            return select_files(name)

        return real(urls, select_files=keep, **kw)

    monkeypatch.setattr(shards, "open_shards", counted)
    n, k = 2, meta["num_clusters"]
    assert len(choose_prompts(Dataset.open(d), n, seed=0).captions) == n
    # each cluster's buffer (n / K held-out captions) fills, then one held-out caption per prompt: ≈ (n + K)/vf
    assert 0 < len(read) <= 4 * (n + k) / val_fraction < meta["num_images"] / 20


@pytest.fixture(scope="module")
def reproduced(tmp_path_factory, dataset_dir):
    modes = ["top1", "top2", "full", "threshold", "oracle"]
    d = dict(TINY, evaluation=dict(TINY["evaluation"], routing_modes=modes, seeds=2))
    path = tmp_path_factory.mktemp("repro") / "tiny.yaml"
    path.write_text(yaml.safe_dump(d))
    cfg = load_config(path)
    out = tmp_path_factory.mktemp("out")
    return cfg, out, reproduce(cfg, out, Dataset.open(dataset_dir))


@pytest.mark.slow
def test_reproduce_writes_tables_manifest_and_runs(reproduced):
    cfg, out, manifest = reproduced
    # 4 experts: 4FM and 2DDPM:2FM share the FM experts of the FM clusters → 4 FM + 2 DDPM trained once each
    objs = manifest["configurations"]["2DDPM:2FM"]["objectives"]
    assert objs.count("ddpm") == 2 and manifest["configurations"]["4FM"]["objectives"] == ["fm"] * 4
    assert sorted(manifest["artefacts"]["experts"]) == sorted(
        [f"cluster-{k}-fm" for k in range(4)] + [f"cluster-{k}-ddpm" for k, o in enumerate(objs) if o == "ddpm"]
    )
    assert set(manifest["results"]) == {"4FM", "2DDPM:2FM", "monolith"}
    assert set(manifest["results"]["4FM"]) == {"top1", "top2", "full", "threshold", "oracle"}
    assert {"versions", "source", "seeds", "config", "fingerprints", "dataset"} <= set(manifest)
    assert manifest["source"].get("commit") == expected_source_commit()  # the checkout's, read apart; None: none
    mono = json.loads((out / "monolith" / "hddm_expert.json").read_text())
    assert mono["steps"] == cfg.num_experts * cfg.expert.steps and mono["cluster_id"] == "all"
    tables = (out / "tables.md").read_text()
    for text in ("Table 1", "Table 2", "2DDPM:2FM", "monolith", "hddm feature classifier", "22.60", "29.64"):
        assert text in tables
    # two seeds, the same for every configuration (other prompts and noise); intervals across them
    assert "Seeds: 2" in tables and "95 % Student-t" in tables
    assert "Table 3" in tables and "| 2DDPM:2FM: top2 − full |" in tables and "| top2: 2DDPM:2FM − 4FM |" in tables
    for modes in manifest["results"].values():
        for r in modes.values():
            assert [v["seed"] for v in r["per_seed"]] == [cfg.evaluation.seed, cfg.evaluation.seed + 1]
            fids = [v["fid"] for v in r["per_seed"]]
            assert fids[0] == r["fid"] and r["intervals"]["fid"]["n"] == 2
            assert r["intervals"]["fid"]["lo"] <= min(fids) <= max(fids) <= r["intervals"]["fid"]["hi"]
    assert (out / "runs" / "4FM" / "seeds" / f"seed-{cfg.evaluation.seed + 1}" / "expert-usage.png").is_file()
    run = out / "runs" / "2DDPM-2FM"
    links = sorted(os.readlink(p) for p in (run / "experts").glob("expert-*"))
    assert len(links) == 4 and all(not os.path.isabs(x) for x in links)
    report = json.loads((run / "report.json").read_text())
    objectives = [e["objective"] for e in report["experts"]]
    assert objectives.count("ddpm") == 2
    ev = report["metrics"]["evaluation"]
    assert ev["feature_network"].startswith("hddm feature classifier") and "FALLBACK" in ev["diversity_distance"]
    for mode, r in ev["modes"].items():
        assert r["fid"] >= 0 and r["lpips"]["mean"] > 0 and len(r["usage"]) == 4 and r["usage"][3] >= 0
        if mode == "full":  # every expert, the DDPM ones included, runs on every row
            assert r["clamps"]["rows"] > 0
    assert sum(ev["modes"]["top2"]["usage"]) == pytest.approx(2.0)
    assert sum(ev["modes"]["top1"]["usage"]) == pytest.approx(1.0)
    assert sorted(ev["per_expert"]) == ["0", "1", "2", "3"]
    assert ev["per_expert"][str(objectives.index("ddpm"))]["clamps"]["rows"] > 0
    for name in ("router-weights.png", "expert-usage.png", "samples.png", "report.md"):
        assert (run / name).stat().st_size > 0
    for g in ev["grids"]:
        assert Image.open(run / g["file"]).size[1] > 5 * 16  # a row per routing mode
    assert "## Routing modes" in (run / "report.md").read_text()


@pytest.mark.slow
def test_reproduce_reuses_experts_and_refuses_a_changed_config(reproduced, dataset_dir):
    cfg, out, manifest = reproduced
    from hddm_flower.reproduce.training import train_or_reuse

    again = train_or_reuse(
        out / "experts" / "cluster-0-fm", manifest["fingerprints"]["experts"], lambda: pytest.fail("retrained")
    )
    assert again["reused"] and again["sha256"] == manifest["artefacts"]["experts"]["cluster-0-fm"]["sha256"]
    with pytest.raises(ConfigError, match="trained with another config"):
        train_or_reuse(out / "experts" / "cluster-0-fm", "other", lambda: None)


@pytest.mark.slow
def test_cli_evaluate_a_run_and_bad_input(reproduced, cache_dir, capsys):
    cfg, out, _ = reproduced
    run = out / "runs" / "4FM"
    assert main(["evaluate", "--run-dir", str(run), "--cache-dir", str(cache_dir), "--modes", "top2,oracle"]) == 0
    report = json.loads((run / "report.json").read_text())
    assert list(report["metrics"]["evaluation"]["modes"]) == ["top2", "oracle"]
    assert "FID" in capsys.readouterr().out
    assert main(["evaluate", "--run-dir", str(run), "--cache-dir", str(cache_dir), "--modes", "top2,best"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown routing mode 'best'" in err[0]
    assert main(["evaluate", "--run-dir", str(out / "nope"), "--cache-dir", str(cache_dir)]) == 2
    assert "router" in capsys.readouterr().err


@pytest.mark.slow
def test_a_feature_network_trained_with_other_settings_is_refused(reproduced, dataset_dir):
    import dataclasses

    from hddm_flower.evaluation.evaluate import feature_network

    cfg, out, _ = reproduced
    fx, net, desc = feature_network(
        cfg, Dataset.open(dataset_dir), out / "feature_net", decode=lambda x: x
    )  # same settings: reused
    assert fx.name.startswith("hddm feature classifier") and net is not None
    other = dataclasses.replace(cfg, evaluation=dataclasses.replace(cfg.evaluation, feature_steps=7))
    with pytest.raises(ConfigError, match="trained with other settings"):
        feature_network(other, Dataset.open(dataset_dir), out / "feature_net", decode=lambda x: x)


def test_monolith_sees_what_the_experts_saw(tiny_config, dataset_dir):
    """Equal compute: with gradient accumulation the monolith takes K × steps optimiser steps of batch × accumulation
    images, like the experts, not K × steps micro-batches."""
    import dataclasses

    from hddm_flower.reproduce.training import train_monolith

    e = dataclasses.replace(tiny_config.expert, steps=1, grad_accumulation=3)
    cfg = dataclasses.replace(tiny_config, expert=e)
    _, _, meta = train_monolith(cfg, Dataset.open(dataset_dir))
    assert meta["steps"] == cfg.num_experts * e.steps and meta["grad_accumulation"] == 3
    assert meta["images_seen"] == cfg.num_experts * e.steps * e.batch_size * e.grad_accumulation


def test_the_monolith_is_reproducible_from_its_seed_across_processes_and_threads(tiny_config, dataset_dir, tmp_path):
    """The monolith trained here (this process's torch threads) and in a spawned worker (one thread) has the same
    weights to the byte and the same loss curve; training 1 of evaluation.training_seeds (other seeds) does not."""
    import dataclasses
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from hddm_flower.checkpoints import WEIGHTS, read_expert_meta
    from hddm_flower.reproduce.training import tensor_sha256, train_job
    from hddm_flower.training_seeds import training_config

    cfg = dataclasses.replace(tiny_config, expert=dataclasses.replace(tiny_config.expert, steps=4))

    def job(c, folder, in_worker):
        return (c.to_dict(), str(dataset_dir), None, "fm", str(tmp_path / folder), "fp", in_worker, False)

    train_job(job(cfg, "here", False))
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        pool.submit(train_job, job(cfg, "worker", True)).result()
    train_job(job(training_config(cfg, 1), "training-1", False))
    digest = {f: tensor_sha256(tmp_path / f / WEIGHTS) for f in ("here", "worker", "training-1")}
    curves = {f: read_expert_meta(tmp_path / f)["loss_curve"] for f in digest}
    assert digest["here"] == digest["worker"] and curves["here"] == curves["worker"]
    assert digest["training-1"] != digest["here"] and curves["training-1"] != curves["here"]


def test_streamed_monolith_reads_the_shards_as_a_stream_and_is_reproducible(tiny_config, dataset_dir, monkeypatch):
    """data.stream: the monolith trains from every cluster's seeded stream (no split loaded), twice the same."""
    import dataclasses

    from hddm_flower.reproduce import training as reproduce

    def no_loading(*a, **k):
        raise AssertionError("the streamed monolith loaded a split")

    monkeypatch.setattr(Dataset, "split", no_loading)
    e = dataclasses.replace(tiny_config.expert, steps=1)
    cfg = dataclasses.replace(tiny_config, expert=e, data=dataclasses.replace(tiny_config.data, stream=True))
    a, _, meta = reproduce.train_monolith(cfg, Dataset.open(dataset_dir))
    b, _, _ = reproduce.train_monolith(cfg, Dataset.open(dataset_dir))
    train = sum(c["size"] - c["val"] for c in json.loads((dataset_dir / "meta.json").read_text())["clusters"])
    assert meta["cluster_size"] == train and meta["images_seen"] == cfg.num_experts * e.batch_size
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)


@pytest.mark.parametrize("stream", [False, True])
def test_a_monolith_killed_after_its_checkpoint_resumes_from_it(
    tiny_config, dataset_dir, tmp_path, monkeypatch, stream
):
    """hddm reproduce's monolith keeps a training state as an expert does (expert.checkpoint_every): killed right
    after its first save, the next call resumes there and removes the state once the folder is written. From a
    loaded split the resumed monolith equals the uninterrupted one to the byte; from the stream it resumes its
    weights, optimiser and step, and its stream starts at the resumed step (a stream of its own, as an expert's
    does: ``tests/test_dataset.py``), so its weights differ from the uninterrupted run's."""
    import dataclasses

    from hddm_flower import training
    from hddm_flower.checkpoints import WEIGHTS, read_expert_meta
    from hddm_flower.reproduce.training import tensor_sha256, train_job, training_state

    e = dataclasses.replace(tiny_config.expert, steps=2, checkpoint_every=3)  # the monolith: 4 × 2 = 8 steps
    cfg = dataclasses.replace(tiny_config, expert=e, data=dataclasses.replace(tiny_config.data, stream=stream))

    def job(folder):
        return (cfg.to_dict(), str(dataset_dir), None, "fm", str(tmp_path / folder), "fp", False, False)

    train_job(job("straight"))
    real = training._save_training_state

    def save_then_die(path, *a):
        real(path, *a)
        raise KeyboardInterrupt  # the process is killed right after its first checkpoint

    monkeypatch.setattr(training, "_save_training_state", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        train_job(job("killed"))
    state = training_state(tmp_path / "killed", "fp")
    assert state.is_file() and not (tmp_path / "killed").exists()
    monkeypatch.setattr(training, "_save_training_state", real)
    starts = []
    real_fit = training.fit
    monkeypatch.setattr(training, "fit", lambda *a, on_start, **k: real_fit(*a, on_start=_also(on_start, starts), **k))
    train_job(job("killed"))
    assert starts == [3]  # the data source was told where the training starts
    meta = read_expert_meta(tmp_path / "killed")
    assert meta["resumed_steps"] == 3 and meta["steps"] == 8 and not state.exists()
    assert [s for s, _ in meta["loss_curve"]] == list(range(1, 9))
    same = tensor_sha256(tmp_path / "killed" / WEIGHTS) == tensor_sha256(tmp_path / "straight" / WEIGHTS)
    assert same != stream  # the resumed stream gives other batches after step 3


def _also(on_start, starts: list):
    """``on_start`` that also records the step it was called with."""

    def call(step):
        starts.append(step)
        if on_start is not None:
            on_start(step)

    return call


def test_paired_differences_cancel_what_every_row_of_a_seed_shares():
    """Each seed moves every row by the same amount (its prompts): the marginal intervals are wide, the paired
    differences exact. One seed gives no paired table."""
    shift = [0.0, -30.0, 25.0]  # the prompt set of each seed

    def rows(**offsets):
        return {
            m: [{"seed": s, "fid": 50 + o + shift[s], "kid": 10 + o / 2} for s in range(3)] for m, o in offsets.items()
        }

    results = {
        "8FM": {"per_seed": rows(top2=0.0, full=12.0)},
        "2DDPM:6FM": {"per_seed": rows(top2=-1.0, full=9.0)},
        "monolith": {"per_seed": rows(top1=0.0)},
    }
    got = {e["what"]: e for e in paired_differences(results)}
    assert set(got) == {
        "8FM: top2 − full",
        "2DDPM:6FM: top2 − full",
        "8FM: top2 − monolith",
        "2DDPM:6FM: top2 − monolith",
        "top2: 2DDPM:6FM − 8FM",
    }
    full = got["8FM: top2 − full"]["fid"]
    assert full["mean"] == pytest.approx(-12.0) and full["half"] == pytest.approx(0.0) and full["resolved"]
    assert got["top2: 2DDPM:6FM − 8FM"]["kid"]["mean"] == pytest.approx(-0.5)
    assert not got["8FM: top2 − monolith"]["fid"]["resolved"]  # a difference of exactly 0
    one = {n: {"per_seed": {m: v[:1] for m, v in r["per_seed"].items()}} for n, r in results.items()}
    assert paired_differences(one) == []


def test_a_mode_streamed_batch_by_batch_gives_the_whole_sets_metrics_and_keeps_only_the_grid():
    """StreamedSamples fed batches that cut across prompts gives the features, diversity and adherence of the
    whole sample set at once (float64), and keeps the pixels of the grid's prompts only."""
    from hddm_flower.evaluation import metrics as M
    from hddm_flower.evaluation.adherence import classify
    from hddm_flower.evaluation.evaluate import Prompts, StreamedSamples

    torch.manual_seed(0)
    classifier = M.FeatureClassifier(in_channels=3, num_classes=4, text_dim=8).double().eval()
    fx = M.classifier_features(classifier, "random test net")
    distance = M.lpips_distance(None, fallback=classifier, fallback_description="random test net")
    P, S, G = 5, 3, 2
    images = torch.rand(P, S, 3, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 2 - 1
    prompts = Prompts([f"prompt {p}" for p in range(P)], None, torch.tensor([0, 1, 2, 3, 1]))
    streamed = StreamedSamples(fx, classifier, distance, prompts, S, G)
    flat = images.flatten(0, 1)
    for i in range(0, len(flat), 4):  # batches of 4 rows: prompts of 3 samples split across batches
        streamed(flat[i : i + 4])
    torch.testing.assert_close(streamed.features(), fx(flat), rtol=1e-12, atol=1e-12)
    whole = M.intra_prompt_diversity(images, distance)
    got = streamed.diversity()
    assert got["pairs_per_prompt"] == whole["pairs_per_prompt"] and len(got["per_prompt"]) == P
    torch.testing.assert_close(torch.tensor(got["per_prompt"]), torch.tensor(whole["per_prompt"]), rtol=1e-12, atol=0)
    hits = (classify(classifier, flat) == prompts.labels.repeat_interleave(S)).double().mean()
    assert streamed.hits / streamed.rows == float(hits) and streamed.rows == P * S
    assert torch.equal(streamed.grid, images[:G])  # kept: the grid's prompts, nothing else
    assert sum(len(r) for r in streamed.grid_rows) == G * S and streamed.pending is None
