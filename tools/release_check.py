"""Every check a release artefact passes before it is published, defined once.

For each wheel (its target found from its distribution name) and the sdist: the golden file
list, metadata, tag, build info, size budget and CUDA device code (tools/wheel_check.py), then
``check-wheel-contents`` and ``twine check --strict``.  The release workflow's check job runs
``nox -s release-check``, the ``wheel-<target>`` sessions and the release rehearsal run this same
module, so no check is written twice and nothing is published that the rehearsal would refuse.

    python tools/release_check.py [--root TREE] FILE_OR_DIR...
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools import targets as _targets
from tools import wheel_check as _wheel_check

__all__ = ["artifacts_in", "check", "target_of"]

#: W002 (duplicate files): the empty __init__.py files of the package are identical on purpose
CHECK_WHEEL_CONTENTS = ["-m", "check_wheel_contents"]


def artifacts_in(paths: Iterable[Path]) -> list[Path]:
    """Wheels and sdists named, or found directly under the directories named."""
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found += sorted(p for p in path.iterdir() if p.name.endswith((".whl", ".tar.gz")))
        else:
            found.append(path)
    return found


def target_of(artifact: Path, table: dict[str, _targets.Target]) -> _targets.Target:
    """The target an artefact belongs to: by distribution name; the sdist is the default's."""
    name = Path(artifact).name
    if name.endswith(".tar.gz"):
        return _targets.default_target(table)
    dist = name.split("-")[0].replace("_", "-")
    for t in table.values():
        if t.distribution == dist:
            return t
    raise LookupError(f"{name}: no target in targets.toml has distribution {dist!r}")


def _repaired_ignores(wheel: Path) -> list[str]:
    """auditwheel grafts external libraries into ``<dist>.libs/`` beside the package: a second
    top-level entry without Python modules (W009, W010) is what a repaired wheel looks like."""
    dist = wheel.name.split("-")[0]
    with zipfile.ZipFile(wheel) as zf:
        grafted = any(n.startswith(f"{dist}.libs/") for n in zf.namelist())
    return ["--ignore", "W002,W009,W010" if grafted else "W002"]


def check(artifacts: Sequence[Path], root: Path, *, python: str = sys.executable) -> list[str]:
    """Every problem with ``artifacts`` as builds of the tree at ``root`` (empty: publishable)."""
    root = Path(root)
    table = _targets.load(root / "targets.toml")
    problems: list[str] = []
    if not artifacts:
        return ["no wheel or sdist to check"]
    for target in {target_of(a, table).name: target_of(a, table) for a in artifacts}.values():
        problems += _wheel_check.check_package_data(root / target.pyproject, root)
    for artifact in artifacts:
        target = target_of(artifact, table)
        if artifact.name.endswith(".whl"):
            problems += _wheel_check.check_wheel(artifact, root, target)
        else:
            problems += _wheel_check.check_sdist(artifact, root, target)
    tools = [
        (f"check-wheel-contents {w.name}", [python, *CHECK_WHEEL_CONTENTS, *_repaired_ignores(w), str(w)])
        for w in artifacts
        if w.name.endswith(".whl")
    ]
    tools.append(("twine check", [python, "-m", "twine", "check", "--strict", *map(str, artifacts)]))
    for label, cmd in tools:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            out = (proc.stdout + proc.stderr).strip()
            problems.append(f"{label} failed ({proc.returncode}):\n    " + out.replace("\n", "\n    "))
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--root", type=Path, default=_targets.ROOT, help="the tree they were built from")
    parser.add_argument("paths", nargs="+", type=Path, help="wheels, sdists, or directories of them")
    args = parser.parse_args(argv)
    artifacts = artifacts_in(args.paths)
    problems = check(artifacts, args.root)
    for p in problems:
        print(f"FAIL {p}", file=sys.stderr)
    if problems:
        print(f"release-check: {len(problems)} problem(s); nothing may be published", file=sys.stderr)
        return 1
    names = ", ".join(a.name for a in artifacts)
    print(f"release-check: {names}: file lists, metadata, tags, build info, device code, sizes, twine OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
