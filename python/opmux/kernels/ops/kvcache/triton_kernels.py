"""Triton reshape_and_cache (imported only when the triton backend first runs).

Program (t, c) copies chunk c of token t's H*D key and value elements; a negative or
out-of-range slot masks every store (the token is skipped).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _reshape_and_cache(K, V, KC, VC, SLOTS, skt, skh, svt, svh, scb, NSLOTS, BS, H, D, BLOCK: tl.constexpr):
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
    dst = (safe // BS) * scb + (safe % BS) * (H * D) + offs
    tl.store(KC + dst, k, mask=mask)
    tl.store(VC + dst, v, mask=mask)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    t, h, d = key.shape
    nb, bs = key_cache.shape[:2]
    if t == 0 or h * d == 0:
        return
    if key_cache.stride(0) != value_cache.stride(0):
        raise ValueError(
            "kvcache.reshape_and_cache: key_cache and value_cache must have the same block stride for triton"
        )
    block = min(1024, triton.next_power_of_2(h * d))
    grid = (t, triton.cdiv(h * d, block))
    _reshape_and_cache[grid](
        key,
        value,
        key_cache,
        value_cache,
        slots,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        key_cache.stride(0),
        nb * bs,
        bs,
        h,
        d,
        BLOCK=block,
        num_warps=4,
    )
