"""Rotary embedding for the compat modules: opmux's kernel, ``key=None`` accepted."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["rope"]


def rope(
    positions: Tensor,
    query: Tensor,
    key: Tensor | None,
    head_size: int,
    cos_sin_cache: Tensor,
    is_neox: bool,
    vllm_rounding: bool = False,
) -> None:
    """In place on ``query`` (and ``key`` when given: the op takes ``key=None``); ``vllm_rounding``:
    the op's mode that rounds as vLLM's kernel (cos / sin, each product and sum in the input dtype)."""
    from opmux.kernels.ops import rope as ops

    ops.rotary_embedding(positions, query, key, head_size, cos_sin_cache, bool(is_neox), vllm_rounding)
