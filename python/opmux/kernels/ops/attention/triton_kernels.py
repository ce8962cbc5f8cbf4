"""Triton kernels of the attention ops (imported only when the triton backend first runs).

``paged_decode``: split-KV decode (FlashDecoding). ``_decode_split`` runs on a grid
``(B, Hkv * chunks, num_splits)``: each program takes the query heads of one KV head (the
``G = Hq / Hkv`` heads of a GQA group, or a chunk of at most ``MAX_ACC / BLOCK_DV`` of them
(:func:`group_tile`): one ``[G, D]`` query tile against ``[BLOCK_N, D]`` key tiles, so each key is
read once per group or chunk), walks its share of the sequence's positions (the attended range split
evenly over the splits, in whole tiles) through the block table one token per row (any page size),
and keeps an online softmax in fp32: it writes its unnormalised output, its running max and its
sum to a float32 workspace. ``_decode_merge`` (grid ``(B, Hq)``) rescales the splits to their
common max, adds the sink to the denominator, and writes ``out`` (one cast) and ``lse``; on sm_90+
at one or two splits (:func:`pdl_trigger`) it is launched programmatically (PDL) behind the split
kernel and waits for it before reading the workspace, so its launch and prologue overlap the
split kernel's run (from four splits that cost time on an H100: a plain launch there). The split
count comes from the table's width (the host sees no lengths); a sequence shorter than the table
leaves its last splits without positions: they exit at once, and the merge reads only the splits
that hold some (both from the same rule, ``_split_share``).

Value head dim ``Dv <= D`` (absorbed MLA: a 576-dim latent cache, V its first 512 dims): the
key dims are read as two tiles, ``[0, Dv)`` padded to ``BLOCK_DV`` (the value tile's dims too)
and the rest ``[Dv, D)`` padded to ``BLOCK_DR`` (MLA's 64 rope dims; none when ``Dv = D``), the
score the sum of two products (512 + 64: no tile padded to 1024). When the value cache is the
key cache's own prefix view (same storage and strides, ``key_cache[..., :Dv]``), the value tile
is the key tile already loaded (``V_FROM_K``: one read of each cache row).

The scores go through ``tl.dot`` when a group has several heads (the group padded to 16 rows:
decode reads the cache, the tensor cores are idle anyway); a single head (MHA) takes an
elementwise product. fp32 queries multiply in IEEE fp32 (no tf32); bf16 / fp16 ones in their dtype
with fp32 sums, ``p`` rounded to the value dtype for the second product as flash attention does.
fp8 caches are read as e4m3 and converted to the query's dtype (exact), their scales applied to
the fp32 scores and outputs.

CUDA-graph safe: the lengths stay on the device (no sync, no ``.item()``); the grid and the
workspace are sized from the shapes (``block_tables.shape[1]``) alone. Each program clamps its
length to the table's capacity and masks block ids outside ``[0, num_blocks)``, so no read goes
out of bounds whatever the tables hold; cache offsets are int64.

``paged_prefill``: flash attention over the paged cache, one program per (query block, KV head),
the GQA group packed into the M tile (``_prefill_triton``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any, Literal

import torch
import triton
import triton.language as tl

from opmux.kernels import tuned
from opmux.kernels.ops._triton_pdl import triton_pdl as _pdl
from opmux.kernels.ops._triton_tuned import launch_tuned
from opmux.kernels.ops.gemm.triton_kernels import _cast

from . import _prefill_triton
from ._decode_tile_config import (  # noqa: F401  (MAX_ACC, MAX_SPLITS, ...: this module's names too)
    MAX_ACC,
    MAX_SPLITS,
    MIN_SPLIT_TOKENS,
    WIDE_MAX_SPLITS,
    WIDE_MIN_SPLIT_TOKENS,
    TileConfig,
    group_tile,
    num_splits,
    tile_config,
    wave_target,
)
from ._paged_tiles import _load_tile, _tanh, value_is_key_prefix

#: Triton's CPU interpreter (tests): its ``tl.dot`` takes bf16 tiles for integers, so bf16 tiles
#: go to the dot as fp32 there (exact: a bf16 product fits fp32); never on a GPU
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
OP = "attention.paged_decode"
#: the running max starts at -1e30 (finite, so that no ``-inf - -inf`` ever appears; a literal
#: in the kernels: Triton takes no plain global there)


@functools.cache
def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132  # the CPU interpreter: an H200's count, so tests take the GPU's split counts


@triton.jit
def _attended(LENS, b, capacity, window_left, WINDOW: tl.constexpr):
    """Sequence ``b``'s attended positions ``[lo, n)``: its length clamped to the table's capacity
    (CUDA: no host check), from the window's start."""
    n = tl.load(LENS + b)
    n = tl.minimum(tl.maximum(n, 0), capacity)
    lo = n * 0
    if WINDOW:
        lo = tl.maximum(n - 1 - window_left, 0)
    return n, lo


