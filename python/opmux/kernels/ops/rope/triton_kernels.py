"""Triton rotary embedding (imported only when the triton backend first runs).

One program per token: the token's cos / sin are loaded once and applied to every q and k
head as one [heads, rotary_dim / 2] tile each. Out-of-range positions are clamped (no
out-of-bounds read) and poison the token with NaN; CPU callers check on the host first.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate(
    X, sh, H, cos, sin, r, rmask, HALF, BLOCK_H: tl.constexpr, NEOX: tl.constexpr, VLLM: tl.constexpr
):
    h = tl.arange(0, BLOCK_H)
    mask = (h[:, None] < H) & rmask[None, :]
    if NEOX:
        i1 = r
        i2 = r + HALF
    else:
        i1 = 2 * r
        i2 = 2 * r + 1
    p1 = X + h[:, None] * sh + i1[None, :]
    p2 = X + h[:, None] * sh + i2[None, :]
    a = tl.load(p1, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(p2, mask=mask, other=0.0).to(tl.float32)
    dt = X.dtype.element_ty
    if VLLM:  # vLLM's rounding: cos / sin in x's dtype, each product and the sum rounded to it
        c = cos[None, :].to(dt).to(tl.float32)
        s = sin[None, :].to(dt).to(tl.float32)
        lo = (a * c).to(dt).to(tl.float32) - (b * s).to(dt).to(tl.float32)
        hi = (b * c).to(dt).to(tl.float32) + (a * s).to(dt).to(tl.float32)
    else:
        lo = a * cos[None, :] - b * sin[None, :]
        hi = b * cos[None, :] + a * sin[None, :]
    tl.store(p1, lo.to(dt), mask=mask)
    tl.store(p2, hi.to(dt), mask=mask)


@triton.jit
def _rope(
    P,
    Q,
    K,
    C,
    sqt,
    sqh,
    skt,
    skh,
    sc,
    max_pos,
    HQ,
    HK,
    HALF,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_R: tl.constexpr,
    NEOX: tl.constexpr,
    VLLM: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(P + t)
    ok = (pos >= 0) & (pos < max_pos)
    row = C + tl.where(ok, pos, 0) * sc
    r = tl.arange(0, BLOCK_R)
    rmask = r < HALF
    poison = tl.where(ok, 0.0, float("nan"))  # NaN + x = NaN: flags the token, reads stay in bounds
    cos = tl.load(row + r, mask=rmask, other=0.0).to(tl.float32) + poison
    sin = tl.load(row + HALF + r, mask=rmask, other=0.0).to(tl.float32) + poison
    _rotate(Q + t * sqt, sqh, HQ, cos, sin, r, rmask, HALF, BLOCK_HQ, NEOX, VLLM)
    _rotate(K + t * skt, skh, HK, cos, sin, r, rmask, HALF, BLOCK_HK, NEOX, VLLM)


def rotary_embedding(
    pos: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cache: torch.Tensor,
    is_neox: bool,
    vllm_rounding: bool = False,
) -> None:
    """pos [T] int64, q [T, Hq, D], k [T, Hk, D] (unit last stride), cache [max_pos, rot]."""
    tokens, hq, _ = q.shape
    hk = k.shape[1]
    half = cache.shape[1] // 2
    if tokens == 0 or hq + hk == 0:
        return
    block_r = triton.next_power_of_2(half)
    block_hq, block_hk = triton.next_power_of_2(max(hq, 1)), triton.next_power_of_2(max(hk, 1))
    tile = max(block_hq, block_hk) * block_r
    _rope[(tokens,)](
        pos,
        q,
        k,
        cache,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        cache.stride(0),
        cache.shape[0],
        hq,
        hk,
        half,
        BLOCK_HQ=block_hq,
        BLOCK_HK=block_hk,
        BLOCK_R=block_r,
        NEOX=bool(is_neox),
        VLLM=bool(vllm_rounding),
        num_warps=4 if tile <= 4096 else 8,
    )
