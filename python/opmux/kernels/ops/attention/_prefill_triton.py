"""Triton kernel of ``attention.paged_prefill`` (imported only when the triton backend first runs;
``triton_kernels.paged_prefill`` is its launcher).

Flash attention over the paged cache, one pass (no split-KV: prefill has query blocks enough to
fill the GPU). A program per (query block of a sequence, KV head or chunk of its group) on a grid
``(T // BLOCK_Q + B, Hkv * CHUNKS)`` sized from the shapes alone: sequence ``b``'s blocks are the
program ids from ``cu_seqlens_q[b] // BLOCK_Q + b`` (vLLM's unified-attention numbering, which
gives each sequence at least ``cdiv(q_len, BLOCK_Q)`` ids), found by a binary search over
``cu_seqlens_q``; spare ids exit at once. The ``G = Hq / Hkv`` query heads of the KV head are
packed into the M tile (row ``r``: token ``r // GC``, head ``r % GC``; ``BLOCK_M = BLOCK_Q * GC``
rounded up), so each key tile is read once per group and feeds a ``[BLOCK_M, BLOCK_N]``
tensor-core product. ``GC = G`` (``CHUNKS = 1``) unless the group is larger than the M tile
(MLA's 128 heads against its 32-row tile): then ``CHUNKS`` chunks of ``GC = BLOCK_M`` heads, one
token a program, as decode's ``group_tile`` splits a group; the key rows are read once per chunk,
the same cache reads per query row as any other packing of a ``BLOCK_M`` tile.

Value head dim ``Dv <= D`` (MLA: a 576-dim latent cache, V its first 512 dims) as paged_decode's
split kernel takes it, with its tile loader (``triton_kernels._load_tile``): the key dims read as
two tiles, ``[0, Dv)`` padded to ``BLOCK_DV`` (the value tile's dims too) and ``[Dv, D)`` padded to
``BLOCK_DR`` (``HAS_TAIL``; none when ``Dv = D``), the score the sum of two products; a value cache
that is the key cache's own prefix view takes its tile from the key tile (``V_FROM_K``: each
cache row read once).

The key positions walk the sequence's block table one token per row (any page size) from the
window's start to the block's last causal position (causal block skipping: nothing past it is
read), with the causal and window masks applied per element and an online softmax in fp32
(``exp2``); with ``SPLIT`` (a launch option the prefill sweep races) the key tiles wholly below
the block's diagonal run first without the element masks. Sinks start the running max and sum (``m = sink``, ``l = 1``; a ``-inf`` sink ``m =
-1e30``, ``l = 0``), so they enter the denominator only.

Program ids run in reverse (a sequence's last blocks, with the most keys, start first).
CUDA-graph safe: no sync, no workspace. Each program clamps its offsets to ``[0, T]``, its length
to the table's capacity and masks block ids outside ``[0, num_blocks)``: no read or write out of
bounds, whatever the index tensors hold.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from opmux.kernels import tuned
from opmux.kernels.ops._triton_tuned import launch_tuned
from opmux.kernels.ops.gemm.triton_kernels import _cast

from ._paged_tiles import _load_tile, _tanh, value_is_key_prefix
from ._prefill_tile_config import masked_block_n, tile_config

#: Triton's CPU interpreter (tests): bf16 tiles go to the dot as fp32 there (exact); never on a GPU
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
OP = "attention.paged_prefill"


@triton.jit
def _step(
    q, qr, k, v, kr, ok, n0, qpos, acc, m_i, l_i, qk_scale, softcap, window_left, seen,
    MASKED: tl.constexpr, BLOCK_N: tl.constexpr, DOT_F32: tl.constexpr, SOFTCAP: tl.constexpr,
    WINDOW: tl.constexpr, HAS_TAIL: tl.constexpr, BY_SEEN: tl.constexpr,
):  # fmt: skip
    """One key tile's online-softmax update of (acc, m_i, l_i): scores in log2 units, then the
    causal (or, ``BY_SEEN``, the custom mask's or the non-causal ``seen``) and window masks per element
    (``MASKED``) or, for a tile every row sees whole, only the tile's bad block ids as a column
    bias (one add per score instead of compares and a select)."""
    LOG2E: tl.constexpr = 1.4426950408889634
    if DOT_F32:
        s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
        if HAS_TAIL:
            s += tl.dot(qr, tl.trans(kr.to(tl.float32)), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k.to(q.dtype)))
        if HAS_TAIL:
            s += tl.dot(qr, tl.trans(kr.to(q.dtype)))
    s = s * qk_scale
    if SOFTCAP:
        s = softcap * _tanh(s / softcap) * LOG2E
    if MASKED:
        pos = n0 + tl.arange(0, BLOCK_N)
        if BY_SEEN:
            keep = ok[None, :] & seen
        else:
            keep = ok[None, :] & (pos[None, :] <= qpos[:, None])
        if WINDOW:
            keep = keep & (pos[None, :] >= qpos[:, None] - window_left)
        s = tl.where(keep, s, float("-inf"))
    else:
        s = s + tl.where(ok, 0.0, float("-inf"))[None, :]
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if DOT_F32:
        acc = tl.dot(p, v.to(tl.float32), acc, input_precision="ieee")
    else:
        acc = tl.dot(p.to(q.dtype), v.to(q.dtype), acc)
    return acc, m_new, l_i


@triton.jit
def _prefill(
    Q,
    KC,
    VC,
    BT,
    LENS,
    CU,
    SINKS,
    KS,
    VS,
    OUT,
    LSE,
    CM,
    MI,
    sq_t,
    sq_h,
    sk_b,
    sk_p,
    sk_h,
    sv_b,
    sv_p,
    sv_h,
    sbt_b,
    sbt_m,
    so_t,
    so_h,
    sl_t,
    sl_h,
    num_seqs,
    num_rows,
    num_blocks,
    capacity,
    CHUNKS,
    D,
    DV,
    sm_scale,
    softcap,
    window_left,
    mask_entries,
    G: tl.constexpr,
    GC: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_DR: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_F32: tl.constexpr,
    FP8: tl.constexpr,
    SOFTCAP: tl.constexpr,
    WINDOW: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    HAS_LSE: tl.constexpr,
    HAS_TAIL: tl.constexpr,
    V_FROM_K: tl.constexpr,
    SPLIT: tl.constexpr,
    HAS_MASK: tl.constexpr,
    MASK_PREFIX: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    LOG2E: tl.constexpr = 1.4426950408889634
    pid = tl.num_programs(0) - 1 - tl.program_id(0)
    hk = tl.program_id(1) // CHUNKS  # the KV head; its group in chunks of GC heads
    h0 = (tl.program_id(1) % CHUNKS) * GC
    # the sequence: the last b with cu[b] // BLOCK_Q + b <= pid
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(CU + mid) // BLOCK_Q + mid <= pid:
            lo = mid + 1
        else:
            hi = mid
    b = lo - 1
    if b < 0:
        return
    c0 = tl.load(CU + b)
    j = pid - (c0 // BLOCK_Q + b)  # the query block within the sequence
    q_start = tl.minimum(tl.maximum(c0, 0), num_rows)  # CUDA: no host check, never past query
    q_end = tl.minimum(tl.maximum(tl.load(CU + b + 1), q_start), num_rows)
    q_len = q_end - q_start
    t0 = j * BLOCK_Q
    if t0 >= q_len:
        return
    n = tl.minimum(tl.maximum(tl.load(LENS + b), 0), capacity)
    prefix = n - q_len  # < 0 only for a bad length: those rows see fewer keys, none out of bounds
    b64 = tl.cast(b, tl.int64)

    r = tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_DV)  # the key dims [0, Dv): the value dims too
    tok = t0 + r // GC
    heads = hk * G + h0 + r % GC
    rmask = (r < BLOCK_Q * GC) & (tok < q_len) & (h0 + r % GC < G)
    dmask = d < DV
    qrow = (q_start + tok).to(tl.int64)
    qptr = Q + qrow[:, None] * sq_t + heads[:, None].to(tl.int64) * sq_h
    q = tl.load(qptr + d[None, :], mask=rmask[:, None] & dmask[None, :], other=0.0)
    if DOT_F32:
        q = q.to(tl.float32)
    dr = DV + tl.arange(0, BLOCK_DR)  # the key dims [Dv, D) (MLA's rope part), when HAS_TAIL
    drmask = dr < D
    qr = q  # no key tail: unused
    if HAS_TAIL:
        qr = tl.load(qptr + dr[None, :], mask=rmask[:, None] & drmask[None, :], other=0.0)
        if DOT_F32:
            qr = qr.to(tl.float32)
    qk_scale = sm_scale
    if FP8:
        qk_scale = sm_scale * tl.load(KS)
    if not SOFTCAP:
        qk_scale = qk_scale * LOG2E
    qpos = prefix + tok  # each row's last visible position

    if HAS_SINKS:  # a -inf sink (none for that head) starts at -1e30 with l = 0: a first key
        sink = tl.load(SINKS + heads, mask=rmask, other=0.0) * LOG2E  # tile all masked for a row
        m_i = tl.maximum(sink, -1.0e30)  # must not give exp2(-inf - -inf) = NaN
        l_i = tl.exp2(sink - m_i)
    else:
        m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    kv_end = tl.minimum(n, prefix + tl.minimum(t0 + BLOCK_Q, q_len))  # causal: nothing past the block
    mrow = tok.to(tl.int64) * 0  # HAS_MASK: each row's start in CM (its row of the sequence's matrix)
    if HAS_MASK or not CAUSAL:  # a custom mask or none: every position up to the length
        kv_end = n
    if HAS_MASK:
        mrow = tl.load(MI + b).to(tl.int64) + tok.to(tl.int64) * n
    kv_start = n * 0
    if WINDOW:
        kv_start = tl.maximum(prefix + t0 - window_left, 0)
    kbase = KC + hk.to(tl.int64) * sk_h
    vbase = VC + hk.to(tl.int64) * sv_h
    bt_row = BT + b64 * sbt_b
    # SPLIT: key tiles wholly at or before every row's own position (the block's first row sees
    # up to prefix + t0) run first without the causal mask, only bad block ids masked (a column
    # bias); the tiles across the diagonal (every tile of a window) take the element masks. Off:
    # one masked loop (fewer registers: the split's two pipelined loops hold 192 -> 255 at the
    # 128 x 64 bf16 tile, ptxas sm_90a; which is faster is the sweep's to say)
    PHASES: tl.constexpr = 2 if SPLIT and not WINDOW and not HAS_MASK and CAUSAL else 1
    full_end = kv_start
    if PHASES == 2:
        full_end = tl.maximum(
            kv_start, tl.minimum(kv_end, kv_start + (prefix + t0 + 1 - kv_start) // BLOCK_N * BLOCK_N)
        )
    for phase in tl.static_range(PHASES):  # [kv_start, full_end) unmasked, then [full_end, kv_end)
        lo = kv_start if phase < PHASES - 1 else full_end
        hi = full_end if phase < PHASES - 1 else kv_end
        for n0 in range(lo, hi, BLOCK_N):
            k, v, kr, ok = _load_tile(
                kbase, vbase, bt_row, sbt_m, n0, kv_end, num_blocks, sk_b, sk_p, sv_b, sv_p, d,
                dmask, dr, drmask, PAGE_SIZE, BLOCK_N, HAS_TAIL, V_FROM_K,
            )  # fmt: skip
            # the rows' keys: every real one (not CAUSAL), or the custom mask's (HAS_MASK: below)
            seen = rmask[:, None] & ok[None, :]
            if HAS_MASK:
                pos = n0 + tl.arange(0, BLOCK_N)
                at = mrow[:, None] + pos[None, :]
                inb = rmask[:, None] & ok[None, :] & (at >= 0) & (at < mask_entries)
                seen = tl.load(CM + at, mask=inb, other=0) != 0
                if not MASK_PREFIX:
                    seen = seen | (pos < prefix)[None, :]
            acc, m_i, l_i = _step(
                q, qr, k, v, kr, ok, n0, qpos, acc, m_i, l_i, qk_scale, softcap, window_left, seen,
                phase == PHASES - 1, BLOCK_N, DOT_F32, SOFTCAP, WINDOW, HAS_TAIL, HAS_MASK or not CAUSAL,
            )  # fmt: skip

    if FP8:
        acc = acc * tl.load(VS)
    has = l_i > 0.0
    safe = tl.where(has, l_i, 1.0)
    o = acc / safe[:, None]
    tl.store(
        OUT + qrow[:, None] * so_t + heads[:, None].to(tl.int64) * so_h + d[None, :],
        _cast(o, OUT.dtype.element_ty),
        mask=rmask[:, None] & dmask[None, :],
    )
    if HAS_LSE:
        lse = tl.where(has, (m_i + tl.log2(safe)) / LOG2E, float("-inf"))
        tl.store(LSE + qrow * sl_t + heads.to(tl.int64) * sl_h, lse, mask=rmask)


def launch(
    out: torch.Tensor,
    lse: torch.Tensor,
    has_lse: bool,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    sinks: torch.Tensor,
    has_sinks: bool,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    fp8: bool,
    scale: float,
    softcap: float,
    window_left: int,
    custom_mask: torch.Tensor,
    mask_indptr: torch.Tensor,
    has_mask: bool,
    mask_prefix: bool,
    causal: bool = True,
    block_m: int | None = None,
    block_n: int | None = None,
    warps: int | None = None,
    stages: int | None = None,
    split: bool | None = None,
) -> None:
    """The kernel on the checked arguments. The launch of 16-bit queries is the tuned table's
    entry for (padded value head dim, GQA group) nearest the query rows on this device
    (``configs/attention.paged_prefill/DV=..,G=..,device_name=...json``, or a user folder:
    ``tuned``), else ``tile_config``'s; ``block_m`` / ``block_n`` / ``warps`` / ``stages`` /
    ``split`` (the kernel's ``SPLIT``) override it (tests, benchmarks/tune/prefill_tiles.py). A
    table's entry the compiler refuses here runs the default instead, with a warning
    (``launch_tuned``)."""
    rows, hq, d = query.shape
    nb, ps, hkv = key_cache.shape[0], key_cache.shape[1], key_cache.shape[2]
    dv = value_cache.shape[3]  # <= d (MLA: 512 of 576)
    bsz, width = block_tables.shape
    if rows == 0 or bsz == 0:
        return
    g = hq // hkv
    block_dv = max(16, triton.next_power_of_2(dv))
    block_dr = max(16, triton.next_power_of_2(d - dv)) if d > dv else 16

    def run(cfg: Mapping[str, Any]) -> None:
        bm = max(block_m or cfg["BLOCK_M"], 16)
        bn = block_n or (masked_block_n(cfg["BLOCK_N"]) if has_mask else cfg["BLOCK_N"])
        nw, ns = warps or cfg["num_warps"], stages or cfg["num_stages"]
        sp = bool(cfg.get("SPLIT")) if split is None else split
        gc = min(g, bm)  # the heads of a program: the whole group, or a chunk of it
        chunks = triton.cdiv(g, gc)
        block_q = bm // gc
        dot_f32 = query.dtype == torch.float32 or (_INTERPRETED and query.dtype == torch.bfloat16)
        sbt = block_tables.stride()
        _prefill[(rows // block_q + bsz, hkv * chunks)](
            query,
            key_cache,
            value_cache,
            block_tables,
            seq_lens,
            cu_seqlens_q,
            sinks,
            k_scale,
            v_scale,
            out,
            lse,
            custom_mask.view(torch.uint8) if has_mask else cu_seqlens_q,
            mask_indptr,
            query.stride(0),
            query.stride(1),
            key_cache.stride(0),
            key_cache.stride(1),
            key_cache.stride(2),
            value_cache.stride(0),
            value_cache.stride(1),
            value_cache.stride(2),
            sbt[0],
            sbt[1],
            out.stride(0),
            out.stride(1),
            lse.stride(0) if has_lse else 0,
            lse.stride(1) if has_lse else 0,
            bsz,
            rows,
            nb,
            width * ps,
            chunks,
            d,
            dv,
            scale,
            softcap,
            window_left,
            custom_mask.shape[0] if has_mask else 0,
            G=g,
            GC=gc,
            PAGE_SIZE=ps,
            BLOCK_M=bm,
            BLOCK_Q=block_q,
            BLOCK_DV=block_dv,
            BLOCK_DR=block_dr,
            BLOCK_N=bn,
            DOT_F32=dot_f32,
            FP8=fp8,
            SOFTCAP=softcap > 0,
            WINDOW=window_left >= 0,
            HAS_SINKS=has_sinks,
            HAS_LSE=has_lse,
            HAS_TAIL=d > dv,
            V_FROM_K=value_is_key_prefix(key_cache, value_cache),
            SPLIT=sp,
            HAS_MASK=has_mask,
            MASK_PREFIX=mask_prefix,
            CAUSAL=causal,
            num_warps=nw,
            num_stages=ns,
        )

    if query.dtype == torch.float32:  # a correctness form: the small IEEE tile, never a table's
        bm, bn, w, st = tile_config(block_dv, g, True)
        run({"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": st})
        return
    device = tuned.device_name(query.device)
    cfg = tuned.lookup(OP, "triton", device, (block_dv, g), rows)
    if any(v is not None for v in (block_m, block_n, warps, stages, split)):
        run(cfg)  # the caller's tile: a refusal is the caller's, not the table's
    else:
        launch_tuned(run, cfg, OP, "triton", device, (block_dv, g), rows)
