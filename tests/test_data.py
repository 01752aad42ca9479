"""The embedded dataset: Twemoji rendering, MiniLM states, clustering, shards, and safe preparation."""

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from hddm_flower import embedded as embedded_mod
from hddm_flower.data import Dataset, read_meta
from hddm_flower.embedded import load_twemoji, prepare_embedded
from hddm_flower.text import TextEncoder


def test_twemoji_images_and_captions():
    images, captions, categories = load_twemoji(16, skin_tones=False)
    assert images.shape[1:] == (16, 16, 3) and images.dtype == np.uint8 and len(images) > 1800
    assert len(set(categories)) == 9 and "Component" not in categories
    assert "japan flag" in captions and "hot dog" in captions and all(c == c.lower() for c in captions)
    corners = images[:, [0, 0, -1, -1], [0, -1, 0, -1]]
    assert np.median(corners) == 255  # composited on white
    images_t, captions_t, _ = load_twemoji(8, skin_tones=True)
    assert len(images_t) > 3500 and "father christmas, dark skin tone" in captions_t


def test_prepared_dataset(tiny_config, dataset_dir):
    meta = read_meta(dataset_dir)
    assert meta["num_images"] == 240 and meta["num_clusters"] == 4 and meta["text_dim"] == 384
    assert "Twemoji" in meta["license"] and meta["text_encoder"] and "k-means" in meta["cluster_features"]
    sizes = [c["size"] for c in meta["clusters"]]
    assert sum(sizes) == 240 and sizes == sorted(sizes, reverse=True)  # id 0 = largest
    total = 0
    for k in range(4):
        train, val = Dataset.open(dataset_dir).split([k], "train"), Dataset.open(dataset_dir).split([k], "val")
        assert len(train) + len(val) == sizes[k] and torch.all(train.labels == k)
        total += len(train) + len(val)
        x = train.images
        assert x.shape[1:] == (3, 16, 16) and x.min() >= -1 and x.max() <= 1
        states, mask = train.cond
        assert states.shape[1:] == (8, 384) and torch.all(mask[:, 0] == 1)
        assert torch.all(states[mask == 0] == 0)  # padding carries no signal
    assert total == 240
    un = Dataset.open(dataset_dir).uncond
    assert un.states.shape == (1, 8, 384) and un.mask.sum() == 2  # [CLS] [SEP]
    with pytest.raises(ValueError, match="cluster 9 does not exist"):
        Dataset.open(dataset_dir).split([9])


def test_caption_states_match_the_encoder(dataset_dir):
    split = Dataset.open(dataset_dir).split([0], "train")
    encoder = TextEncoder(max_length=8)
    cond, pooled = encoder.encode(split.captions[:3])
    torch.testing.assert_close(split.cond.states[:3], cond.states, atol=2e-3, rtol=1e-2)  # stored as float16
    torch.testing.assert_close(pooled.norm(dim=-1), torch.ones(3))


