"""The operators, one subpackage per group.

Importing this package (or a group) is cheap: groups load their torch code on first
attribute access, and no backend (triton, tvm-ffi, a compiled library) loads before a
call needs it.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._catalog import GROUPS

__all__ = list(GROUPS)


def __getattr__(name: str) -> Any:
    if name in GROUPS:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}; op groups: {', '.join(GROUPS)}")
