"""Triton reshape_and_cache (imported only when the triton backend first runs).

Program (t, c) copies chunk c of token t's H*D key and value elements to the cache slot, head
h at ``block * block_stride + offset * page_stride + h * head_stride`` (NHD and HND caches alike),
element d of the head at ``(d // x) * chunk_stride + (d % x) * element_stride`` (x = D, unit stride
but for vLLM's paged layout);
a negative or out-of-range slot masks every store (the token is skipped). An fp8 cache gets
``fp8(x / scale)``: an IEEE division, saturated to +-448, rounded to nearest even on the e4m3
grid in fp32 before the cast (the same bits on GPUs and in the CPU interpreter).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _round_e4m3(y):
    """y (fp32, |y| <= 448) rounded to nearest even on the e4m3 grid, still in fp32."""
    bits = y.to(tl.int32, bitcast=True)
    exp = (bits >> 23) & 0xFF
    qexp = tl.maximum(exp - 3, 127 - 9)  # quantum 2**(e-3) for normals, 2**-9 for subnormals
    quantum = (qexp << 23).to(tl.float32, bitcast=True)
    magic = quantum * 12582912.0  # 1.5 * 2**23 quanta: the add rounds to a multiple (RNE)
    r = (tl.abs(y) + magic) - magic
    return tl.where(y < 0, -r, r)


@triton.jit
def _store(ptrs, x, scale, mask, FP8: tl.constexpr):
    if FP8:
        y = tl.math.div_rn(x.to(tl.float32), scale)
        y = tl.where(y != y, y, tl.minimum(tl.maximum(y, -448.0), 448.0))  # NaN stays NaN
        y = _round_e4m3(y)
        tl.store(ptrs, y.to(ptrs.dtype.element_ty), mask=mask)
        # NaN is 0x7F in e4m3fn; GPUs convert it so, the CPU interpreter does not: write the bits
        nan_bits = (tl.zeros_like(y) + 127.0).to(tl.uint8)
        tl.store(ptrs.to(tl.pointer_type(tl.uint8)), nan_bits, mask=mask & (y != y))
    else:
        tl.store(ptrs, x, mask=mask)


@triton.jit
def _token_slot(SLOTS, NSLOTS, BS, WIDTH, BLOCK: tl.constexpr):
    """Program (t, chunk) of a slot-writing kernel: token t, the chunk's lanes ``offs`` into the
    token's WIDTH elements, their mask (a negative or out-of-range slot masks every lane: the
    token is skipped) and the slot's block and offset in the block (0 and 0 when skipped)."""
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    slot = tl.load(SLOTS + t)
    ok = (slot >= 0) & (slot < NSLOTS)
    safe = tl.where(ok, slot, 0)
    mask = offs < tl.where(ok, WIDTH, 0)
    blk = safe // BS
    return t, offs, mask, blk, safe - blk * BS


