"""Triton gated activations: silu / gelu (erf) / gelu_tanh of the gate half times the up half
(imported only when the triton backend first runs)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_ACTS = {"silu": 0, "gelu": 1, "gelu_tanh": 2}


@triton.jit
def _gated(X, Y, sx, sy, D, BLOCK: tl.constexpr, ACT: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < D
    a = tl.load(X + row * sx + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(X + row * sx + D + cols, mask=mask, other=0.0).to(tl.float32)
    if ACT == 0:
        g = a / (1.0 + tl.exp(-a))
    elif ACT == 1:
        g = 0.5 * a * (1.0 + tl.math.erf(a * 0.7071067811865476))
    else:
        # tanh(z) = 1 - 2 / (exp(2z) + 1): exact limits at +-inf, no tanh intrinsic needed
        z = 0.7978845608028654 * (a + 0.044715 * a * a * a)
        g = 0.5 * a * (2.0 - 2.0 / (tl.exp(2.0 * z) + 1.0))
    tl.store(Y + row * sy + cols, (g * b).to(Y.dtype.element_ty), mask=mask)


def gated(x: torch.Tensor, y: torch.Tensor, act: str) -> None:
    """x: [rows, 2d], y: [rows, d], unit last stride (checked by the caller)."""
    rows, d = y.shape
    if rows == 0 or d == 0:
        return
    block = min(4096, triton.next_power_of_2(d))
    grid = (rows, triton.cdiv(d, block))
    _gated[grid](x, y, x.stride(0), y.stride(0), d, BLOCK=block, ACT=_ACTS[act], num_warps=4 if block <= 1024 else 8)
