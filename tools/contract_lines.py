"""Count the per-op contract code written by hand (issue #25's measure).

What counts: the Python hooks a declaration names (``check=``, ``values=``, ``outputs=``) with
the module-private helpers they call, the kernel-view escape hatches (``ops/<group>/_views.py``),
and the C++ serving-lane code written by hand (the
``*_lanes.h`` / ``*_values.h`` headers and ``*_lane`` entries in the units). What does not: the
contracts themselves (data), the generated files (``_contracts.py``, ``_entrypoints.py``,
``contracts/*``), the shared check library (``_checks.py``, ``lane.h``) and the native entry
points' memory-safety checks.

    python tools/contract_lines.py [--json]
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "python" / "opmux" / "kernels"
OPS = KERNELS / "ops"
INCLUDE = KERNELS / "jit" / "include" / "opmux"
CSRC = KERNELS / "jit" / "csrc"
GENERATED = ("_contracts.py", "_entrypoints.py")
HOOKS = ("check", "values", "outputs")
_LANE_DEF = re.compile(r"^lane::Any \w+_lane\(")  # a hand-written entry (generated ones: contracts/*.inc)


def _functions(path: Path) -> tuple[dict[str, ast.FunctionDef], ast.Module]:
    tree = ast.parse(path.read_text(), str(path))
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}, tree


def _called(fn: ast.FunctionDef) -> set[str]:
    return {n.func.id for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def python_hooks(group: Path) -> dict[str, int]:
    """Hook function -> lines (with the private helpers it reaches in its module)."""
    modules = {p.stem: p for p in group.glob("*.py") if p.name not in GENERATED}
    found: dict[str, int] = {}
    for path in modules.values():
        _, tree = _functions(path)
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and getattr(call.func, "id", "") == "declare"):
                continue
            for kw in call.keywords:
                if kw.arg not in HOOKS:
                    continue
                v = kw.value
                if isinstance(v, ast.Name):
                    where, name = path, v.id
                elif isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and v.value.id in modules:
                    where, name = modules[v.value.id], v.attr
                else:
                    continue
                funcs, _ = _functions(where)
                todo, seen = [name], set()
                while todo:
                    f = todo.pop()
                    if f in seen or f not in funcs:
                        continue
                    seen.add(f)
                    todo += [c for c in _called(funcs[f]) if c.startswith("_")]
                for f in seen:
                    node = funcs[f]
                    found[f"{where.relative_to(OPS)}:{f}"] = (
                        (node.end_lineno or node.lineno) - node.lineno + 1
                    )
    if "_views" in modules:  # the escape hatch of kernel views (``Arg(view=...)``): all of it
        funcs, _ = _functions(modules["_views"])
        for f, node in funcs.items():
            found[f"{modules['_views'].relative_to(OPS)}:{f}"] = (
                (node.end_lineno or node.lineno) - node.lineno + 1
            )
    return found


def cpp_lanes() -> dict[str, int]:
    """Hand-written lane headers, and ``*_lane`` definitions in the units."""
    found = {
        str(p.relative_to(KERNELS)): len(p.read_text().splitlines())
        for p in sorted(INCLUDE.glob("*.h"))
        if p.name.endswith(("_lanes.h", "_values.h"))
    }
    for unit in sorted([*CSRC.glob("*_cpu.cpp"), *CSRC.glob("*_cuda.cu")]):
        lines = unit.read_text().splitlines()
        for i, line in enumerate(lines):
            if _LANE_DEF.match(line):
                end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("}")), i)
                found[f"{unit.relative_to(KERNELS)}:{i + 1}"] = end - i + 1
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    py: dict[str, int] = {}
    for group in sorted(d for d in OPS.iterdir() if d.is_dir() and not d.name.startswith("_")):
        py.update(python_hooks(group))
    cpp = cpp_lanes()
    total = sum(py.values()) + sum(cpp.values())
    if args.json:
        print(json.dumps({"python": py, "cpp": cpp, "total": total}, indent=2))
        return 0
    for name, n in sorted({**py, **cpp}.items()):
        print(f"{n:6d}  {name}")
    print(f"{sum(py.values()):6d}  Python hooks\n{sum(cpp.values()):6d}  C++ lanes\n{total:6d}  total")
    return 0


if __name__ == "__main__":
    sys.exit(main())
