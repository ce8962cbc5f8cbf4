"""Measured selection: the backend a tuned ``select`` table names for a call's shape class.

An op whose tuned-config schema (``tuned.SCHEMAS``) has a ``select`` entry and a
``call_problem`` gets its backend order per call from measurements, not from a guess: the
table for (device, shape) (or the device's size classes by M over every tuned shape) names the
backend measured fastest at the nearest M, and dispatch tries that one first, then the
device's declared priority. ``explain`` and the trace say which file decided. Torch-free.
"""

from __future__ import annotations

from typing import Any

from . import tuned

__all__ = ["measured_op", "preferred"]

_MEMO: dict[tuple[str, str, tuple[int, ...], int, Any], tuple[str, str] | None] = tuned.memo()
_MAX = 1 << 14


def measured_op(op: str) -> bool:
    """Whether ``op`` has measured selection tables (checked once, when its dispatch is built)."""
    schema = tuned.SCHEMAS.get(op)
    return schema is not None and "select" in schema.entries and schema.call_problem is not None


def preferred(op: str, device: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, str] | None:
    """(backend, why) measured fastest for this call on ``device``, or None (no table: the
    declared priority decides; arguments the contract will refuse: it speaks first)."""
    schema = tuned.SCHEMAS[op]
    problem = schema.call_problem
    assert problem is not None  # measured_op
    try:
        name = tuned.device_name(device)
        if not tuned.has_tables(op, "select", name):  # none for this device: nothing to key
            return None
        shape, m = problem(*args, **kwargs)
        # an op with several forms has select tables per form (moe.fused_experts: bf16 / fp8)
        tags = schema.call_tags(*args, **kwargs) if schema.call_tags is not None else None
    except Exception:  # not tensors, a 0-d a, ...: the contract names the problem
        return None
    memo = (op, name, shape, m, tags)
    if memo in _MEMO:
        return _MEMO[memo]
    backend = tuned.lookup(op, "select", name, shape, m, tags).get("backend")
    found = None
    if backend:
        dims = ", ".join(f"{d}={v}" for d, v in zip(schema.shape, shape, strict=True))
        where = tuned.source(op, "select", name, shape, m, tags)
        found = (backend, f"measured fastest on {name} for M={m}, {dims} (nearest M of {where})")
    if len(_MEMO) >= _MAX:
        _MEMO.clear()
    _MEMO[memo] = found
    return found
