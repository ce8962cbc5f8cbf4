"""Exceptions that carry fields and a hint, and survive pickling (for worker processes)."""

from __future__ import annotations

from typing import Any

__all__ = ["BackendUnavailable", "CallRefused", "CommError", "FallbackError"]


class BackendUnavailable(RuntimeError):
    """A backend cannot run here (library missing, compile failed, JIT off).

    Raised by backend glue on first use; dispatch catches it, records the backend as
    failed and applies the fallback policy. Bad *input* is a ValueError/TypeError instead.
    """

    def __init__(self, backend: str, detail: str) -> None:
        super().__init__(f"{backend}: {detail}")
        self.backend = backend
        self.detail = detail

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.backend, self.detail))


class CallRefused(BackendUnavailable):
    """A backend that runs here declines *this call* (what its data asks: a block table naming a
    block outside the cache, a shape its vendor kernels lack). Dispatch runs the call on the next
    backend and keeps this one for later calls; a plain BackendUnavailable is remembered instead
    (the backend is off until a refresh)."""


class FallbackError(RuntimeError):
    """The wanted backend cannot run and ``OPMUX_FALLBACK=error`` forbids falling back."""

    def __init__(self, op: str, wanted: str, reason: str, trace: str) -> None:
        hint = "set OPMUX_FALLBACK=warn to fall back, or choose a backend that can run (see the trace)"
        super().__init__(f"{op}: backend {wanted!r} cannot run ({reason}); {hint}\n{trace}")
        self.op, self.wanted, self.reason, self.trace = op, wanted, reason, trace

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.op, self.wanted, self.reason, self.trace))


class CommError(RuntimeError):
    """A ``comm`` op's collective failed: a peer left the call, never joined it within
    ``OPMUX_COMM_TIMEOUT``, or the group's backend refused it."""

    def __init__(self, op: str, group: str, rank: int, world: int, cause: str) -> None:
        super().__init__(
            f"{op}: the collective on group {group!r} (rank {rank} of {world}) failed: {cause}. "
            "A peer that died or did not join the call within OPMUX_COMM_TIMEOUT fails every rank; "
            "the group cannot be used again (create a new one)"
        )
        self.op, self.group, self.rank, self.world, self.cause = op, group, rank, world, cause

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.op, self.group, self.rank, self.world, self.cause))
