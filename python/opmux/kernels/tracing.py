"""Call tracing: which backend ran for each op call, and what fell back.

Off by default (``OPMUX_TRACE=1`` or ``enable()``). While on, every call takes the
slow dispatch path so that it can be recorded; the fast path stays untouched when off.
"""

from __future__ import annotations

import contextlib
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

__all__ = [
    "CallRecord",
    "capture",
    "counters",
    "disable",
    "enable",
    "enabled",
    "fallbacks",
    "records",
    "reset",
]

_MAX_RECORDS = 10_000


@dataclass(frozen=True)
class CallRecord:
    op: str
    backend: str
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    device: str
    fallback_from: str | None = None


class _State:
    enabled: bool | None = None  # None: not read from OPMUX_TRACE yet
    records: ClassVar[deque[CallRecord]] = deque(maxlen=_MAX_RECORDS)
    ran: ClassVar[Counter[tuple[str, str]]] = Counter()
    fell_back: ClassVar[Counter[tuple[str, str, str, str]]] = Counter()


def enabled() -> bool:
    if _State.enabled is None:
        from . import config

        _State.enabled = bool(config.trace())
    return _State.enabled


def _invalidate() -> None:
    from . import _dispatch_state as fused_op_state

    fused_op_state.invalidate_all()


def enable() -> None:
    _State.enabled = True
    _invalidate()


def disable() -> None:
    _State.enabled = False
    _invalidate()


def record(rec: CallRecord) -> None:
    _State.records.append(rec)
    _State.ran[(rec.op, rec.backend)] += 1


def record_fallback(op: str, wanted: str, chosen: str, reason: str) -> None:
    _State.fell_back[(op, wanted, chosen, reason)] += 1


def records() -> list[CallRecord]:
    return list(_State.records)


def counters() -> dict[tuple[str, str], int]:
    """(op, backend) -> calls, counted while tracing was on."""
    return dict(_State.ran)


def fallbacks() -> dict[tuple[str, str, str, str], int]:
    """(op, wanted backend, chosen backend, reason) -> count; counted always."""
    return dict(_State.fell_back)


def reset() -> None:
    _State.records.clear()
    _State.ran.clear()
    _State.fell_back.clear()


@contextlib.contextmanager
def capture() -> Iterator[list[CallRecord]]:
    """Trace inside the block; yields the list that receives this block's records."""
    before = _State.enabled
    start = len(_State.records)
    out: list[CallRecord] = []
    enable()
    try:
        yield out
    finally:
        out.extend(list(_State.records)[start:])
        _State.enabled = before
        _invalidate()
