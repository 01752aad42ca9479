"""The installed command line: `hddm --version` and every `--help` answer without importing torch, and the
shipped configs travel inside the package so an installed `hddm` finds its default."""

import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

from hddm_flower.config import shipped_configs

ROOT = Path(__file__).parent.parent


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_help_and_version_import_no_torch():
    """`hddm --help`, each subcommand's --help and --version print and exit 0 with torch never imported."""
    code = """
import contextlib, io, sys
from hddm_flower.cli import build_parser, main
parser = build_parser()
commands = sorted(parser._subparsers._group_actions[0].choices)
for argv in [["--help"], ["--version"], *([c, "--help"] for c in commands)]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main(argv)
        except SystemExit as e:
            assert e.code == 0, (argv, e.code)
    assert out.getvalue().strip(), argv
    assert "torch" not in sys.modules, f"{argv} imported torch"
print(len(commands), "commands")
"""
    r = _run(code)
    assert r.returncode == 0, r.stderr[-2000:]
    assert int(r.stdout.split()[0]) >= 10


def test_version_names_the_package_and_its_frameworks():
    r = _run("from hddm_flower.cli import main; main(['--version'])")
    assert r.stdout.startswith("hddm-flower ") and "flwr " in r.stdout and "torch " in r.stdout, r.stdout


def test_configs_ship_inside_the_package_and_are_self_contained():
    """The wheel maps configs/ to hddm_flower/configs (where `shipped_configs` looks first); every `base:` of a
    shipped file names a file beside it, so the folder works wherever it is installed."""
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert build["force-include"]["configs"] == "hddm_flower/configs"
    assert shipped_configs() == (ROOT / "configs").resolve()  # the source tree: no copy inside the package
    for path in shipped_configs().glob("*.yaml"):
        base = (yaml.safe_load(path.read_text()) or {}).get("base")
        assert base is None or (path.parent / base).resolve().parent == path.parent.resolve(), path.name
