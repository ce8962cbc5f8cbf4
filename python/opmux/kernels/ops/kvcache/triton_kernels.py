"""Triton reshape_and_cache (imported only when the triton backend first runs).

Program (t, c) copies chunk c of token t's H*D key and value elements to the cache slot, head
h at ``block * block_stride + offset * page_stride + h * head_stride`` (NHD and HND caches alike);
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
    vcb,
    vcp,
    vch,
    NSLOTS,
    BS,
    H,
    D,
    FP8: tl.constexpr,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    slot = tl.load(SLOTS + t)
    ok = (slot >= 0) & (slot < NSLOTS)
    safe = tl.where(ok, slot, 0)
    mask = offs < tl.where(ok, H * D, 0)  # a skipped token masks every lane
    h = offs // D
    d = offs - h * D
    k = tl.load(K + t * skt + h * skh + d, mask=mask)
    v = tl.load(V + t * svt + h * svh + d, mask=mask)
    blk = safe // BS
    off = safe - blk * BS
    ks = 1.0
    vs = 1.0
    if FP8:
        ks = tl.load(KS)
        vs = tl.load(VS)
    _store(KC + blk * kcb + off * kcp + h * kch + d, k, ks, mask, FP8)
    _store(VC + blk * vcb + off * vcp + h * vch + d, v, vs, mask, FP8)


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
    nb, bs = key_cache.shape[:2]
    if t == 0 or h * d == 0:
        return
    block = min(1024, triton.next_power_of_2(h * d))
    grid = (t, triton.cdiv(h * d, block))
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
        *key_cache.stride()[:3],
        *value_cache.stride()[:3],
        nb * bs,
        bs,
        h,
        d,
        FP8=fp8,
        BLOCK=block,
        num_warps=4,
    )
