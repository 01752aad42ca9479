"""The `hddm` command line: every stage without Flower, and one-line errors with a non-zero exit on bad input."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hddm_flower.cli import main


def _common(tiny_config_path, cache_dir):
    return ["--config", str(tiny_config_path), "--cache-dir", str(cache_dir)]


def test_stages_without_flower(tiny_config_path, dataset_dir, cache_dir, tmp_path, capsys):
    common = _common(tiny_config_path, cache_dir)
    assert main(["prepare", *common]) == 0
    assert "4 clusters" in capsys.readouterr().out
    run = tmp_path / "run"
    threads = torch.get_num_threads()
    try:
        for k in (0, 1):
            out = ["--out", str(run / "experts" / f"expert-{k}"), "--set", "expert.steps=2", "--threads", "1"]
            assert main(["train-expert", *common, "--expert-id", str(k), *out]) == 0
    finally:
        torch.set_num_threads(threads)  # --threads set this process's torch threads
    meta = json.loads((run / "experts" / "expert-1" / "hddm_expert.json").read_text())
    assert meta["objective"] == "ddpm" and meta["steps"] == 2  # the config gives cluster 1 DDPM
    assert meta["cpu_threads"] == 1
    assert main(["assemble", *common, "--run-dir", str(run), "--device", "cpu"]) == 0
    report = json.loads((run / "report.json").read_text())
    assert len(report["experts"]) == 2 and [m["expert_id"] for m in report["missing"]] == [2, 3]
    assert (
        main(
            [
                *("sample", *common, "--run-dir", str(run), "--prompt", "red apple"),
                *("--out", str(tmp_path / "apple.png"), "--device", "cpu"),
            ]
        )
        == 0
    )
    assert (tmp_path / "apple.png").exists()
    # every coordinator stage takes --device (here the CPU, explicitly) and records where it ran
    assert main(["train-router", *common, "--run-dir", str(tmp_path / "r2"), "--device", "cpu"]) == 0
    assert (tmp_path / "r2" / "router" / "diffusion_pytorch_model.safetensors").exists()
    assert json.loads((tmp_path / "r2" / "router" / "hddm_router.json").read_text())["device"] == "cpu"

    if not torch.cuda.is_available():  # a device the machine lacks: one line, non-zero, before any work
        capsys.readouterr()
        assert main(["reproduce", *common, "--out", str(tmp_path / "rep"), "--device", "cuda"]) == 2
        assert "CUDA is not available" in capsys.readouterr().err and not (tmp_path / "rep").exists()
        assert main(["evaluate", "--run-dir", str(run), "--cache-dir", str(cache_dir), "--device", "cuda:0"]) == 2
        assert "CUDA is not available" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "expert.stpes=3", "--expert-id", "0", "--out", "X"], "unknown key expert.stpes"),
        (["--expert-id", "7", "--out", "X"], "--expert-id 7 is outside 0..3"),
        (["--threads", "0", "--expert-id", "0", "--out", "X"], "--threads 0: expected at least 1"),
    ],
)
def test_bad_input_is_one_line_and_nonzero(tiny_config_path, dataset_dir, cache_dir, tmp_path, capsys, args, message):
    out = str(tmp_path / "x")
    argv = ["train-expert", *_common(tiny_config_path, cache_dir), *[out if a == "X" else a for a in args]]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_missing_files_exit_nonzero_in_a_real_process(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hddm_flower.cli",
            "sample",
            "--config",
            str(tmp_path / "no.yaml"),
            "--run-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"hddm sample: error: config file {tmp_path / 'no.yaml'} does not exist"
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "hddm_flower.cli", "assemble", "--run-dir", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "no expert folders" in proc.stderr


def test_paper_config_without_its_local_files_fails_clearly(tmp_path, capsys):
    from pathlib import Path

    paper = Path(__file__).parent.parent / "configs" / "paper-2ddpm-6fm.yaml"
    assert main(["prepare", "--config", str(paper), "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "/models/sd-vae-ft-mse does not hold" in err and not any(tmp_path.iterdir())
    assert main(["prepare", "--config", str(paper), "--cache-dir", str(tmp_path), "--set", "data.vae=''"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "hddm prepare: error: shard /data/laion-aesthetics/00000.tar does not exist "
        "(set data.skip_bad_shards: true to skip it)"
    ) and not any(tmp_path.iterdir())


def test_tables_reads_a_gmm_run_over_some_of_its_trainings(tmp_path, capsys):
    """`hddm tables` on the committed 7-training manifest, read over trainings 0-2, gives the paired differences of
    the committed run of those three trainings to the bit (they were reused, not retrained), and its tables say
    which trainings they cover; one training is read over its sampling seeds; bad requests fail with one line, exit 2
    and nothing written, and nothing but an earlier reading is ever replaced (not the manifest, not a run's tables)."""
    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    seven = results / "reproduce-gmm-subspace-800-text-lr1.6e-2-mono1.6e-2-7-trainings-manifest.json"
    three = json.loads((results / "reproduce-gmm-subspace-800-text-lr1.6e-2-mono1.6e-2-manifest.json").read_text())
    out = tmp_path / "read.md"
    assert main(["tables", str(seven), "--trainings", "0", "1", "2", "--out", str(out)]) == 0
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["paired"] == three["paired"] and record["trainings"] == [0, 1, 2] and record["of"] == 7
    md = out.read_text()
    assert "trainings 0, 1, 2 of the 7" in md and "Each cell: the mean over 3 independent trainings" in md
    everything = json.loads(seven.read_text())
    assert main(["tables", str(seven), "--out", str(out)]) == 0  # an earlier reading is replaced
    assert json.loads(out.with_suffix(".json").read_text())["paired"] == everything["paired"]
    assert main(["tables", str(seven), "--trainings", "4", "--out", str(out)]) == 0
    one = out.read_text()
    assert "training 4 of the 7 in" in one and "alone, so every interval below is over its sampling seeds" in one
    assert (
        "one** training ± the half-width of its 95 % Student-t interval; it does not cover another training of the same config (the run has 7: read over several, `hddm tables`)."
        in one
    )
    assert "– in a reading that does not start with training 0" in one
    (lead,) = [
        e for e in json.loads(out.with_suffix(".json").read_text())["paired"] if e["what"] == "8FM: top2 − monolith"
    ]
    assert lead["delta_log_density"]["covers"] == "sampling seeds of one training"
    capsys.readouterr()
    bad = tmp_path / "bad.md"
    not_gmm = tmp_path / "manifest.json"
    not_gmm.write_text(json.dumps({"results": {"8FM": {"top2": {}}}}))
    odd = tmp_path / "odd.json"  # rows that are not objects
    odd.write_text(json.dumps({"results": {"x": 5}}))
    older = tmp_path / "older.json"  # a Gaussian-mixture manifest of an older version: a field it lacks
    older.write_text(json.dumps({"results": {"x": {"row": {}}}}))
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(seven.read_text())
    (run / "tables.md").write_text("the run's own tables")
    (run / "NAME-tables.md").write_text("a committed run's tables")
    for argv, message in (
        ([str(seven), "--trainings", "7", "--out", str(bad)], "training 7: these results hold trainings 0–6"),
        ([str(not_gmm), "--out", str(bad)], "not the manifest of an `hddm reproduce` run on a Gaussian mixture"),
        ([str(odd), "--out", str(bad)], "not the manifest of an `hddm reproduce` run on a Gaussian mixture"),
        ([str(older), "--out", str(bad)], "a manifest this version cannot read (KeyError"),
        ([str(seven), "--out", str(tmp_path / "bad.txt")], "name a .md file"),
        ([str(run / "manifest.json"), "--out", str(run / "manifest.md")], "manifest.json exists and is not an earlier"),
        ([str(run / "manifest.json"), "--out", str(run / "tables.md")], "tables.md exists and is not an earlier"),
        ([str(run / "manifest.json"), "--out", str(run / "NAME-tables.md")], "exists and is not an earlier"),
    ):
        assert main(["tables", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and message in err, err
    assert not bad.exists() and not bad.with_suffix(".json").exists() and not (tmp_path / "bad.txt").exists()
    assert (run / "manifest.json").read_text() == seven.read_text() and not (run / "manifest.md").exists()
    assert (run / "tables.md").read_text() == "the run's own tables" and not (run / "tables.json").exists()
    assert (run / "NAME-tables.md").read_text() == "a committed run's tables"
    stuck = tmp_path / "stuck.md"  # an earlier reading whose tables cannot be written again: no record left alone
    assert main(["tables", str(seven), "--trainings", "0", "1", "--out", str(stuck)]) == 0
    stuck.unlink()
    stuck.mkdir()
    assert main(["tables", str(seven), "--out", str(stuck)]) == 2 and not stuck.with_suffix(".json").exists()
