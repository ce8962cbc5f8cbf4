"""The parity cases of the registered ops: test data, kept with the tests (not in the wheel).

``OpSpec.samples`` is ``<group>:<prefix>``: ``samples/<group>.py`` (beside this file) defines
``<prefix>_samples(device, dtype) -> list[Sample]`` and ``<prefix>_invalid(device)``, the
``(name, args, kwargs, exception type, message pattern)`` cases every backend must reject.
``OPMUX_PARITY_SAMPLES`` (folders, ``os.pathsep``-separated) is searched first, for groups
that live outside this tree (tests/unit/test_adding_an_op.py's toy group).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent / "samples"


@functools.cache
def _module(group: str) -> ModuleType:
    extra = [Path(p) for p in os.environ.get("OPMUX_PARITY_SAMPLES", "").split(os.pathsep) if p]
    for folder in (*extra, HERE):
        path = folder / f"{group}.py"
        if path.is_file():
            spec = importlib.util.spec_from_file_location(f"opmux_parity_samples_{group}", path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    raise FileNotFoundError(f"no parity samples for group {group!r} in {[*extra, HERE]}")


def _fn(op: Any, kind: str) -> Callable[..., Any]:
    group, _, prefix = op.samples.partition(":")
    return getattr(_module(group), f"{prefix}_{kind}")  # type: ignore[no-any-return]


def samples(op: Any) -> Callable[..., Any]:
    """``<prefix>_samples`` of the op spec ``op``."""
    return _fn(op, "samples")


def invalid(op: Any) -> Callable[..., Any]:
    """``<prefix>_invalid`` of the op spec ``op``."""
    return _fn(op, "invalid")
