"""The prepared dataset's face (hddm_flower/data/dataset.py): ``meta.json`` read once by ``Dataset.open``, what it
says answered from memory, splits read once and kept, one cluster's stream, the empty caption."""

import json

import pytest
import torch

from hddm_flower.data import Dataset, StreamingSplit, split_size
from hddm_flower.data.layout import META, cluster_dir
from hddm_flower.data.writer import DatasetWriter

L, DIM = 3, 2


def _write(out, sizes=(3, 2), latent=True):
    """Cluster k holds ``sizes[k]`` samples, the last of each held out; sample i of cluster k is the constant
    10k + i and its caption ``ck-i`` (i + 1 tokens, capped at L)."""
    clusters = [{"id": k, "size": n, "val": 1} for k, n in enumerate(sizes)]
    meta = {
        "name": "tiny",
        "version": 4,
        "num_clusters": len(sizes),
        "num_images": sum(sizes),
        "channels": 4 if latent else 3,
        "max_caption_tokens": L,
        "text_dim": DIM,
        "clusters": clusters,
    } | ({"latent": {"path": "vae", "scaling_factor": 0.18}} if latent else {})
    with DatasetWriter(out) as w:
        for k, n in enumerate(sizes):
            with w.shard_writer(k, maxcount=2) as shards:
                for i in range(n):
                    shards.write(
                        {
                            "__key__": f"{k}-{i}",
                            "latent.npy": torch.full((4, 2, 2), 10.0 * k + i).numpy(),
                            "txt": f"c{k}-{i}",
                            "emb.npy": torch.ones(min(i + 1, L + 1), DIM).numpy(),
                            "json": {"split": "val" if i == n - 1 else "train"},
                        }
                    )
        w.write_uncond(torch.zeros(L, DIM), torch.tensor([1.0, 1.0, 0.0]))
        w.write_meta(meta)
    return out


def test_open_reads_the_metadata_once_and_answers_from_it(tmp_path):
    d = Dataset.open(_write(tmp_path / "d"))
    (d.root / META).write_text("not json")  # nothing below reads the file again
    assert d.num_clusters == 2 and d.cluster_ids == [0, 1] and d.text_dim == DIM and d.max_caption_tokens == L
    assert d.channels == 4 and d.pixel_channels == 3 and d.latent["scaling_factor"] == 0.18 and not d.data_free
    assert [d.size(None, s) for s in ("train", "val", None)] == [3, 2, 5] and d.size([1]) == 1
    assert d.size([0], "val") == split_size(d.meta, [0], "val") == 1
    assert d.description() == "trained on tiny v4 (d)" and repr(d) == f"Dataset({str(d.root)!r})"
    with pytest.raises(ValueError, match="not valid JSON"):
        Dataset.open(d.root)
    with pytest.raises(FileNotFoundError, match="not a prepared dataset"):
        Dataset.open(tmp_path / "nothing")


def test_a_split_is_read_once_and_kept(tmp_path):
    d = Dataset.open(_write(tmp_path / "d"))
    train = d.split(None, "train")
    assert train.labels.tolist() == [0, 0, 1] and train.captions == ["c0-0", "c0-1", "c1-0"]
    assert sorted(train.images[:, 0, 0, 0].tolist()) == [0.0, 1.0, 10.0]
    assert train.cond.states.shape == (3, L, DIM) and train.cond.mask.sum(1).tolist() == [1.0, 2.0, 1.0]
    assert torch.all(train.cond.states[train.cond.mask == 0] == 0)  # padding carries no signal
    for shard in d.root.rglob("shard-*.tar"):
        shard.unlink()
    assert d.split(None, "train") is train  # asked again: no shard read
    with pytest.raises(ValueError, match="empty"):
        d.split([0], "val")  # another split is read from the shards, which are gone


def test_one_cluster_folder_and_the_shard_errors(tmp_path):
    root = _write(tmp_path / "d")
    one = Dataset.open(cluster_dir(root, 1))
    assert one.own_cluster == 1 and Dataset.open(root).own_cluster == 0  # a node's own cluster
    assert one.cluster_ids == [1] and one.shards(1) == Dataset.open(root).shards(1)
    assert one.split(None, "val").labels.tolist() == [1]
    with pytest.raises(ValueError, match="shard set of cluster 1, not of cluster 0"):
        one.shards(0)
    with pytest.raises(ValueError, match="cluster 2 does not exist"):
        Dataset.open(root).shards(2)
    with pytest.raises(ValueError, match=r"no 'test' samples in clusters \[1\]"):
        one.split(None, "test")  # a split no sample belongs to


def test_the_stream_the_empty_caption_and_the_decoder(tiny_config, tmp_path):
    d = Dataset.open(_write(tmp_path / "d", sizes=(5, 2), latent=False))
    assert d.pixel_channels == 3 and d.latent is None
    x = torch.randn(2, 3, 4, 4)
    assert d.decoder(tiny_config)(x) is x  # a pixel dataset's samples are its images
    batches = d.batches(0, batch_size=2, seed=1, shuffle_buffer=2)
    seen = torch.cat([next(batches)[0] for _ in range(4)])[:, 0, 0, 0]
    assert sorted(seen.tolist()) == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0]  # two epochs of the 4 training samples
    stream = StreamingSplit(d, 0, seed=1, shuffle_buffer=2)
    assert len(stream) == 4 and stream.labels.tolist() == [0] * 4
    x, cond = stream.batch(torch.zeros(3, dtype=torch.long))
    assert x.shape == (3, 4, 2, 2) and cond.states.shape == (3, L, DIM)
    with pytest.raises(ValueError, match="no 'test' samples in cluster 1"):
        next(d.batches(1, batch_size=2, split="test"))
    assert d.uncond.states.shape == (1, L, DIM) and d.uncond.mask.tolist() == [[1.0, 1.0, 0.0]]
    assert d.uncond is d.uncond  # loaded once
    assert json.loads((d.root / META).read_text())["num_clusters"] == 2


