"""The CI matrix, generated from targets.toml: ``python tools/ci_matrix.py`` prints JSON.

``{"cpu": {"include": [...]}, "gpu": {"include": [...]}, "targets": [...]}``: each entry has a
``name`` (the check's name) and ``sessions`` (the nox sessions it runs, in order); GPU entries
also have ``runs-on``, the self-hosted runner labels of the target (targets.toml ``runner``).
CPU jobs run on ubuntu-latest: tests, lint, wheel-<target> for every selected target,
import-smoke, find-spec and parity-<target> for targets whose parity device is the CPU.
``--base SHA`` keeps only the targets that the change touches (tools/changes.py);
``--github-output FILE`` appends ``cpu=``, ``gpu=``, ``gpu-count=`` and ``targets=`` lines for
``fromJSON`` in .github/workflows/ci.yml.  ``--release`` prints the release build matrix.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools import changes as _changes
from tools import targets as _targets

__all__ = ["matrix", "release_matrix"]

CPU_RUNNER = "ubuntu-latest"


def _is_cpu(t: _targets.Target) -> bool:
    return t.parity_device == "cpu"


def matrix(table: dict[str, _targets.Target], selected: list[str] | None = None) -> dict:
    """The PR/push matrix for ``selected`` targets (all when None)."""
    chosen = [t for t in table.values() if selected is None or t.name in selected]
    wheels = [f"wheel-{t.name}" for t in chosen]
    cpu = [{"name": "tests", "sessions": "tests"}, {"name": "lint", "sessions": "lint"}]
    cpu += [{"name": w, "sessions": w} for w in wheels]
    if chosen:
        cpu.append({"name": "import-smoke", "sessions": " ".join([*wheels, "import-smoke"])})
        cpu.append({"name": "find-spec", "sessions": " ".join([*wheels, "find-spec"])})
    cpu += [
        {"name": f"parity-{t.name}", "sessions": f"wheel-{t.name} parity-{t.name}"}
        for t in chosen
        if _is_cpu(t)
    ]
    gpu = [
        {"name": f"parity-{t.name}", "sessions": f"wheel-{t.name} parity-{t.name}", "runs-on": list(t.runner)}
        for t in chosen
        if not _is_cpu(t)
    ]
    return {"cpu": {"include": cpu}, "gpu": {"include": gpu}, "targets": [t.name for t in chosen]}


RELEASE_RUNNERS = {"x86_64": "ubuntu-latest", "aarch64": "ubuntu-24.04-arm"}


def release_matrix(table: dict[str, _targets.Target]) -> dict:
    """One release build per target and machine: cibuildwheel for targets with AOT libraries (a
    manylinux image, auditwheel, the test command), on a native runner of each machine in
    targets.toml ``machines``; ``python -m build`` + tools/wheel_test.py once for pure ones
    (cibuildwheel refuses pure wheels)."""
    include = []
    for t in table.values():
        machines = t.machines if t.aot.libraries else ("x86_64",)
        for machine in machines:
            include.append(
                {
                    "target": t.name,
                    "machine": machine,
                    "runs-on": RELEASE_RUNNERS[machine],
                    "builder": "cibuildwheel" if t.aot.libraries else "build",
                }
            )
    return {"include": include}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--base", default=None, help="keep only the targets this change touches")
    parser.add_argument("--head", default="HEAD")
    parser.add_argument("--release", action="store_true")
    parser.add_argument("--github-output", type=Path, default=None)
    args = parser.parse_args(argv)
    table = _targets.load()
    if args.release:
        result = {"release": release_matrix(table)}
    else:
        selected = None
        if args.base is not None:
            files = _changes.changed_files(args.base, args.head)
            selected = None if files is None else _changes.affected(files, table)
        m = matrix(table, selected)
        result = {**m, "gpu-count": len(m["gpu"]["include"])}
    if args.github_output:
        with args.github_output.open("a", encoding="utf-8") as fh:
            for key, value in result.items():
                fh.write(f"{key}={json.dumps(value, separators=(',', ':'))}\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
