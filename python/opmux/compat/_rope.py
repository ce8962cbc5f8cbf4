"""Rotary embedding for the compat modules: opmux's kernel, ``key=None`` accepted."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["rope"]


def rope(
    positions: Tensor, query: Tensor, key: Tensor | None, head_size: int, cos_sin_cache: Tensor, is_neox: bool
) -> None:
    """In place on ``query`` (and ``key`` when given: the op takes ``key=None``)."""
    from opmux.kernels.ops import rope as ops

    ops.rotary_embedding(positions, query, key, head_size, cos_sin_cache, bool(is_neox))
