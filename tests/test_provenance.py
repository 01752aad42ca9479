"""Provenance: the checkout's commit and its uncommitted files, and nothing where the package is not the top of a
checkout of its own."""

import shutil
import subprocess

import pytest

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


def test_a_changed_tracked_file_is_named_and_an_untracked_one_is_not(checkout):
    (checkout / "pkg" / "a.py").write_text("x = 2\n")
    (checkout / "pkg" / "new.py").write_text("y = 1\n")
    assert source(checkout / "pkg")["uncommitted"] == ["pkg/a.py"]
    git(checkout, "commit", "-qam", "second")
    assert source(checkout / "pkg") == {"commit": git(checkout, "rev-parse", "--short", "HEAD"), "uncommitted": []}


def test_a_package_deeper_in_a_repository_is_not_its_checkout(checkout):
    """An installed copy in a site-packages folder that happens to sit inside some repository names no commit."""
    inner = checkout / "venv" / "site-packages" / "pkg"
    inner.mkdir(parents=True)
    assert source(inner) == {}


def test_outside_any_repository_there_is_nothing(tmp_path):
    (tmp_path / "pkg").mkdir()
    assert source(tmp_path / "pkg") == {}
