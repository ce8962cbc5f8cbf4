"""Which targets a change touches: the path filter of CI's ``changes`` job.

Rules are tried in order and the first match decides.  Target sets are derived from
targets.toml (which targets compile C++ sources, which compile CUDA/HIP sources), so a new
target needs no edit here.  An unknown path, or no usable diff, selects every target: a filter
may run too much, never too little.  The unit and lint jobs always run.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools import targets as _targets

__all__ = ["RULES", "affected", "changed_files"]

Table = dict[str, _targets.Target]


def _none(table: Table) -> set[str]:
    return set()


def _all(table: Table) -> set[str]:
    return set(table)


def _cxx(table: Table) -> set[str]:
    """Targets that compile the C++ (CPU) kernels: an AOT cpu library or a C++ JIT."""
    return {t.name for t in table.values() if "cpu" in t.aot.libraries or t.jit == "cxx"}


def _gpu(table: Table) -> set[str]:
    """Targets that compile the CUDA/HIP kernels (HIP builds from the same .cu sources)."""
    return {
        t.name
        for t in table.values()
        if {"cuda", "rocm"} & set(t.aot.libraries) or t.jit in ("nvcc", "hipcc")
    }


def _native(table: Table) -> set[str]:
    return _cxx(table) | _gpu(table)


#: (glob, targets) in order; the first glob that matches a path decides its targets.
RULES: list[tuple[str, Callable[[Table], set[str]]]] = [
    ("docs/*", _none),
    ("benchmarks/*", _none),
    ("*.md", _none),
    (".github/CODEOWNERS", _none),
    (".github/labeler.yml", _none),
    (".github/dependabot.yml", _none),
    ("csrc/aot_cpu.cpp", _cxx),
    ("csrc/aot_cuda.cu", _gpu),
    ("python/opmux/kernels/jit/csrc/*_cpu.*", _cxx),
    ("python/opmux/kernels/jit/csrc/*_cuda.*", _gpu),
    ("python/opmux/kernels/jit/include/*.cuh", _gpu),
    ("python/opmux/kernels/jit/include/*", _native),
    ("python/opmux/kernels/jit/*", _native),
    # ops, the metadata layer, packaging (setup.py, pyproject*.toml, targets.toml, tools/,
    # noxfile.py), workflows and tests reach every target
    ("*", _all),
]


def affected(paths: Iterable[str], table: Table) -> list[str]:
    """The targets touched by ``paths`` (repository-relative), in targets.toml order."""
    hit: set[str] = set()
    for path in paths:
        for pattern, targets in RULES:
            if fnmatch.fnmatchcase(path, pattern):
                hit |= targets(table)
                break
    return [name for name in table if name in hit]


def changed_files(base: str, head: str = "HEAD", *, root: Path = _targets.ROOT) -> list[str] | None:
    """``git diff --name-only base...head``; None when there is no usable base."""
    if not base or set(base) == {"0"}:
        return None  # a new branch or tag: no base to compare with
    out = subprocess.run(
        ["git", "-C", str(root), "diff", "--name-only", f"{base}...{head}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.split() if out.returncode == 0 else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--base", default="", help="base commit (empty: every target)")
    parser.add_argument("--head", default="HEAD")
    parser.add_argument("files", nargs="*", help="changed paths (instead of --base)")
    args = parser.parse_args(argv)
    table = _targets.load()
    files = args.files or changed_files(args.base, args.head)
    print(json.dumps(list(table) if files is None else affected(files, table)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
