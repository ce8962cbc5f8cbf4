"""Triton RMSNorm kernels (imported only when the triton backend first runs).

One program per row. Rows up to ``_ONE_PASS_MAX`` elements stay in registers (one read
of x); longer rows loop twice over the row in ``_CHUNK`` pieces.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_ONE_PASS_MAX = 16384
_CHUNK = 4096


@triton.jit
def _rmsnorm_row(
    X, W, Y, R, sx, sy, sr, N, eps, BLOCK: tl.constexpr, HAS_RES: tl.constexpr, GEMMA: tl.constexpr
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
    tl.store(Y + row * sy + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_looped(
    X, W, Y, R, sx, sy, sr, N, eps, BLOCK: tl.constexpr, HAS_RES: tl.constexpr, GEMMA: tl.constexpr
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
        tl.store(Y + row * sy + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)


def _num_warps(block: int) -> int:
    return 4 if block <= 2048 else 8 if block <= 8192 else 16


def _launch(
    x: torch.Tensor,
    w: torch.Tensor,
    eps: float,
    y: torch.Tensor,
    residual: torch.Tensor | None,
    gemma: bool = False,
) -> None:
    """x, y, residual: [rows, N] with unit last stride (checked by the caller); ``gemma``
    applies the weight as ``1 + w`` (in fp32)."""
    rows, n = x.shape
    if rows == 0 or n == 0:
        return
    r = residual if residual is not None else x
    sr = r.stride(0)
    if n <= _ONE_PASS_MAX:
        block = triton.next_power_of_2(n)
        _rmsnorm_row[(rows,)](
            x,
            w,
            y,
            r,
            x.stride(0),
            y.stride(0),
            sr,
            n,
            eps,
            BLOCK=block,
            HAS_RES=residual is not None,
            GEMMA=gemma,
            num_warps=_num_warps(block),
        )
    else:
        _rmsnorm_looped[(rows,)](
            x,
            w,
            y,
            r,
            x.stride(0),
            y.stride(0),
            sr,
            n,
            eps,
            BLOCK=_CHUNK,
            HAS_RES=residual is not None,
            GEMMA=gemma,
            num_warps=8,
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
