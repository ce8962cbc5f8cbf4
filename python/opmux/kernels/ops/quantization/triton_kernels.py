"""Triton fp8 / int8 quantization kernels (imported only when the triton backend first runs).

The fp8 rounding is done explicitly in fp32 (``_round_e4m3``: round to nearest even on the
e4m3 grid) before the cast, so the cast only ever sees representable values. This gives the
same bits on GPUs and in the CPU interpreter, whose own float->fp8 cast mis-rounds values
that carry into the next binade (e.g. 7.8 -> 4.0).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# read inside @triton.jit: module globals must be constexpr there
MIN_SCALE = tl.constexpr(1.0 / (448.0 * 512.0))
_ONE_PASS_MAX = 16384
_CHUNK = 4096


@triton.jit
def _round_e4m3(y):
    """y (fp32, |y| <= 448) rounded to nearest even on the e4m3 grid, still in fp32."""
    bits = y.to(tl.int32, bitcast=True)
    exp = (bits >> 23) & 0xFF
    # quantum 2**(e-3) for normals (e >= -6), 2**-9 for subnormals
    qexp = tl.minimum(
        tl.maximum(exp - 3, 127 - 9), 127 + 5
    )  # capped: a NaN's exponent must not overflow magic
    quantum = (qexp << 23).to(tl.float32, bitcast=True)
    magic = quantum * 12582912.0  # 1.5 * 2**23 quanta: the add rounds to a multiple (RNE)
    r = (tl.abs(y) + magic) - magic
    return tl.where(y < 0, -r, r)


@triton.jit
def _quantize(x, inv):
    y = x * inv
    y = tl.where(y != y, y, tl.minimum(tl.maximum(y, -448.0), 448.0))  # NaN stays NaN
    return _round_e4m3(y)


@triton.jit
def _store_fp8(ptrs, y, mask):
    tl.store(ptrs, y.to(ptrs.dtype.element_ty), mask=mask)
    # NaN is 0x7F in e4m3fn; GPUs convert it so, the CPU interpreter does not: write the bits
    nan_bits = (tl.zeros_like(y) + 127.0).to(tl.uint8)
    tl.store(ptrs.to(tl.pointer_type(tl.uint8)), nan_bits, mask=mask & (y != y))


@triton.jit
def _amax(x, axis: tl.constexpr):
    """max |x| along ``axis``, NaN where the slice has a NaN (tl.max drops NaN on GPUs)."""
    has_nan = tl.max((x != x).to(tl.int32), axis=axis) > 0
    m = tl.max(tl.abs(x), axis=axis)
    return tl.where(has_nan, m * float("nan"), m)


@triton.jit
def _keep_nan(a, b):
    """``b`` (a bound applied to a), but NaN where ``a`` is NaN, as in the reference."""
    return tl.where(a != a, a, b)


@triton.jit
def _quantize_by(x, inv, scale, DIVIDE: tl.constexpr):
    """e4m3 grid values of x * inv, or of x / scale (an IEEE division per element)."""
    if DIVIDE:
        y = tl.math.div_rn(x, scale)
        y = tl.where(y != y, y, tl.minimum(tl.maximum(y, -448.0), 448.0))
        return _round_e4m3(y)
    else:
        return _quantize(x, inv)


@triton.jit
def _per_token_row(X, Q, S, UB, sx, sq, N, HAS_UB: tl.constexpr, DIVIDE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * sx + cols, mask=mask, other=0.0).to(tl.float32)
    amax = _amax(x, 0)
    if HAS_UB:
        amax = _keep_nan(amax, tl.minimum(amax, tl.load(UB)))
    scale = tl.math.div_rn(amax, 448.0)
    scale = _keep_nan(scale, tl.maximum(scale, MIN_SCALE))
    inv = tl.math.div_rn(1.0, scale)
    tl.store(S + row, scale)
    _store_fp8(Q + row * sq + cols, _quantize_by(x, inv, scale, DIVIDE), mask)


@triton.jit
def _per_token_looped(
    X, Q, S, UB, sx, sq, N, HAS_UB: tl.constexpr, DIVIDE: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(X + row * sx + cols, mask=cols < N, other=0.0).to(tl.float32)
        acc = tl.where((x != x) | (acc != acc), acc + x, tl.maximum(acc, tl.abs(x)))  # NaN sticks
    amax = _amax(acc, 0)
    if HAS_UB:
        amax = _keep_nan(amax, tl.minimum(amax, tl.load(UB)))
    scale = tl.math.div_rn(amax, 448.0)
    scale = _keep_nan(scale, tl.maximum(scale, MIN_SCALE))
    inv = tl.math.div_rn(1.0, scale)
    tl.store(S + row, scale)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(X + row * sx + cols, mask=mask, other=0.0).to(tl.float32)
        _store_fp8(Q + row * sq + cols, _quantize_by(x, inv, scale, DIVIDE), mask)


@triton.jit
def _tensor_amax(X, S, sx, N, BLOCK: tl.constexpr):
    """Dynamic per-tensor scale, phase 1: S (int32 view, zeroed) = max over rows of the bits of
    row amax / 448 (non-negative floats order as their bits; a NaN wins)."""
    row = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(X + row * sx + cols, mask=cols < N, other=0.0).to(tl.float32)
        acc = tl.where((x != x) | (acc != acc), acc + x, tl.maximum(acc, tl.abs(x)))  # NaN sticks
    scale = tl.math.div_rn(_amax(acc, 0), 448.0)
    bits = tl.where(scale != scale, 0x7FC00000, scale.to(tl.int32, bitcast=True))
    tl.atomic_max(S, bits)


@triton.jit
def _tensor_scaled(X, Q, S, ST, sx, sq, N, STATIC: tl.constexpr, BLOCK: tl.constexpr):
    """Phase 2 (or the static case): q = e4m3(x * (1 / scale)); program (0, 0) stores a static
    scale into S."""
    row = tl.program_id(0).to(tl.int64)
    scale = tl.load(ST) if STATIC else tl.load(S)
    inv = tl.math.div_rn(1.0, scale)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * sx + cols, mask=mask, other=0.0).to(tl.float32)
    _store_fp8(Q + row * sq + cols, _quantize(x, inv), mask)
    if STATIC:
        if (row == 0) & (tl.program_id(1) == 0):
            tl.store(S, scale)


@triton.jit
def _static_blocks(X, Q, S, sx, sq, ssi, ssj, N, GM, GN, BLOCK: tl.constexpr):
    """q = e4m3(x * (1 / s)) with s = S[(row // GM) * ssi + (col // GN) * ssj]."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * sx + cols, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(S + (row // GM) * ssi + (cols // GN) * ssj, mask=mask, other=1.0)
    inv = tl.math.div_rn(tl.full([BLOCK], 1.0, tl.float32), s)
    _store_fp8(Q + row * sq + cols, _quantize(x, inv), mask)


@triton.jit
def _per_group(
    X,
    Q,
    S,
    sx,
    sq,
    sst,
    ssg,
    G,
    GS,
    eps,
    QMAX: tl.constexpr,
    INT8: tl.constexpr,
    UE8M0: tl.constexpr,
    PACKED: tl.constexpr,
    DIVIDE: tl.constexpr,
    RECIP: tl.constexpr,
    GPP: tl.constexpr,
    BLOCK: tl.constexpr,
    SILU: tl.constexpr = False,
    D=0,
):
    """GPP groups of one row per program: a [GPP, BLOCK] tile. Scales: float32 at
    S[row * sst + grp * ssg], or (PACKED) the UE8M0 byte grp % 4 of int32 S[row * sst + grp // 4 * ssg].
    SILU: the values quantized are silu(X[row, c]) * X[row, D + c] in fp32 (the fused form)."""
    row = tl.program_id(0).to(tl.int64)
    grp = tl.program_id(1) * GPP + tl.arange(0, GPP)
    cols = tl.arange(0, BLOCK)
    mask = (grp[:, None] < G) & (cols[None, :] < GS)
    off = grp[:, None] * GS + cols[None, :]
    x = tl.load(X + row * sx + off, mask=mask, other=0.0).to(tl.float32)
    if SILU:
        u = tl.load(X + row * sx + D + off, mask=mask, other=0.0).to(tl.float32)
        en = tl.exp(-tl.abs(x))  # sigmoid without an overflowing exp (the interpreter raises on one)
        x = x * tl.where(x >= 0, 1.0 / (1.0 + en), en / (1.0 + en)) * u
    amax = _amax(x, 1)
    amax = _keep_nan(amax, tl.maximum(amax, eps))
    if RECIP:  # vLLM's form on CUDA: max(amax, eps) * (1 / qmax), the reciprocal a float first
        scale = amax * tl.math.div_rn(tl.full([GPP], 1.0, tl.float32), QMAX)
    else:
        scale = tl.math.div_rn(amax, QMAX)
    bits = scale.to(tl.int32, bitcast=True)
    if UE8M0:  # up to a power of two, exactly; NaN / inf kept
        e = (bits >> 23) & 0xFF
        up = (e + ((bits & 0x7FFFFF) != 0).to(tl.int32)) << 23
        bits = tl.where(e == 0xFF, bits, up)
        scale = bits.to(tl.float32, bitcast=True)
    inv = tl.math.div_rn(tl.full([GPP], 1.0, tl.float32), scale)
    if PACKED:
        sb = S.to(tl.pointer_type(tl.uint8)) + 4 * (row * sst + (grp // 4) * ssg) + grp % 4
        tl.store(sb, ((bits >> 23) & 0xFF).to(tl.uint8), mask=grp < G)
    else:
        tl.store(S + row * sst + grp * ssg, scale, mask=grp < G)
    if INT8:
        y = x * inv[:, None]
        y = tl.where(y != y, 0.0, tl.minimum(tl.maximum(y, -128.0), 127.0))
        tl.store(Q + row * sq + off, y.to(tl.int32).to(tl.int8), mask=mask)
    else:
        _store_fp8(Q + row * sq + off, _quantize_by(x, inv[:, None], scale[:, None], DIVIDE), mask)


def per_token_quant(
    x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, ub: torch.Tensor, divide: bool = False
) -> None:
    """x, q: [rows, N] with unit last stride; s: [rows] contiguous; ub: 0 or 1 element."""
    rows, n = x.shape
    if rows == 0:
        return
    has_ub = ub.numel() == 1
    if n <= _ONE_PASS_MAX:
        block = triton.next_power_of_2(n)
        _per_token_row[(rows,)](
            x,
            q,
            s,
            ub,
            x.stride(0),
            q.stride(0),
            n,
            HAS_UB=has_ub,
            DIVIDE=divide,
            BLOCK=block,
            num_warps=4 if block <= 2048 else 8 if block <= 8192 else 16,
        )
    else:
        _per_token_looped[(rows,)](
            x, q, s, ub, x.stride(0), q.stride(0), n, HAS_UB=has_ub, DIVIDE=divide, BLOCK=_CHUNK, num_warps=8
        )


def per_tensor_quant(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, static: torch.Tensor) -> None:
    """x, q: [rows, N] with unit last stride; s: [1] (written); static: 0 (dynamic) or 1 element."""
    rows, n = x.shape
    is_static = static.numel() == 1
    if not is_static:
        s.zero_()
        if rows:
            _tensor_amax[(rows,)](
                x, s.view(torch.int32), x.stride(0), n, BLOCK=min(_CHUNK, triton.next_power_of_2(n))
            )
    if rows == 0:
        if is_static:
            s.copy_(static)
        return
    block = min(_CHUNK, triton.next_power_of_2(n))
    _tensor_scaled[(rows, triton.cdiv(n, block))](
        x, q, s, static, x.stride(0), q.stride(0), n, STATIC=is_static, BLOCK=block, num_warps=4
    )


def per_token_group_quant(
    x: torch.Tensor,
    q: torch.Tensor,
    s: torch.Tensor,
    gs: int,
    eps: float,
    ue8m0: bool = False,
    divide: bool = False,
    recip: bool | None = None,
    silu: bool = False,
) -> None:
    """x, q: [rows, G * gs] with unit last stride (q fp8 or int8); s: [rows, G] float32 or
    [rows, ceil(G / 4)] int32 (packed UE8M0), any strides. ``recip``: the scale's reciprocal
    form (op.py's ``group_scale_of``); None: ``divide and x.is_cuda``, as the op wants.
    ``silu``: x is [rows, 2 * G * gs] and ``silu(x[:, :d]) * x[:, d:]`` is quantized."""
    rows, n = x.shape
    if rows == 0:
        return
    if silu:
        n //= 2
    g = n // gs
    block = triton.next_power_of_2(gs)
    gpp = max(1, min(triton.next_power_of_2(g), 4096 // block))
    grid = (rows, triton.cdiv(g, gpp))
    int8 = q.dtype == torch.int8
    _per_group[grid](
        x,
        q,
        s,
        x.stride(0),
        q.stride(0),
        s.stride(0),
        s.stride(1),
        g,
        gs,
        eps,
        QMAX=127.0 if int8 else 448.0,
        INT8=int8,
        UE8M0=ue8m0,
        PACKED=s.dtype == torch.int32,
        DIVIDE=divide,
        RECIP=divide and x.is_cuda if recip is None else recip,  # op.py's group_scale_of
        GPP=gpp,
        BLOCK=block,
        SILU=silu,
        D=n if silu else 0,
        num_warps=4,
    )


# The kernel argument lists of the quantization ops (see op.py): fp8 outputs arrive as uint8.
def per_token_quant_fp8(
    q: torch.Tensor, s: torch.Tensor, x: torch.Tensor, ub: torch.Tensor, divide: bool
) -> None:
    per_token_quant(x, q.view(torch.float8_e4m3fn), s, ub, divide)


def per_tensor_quant_fp8(q: torch.Tensor, s: torch.Tensor, x: torch.Tensor, static: torch.Tensor) -> None:
    per_tensor_quant(x, q.view(torch.float8_e4m3fn), s, static)


def per_token_group_quant_fp8(
    q: torch.Tensor, s: torch.Tensor, x: torch.Tensor, gs: int, eps: float, ue8m0: bool, divide: bool
) -> None:
    per_token_group_quant(x, q.view(torch.float8_e4m3fn), s, gs, eps, ue8m0, divide)


def silu_and_mul_per_token_group_quant_fp8(
    q: torch.Tensor, s: torch.Tensor, x: torch.Tensor, gs: int, eps: float, ue8m0: bool
) -> None:
    per_token_group_quant(x, q.view(torch.float8_e4m3fn), s, gs, eps, ue8m0, silu=True)


def per_token_group_quant_int8(
    q: torch.Tensor, s: torch.Tensor, x: torch.Tensor, gs: int, eps: float
) -> None:
    per_token_group_quant(x, q, s, gs, eps)


def static_quant_fp8(q: torch.Tensor, x: torch.Tensor, s: torch.Tensor, gm: int, gn: int) -> None:
    """q (uint8), x: [rows, N], unit last stride; s: [Gm, Gn] any strides."""
    rows, n = x.shape
    if rows == 0:
        return
    block = min(_CHUNK, triton.next_power_of_2(n))
    ssi = s.stride(0) if s.shape[0] > 1 else 0
    ssj = s.stride(1) if s.shape[1] > 1 else 0
    _static_blocks[(rows, triton.cdiv(n, block))](
        x,
        q.view(torch.float8_e4m3fn),
        s,
        x.stride(0),
        q.stride(0),
        ssi,
        ssj,
        n,
        gm,
        gn,
        BLOCK=block,
        num_warps=4,
    )
