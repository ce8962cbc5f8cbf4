"""Check that an installed opmux finds everything it names inside site-packages.

Run with a venv's interpreter from a temporary directory:

    <venv>/bin/python -I tools/find_spec_check.py

1. ``opmux.kernels.registry.verify_targets()``: every registered backend target resolves through
   ``importlib.util.find_spec`` and its attribute chain.
2. ``opmux.kernels.jit.KERNEL_PATH`` lies inside site-packages, not in a checkout.
3. Every source named by the JIT module table (``opmux.kernels.jit.modules``) exists under it,
   and so does every ``#include "opmux/..."`` those sources reach.
"""

from __future__ import annotations

import importlib
import re
import sys
import sysconfig
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = ["includes_of", "main", "module_sources"]

INCLUDE = re.compile(r'^\s*#\s*include\s*"(opmux/[^"]+)"', re.M)


_MISSING = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")


def _missing_dependency(problem: str) -> bool:
    """Whether ``problem`` is an import of a module outside opmux that is not installed."""
    m = _MISSING.search(problem)
    return m is not None and m.group(1).split(".")[0] != "opmux"


def includes_of(
    source: Path, include_dir: Path, seen: set[Path] | None = None
) -> tuple[set[Path], list[str]]:
    """Every ``opmux/...`` header ``source`` reaches (transitively), and the ones missing."""
    seen = set() if seen is None else seen
    missing: list[str] = []
    for rel in INCLUDE.findall(source.read_text(encoding="utf-8", errors="replace")):
        header = include_dir / rel
        if not header.is_file():
            missing.append(f'{source.name} includes "{rel}", not found in {include_dir}')
        elif header not in seen:
            seen.add(header)
            missing += includes_of(header, include_dir, seen)[1]
    return seen, missing


def _entries(table: object) -> Iterable[tuple[str, object]]:
    if isinstance(table, Mapping):
        return table.items()
    return ((getattr(e, "name", str(e)), e) for e in table)  # a list of module specs


def module_sources(modules_mod: object) -> dict[str, list[str]]:
    """name -> sources of the JIT module table, whatever container the table module uses."""
    table = next(
        (
            getattr(modules_mod, a)
            for a in ("MODULES", "JIT_MODULES", "TABLE", "modules")
            if hasattr(modules_mod, a)
        ),
        None,
    )
    if table is None:
        raise LookupError(f"{modules_mod.__name__} has no MODULES table; attributes: {dir(modules_mod)}")
    out = {}
    for name, entry in _entries(table):
        sources = entry.get("sources") if isinstance(entry, dict) else getattr(entry, "sources", None)
        if sources is None:
            raise LookupError(f"JIT module {name!r} has no sources")
        out[str(name)] = [str(s) for s in sources]
    return out


def main() -> int:
    failures: list[str] = []
    site = [Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")]

    from opmux.kernels import registry

    n_ops = len(registry.all_ops())
    if n_ops == 0:
        failures.append("the registry has no ops: nothing to verify")
    try:
        result = registry.verify_targets()
    except Exception as exc:  # report, do not crash: the message is the finding
        failures.append(f"verify_targets() raised {type(exc).__name__}: {exc}")
    else:
        problems = [r for r in (result or []) if r] if not isinstance(result, (bool, int)) else []
        # A backend module that is in the wheel (find_spec found it) but imports an optional
        # dependency this venv lacks (triton, torch_npu) is not a packaging fault: say so, and
        # leave its attribute chain to an environment that has the dependency (parity-<target>).
        optional = [p for p in problems if _missing_dependency(str(p))]
        for p in optional:
            print(f"find-spec note: {p} (not a wheel fault: an optional dependency is absent here)")
        problems = [p for p in problems if p not in optional]
        failures += [f"verify_targets(): {p}" for p in problems]
        if isinstance(result, bool) and not result:
            failures.append("verify_targets() returned False")
        print(
            f"find-spec {'ok  ' if not problems else 'FAIL'} verify_targets(): {n_ops} ops, {len(problems)} problem(s)"
        )

    jit = importlib.import_module("opmux.kernels.jit")
    kernel_path = Path(jit.KERNEL_PATH).resolve()
    if not any(kernel_path.is_relative_to(s) for s in site):
        failures.append(f"KERNEL_PATH = {kernel_path} is not inside site-packages {site}")
    else:
        print(f"find-spec ok   KERNEL_PATH = {kernel_path}")

    modules = importlib.import_module("opmux.kernels.jit.modules")
    try:
        table = module_sources(modules)
    except LookupError as exc:
        failures.append(str(exc))
        table = {}
    n_headers: dict[str, int] = {}
    for name, sources in table.items():
        for src in sources:
            path = Path(src) if Path(src).is_absolute() else kernel_path / src
            if not path.is_file():
                alt = kernel_path / "csrc" / src
                path = alt if alt.is_file() else path
            if not path.is_file():
                failures.append(f"JIT module {name!r}: source {src} not found under {kernel_path}")
                continue
            if not path.resolve().is_relative_to(kernel_path):
                failures.append(f"JIT module {name!r}: source {path} is outside KERNEL_PATH {kernel_path}")
            headers, missing = includes_of(path, kernel_path / "include")
            failures += [f"JIT module {name!r}: {m}" for m in missing]
            n_headers[name] = n_headers.get(name, 0) + len(headers)
        bad = any(f"JIT module {name!r}" in f for f in failures)
        print(
            f"find-spec {'FAIL' if bad else 'ok  '} JIT module {name}: {', '.join(sources)} + {n_headers.get(name, 0)} opmux header(s)"
        )
    from opmux import _build_info

    aot_dir = kernel_path.parent / "aot"
    for lib in _build_info.BUILD_INFO.get("aot", []):
        ok = (aot_dir / lib).is_file()
        if not ok:
            failures.append(f"_build_info lists AOT library {lib}, not found in {aot_dir}")
        print(f"find-spec {'ok  ' if ok else 'FAIL'} AOT library {lib}")
    if not table and not failures:
        failures.append("the JIT module table is empty")
    for f in failures:
        print(f"FAIL {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
