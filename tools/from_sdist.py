"""One sdist, every wheel: unpack the sdist and build any target's wheel from it.

The sdist carries no target (MANIFEST.in ships every ``pyproject_<target>.toml``, targets.toml,
csrc/ and the tools setup.py imports).  A target's wheel is built by unpacking it and copying
``pyproject_<target>.toml`` over ``pyproject.toml``; the version comes from the sdist's PKG-INFO.
Used by tests/packaging/test_sdist.py and by the release workflow, which runs ``--prepare``
and hands the directory to cibuildwheel.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools import targets as _targets

__all__ = ["build_wheel", "prepare"]


def prepare(sdist: Path, target: str, dest: Path) -> Path:
    """Unpack ``sdist`` into a fresh ``dest/<target>/`` and make it build ``target``; return the
    source dir.  Fresh per target: a setuptools ``build/`` left by another target's build in the
    same tree would put that target's libraries into this wheel (the rehearsal caught it)."""
    dest = Path(dest) / target
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with tarfile.open(sdist) as tf:
        if sys.version_info >= (3, 12):
            tf.extractall(dest, filter="data")
        else:  # pragma: no cover - 3.10/3.11 floor
            tf.extractall(dest)
    (src,) = [p for p in dest.iterdir() if p.is_dir()]
    table = _targets.load(src / "targets.toml")
    if target not in table:
        raise SystemExit(f"from_sdist: unknown target {target!r}; targets.toml has {sorted(table)}")
    pyproject = table[target].pyproject
    if pyproject != "pyproject.toml":
        shutil.copy2(src / pyproject, src / "pyproject.toml")
    return src


def build_wheel(sdist: Path, target: str, workdir: Path, outdir: Path, *, env: dict | None = None) -> Path:
    """Build ``target``'s wheel from ``sdist`` into ``outdir``; return the wheel."""
    src = prepare(sdist, target, workdir)
    before = set(outdir.glob("*.whl")) if outdir.exists() else set()
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(outdir), str(src)], check=True, env=env
    )
    (wheel,) = set(outdir.glob("*.whl")) - before
    return wheel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("sdist", type=Path)
    parser.add_argument("--target", required=True)
    parser.add_argument("--dest", type=Path, required=True, help="where to unpack")
    parser.add_argument("--prepare", action="store_true", help="only unpack and swap the pyproject")
    parser.add_argument("--outdir", type=Path, default=Path("dist"))
    args = parser.parse_args(argv)
    if args.prepare:
        print(prepare(args.sdist, args.target, args.dest))
    else:
        print(build_wheel(args.sdist, args.target, args.dest, args.outdir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
