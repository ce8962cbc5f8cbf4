"""The decode path of ``moe.fused_experts``'s Triton backend: one program per routed slot and
block of weight rows, no routing pass, no grouped tiles, two launches.

At decode sizes (one token, or a few, each routed to ``topk`` distinct experts) the op is a
read of the touched experts' weights, and the grouped path's six launches (routing, two
products, activation, quantization, sum) cost more than the read itself: Qwen3-30B-A3B's eight
experts are 75 MB, 18 us at the H200's copy bandwidth, against 40 us for the grouped path. Here:

1. ``_up_kernel``, grid ``(M * topk, cdiv(N, BLOCK_SIZE_N))``: a slot's gate and up rows of
   ``w1`` times its token's ``hidden`` row (fp32 sums; fp8: the row quantized per 1x128 group
   once, by ``per_token_group_quant_fp8``), each rounded to ``hidden``'s dtype, the gated
   activation in fp32, rounded once into ``act [M * topk, N]``;
2. ``_down_kernel``, grid ``(M, cdiv(K, BLOCK_SIZE_M))``: per token and block of output
   columns, its ``topk`` slots' ``act`` rows (fp8: quantized per group) times the rows of their
   experts' ``w2``, all ``topk`` tiles loaded at once, times the routed weight, rounded to
   ``hidden``'s dtype, the terms summed in fp32 and rounded once into ``out``.

The arithmetic is the definition's (``_experts.reference``): the same rounding points as the
grouped path, only the order of each fp32 sum differs. A slot whose expert is outside ``[0, E)``
or mapped to -1 is skipped by both kernels (nothing is loaded through its id), so out-of-range
ids never reach memory. The only intermediate is ``act`` ([M * topk, N]).

A configuration with ``DECODE: 1`` selects this path (the tuner times it beside the grouped
configurations at small M and the tables keep whichever is faster); ``BLOCK_SIZE_N`` is the
up kernel's rows per program, ``BLOCK_SIZE_M`` the down kernel's, ``BLOCK_SIZE_K`` the
reduction step (fp8: 128, 256 or 512, whole activation groups, unrolled so that their loads
overlap); ``GROUP_SIZE_M`` is unused. On sm_90+ the down kernel is launched programmatically
(PDL): its launch and set-up overlap the up kernel's tail, and it waits for that grid before
reading ``act``.

fp8 weights are multiplied as they are stored, on the tensor cores: per 128-wide group one
e4m3 product with fp32 accumulation, its block scales applied to the product, as the grouped
path does. A GEMV's other operand is one column, so it is padded to a tile's least width (16):
the up kernel's ``x`` is column 0 of a ``[128, 16]`` operand whose other columns are zero; the
down kernel stacks the topk experts' weight rows (``ROWS``) against the token's topk activation
groups as columns (``COLS``) and keeps each row's own slot's column. Converting every weight
byte to fp32 on the CUDA cores instead cost more than its read (DeepSeek-V3 fp8 at M = 1: 0.60
of the copy bandwidth, the grouped path ahead of this one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from opmux.kernels import ops
from opmux.kernels.ops._triton_pdl import triton_pdl as _pdl
from opmux.kernels.ops.activation.triton_kernels import _ACTS, _act, _clamp_hi, _sig_div
from opmux.kernels.ops.gemm.triton_kernels import _cast
from opmux.kernels.ops.quantization.triton_kernels import _amax, _keep_nan, _quantize_by

__all__ = ["ACT_CODES", "launch_decode", "quant_groups"]

#: the activation names' codes in the kernels (the activation group's own, for the _act helper)
ACT_CODES = {name: _ACTS[name] for name in ("silu", "gelu", "swigluoai")}
#: swigluoai's alpha and limit (gpt-oss's, as ``activation.swigluoai_and_mul`` defaults them)
_OAI_ALPHA, _OAI_LIMIT = 1.702, 7.0


@triton.jit
def _slot_expert(IDS, MAP, s, topk, stride_ids, num_ids, num_experts, HAS_MAP: tl.constexpr):
    """The local expert of slot ``s`` and whether one of this rank computes it."""
    t = s // topk
    e = tl.load(IDS + t * stride_ids + s % topk).to(tl.int64)
    ok = (e >= 0) & (e < num_ids)
    if HAS_MAP:
        local = tl.load(MAP + tl.where(ok, e, 0)).to(tl.int64)
        ok = ok & (local >= 0) & (local < num_experts)
        e = local
    return tl.where(ok, e, 0), ok


@triton.jit
def _token_expert(IDS, MAP, t, js, topk, stride_ids, num_ids, num_experts, HAS_MAP: tl.constexpr):
    """The local experts of token ``t``'s slots ``js`` (0 where none) and whether one of this
    rank computes each (slots past ``topk`` do not exist)."""
    in_k = js < topk
    e = tl.load(IDS + t * stride_ids + js, mask=in_k, other=-1).to(tl.int64)
    ok = in_k & (e >= 0) & (e < num_ids)
    if HAS_MAP:
        local = tl.load(MAP + tl.where(ok, e, 0), mask=ok, other=-1).to(tl.int64)
        ok = ok & (local >= 0) & (local < num_experts)
        e = local
    return tl.where(ok, e, 0), ok


@triton.jit
def _up_kernel(
    X,
    XS,
    W1,
    WS,
    TW,
    IDS,
    MAP,
    ACT,
    N,
    K,
    topk,
    num_ids,
    num_experts,
    stride_x,
    stride_xs,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_sk,
    stride_tw,
    stride_ids,
    stride_act,
    alpha,
    limit,
    ACT_CODE: tl.constexpr,
    HAS_MAP: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,
    FP8: tl.constexpr,
    GROUPS: tl.constexpr,
    USE_PDL: tl.constexpr,
    VLLM: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
):
    """act[s, n] = act(round(w1[e, gate n] . x[t]), round(w1[e, up n] . x[t])) for one slot s
    (token t = s // topk, expert e) and BLOCK_SIZE_N of its N columns. fp32 partial sums per
    column of the step, summed once at the end (no reduction inside the loop)."""
    if USE_PDL:  # the down kernel may launch now; it waits for this grid before reading act
        tl.extra.cuda.gdc_launch_dependents()
    s = tl.program_id(0).to(tl.int64)
    e, ok = _slot_expert(IDS, MAP, s, topk, stride_ids, num_ids, num_experts, HAS_MAP)
    if not ok:
        return
    t = s // topk
    offs_n = tl.program_id(1) * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    cols = tl.minimum(offs_n, N - 1).to(tl.int64)  # in bounds; the store drops the tail
    if ACT_CODE == 5:  # swigluoai: (gate, up) pairs interleaved
        g_rows, u_rows = 2 * cols, 2 * cols + 1
    else:
        g_rows, u_rows = cols, cols + N
    w_base = W1 + e * stride_we
    if FP8:  # x arrives quantized (XQ, one scale per 1x128 group in XS); GROUPS groups a step
        # each group is a tensor-core product of the e4m3 tiles (no per-element conversion):
        # x is column 0 of a [128, 16] operand whose other columns are zero, so the row sums of
        # the [BLOCK_SIZE_N, 16] fp32 partials are the products; scales apply per group
        offs_q = tl.arange(0, 128)
        lane = tl.arange(0, 16)
        g_ptrs = w_base + g_rows[:, None] * stride_wn + offs_q[None, :]
        u_ptrs = w_base + u_rows[:, None] * stride_wn + offs_q[None, :]
        x_ptrs = X + t * stride_x + offs_q
        acc_g2 = tl.zeros((BLOCK_SIZE_N, 16), dtype=tl.float32)
        acc_u2 = tl.zeros((BLOCK_SIZE_N, 16), dtype=tl.float32)
        gs_ptrs = WS + e * stride_se + (g_rows // 128) * stride_sn
        us_ptrs = WS + e * stride_se + (u_rows // 128) * stride_sn
        for kb in range(0, tl.cdiv(K, 128 * GROUPS)):
            for gi in tl.static_range(GROUPS):  # unrolled: the groups' loads are in flight together
                grp = kb * GROUPS + gi
                k_ok = offs_q < K - grp * 128
                in_k = cols * 0 + grp * 128 < K  # a group past K adds nothing (and reads no scale)
                xq = tl.load(x_ptrs + grp * 128, mask=k_ok, other=0.0)
                xs = tl.load(XS + t * stride_xs + grp, mask=grp * 128 < K, other=0.0)
                xpad = tl.where(lane[None, :] == 0, xq[:, None], tl.zeros((128, 16), dtype=xq.dtype))
                wg = tl.load(g_ptrs + grp * 128, mask=k_ok[None, :], other=0.0)
                wu = tl.load(u_ptrs + grp * 128, mask=k_ok[None, :], other=0.0)
                sg = tl.load(gs_ptrs + grp * stride_sk, mask=in_k, other=0.0)
                su = tl.load(us_ptrs + grp * stride_sk, mask=in_k, other=0.0)
                acc_g2 += tl.dot(wg, xpad) * (sg * xs)[:, None]
                acc_u2 += tl.dot(wu, xpad) * (su * xs)[:, None]
    else:  # the next step's tiles are loaded before this step's products (two steps in flight)
        offs_k = tl.arange(0, BLOCK_SIZE_K)
        g_ptrs = w_base + g_rows[:, None] * stride_wn + offs_k[None, :]
        u_ptrs = w_base + u_rows[:, None] * stride_wn + offs_k[None, :]
        x_ptrs = X + t * stride_x + offs_k
        acc_g2 = tl.zeros((BLOCK_SIZE_N, BLOCK_SIZE_K), dtype=tl.float32)
        acc_u2 = tl.zeros((BLOCK_SIZE_N, BLOCK_SIZE_K), dtype=tl.float32)
        k_ok = offs_k < K
        x_next = tl.load(x_ptrs, mask=k_ok, other=0.0)
        wg_next = tl.load(g_ptrs, mask=k_ok[None, :], other=0.0)
        wu_next = tl.load(u_ptrs, mask=k_ok[None, :], other=0.0)
        for kb in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
            x = x_next.to(tl.float32)
            wg = wg_next.to(tl.float32)
            wu = wu_next.to(tl.float32)
            k1 = (kb + 1) * BLOCK_SIZE_K
            k_ok = offs_k < K - k1  # past the last step: all masked, nothing read
            x_next = tl.load(x_ptrs + k1, mask=k_ok, other=0.0)
            wg_next = tl.load(g_ptrs + k1, mask=k_ok[None, :], other=0.0)
            wu_next = tl.load(u_ptrs + k1, mask=k_ok[None, :], other=0.0)
            acc_g2 += wg * x[None, :]
            acc_u2 += wu * x[None, :]
    acc_g = tl.sum(acc_g2, axis=1)
    acc_u = tl.sum(acc_u2, axis=1)
    if MUL_WEIGHT:  # the router weight on the input (topk == 1): it scales the first product
        w = tl.load(TW + t * stride_tw)
        acc_g = acc_g * w
        acc_u = acc_u * w
    # the first product rounded to hidden's dtype, as the engines' cache holds it
    a = _cast(acc_g, ACT.dtype.element_ty).to(tl.float32)
    b = _cast(acc_u, ACT.dtype.element_ty).to(tl.float32)
    if ACT_CODE == 5:
        g = _clamp_hi(a, limit)
        u = _clamp_hi(tl.where(b < -limit, -limit, b), limit)
        y = (u + 1.0) * _sig_div(g, -alpha * g)
    elif VLLM:  # vLLM's rounding: the activation rounded to the output dtype before the product
        y = _cast(_act(a, ACT_CODE), ACT.dtype.element_ty).to(tl.float32) * b
    else:
        y = _act(a, ACT_CODE) * b
    tl.store(ACT + s * stride_act + offs_n, _cast(y, ACT.dtype.element_ty), mask=offs_n < N)


@triton.jit
def _down_kernel(
    A,
    W2,
    WS,
    TW,
    IDS,
    MAP,
    OUT,
    N,
    K,
    topk,
    num_ids,
    num_experts,
    stride_a,
    stride_we,
    stride_wk,
    stride_se,
    stride_sk,
    stride_sn,
    stride_tw,
    stride_ids,
    stride_out,
    HAS_MAP: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,
    FP8: tl.constexpr,
    GROUPS: tl.constexpr,
    USE_PDL: tl.constexpr,
    DIVIDE: tl.constexpr,
    RECIP: tl.constexpr,
    TOPK: tl.constexpr,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
):
    """out[t, c] = sum_j round(w_j * (w2[e_j, c] . act[t * topk + j])) for BLOCK_SIZE_M of the
    K output columns c; terms of slots no expert of this rank computes are left out. The topk
    experts' tiles are loaded together (a [TOPK, rows, K step] tile): their reads overlap instead
    of following one another. fp8: ROWS = max(16, TOPK * BLOCK_SIZE_M) stacked weight rows and
    COLS = max(16, TOPK) activation columns (a tensor-core tile's least extent)."""
    t = tl.program_id(0).to(tl.int64)
    offs_c = tl.program_id(1) * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    rows = tl.minimum(offs_c, K - 1).to(tl.int64)
    js = tl.arange(0, TOPK)
    e, ok = _token_expert(IDS, MAP, t, js, topk, stride_ids, num_ids, num_experts, HAS_MAP)
    if FP8:  # a step of GROUPS activation groups, each quantized and scaled on its own
        # one tensor-core product per group: the topk experts' weight tiles stacked as the rows
        # of one [ROWS, 128] operand (row i: slot i // BLOCK_SIZE_M), the token's topk act groups
        # as the columns of a [128, COLS] operand; row i's product is its own slot's column
        idx = tl.arange(0, ROWS)
        jr = idx // BLOCK_SIZE_M
        c_r = tl.program_id(1) * BLOCK_SIZE_M + idx % BLOCK_SIZE_M
        row_r = tl.minimum(c_r, K - 1).to(tl.int64)
        e_r, ok_r = _token_expert(IDS, MAP, t, jr, topk, stride_ids, num_ids, num_experts, HAS_MAP)
        jc = tl.arange(0, COLS)
        _, ok_c = _token_expert(IDS, MAP, t, jc, topk, stride_ids, num_ids, num_experts, HAS_MAP)
        offs_q = tl.arange(0, 128)
        w_ptrs = W2 + e_r[:, None] * stride_we + row_r[:, None] * stride_wk + offs_q[None, :]
        a_ptrs = A + (t * topk + jc)[None, :] * stride_a + offs_q[:, None]
        s_ptrs = WS + e_r * stride_se + (row_r // 128) * stride_sk
        acc2 = tl.zeros((ROWS, COLS), dtype=tl.float32)
        if USE_PDL:  # launched while the up kernel runs: act is complete after this wait
            tl.extra.cuda.gdc_wait()
        for nb in range(0, tl.cdiv(N, 128 * GROUPS)):
            for gi in tl.static_range(GROUPS):
                grp = nb * GROUPS + gi
                n_ok = offs_q < N - grp * 128
                a = tl.load(a_ptrs + grp * 128, mask=ok_c[None, :] & n_ok[:, None], other=0.0).to(tl.float32)
                w = tl.load(w_ptrs + grp * 128, mask=ok_r[:, None] & n_ok[None, :], other=0.0)
                # each slot's activation group quantized as per_token_group_quant_fp8 does it
                amax = _amax(a, 0)
                amax = _keep_nan(amax, tl.maximum(amax, 1e-10))
                if RECIP:  # the op's divide_by_scale form on CUDA: max(amax, eps) * (1 / 448)
                    a_s = amax * tl.math.div_rn(tl.full([COLS], 1.0, tl.float32), 448.0)
                else:
                    a_s = tl.math.div_rn(amax, 448.0)
                inv = tl.math.div_rn(tl.full([COLS], 1.0, tl.float32), a_s)
                aq = _quantize_by(a, inv[None, :], a_s[None, :], DIVIDE).to(w.dtype)
                w_s = tl.load(s_ptrs + grp * stride_sn, mask=ok_r & (c_r * 0 + grp * 128 < N), other=0.0)
                acc2 += tl.dot(w, aq) * w_s[:, None] * a_s[None, :]
        acc_r = tl.sum(tl.where(jc[None, :] == jr[:, None], acc2, 0.0), axis=1)
        if MUL_WEIGHT:
            acc_r = acc_r * tl.load(TW + t * stride_tw + jr, mask=ok_r, other=0.0)
        y_r = tl.where(ok_r, _cast(acc_r, OUT.dtype.element_ty).to(tl.float32), 0.0)
        total = tl.sum(tl.reshape(y_r, (ROWS // BLOCK_SIZE_M, BLOCK_SIZE_M)), axis=0)
    else:
        offs_n = tl.arange(0, BLOCK_SIZE_K)
        w_ptrs = W2 + e[:, None, None] * stride_we + rows[None, :, None] * stride_wk + offs_n[None, None, :]
        a_ptrs = A + (t * topk + js)[:, None] * stride_a + offs_n[None, :]
        acc3 = tl.zeros((TOPK, BLOCK_SIZE_M, BLOCK_SIZE_K), dtype=tl.float32)
        n_ok = offs_n < N  # the next step's tiles loaded before this step's products
        # the first weight tile is read before the wait: the up kernel never writes w2, so on
        # sm_90 (PDL) that read overlaps the up kernel's tail
        w_next = tl.load(w_ptrs, mask=ok[:, None, None] & n_ok[None, None, :], other=0.0)
        if USE_PDL:  # act is complete after this wait
            tl.extra.cuda.gdc_wait()
        a_next = tl.load(a_ptrs, mask=ok[:, None] & n_ok[None, :], other=0.0)
        for nb in range(0, tl.cdiv(N, BLOCK_SIZE_K)):
            a = a_next.to(tl.float32)
            w = w_next.to(tl.float32)
            n1 = (nb + 1) * BLOCK_SIZE_K
            n_ok = offs_n < N - n1
            a_next = tl.load(a_ptrs + n1, mask=ok[:, None] & n_ok[None, :], other=0.0)
            w_next = tl.load(w_ptrs + n1, mask=ok[:, None, None] & n_ok[None, None, :], other=0.0)
            acc3 += w * a[:, None, :]
        acc = tl.sum(acc3, axis=2)
        if MUL_WEIGHT:
            acc = acc * tl.load(TW + t * stride_tw + js, mask=ok, other=0.0)[:, None]
        # each expert's output rounded to hidden's dtype, then summed in fp32 (absent terms are 0)
        y = tl.where(ok[:, None], _cast(acc, OUT.dtype.element_ty).to(tl.float32), 0.0)
        total = tl.sum(y, axis=0)
    tl.store(OUT + t * stride_out + offs_c, _cast(total, OUT.dtype.element_ty), mask=offs_c < K)


def quant_groups(x: torch.Tensor, vllm: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [R, C] in e4m3 per 1x128 group (C zero-padded to whole groups, as the definition's
    ``_experts._qdq``; ``vllm``: divided by the scale, vLLM's form), by the op itself. The fp8
    up kernel reads it instead of quantizing the row again in each of its programs; the grouped
    path quantizes its activations with it too."""
    pad = -x.shape[1] % 128
    xp = torch.nn.functional.pad(x, (0, pad)) if pad else x
    q: tuple[torch.Tensor, torch.Tensor] = ops.quantization.per_token_group_quant_fp8(
        xp, 128, divide_by_scale=vllm
    )
    return q


def launch_decode(
    out: torch.Tensor,
    hidden: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w1_scale: torch.Tensor,
    w2_scale: torch.Tensor,
    expert_map: torch.Tensor,
    activation: str,
    apply_router_weight_on_input: bool,
    config: Mapping[str, Any],
    *,
    vllm_rounding: bool = False,
    pdl: bool | None = None,
) -> None:
    """The two launches (kernel arguments as the contract's, already checked; ``M >= 1``).
    ``pdl=False`` launches the down kernel plainly where PDL would be on (benchmarks: the same
    launch without it)."""
    m, k = hidden.shape
    experts, n2, _ = w1.shape
    n = n2 // 2
    topk = topk_ids.shape[1]
    if topk == 0:  # no slots: every row sums no term (the down kernel's tile needs TOPK >= 1)
        out.zero_()
        return
    fp8 = w1_scale.numel() > 0
    has_map = expert_map.numel() > 0
    num_ids = expert_map.numel() if has_map else experts
    emap = expert_map if has_map else topk_ids
    bk = config["BLOCK_SIZE_K"]
    slots = triton.next_power_of_2(topk)
    act = torch.empty((m * topk, n), dtype=hidden.dtype, device=hidden.device)
    s1 = w1_scale if fp8 else topk_weights  # an unused pointer when not fp8
    s2 = w2_scale if fp8 else topk_weights
    warps, stages = config["num_warps"], config["num_stages"]
    groups = bk // 128 if fp8 else 1
    # the down kernel launched programmatically (PDL) behind the up kernel, on GPUs that have it
    pdl = _pdl(hidden.device) and pdl is not False
    extra = {"launch_pdl": True} if pdl else {}
    if fp8:  # the token rows quantized once (not by every program): one launch
        x, xs = quant_groups(hidden, vllm_rounding)
    else:
        x, xs = hidden, topk_weights  # an unused pointer
    _up_kernel[(m * topk, triton.cdiv(n, config["BLOCK_SIZE_N"]))](
        x, xs, w1, s1, topk_weights, topk_ids, emap, act,
        n, k, topk, num_ids, experts,
        x.stride(0), xs.stride(0) if fp8 else 0, w1.stride(0), w1.stride(1),
        s1.stride(0) if fp8 else 0, s1.stride(1) if fp8 else 0, s1.stride(2) if fp8 else 0,
        topk_weights.stride(0), topk_ids.stride(0), act.stride(0),
        _OAI_ALPHA, _OAI_LIMIT,
        ACT_CODE=ACT_CODES[activation], HAS_MAP=has_map, MUL_WEIGHT=apply_router_weight_on_input,
        FP8=fp8, GROUPS=groups, USE_PDL=pdl, VLLM=vllm_rounding and activation != "swigluoai", BLOCK_SIZE_N=config["BLOCK_SIZE_N"], BLOCK_SIZE_K=bk,
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    _down_kernel[(m, triton.cdiv(k, config["BLOCK_SIZE_M"]))](
        act, w2, s2, topk_weights, topk_ids, emap, out,
        n, k, topk, num_ids, experts,
        act.stride(0), w2.stride(0), w2.stride(1),
        s2.stride(0) if fp8 else 0, s2.stride(1) if fp8 else 0, s2.stride(2) if fp8 else 0,
        topk_weights.stride(0), topk_ids.stride(0), out.stride(0),
        HAS_MAP=has_map, MUL_WEIGHT=not apply_router_weight_on_input, FP8=fp8, GROUPS=groups,
        USE_PDL=pdl, DIVIDE=vllm_rounding, RECIP=vllm_rounding and hidden.is_cuda, TOPK=slots,
        ROWS=max(16, slots * config["BLOCK_SIZE_M"]), COLS=max(16, slots), BLOCK_SIZE_M=config["BLOCK_SIZE_M"], BLOCK_SIZE_K=bk,
        num_warps=warps, num_stages=stages, **extra,
    )  # fmt: skip
