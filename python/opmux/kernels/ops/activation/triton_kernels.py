"""Triton gated activations: silu / gelu (erf) / gelu_tanh of the gate half times the up half
(imported only when the triton backend first runs)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_ACTS = {"silu": 0, "gelu": 1, "gelu_tanh": 2}


@triton.jit
def _erfc(z):
    # Chebyshev fit of erfc (Numerical Recipes' erfcc), fractional error < 1.2e-7 everywhere, so
    # the gelu tail keeps its relative accuracy where 1 + erf(z) would cancel; tl.math has no
    # erfc and libdevice is unavailable in the interpreter.
    az = tl.abs(z)
    t = 1.0 / (1.0 + 0.5 * az)
    p = -1.26551223 + t * (
        1.00002368
        + t
        * (
            0.37409196
            + t
            * (
                0.09678418
                + t
                * (
                    -0.18628806
                    + t
                    * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))
                )
            )
        )
    )
    r = t * tl.exp(-az * az + p)
    return tl.where(z >= 0, r, 2.0 - r)


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
        g = 0.5 * a * _erfc(a * -0.7071067811865476)
    else:
        # 0.5 * (1 + tanh(z)) == sigmoid(2z): no tanh intrinsic and no cancellation near -1;
        # |z| <= 40 saturates the sigmoid in fp32 without overflowing exp
        z = 0.7978845608028654 * (a + 0.044715 * a * a * a)
        z = tl.minimum(tl.maximum(z, -40.0), 40.0)
        g = a / (1.0 + tl.exp(-2.0 * z))
    tl.store(Y + row * sy + cols, (g * b).to(Y.dtype.element_ty), mask=mask)


def gated(x: torch.Tensor, y: torch.Tensor, act: str) -> None:
    """x: [rows, 2d], y: [rows, d], unit last stride (checked by the caller)."""
    rows, d = y.shape
    if rows == 0 or d == 0:
        return
    block = min(4096, triton.next_power_of_2(d))
    grid = (rows, triton.cdiv(d, block))
    _gated[grid](
        x, y, x.stride(0), y.stride(0), d, BLOCK=block, ACT=_ACTS[act], num_warps=4 if block <= 1024 else 8
    )


# The kernel argument lists of the activation ops (see op.py): out [T, d], x [T, 2d].
def silu_and_mul(out: torch.Tensor, x: torch.Tensor) -> None:
    gated(x, out, "silu")


def gelu_and_mul(out: torch.Tensor, x: torch.Tensor) -> None:
    gated(x, out, "gelu")


def gelu_tanh_and_mul(out: torch.Tensor, x: torch.Tensor) -> None:
    gated(x, out, "gelu_tanh")
