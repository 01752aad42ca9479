"""Ground rules of the house that a test can hold: the core never imports flwr; CI runs README's test command."""

import re
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_core_is_framework_free():
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "hddm_flower").rglob("*.py")
        if re.search(r"^\s*(import flwr|from flwr)", p.read_text(), re.M)
    ]
    assert offenders == []


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Tests", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    readme_cmds = [ln.strip() for ln in block.strip().splitlines()]
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert readme_cmds[-1] == ci[-1]  # the test command itself
    assert 'pip install -q -e ".[test]"' in ci and 'pip install -e ".[test]"' in readme_cmds


def test_pyproject_has_no_legacy_federations_block():
    assert "[tool.flwr.federations" not in (ROOT / "pyproject.toml").read_text()
