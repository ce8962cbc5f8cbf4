"""What the generated entry points (``ops/<group>/_entrypoints.py``) read besides their op's
tables: torch's per-call primitives and the contract's raisers, under the names the generated
text uses.

Kept apart from ``fused_op`` so the generated modules import only this (and torch), never the
live ops: ``fused_op`` imports them, not the reverse.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import BuiltinFunctionType, SimpleNamespace
from typing import Any

from . import _checks
from ._torch import torch

__all__ = [
    "ALIAS",
    "BUMP",
    "COMPILER",
    "DYNAMO",
    "DYNAMO_ON",
    "ENTRY",
    "GRAD",
    "NO_GRAD",
    "NO_LANE",
    "NO_LANES",
    "OVERLAPS",
    "SELF",
    "TENSOR",
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

# The public functions' torch.compile check, ``DYNAMO_ON[0] and DYNAMO() or
# COMPILER._is_compiling_flag``: is_dynamo_compiling is a constant False in eager that dynamo folds
# to True while it traces; the flag is what torch.export sets without dynamo. A torch without
# either: is_compiling (which dynamo folds too) and no flag.
if hasattr(torch.compiler, "is_dynamo_compiling") and hasattr(torch.compiler, "_is_compiling_flag"):
    DYNAMO: Callable[[], bool] = torch.compiler.is_dynamo_compiling
    COMPILER: Any = torch.compiler
else:
    DYNAMO = torch.compiler.is_compiling
    COMPILER = SimpleNamespace(_is_compiling_flag=False)

#: ``[False]`` until torch._dynamo is imported: nothing can trace a public function before, so
#: an eager call skips the is_dynamo_compiling call (a Python call, 1-2% of a CPU default call);
#: ``_DynamoWatch`` sets it as dynamo's import begins, before dynamo loads
DYNAMO_ON = ["torch._dynamo" in sys.modules]


class _DynamoWatch:
    """On ``sys.meta_path``, finding nothing: it sees torch._dynamo's import begin. It stays there
    (the import system iterates the list it would leave: the next finder would be skipped)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "torch._dynamo":
            DYNAMO_ON[0] = True


if not DYNAMO_ON[0]:
    sys.meta_path.insert(0, _DynamoWatch())
