"""Files from outside are opened, not trusted: hddm_flower.safeio, and `hddm add-expert` on hostile folders; our own
files are written whole."""

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from hddm_flower.data import Dataset
from hddm_flower.safeio import UnsafeFile, atomic_path, copy_file, read_text, write_atomic


def test_only_regular_files_within_the_limit_are_read(tmp_path):
    (tmp_path / "ok.json").write_text('{"a": 1}')
    assert read_text(tmp_path / "ok.json", "metadata", 100) == '{"a": 1}'
    os.mkfifo(tmp_path / "fifo")  # opening a FIFO for reading would block forever
    (tmp_path / "zero").symlink_to("/dev/zero")  # an endless file
    (tmp_path / "dir").mkdir()
    for name, why in (("fifo", "is a FIFO"), ("zero", "is a character device"), ("dir", "is a directory")):
        with pytest.raises(UnsafeFile, match=why):
            read_text(tmp_path / name, "metadata", 100)
    with pytest.raises(UnsafeFile, match="more than the limit of 4"):
        read_text(tmp_path / "ok.json", "metadata", 4)
    with pytest.raises(UnsafeFile, match="No such file"):
        read_text(tmp_path / "missing", "metadata", 4)
    (tmp_path / "latin1").write_bytes(b"caf\xe9")
    with pytest.raises(UnsafeFile, match="latin1 is not UTF-8"):
        read_text(tmp_path / "latin1", "metadata", 100)


def test_copies_are_bounded_and_leave_nothing_on_failure(tmp_path):
    src = tmp_path / "w.safetensors"
    src.write_bytes(b"x" * 1000)
    assert copy_file(src, tmp_path / "copy", "weights", 1000) == 1000
    with pytest.raises(UnsafeFile, match="more than the limit of 999"):
        copy_file(src, tmp_path / "copy2", "weights", 999)
    (tmp_path / "zero").symlink_to("/dev/zero")
    with pytest.raises(UnsafeFile, match="character device"):
        copy_file(tmp_path / "zero", tmp_path / "copy3", "weights", 10**9)
    assert not (tmp_path / "copy2").exists() and not (tmp_path / "copy3").exists()
    with pytest.raises(FileExistsError):  # never over an existing file
        copy_file(src, tmp_path / "copy", "weights", 1000)


@pytest.fixture
def late(tiny_config, dataset_dir, tmp_path):
    """A run directory and a late expert folder with valid metadata and model config and a real weights file."""
    import hashlib

    import torch

    from hddm_flower.checkpoints import TIME_CONVENTION, weights_bytes
    from hddm_flower.models import ExpertNet
    from hddm_flower.stages.expert import expected_model_config

    run = tmp_path / "run"
    (run / "experts").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(tiny_config.to_dict()))
    config = expected_model_config(tiny_config, Dataset.open(dataset_dir))
    torch.manual_seed(0)
    blob = weights_bytes(ExpertNet.from_config(config).transformer.state_dict())
    ckpt = tmp_path / "late"
    ckpt.mkdir()
    (ckpt / "diffusion_pytorch_model.safetensors").write_bytes(blob)
    (ckpt / "config.json").write_text(json.dumps(config))
    meta = {
        "expert_id": 2,
        "cluster_id": 2,
        "objective": "fm",
        "preset": "test",
        "time_convention": TIME_CONVENTION,
        "steps": 3,
        "images_seen": 12,
        "device_seconds": 1.0,
        "sha256": hashlib.sha256(blob).hexdigest(),
    }
    (ckpt / "hddm_expert.json").write_text(json.dumps(meta))
    return run, ckpt, meta


def _add(run: Path, ckpt: Path, cache_dir, capsys) -> str:
    from hddm_flower.cli import main

    capsys.readouterr()
    assert main(["add-expert", str(run), str(ckpt), "--cache-dir", str(cache_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hddm add-expert: error: "), err
    assert sorted(p.name for p in (run / "experts").iterdir()) == []  # nothing half-written, nothing installed
    return err[0]


@pytest.mark.parametrize(
    "meta_text, reason",
    [
        ("[" * 100_000 + "]" * 100_000, "not valid JSON"),  # RecursionError: a traceback before
        ('{"expert_id": 1e999}', "overflows"),
        (None, "expected an integer, got list"),  # int([2]): TypeError, a traceback before
        ("x" * (3 * 2**20), "more than the limit"),
    ],
)
def test_add_expert_with_hostile_metadata_is_a_one_line_error(late, cache_dir, capsys, meta_text, reason):
    run, ckpt, meta = late
    (ckpt / "hddm_expert.json").write_text(meta_text or json.dumps(meta | {"expert_id": [2]}))
    assert reason in _add(run, ckpt, cache_dir, capsys)


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda p: p.symlink_to("/dev/zero"), "is a character device"),  # copied forever before
        (lambda p: os.mkfifo(p), "is a FIFO"),  # blocked forever before
        (lambda p: p.mkdir(), "is a directory"),
        (lambda p: os.truncate(p.write_bytes(b"") or p, 2**32), "more than the limit"),  # a sparse 4 GiB file
    ],
)
def test_add_expert_opens_the_weights_as_a_file_from_outside(late, cache_dir, capsys, make, reason):
    run, ckpt, _ = late
    weights = ckpt / "diffusion_pytorch_model.safetensors"
    weights.unlink()
    make(weights)
    assert reason in _add(run, ckpt, cache_dir, capsys)


