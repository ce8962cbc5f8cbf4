"""What makes a folder under ``ops/`` an op group: its ``op.py`` declarations, read by convention.

``ops/<group>/__init__.py`` is two lines (``__all__, __getattr__ = exports(__name__)``): the
public functions are built from the declarations on first attribute access, so importing a
group imports no torch and loads no kernel.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ._catalog import decls

__all__ = ["exports"]


def _declaration_module(package: str) -> ModuleType:
    return importlib.import_module(f"{package}.op")


def exports(package: str) -> tuple[list[str], Callable[[str], Any]]:
    """``(__all__, __getattr__)`` for the group package ``package``."""
    by_name = {d.short_name: d for d in decls(_declaration_module(package))}

    def __getattr__(name: str) -> Any:
        decl = by_name.get(name)
        if decl is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}; ops: {', '.join(by_name)}")
        from ..fused_op import instance  # imports torch: only when an op is first used

        public = instance(decl).public
        # later ``group.op`` lookups are plain module-dict hits, not this hook (~1 us per call on
        # the CPU); the object is the one users hold, for the life of the process
        setattr(sys.modules[package], name, public)
        return public

    return sorted(by_name), __getattr__
