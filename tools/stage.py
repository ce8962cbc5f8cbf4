"""Stage a clean copy of the source tree for a build, and fingerprint the checkout.

A wheel is never built in the checkout: the files git would commit (tracked, plus untracked
files that are not ignored) are copied into a temporary directory and built there, so no
build/, egg-info, _version.py or compiled object ever lands in the working tree.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

__all__ = ["fingerprint", "source_files", "stage"]

# Without git, a plain walk skips these (directory names, anywhere in the tree).
SKIP_DIRS = {
    ".git",
    ".nox",
    ".venv",
    "build",
    "dist",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".whl",
    ".eggs",
}
SKIP_SUFFIXES = (".pyc", ".pyo", ".so", ".o", ".egg-info")


def _git_files(root: Path) -> list[str] | None:
    if not (root / ".git").exists() or shutil.which("git") is None:
        return None
    out = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "-co", "--exclude-standard"],
        capture_output=True,
        check=False,
    )
    if out.returncode != 0:
        return None
    return [p for p in out.stdout.decode().split("\0") if p]


def source_files(root: Path) -> list[str]:
    """Relative POSIX paths of the files a build may see, sorted.

    With git: ``git ls-files -co --exclude-standard`` (tracked + untracked-not-ignored) that
    exist on disk.  Without git: a walk that skips build outputs, VCS data and caches.
    """
    root = Path(root)
    files = _git_files(root)
    if files is None:
        files = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info"))
            rel = Path(dirpath).relative_to(root)
            files += [(rel / f).as_posix() for f in filenames if not f.endswith(SKIP_SUFFIXES)]
    return sorted(p for p in files if (root / p).is_file() and not (root / p).is_symlink())


def stage(root: Path, dest: Path, *, pyproject: str = "pyproject.toml") -> Path:
    """Copy the source files of ``root`` into ``dest``; ``pyproject`` becomes pyproject.toml."""
    root, dest = Path(root), Path(dest)
    for rel in source_files(root):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)
    if pyproject != "pyproject.toml":
        shutil.copy2(root / pyproject, dest / "pyproject.toml")
    return dest


# Tool caches that other processes (mypy, ruff, pytest) may rewrite while a build runs.
CACHE_DIRS = {"__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".venv", ".ty_cache"}
# Files of the checkout that a build could be tempted to write although they are not ignored.
WATCHED = ("pyproject.toml", "python/opmux/_build_info.py", "setup.py", "targets.toml", "MANIFEST.in")


def fingerprint(root: Path, *, exclude: tuple[str, ...] = ("dist", ".nox", ".git")) -> dict[str, str]:
    """Hashes of what a build writes if it writes into the checkout: every file that is not a
    source file (ignored or build output: build/, *.egg-info, _version.py, *.so), plus WATCHED.

    Source files edited meanwhile by a person are not counted: only build outputs are.
    Top-level ``exclude`` directories (where builds are meant to write) are skipped.
    """
    root = Path(root)
    sources = set(source_files(root))
    result = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        if rel_dir == Path("."):
            dirnames[:] = [d for d in dirnames if d not in exclude]
        dirnames[:] = [d for d in dirnames if d not in CACHE_DIRS]
        for f in filenames:
            p = Path(dirpath) / f
            rel = (rel_dir / f).as_posix()
            if p.is_symlink() or not p.is_file() or (rel in sources and rel not in WATCHED):
                continue
            result[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return result


def diff_fingerprints(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Human-readable list of files added, removed or changed between two fingerprints."""
    out = [f"added: {p}" for p in sorted(after.keys() - before.keys())]
    out += [f"removed: {p}" for p in sorted(before.keys() - after.keys())]
    out += [f"changed: {p}" for p in sorted(p for p in before.keys() & after.keys() if before[p] != after[p])]
    return out