def test_text_encoder_from_a_local_directory(tmp_path):
    """Any transformers encoder saved to a folder loads through the same code (here a tiny random BERT)."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    default = TextEncoder()
    AutoTokenizer.from_pretrained(default.path).save_pretrained(tmp_path)
    BertModel(
        BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    ).save_pretrained(tmp_path)
    enc = TextEncoder(tmp_path, max_length=6)
    cond, pooled = enc.encode(["a dog", "japan flag"])
    assert enc.dim == 32 and cond.states.shape == (2, 6, 32) and pooled.shape == (2, 32)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        TextEncoder(tmp_path / "missing")


def test_concurrent_prepare_builds_once_and_failure_leaves_nothing(tmp_path, monkeypatch):
    calls = []
    real = embedded_mod.load_twemoji

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(embedded_mod, "load_twemoji", counting)
    out = []
    threads = [
        threading.Thread(target=lambda: out.append(prepare_embedded(tmp_path, num_clusters=2, limit=24)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == 2 and out[0] == out[1] and len(calls) == 1

    def broken(*a, **k):
        raise RuntimeError("encoder exploded")

    monkeypatch.setattr(embedded_mod.TextEncoder, "encode", broken)
    with pytest.raises(RuntimeError, match="exploded"):
        prepare_embedded(tmp_path, num_clusters=3, limit=24)
    leftovers = [p.name for p in tmp_path.iterdir() if not p.name.startswith(".") or not p.name.endswith(".lock")]
    assert leftovers == [out[0].name]


def _poison_text_members(src, dst):
    """A copy of a dataset whose caption and text-state members are bytes no decoder accepts."""
    import io
    import shutil
    import tarfile

    shutil.copytree(src, dst)
    for shard in Path(dst).glob("cluster-*/shard-*.tar"):
        members = []
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                data = tar.extractfile(m).read()
                if m.name.endswith((".txt", ".emb.npy")):
                    data = b"\xff\xfe\x00 not text, not npy"
                members.append((m.name, data))
        with tarfile.open(shard, "w") as tar:
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def test_router_data_path_reads_no_text_member(tiny_config, dataset_dir, tmp_path):
    """The router's stream reads images/latents and labels only: on a dataset whose every caption and text-state
    member is undecodable it yields each training sample once (same images, same labels as the in-RAM split), and
    the router trains from it, its steps derived from router.epochs."""
    import dataclasses

    from hddm_flower.data import Dataset, read_meta, split_size
    from hddm_flower.stages.router import fit_router

    poisoned = tmp_path / "poisoned"
    _poison_text_members(dataset_dir, poisoned)
    from webdataset.autodecode import DecodingError

    with pytest.raises(DecodingError):  # anything that decodes a text member fails on this copy
        Dataset.open(poisoned).split([0], "train")
    ref = Dataset.open(dataset_dir).split(None, "train")
    n = split_size(read_meta(poisoned), None, "train")
    assert n == len(ref)
    batches = list(Dataset.open(poisoned).images(None, batch_size=7, split="train", seed=3, loop=False))
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    assert len(x) == n and all(len(b[0]) == 7 for b in batches[:-1])
    key = lambda imgs, labels: sorted(zip(labels.tolist(), imgs.flatten(1).sum(1).tolist()))  # noqa: E731
    assert key(x, y) == key(ref.images, ref.labels)  # every sample once, with its cluster's label
    assert len(set(y[:32].tolist())) > 1  # batches mix the clusters
    r = dataclasses.replace(tiny_config.router, epochs=0.5, batch_size=8)
    cfg = dataclasses.replace(tiny_config, router=r)
    fit_router(cfg, Dataset.open(poisoned), tmp_path / "run", device="cpu")
    info = json.loads((tmp_path / "run" / "router" / "hddm_router.json").read_text())
    assert info["steps"] == -(-n // 16) and info["device"] == "cpu" and info["training_images"] == n


def test_a_looping_stream_fills_batches_larger_than_its_split(dataset_dir):
    """A split smaller than one batch (a small cluster, a tiny dataset) still yields full batches when looping:
    a batch spans epochs, every sample appears once per epoch, labels stay with their samples."""
    from hddm_flower.data import read_meta, split_size

    n = split_size(read_meta(dataset_dir), [0], "val")
    assert 0 < n < 64
    stream = Dataset.open(dataset_dir).images([0], batch_size=2 * n + 1, split="val", seed=1)
    x, y = next(stream)
    assert len(x) == 2 * n + 1 and set(y.tolist()) == {0}
    one_pass = torch.cat([b[0] for b in Dataset.open(dataset_dir).images([0], batch_size=n, split="val", loop=False)])
    key = lambda imgs: sorted(imgs.flatten(1).sum(1).tolist())  # noqa: E731
    assert key(x[:n]) == key(one_pass) and key(x[n : 2 * n]) == key(one_pass)