@triton.jit
def _reshape_and_cache(
    K,
    V,
    KC,
    VC,
    SLOTS,
    KS,
    VS,
    skt,
    skh,
    svt,
    svh,
    kcb,
    kcp,
    kch,
    kchi,
    kclo,
    kx,
    vcb,
    vcp,
    vch,
    vchi,
    vclo,
    vx,
    NSLOTS,
    BS,
    H,
    D,
    FP8: tl.constexpr,
    BLOCK: tl.constexpr,
):
    t, offs, mask, blk, off = _token_slot(SLOTS, NSLOTS, BS, H * D, BLOCK)
    h = offs // D
    d = offs - h * D
    k = tl.load(K + t * skt + h * skh + d, mask=mask)
    v = tl.load(V + t * svt + h * svh + d, mask=mask)
    ks = 1.0
    vs = 1.0
    if FP8:
        ks = tl.load(KS)
        vs = tl.load(VS)
    kd = (d // kx) * kchi + (d % kx) * kclo  # element d of a head row (chunks of x: vLLM's paged key)
    vd = (d // vx) * vchi + (d % vx) * vclo
    _store(KC + blk * kcb + off * kcp + h * kch + kd, k, ks, mask, FP8)
    _store(VC + blk * vcb + off * vcp + h * vch + vd, v, vs, mask, FP8)


def _token_grid(tokens: int, width: int) -> tuple[int, tuple[int, int]]:
    """-> (BLOCK, grid) of a slot-writing kernel: a program per (token, chunk of BLOCK of its
    ``width`` elements)."""
    block = min(1024, triton.next_power_of_2(width))
    return block, (tokens, triton.cdiv(width, block))


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slots: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    fp8: bool,
) -> None:
    t, h, d = key.shape
    kst: tuple[int, ...]
    vst: tuple[int, ...]
    if key_cache.dim() == 5:  # vLLM's paged layout: key [nb, H, D/x, bs, x], value [nb, H, D, bs]
        nb, bs = key_cache.shape[0], key_cache.shape[3]
        s0, s1, s2, s3, s4 = key_cache.stride()
        kst = (s0, s3, s1, s2, s4, key_cache.shape[4])
        v0, v1, v2, v3 = value_cache.stride()
        vst = (v0, v3, v1, 0, v2, d)
    else:  # [nb, bs, H, D] with any strides but D's
        nb, bs = key_cache.shape[:2]
        kst = (*key_cache.stride()[:3], 0, 1, d)
        vst = (*value_cache.stride()[:3], 0, 1, d)
    if t == 0 or h * d == 0:
        return
    block, grid = _token_grid(t, h * d)
    _reshape_and_cache[grid](
        key,
        value,
        key_cache,
        value_cache,
        slots,
        k_scale,
        v_scale,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        *kst,
        *vst,
        nb * bs,
        bs,
        h,
        d,
        FP8=fp8,
        BLOCK=block,
        num_warps=4,
    )


# -- the block ops ----------------------------------------------------------------------------
# Caches of any dtype are copied as integers of their element size (fp8 included).
_AS_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _as_int(t: torch.Tensor) -> torch.Tensor:
    return t.view(_AS_INT[t.element_size()])


@triton.jit
def _copy_blocks(C, PAIRS, NB, STRIDE, NUMEL, BLOCK: tl.constexpr):
    """Program (pair, chunk): elements [chunk * BLOCK, ...) of block src onto block dst (a block
    is one dense region of NUMEL elements; a pair out of range or onto itself is skipped)."""
    p = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    s = tl.load(PAIRS + 2 * p)
    d = tl.load(PAIRS + 2 * p + 1)
    ok = (s >= 0) & (s < NB) & (d >= 0) & (d < NB) & (s != d)
    mask = offs < tl.where(ok, NUMEL, 0)
    v = tl.load(C + tl.where(ok, s, 0) * STRIDE + offs, mask=mask)
    tl.store(C + tl.where(ok, d, 0) * STRIDE + offs, v, mask=mask)


def copy_blocks(cache: torch.Tensor, block_mapping: torch.Tensor) -> None:
    n, numel = block_mapping.shape[0], cache[0].numel() if cache.shape[0] else 0
    if n == 0 or numel == 0:
        return
    block = min(4096, triton.next_power_of_2(numel))
    stride = cache.stride(0) if cache.shape[0] > 1 else numel
    _copy_blocks[(n, triton.cdiv(numel, block))](
        _as_int(cache), block_mapping, cache.shape[0], stride, numel, BLOCK=block, num_warps=4
    )


@triton.jit
def _concat_and_cache_mla(
    KVC, KPE, CACHE, SLOTS, SCALE, sc, sp, cb, cp, R, P, NSLOTS, BS, FP8: tl.constexpr, BLOCK: tl.constexpr
):
    """Program (t, chunk): elements [chunk * BLOCK, ...) of token t's [kv_c | k_pe] row at its
    slot; a negative or out-of-range slot masks every store."""
    t, offs, mask, blk, off = _token_slot(SLOTS, NSLOTS, BS, R + P, BLOCK)
    in_c = offs < R
    x = tl.load(KVC + t * sc + offs, mask=mask & in_c, other=0.0)
    y = tl.load(KPE + t * sp + (offs - R), mask=mask & (offs >= R), other=0.0)
    v = tl.where(in_c, x, y)
    s = 1.0
    if FP8:
        s = tl.load(SCALE)
    _store(CACHE + blk * cb + off * cp + offs, v, s, mask, FP8)


def concat_and_cache_mla(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slots: torch.Tensor,
    scale: torch.Tensor,
    fp8: bool,
) -> None:
    t, r = kv_c.shape
    p = k_pe.shape[1]
    if t == 0 or r + p == 0:
        return
    nb, bs = kv_cache.shape[:2]
    block, grid = _token_grid(t, r + p)
    _concat_and_cache_mla[grid](
        kv_c,
        k_pe,
        kv_cache,
        slots,
        scale,
        kv_c.stride(0),
        k_pe.stride(0),
        kv_cache.stride(0),
        kv_cache.stride(1),
        r,
        p,
        nb * bs,
        bs,
        FP8=fp8,
        BLOCK=block,
        num_warps=4,
    )


@triton.jit
def _gather_cache(
    SRC,
    DST,
    TABLE,
    CU,
    STARTS,
    NB,
    BS,
    ROWS,
    WIDTH,
    trow,
    cblk,
    cpage,
    drow,
    ENTRY,
    HAS_STARTS: tl.constexpr,
    SPLITS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Program (sequence b, split): its share of b's tokens, entry by entry. Bad values skip the
    sequence (cu_seq_lens, seq_starts) or the token (block_table column or id out of range)."""
    b = tl.program_id(0).to(tl.int64)
    lo = tl.load(CU + b).to(tl.int64)
    hi = tl.load(CU + b + 1).to(tl.int64)
    first = lo * 0
    if HAS_STARTS:
        first = tl.load(STARTS + b).to(tl.int64)
    ok = (lo >= 0) & (hi >= lo) & (hi <= ROWS) & (first >= 0)
    n = tl.where(ok, hi - lo, 0)
    per = (n + SPLITS - 1) // SPLITS
    t0 = tl.program_id(1) * per
    t1 = tl.minimum(n, t0 + per)
    col0 = tl.where(ok, first, 0) // BS
    cols = tl.arange(0, BLOCK)
    for i in range(t0, t1):
        col = col0 + i // BS
        in_table = col < WIDTH
        blk = tl.load(TABLE + b * trow + tl.where(in_table, col, 0), mask=in_table, other=-1).to(tl.int64)
        good = in_table & (blk >= 0) & (blk < NB)
        src = SRC + tl.where(good, blk, 0) * cblk + (i % BS) * cpage
        dst = DST + (lo + i) * drow
        lim = tl.where(good, ENTRY, 0)  # a skipped token masks every lane
        for e0 in range(0, ENTRY, BLOCK):
            m = e0 + cols < lim
            tl.store(dst + e0 + cols, tl.load(src + e0 + cols, mask=m), mask=m)


def gather_cache(
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    seq_starts: torch.Tensor,
    has_starts: bool,
) -> None:
    b = block_table.shape[0]
    entry = dst[0].numel() if dst.shape[0] else src_cache[0, 0].numel() if src_cache.shape[0] else 0
    if b == 0 or entry == 0:
        return
    splits = 1 if b >= 64 else 4
    _gather_cache[(b, splits)](
        _as_int(src_cache),
        _as_int(dst),
        block_table,
        cu_seq_lens,
        seq_starts,
        src_cache.shape[0],
        src_cache.shape[1],
        dst.shape[0],
        block_table.shape[1],
        block_table.stride(0),
        src_cache.stride(0),
        src_cache.stride(1),
        dst.stride(0),
        entry,
        HAS_STARTS=has_starts,
        SPLITS=splits,
        BLOCK=min(1024, triton.next_power_of_2(entry)),
        num_warps=4,
    )
