"""Data at scale: webdataset ingestion with broken samples, resumption, latents + CLIP + DINOv2 from local folders,
hierarchical k-means, per-cluster shard sets, and what clients read from them."""

import csv
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hddm_flower.cluster import cluster_encoded, fit_hierarchical
from hddm_flower.config.io import config_from_dict
from hddm_flower.data import Dataset, check_clusters, read_meta
from hddm_flower.ingest import prepare_from_config
from hddm_flower.sources import SKIP_REASONS, ShardError

from .tiny_models import save_tiny_clip_text, save_tiny_dinov2, save_tiny_vae

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 60), "blue": (30, 60, 220)}


def _image(colour: str, i: int, size: int = 40, fmt: str = "jpeg") -> bytes:
    """A coloured square with a stripe pattern whose frequency depends on i (detail varies)."""
    rng = np.random.default_rng(i)
    x = np.ones((size, size + 8, 3), np.float32) * np.array(COLOURS[colour], np.float32)
    if i % 2:
        x[:, ::2] *= 0.5  # fine stripes: high Laplacian energy
    x += rng.normal(0, 4, x.shape)
    buf = io.BytesIO()
    Image.fromarray(x.clip(0, 255).astype(np.uint8)).save(buf, format=fmt)
    return buf.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _write_shard(path: Path, samples: list[dict]) -> None:
    with tarfile.open(path, "w") as tar:
        for s in samples:
            for ext, data in s.items():
                if ext != "key":
                    _add(tar, f"{s['key']}.{ext}", data)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Three img2dataset-style shards (18 good samples) with every kind of broken sample, plus their counts."""
    root = tmp_path_factory.mktemp("laion")
    good, n = [], 0
    for shard in range(3):
        samples = []
        for j in range(6):
            colour = list(COLOURS)[(shard * 6 + j) % 3]
            key = f"{shard:05d}{j:04d}"
            tag = chr(97 + shard * 6 + j) * 3  # every caption distinct: "aaa", "bbb", …
            fmt, ext = [("jpeg", "jpg"), ("png", "png"), ("webp", "webp")][j % 3]
            s = {"key": key, ext: _image(colour, shard * 6 + j, fmt=fmt)}
            if j == 4:  # caption only in the json, as img2dataset can write it
                s["json"] = json.dumps({"caption": f"a {colour} square {tag}", "url": "http://x"}).encode()
            else:
                s["txt"] = f"a photo of a {colour} square {tag}".encode()
                s["json"] = json.dumps({"url": "http://x"}).encode()
            samples.append(s)
            good.append(key)
            n += 1
        _write_shard(root / f"{shard:05d}.tar", samples)
    # broken samples in a fourth shard, then truncated
    broken = [
        {"key": "0000300000", "jpg": b"\xff\xd8 this is not a jpeg", "txt": b"a red square"},  # corrupt_image
        {"key": "0000300001", "jpg": _image("red", 1), "json": b'{"url": "x"}'},  # missing_caption
        {"key": "0000300002", "png": _image("blue", 2, fmt="png"), "txt": b"   \n"},  # empty_caption
        {"key": "0000300003", "txt": b"a caption without an image"},  # missing_image
        {"key": "0000300004", "jpg": _image("green", 3), "txt": b"a green square"},  # good
        {"key": "0000300005", "jpg": _image("green", 5, size=200), "txt": b"a green square"},  # cut off below
    ]
    path = root / "00003.tar"
    _write_shard(path, broken)
    data = path.read_bytes()
    # cut inside the last image member: find its header, keep 700 bytes of its data
    start = data.index(b"0000300005.jpg")
    path.write_bytes(data[: start + 512 + 700])
    good.append("0000300004")
    counts = {
        "num_samples": n + 1,
        "skipped": {
            "corrupt_image": 1,
            "missing_image": 1,
            "missing_caption": 1,
            "empty_caption": 1,
            "truncated_member": 1,
        },
    }
    return root, counts, good


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {
        "vae": save_tiny_vae(root / "vae"),
        "clip": save_tiny_clip_text(root / "clip"),
        "dinov2": save_tiny_dinov2(root / "dinov2"),
    }


def _data(shards_root: Path, **kw):
    d = {
        "name": "webdataset",
        "shards": str(shards_root / "{00000..00003}.tar"),
        "image_size": 16,
        "max_caption_tokens": 8,
        "encode_batch_size": 4,
        "fine_clusters": 6,
        "shard_size": 4,
        "device": "cpu",
    }
    return config_from_dict(
        {"num_experts": 3, "objectives": {"ddpm": 1, "fm": 2}, "federation": {"min_experts": 1}, "data": d | kw}
    ).data


def _keys(encoded: Path) -> list[str]:
    import webdataset as wds

    m = json.loads((encoded / "manifest.json").read_text())
    urls = [str(encoded / s["name"]) for s in m["shards"]]
    return [json.loads(s["json"])["source_key"] for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False)]


def test_manifest_counts_are_exact(shards, tmp_path):
    root, counts, good = shards
    m = prepare_from_config(_data(root), tmp_path / "enc")
    assert m["num_samples"] == counts["num_samples"] and m["skipped"] == counts["skipped"]
    assert set(m["skipped"]) == set(SKIP_REASONS) and m["skipped_shards"] == []
    assert [s["count"] for s in m["shards"]] == [6, 6, 6, 1]
    assert m["pixel_size"] == 16 and m["channels"] == 3 and m["latent"] is None
    assert m["text_encoder"]["name"].startswith("bert") and m["versions"]["webdataset"]
    assert sorted(_keys(tmp_path / "enc")) == sorted(good)
    json_only = [k for k in good if k.endswith("0004")]
    assert json_only  # captions from the json field were kept


def test_missing_shard_is_a_one_line_error_or_skipped_with_the_flag(shards, tmp_path):
    root, counts, _ = shards
    pattern = str(root / "{00000..00004}.tar")  # 00004.tar does not exist
    with pytest.raises(ShardError, match=r"shard .*00004\.tar does not exist") as e:
        prepare_from_config(_data(root, shards=pattern), tmp_path / "a")
    assert "\n" not in str(e.value)
    (tmp_path / "junk.tar").write_bytes(b"not a tar at all" * 10)
    m = prepare_from_config(
        _data(root, shards=f"{pattern} {tmp_path / 'junk.tar'}", skip_bad_shards=True), tmp_path / "b"
    )
    assert m["num_samples"] == counts["num_samples"]
    assert [s["shard"].split("/")[-1] for s in m["skipped_shards"]] == ["00004.tar", "junk.tar"]
    assert "not a readable tar" in m["skipped_shards"][1]["error"]
    # the shard appears later: a rerun encodes it and nothing else twice
    (root / "00004.tar").write_bytes((root / "00000.tar").read_bytes())
    try:
        m2 = prepare_from_config(
            _data(root, shards=f"{pattern} {tmp_path / 'junk.tar'}", skip_bad_shards=True), tmp_path / "b"
        )
    finally:
        (root / "00004.tar").unlink()
    assert m2["num_samples"] == counts["num_samples"] + 6 and len(m2["skipped_shards"]) == 1
    assert len((tmp_path / "b" / "progress.jsonl").read_text().splitlines()) == 5


def test_resume_after_an_interruption_writes_no_duplicates(shards, tmp_path):
    root, counts, good = shards
    data = _data(root)
    out = tmp_path / "enc"
    part = prepare_from_config(data, out, stop_after_units=2)
    assert part["complete"] is False and not (out / "manifest.json").exists()
    # an interruption in the middle of the third shard leaves a partial file behind
    (out / "shard-000002.tar.partial").write_bytes(b"half a shard")
    m = prepare_from_config(data, out)
    keys = _keys(out)
    assert len(keys) == len(set(keys)) == m["num_samples"] == counts["num_samples"]
    assert sorted(keys) == sorted(good) and m["skipped"] == counts["skipped"]
    assert not list(out.glob("*.partial"))
    lines = (out / "progress.jsonl").read_text().splitlines()
    assert len(lines) == 4  # each unit recorded once
    with pytest.raises(ValueError, match="other settings"):
        prepare_from_config(_data(root, max_caption_tokens=6), out)


def test_latents_clip_and_dinov2_end_to_end(shards, models, tmp_path, monkeypatch):
    """img2dataset shards → VAE latents + CLIP states → DINOv2 hierarchical k-means → shard sets → an expert
    trained on latents → samples decoded by the VAE."""
    from hddm_flower.encoders import LatentCodec
    from hddm_flower.stages.expert import train_one_expert
    from hddm_flower.stages.prepare import prepare_data

    root, counts, good = shards
    cfg = config_from_dict(
        {
            "num_experts": 2,
            "objectives": {"ddpm": 1, "fm": 1, "ddpm_clusters": "auto"},
            "federation": {"min_experts": 1, "min_nodes": 1},
            "evaluation": {
                "num_prompts": 3,
                "samples_per_prompt": 2,
                "per_expert_samples": 3,
                "grid_prompts": 1,
                "feature_steps": 3,
                "kid_subset_size": 2,
                "kid_subsets": 2,
                "routing_modes": ["top1", "top2+vscale"],
            },
            "expert": {"preset": "test", "steps": 2, "batch_size": 2, "warmup_steps": 1, "log_every": 1},
            "data": {
                "name": "webdataset",
                "shards": str(root / "{00000..00003}.tar"),
                "image_size": 8,
                "vae": str(models["vae"]),
                "text_encoder": str(models["clip"]),
                "max_caption_tokens": 77,
                "cluster_features": "dinov2",
                "dinov2": str(models["dinov2"]),
                "fine_clusters": 6,
                "encode_batch_size": 4,
                "shard_size": 3,
                "device": "cpu",
            },
        }
    )
    d = prepare_data(cfg, tmp_path / "cache").root
    meta = read_meta(d)
    assert meta["channels"] == 4 and meta["image_size"] == 8 and meta["pixel_size"] == 16
    assert meta["latent"]["scaling_factor"] == 0.18215 and meta["text_dim"] == 32
    assert meta["feature_model"].startswith("dinov2:") and "6 fine → 2 coarse" in meta["cluster_features"]
    assert sum(c["size"] for c in meta["clusters"]) == counts["num_samples"]
    # the stored latents are the VAE's scaled posterior means of the centre-cropped image
    split = Dataset.open(d).split(None, "train")
    assert split.images.shape[1:] == (4, 8, 8) and split.cond.states.shape[1:] == (77, 32)
    assert Dataset.open(d).uncond.mask.sum() == 2  # CLIP: <|startoftext|> <|endoftext|>
    assert prepare_data(cfg, tmp_path / "cache").root == d  # cached
    state, model_config, emeta = train_one_expert(cfg, Dataset.open(d), 0, "fm")
    assert model_config["in_channels"] == 4 and model_config["sample_size"] == 8 and emeta["steps"] == 2
    x = torch.randn(2, 4, 8, 8)
    img = Dataset.open(d).decoder(cfg)(x)
    assert img.shape == (2, 3, 16, 16) and img.abs().max() <= 1
    torch.testing.assert_close(img, LatentCodec(models["vae"]).decode(x))
    # an institution's folder alone is enough to train
    state2, _, _ = train_one_expert(cfg, Dataset.open(d / "cluster-0"), 0, "fm")
    for k in state:
        torch.testing.assert_close(state[k], state2[k])
    # the whole run on latents: experts, router, evaluation, samples decoded by the VAE into a pixel grid
    from hddm_flower.checkpoints import save_expert
    from hddm_flower.stages.assemble import finish_run
    from hddm_flower.stages.prepare import assign_objectives

    run = tmp_path / "run"
    for k, objective in enumerate(assign_objectives(cfg, Dataset.open(d))):
        save_expert(run / "experts" / f"expert-{k}", *train_one_expert(cfg, Dataset.open(d), k, objective))
    cfg.router.preset, cfg.router.steps, cfg.router.batch_size = "test", 2, 4
    cfg.sampling.num_steps, cfg.sampling.samples_per_prompt, cfg.sampling.prompts = 2, 2, ["a red square"]
    from diffusers import AutoencoderKL

    vae_loads, load_vae = [], AutoencoderKL.from_pretrained.__func__

    def counted(cls, *args, **kwargs):
        vae_loads.append(args[0] if args else kwargs)
        return load_vae(cls, *args, **kwargs)

    monkeypatch.setattr(AutoencoderKL, "from_pretrained", classmethod(counted))
    report = finish_run(cfg, run, Dataset.open(d), [])
    assert len(vae_loads) == 1  # stage 4 decodes metrics, grids and samples through one VAE
    monkeypatch.undo()
    assert len(report["experts"]) == 2 and report["dataset"]["text_encoder"].startswith("clip_text_model")
    with Image.open(run / "samples.png") as grid:
        assert grid.size == (4 * (2 + 2 * (16 + 2)), 4 * (2 + 16 + 2))  # 16×16 pixels per sample, not 8×8 latents
    # the evaluation works on pixels too: its feature classifier saw decoded 3-channel images, not 4-channel latents
    assert json.loads((run / "feature_net" / "config.json").read_text())["in_channels"] == 3
    modes = report["metrics"]["evaluation"]["modes"]
    assert set(modes) == {"top1", "top2+vscale"}  # the velocity-scaling ablation next to plain routing
    assert (
        "velocity_scaling_rows" in modes["top2+vscale"]["clamps"]
        and "velocity_scaling_rows" not in modes["top1"]["clamps"]
    )
    # the run as a diffusers pipeline: CLIP text encoder and VAE loaded from their references, decoded to pixels
    from hddm_flower.hddm_pipeline import HDDMPipeline

    pipe = HDDMPipeline.from_pretrained(run)
    assert pipe.vae is not None and pipe.text_encoder.config.model_type == "clip_text_model"
    assert pipe("a red square", num_inference_steps=10).images[0].size == (16, 16)
    # what stage 4's metrics read through the pipeline's VAE is what the dataset's decoder gives (one VAE loaded)
    torch.testing.assert_close(pipe.pixels(x), img)
    assert pipe.pixels(x[:0]).shape == (0, 4, 8, 8)


def test_clustering_is_deterministic_and_each_sample_lands_in_one_shard_set(tmp_path):
    """The embedded dataset through the same path (ingest + cluster), pixel features, twice with one seed."""
    import webdataset as wds

    data = config_from_dict(
        {
            "num_experts": 4,
            "objectives": {"ddpm": 0, "fm": 4},
            "federation": {"min_experts": 1},
            "data": {
                "limit": 120,
                "max_caption_tokens": 8,
                "fine_clusters": 16,
                "shard_size": 10,
                "encode_batch_size": 32,
                "device": "cpu",
            },
        }
    ).data
    enc = tmp_path / "enc"
    m = prepare_from_config(data, enc)
    assert m["num_samples"] == 120 and m["source"]["kind"] == "twemoji"
    outs = [
        cluster_encoded(
            enc, tmp_path / f"c{i}", num_clusters=4, features="pixels", fine_clusters=16, seed=3, shard_size=10
        )
        for i in range(2)
    ]
    rows = [list(csv.reader((o / "assignments.csv").open()))[1:] for o in outs]
    assert rows[0] == rows[1]
    assert cluster_encoded(
        enc, tmp_path / "c2", num_clusters=4, features="pixels", fine_clusters=16, seed=4, shard_size=10
    ).exists()
    meta = read_meta(outs[0])
    keys = []
    for k in range(4):
        urls = Dataset.open(outs[0]).shards(k)
        ks = [s["__key__"] for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False)]
        assert len(ks) == meta["clusters"][k]["size"] > 0
        assert all(
            json.loads(s["json"])["cluster"] == k for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False)
        )
        keys += ks
    assert len(keys) == len(set(keys)) == 120 and sorted(keys) == sorted(r[0] for r in rows[0])
    sizes = [c["size"] for c in meta["clusters"]]
    assert sizes == sorted(sizes, reverse=True)
    assert (outs[0] / "clusters.png").exists() and "detail rank" in (outs[0] / "report.md").read_text()
    assert all(c["categories"] and c["detail"] > 0 for c in meta["clusters"])
    # each cluster folder stands alone
    own = read_meta(outs[0] / "cluster-2")
    assert own["cluster_set"] == 2 and (outs[0] / "cluster-2" / "uncond.safetensors").exists()
    assert (
        len(Dataset.open(outs[0] / "cluster-2").split(None, "train"))
        + len(Dataset.open(outs[0] / "cluster-2").split([2], "val"))
        == sizes[2]
    )
    with pytest.raises(ValueError, match="shard set of cluster 2, not of cluster 1"):
        Dataset.open(outs[0] / "cluster-2").split([1])
    with pytest.raises(FileExistsError, match="already holds"):
        cluster_encoded(enc, outs[0], num_clusters=4, features="pixels", fine_clusters=16)
    # streaming: explicit shard shuffle, whole shard set, batches of the right shape
    batches = Dataset.open(outs[0]).batches(0, batch_size=5, seed=0)
    x, cond = next(batches)
    assert x.shape == (5, 3, 16, 16) and cond.states.shape == (5, 8, 384)
    seen = torch.cat([next(batches)[0] for _ in range(20)])
    assert len(seen) == 100  # repeats endlessly over a cluster smaller than that


def test_caption_features_and_empty_clusters(tmp_path):
    feats = np.zeros((20, 4), np.float32)
    feats[:, 0] = 1  # all identical
    with pytest.raises(ValueError, match="only 1 distinct fine clusters, fewer than the 3"):
        fit_hierarchical(feats, num_clusters=3, fine_clusters=8, seed=0)
    with pytest.raises(ValueError, match="2 samples cannot make 3 clusters"):
        fit_hierarchical(feats[:2], num_clusters=3, fine_clusters=8, seed=0)
    meta = {
        "num_clusters": 3,
        "clusters": [{"id": 0, "size": 5, "val": 1}, {"id": 1, "size": 1, "val": 1}, {"id": 2, "size": 4, "val": 0}],
    }
    with pytest.raises(ValueError, match=r"cluster\(s\) \[1\] in /x have no training samples"):
        check_clusters(meta, 3, "/x")
    with pytest.raises(ValueError, match="has 3 clusters but num_experts is 8"):
        check_clusters(meta, 8)
    # well separated groups are found exactly, whatever the fine/coarse split
    rng = np.random.default_rng(0)
    centres = np.eye(3, 8) * 5
    x = np.concatenate([c + rng.normal(0, 0.1, (30 + 10 * i, 8)) for i, c in enumerate(centres)])
    labels, fine, info = fit_hierarchical(x.astype(np.float16), num_clusters=3, fine_clusters=12, seed=0)
    assert [len(set(labels[s:e])) for s, e in [(0, 30), (30, 70), (70, 120)]] == [1, 1, 1]
    assert labels[0] == 2 and labels[-1] == 0  # ordered by size
    assert info["fine_clusters"] == 12 and fine.max() < 12


def test_cli_prepare_and_cluster(shards, tmp_path, capsys):
    from hddm_flower.cli import main

    root, counts, _ = shards
    base = [
        "--set",
        "data.name=webdataset",
        "--set",
        f"data.shards={root}/{{00000..00003}}.tar",
        "--set",
        "num_experts=2",
        "--set",
        "objectives.ddpm=0",
        "--set",
        "objectives.fm=2",
        "--set",
        "federation.min_experts=1",
        "--set",
        "data.fine_clusters=4",
        "--set",
        "data.max_caption_tokens=8",
    ]
    assert main(["prepare", *base, "--out", str(tmp_path / "enc")]) == 0
    out = capsys.readouterr().out
    assert f"{counts['num_samples']} samples in 4 shards" in out and "corrupt_image 1" in out
    assert main(["cluster", *base, "--encoded", str(tmp_path / "enc"), "--out", str(tmp_path / "clu")]) == 0
    assert "cluster 1:" in capsys.readouterr().out and (tmp_path / "clu" / "cluster-1" / "meta.json").exists()
    # the later stages use that folder as is
    train = [
        "--set",
        f"data.prepared={tmp_path / 'clu'}",
        "--set",
        "expert.preset=test",
        "--set",
        "expert.steps=1",
        "--set",
        "expert.batch_size=2",
        "--cache-dir",
        str(tmp_path / "unused"),
    ]
    assert main(["train-expert", *base, *train, "--expert-id", "1", "--out", str(tmp_path / "e1")]) == 0
    assert (tmp_path / "e1" / "hddm_expert.json").exists() and not (tmp_path / "unused").exists()
    capsys.readouterr()
    assert (
        main(
            [
                "train-expert",
                *base,
                "--set",
                f"data.prepared={tmp_path}",
                *train[2:],
                "--expert-id",
                "1",
                "--out",
                str(tmp_path / "e2"),
            ]
        )
        == 2
    )
    assert "is not a clustered dataset" in capsys.readouterr().err
    bad = base[:2] + ["--set", f"data.shards={root}/{{00000..00009}}.tar"] + base[4:]
    assert main(["prepare", *bad, "--out", str(tmp_path / "enc2")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hddm prepare: error: shard") and "00004.tar does not exist" in err and "\n" not in err


def test_throughput_benchmark_smoke(tmp_path):
    """benchmarks/data_throughput.py runs (tiny settings) and writes its JSON and Markdown."""
    import importlib.util

    path = Path(__file__).parent.parent / "benchmarks" / "data_throughput.py"
    spec = importlib.util.spec_from_file_location("data_throughput", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    r = module.main(
        [
            "--repeat",
            "2",
            "--small-repeat",
            "2",
            "--limit",
            "30",
            "--fine-clusters",
            "8",
            "--num-clusters",
            "2",
            "--out",
            str(tmp_path / "bench"),
        ]
    )  # one scale: two processes
    assert [run["prepare"]["samples"] for run in r["runs"]] == [60]
    assert r["runs"][0]["cluster"]["samples"] == 60 and sum(r["runs"][0]["cluster"]["cluster_sizes"]) == 60
    assert r["runs"][0]["prepare"]["rss_trace"][-1][0] == 60
    assert r["extrapolation"]["prepare_samples_per_s"] > 0
    assert (tmp_path / "bench.md").read_text().startswith("# Data path throughput")


def test_nodes_train_from_their_own_shard_set_only(tiny_config, dataset_dir, tmp_path):
    """The real ClientApp over a fake Grid: each node's config names only its cluster folder (a copy elsewhere,
    as an institution would hold it); a node holding another cluster's set fails with a message saying so."""
    import shutil

    from clients.client_app import app as client_app
    from hddm_flower.accept import ExpertStore
    from hddm_flower.stages.expert import expert_spec
    from strategies.inprocess_grid import FakeGrid
    from strategies.one_shot import OneShotExperts

    cfg = tiny_config
    sites = {}
    for k in range(cfg.num_experts):
        sites[k] = tmp_path / f"site-{k}" / "cluster"
        shutil.copytree(dataset_dir / f"cluster-{k}", sites[k])
    nodes = {200 + k: {"partition-id": k, "num-partitions": 4, "shard-set": str(sites[k])} for k in range(3)}
    nodes[203] = {"partition-id": 3, "num-partitions": 4, "shard-set": str(sites[1])}  # the wrong folder
    strategy = OneShotExperts(
        ExpertStore(tmp_path / "run", expert_spec(cfg, Dataset.open(dataset_dir))),
        cfg.to_dict(),
        cfg.objective_of(),
        min_nodes=4,
        min_experts=cfg.federation.min_experts,
        node_wait_timeout=1.0,
        cache_dir=str(tmp_path / "no-cache"),
        poll_interval=0.05,
    )
    strategy.start(FakeGrid(client_app, nodes), timeout=30.0, ensemble_fn=lambda received, missing: {})
    assert sorted(strategy.received) == [0, 1, 2]
    assert "shard set of cluster 1, not of cluster 3" in strategy.missing[3]
    assert not (tmp_path / "no-cache").exists()  # nothing was prepared: the nodes read their own folders
    sizes = {c["id"]: c["size"] - c["val"] for c in read_meta(dataset_dir)["clusters"]}
    for k in range(3):
        meta = json.loads((tmp_path / "run" / "experts" / f"expert-{k}" / "hddm_expert.json").read_text())
        assert meta["cluster_size"] == sizes[k] and meta["cluster_id"] == k


