"""Triton SiLU-and-mul (imported only when the triton backend first runs)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_and_mul(X, Y, sx, sy, D, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < D
    a = tl.load(X + row * sx + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(X + row * sx + D + cols, mask=mask, other=0.0).to(tl.float32)
    y = a / (1.0 + tl.exp(-a)) * b
    tl.store(Y + row * sy + cols, y.to(Y.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, y: torch.Tensor) -> None:
    """x: [rows, 2d], y: [rows, d], unit last stride (checked by the caller)."""
    rows, d = y.shape
    if rows == 0 or d == 0:
        return
    block = min(4096, triton.next_power_of_2(d))
    grid = (rows, triton.cdiv(d, block))
    _silu_and_mul[grid](x, y, x.stride(0), y.stride(0), d, BLOCK=block, num_warps=4 if block <= 1024 else 8)
