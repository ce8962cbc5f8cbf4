"""Process-wide dispatch state that must stay torch-free: overrides and live ops.

``OPMUX_KERNEL_BACKEND`` and ``OPMUX_FALLBACK`` are read (and validated) once, at the first
dispatch, and cached: reading the environment on every call would cost more than the whole
fast path, and a typo must fail at the first call, not at the first fallback. ``refresh()``
re-reads them; ``config.scope`` does so on entry and exit.

``use_backends`` is scoped to the thread or asyncio task that opened it (a ``ContextVar``).
The ops' fast-path caches are shared by every thread, so while any block is open anywhere
they stay empty and nothing is remembered: every call takes the full selection, which reads
the caller's own context. A generation counter, bumped whenever a block opens or closes,
lets a dispatch that raced with that change drop what it was about to cache, so nothing
chosen inside a block outlives it.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import Protocol

from . import config, registry
from .overrides import Overrides, forced_backend, parse_overrides

__all__ = [
    "backends_for",
    "cacheable",
    "forced",
    "generation",
    "invalidate_all",
    "policy",
    "refresh",
    "track",
    "use_backends",
]


class _Invalidatable(Protocol):
    def invalidate(self) -> None: ...


_live: weakref.WeakSet[_Invalidatable] = weakref.WeakSet()
_lock = threading.Lock()
_env: Overrides | None = None
_policy: str | None = None
_context: contextvars.ContextVar[tuple[Overrides, ...]] = contextvars.ContextVar(
    "opmux_use_backends", default=()
)
_open_blocks = 0
_generation = 0


def track(op: _Invalidatable) -> None:
    _live.add(op)


def invalidate_all() -> None:
    for op in list(_live):
        op.invalidate()


def _bump() -> None:
    global _generation
    with _lock:
        _generation += 1
    invalidate_all()


def generation() -> int:
    """Read before a selection; pass to :func:`cacheable` before caching its result."""
    return _generation


def cacheable(gen: int) -> bool:
    """May a choice selected under generation ``gen`` go into the shared fast-path cache?
    No while any ``use_backends`` block is open, nor if one opened or closed since ``gen``.
    A caller checks again after caching, and drops its cache when this turned False."""
    return _open_blocks == 0 and _generation == gen


def _env_overrides() -> Overrides:
    global _env, _policy
    if _env is None:
        with _lock:
            text = config.kernel_backend()
            parsed = parse_overrides(text, known=registry.known_backends())
            _policy = config.fallback()  # validated now: a typo fails the first call
            _env = parsed
    return _env


def policy() -> str:
    """``OPMUX_FALLBACK``, validated at the first dispatch and cached like the overrides."""
    _env_overrides()
    return _policy or config.fallback()


def _stale() -> None:
    global _env, _policy
    _env = None
    _policy = None
    from . import facts

    facts.reset()
    for op in list(_live):  # the settings that found the kernels (cache dir, JIT) may have changed
        getattr(op, "forget_kernels", lambda: None)()
    _bump()


def refresh() -> None:
    """Re-read OPMUX_KERNEL_BACKEND and OPMUX_FALLBACK (validated now) and drop every
    cached choice. Call it after changing ``os.environ`` in-process; ``config.scope`` does
    it for you."""
    _stale()
    _env_overrides()


config.on_change(_stale)


def backends_for(op: str) -> tuple[str, ...] | None:
    """The forced backends for ``op``: this context's innermost ``use_backends`` block first,
    then the environment."""
    env = _env_overrides()  # also validates OPMUX_FALLBACK at the first call
    for ov in reversed(_context.get()):
        hit = ov.backends_for(op)
        if hit is not None:
            return hit
    return env.backends_for(op)


def forced(op: str, value: str | Sequence[str]) -> tuple[str, ...]:
    """Validate a per-call ``backend=`` value against the op's backends."""
    _env_overrides()  # the settings are validated at the first call, whichever path it takes
    return forced_backend(value, op=op, known_backends=(*registry.get(op).backend_names, "reference"))


@contextlib.contextmanager
def use_backends(text: str) -> Iterator[Overrides]:
    """Force backends inside the block, in the same grammar as OPMUX_KERNEL_BACKEND.

    Validated on entry: ``use_backends("layernorm.rmsnorm=tritn")`` raises ValueError
    naming ``tritn`` and the valid backends before any op runs. Scoped to this thread or
    asyncio task: other threads keep their own choice, and none of the block's choices is
    cached past its end.
    """
    global _open_blocks
    ov = parse_overrides(text, known=registry.known_backends())
    token = _context.set((*_context.get(), ov))
    with _lock:
        _open_blocks += 1
    _bump()
    try:
        yield ov
    finally:
        _context.reset(token)
        with _lock:
            _open_blocks -= 1
        _bump()
