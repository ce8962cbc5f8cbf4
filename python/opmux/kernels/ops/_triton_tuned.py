"""Launching a Triton kernel on a tuned table's entry. A table's checks cover its keys, not the
chip's limits: an entry the compiler refuses here (Triton's ``OutOfResources``: shared memory,
registers; a user's table written for a larger part, say) falls back to the op's default with a
warning (``tuned.reject``, which also serves that default to later calls of the same shape), so
a bad entry costs one failed compile, never the call."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from triton.runtime.errors import OutOfResources

from opmux.kernels import tuned

__all__ = ["launch_tuned"]

R = TypeVar("R")


def launch_tuned(
    launch: Callable[[Mapping[str, Any]], R],
    config: Mapping[str, Any],
    op: str,
    backend: str,
    device_name: str,
    shape: tuple[int, ...],
    m: int,
    tags: tuned.Tags | None = None,
) -> R:
    """``launch(config)``; where the compiler refuses ``config``, ``launch`` of the default (the
    launch must write its outputs whole, as a retry runs it again from the start). A refused
    default is a bug of the default: it raises."""
    try:
        return launch(config)
    except OutOfResources as exc:
        default = tuned.reject(op, backend, device_name, shape, m, tags, config, exc)
        if dict(default) == dict(config):
            raise
    return launch(default)  # outside the handler: the first try's frames (buffers) are freed
