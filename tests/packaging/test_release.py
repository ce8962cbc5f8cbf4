"""tools/release.py: release builds need a clean, tagged git tree and a final version."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from tools import release


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("1.2.3", True),
        ("0.4", True),
        ("1.0rc1", True),
        ("1.0.post1", True),
        ("0.0.0.dev0+unknown", False),
        ("0.0.0.dev0", False),
        ("1.2.4.dev3+g2713d34c3", False),
        ("1.2.3+local", False),
        ("", False),
    ],
)
def test_release_versions(version, ok):
    assert release.is_release_version(version) is ok


def test_requested():
    assert release.requested({"OPMUX_RELEASE": "1"})
    assert not release.requested({"OPMUX_RELEASE": "0"})
    assert not release.requested({})


def _git(tree, *args):
    subprocess.run(
        ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
    )


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_tree_checks(tmp_path):
    assert release.git_problems(tmp_path) is None  # not a git tree
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("a")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "commit", "-q", "-m", "a")
    problems = release.git_problems(tmp_path)
    assert len(problems) == 1 and "carries no version tag v*" in problems[0]
    _git(tmp_path, "tag", "v1.0.0")
    assert release.git_problems(tmp_path) == []
    (tmp_path / "a.txt").write_text("changed")
    (tmp_path / "new.txt").write_text("untracked")
    problems = release.git_problems(tmp_path)
    assert problems == [
        "the git tree is dirty (2 changed or untracked file(s): a.txt, new.txt); commit or stash them"
    ]
    assert release.check(tmp_path, "1.0.0") == problems
    message = release.refusal(release.check(tmp_path, "1.0.1.dev1+gabc"))
    assert message.startswith("opmux: OPMUX_RELEASE=1 but this is not a releasable tree:")
    assert "version '1.0.1.dev1+gabc' is a development version" in message
