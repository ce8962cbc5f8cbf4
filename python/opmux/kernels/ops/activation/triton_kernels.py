"""Triton activations (imported only when the triton backend first runs): gated silu / gelu (erf) /
gelu_tanh of the gate half times the up half, mul_and_silu (halves swapped), fatrelu, swiglustep,
swigluoai (interleaved pairs); element-wise gelu_new / gelu_fast / gelu_quick."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_ACTS = {"silu": 0, "gelu": 1, "gelu_tanh": 2, "fatrelu": 3, "swiglustep": 4, "swigluoai": 5, "gelu_quick": 6}


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
def _sig_div(a, e):
    # a / (1 + exp(e)), e capped at 88 (exp(88) < FLT_MAX: no overflow, which the interpreter's
    # numpy reports; the quotient is then below 1e-36 where it would be 0); a NaN e stays NaN,
    # and an infinite a over the cap is inf * 0 = NaN, as in the reference
    q = a / (1.0 + tl.exp(tl.where(e > 88.0, 88.0, e)))
    return tl.where((e > 88.0) & (tl.abs(a) == float("inf")), float("nan"), q)


@triton.jit
def _act(a, ACT: tl.constexpr):
    if ACT == 0:
        g = _sig_div(a, -a)
    elif ACT == 1:
        g = 0.5 * a * _erfc(a * -0.7071067811865476)
    elif ACT == 2:
        # 0.5 * (1 + tanh(z)) == sigmoid(2z): no tanh intrinsic and no cancellation near -1;
        # |z| <= 40 saturates the sigmoid in fp32 without overflowing exp
        z = 0.7978845608028654 * (a + 0.044715 * a * a * a)
        z = tl.minimum(tl.maximum(z, -40.0), 40.0)
        g = a / (1.0 + tl.exp(-2.0 * z))
        g = tl.where(a == -float("inf"), float("nan"), g)  # -inf * sigmoid(-inf), as the reference
    else:  # gelu_quick
        g = _sig_div(a, -1.702 * a)
    return g


@triton.jit
def _clamp_hi(v, lim):
    return tl.where(v > lim, lim, v)  # a NaN v stays NaN, as torch.clamp


@triton.jit
def _gated(
    X, Y, sx, sy, D, P0, P1, BLOCK: tl.constexpr, ACT: tl.constexpr, SWAP: tl.constexpr, VLLM: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < D
    if ACT == 5:  # swigluoai: (gate, up) pairs interleaved
        ga = X + row * sx + 2 * cols
        ua = ga + 1
    elif SWAP:  # mul_and_silu: the gate is the second half
        ua = X + row * sx + cols
        ga = ua + D
    else:
        ga = X + row * sx + cols
        ua = ga + D
    a = tl.load(ga, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(ua, mask=mask, other=0.0).to(tl.float32)
    if ACT == 3:  # fatrelu: g <= threshold -> 0 (NaN passes)
        y = tl.where(a <= P0, 0.0, a) * b
    elif ACT == 4:  # swiglustep
        s = _clamp_hi(_sig_div(a, -a), P1)
        y = s * _clamp_hi(tl.where(b < -P1, -P1, b), P1)
    elif ACT == 5:  # swigluoai
        g = _clamp_hi(a, P1)
        u = _clamp_hi(tl.where(b < -P1, -P1, b), P1)
        y = (u + 1.0) * _sig_div(g, -P0 * g)
    elif VLLM:  # vLLM's rounding: the activation rounded to the output dtype before the product
        y = _act(a, ACT).to(Y.dtype.element_ty).to(tl.float32) * b
    else:
        y = _act(a, ACT) * b
    tl.store(Y + row * sy + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _tanh(z):
    # 1 - 2 / (1 + e^(2z)) with |z| capped at 20 (tanh is +-1 in float32 there); NaN stays
    zc = tl.where(z > 20.0, 20.0, tl.where(z < -20.0, -20.0, z))
    return 1.0 - 2.0 / (1.0 + tl.exp(2.0 * zc))


@triton.jit
def _elementwise(X, Y, sx, sy, D, BLOCK: tl.constexpr, ACT: tl.constexpr, VLLM: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < D
    a = tl.load(X + row * sx + cols, mask=mask, other=0.0).to(tl.float32)
    if VLLM == 1:  # gelu_new, vLLM's roundings (each step rounded to the output dtype)
        dt = Y.dtype.element_ty
        x3 = ((a * a).to(dt).to(tl.float32) * a).to(dt).to(tl.float32)
        b = (a + (0.044715 * x3).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        t = _tanh((0.79788456 * b).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        y = (0.5 * a).to(dt).to(tl.float32) * (1.0 + t).to(dt).to(tl.float32)
    elif VLLM == 2:  # gelu_fast, vLLM's roundings
        dt = Y.dtype.element_ty
        p = (a * 0.79788456).to(dt).to(tl.float32)
        q = ((0.044715 * a).to(dt).to(tl.float32) * a).to(dt).to(tl.float32)
        s = (1.0 + q).to(dt).to(tl.float32)
        t = _tanh((p * s).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        y = (0.5 * a).to(dt).to(tl.float32) * (1.0 + t).to(dt).to(tl.float32)
    else:
        y = _act(a, ACT)
    tl.store(Y + row * sy + cols, y.to(Y.dtype.element_ty), mask=mask)


def _tiles(y: torch.Tensor) -> tuple[tuple[int, int], int, int] | None:
    """The launch over y [rows, d]: (grid, BLOCK, num_warps), a program per row and BLOCK
    (a power of two, at most 4096) columns; None when y is empty (nothing to launch)."""
    rows, d = y.shape
    if rows == 0 or d == 0:
        return None
    block = min(4096, triton.next_power_of_2(d))
    return (rows, triton.cdiv(d, block)), block, 4 if block <= 1024 else 8


def gated(
    x: torch.Tensor,
    y: torch.Tensor,
    act: str,
    p0: float = 0.0,
    p1: float = 0.0,
    *,
    swap: bool = False,
    vllm: bool = False,
) -> None:
    """x: [rows, 2d], y: [rows, d], unit last stride (checked by the caller)."""
    tiles = _tiles(y)
    if tiles is None:
        return
    grid, block, warps = tiles
    _gated[grid](
        x,
        y,
        x.stride(0),
        y.stride(0),
        y.shape[1],
        float(p0),
        float(p1),
        BLOCK=block,
        ACT=_ACTS[act],
        SWAP=swap,
        VLLM=vllm,
        num_warps=warps,
    )


def elementwise(x: torch.Tensor, y: torch.Tensor, act: str, vllm: int = 0) -> None:
    """x, y: [rows, n], unit last stride (checked by the caller)."""
    tiles = _tiles(y)
    if tiles is None:
        return
    grid, block, warps = tiles
    _elementwise[grid](
        x,
        y,
        x.stride(0),
        y.stride(0),
        y.shape[1],
        BLOCK=block,
        ACT=_ACTS[act],
        VLLM=vllm,
        num_warps=warps,
    )


# The kernel argument lists of the activation ops (see op.py): out [T, d], x [T, 2d].
def silu_and_mul(out: torch.Tensor, x: torch.Tensor, vllm_rounding: bool) -> None:
    gated(x, out, "silu", vllm=vllm_rounding)


def gelu_and_mul(out: torch.Tensor, x: torch.Tensor, vllm_rounding: bool) -> None:
    gated(x, out, "gelu", vllm=vllm_rounding)


def gelu_tanh_and_mul(out: torch.Tensor, x: torch.Tensor, vllm_rounding: bool) -> None:
    gated(x, out, "gelu_tanh", vllm=vllm_rounding)


def mul_and_silu(out: torch.Tensor, x: torch.Tensor, vllm_rounding: bool) -> None:
    gated(x, out, "silu", swap=True, vllm=vllm_rounding)


def fatrelu_and_mul(out: torch.Tensor, x: torch.Tensor, threshold: float) -> None:
    gated(x, out, "fatrelu", threshold)


def swiglustep_and_mul(out: torch.Tensor, x: torch.Tensor, limit: float) -> None:
    gated(x, out, "swiglustep", 0.0, limit)


def swigluoai_and_mul(out: torch.Tensor, x: torch.Tensor, alpha: float, limit: float) -> None:
    gated(x, out, "swigluoai", alpha, limit)


# Element-wise (out, x both [T, n]): gelu_new and gelu_fast are one function (the tanh form).
def gelu_new(out: torch.Tensor, x: torch.Tensor, vllm_rounding: bool) -> None:
    elementwise(x, out, "gelu_tanh", 1 if vllm_rounding else 0)


def gelu_fast(out: torch.Tensor, x: torch.Tensor, vllm_rounding: bool) -> None:
    elementwise(x, out, "gelu_tanh", 2 if vllm_rounding else 0)


def gelu_quick(out: torch.Tensor, x: torch.Tensor) -> None:
    elementwise(x, out, "gelu_quick")
