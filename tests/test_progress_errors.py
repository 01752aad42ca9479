"""An error in the middle of a stage closes its progress bar first: the last line a user sees is the error."""

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from hddm_flower.data import Dataset
from hddm_flower.data.writer import DatasetWriter

from .test_data_scale import _image, _write_shard


def _shards(root: Path, n: int) -> None:
    for shard in range(n):
        samples = [
            {"key": f"{shard:05d}{j:04d}", "jpg": _image("red", j), "txt": f"a red square {j}".encode()}
            for j in range(3)
        ]
        _write_shard(root / f"{shard:05d}.tar", samples)


def test_prepare_error_mid_run_is_the_last_line(tmp_path, capsys):
    from hddm_flower.cli import main

    _shards(tmp_path, 2)  # 00000.tar and 00001.tar encode, 00002.tar is not a tar: the bar is open at 2/3
    (tmp_path / "00002.tar").write_bytes(b"not a tar at all" * 10)
    config = tmp_path / "c.yaml"
    data = {"name": "webdataset", "shards": str(tmp_path / "{00000..00002}.tar"), "image_size": 16}
    config.write_text(yaml.safe_dump({"data": data | {"max_caption_tokens": 8, "encode_batch_size": 4}}))
    assert main(["prepare", "--config", str(config), "--out", str(tmp_path / "enc")]) == 2
    err = capsys.readouterr().err
    assert "2/3 [" in err  # the bar was drawn …
    last = err.rstrip("\n").split("\n")[-1]
    assert last.startswith("hddm prepare: error: shard ") and "00002.tar" in last, repr(last[-300:])
    assert err.endswith("\n") and "\r" not in last  # … and closed before the error was printed on its own line


# -- the core loops: an error raised mid-loop reaches the caller with the loop's bar already closed --------------


class Boom(RuntimeError):
    pass


def _closed_before_the_error(capsys, call, what: str) -> None:
    """``call()`` raises :class:`Boom` in the middle of a loop with a progress bar: when the error reaches the
    caller (the CLI prints it next), the bar is closed and stderr ends with its finished line."""
    from tqdm import tqdm

    capsys.readouterr()
    before = set(tqdm._instances)
    try:
        call()
    except Boom:  # where the CLI prints the error: the traceback, and every frame on it, is still alive here
        still_open = [bar for bar in set(tqdm._instances) - before if not bar.disable]
        err = capsys.readouterr().err
    else:
        pytest.fail("no error")
    assert what in err, err[-500:]  # the bar was drawn …
    assert not still_open and err.endswith("\n"), repr(err[-300:])  # … and closed: the error comes on its own line


def _raise_on(n: int, value=None):
    """A callable that returns ``value`` (or its argument's length-1 view) until its ``n``-th call, which raises."""
    calls = []

    def fn(*args):
        calls.append(1)
        if len(calls) == n:
            raise Boom("the device failed mid-loop")
        return value(*args) if callable(value) else value

    return fn


def test_training_loop_closes_its_bar(capsys):
    from hddm_flower.config.sections import OptimConfig
    from hddm_flower.training import fit

    model = torch.nn.Linear(3, 1)
    loss = _raise_on(3, lambda g: model(torch.ones(1, 3)).pow(2).mean())
    _closed_before_the_error(
        capsys, lambda: fit(model, loss, OptimConfig(), steps=5, progress=True, name="expert 0 [fm]"), "expert 0 [fm]"
    )


def test_clustering_loops_close_their_bars(dataset_dir, tmp_path, capsys, monkeypatch):
    import webdataset as wds

    from hddm_flower import cluster

    urls = sorted(str(p) for p in (Path(dataset_dir) / "cluster-0").glob("*.tar"))
    n = sum(1 for _ in cluster.iter_raw(urls))
    assert n >= 4

    class Features:  # a feature network whose device fails on the second batch
        dim, normalize = 4, False

        def __init__(self):
            self.fn = _raise_on(2, lambda ims: np.ones((len(ims), 4), np.float32))

        def __call__(self, images, texts):
            return self.fn(images)

    _closed_before_the_error(
        capsys,
        lambda: cluster.compute_features(urls, n, Features(), tmp_path / "f.npy", batch_size=2, progress=True),
        "features",
    )

    class Failing(np.ndarray):  # a memmap whose disk fails on the second chunk
        def __getitem__(self, key):
            if isinstance(key, slice) and key.start:
                raise Boom("read error")
            return np.asarray(self).__getitem__(key)

    feats = np.random.default_rng(0).normal(size=(12, 4)).astype(np.float32).view(Failing)
    _closed_before_the_error(
        capsys,
        lambda: cluster.fit_hierarchical(feats, num_clusters=2, fine_clusters=4, seed=0, chunk=4, progress=True),
        "assign",
    )

    fail, write = _raise_on(2), wds.ShardWriter.write  # the disk fills while the shard sets are written
    monkeypatch.setattr(wds.ShardWriter, "write", lambda self, rec: (fail(), write(self, rec)))
    labels = np.zeros(n, np.int64)

    def shard_sets():
        with DatasetWriter(tmp_path / "sets") as writer:
            cluster.write_shard_sets(
                urls, writer, labels, labels, labels.astype(bool), 1, shard_size=100, progress=True
            )

    _closed_before_the_error(capsys, shard_sets, "shard sets")


def test_reference_statistics_loop_closes_its_bar(dataset_dir, capsys):
    from hddm_flower.evaluation.metrics import FeatureExtractor
    from hddm_flower.evaluation.reference import compute_reference

    fn = _raise_on(2, lambda x: x.flatten(1)[:, :4])
    fx = FeatureExtractor("pixels", 4, fn)
    _closed_before_the_error(
        capsys,
        lambda: compute_reference(Dataset.open(dataset_dir), fx, batch_size=4, progress=True),
        "reference statistics",
    )
