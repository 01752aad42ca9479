"""An error in the middle of a stage closes its progress bar first: the last line a user sees is the error."""

from pathlib import Path

import yaml

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
