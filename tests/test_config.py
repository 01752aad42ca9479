"""The configuration schema: every shipped YAML loads; bad input fails with the key and the file named."""

from pathlib import Path

import pytest
import yaml

from hddm_flower.config.io import config_from_dict, load_config, parse_overrides
from hddm_flower.config.rules import MAX_MESSAGE, ConfigError
from hddm_flower.config.schema import Config
from hddm_flower.config.sections import OptimConfig

CONFIGS = sorted((Path(__file__).parent.parent / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_load(path):
    cfg = load_config(path)
    assert isinstance(cfg, Config) and cfg.num_experts >= 1


def test_default_is_2_ddpm_6_fm_on_8_experts():
    cfg = load_config(Path(__file__).parent.parent / "configs" / "default.yaml")
    assert cfg.num_experts == 8 and (cfg.objectives.ddpm, cfg.objectives.fm) == (2, 6)
    details = [0.1, 0.5, 0.2, 0.9, 0.3, 0.0, 0.4, 0.05]
    assert cfg.objective_of(details) == ["fm", "ddpm", "fm", "ddpm", "fm", "fm", "fm", "fm"]


def _write(tmp_path, text):
    p = tmp_path / "exp.yaml"
    p.write_text(text)
    return p


def test_unknown_key_names_key_and_file(tmp_path):
    p = _write(tmp_path, "expert:\n  stpes: 10\n")
    with pytest.raises(ConfigError, match=r"exp\.yaml: unknown key expert\.stpes") as e:
        load_config(p)
    assert "\n" not in str(e.value)
    p = _write(tmp_path, "num_expert: 8\n")
    with pytest.raises(ConfigError, match=r"unknown key num_expert"):
        load_config(p)
    p = _write(tmp_path, "sampling:\n  cfg-scale: 2\n")
    with pytest.raises(ConfigError, match=r"did you mean sampling\.cfg_scale"):
        load_config(p)


def test_type_and_value_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"exp\.yaml: expert\.steps: expected int, got 'many'"):
        load_config(_write(tmp_path, "expert:\n  steps: many\n"))
    with pytest.raises(ConfigError, match=r"ddpm\.schedule: unknown schedule 'quadratic'"):
        load_config(_write(tmp_path, "ddpm:\n  schedule: quadratic\n"))
    with pytest.raises(ConfigError, match=r"sampling\.routing: unknown routing mode 'best'"):
        load_config(_write(tmp_path, "sampling:\n  routing: best\n"))
    with pytest.raises(ConfigError, match=r"not valid YAML"):
        load_config(_write(tmp_path, "expert: [\n"))
    with pytest.raises(ConfigError, match=r"does not exist"):
        load_config(tmp_path / "nope.yaml")
    assert (
        load_config(_write(tmp_path, "expert:\n  optim: {lr: 1}\n")).expert.optim.lr == 1.0
    )  # int accepted for a float


def test_objective_mixes(tmp_path):
    cfg = load_config(_write(tmp_path, "objectives: {ddpm: 4, fm: 4, ddpm_clusters: [0, 2, 4, 6]}\n"))
    assert cfg.objective_of() == ["ddpm", "fm"] * 4
    cfg = load_config(_write(tmp_path, "objectives: {ddpm: 0, fm: 8}\n"))
    assert cfg.objective_of([0.0] * 8) == ["fm"] * 8
    cfg = load_config(_write(tmp_path, "num_experts: 3\nfederation: {min_experts: 2}\nobjectives: [fm, ddpm, fm]\n"))
    assert cfg.objective_of() == ["fm", "ddpm", "fm"]
    with pytest.raises(ConfigError, match=r"objectives: ddpm 3 \+ fm 6 must equal num_experts 8"):
        load_config(_write(tmp_path, "objectives: {ddpm: 3, fm: 6}\n"))
    with pytest.raises(ConfigError, match=r"objectives\.ddpm_clusters: needs 2 distinct ids"):
        load_config(_write(tmp_path, "objectives: {ddpm_clusters: [1, 1]}\n"))
    with pytest.raises(ConfigError, match=r"objectives\.per_expert\[1\]: unknown objective 'edm'"):
        load_config(_write(tmp_path, "num_experts: 2\nfederation: {min_experts: 1}\nobjectives: [fm, edm]\n"))


def test_overrides(tmp_path):
    p = _write(tmp_path, "expert:\n  steps: 10\n")
    o = parse_overrides("expert.steps=3 sampling.prompts=[a cat, 'b, c'] sampling.cfg_scale=4.5")
    assert o == {"expert.steps": 3, "sampling.prompts": ["a cat", "b, c"], "sampling.cfg_scale": 4.5}
    cfg = load_config(p, o)
    assert cfg.expert.steps == 3 and cfg.sampling.prompts == ["a cat", "b, c"]
    with pytest.raises(ConfigError, match=r"unknown key expert\.step"):
        load_config(p, {"expert.step": 3})
    with pytest.raises(ConfigError, match="not of the form key=value"):
        parse_overrides("expert.steps")


def test_exponent_floats_without_a_dot_are_numbers(tmp_path):
    """YAML 1.1 reads 2e-3 as a string; the config reads it (in files and overrides) as YAML 1.2 does."""
    o = parse_overrides("expert.optim.lr=2e-3 sampling.cfg_scale=+1E1 a=.5e1 b=1e c=e5 d=2e-3x e=10")
    assert o == {
        "expert.optim.lr": 0.002,
        "sampling.cfg_scale": 10.0,
        "a": 5.0,
        "b": "1e",
        "c": "e5",
        "d": "2e-3x",
        "e": 10,
    }
    cfg = load_config(
        _write(tmp_path, "expert:\n  optim: {lr: 3e-4}\n"), {"sampling.cfg_scale": o["sampling.cfg_scale"]}
    )
    assert (cfg.expert.optim.lr, cfg.sampling.cfg_scale) == (3e-4, 10.0)
    assert yaml.safe_load("x: 2e-3") == {"x": "2e-3"}  # PyYAML's own loader is left as it is


def test_round_trip_through_dict():
    cfg = Config()
    assert config_from_dict(cfg.to_dict()) == cfg


def test_base_files_are_deep_merged(tmp_path):
    (tmp_path / "a.yaml").write_text("expert: {steps: 7, lr: 0.5}\nsampling: {cfg_scale: 2}\n")
    cfg = load_config(_write(tmp_path, "base: a.yaml\nexpert: {steps: 9}\n"))
    assert (cfg.expert.steps, cfg.expert.optim.lr, cfg.sampling.cfg_scale) == (9, 0.5, 2.0)
    fm8 = load_config(Path(__file__).parent.parent / "configs" / "fm-8.yaml")
    default = load_config(Path(__file__).parent.parent / "configs" / "default.yaml")
    assert fm8.objective_of() == ["fm"] * 8 and fm8.expert == default.expert and fm8.sampling == default.sampling
    (tmp_path / "loop.yaml").write_text("base: loop.yaml\n")
    with pytest.raises(ConfigError, match="includes itself"):
        load_config(tmp_path / "loop.yaml")


def test_init_per_objective_and_expert(tmp_path):
    cfg = load_config(_write(tmp_path, "expert:\n  init: {fm: /a, ddpm: /b, 3: random}\n"))
    assert [cfg.init_for(k, o) for k, o in [(0, "fm"), (1, "ddpm"), (3, "ddpm")]] == ["/a", "/b", "random"]
    assert load_config(_write(tmp_path, "expert: {init: /c}\n")).init_for(5, "fm") == "/c"
    with pytest.raises(ConfigError, match=r"expert\.init: entry 'sde'"):
        load_config(_write(tmp_path, "expert:\n  init: {sde: /a}\n"))


def test_fm_time_sampling_is_checked_and_reaches_the_fm_experts_metadata(tmp_path):
    from hddm_flower.checkpoints import make_expert
    from hddm_flower.stages.expert import build_expert

    with pytest.raises(ConfigError, match=r"expert\.fm_time_sampling: .*'beta'"):
        load_config(_write(tmp_path, "expert: {fm_time_sampling: beta}\n"))
    with pytest.raises(ConfigError, match=r"expert\.fm_logit_std"):
        load_config(_write(tmp_path, "expert: {fm_time_sampling: logit_normal, fm_logit_std: 0}\n"))
    cfg = load_config(_write(tmp_path, "expert: {preset: test, fm_time_sampling: logit_normal, fm_logit_mean: 0.5}\n"))
    shapes = {"image_size": 8, "channels": 3, "text_dim": 8}
    fm, _, meta = build_expert(cfg, shapes, "fm")
    assert meta["time_sampling"] == {"kind": "logit_normal", "mean": 0.5, "std": 1.0}
    assert make_expert(fm.net, meta).time_sampling == fm.time_sampling == meta["time_sampling"]
    assert "time_sampling" not in build_expert(cfg, shapes, "ddpm")[2]  # DDPM timesteps stay uniform
    assert build_expert(Config(), shapes, "fm")[2]["time_sampling"] == {"kind": "uniform"}


def test_paper_configs_state_the_paper_setup():
    paper = load_config(Path(__file__).parent.parent / "configs" / "paper-2ddpm-6fm.yaml")
    assert (paper.expert.preset, paper.router.preset, paper.num_experts) == ("XL/2", "B/2", 8)
    assert (paper.sampling.top_k, paper.sampling.cfg_scale, paper.sampling.num_steps) == (2, 7.5, 50)
    assert paper.data.max_caption_tokens == 77 and paper.expert.mixed_precision == "bf16"
    fm8 = load_config(Path(__file__).parent.parent / "configs" / "paper-8fm.yaml")
    assert fm8.objective_of() == ["fm"] * 8 and fm8.expert == paper.expert


BAD = sorted((Path(__file__).parent / "bad_configs").glob("*.yaml"))


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_config_corpus_gives_its_one_line_message(path, tmp_path, capsys):
    """Each file in tests/bad_configs states the message it must produce; `hddm prepare` exits 2 with it, in one
    line, without a traceback, and writes nothing."""
    from hddm_flower.cli import main

    expected = path.read_bytes().splitlines()[0].decode().removeprefix("# expect: ")
    assert main(["prepare", "--config", str(path), "--cache-dir", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert len(err[0]) <= len("hddm prepare: error: ") + MAX_MESSAGE
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


@pytest.mark.parametrize(
    "item, expected",
    [
        ("expert.steps=[", "override expert.steps: not valid YAML"),
        ("expert.steps.x=1", "override expert.steps.x: expert.steps is not a section"),
        ("expert..steps=1", "is not a dotted key"),
        ("sampling.top_k=0", "sampling.top_k: must be ≥ 1"),
        ("expert.lr=.inf", "expert.optim.lr: expected a finite number, got inf"),
        ("router.optim.lr=-1", "router.optim.lr: must be > 0"),
        ("federation.min_experts=9", "federation.min_experts: must be in 1..8"),
    ],
)
def test_bad_overrides_give_one_line_errors(item, expected, tmp_path, capsys):
    """Dotted overrides go through the same checks as the file; a malformed one is a one-line error, exit 2."""
    from hddm_flower.cli import main

    config = Path(__file__).parent.parent / "configs" / "default.yaml"
    argv = ["prepare", "--config", str(config), "--set", item, "--cache-dir", str(tmp_path / "cache")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err


def test_optimiser_block_is_shared_and_flat_keys_still_load(tmp_path):
    """expert.optim and router.optim are one block type; the flat form of older files and run directories loads
    into it, merges key by key with a base file in the other form, and overrides may use either spelling."""
    (tmp_path / "a.yaml").write_text("expert: {optim: {lr: 0.5, warmup_steps: 7}}\nrouter: {lr: 0.25}\n")
    cfg = load_config(_write(tmp_path, "base: a.yaml\nexpert: {lr: 0.1, optimizer: foreach}\n"), {"router.lr": 0.3})
    assert cfg.expert.optim == OptimConfig(lr=0.1, warmup_steps=7, implementation="foreach")
    assert cfg.router.optim == OptimConfig(lr=0.3, warmup_steps=40)
    assert type(cfg.expert.optim) is type(cfg.router.optim)
    assert config_from_dict({"expert": {"lr": 0.2}}).expert.optim.lr == 0.2


def test_error_messages_are_bounded_and_show_values_cut(tmp_path):
    long = "x" * 10_000
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, f"expert: {{steps: {long}}}\n"))
    assert len(str(e.value)) <= 200 and "expert.steps: expected int, got 'xxx" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, f"{long[:1000]}: 1\n"))  # (YAML allows plain keys up to 1024 characters)
    assert len(str(e.value)) <= MAX_MESSAGE and "unknown key xxx" in str(e.value)
    with pytest.raises(ConfigError, match="larger than 1024 KiB"):
        load_config(_write(tmp_path, "# " + "x" * (1 << 20) + "\n"))


def test_loading_a_config_imports_no_torch():
    """The schema and the YAML loader stay light: a config loads (and the CLI parser builds) without torch."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from hddm_flower.config.io import load_config\n"
        "load_config('configs/paper-2ddpm-6fm.yaml')\n"
        "assert 'torch' not in sys.modules, 'config imported torch'\n"
    )
    root = Path(__file__).parent.parent
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True, timeout=60)


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "{}\n", "---\n"])
def test_an_experiment_file_without_settings_is_a_one_line_error_naming_it(tmp_path, text):
    from hddm_flower.config.io import load_config
    from hddm_flower.config.rules import ConfigError

    path = tmp_path / "exp.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="holds no settings") as e:
        load_config(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
