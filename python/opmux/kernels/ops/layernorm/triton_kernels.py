"""Triton RMSNorm kernels (imported only when the triton backend first runs).

One program per row. Rows up to ``_ONE_PASS_MAX`` elements stay in registers (one read
of x); longer rows loop twice over the row in ``_CHUNK`` pieces. With ``QUANT`` the row's
output, rounded to its dtype as rmsnorm stores it, is quantized to fp8 into Q instead
(``q = e4m3(y * (1 / scale))``, the quantization kernels' rounding), and Y is not written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..quantization.triton_kernels import _quantize, _store_fp8

_ONE_PASS_MAX = 16384
_CHUNK = 4096


@triton.jit
def _emit(Y, Q, S, row, sy, sq, cols, y, mask, QUANT: tl.constexpr):
    """y (fp32) rounded to Y's dtype, stored to Y or, with QUANT, quantized into Q."""
    yt = y.to(Y.dtype.element_ty)
    if QUANT:
        inv = tl.math.div_rn(1.0, tl.load(S))
        _store_fp8(Q + row * sq + cols, _quantize(yt.to(tl.float32), inv), mask)
    else:
        tl.store(Y + row * sy + cols, yt, mask=mask)


@triton.jit
def _rmsnorm_row(
    X,
    W,
    Y,
    R,
    Q,
    S,
    sx,
    sy,
    sr,
    sq,
    N,
    eps,
    BLOCK: tl.constexpr,
    HAS_RES: tl.constexpr,
    GEMMA: tl.constexpr,
    QUANT: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * sx + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        r = x + tl.load(R + row * sr + cols, mask=mask, other=0.0).to(tl.float32)
        r_stored = r.to(R.dtype.element_ty)
        tl.store(R + row * sr + cols, r_stored, mask=mask)
        x = r_stored.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    if GEMMA:
        w = w + 1.0
    _emit(Y, Q, S, row, sy, sq, cols, x * rstd * w, mask, QUANT)


@triton.jit
def _rmsnorm_looped(
    X,
    W,
    Y,
    R,
    Q,
    S,
    sx,
    sy,
    sr,
    sq,
    N,
    eps,
    BLOCK: tl.constexpr,
    HAS_RES: tl.constexpr,
    GEMMA: tl.constexpr,
    QUANT: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(X + row * sx + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_RES:
            r = x + tl.load(R + row * sr + cols, mask=mask, other=0.0).to(tl.float32)
            r_stored = r.to(R.dtype.element_ty)
            tl.store(R + row * sr + cols, r_stored, mask=mask)
            x = r_stored.to(tl.float32)
        acc += x * x
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / N + eps)
    src = R if HAS_RES else X
    ss = sr if HAS_RES else sx
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(src + row * ss + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        if GEMMA:
            w = w + 1.0
        _emit(Y, Q, S, row, sy, sq, cols, x * rstd * w, mask, QUANT)


def _num_warps(block: int) -> int:
    return 4 if block <= 2048 else 8 if block <= 8192 else 16


def _launch(
    x: torch.Tensor,
    w: torch.Tensor,
    eps: float,
    y: torch.Tensor,
    residual: torch.Tensor | None,
    gemma: bool = False,
    q: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
) -> None:
    """x, y, residual: [rows, N] with unit last stride (checked by the caller); ``gemma``
    applies the weight as ``1 + w`` (in fp32). With ``q`` (fp8 [rows, N], unit last stride) and
    ``scale`` (one float32), the output is quantized into q and y is not written."""
    rows, n = x.shape
    if rows == 0 or n == 0:
        return
    r = residual if residual is not None else x
    sr = r.stride(0)
    quant = q is not None
    qq = q if q is not None else y
    ss = scale if scale is not None else w
    if n <= _ONE_PASS_MAX:
        kernel, block = _rmsnorm_row, triton.next_power_of_2(n)
        warps = _num_warps(block)
    else:
        kernel, block, warps = _rmsnorm_looped, _CHUNK, 8
    kernel[(rows,)](
        x,
        w,
        y,
        r,
        qq,
        ss,
        x.stride(0),
        y.stride(0),
        sr,
        qq.stride(0),
        n,
        eps,
        BLOCK=block,
        HAS_RES=residual is not None,
        GEMMA=gemma,
        QUANT=quant,
        num_warps=warps,
    )


def _heads(x: torch.Tensor, w: torch.Tensor, eps: float) -> None:
    """In place over x: [tokens, heads, D] (unit last stride). One launch when the (token, head)
    rows share one stride (the usual layout, even inside a fused qkv tensor), else one per head."""
    tokens, heads, d = x.shape
    if tokens == 0 or heads == 0 or d == 0:
        return
    if heads == 1:
        rows = x[:, 0]
    elif tokens == 1:
        rows = x[0]
    elif x.stride(0) == heads * x.stride(1):
        rows = x.as_strided((tokens * heads, d), (x.stride(1), 1))
    else:
        for h in range(heads):
            _launch(x[:, h], w, eps, x[:, h], None)
        return
    _launch(rows, w, eps, rows, None)


# The kernel argument lists of the layernorm ops (see op.py): rows [T, H] with a unit last
# stride, dense weights, eps > 0 (all checked by the contract).
def rmsnorm(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    _launch(x, weight, eps, out, None)


def gemma_rmsnorm(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    _launch(x, weight, eps, out, None, gemma=True)


def fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    _launch(x, weight, eps, x, residual)


def gemma_fused_add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> None:
    _launch(x, weight, eps, x, residual, gemma=True)


def qk_norm(
    q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float
) -> None:
    _heads(q, q_weight, eps)
    _heads(k, k_weight, eps)


def rmsnorm_static_quant_fp8(
    q: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, eps: float
) -> None:
    _launch(x, weight, eps, x, None, q=q.view(torch.float8_e4m3fn), scale=scale)


def fused_add_rmsnorm_static_quant_fp8(
    q: torch.Tensor,
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    eps: float,
) -> None:
    _launch(x, weight, eps, x, residual, q=q.view(torch.float8_e4m3fn), scale=scale)
