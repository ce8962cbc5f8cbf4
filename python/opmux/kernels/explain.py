"""Explain: which backend runs for an op on this machine, and why each other one does not."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .selector import Selection

# The package re-exports ``explain`` eagerly (a submodule of the same name would otherwise shadow
# it), so this module imports the rest of the metadata layer only when called.

__all__ = ["explain", "op_instance"]


def op_instance(name: str) -> Any:
    """The live ``FusedOp`` of ``name`` (imports torch)."""
    from . import registry
    from .fused_op import _INSTANCES, instance
    from .ops._catalog import decls

    spec = registry.get(name)
    if name in _INSTANCES:  # also ops made outside a group (tests, benchmarks)
        return _INSTANCES[name]
    module = importlib.import_module(f"opmux.kernels.ops.{spec.group}.op")
    for decl in decls(module):
        if decl.name == name:
            return instance(decl)
    raise LookupError(f"{name}: not declared in {module.__name__}")


def explain(
    op: str,
    *args: Any,
    device: str | None = None,
    dtype: str | None = None,
    backend: str | None = None,
    numel: int | None = None,
    **kwargs: Any,
) -> Selection:
    """The selection for ``op``: with arguments, exactly what a call with them would do;
    without, for ``device`` (default: this machine's accelerator, else cpu) and ``dtype``
    (default bfloat16 on accelerators, float32 on cpu), and ``numel`` elements of the key
    tensor where the op's priority depends on size (default: the size-independent order)."""
    from . import _dispatch_state, facts, registry
    from .selector import select

    if args:
        return op_instance(op).select_for(args, kwargs, backend)  # type: ignore[no-any-return]
    spec = registry.get(op)
    arch = None
    if device is None or device != "cpu":
        from . import platform

        plat = platform.detect()
        device = device or plat.device_type
        if device == plat.device_type:
            arch = plat.arch
    dtype = dtype or ("float32" if device == "cpu" else "bfloat16")
    forced = _dispatch_state.forced(op, backend) if backend else _dispatch_state.backends_for(op)
    return select(spec, facts.detect_facts(device, arch), dtype=dtype, forced=forced, numel=numel)