@triton.jit
def _split_share(n, lo, S, BLOCK_N: tl.constexpr):
    """Positions a split takes of the attended range ``[lo, n)``, in whole key tiles: splits
    ``[0, cdiv(n - lo, share))`` hold them, the rest none (a table wider than the sequence)."""
    per = (n - lo + S - 1) // S
    return (per + BLOCK_N - 1) // BLOCK_N * BLOCK_N


@triton.jit
def _decode_split(
    Q,
    KC,
    VC,
    BT,
    LENS,
    KS,
    VS,
    PO,
    PM,
    PL,
    sq_b,
    sq_h,
    sk_b,
    sk_p,
    sk_h,
    sv_b,
    sv_p,
    sv_h,
    sbt_b,
    sbt_m,
    num_blocks,
    capacity,
    G,
    CHUNKS,
    Hq,
    D,
    DV,
    S,
    sm_scale,
    softcap,
    window_left,
    PAGE_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_DR: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_DOT: tl.constexpr,
    DOT_F32: tl.constexpr,
    FP8: tl.constexpr,
    SOFTCAP: tl.constexpr,
    WINDOW: tl.constexpr,
    HAS_TAIL: tl.constexpr,
    V_FROM_K: tl.constexpr,
    PREFETCH: tl.constexpr,
    PDL_TRIGGER: tl.constexpr,
):
    if PDL_TRIGGER == 1:  # the merge may launch now (its programs wait for this grid before reading)
        tl.extra.cuda.gdc_launch_dependents()
    b = tl.program_id(0)
    hk = tl.program_id(1) // CHUNKS  # the KV head; its group in chunks of BLOCK_G heads
    c0 = (tl.program_id(1) % CHUNKS) * BLOCK_G
    split = tl.program_id(2)
    b64 = b.to(tl.int64)

    n, lo = _attended(LENS, b, capacity, window_left, WINDOW)
    per = _split_share(n, lo, S, BLOCK_N)
    start = lo + split * per
    end = tl.minimum(start + per, n)
    if start >= end:  # past the sequence (short sequences, wide tables): the merge reads no partial
        return

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_DV)  # the key dims [0, Dv): the value dims too
    gmask = c0 + g < G
    dmask = d < DV
    heads = hk * G + c0 + g
    qrow = Q + b64 * sq_b + heads[:, None].to(tl.int64) * sq_h
    q = tl.load(qrow + d[None, :], mask=gmask[:, None] & dmask[None, :], other=0.0)
    if DOT_F32:
        q = q.to(tl.float32)
    dr = DV + tl.arange(0, BLOCK_DR)  # the key dims [Dv, D) (MLA's rope part), when HAS_TAIL
    rmask = dr < D
    if HAS_TAIL:
        qr = tl.load(qrow + dr[None, :], mask=gmask[:, None] & rmask[None, :], other=0.0)
        if DOT_F32:
            qr = qr.to(tl.float32)
    qk_scale = sm_scale
    if FP8:
        qk_scale = sm_scale * tl.load(KS)

    m_i = tl.full([BLOCK_G], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_DV], dtype=tl.float32)
    kbase = KC + hk.to(tl.int64) * sk_h
    vbase = VC + hk.to(tl.int64) * sv_h
    if PREFETCH:  # the first tile's rows; each step then issues the next tile's before its math
        k_nx, v_nx, kr_nx, ok_nx = _load_tile(
            kbase, vbase, BT + b64 * sbt_b, sbt_m, start, end, num_blocks, sk_b, sk_p, sv_b, sv_p, d,
            dmask, dr, rmask, PAGE_SIZE, BLOCK_N, HAS_TAIL, V_FROM_K,
        )  # fmt: skip
    for n0 in range(start, end, BLOCK_N):
        if PREFETCH:
            k, v, kr, ok = k_nx, v_nx, kr_nx, ok_nx
            k_nx, v_nx, kr_nx, ok_nx = _load_tile(
                kbase, vbase, BT + b64 * sbt_b, sbt_m, n0 + BLOCK_N, end, num_blocks, sk_b, sk_p, sv_b,
                sv_p, d, dmask, dr, rmask, PAGE_SIZE, BLOCK_N, HAS_TAIL, V_FROM_K,
            )  # fmt: skip
        else:
            k, v, kr, ok = _load_tile(
                kbase, vbase, BT + b64 * sbt_b, sbt_m, n0, end, num_blocks, sk_b, sk_p, sv_b, sv_p, d,
                dmask, dr, rmask, PAGE_SIZE, BLOCK_N, HAS_TAIL, V_FROM_K,
            )  # fmt: skip
        if DOT_F32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        else:
            k = k.to(q.dtype)
            v = v.to(q.dtype)
        if USE_DOT:
            if DOT_F32:
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
        else:
            s = tl.sum(q.to(tl.float32)[:, None, :] * k.to(tl.float32)[None, :, :], 2)
        if HAS_TAIL:
            if DOT_F32:
                kr = kr.to(tl.float32)
            else:
                kr = kr.to(q.dtype)
            if USE_DOT:
                if DOT_F32:
                    s += tl.dot(qr, tl.trans(kr), input_precision="ieee")
                else:
                    s += tl.dot(qr, tl.trans(kr))
            else:
                s += tl.sum(qr.to(tl.float32)[:, None, :] * kr.to(tl.float32)[None, :, :], 2)
        s = s * qk_scale
        if SOFTCAP:
            s = softcap * _tanh(s / softcap)
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if USE_DOT:
            if DOT_F32:
                acc = tl.dot(p, v, acc, input_precision="ieee")
            else:
                acc = tl.dot(p.to(v.dtype), v, acc)
        else:
            acc += tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], 1)
        m_i = m_new

    if FP8:
        acc = acc * tl.load(VS)
    row = (b64 * Hq + heads.to(tl.int64)) * S + split  # [B, Hq, S]
    tl.store(PM + row, m_i, mask=gmask)
    tl.store(PL + row, l_i, mask=gmask)
    tl.store(PO + row[:, None] * DV + d[None, :], acc, mask=gmask[:, None] & dmask[None, :])
    if PDL_TRIGGER == 2:  # the merge may launch once every program has stored (or exited)
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _decode_merge(
    PO,
    PM,
    PL,
    SINKS,
    OUT,
    LSE,
    so_b,
    so_h,
    sl_b,
    sl_h,
    LENS,
    capacity,
    window_left,
    Hq,
    D,
    S,
    HAS_SINKS: tl.constexpr,
    HAS_LSE: tl.constexpr,
    WINDOW: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    row = b * Hq + h
    sp = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    # the splits that hold positions (the split kernel's own rule; the others wrote nothing)
    n, lo = _attended(LENS, b, capacity, window_left, WINDOW)
    per = tl.maximum(_split_share(n, lo, S, BLOCK_N), 1)
    smask = sp < tl.minimum((n - lo + per - 1) // per, S)
    dmask = d < D
    if USE_PDL:  # launched behind the split kernel: its partials are complete after this wait
        tl.extra.cuda.gdc_wait()
    m = tl.load(PM + row * S + sp, mask=smask, other=-1.0e30)
    ls = tl.load(PL + row * S + sp, mask=smask, other=0.0)
    mx = tl.max(m, 0)
    if HAS_SINKS:
        sink = tl.load(SINKS + h)
        mx = tl.maximum(mx, sink)
    w = tl.exp(m - mx)
    total = tl.sum(w * ls, 0)
    if HAS_SINKS:
        total += tl.exp(sink - mx)
    po = tl.load(
        PO + (row * S + sp)[:, None] * D + d[None, :], mask=smask[:, None] & dmask[None, :], other=0.0
    )
    o = tl.sum(w[:, None] * po, 0)
    has = total > 0.0
    safe = tl.where(has, total, 1.0)
    o = o / safe
    tl.store(OUT + b * so_b + h * so_h + d, _cast(o, OUT.dtype.element_ty), mask=dmask)
    if HAS_LSE:
        lse = tl.where(has, tl.log(safe) + mx, float("-inf"))
        tl.store(LSE + b * sl_b + h * sl_h, lse)


#: where the split kernel lets the merge launch behind it (PDL): ``off`` (a plain launch after
#: it), ``start`` (each program's first instruction: the merge's launch overlaps the whole split),
#: ``end`` (after each program's stores)
PdlTrigger = Literal["off", "start", "end"]
_TRIGGERS: dict[str, int] = {"off": 0, "start": 1, "end": 2}
#: the most splits the merge still goes behind PDL (from the start) by default
PDL_MAX_SPLITS = 2


def pdl_trigger(splits: int) -> PdlTrigger:
    """The merge's launch on a GPU with PDL, by the split count. On an H100 (Triton 3.6, the
    default tile; ``benchmarks/tune/decode_splits.py``, 24 cases, docs/benchmarks/
    attention_decode_h200.md) PDL from the split's start was 0.2-3.0% faster in 6 of 7 cases of
    one or two splits (0.2% slower in one) and slower in 14 of 17 from four splits on, by up to
    1.33x (Qwen3-30B-A3B B 16 x 512: 14.9 us against 11.3 plain; Llama-3-8B B 4 x 2048: 18.0
    against 14.6); the other three, 32-128 splits of one sequence, a tie or 0.8-1.9% faster. Not
    the grid's rounds: every grid of two or more splits fills at most one round, and two gained."""
    return "start" if splits <= PDL_MAX_SPLITS else "off"


def launch_config(
    device: torch.device,
    batch: int,
    heads: int,
    capacity: int,
    block_dv: int,
    group: int,
    plain: bool,
    fp8: bool,
) -> tuple[TileConfig, int, int]:
    """The split kernel's (tile, wave target, split count) for ``batch`` sequences of ``heads`` KV
    head chunks and a table of ``capacity`` positions. The forms the H200 sweep timed (16-bit
    caches, value head dims <= 128, ``plain``: 16-bit queries without a key tail) take the tuned
    table's entry for (padded value head dim, GQA group) nearest the programs of a split on this
    device (``configs/attention.paged_decode/DV=..,G=..,device_name=...json``, or a user folder:
    ``tuned``), else :func:`tile_config` and :func:`wave_target`; the other forms keep those.
    From the shapes only: CUDA-graph safe. Memoised per shape (emptied when the tables change):
    a decode step calls it once per layer with the same shapes."""
    return _launch_plan(device, batch, heads, capacity, block_dv, group, plain, fp8)[:3]


def _launch_plan(
    device: torch.device,
    batch: int,
    heads: int,
    capacity: int,
    block_dv: int,
    group: int,
    plain: bool,
    fp8: bool,
) -> tuple[TileConfig, int, int, Mapping[str, Any] | None]:
    """:func:`launch_config`'s result and the table's entry it came from (None: no table read)."""
    key = (device, batch, heads, capacity, block_dv, group, plain, fp8)
    hit = _LAUNCH_MEMO.get(key)
    if hit is not None:
        return hit
    sms = _sm_count(device)
    measured = block_dv <= 128 and not fp8
    waves = wave_target(measured and plain)  # the round of the plain tile (fp32 / tail: 8 warps)
    cfg = None
    if _tabled(block_dv, plain, fp8):
        cfg = tuned.lookup(OP, "triton", tuned.device_name(device), (block_dv, group), batch * heads)
        tile = TileConfig(cfg["BLOCK_N"], cfg["num_warps"], cfg["num_stages"], bool(cfg.get("PREFETCH")))
        waves = cfg.get("WAVES", waves)
    else:
        tile = tile_config(block_dv, plain)
    if len(_LAUNCH_MEMO) >= 4096:  # many batch / table widths over a long run: start again
        _LAUNCH_MEMO.clear()
    hit = _LAUNCH_MEMO[key] = (tile, waves, num_splits(batch, heads, capacity, sms, measured, waves), cfg)
    return hit


def _tabled(block_dv: int, plain: bool, fp8: bool) -> bool:
    """Whether the launch comes from a tuned table: the forms the H200 sweep timed (16-bit
    caches, value head dims <= 128, 16-bit queries without a key tail)."""
    return block_dv <= 128 and plain and not fp8


#: _launch_plan's results (tuned.memo: emptied by tuned.refresh and tuned.reject)
_LAUNCH_MEMO: dict[tuple[Any, ...], tuple[TileConfig, int, int, Mapping[str, Any] | None]] = tuned.memo()


def launch(
    out: torch.Tensor,
    lse: torch.Tensor,
    has_lse: bool,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    sinks: torch.Tensor,
    has_sinks: bool,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    fp8: bool,
    scale: float,
    softcap: float,
    window_left: int,
    splits: int | None = None,
    tile: TileConfig | None = None,
    pdl: PdlTrigger | None = None,
) -> None:
    """Both kernels on the checked arguments. The tile and the split count's wave target are
    :func:`launch_config`'s; ``splits`` and ``tile`` override them (tests, tuning), ``pdl`` the
    merge's launch where the GPU has PDL (:func:`pdl_trigger`'s otherwise; benchmarks race the
    three). A table's entry the compiler refuses here runs the default instead, with a warning
    (``launch_tuned``)."""
    bsz, hq, d = query.shape
    nb, ps, hkv = key_cache.shape[0], key_cache.shape[1], key_cache.shape[2]
    dv = value_cache.shape[3]  # <= d (MLA: 512 of 576)
    if bsz == 0:
        return
    g = hq // hkv
    width = block_tables.shape[1]
    capacity = width * ps
    block_dv = max(16, triton.next_power_of_2(dv))
    block_dr = max(16, triton.next_power_of_2(d - dv)) if d > dv else 16
    use_dot = g > 1
    block_g = group_tile(g, block_dv)
    chunks = triton.cdiv(g, block_g)
    plain = query.dtype != torch.float32 and d == dv
    if pdl is not None and pdl not in _TRIGGERS:
        raise ValueError(
            f"{OP}: pdl={pdl!r}: the merge's trigger is one of {', '.join(_TRIGGERS)} (None: the rule's)"
        )
    has_pdl = _pdl(query.device)

    def run(_: object = None) -> None:
        auto_tile, _, auto_splits, _ = _launch_plan(
            query.device, bsz, hkv * chunks, capacity, block_dv, g, plain, fp8
        )
        n_splits = auto_splits if splits is None else splits
        # the merge behind the split kernel (PDL) where the GPU has it and the rule or caller says
        trigger = (pdl_trigger(n_splits) if pdl is None else pdl) if has_pdl else "off"
        use_pdl = trigger != "off"
        extra = {"launch_pdl": True} if use_pdl else {}
        block_n, warps, stages, prefetch = tile or auto_tile
        dot_f32 = query.dtype == torch.float32 or (_INTERPRETED and query.dtype == torch.bfloat16)
        ws = torch.empty((bsz, hq, n_splits, dv), dtype=torch.float32, device=query.device)
        pm = torch.empty((bsz, hq, n_splits), dtype=torch.float32, device=query.device)
        pl = torch.empty((bsz, hq, n_splits), dtype=torch.float32, device=query.device)
        # a stride of an empty table (no column) is unread; keep it a valid int
        sbt = block_tables.stride()
        _decode_split[(bsz, hkv * chunks, n_splits)](
            query,
            key_cache,
            value_cache,
            block_tables,
            seq_lens,
            k_scale,
            v_scale,
            ws,
            pm,
            pl,
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
            nb,
            capacity,
            g,
            chunks,
            hq,
            d,
            dv,
            n_splits,
            scale,
            softcap,
            window_left,
            PAGE_SIZE=ps,
            BLOCK_G=block_g,
            BLOCK_DV=block_dv,
            BLOCK_DR=block_dr,
            BLOCK_N=block_n,
            USE_DOT=use_dot,
            DOT_F32=dot_f32,
            FP8=fp8,
            SOFTCAP=softcap > 0,
            WINDOW=window_left >= 0,
            HAS_TAIL=d > dv,
            V_FROM_K=value_is_key_prefix(key_cache, value_cache),
            PREFETCH=prefetch,
            PDL_TRIGGER=_TRIGGERS[trigger],
            num_warps=warps,
            num_stages=stages,
        )
        _decode_merge[(bsz, hq)](
            ws,
            pm,
            pl,
            sinks,
            out,
            lse,
            out.stride(0),
            out.stride(1),
            lse.stride(0) if has_lse else 0,
            lse.stride(1) if has_lse else 0,
            seq_lens,
            capacity,
            window_left,
            hq,
            dv,
            n_splits,
            HAS_SINKS=has_sinks,
            HAS_LSE=has_lse,
            WINDOW=window_left >= 0,
            BLOCK_N=block_n,
            BLOCK_S=triton.next_power_of_2(n_splits),
            BLOCK_D=triton.next_power_of_2(dv),
            USE_PDL=use_pdl,
            num_warps=4,
            **extra,
        )

    cfg = _launch_plan(query.device, bsz, hkv * chunks, capacity, block_dv, g, plain, fp8)[3]
    if tile is not None or cfg is None:
        run()  # no table's tile: a refusal is the caller's or the default's
    else:  # a table's entry the compiler refuses here: the default instead, with a warning
        m = bsz * hkv * chunks
        launch_tuned(run, cfg, OP, "triton", tuned.device_name(query.device), (block_dv, g), m)


def paged_decode(
    out: torch.Tensor,
    lse: torch.Tensor,
    has_lse: bool,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    sinks: torch.Tensor,
    has_sinks: bool,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    fp8: bool,
    scale: float,
    softcap: float,
    window_left: int,
) -> None:
    """``attention.paged_decode`` per its contract (ops/attention/op.py), the launch from
    :func:`launch_config`."""
    launch(
        out,
        lse,
        has_lse,
        query,
        key_cache,
        value_cache,
        block_tables,
        seq_lens,
        sinks,
        has_sinks,
        k_scale,
        v_scale,
        fp8,
        scale,
        softcap,
        window_left,
    )


def paged_prefill(
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
    causal: bool,
) -> None:
    """``attention.paged_prefill`` per its contract (ops/attention/op.py), the tile from
    :func:`_prefill_triton.tile_config`."""
    _prefill_triton.launch(
        out,
        lse,
        has_lse,
        query,
        key_cache,
        value_cache,
        block_tables,
        seq_lens,
        cu_seqlens_q,
        sinks,
        has_sinks,
        k_scale,
        v_scale,
        fp8,
        scale,
        softcap,
        window_left,
        custom_mask,
        mask_indptr,
        has_mask,
        mask_prefix,
        causal,
    )
