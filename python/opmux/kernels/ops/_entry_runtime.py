"""What the generated entry points (``ops/<group>/_entrypoints.py``) read besides their op's
tables: torch's per-call primitives under the names the generated text uses, the contract's
raisers, and the two types that carry an op's tables in and its functions out.

Kept apart from ``fused_op`` so the generated modules import only this (and torch), never the
live ops: ``fused_op`` imports them, not the reverse.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import BuiltinFunctionType, SimpleNamespace
from typing import Any

from . import _checks
from ._torch import torch

__all__ = [
    "ALIAS",
    "BUMP",
    "COMPILER",
    "DYNAMO",
    "ENTRY",
    "GRAD",
    "NO_GRAD",
    "NO_LANE",
    "NO_LANES",
    "OVERLAPS",
    "SELF",
    "TENSOR",
    "Entrypoints",
    "Tables",
]

GRAD = torch.is_grad_enabled
NO_GRAD = _checks.no_grad
BUMP = torch._C._increment_version
OVERLAPS = torch._C._overlaps
ALIAS = _checks.alias
SELF = _checks.self_overlap
TENSOR = torch.Tensor
#: what ``torch_kernels.lane_entry`` returns (a C function taking the lane's arguments)
ENTRY = BuiltinFunctionType
#: a lane table with no entry, and a forced call's lane where none is cached
NO_LANES: dict[Any, Any] = {}
NO_LANE = (None, None)

# The public functions' torch.compile check, ``DYNAMO() or COMPILER._is_compiling_flag``:
# is_dynamo_compiling is a constant False in eager (one call) that dynamo folds to True while it
# traces; the flag is what torch.export sets without dynamo. A torch without either: is_compiling
# (which dynamo folds too) and no flag.
if hasattr(torch.compiler, "is_dynamo_compiling") and hasattr(torch.compiler, "_is_compiling_flag"):
    DYNAMO: Callable[[], bool] = torch.compiler.is_dynamo_compiling
    COMPILER: Any = torch.compiler
else:
    DYNAMO = torch.compiler.is_compiling
    COMPILER = SimpleNamespace(_is_compiling_flag=False)


@dataclass(frozen=True)
class Tables:
    """One op's runtime state as its generated functions see it (``fused_op.FusedOp`` owns it):
    filled and cleared in place, never rebound, so the closures over it stay current."""

    op: str
    check: Callable[..., tuple[tuple[Any, ...], Any]]
    values: Callable[..., None] | None
    outputs: Callable[..., tuple[tuple[Any, ...], Any]] | None
    #: library op name -> its OpOverload (what the compile path calls)
    lib: dict[str, Any]
    #: the default call's caches and their size-class thresholds (1 << 62 where there is none)
    cpu: dict[Any, Any]
    cuda: dict[Any, Any]
    cpu_t: int
    cuda_t: int
    #: (backend, is_cpu, dtype) -> (kernel, PDL flag)
    forced: dict[Any, Any]
    #: the full dispatch: ``dispatch(args, kwargs, backend, enable_pdl)``
    dispatch: Callable[..., Any]
    lane_cpu: dict[Any, Any]
    lane_cuda: dict[Any, Any]
    lane_forced: dict[Any, Any]
    #: ``[True]`` while the library ops' C++ kernels / the default calls' entries are pending,
    #: and what a call then runs (``fused_op._bridge_poll`` / ``_entry_poll``)
    bridge_pending: list[bool]
    bridge_poll: Callable[[], None]
    entry_pending: list[bool]
    entry_poll: Callable[[], None]


@dataclass(frozen=True)
class Entrypoints:
    """What ``make_<op>`` returns: the public function, and per library op its Python kernel
    and fake."""

    public: Callable[..., Any]
    library: dict[str, tuple[Callable[..., Any], Callable[..., Any]]]