def test_a_resumed_stream_reads_a_stream_of_its_own(tmp_path):
    """A training resumed at step s reads the stream of (seed, s): the same for the same s, the fresh one at step 0,
    and not the fresh stream's first batches again (``resume_at`` is what the training loop calls)."""
    from hddm_flower.data.streams import StreamingAllClusters

    d = Dataset.open(_write(tmp_path / "d", sizes=(41, 2), latent=False))

    def first_batches(make, step=None):
        stream = make()
        if step is not None:
            stream.resume_at(step)
        return torch.cat([stream.batch(torch.zeros(5, dtype=torch.long))[0] for _ in range(2)])[:, 0, 0, 0].tolist()

    for make in (lambda: StreamingSplit(d, 0, seed=1, shuffle_buffer=4), lambda: StreamingAllClusters(d, seed=1)):
        fresh = first_batches(make)
        assert first_batches(make, 0) == fresh and first_batches(make, 3) == first_batches(make, 3) != fresh
        assert first_batches(make, 4) != first_batches(make, 3)


def test_for_node_a_central_node_takes_its_shard_set_or_data_dir_else_the_prepared_dataset(tiny_config, tmp_path):
    """The node's rule without institution-owned data: ``shard-set`` before ``data-dir``, each checked for the
    clusters it must serve (the error names the folder), else the config's dataset built by ``prepare`` in the
    node's ``cache-dir``, else in the ``cache_dir`` the caller names."""
    root = _write(tmp_path / "d")
    asked = []

    def prepare(cfg, cache):
        asked.append((cfg.data.partition, cache))
        return Dataset.open(root)

    one = Dataset.for_node({"shard-set": str(cluster_dir(root, 1)), "data-dir": "elsewhere"}, tiny_config, prepare,
        clusters=[1])  # fmt: skip
    assert one.root == cluster_dir(root, 1) and one.cluster_ids == [1]
    whole = Dataset.for_node({"data-dir": str(root)}, tiny_config, prepare, clusters=[0, 1])
    assert whole.root == root and whole.cluster_ids == [0, 1] and asked == []
    with pytest.raises(ValueError, match=rf"{cluster_dir(root, 1)} is the shard set of cluster 1, not of cluster 0"):
        Dataset.for_node({"shard-set": str(cluster_dir(root, 1))}, tiny_config, prepare, clusters=[0])
    Dataset.for_node({}, tiny_config, prepare, cache_dir="/coordinator")
    Dataset.for_node({"cache-dir": "/node"}, tiny_config, prepare, cache_dir="/coordinator")
    Dataset.for_node({"cache-dir": ""}, tiny_config, prepare, cache_dir="")
    assert asked == [("central", "/coordinator"), ("central", "/node"), ("central", None)]


def test_for_node_an_institution_takes_its_own_folder_or_its_simulated_cluster(tiny_config, tmp_path):
    """``data.partition: institution``: the node's ``data-dir`` before its ``shard-set``, its own cluster's shards
    checked; in simulation cluster ``partition-id`` of the config's dataset prepared as central data in the node's
    own cache only (never the coordinator's); a node naming neither, or a partition without a cluster, is refused in
    one line."""
    import dataclasses

    cfg = dataclasses.replace(tiny_config, data=dataclasses.replace(tiny_config.data, partition="institution"))
    root = _write(tmp_path / "d")
    asked = []

    def prepare(c, cache):
        asked.append((c.data.partition, cache))
        return Dataset.open(root)

    own = Dataset.for_node({"data-dir": str(cluster_dir(root, 1)), "shard-set": "elsewhere"}, cfg, prepare)
    assert own.root == cluster_dir(root, 1) and asked == []
    assert Dataset.for_node({"shard-set": str(cluster_dir(root, 0))}, cfg, prepare).cluster_ids == [0]
    simulated = Dataset.for_node({"partition-id": 1, "cache-dir": "/node"}, cfg, prepare, cache_dir="/coordinator")
    assert simulated.root == cluster_dir(root, 1) and simulated.cluster_ids == [1]
    Dataset.for_node({"partition-id": 0}, cfg, prepare, cache_dir="/coordinator")
    assert asked == [("central", "/node"), ("central", None)]  # the coordinator's cache is never the node's
    for node, message in [
        ({}, r"^data.partition is institution but this node's config names no data-dir or shard-set$"),
        (
            {"partition-id": cfg.num_experts},
            rf"^simulated institution {cfg.num_experts} has no cluster among the run's",
        ),
        ({"partition-id": -1}, r"^simulated institution -1 has no cluster"),
    ]:
        with pytest.raises(ValueError, match=message) as e:
            Dataset.for_node(node, cfg, prepare)
        assert "\n" not in str(e.value)
    for shard in cluster_dir(root, 1).glob("shard-*.tar"):
        shard.unlink()
    with pytest.raises(ValueError, match=rf"cluster 1 of {cluster_dir(root, 1)} is empty"):
        Dataset.for_node({"shard-set": str(cluster_dir(root, 1))}, cfg, prepare)
