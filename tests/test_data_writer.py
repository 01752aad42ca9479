"""The one dataset writer (hddm_flower/data/writer.py): a finished dataset appears at once, in the layout of
hddm_flower/data/layout.py; a failed one leaves nothing; a finished one is never overwritten unless asked."""

import json

import pytest
import torch

from hddm_flower.data import Dataset, read_meta
from hddm_flower.data.layout import META, UNCOND, cluster_dir, is_prepared
from hddm_flower.data.writer import DatasetWriter, rewrite_meta


def _meta(k: int = 2) -> dict:
    clusters = [{"id": i, "size": 2, "val": 1} for i in range(k)]
    return {"num_clusters": k, "num_images": 2 * k, "max_caption_tokens": 3, "text_dim": 2, "clusters": clusters}


def _write(out, k: int = 2, fail: bool = False, **kw):
    with DatasetWriter(out, **kw) as w:
        for c in range(k):
            with w.shard_writer(c, maxcount=1) as shards:
                for i, split in enumerate(("train", "val")):
                    emb = torch.full((2, 2), float(c)).numpy()
                    x = torch.zeros(1, 2, 2).numpy()
                    shards.write(
                        {
                            "__key__": f"{c}{i}",
                            "latent.npy": x,
                            "txt": f"c{c}",
                            "emb.npy": emb,
                            "json": {"split": split},
                        }
                    )
            assert w.shard_names(c) == ["shard-000000.tar", "shard-000001.tar"]
        (w.path("extra.txt")).write_text("x")
        w.write_uncond(torch.zeros(3, 2), torch.tensor([1.0, 0, 0]))
        if fail:
            raise RuntimeError("interrupted")
        w.write_meta(_meta(k), also=("extra.txt",))
    return out


def test_a_written_dataset_reads_back_and_each_cluster_stands_alone(tmp_path):
    out = _write(tmp_path / "d")
    assert is_prepared(out) and read_meta(out)["num_clusters"] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["d"]  # no temporary folder left beside it
    for k in range(2):
        folder = cluster_dir(out, k)
        assert json.loads((folder / META).read_text()) == _meta() | {"cluster_set": k}
        assert (folder / UNCOND).read_bytes() == (out / UNCOND).read_bytes()
        assert (folder / "extra.txt").read_text() == "x"
        assert len(Dataset.open(out).shards(k)) == 2 and Dataset.open(folder).shards(k) == Dataset.open(out).shards(k)
    split = Dataset.open(out).split(None, "val")
    assert split.labels.tolist() == [0, 1] and split.cond.states.shape == (2, 3, 2)
    assert Dataset.open(out).uncond.mask.tolist() == [[1.0, 0.0, 0.0]]


def test_a_failed_write_leaves_nothing_and_a_finished_one_is_kept(tmp_path):
    with pytest.raises(RuntimeError, match="interrupted"):
        _write(tmp_path / "d", fail=True)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "d").mkdir()  # an empty folder may be written into
    _write(tmp_path / "d")
    before = (tmp_path / "d" / META).read_bytes()
    with pytest.raises(FileExistsError, match="not empty"):
        _write(tmp_path / "d", k=3)
    assert (tmp_path / "d" / META).read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["d"]
    _write(tmp_path / "d", k=3, replace=True)  # asked: the new dataset takes the old one's place
    assert read_meta(tmp_path / "d")["num_clusters"] == 3 and [p.name for p in tmp_path.iterdir()] == ["d"]
    rewrite_meta(tmp_path / "d", read_meta(tmp_path / "d") | {"institution": True})
    assert read_meta(tmp_path / "d")["institution"] is True and not list((tmp_path / "d").glob("*.tmp"))
