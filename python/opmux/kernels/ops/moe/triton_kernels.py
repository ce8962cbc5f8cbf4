"""Triton MoE routing kernels (imported only when the triton backend first runs)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _topk_softmax(G, W, IDS, sg, E, K, RENORM: tl.constexpr, BLOCK: tl.constexpr, KBLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    kcols = tl.arange(0, KBLOCK)
    inb = cols < E
    x = tl.load(G + row * sg + cols, mask=inb, other=float("-inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    ex = tl.where(inb, tl.exp(x - m), 0.0)
    inv_sum = tl.math.div_rn(1.0, tl.sum(ex, axis=0))
    avail = inb
    nan = x != x  # NaN ranks above every logit (as torch.sort has it); its row's weights are NaN
    wk = tl.zeros([KBLOCK], dtype=tl.float32)
    ik = tl.zeros([KBLOCK], dtype=tl.int32)
    for j in range(K):
        best = tl.max(tl.where(avail & ~nan, x, float("-inf")), axis=0)
        # lowest available index holding the best logit (ties -> lower expert id), NaNs first
        idx = tl.min(tl.where(avail & ~nan & (x == best), cols, BLOCK), axis=0)
        nan_idx = tl.min(tl.where(avail & nan, cols, BLOCK), axis=0)
        idx = tl.where(nan_idx < BLOCK, nan_idx, idx)
        w = tl.sum(tl.where(cols == idx, ex, 0.0), axis=0) * inv_sum
        wk = tl.where(kcols == j, w, wk)
        ik = tl.where(kcols == j, idx, ik)
        avail = avail & (cols != idx)
    if RENORM:
        wk = wk * tl.math.div_rn(1.0, tl.sum(wk, axis=0))
    tl.store(W + row * K + kcols, wk, mask=kcols < K)
    tl.store(IDS + row * K + kcols, ik, mask=kcols < K)


# The kernel argument lists of the moe ops (see op.py).
def topk_softmax(w: torch.Tensor, ids: torch.Tensor, g: torch.Tensor, renormalize: bool) -> None:
    t, e = g.shape
    if t == 0:
        return
    block = triton.next_power_of_2(e)
    k = w.shape[1]
    _topk_softmax[(t,)](
        g,
        w,
        ids,
        g.stride(0),
        e,
        k,
        RENORM=renormalize,
        BLOCK=block,
        KBLOCK=triton.next_power_of_2(k),
        num_warps=1 if block <= 256 else 4,
    )


@triton.jit
def _align_count(IDS, COUNTS, N, BLOCK: tl.constexpr):
    """Program e: number of entries routed to expert e."""
    e = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(0, N, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        v = tl.load(IDS + offs, mask=offs < N, other=-1)
        acc += (v == e).to(tl.int32)
    tl.store(COUNTS + e, tl.sum(acc, axis=0))


@triton.jit
def _align_scatter(
    IDS, COUNTS, SORTED, EXPERT_IDS, POST, N, E, BS, BLOCK: tl.constexpr, EBLOCK: tl.constexpr
):
    """Program e: writes its block owners and its entries' flat indices, in token order."""
    e = tl.program_id(0)
    ex = tl.arange(0, EBLOCK)
    c = tl.load(COUNTS + ex, mask=ex < E, other=0)
    padded = (c + BS - 1) // BS * BS
    start = tl.sum(tl.where(ex < e, padded, 0), axis=0)
    mine = tl.sum(tl.where(ex == e, padded, 0), axis=0)
    if e == 0:
        tl.store(POST, tl.sum(padded, axis=0))
    for b in range(0, mine // BS):
        tl.store(EXPERT_IDS + start // BS + b, e)
    running = start
    for s in range(0, N, BLOCK):
        offs = s + tl.arange(0, BLOCK)
        v = tl.load(IDS + offs, mask=offs < N, other=-1)
        hit = (v == e).to(tl.int32)
        pos = running + tl.cumsum(hit, axis=0) - 1  # inclusive scan: stable ranks
        tl.store(SORTED + pos, offs.to(tl.int32), mask=hit == 1)
        running += tl.sum(hit, axis=0)


def moe_align_block_size(
    sorted_ids: torch.Tensor, expert_ids: torch.Tensor, post: torch.Tensor, ids: torch.Tensor, bs: int, e: int
) -> None:
    n = ids.numel()
    sorted_ids.fill_(n)
    expert_ids.fill_(-1)
    counts = torch.empty(e, dtype=torch.int32, device=ids.device)
    block = min(1024, max(16, triton.next_power_of_2(n)))
    _align_count[(e,)](ids, counts, n, BLOCK=block)
    _align_scatter[(e,)](
        ids,
        counts,
        sorted_ids,
        expert_ids,
        post,
        n,
        e,
        bs,
        BLOCK=block,
        EBLOCK=max(16, triton.next_power_of_2(e)),
    )
