"""The torch-free metadata layer of opmux kernels: specs, registry, selection, explain.

Importing this imports no torch, triton, tvm_ffi or compiled library, and nothing of its own
until a name is used: the names below load their module on first access (a module
``__getattr__``), so ``import opmux.kernels.ops`` stays cheap (the host path starts at import).
The ops live in ``opmux.kernels.ops`` and load their code on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# eager: a submodule import (``opmux.kernels.explain``) would otherwise set the package's
# ``explain`` to the module; explain.py imports nothing at import time
from .explain import explain

if TYPE_CHECKING:
    from ._dispatch_state import refresh, use_backends
    from ._seeds import clear_cache, get_kernel, select_kernel
    from .errors import BackendUnavailable, FallbackError
    from .registry import all_ops, get, groups, verify_targets
    from .selector import Decision, Facts, Reason, Selection, select
    from .spec import BackendSpec, OpSpec, Requirement

_FROM = {
    "refresh": "_dispatch_state",
    "use_backends": "_dispatch_state",
    "clear_cache": "_seeds",
    "get_kernel": "_seeds",
    "select_kernel": "_seeds",
    "BackendUnavailable": "errors",
    "FallbackError": "errors",
    "all_ops": "registry",
    "get": "registry",
    "groups": "registry",
    "verify_targets": "registry",
    "Decision": "selector",
    "Facts": "selector",
    "Reason": "selector",
    "Selection": "selector",
    "select": "selector",
    "BackendSpec": "spec",
    "OpSpec": "spec",
    "Requirement": "spec",
}

__all__ = [
    "BackendSpec",
    "BackendUnavailable",
    "Decision",
    "Facts",
    "FallbackError",
    "OpSpec",
    "Reason",
    "Requirement",
    "Selection",
    "all_ops",
    "clear_cache",
    "explain",
    "get",
    "get_kernel",
    "groups",
    "refresh",
    "select",
    "select_kernel",
    "use_backends",
    "verify_targets",
]


def __getattr__(name: str) -> Any:
    module = _FROM.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later accesses are plain lookups
    return value
