"""Release builds: refuse a dirty or untagged tree, and any development version.

``OPMUX_RELEASE=1`` asks for a release build.  Then the git checkout (when there is one) must
be clean (no modified, staged or untracked-not-ignored file) and its HEAD must carry a version
tag ``v*``, and the version being built must be a final one (no ``.dev``, no ``+local``).
A tree that is not itself the root of a git checkout (an unpacked sdist, recognised by its
PKG-INFO even when it lies inside another repository's workspace as in the release workflow and
in cibuildwheel; a staged copy) is judged by its version alone: git would describe the parent.
Standard library only (plus ``packaging`` when present): setup.py imports this module inside
the isolated build environment, and noxfile.py checks the checkout with it before staging.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

__all__ = ["ENV", "check", "git_problems", "is_release_version", "refusal", "requested"]

ENV = "OPMUX_RELEASE"
_FINAL = re.compile(r"^\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?$")


def requested(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Whether ``OPMUX_RELEASE`` asks for a release build."""
    return environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


def is_release_version(version: str) -> bool:
    """True for a publishable version: no ``.devN`` segment and no ``+local`` label."""
    return bool(_FINAL.match(version or ""))


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False)


def git_problems(root: Path) -> list[str] | None:
    """What stops ``root`` from being released; None when ``root`` is not a git checkout."""
    root = Path(root)
    if (root / "PKG-INFO").is_file() or shutil.which("git") is None:
        return None  # an unpacked sdist: its version says what it is
    top = _git(root, "rev-parse", "--show-toplevel")
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root.resolve():
        return None  # not a checkout's root: asking git would judge an enclosing repository
    problems = []
    status = _git(root, "status", "--porcelain", "--untracked-files=normal")
    dirty = [line[3:] for line in status.stdout.splitlines() if line.strip()]
    if dirty:
        shown = ", ".join(dirty[:8]) + (f" and {len(dirty) - 8} more" if len(dirty) > 8 else "")
        problems.append(
            f"the git tree is dirty ({len(dirty)} changed or untracked file(s): {shown}); commit or stash them"
        )
    tag = _git(root, "describe", "--tags", "--exact-match", "--match", "v*", "HEAD")
    if tag.returncode != 0:
        head = _git(root, "rev-parse", "--short", "HEAD").stdout.strip() or "HEAD"
        problems.append(f"HEAD ({head}) carries no version tag v*; tag it, e.g. `git tag v1.2.3`")
    return problems


def check(root: Path, version: str | None) -> list[str]:
    """Every reason why building ``version`` from ``root`` is not a release build."""
    problems = git_problems(root) or []
    if version is not None and not is_release_version(version):
        problems.append(
            f"version {version!r} is a development version (from an untagged or dirty tree, or the "
            "no-git fallback 0.0.0.dev0); release builds need a final version from a v* tag"
        )
    return problems


def refusal(problems: list[str]) -> str:
    """The message a refused release build prints."""
    lines = "\n".join(f"  - {p}" for p in problems)
    return f"opmux: {ENV}=1 but this is not a releasable tree:\n{lines}\nUnset {ENV} for a development build."
