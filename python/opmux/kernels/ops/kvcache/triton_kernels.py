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
    kd = (d // kx) * kchi + (d % kx) * kclo  # element d of a head row (chunks of x: vLLM's paged key)
    vd = (d // vx) * vchi + (d % vx) * vclo
    _store(KC + blk * kcb + off * kcp + h * kch + kd, k, ks, mask, FP8)
    _store(VC + blk * vcb + off * vcp + h * vch + vd, v, vs, mask, FP8)


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
