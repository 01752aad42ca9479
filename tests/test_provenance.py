"""Provenance: the checkout's commit and its uncommitted files, and nothing where the package is not the top of a
checkout of its own."""

import shutil
import subprocess
from pathlib import Path

import pytest

from hddm_flower import provenance
from hddm_flower.provenance import source

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def git(root, *args):
    return subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


@pytest.fixture
def checkout(tmp_path):
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("x = 1\n")
    (root / "README.md").write_text("r\n")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-qm", "first")
    return root


def test_a_clean_checkout_names_its_commit(checkout):
    assert source(checkout / "pkg") == {"commit": git(checkout, "rev-parse", "--short", "HEAD"), "uncommitted": []}


def test_changed_files_and_untracked_modules_of_the_package_are_named(checkout):
    """A changed tracked file, a renamed one (by its new path), a path with a space, and an untracked module inside
    the package (it runs too) are named; an untracked file outside the package is not."""
    (checkout / "pkg" / "a.py").write_text("x = 2\n")
    (checkout / "pkg" / "new module.py").write_text("y = 1\n")
    (checkout / "notes.txt").write_text("n\n")
    assert source(checkout / "pkg")["uncommitted"] == ["pkg/a.py", "pkg/new module.py"]
    git(checkout, "add", "pkg/new module.py")
    git(checkout, "commit", "-qam", "second")
    assert source(checkout / "pkg") == {"commit": git(checkout, "rev-parse", "--short", "HEAD"), "uncommitted": []}
    git(checkout, "mv", "pkg/a.py", "pkg/b.py")
    assert source(checkout / "pkg")["uncommitted"] == ["pkg/b.py"]


def test_a_callers_git_environment_does_not_redirect_it(checkout, tmp_path, monkeypatch):
    """Under a git hook GIT_DIR names the hook's repository; the package's own checkout is still the one read."""
    other = tmp_path / "other"
    other.mkdir()
    git(other, "init", "-q")
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(other))
    expect = subprocess.run(
        ["git", "-C", str(checkout), "--git-dir", str(checkout / ".git"), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert source(checkout / "pkg") == {"commit": expect, "uncommitted": []}


def test_a_checkout_git_cannot_read_says_so(checkout, monkeypatch):
    """git missing (or refusing the repository) in a checkout: an error, not the silence of an installed release."""

    def missing(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(provenance.subprocess, "run", missing)
    assert source(checkout / "pkg") == {"error": "git: git"}


def test_a_package_deeper_in_a_repository_is_not_its_checkout(checkout):
    """An installed copy in a site-packages folder that happens to sit inside some repository names no commit."""
    inner = checkout / "venv" / "site-packages" / "pkg"
    inner.mkdir(parents=True)
    assert source(inner) == {}


def test_outside_any_repository_there_is_nothing(tmp_path):
    (tmp_path / "pkg").mkdir()
    assert source(tmp_path / "pkg") == {}


def expected_source_commit() -> str | None:
    """What the package's own checkout says its commit is, read apart from :func:`source` (None: not a checkout)."""
    root = Path(provenance.__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    return git(root, "rev-parse", "--short", "HEAD")


def test_a_checkout_that_moves_during_a_run_is_recorded_at_both_ends(checkout, monkeypatch):
    pkg = checkout / "pkg"
    monkeypatch.setattr(provenance, "source", lambda: source(pkg))
    at_start = source(pkg)
    assert provenance.source_since(at_start) == at_start
    (pkg / "a.py").write_text("x = 3\n")
    assert provenance.source_since(at_start) == at_start | {"at_the_end": source(pkg)}
    assert source(pkg)["uncommitted"] == ["pkg/a.py"]
