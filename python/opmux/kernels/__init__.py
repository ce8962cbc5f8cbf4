"""The torch-free metadata layer of opmux kernels: specs, registry, selection, explain.

Importing this imports no torch, triton, tvm_ffi or compiled library; the ops live in
``opmux.kernels.ops`` and load their code on first use.
"""

from __future__ import annotations

from ._dispatch_state import refresh, use_backends
from .errors import BackendUnavailable, FallbackError
from .explain import explain
from .registry import all_ops, get, groups, verify_targets
from .selector import Decision, Facts, Reason, Selection, select
from .spec import BackendSpec, OpSpec, Requirement

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
    "explain",
    "get",
    "groups",
    "refresh",
    "select",
    "use_backends",
    "verify_targets",
]
