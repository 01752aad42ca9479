"""The benchmark scripts run (tiny settings, CPU), so they do not rot between the runs that measure."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).parent.parent


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_dry_run_on_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    result = _load("gpu_xl_step").main(["--device", "cpu", "--preset", "test", "--batch-size", "2", "--steps", "1",
                                        "--out", str(out)])
    assert json.loads(out.read_text())["model_flops_per_step"] == result["model_flops_per_step"] > 0


def test_convert_init_benchmark_smoke(tiny_config_path, dataset_dir, cache_dir, tmp_path):
    r = _load("convert_init").main(["--config", str(tiny_config_path), "--cache-dir", str(cache_dir),
                                    "--pretrain-steps", "3", "--steps", "4", "--out", str(tmp_path / "ci")])
    assert set(r["runs"]) == {"fm/random", "fm/converted", "ddpm/random", "ddpm/converted"}
    assert r["runs"]["ddpm/converted"]["conversion_check"]["max_output_diff"] < 1e-4
    assert (tmp_path / "ci.md").read_text().startswith("Expert init from a converted tiny DiT")
