"""Rotary embedding for the compat modules: opmux's kernel, ``key=None`` accepted."""

from __future__ import annotations

from typing import TYPE_CHECKING

from opmux.kernels.ops._torch import torch

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["rope"]


def rope(
    positions: Tensor, query: Tensor, key: Tensor | None, head_size: int, cos_sin_cache: Tensor, is_neox: bool
) -> None:
    """In place on ``query`` (and ``key`` when given). Without a key the op rotates a key with
    no heads (``[*positions.shape, 0, head_size]``): nothing extra is read or written."""
    from opmux.kernels.ops import rope as ops

    if key is None:
        key = torch.empty((*positions.shape, 0, head_size), dtype=query.dtype, device=query.device)
    ops.rotary_embedding(positions, query, key, head_size, cos_sin_cache, bool(is_neox))
