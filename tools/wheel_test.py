"""Install one wheel in a fresh venv and run its target's cibuildwheel test command there.

cibuildwheel does exactly this for the wheels it repairs (``test-requires`` + ``test-command`` of
the target's ``[tool.cibuildwheel]`` table: import-smoke and find-spec from a temporary
directory); the release workflow runs this script for the pure wheels that cibuildwheel does not
build, and the rehearsal runs it for every wheel.  One table, one test.

    python tools/wheel_test.py WHEEL --project CHECKOUT [--venv DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools import cibw as _cibw
from tools import release_check as _release_check
from tools import targets as _targets

__all__ = ["test_wheel"]


def test_wheel(wheel: Path, project: Path, venv: Path, *, python: str = sys.executable) -> None:
    """Raise ``subprocess.CalledProcessError`` when the install or the test command fails."""
    table = _targets.load(project / "targets.toml")
    target = _release_check.target_of(wheel, table)
    cfg = _cibw.load(project / target.pyproject)
    subprocess.run([python, "-m", "virtualenv", "-q", str(venv)], check=True)
    vpy = venv / "bin" / "python"
    subprocess.run([str(vpy), "-m", "pip", "install", "-q", str(wheel), *cfg.test_requires], check=True)
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PYTHONPATH", None)
    with tempfile.TemporaryDirectory(prefix="opmux-wheel-test-") as tmp:
        env["HOME"] = tmp
        subprocess.run(["bash", "-c", cfg.test(project, project)], check=True, cwd=tmp, env=env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("wheel", type=Path)
    parser.add_argument("--project", type=Path, default=_targets.ROOT)
    parser.add_argument("--venv", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="opmux-wheel-venv-") as tmp:
        venv = args.venv or Path(tmp) / "venv"
        try:
            test_wheel(args.wheel.resolve(), args.project.resolve(), venv)
        except subprocess.CalledProcessError as exc:
            print(f"wheel-test: {args.wheel.name}: {exc}", file=sys.stderr)
            return 1
    print(f"wheel-test: {args.wheel.name}: installed in a fresh venv; test command passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
