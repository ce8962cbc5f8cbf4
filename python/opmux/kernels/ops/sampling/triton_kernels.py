"""Triton launchers of the sampling ops: each takes check()'s kernel arguments (ops/sampling/op.py).

No sort. A program takes ``ROWS`` rows (one row per program for real vocabularies: ``ROWS`` is 1
once a row fills the ``TILE``-element tile; short rows are packed, several to a program) and
walks each row in ``BLOCK``-wide blocks (at most ``MAX_BLOCK``):

* a threshold (the k-th largest value, the top-p boundary value) is found by a binary search on
  the value's bits: the float32 bits of a probability (non-negative: its bits order as its value)
  or an order-preserving int key of a logit. Each of the 31 (probabilities) or 32 (logits) steps
  is one pass over the row counting the entries ``>= pivot`` (top-k) or summing their mass
  (top-p), keeping the invariant ``stat(>= lo) >= need > stat(>= hi)``. The search ends on the
  exact largest key that satisfies it, which is a value of the row: the threshold; masking
  ``x >= threshold`` keeps every value tied with it;
* the kept mass is one more pass (the same blocked sum as the search's, so the top-p invariant
  holds at the start of the search exactly); a renorm op then writes ``x / mass``;
* sampling draws ``u`` (Philox: seed, counter ``(offset lo, offset hi, row, 0)``) and walks the row
  once more with a blocked prefix sum (``tl.cumsum`` plus the blocks before), stopping at the
  first index whose cumulative kept mass exceeds ``u * mass``.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.random import uint_to_uniform_float

#: the widest block a row is walked in
MAX_BLOCK = 2048
#: elements of one program's tile: short rows are packed until a tile is full, longer ones take a
#: program each. The interpreter runs programs one after another at a cost per operation: there a
#: program takes many more rows (the kernels are the same; ``ROWS`` is a parameter)
TILE = 65536 if os.environ.get("TRITON_INTERPRET") == "1" else MAX_BLOCK
#: the search ranges: probabilities [0, bits(inf) + 1) (31 halvings), logit keys [-2^31, 2^31) (32)
_P_LO, _P_HI, _P_ITERS = 0, 0x7F800001, 31
_L_LO, _L_HI, _L_ITERS = -(2**31), 2**31, 32


@triton.jit
def _key(x, ORDERED: tl.constexpr):
    """An int32 key that orders as ``x`` (float32): its bits, for non-negative values; for logits
    the negative ones' magnitude bits flipped (``ORDERED``). -0 takes +0's key: the two are one
    value, so a zero tied with a zero threshold is kept whatever its sign (the ops' ``x >= t``)."""
    b = x.to(tl.int32, bitcast=True)
    b = tl.where((b & 0x7FFFFFFF) == 0, 0, b)
    if ORDERED:
        b = b ^ ((b >> 31) & 0x7FFFFFFF)
    return b


@triton.jit
def _stat(
    X,
    sx,
    rows,
    rmask,
    n,
    pivot,
    MASS: tl.constexpr,
    ORDERED: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Per row: the count (``MASS`` False) or the sum of the entries whose key is ``>= pivot``."""
    if MASS:
        acc = tl.zeros([ROWS], dtype=tl.float32)
    else:
        acc = tl.zeros([ROWS], dtype=tl.int32)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        valid = rmask[:, None] & (cols < n)[None, :]
        x = tl.load(X + rows[:, None] * sx + cols[None, :], mask=valid, other=0.0).to(tl.float32)
        ge = valid & (_key(x, ORDERED).to(tl.int64) >= pivot[:, None])
        if MASS:
            acc += tl.sum(tl.where(ge, x, 0.0), axis=1)
        else:
            acc += tl.sum(ge.to(tl.int32), axis=1)
    return acc


@triton.jit
def _search(
    X,
    sx,
    rows,
    rmask,
    n,
    lo,
    hi,
    need,
    MASS: tl.constexpr,
    ORDERED: tl.constexpr,
    ITERS: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """The largest key ``v`` in ``[lo, hi)`` with ``stat(>= v) >= need``, given
    ``stat(>= lo) >= need`` and ``stat(>= hi) < need`` (``ITERS`` >= log2(hi - lo))."""
    for _ in range(ITERS):
        mid = (lo + hi) >> 1
        ok = _stat(X, sx, rows, rmask, n, mid, MASS, ORDERED, ROWS, BLOCK) >= need
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid)
    return lo


@triton.jit
def _top_k_key(
    X,
    sx,
    rows,
    rmask,
    n,
    K,
    k_val,
    HAS_K_ARR: tl.constexpr,
    ORDERED: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """(the k-th largest key per row, whether top-k is on): off rows (k = 0, k >= V) get the
    lowest key, which keeps every entry."""
    if HAS_K_ARR:
        k = tl.load(K + rows, mask=rmask, other=0).to(tl.int32)
    else:
        k = tl.zeros([ROWS], dtype=tl.int32) + k_val
    on = (k > 0) & (k < n)
    if ORDERED:
        lo0 = tl.full([ROWS], -2147483648, tl.int64)
        hi0 = tl.full([ROWS], 2147483648, tl.int64)
        t = _search(X, sx, rows, rmask, n, lo0, hi0, k, False, True, 32, ROWS, BLOCK)
    else:
        lo0 = tl.zeros([ROWS], dtype=tl.int64)
        hi0 = tl.full([ROWS], 0x7F800001, tl.int64)
        t = _search(X, sx, rows, rmask, n, lo0, hi0, k, False, False, 31, ROWS, BLOCK)
    return tl.where(on, t, lo0), on


@triton.jit
def _top_p_key(
    X, sx, rows, rmask, n, base, P, p_val, HAS_P_ARR: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr
):
    """(the top-p boundary key per row, on): the largest value whose ``>=`` mass reaches p times
    the mass above ``base`` (a key: 0 for the whole row, the top-k threshold for top_k_first)."""
    if HAS_P_ARR:
        p = tl.load(P + rows, mask=rmask, other=1.0)
    else:
        p = tl.zeros([ROWS], dtype=tl.float32) + p_val
    on = p < 1.0
    need = p * _stat(X, sx, rows, rmask, n, base, True, False, ROWS, BLOCK)
    hi0 = tl.full([ROWS], 0x7F800001, tl.int64)
    t = _search(X, sx, rows, rmask, n, base, hi0, need, True, False, 31, ROWS, BLOCK)
    # no mass above base (an all-zero row): every entry holds "p of nothing", as the definition
    # keeps the whole row (its renorm is then 0 / 0, NaN, as the reference's)
    return tl.where(on & (need > 0.0), t, base), on


@triton.jit
def _renorm_write(Y, sy, X, sx, rows, rmask, n, t, on, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """``y = x / mass(>= t)`` where ``x >= t``, else 0; rows not ``on`` copied."""
    mass = _stat(X, sx, rows, rmask, n, t, True, False, ROWS, BLOCK)
    mass = tl.where(rmask, mass, 1.0)  # (rows past the batch: no 0 / 0)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        valid = rmask[:, None] & (cols < n)[None, :]
        x = tl.load(X + rows[:, None] * sx + cols[None, :], mask=valid, other=0.0)
        keep = _key(x, False).to(tl.int64) >= t[:, None]
        y = tl.where(on[:, None], tl.where(keep, x / mass[:, None], 0.0), x)
        tl.store(Y + rows[:, None] * sy + cols[None, :], y, mask=valid)


@triton.jit
def _top_k_renorm(
    Y, sy, X, sx, B, n, K, k_val, HAS_K_ARR: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    rmask = rows < B
    t, on = _top_k_key(X, sx, rows, rmask, n, K, k_val, HAS_K_ARR, False, ROWS, BLOCK)
    _renorm_write(Y, sy, X, sx, rows, rmask, n, t, on, ROWS, BLOCK)


@triton.jit
def _top_p_renorm(
    Y, sy, X, sx, B, n, P, p_val, HAS_P_ARR: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    rmask = rows < B
    base = tl.zeros([ROWS], dtype=tl.int64)
    t, on = _top_p_key(X, sx, rows, rmask, n, base, P, p_val, HAS_P_ARR, ROWS, BLOCK)
    _renorm_write(Y, sy, X, sx, rows, rmask, n, t, on, ROWS, BLOCK)


@triton.jit
def _top_k_mask(
    Y, sy, X, sx, B, n, K, k_val, HAS_K_ARR: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    rmask = rows < B
    t, on = _top_k_key(X, sx, rows, rmask, n, K, k_val, HAS_K_ARR, True, ROWS, BLOCK)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        valid = rmask[:, None] & (cols < n)[None, :]
        x = tl.load(X + rows[:, None] * sx + cols[None, :], mask=valid, other=0.0)
        drop = on[:, None] & (_key(x.to(tl.float32), True).to(tl.int64) < t[:, None])
        tl.store(Y + rows[:, None] * sy + cols[None, :], tl.where(drop, float("-inf"), x), mask=valid)


@triton.jit
def _greedy(Y, X, sx, B, n, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    rmask = rows < B
    best = tl.full([ROWS], float("-inf"), tl.float32)
    idx = tl.zeros([ROWS], dtype=tl.int32)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        valid = rmask[:, None] & (cols < n)[None, :]
        x = tl.load(X + rows[:, None] * sx + cols[None, :], mask=valid, other=float("-inf")).to(tl.float32)
        bmax = tl.max(x, axis=1)
        bidx = tl.min(tl.where(valid & (x == bmax[:, None]), cols[None, :], 2147483647), axis=1)
        upd = bmax > best  # strictly: an equal maximum in a later block keeps the lower index
        best = tl.where(upd, bmax, best)
        idx = tl.where(upd, bidx, idx)
    tl.store(Y + rows, idx, mask=rmask)


@triton.jit
def _uniform(rows, SEED, seed_val, OFFSET, offset_val, HAS_SEED: tl.constexpr, HAS_OFFSET: tl.constexpr):
    """One uniform in [0, 1) per row: Philox keyed by the seed, counter (offset lo, hi, row, 0)."""
    if HAS_SEED:
        seed = tl.load(SEED)
    else:
        seed = seed_val.to(tl.int64)
    if HAS_OFFSET:
        off = tl.load(OFFSET).to(tl.int64)
    else:
        off = offset_val.to(tl.int64)
    r = rows.to(tl.uint32)
    zero = r * 0
    lo = zero + (off & 0xFFFFFFFF).to(tl.uint32)
    hi = zero + ((off >> 32) & 0xFFFFFFFF).to(tl.uint32)
    c0, _, _, _ = tl.philox(seed.to(tl.int64), lo, hi, r, zero)
    return uint_to_uniform_float(c0)


@triton.jit
def _draw(Y, X, sx, rows, rmask, n, t, u, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """Inverse CDF over the entries ``>= t``: the first index whose cumulative kept mass exceeds
    ``u * kept mass`` (else the last kept positive entry, else 0)."""
    target = u * _stat(X, sx, rows, rmask, n, t, True, False, ROWS, BLOCK)
    carry = tl.zeros([ROWS], dtype=tl.float32)
    found = tl.full([ROWS], -1, tl.int32)
    last = tl.full([ROWS], -1, tl.int32)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        valid = rmask[:, None] & (cols < n)[None, :]
        x = tl.load(X + rows[:, None] * sx + cols[None, :], mask=valid, other=0.0)
        keep = valid & (_key(x, False).to(tl.int64) >= t[:, None])
        q = tl.where(keep, x, 0.0)
        cs = carry[:, None] + tl.cumsum(q, axis=1)
        hit = keep & (cs > target[:, None])
        first = tl.min(tl.where(hit, cols[None, :], 2147483647), axis=1)
        found = tl.where((found < 0) & (first < 2147483647), first, found)
        last = tl.maximum(last, tl.max(tl.where(keep & (x > 0.0), cols[None, :], -1), axis=1))
        carry += tl.sum(q, axis=1)
    ids = tl.where(found >= 0, found, tl.maximum(last, 0))
    tl.store(Y + rows, ids, mask=rmask)


#: a seed or offset is a runtime value: no recompilation per value (nor for 1, nor per alignment)
_RANDOM_ARGS = ["seed_val", "offset_val"]


@triton.jit(do_not_specialize=_RANDOM_ARGS)
def _top_k_top_p_sample(
    Y, X, sx, B, n, K, k_val, P, p_val, SEED, seed_val, OFFSET, offset_val,
    HAS_K: tl.constexpr, HAS_K_ARR: tl.constexpr, HAS_P: tl.constexpr, HAS_P_ARR: tl.constexpr,
    HAS_SEED: tl.constexpr, HAS_OFFSET: tl.constexpr, JOINT: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    rmask = rows < B
    t = tl.zeros([ROWS], dtype=tl.int64)
    if HAS_K:
        t, _ = _top_k_key(X, sx, rows, rmask, n, K, k_val, HAS_K_ARR, False, ROWS, BLOCK)
    if HAS_P:
        if JOINT:
            tp, _ = _top_p_key(
                X, sx, rows, rmask, n, tl.zeros([ROWS], dtype=tl.int64), P, p_val, HAS_P_ARR, ROWS, BLOCK
            )
            t = tl.maximum(t, tp)
        else:
            t, _ = _top_p_key(X, sx, rows, rmask, n, t, P, p_val, HAS_P_ARR, ROWS, BLOCK)
    u = _uniform(rows, SEED, seed_val, OFFSET, offset_val, HAS_SEED, HAS_OFFSET)
    _draw(Y, X, sx, rows, rmask, n, t, u, ROWS, BLOCK)


@triton.jit(do_not_specialize=_RANDOM_ARGS)
def _min_p_sample(
    Y, X, sx, B, n, M, m_val, SEED, seed_val, OFFSET, offset_val,
    HAS_M_ARR: tl.constexpr, HAS_SEED: tl.constexpr, HAS_OFFSET: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    rmask = rows < B
    if HAS_M_ARR:
        m = tl.load(M + rows, mask=rmask, other=0.0)
    else:
        m = tl.zeros([ROWS], dtype=tl.float32) + m_val
    top = tl.zeros([ROWS], dtype=tl.float32)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        valid = rmask[:, None] & (cols < n)[None, :]
        x = tl.load(X + rows[:, None] * sx + cols[None, :], mask=valid, other=0.0)
        top = tl.maximum(top, tl.max(x, axis=1))
    t = tl.maximum(_key(m * top, False), 0).to(tl.int64)
    u = _uniform(rows, SEED, seed_val, OFFSET, offset_val, HAS_SEED, HAS_OFFSET)
    _draw(Y, X, sx, rows, rmask, n, t, u, ROWS, BLOCK)


# -- launchers -------------------------------------------------------------------------------------
def _tiles(x: torch.Tensor) -> tuple[tuple[int], int, int]:
    """(grid, ROWS, BLOCK): rows packed into ``TILE``-element tiles while they are short."""
    b, n = x.shape
    block = min(triton.next_power_of_2(n), MAX_BLOCK)
    rows = max(1, min(TILE // block, triton.next_power_of_2(b)))
    return (triton.cdiv(b, rows),), rows, block


def top_k_renorm_probs(
    out: torch.Tensor, probs: torch.Tensor, k_arr: torch.Tensor, has_k: bool, top_k: int
) -> None:
    b, n = probs.shape
    if not b:
        return
    grid, rows, block = _tiles(probs)
    _top_k_renorm[grid](
        out, out.stride(0), probs, probs.stride(0), b, n, k_arr, top_k, has_k, ROWS=rows, BLOCK=block
    )


def top_p_renorm_probs(
    out: torch.Tensor, probs: torch.Tensor, p_arr: torch.Tensor, has_p: bool, top_p: float
) -> None:
    b, n = probs.shape
    if not b:
        return
    grid, rows, block = _tiles(probs)
    _top_p_renorm[grid](
        out, out.stride(0), probs, probs.stride(0), b, n, p_arr, top_p, has_p, ROWS=rows, BLOCK=block
    )


def top_k_mask_logits(
    out: torch.Tensor, logits: torch.Tensor, k_arr: torch.Tensor, has_k: bool, top_k: int
) -> None:
    b, n = logits.shape
    if not b:
        return
    grid, rows, block = _tiles(logits)
    _top_k_mask[grid](
        out, out.stride(0), logits, logits.stride(0), b, n, k_arr, top_k, has_k, ROWS=rows, BLOCK=block
    )


def greedy(out: torch.Tensor, logits: torch.Tensor) -> None:
    b, n = logits.shape
    if not b:
        return
    grid, rows, block = _tiles(logits)
    _greedy[grid](out, logits, logits.stride(0), b, n, ROWS=rows, BLOCK=block)


def top_k_top_p_sampling_from_probs(
    out: torch.Tensor,
    probs: torch.Tensor,
    k_arr: torch.Tensor,
    has_k_arr: bool,
    top_k: int,
    p_arr: torch.Tensor,
    has_p_arr: bool,
    top_p: float,
    seed_t: torch.Tensor,
    has_seed: bool,
    seed: int,
    offset_t: torch.Tensor,
    has_offset: bool,
    offset: int,
    order: str,
) -> None:
    b, n = probs.shape
    if not b:
        return
    grid, rows, block = _tiles(probs)
    has_k = has_k_arr or 0 < top_k < n  # a scalar that turns top-k off skips its search
    has_p = has_p_arr or top_p < 1.0
    _top_k_top_p_sample[grid](
        out, probs, probs.stride(0), b, n, k_arr, top_k, p_arr, top_p, seed_t, seed, offset_t, offset,
        has_k, has_k_arr, has_p, has_p_arr, has_seed, has_offset, order == "joint", ROWS=rows, BLOCK=block,
    )  # fmt: skip


def min_p_sampling_from_probs(
    out: torch.Tensor,
    probs: torch.Tensor,
    m_arr: torch.Tensor,
    has_m_arr: bool,
    min_p: float,
    seed_t: torch.Tensor,
    has_seed: bool,
    seed: int,
    offset_t: torch.Tensor,
    has_offset: bool,
    offset: int,
) -> None:
    b, n = probs.shape
    if not b:
        return
    grid, rows, block = _tiles(probs)
    _min_p_sample[grid](
        out, probs, probs.stride(0), b, n, m_arr, min_p, seed_t, seed, offset_t, offset,
        has_m_arr, has_seed, has_offset, ROWS=rows, BLOCK=block,
    )  # fmt: skip
