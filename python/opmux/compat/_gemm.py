"""The engines' names for the block-scaled fp8 GEMM, on ``gemm.w8a8_block_fp8_matmul``.

vLLM's and SGLang's Triton entry ``w8a8_block_fp8_matmul(A, B, As, Bs, block_size, output_dtype)``
(B [N, K], Bs [N/128, K/128]) and the CUTLASS entries that take B as a [K, N] column-major view
(vLLM's ``cutlass_scaled_mm`` with block scales, sgl-kernel's ``fp8_blockwise_scaled_mm``: scale_b
[K/128, N/128]) map onto the op's one contract; only the recipe's 128x128 blocks exist.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import Tensor


def _op() -> Any:
    from opmux.kernels.ops.gemm import w8a8_block_fp8_matmul

    return w8a8_block_fp8_matmul


def _block(name: str, block_size: Sequence[int]) -> None:
    if list(block_size) != [128, 128]:
        raise ValueError(
            f"{name}: block_size {list(block_size)} is not supported; valid: [128, 128] "
            "(1x128 activation and 128x128 weight scales)"
        )


def triton_block_matmul(
    name: str, A: Tensor, B: Tensor, As: Tensor, Bs: Tensor, block_size: Sequence[int], output_dtype: Any
) -> Tensor:
    """``w8a8_block_fp8_matmul(A, B, As, Bs, block_size, output_dtype)`` of vLLM and SGLang."""
    _block(name, block_size)
    return _op()(A, B, As, Bs, out_dtype=output_dtype)  # type: ignore[no-any-return]


def column_major_matmul(
    name: str,
    a: Tensor,
    b: Tensor,
    scale_a: Tensor,
    scale_b: Tensor,
    out_dtype: torch.dtype,
    bias: Tensor | None,
) -> Tensor:
    """The CUTLASS form: b [K, N] (a column-major view of the [N, K] weight), scale_b [K/128, N/128]."""
    if b.dim() != 2 or scale_b.dim() != 2:
        raise ValueError(f"{name}: b and scale_b must be 2-d ([K, N], [K/128, N/128])")
    y = _op()(a, b.t(), scale_a, scale_b.t(), out_dtype=out_dtype)
    if bias is not None:
        y += bias
    return y  # type: ignore[no-any-return]
