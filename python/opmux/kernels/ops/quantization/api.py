"""Public quantization ops: eager calls dispatch directly; torch.compile sees torch library ops."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch

from .op import PerTokenGroupQuantFP8, PerTokenQuantFP8, _check_group, _check_per_token

__all__ = ["per_token_group_quant_fp8", "per_token_quant_fp8"]

_pt = PerTokenQuantFP8()
_pg = PerTokenGroupQuantFP8()
# bound once: dynamo folds this function to True while tracing; eager pays one call
_compiling = torch.compiler.is_compiling
Backend = str | Sequence[str] | None
_Pair = tuple[torch.Tensor, torch.Tensor]


@torch.library.custom_op("opmux::per_token_quant_fp8", mutates_args=())
def _per_token_op(x: torch.Tensor, scale_ub: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    return cast(_Pair, _pt(x, scale_ub))


@_per_token_op.register_fake
def _(x: torch.Tensor, scale_ub: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    _, q, s, _, _, _ = _check_per_token(x, scale_ub)
    return q, s


@torch.library.custom_op("opmux::per_token_group_quant_fp8", mutates_args=())
def _per_group_op(
    x: torch.Tensor, group_size: int, eps: float, column_major_scales: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    return cast(_Pair, _pg(x, group_size, eps, column_major_scales))


@_per_group_op.register_fake
def _(
    x: torch.Tensor, group_size: int, eps: float, column_major_scales: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    _, q, s, _, _ = _check_group(x, group_size, eps, column_major_scales)
    return q, s


def per_token_quant_fp8(
    x: torch.Tensor, scale_ub: torch.Tensor | None = None, *, backend: Backend = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token fp8 quantization of ``x`` ``[..., H]`` (float32/float16/bfloat16).

    Returns ``(q, scales)``: ``q`` float8_e4m3fn ``[..., H]``, ``scales`` float32 ``[..., 1]`` with
    ``scale = max(min(amax, scale_ub) / 448, 1 / (448 * 512))`` and ``q = e4m3(x / scale)``
    (round to nearest even, saturated to +-448), so ``q.float() * scales`` approximates ``x``.
    ``scale_ub`` (vLLM's upper bound) is an optional one-element float32 tensor on x's device.
    """
    fn = None if backend is not None or _compiling() else _pt.lookup(x)
    if fn is not None:  # the hot path: a cached backend, called directly
        return fn(x, scale_ub)
    if _compiling():
        return cast(_Pair, torch.ops.opmux.per_token_quant_fp8(x, scale_ub))
    return cast(_Pair, _pt(x, scale_ub, backend=backend))


def per_token_group_quant_fp8(
    x: torch.Tensor,
    group_size: int = 128,
    eps: float = 1e-10,
    column_major_scales: bool = False,
    *,
    backend: Backend = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 quantization of ``x`` ``[..., H]`` in groups of ``group_size`` along the last dim.

    Returns ``(q, scales)``: ``q`` float8_e4m3fn ``[..., H]``, ``scales`` float32
    ``[..., H / group_size]`` with ``scale = max(group amax, eps) / 448``. With
    ``column_major_scales`` the scales are a ``[T, G]`` view of a contiguous ``[G, T]`` tensor
    (the layout DeepGEMM-style fp8 GEMMs read).
    """
    fn = None if backend is not None or _compiling() else _pg.lookup(x)
    if fn is not None:  # the hot path: a cached backend, called directly
        return fn(x, group_size, eps, column_major_scales)
    if _compiling():
        return cast(_Pair, torch.ops.opmux.per_token_group_quant_fp8(x, group_size, eps, column_major_scales))
    return cast(_Pair, _pg(x, group_size, eps, column_major_scales, backend=backend))
