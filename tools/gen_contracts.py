"""Write every op group's ``_contracts.py`` (its Python checks) and its C++ serving lanes
(``jit/include/opmux/contracts/<group>.h`` and ``<group>_<device>_lanes.inc``) from the contracts
its ``op.py`` declares, and its ``_entrypoints.py`` (the public, bound and library-op functions
of every op it declares, ``ops/_entry_codegen.py``).

    python tools/gen_contracts.py          # rewrite the files that changed
    python tools/gen_contracts.py --check  # exit 1, naming them, when any is stale

``nox -s contracts`` runs the first; ``tests/unit/test_contracts.py`` the second's check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def expected(package: Path = ROOT / "python" / "opmux") -> dict[Path, str]:
    """path -> the text each generated file should have (``_contracts.py``: groups with contracts;
    ``_entrypoints.py``: every group), for the ``opmux`` package at ``package`` (the tree's by
    default)."""
    sys.path.insert(0, str(package.parent))
    import importlib

    from opmux.kernels.ops._catalog import decls
    from opmux.kernels.ops._contract_codegen import render_group
    from opmux.kernels.ops._contract_cpp import render_entries, render_header
    from opmux.kernels.ops._decl import Decl
    from opmux.kernels.ops._entry_codegen import render_group as render_entrypoints

    ops = package / "kernels" / "ops"
    out: dict[Path, str] = {}
    entry: dict[Path, dict[str, Decl]] = {}
    for folder in sorted(p for p in ops.iterdir() if (p / "op.py").is_file()):
        found = decls(importlib.import_module(f"opmux.kernels.ops.{folder.name}.op"))
        if any(d.contract is not None for d in found):
            out[folder / "_contracts.py"] = render_group(found)
        # an op's entry points live with its reference (where fused_op looks for them)
        for d in found:
            home = ops / d.spec.reference.partition(":")[0].split(".")[3]
            entry.setdefault(home / "_entrypoints.py", {})[d.name] = d
        include = package / "kernels" / "jit" / "include" / "opmux" / "contracts"
        header = render_header(folder.name, found)
        if header is not None:
            out[include / f"{folder.name}.h"] = header
            for device in ("cpu", "cuda"):
                entries = render_entries(folder.name, device, found)
                assert entries is not None
                out[include / f"{folder.name}_{device}_lanes.inc"] = entries
    _load_rendered_contracts(out)
    out |= {path: render_entrypoints(found.values()) for path, found in entry.items()}
    return out


def _load_rendered_contracts(out: dict[Path, str]) -> None:
    """Rendering the entry points reads each group's ``_contracts`` module (``Decl.outputs``):
    load the text just rendered as that module, in memory (nothing written), so they follow the
    declarations of this run, not a stale file (or none yet: a new group) in one pass."""
    import types

    for path, text in out.items():
        if path.name != "_contracts.py":
            continue
        name = f"opmux.kernels.ops.{path.parent.name}._contracts"
        module = types.ModuleType(name)
        module.__file__ = str(path)
        module.__package__ = name.rpartition(".")[0]
        exec(compile(text, str(path), "exec"), module.__dict__)
        sys.modules[name] = module


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--check", action="store_true", help="only report stale files (exit 1)")
    p.add_argument(
        "--package", type=Path, default=ROOT / "python" / "opmux", help="the opmux package (%(default)s)"
    )
    a = p.parse_args(argv)
    want = expected(a.package.resolve())
    stale = [path for path, text in want.items() if not path.is_file() or path.read_text() != text]
    if a.check:
        for path in stale:
            print(f"stale: {path} (run: python tools/gen_contracts.py)", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(want[path])
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
