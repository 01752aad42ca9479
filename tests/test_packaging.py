"""The installed command line: `hddm --version` and every `--help` answer without importing torch, the
shipped configs travel inside the package so an installed `hddm` finds its default, the Flower app bundle passes
Flower's format-v1 checks, and the installed Flower is the release the spooling code was written for."""

import importlib.metadata
import io
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import yaml
from flwr.cli.build import build_fab_from_disk
from flwr.proto.runtime_pb2 import PullAppMessagesRequest  # pylint: disable=E0611
from packaging.requirements import Requirement
from packaging.version import Version

from hddm_flower.config.schema import shipped_configs
from strategies.spool import FLOWER_SERIES

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


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_installed_flower_is_the_release_the_spool_was_written_for():
    """strategies/spool.py builds Flower's private Runtime API requests; on another Flower release it must be
    re-checked before anything runs on it (the next release renames ``PullAppMessagesRequest.message_ids``)."""
    installed = Version(importlib.metadata.version("flwr"))
    series = ".".join(map(str, FLOWER_SERIES))
    assert installed.release[:2] == FLOWER_SERIES, (
        f"flwr {installed} is installed, but strategies/spool.py was written against Flower {series}'s internals "
        f"(HttpGrid._runtime_client, PullAppMessagesRequest.message_ids): check it against this release with "
        f"tests/test_spool.py and benchmarks/server_memory.py, then update FLOWER_SERIES and pyproject's flwr bound"
    )
    fields = PullAppMessagesRequest.DESCRIPTOR.fields_by_name
    assert "message_ids" in fields, f"PullAppMessagesRequest has no message_ids in flwr {installed}: {sorted(fields)}"
    [flwr_req] = [Requirement(d) for d in _pyproject()["project"]["dependencies"] if Requirement(d).name == "flwr"]
    assert f"{series}.0" in flwr_req.specifier and f"{series}.99" in flwr_req.specifier, flwr_req
    nxt = f"{FLOWER_SERIES[0]}.{FLOWER_SERIES[1] + 1}.0"
    assert nxt not in flwr_req.specifier, f"pyproject admits flwr {nxt}, which spool.py was not written for"


def test_flower_app_bundle_passes_format_v1_with_its_licence():
    """What `flwr build` bundles: format version 1 with a target version inside the flwr bound (Flower's own
    checks raise otherwise), the Apache-2.0 LICENSE inside the bundle, no tests' caches or virtual environments."""
    app = _pyproject()["tool"]["flwr"]["app"]
    assert app["fab-format-version"] == 1
    blob = build_fab_from_disk(ROOT)
    assert len(blob) < 2 * 2**20, f"the bundle is {len(blob)} bytes: what grew it? (Flower refuses 10 MB)"
    fab = zipfile.ZipFile(io.BytesIO(blob))
    names = set(fab.namelist())
    assert "LICENSE" in names and "pyproject.toml" in names
    assert fab.read("LICENSE") == (ROOT / "LICENSE").read_bytes()
    assert b"Apache License" in fab.read("LICENSE") and b"Version 2.0, January 2004" in fab.read("LICENSE")
    bundled = tomllib.loads(fab.read("pyproject.toml").decode())
    assert bundled["tool"]["flwr"]["app"]["flwr-version-target"] == app["flwr-version-target"]
    assert not any(n.startswith(".venv/") or "__pycache__" in n for n in names)
    # the apps, their library and configs; no results, tests or docs (Flower refuses a bundle over its 10 MB)
    assert {
        "strategies/server_app.py",
        "clients/client_app.py",
        "hddm_flower/__init__.py",
        "configs/default.yaml",
    } <= names
    assert not [n for n in names if n.split("/")[0] in ("benchmarks", "tests", "docs", "scripts")]
