"""Process-wide dispatch state that must stay torch-free: overrides and live ops.

``OPMUX_KERNEL_BACKEND`` is read once, at the first dispatch, and cached: reading the
environment on every call would cost more than the whole fast path. ``refresh()``
re-reads it (and ``config.scope`` callers should call it after changing the variable).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import Protocol

from . import config, registry
from .overrides import Overrides, forced_backend, parse_overrides

__all__ = ["backends_for", "forced", "invalidate_all", "refresh", "track", "use_backends"]


class _Invalidatable(Protocol):
    def invalidate(self) -> None: ...


_live: weakref.WeakSet[_Invalidatable] = weakref.WeakSet()
_lock = threading.Lock()
_env: Overrides | None = None
_context: list[Overrides] = []


def track(op: _Invalidatable) -> None:
    _live.add(op)


def invalidate_all() -> None:
    for op in list(_live):
        op.invalidate()


def _env_overrides() -> Overrides:
    global _env
    if _env is None:
        with _lock:
            text = config.kernel_backend()
            _env = parse_overrides(text, known=registry.known_backends())
    return _env


def _stale() -> None:
    global _env
    _env = None
    from . import facts

    facts.reset()
    invalidate_all()


def refresh() -> None:
    """Re-read OPMUX_KERNEL_BACKEND (validated now) and drop every cached choice.

    Call it after changing ``os.environ`` in-process; ``config.scope`` does it for you.
    """
    _stale()
    _env_overrides()


config.on_change(_stale)


def backends_for(op: str) -> tuple[str, ...] | None:
    """The forced backends for ``op``: the innermost ``use_backends`` block first, then the env."""
    for ov in reversed(_context):
        hit = ov.backends_for(op)
        if hit is not None:
            return hit
    return _env_overrides().backends_for(op)


def forced(op: str, value: str | Sequence[str]) -> tuple[str, ...]:
    """Validate a per-call ``backend=`` value against the op's backends."""
    return forced_backend(value, op=op, known_backends=(*registry.get(op).backend_names, "reference"))


@contextlib.contextmanager
def use_backends(text: str) -> Iterator[Overrides]:
    """Force backends inside the block, in the same grammar as OPMUX_KERNEL_BACKEND.

    Validated on entry: ``use_backends("layernorm.rmsnorm=tritn")`` raises ValueError
    naming ``tritn`` and the valid backends before any op runs.
    """
    ov = parse_overrides(text, known=registry.known_backends())
    _context.append(ov)
    invalidate_all()
    try:
        yield ov
    finally:
        _context.remove(ov)
        invalidate_all()
