"""Triton MoE routing kernels (imported only when the triton backend first runs)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _tanh(x):
    """Cephes tanhf, as the CPU kernel's tanh_f (odd polynomial below 0.625, 1 - 2 / (e^2|x| + 1) above)."""
    ax = tl.abs(x)
    z = x * x
    p = -5.70498872745e-3
    p = p * z + 2.06390887954e-2
    p = p * z - 5.37397155531e-2
    p = p * z + 1.33314422036e-1
    p = p * z - 3.33332819422e-1
    small = p * z * x + x
    big = 1.0 - 2.0 / (tl.exp(ax + ax) + 1.0)
    big = tl.where(x < 0.0, -big, big)
    return tl.where(ax < 0.625, small, big)


@triton.jit
def _topk_softmax(
    G,
    W,
    IDS,
    TEI,
    BIAS,
    sg,
    sw,
    sid,
    stei,
    T,
    E,
    K,
    cap,
    RENORM: tl.constexpr,
    HAS_TEI: tl.constexpr,
    BIAS_MODE: tl.constexpr,  # 0: none, 1: DeepSeek (choose by softmax + bias), 2: bias on logits
    SOFTCAP: tl.constexpr,
    BLOCK: tl.constexpr,
    KBLOCK: tl.constexpr,
    SIGMOID: tl.constexpr = False,  # topk_sigmoid: scores sigmoid(x), chosen by score (+ bias, BIAS_MODE 1)
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    kcols = tl.arange(0, KBLOCK)
    inb = cols < E
    x = tl.load(G + row * sg + cols, mask=inb, other=float("-inf")).to(tl.float32)
    if SOFTCAP:
        x = tl.where(inb, _tanh(x / cap) * cap, float("-inf"))
    if BIAS_MODE != 0:
        b = tl.load(BIAS + cols, mask=inb, other=0.0)
    if BIAS_MODE == 2:
        x = tl.where(inb, x + b, float("-inf"))
    if SIGMOID:
        ex = tl.where(inb, tl.math.div_rn(1.0, 1.0 + tl.exp(-x)), 0.0)  # the weights: the scores
        inv_sum = 1.0
        x = tl.where(inb, ex, float("-inf"))  # the ranking key: the score
        if BIAS_MODE == 1:
            x = tl.where(inb, ex + b, float("-inf"))
    else:
        m = tl.max(x, axis=0)
        ex = tl.where(inb, tl.exp(x - m), 0.0)
        total_e = tl.sum(ex, axis=0)
        inv_sum = tl.math.div_rn(1.0, total_e)
        if BIAS_MODE == 1:
            x = tl.where(inb, tl.math.div_rn(ex, total_e) + b, float("-inf"))  # the ranking key
    # a NaN key (a NaN logit or bias) ranks above every other (as torch.sort has it); a NaN logit
    # makes its row's weights NaN
    nan = x != x
    avail = inb
    wk = tl.zeros([KBLOCK], dtype=tl.float32)
    ik = tl.zeros([KBLOCK], dtype=tl.int32)
    for j in range(K):
        best = tl.max(tl.where(avail & ~nan, x, float("-inf")), axis=0)
        # lowest available index holding the best key (ties -> lower expert id), NaNs first
        idx = tl.min(tl.where(avail & ~nan & (x == best), cols, BLOCK), axis=0)
        nan_idx = tl.min(tl.where(avail & nan, cols, BLOCK), axis=0)
        idx = tl.where(nan_idx < BLOCK, nan_idx, idx)
        w = tl.sum(tl.where(cols == idx, ex, 0.0), axis=0) * inv_sum
        wk = tl.where(kcols == j, w, wk)
        ik = tl.where(kcols == j, idx, ik)
        avail = avail & (cols != idx)
    if RENORM:
        wk = wk * tl.math.div_rn(1.0, tl.sum(wk, axis=0))
    tl.store(W + row * sw + kcols, wk, mask=kcols < K)
    tl.store(IDS + row * sid + kcols, ik.to(IDS.dtype.element_ty), mask=kcols < K)
    if HAS_TEI:
        tl.store(TEI + row * stei + kcols, (kcols * T + row).to(tl.int32), mask=kcols < K)


def _launch_topk(
    w: torch.Tensor,
    ids: torch.Tensor,
    tei: torch.Tensor,
    has_tei: bool,
    g: torch.Tensor,
    bias: torch.Tensor,
    renormalize: bool,
    softcap: float,
    bias_mode: int,
    sigmoid: bool,
) -> None:
    """One program per token row of ``_topk_softmax`` (softmax or sigmoid scoring)."""
    t, e = g.shape
    if t == 0:
        return
    block = triton.next_power_of_2(e)
    k = w.shape[1]
    _topk_softmax[(t,)](
        g,
        w,
        ids,
        tei,
        bias,
        g.stride(0),
        w.stride(0),
        ids.stride(0),
        tei.stride(0),
        t,
        e,
        k,
        softcap if softcap else 1.0,
        RENORM=renormalize,
        HAS_TEI=has_tei,
        BIAS_MODE=bias_mode,
        SOFTCAP=softcap > 0,
        BLOCK=block,
        KBLOCK=triton.next_power_of_2(k),
        SIGMOID=sigmoid,
        num_warps=1 if block <= 256 else 4,
    )


# The kernel argument lists of the moe ops (see op.py).
def topk_softmax(
    w: torch.Tensor,
    ids: torch.Tensor,
    tei: torch.Tensor,
    has_tei: bool,
    g: torch.Tensor,
    bias: torch.Tensor,
    has_bias: bool,
    renormalize: bool,
    softcap: float,
    bias_on_logits: bool,
) -> None:
    bias_mode = (2 if bias_on_logits else 1) if has_bias else 0
    _launch_topk(w, ids, tei, has_tei, g, bias, renormalize, softcap, bias_mode, sigmoid=False)


def topk_sigmoid(
    w: torch.Tensor,
    ids: torch.Tensor,
    tei: torch.Tensor,
    has_tei: bool,
    g: torch.Tensor,
    bias: torch.Tensor,
    has_bias: bool,
    renormalize: bool,
) -> None:
    _launch_topk(w, ids, tei, has_tei, g, bias, renormalize, 0.0, 1 if has_bias else 0, sigmoid=True)


@triton.jit
def _align_count(IDS, MAP, COUNTS, N, E, HAS_MAP: tl.constexpr, BLOCK: tl.constexpr):
    """Program e: number of entries routed to (local) expert e."""
    e = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(0, N, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        v = _bin(IDS, MAP, offs, N, E, HAS_MAP)
        acc += (v == e).to(tl.int32)
    tl.store(COUNTS + e, tl.sum(acc, axis=0))


@triton.jit
def _bin(IDS, MAP, offs, N, E, HAS_MAP: tl.constexpr):
    """The bin of entries ``offs``: the expert id (through MAP), or -1 (not placed)."""
    v = tl.load(IDS + offs, mask=offs < N, other=-1).to(tl.int64)
    ok = (v >= 0) & (v < E)
    v = tl.where(ok, v, -1)
    if HAS_MAP:
        m = tl.load(MAP + tl.where(ok, v, 0), mask=ok, other=-1).to(tl.int64)
        v = tl.where(ok & (m >= 0) & (m < E), m, -1)
    return v


@triton.jit
def _align_scatter(
    IDS,
    MAP,
    COUNTS,
    SORTED,
    EXPERT_IDS,
    POST,
    CUMSUM,
    N,
    E,
    BS,
    NBLOCKS,
    FILL,
    HAS_MAP: tl.constexpr,
    HAS_CUMSUM: tl.constexpr,
    BLOCK: tl.constexpr,
    EBLOCK: tl.constexpr,
):
    """Program e: writes its block owners and its entries' flat indices, in token order;
    program 0 also the total, the cumsum and the unused blocks."""
    e = tl.program_id(0)
    ex = tl.arange(0, EBLOCK)
    c = tl.load(COUNTS + ex, mask=ex < E, other=0)
    padded = (c + BS - 1) // BS * BS
    start = tl.sum(tl.where(ex < e, padded, 0), axis=0)
    mine = tl.sum(tl.where(ex == e, padded, 0), axis=0)
    if e == 0:
        total = tl.sum(padded, axis=0)
        tl.store(POST, total)
        if HAS_CUMSUM:
            tl.store(CUMSUM + ex, tl.cumsum(padded, axis=0) - padded, mask=ex < E)
            tl.store(CUMSUM + E, total)
        for b0 in range(total // BS, NBLOCKS, BLOCK):
            bo = b0 + tl.arange(0, BLOCK)
            tl.store(EXPERT_IDS + bo, tl.zeros([BLOCK], dtype=tl.int32) + FILL, mask=bo < NBLOCKS)
    for b in range(0, mine // BS):
        tl.store(EXPERT_IDS + start // BS + b, e)
    running = start
    for s in range(0, N, BLOCK):
        offs = s + tl.arange(0, BLOCK)
        v = _bin(IDS, MAP, offs, N, E, HAS_MAP)
        hit = (v == e).to(tl.int32)
        pos = running + tl.cumsum(hit, axis=0) - 1  # inclusive scan: stable ranks
        tl.store(SORTED + pos, offs.to(tl.int32), mask=hit == 1)
        running += tl.sum(hit, axis=0)


def moe_align_block_size(
    sorted_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    post: torch.Tensor,
    cumsum: torch.Tensor,
    has_cumsum: bool,
    ids: torch.Tensor,
    expert_map: torch.Tensor,
    has_map: bool,
    bs: int,
    e: int,
    pad: bool,
    fill: int,
) -> None:
    n = ids.numel()
    if pad:
        sorted_ids.fill_(n)
    counts = torch.empty(e, dtype=torch.int32, device=ids.device)
    block = min(1024, max(16, triton.next_power_of_2(n)))
    _align_count[(e,)](ids, expert_map, counts, n, e, HAS_MAP=has_map, BLOCK=block)
    _align_scatter[(e,)](
        ids,
        expert_map,
        counts,
        sorted_ids,
        expert_ids,
        post,
        cumsum,
        n,
        e,
        bs,
        expert_ids.numel(),
        fill,
        HAS_MAP=has_map,
        HAS_CUMSUM=has_cumsum,
        BLOCK=block,
        EBLOCK=max(16, triton.next_power_of_2(e)),
    )


@triton.jit
def _batched_align(
    COUNTS,
    SORTED,
    EXPERT_IDS,
    POST,
    E,
    M,
    BS,
    NSORTED,
    NBLOCKS,
    BLOCK: tl.constexpr,
    EBLOCK: tl.constexpr,
):
    """Program x: expert x's slots (its entries x * M + j, then the sentinel E * M) and blocks;
    program 0 also the total and every slot / block past it. Counts are clamped to [0, M]."""
    x = tl.program_id(0)
    ex = tl.arange(0, EBLOCK)
    c = tl.load(COUNTS + ex, mask=ex < E, other=0)
    c = tl.minimum(tl.maximum(c, 0), M)
    padded = (c + BS - 1) // BS * BS
    start = tl.sum(tl.where(ex < x, padded, 0), axis=0)
    mine = tl.sum(tl.where(ex == x, padded, 0), axis=0)
    cnt = tl.sum(tl.where(ex == x, c, 0), axis=0)
    sentinel = E * M
    for s0 in range(0, mine, BLOCK):
        j = s0 + tl.arange(0, BLOCK)
        v = tl.where(j < cnt, x * M + j, sentinel)
        tl.store(SORTED + start + j, v, mask=j < mine)
    for b0 in range(0, mine // BS, BLOCK):
        b = b0 + tl.arange(0, BLOCK)
        tl.store(EXPERT_IDS + start // BS + b, tl.zeros([BLOCK], dtype=tl.int32) + x, mask=b < mine // BS)
    if x == 0:
        total = tl.sum(padded, axis=0)
        tl.store(POST, total)
        for s0 in range(total, NSORTED, BLOCK):
            i = s0 + tl.arange(0, BLOCK)
            tl.store(SORTED + i, tl.zeros([BLOCK], dtype=tl.int32) + sentinel, mask=i < NSORTED)
        for b0 in range(total // BS, NBLOCKS, BLOCK):
            b = b0 + tl.arange(0, BLOCK)
            tl.store(EXPERT_IDS + b, tl.zeros([BLOCK], dtype=tl.int32) - 1, mask=b < NBLOCKS)


def batched_moe_align_block_size(
    sorted_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    post: torch.Tensor,
    counts: torch.Tensor,
    m: int,
    bs: int,
) -> None:
    e = counts.numel()
    _batched_align[(e,)](
        counts,
        sorted_ids,
        expert_ids,
        post,
        e,
        m,
        bs,
        sorted_ids.numel(),
        expert_ids.numel(),
        BLOCK=min(1024, max(16, triton.next_power_of_2(m))),
        EBLOCK=max(16, triton.next_power_of_2(e)),
    )


from .fused_experts_triton import fused_experts, launch_fused_experts  # noqa: E402,F401
