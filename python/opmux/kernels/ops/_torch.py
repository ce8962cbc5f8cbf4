"""``torch``, imported on first attribute access.

Op declarations (``ops/<group>/op.py``) hold their reference, argument contract and torch
backend next to the metadata the torch-free registry reads, so they must import without
torch. They write ``torch.x`` as usual against this object: the first access imports torch
and copies its namespace in, so later accesses are plain attribute lookups (no proxy call
on the hot path); names torch only creates later fall through to the module.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["torch"]


class _LazyModule:
    def __init__(self, name: str) -> None:
        self.__dict__["_name"] = name

    def __getattr__(self, attr: str) -> Any:
        # only reached for names not yet copied in: the first access, or a late submodule
        module = importlib.import_module(self.__dict__["_name"])
        if "_loaded" not in self.__dict__:
            self.__dict__.update(vars(module))
            self.__dict__["_loaded"] = True
        return getattr(module, attr)

    def __repr__(self) -> str:
        state = "loaded" if "_loaded" in self.__dict__ else "not loaded yet"
        return f"<lazy module {self.__dict__['_name']!r} ({state})>"


torch: Any = _LazyModule("torch")