def test_add_expert_metadata_file_must_be_regular(late, cache_dir, capsys):
    run, ckpt, _ = late
    (ckpt / "hddm_expert.json").unlink()
    (ckpt / "hddm_expert.json").symlink_to("/dev/zero")
    assert "is a character device" in _add(run, ckpt, cache_dir, capsys)
    shutil.rmtree(ckpt)


def test_prepared_datasets_and_shard_sets_are_opened_not_trusted(tiny_config, tmp_path):
    """data.prepared and --cluster-data: a meta.json that is a FIFO or nested beyond the parser, a shard that
    links to a device — each a one-line error instead of a hang or a crash."""
    from hddm_flower.config.io import config_from_dict
    from hddm_flower.data import Dataset, read_meta
    from hddm_flower.stages.prepare import prepare_data

    d = tmp_path / "prepared"
    d.mkdir()
    os.mkfifo(d / "meta.json")
    cfg = config_from_dict(tiny_config.to_dict() | {"data": tiny_config.to_dict()["data"] | {"prepared": str(d)}})
    with pytest.raises(UnsafeFile, match="is a FIFO"):
        prepare_data(cfg, tmp_path / "cache")
    (d / "meta.json").unlink()
    (d / "meta.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="is not valid JSON"):
        read_meta(d)
    (d / "meta.json").write_text(json.dumps({"num_clusters": 1, "cluster_set": 0}))
    (d / "shard-000000.tar").symlink_to("/dev/zero")
    with pytest.raises(ValueError, match="is not a regular file"):
        Dataset.open(d).shards(0)


def test_convert_dit_inputs_are_opened_not_trusted(tmp_path, capsys):
    from hddm_flower.cli import main

    os.mkfifo(tmp_path / "dit.pt")
    folder = tmp_path / "diffusers-dit"
    folder.mkdir()
    (folder / "config.json").symlink_to("/dev/zero")
    for source, why in ((tmp_path / "dit.pt", "is a FIFO"), (folder, "is a character device")):
        assert main(["convert-dit", str(source), "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and why in err[0], err


def test_an_atomic_write_replaces_the_file_whole_or_leaves_it_as_it_was(tmp_path):
    target = tmp_path / "report.json"
    write_atomic(target, "old ε²")
    assert target.read_bytes() == "old ε²".encode()  # UTF-8 whatever the locale
    with pytest.raises(RuntimeError, match="killed mid-write"):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed mid-write")
    assert target.read_text(encoding="utf-8") == "old ε²" and [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_shared_writers_of_one_file_each_write_through_their_own_temporary_file(tmp_path):
    """Two evaluations caching the same statistics beside one dataset: the second writer must not take (or rename)
    the first one's temporary file, or the first one's rename fails."""
    target = tmp_path / "stats.json"
    with atomic_path(target, shared=True) as outer:
        outer.write_text("first")
        other = threading.Thread(target=write_atomic, args=(target, "second"), kwargs={"shared": True})
        other.start()
        other.join()
        assert target.read_text() == "second" and outer.read_text() == "first"
    assert target.read_text() == "first" and [p.name for p in tmp_path.iterdir()] == ["stats.json"]


def test_an_atomic_write_is_utf8_under_an_ascii_locale(tmp_path):
    """Model cards hold ε and ²: the write must not depend on the locale's encoding (here ASCII, UTF-8 mode off)."""
    target = tmp_path / "README.md"
    text = "ε² – ok"
    code = f"from hddm_flower.safeio import write_atomic; write_atomic({str(target)!r}, {ascii(text)})"  # argv: ASCII
    env = dict(os.environ, LC_ALL="C", LANG="C", PYTHONCOERCECLOCALE="0", PYTHONUTF8="0")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
    assert target.read_bytes() == text.encode()
