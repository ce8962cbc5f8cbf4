"""tools/stage.py: staging copies only source files; the fingerprint sees build outputs."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from tools import stage


@pytest.fixture
def tree(tmp_path):
    t = tmp_path / "tree"
    (t / "python/opmux/__pycache__").mkdir(parents=True)
    (t / "build/lib").mkdir(parents=True)
    (t / "python/opmux/__init__.py").write_text("")
    (t / "python/opmux/__pycache__/x.cpython-311.pyc").write_bytes(b"")
    (t / "build/lib/junk.py").write_text("")
    (t / "pyproject.toml").write_text("[project]\n")
    (t / "pyproject_cpu.toml").write_text("[project]\nname='cpu'\n")
    (t / "python/opmux/libfoo.so").write_bytes(b"")
    (t / ".gitignore").write_text("__pycache__/\n/build/\n*.so\n")
    return t


def test_source_files_without_git(tree):
    assert stage.source_files(tree) == [
        ".gitignore",
        "pyproject.toml",
        "pyproject_cpu.toml",
        "python/opmux/__init__.py",
    ]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_source_files_with_git(tree):
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    (tree / "untracked.txt").write_text("x")
    assert "untracked.txt" in stage.source_files(tree)
    assert not [f for f in stage.source_files(tree) if f.startswith("build/") or f.endswith((".pyc", ".so"))]


def test_stage_swaps_the_pyproject(tree, tmp_path):
    dest = stage.stage(tree, tmp_path / "staged", pyproject="pyproject_cpu.toml")
    assert (dest / "pyproject.toml").read_text() == "[project]\nname='cpu'\n"
    assert not (dest / "build").exists() and not (dest / "python/opmux/__pycache__").exists()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_fingerprint_sees_build_outputs(tree):
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    (tree / ".gitignore").write_text("__pycache__/\n/build/\n*.so\n/python/opmux/_version.py\n")
    (tree / "python/opmux/edited_by_a_person.py").write_text("")
    before = stage.fingerprint(tree)
    (tree / "python/opmux/_version.py").write_text("v = 1\n")  # as setuptools-scm would
    (tree / "build/lib/junk.py").write_text("changed")
    (tree / "python/opmux/edited_by_a_person.py").write_text("x = 1\n")  # not a build output
    assert stage.diff_fingerprints(before, stage.fingerprint(tree)) == [
        "added: python/opmux/_version.py",
        "changed: build/lib/junk.py",
    ]
