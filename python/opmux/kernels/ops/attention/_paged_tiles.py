"""Triton pieces both paged attention kernels share (decode's split kernel, ``triton_kernels``, and
prefill's, ``_prefill_triton``): the key / value tile loader through a block table, the test for
MLA's value-as-key-prefix view, and tanh for softcap."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def value_is_key_prefix(key_cache: torch.Tensor, value_cache: torch.Tensor) -> bool:
    """Whether ``value_cache`` is ``key_cache[..., :Dv]`` (same start, dtype and strides: MLA's
    latent cache passed twice), so the kernel takes the value rows from the key tile it read."""
    return (
        value_cache.data_ptr() == key_cache.data_ptr()
        and value_cache.dtype == key_cache.dtype
        and value_cache.stride() == key_cache.stride()
    )


@triton.jit
def _tanh(x):
    """tanh from one exp of a non-positive argument (no overflow; no libdevice in the interpreter)."""
    t = tl.exp(-2.0 * tl.abs(x))
    y = (1.0 - t) / (1.0 + t)
    return tl.where(x < 0.0, -y, y)


@triton.jit
def _load_tile(
    kbase,
    vbase,
    bt_row,
    sbt_m,
    n0,
    end,
    num_blocks,
    sk_b,
    sk_p,
    sv_b,
    sv_p,
    d,
    dmask,
    dr,
    rmask,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_TAIL: tl.constexpr,
    V_FROM_K: tl.constexpr,
):
    """One key tile's rows ``[n0, n0 + BLOCK_N)`` of the sequence through its block table, in the
    cache's dtype: (keys ``[0, Dv)``, values, keys ``[Dv, D)`` (the keys again without a tail),
    which rows are real). Positions at or past ``end`` and bad block ids load nothing."""
    pos = n0 + tl.arange(0, BLOCK_N)
    inr = pos < end
    blk = tl.load(bt_row + (pos // PAGE_SIZE).to(tl.int64) * sbt_m, mask=inr, other=-1)
    ok = inr & (blk >= 0) & (blk < num_blocks)  # a bad block id: its tokens are skipped
    page_off = (pos % PAGE_SIZE).to(tl.int64)
    kmask = ok[:, None] & dmask[None, :]
    krow = kbase + (blk.to(tl.int64) * sk_b + page_off * sk_p)[:, None]
    k = tl.load(krow + d[None, :], mask=kmask, other=0.0)
    if V_FROM_K:  # value_cache = key_cache[..., :Dv]: the rows just read
        v = k
    else:
        v = tl.load(
            vbase + (blk.to(tl.int64) * sv_b + page_off * sv_p)[:, None] + d[None, :], mask=kmask, other=0.0
        )
    if HAS_TAIL:
        kr = tl.load(krow + dr[None, :], mask=ok[:, None] & rmask[None, :], other=0.0)
    else:
        kr = k
    return k, v, kr, ok