def test_streamed_training_reads_the_shards_as_a_stream(tiny_config, dataset_dir):
    """data.stream: the expert trains from StreamingSplit (webdataset, shard shuffle) instead of RAM."""
    import copy

    from hddm_flower.data import Dataset, StreamingSplit
    from hddm_flower.stages.expert import train_one_expert

    in_ram = Dataset.open(dataset_dir).split([1], "train")
    stream = StreamingSplit(Dataset.open(dataset_dir), 1, seed=0)
    assert len(stream) == len(in_ram)
    xs = torch.cat([stream.batch(torch.zeros(7, dtype=torch.long))[0] for _ in range(len(in_ram) // 7 * 3)])
    # over three epochs every training image comes round, each as often as the others (± the buffer's edges)
    ref = {tuple(x.flatten()[:24].tolist()) for x in in_ram.images}
    seen = [tuple(x.flatten()[:24].tolist()) for x in xs]
    assert set(seen) <= ref and len(set(seen)) == len(ref)
    cfg = copy.deepcopy(tiny_config)
    cfg.data.stream = True
    _, _, meta = train_one_expert(cfg, Dataset.open(dataset_dir), 1, "fm")
    assert meta["cluster_size"] == len(in_ram) and meta["steps"] == cfg.expert.steps


def test_outputs_of_several_machines_cluster_together(shards, tmp_path):
    """`hddm prepare` on disjoint shard ranges (one per machine), then one `hddm cluster` over all of them."""
    import webdataset as wds

    root, counts, good = shards
    a = prepare_from_config(_data(root, shards=str(root / "{00000..00001}.tar")), tmp_path / "a")
    b = prepare_from_config(_data(root, shards=str(root / "{00002..00003}.tar")), tmp_path / "b")
    assert a["num_samples"] + b["num_samples"] == counts["num_samples"]
    out = cluster_encoded(
        [tmp_path / "a", tmp_path / "b"],
        tmp_path / "c",
        num_clusters=3,
        features="pixels",
        fine_clusters=6,
        shard_size=4,
    )
    meta = read_meta(out)
    assert meta["num_images"] == counts["num_samples"] and meta["skipped"] == counts["skipped"]
    keys, sources = [], []
    for k in range(3):
        for s in wds.WebDataset(Dataset.open(out).shards(k), shardshuffle=False, empty_check=False):
            keys.append(s["__key__"])
            sources.append(json.loads(s["json"])["source_key"])
    assert len(set(keys)) == len(keys) == counts["num_samples"] and sorted(sources) == sorted(good)
    assert {k[:4] for k in keys} == {"000-", "001-"}
    prepare_from_config(_data(root, shards=str(root / "00003.tar"), max_caption_tokens=6), tmp_path / "d")
    with pytest.raises(ValueError, match="prepared with another text_encoder"):
        cluster_encoded(
            [tmp_path / "a", tmp_path / "d"], tmp_path / "e", num_clusters=3, features="pixels", fine_clusters=6
        )


@pytest.mark.parametrize(
    "where, expected",
    [
        ("inside the next sample's first header", [("a", None), ("a+next", "truncated_member")]),
        ("inside an image", [("a", None), ("b", "truncated_member")]),
        ("inside the caption's header", [("a", None), ("b", "truncated_member")]),
        ("in the end-of-archive padding", [("a", None), ("b", None)]),
    ],
)
def test_truncated_tar_members_are_counted_once(tmp_path, where, expected):
    from hddm_flower.sources import read_tar_shard

    path = tmp_path / "t.tar"
    _write_shard(path, [{"key": k, "jpg": b"x" * 3000, "txt": b"a caption"} for k in "ab"])
    data = path.read_bytes()
    b = data.index(b"b.jpg")
    cut = {
        "inside the next sample's first header": b + 100,
        "inside an image": b + 512 + 10,
        "inside the caption's header": b + 512 + 3072 + 100,
        "in the end-of-archive padding": len(data) - 100,
    }
    path.write_bytes(data[: cut[where]])
    assert [(s.key, s.skip) for s in read_tar_shard(str(path))] == expected


def test_a_folder_of_images_with_captions_beside_them(tmp_path):
    folder = tmp_path / "photos"
    (folder / "sub").mkdir(parents=True)
    for i, colour in enumerate(COLOURS):
        (folder / f"{colour}.png").write_bytes(_image(colour, i, fmt="png"))
        (folder / f"{colour}.txt").write_text(f"a {colour} square\n")
    (folder / "sub" / "nocaption.jpg").write_bytes(_image("red", 9))
    (folder / "sub" / "broken.webp").write_bytes(b"RIFF....WEBPVP8 nope")
    (folder / "sub" / "broken.txt").write_text("a broken square")
    (folder / "notes.md").write_text("not an image")
    data = config_from_dict(
        {
            "num_experts": 2,
            "objectives": {"ddpm": 0, "fm": 2},
            "federation": {"min_experts": 1},
            "data": {
                "name": "folder",
                "folder": str(folder),
                "max_caption_tokens": 8,
                "shard_size": 2,
                "fine_clusters": 2,
                "device": "cpu",
            },
        }
    ).data
    m = prepare_from_config(data, tmp_path / "enc")
    assert m["num_samples"] == 3 and m["skipped"]["missing_caption"] == 1 and m["skipped"]["corrupt_image"] == 1
    assert len(m["shards"]) == 3 and sorted(_keys(tmp_path / "enc")) == ["blue", "green", "red"]
    with pytest.raises(ShardError, match="image folder .*nowhere does not exist"):
        prepare_from_config(
            config_from_dict({"data": {"name": "folder", "folder": str(tmp_path / "nowhere")}}).data, tmp_path / "x"
        )
