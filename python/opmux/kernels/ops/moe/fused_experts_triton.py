"""Triton backend of ``moe.fused_experts`` (imported only when the triton backend runs).

The engines' structure (vLLM's / SGLang's fused MoE), written as opmux's own code:

1. routing: ``moe.moe_align_block_size(topk_ids, BLOCK_SIZE_M, ...)`` lists the slots
   ``t * topk + j`` per local expert, each expert padded to whole M-blocks, one expert id per
   block (-1 past the total; slots mapped to -1 by ``expert_map`` are left out, and on CUDA
   ids out of range are skipped): a block without an expert loads nothing;
2. a grouped GEMM (one program per (M-block of slots, N-block)): the block's rows of ``hidden``
   (``slot // topk``) times its expert's ``w1`` rows, fp32 accumulation, stored rounded to
   ``hidden``'s dtype into ``[M * topk, 2N]``;
3. the gated activation through ``activation.<act>_and_mul`` (fp32, one rounding);
4. the same kernel on the activations (rows ``slot``) and ``w2``, times the routed weight, rounded
   to ``hidden``'s dtype into step 2's buffer (free by then), in chunks of at most 2N of K's
   columns when K > 2N, so that no intermediate outgrows the definition's ``[M * topk, 2N]``;
5. a reduce kernel per chunk: per token, the ``topk`` terms that an expert of this rank
   computed, summed in fp32, rounded once into ``out``'s columns (rows with no such term get 0).

Allocated per call: the routing (``moe_align_block_size``'s three int32 arrays), the first
product ``[M * topk, 2N]``, the activation ``[M * topk, N]``, and for fp8 the quantized copies of
``hidden`` and of the activation (one byte per element) with their scales. A configuration with
``DECODE: 1`` runs :mod:`.fused_experts_decode` instead (two launches, only the activation).

Why this arithmetic: it is the definition's (``_experts.reference``), the rounding points the
engines' caches impose: each product summed in fp32, the first rounded to ``hidden``'s dtype, the
activation in fp32 rounded once, each expert's output rounded, the terms summed in fp32. fp32
``hidden`` uses IEEE products (no tf32). fp8 weights: the activations are quantized per 1x128
group by ``quantization.per_token_group_quant_fp8`` (a K that is no multiple of 128 zero-padded
to whole groups, as ``_experts._qdq`` defines it), and every K step of the kernel is one scale
block: ``acc += dot(a, b) * a_scale[:, None] * b_scale[None, :]``.

``out`` may be ``hidden`` itself: ``hidden`` is read by step 2 only, ``out`` written by step 5.
The launch configuration comes from :mod:`opmux.kernels.tuned` (vLLM's / SGLang's fused-MoE
tables by (E, N), device and form), else its tested default heuristic.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from opmux.kernels import ops, tuned
from opmux.kernels.ops._triton_tuned import launch_tuned
from opmux.kernels.ops.gemm.triton_kernels import _cast
from opmux.kernels.ops.moe import _experts
from opmux.kernels.ops.moe.fused_experts_decode import launch_decode, quant_groups

OP = "moe.fused_experts"
BACKEND = "triton"
#: the weight-block edge and activation group size of the fp8 form
SCALE_BLOCK = 128
_REDUCE_BLOCK = 1024
#: Triton's CPU interpreter (tests): read as ``triton.jit`` reads it, when the kernels are defined.
#: Its ``tl.dot`` takes bf16 tiles for integers (they are stored as uint16 there), so bf16 tiles
#: go to the dot as fp32 there (exact: a bf16 product fits fp32); never on a GPU
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
_SCHEMA = tuned.SCHEMAS[OP]
assert _SCHEMA.kernel_problem is not None and _SCHEMA.kernel_tags is not None
#: (E, N), M and the form's tags (vLLM's file names) of a call, from its kernel arguments
_PROBLEM, _TAGS = _SCHEMA.kernel_problem, _SCHEMA.kernel_tags


@triton.jit
def _grouped_gemm_kernel(
    A,
    B,
    C,
    AS,
    BS,
    TW,
    SORTED,
    EXPERTS,
    NPOST,
    N,
    K,
    num_slots,
    num_sorted,
    topk,
    a_div,
    num_experts,
    stride_am,
    stride_be,
    stride_bn,
    stride_cm,
    stride_as_m,
    stride_as_k,
    stride_bs_e,
    stride_bs_n,
    stride_bs_k,
    stride_tw,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,
    FP8: tl.constexpr,
    IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
    EVEN_K: tl.constexpr,
    SCALE_N: tl.constexpr,
):
    """C[slot, n] = (A[slot // a_div] . B[expert, n]) (* weight of slot), for the slots of one
    M-block of the routing (all one expert's) and one N-block; fp32 accumulation."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(num_sorted, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m

    # blocks past the padded total, and blocks of no (or no valid) expert, touch nothing
    if pid_m * BLOCK_SIZE_M >= tl.load(NPOST):
        return
    expert = tl.load(EXPERTS + pid_m).to(tl.int64)
    if (expert < 0) | (expert >= num_experts):
        return

    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    slots = tl.load(SORTED + offs_m).to(tl.int64)
    slot_ok = slots < num_slots
    # padding slots read the block's first slot's row (always a routed one: an expert's padding
    # never fills a block), columns past N column N-1: in bounds, no mask in the loop, and only
    # rows this expert wrote (an unrouted row of the activations holds anything, NaN included);
    # the store drops them
    first = tl.load(SORTED + pid_m * BLOCK_SIZE_M).to(tl.int64)
    rows = tl.where(slot_ok, slots, first) // a_div
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    cols = tl.minimum(offs_n, N - 1).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = A + rows[:, None] * stride_am + offs_k[None, :]
    b_ptrs = B + expert * stride_be + cols[None, :] * stride_bn + offs_k[:, None]
    if FP8:
        as_ptrs = AS + rows * stride_as_m
        bs_ptrs = BS + expert * stride_bs_e + (cols // SCALE_N) * stride_bs_n

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        k0 = kb * BLOCK_SIZE_K
        if EVEN_K:
            a = tl.load(a_ptrs + k0)
            b = tl.load(b_ptrs + k0)
        else:
            k_left = K - k0
            a = tl.load(a_ptrs + k0, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs + k0, mask=offs_k[:, None] < k_left, other=0.0)
        if FP8:
            a_s = tl.load(as_ptrs + kb * stride_as_k)
            b_s = tl.load(bs_ptrs + kb * stride_bs_k)
            acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        elif IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        elif UPCAST:  # the interpreter's dot multiplies bf16 tiles as their uint16 bits
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)

    if MUL_WEIGHT:
        w = tl.load(TW + (slots // topk) * stride_tw + slots % topk, mask=slot_ok, other=0.0)
        acc = acc * w[:, None]
    c_ptrs = C + slots[:, None] * stride_cm + offs_n[None, :]
    mask = slot_ok[:, None] & (offs_n[None, :] < N)
    tl.store(c_ptrs, _cast(acc, C.dtype.element_ty), mask=mask)


@triton.jit
def _sum_topk_kernel(
    Y,
    OUT,
    IDS,
    MAP,
    K,
    topk,
    num_ids,
    num_experts,
    stride_out,
    stride_ids,
    HAS_MAP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """OUT[t, :] = sum over j (in order, fp32) of Y[t * topk + j, :] for the slots an expert of
    this rank computed (the others were never written: left out by ``where``)."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_k = cols < K
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in range(0, topk):
        e = tl.load(IDS + t * stride_ids + j).to(tl.int64)
        ok = (e >= 0) & (e < num_ids)
        if HAS_MAP:
            local = tl.load(MAP + tl.where(ok, e, 0))
            ok = ok & (local >= 0) & (local < num_experts)
        # an unwritten slot holds anything (NaN included): its term is not even loaded
        y = tl.load(Y + (t * topk + j) * K + cols, mask=cols < tl.where(ok, K, 0), other=0.0)
        acc += y.to(tl.float32)
    tl.store(OUT + t * stride_out + cols, _cast(acc, OUT.dtype.element_ty), mask=in_k)


def _grouped_gemm(
    c: torch.Tensor,
    a: torch.Tensor,
    w: torch.Tensor,
    a_scale: torch.Tensor | None,
    w_scale: torch.Tensor,
    topk_weights: torch.Tensor,
    routing: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    *,
    k: int,
    topk: int,
    a_div: int,
    mul_weight: bool,
    config: Mapping[str, Any],
) -> None:
    sorted_ids, expert_ids, post = routing
    n = w.shape[1]
    fp8 = a_scale is not None
    block_m, block_n, block_k = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"]
    # the scales, or unused pointers when not fp8
    a_s = a_scale if a_scale is not None else topk_weights
    b_s = w_scale if fp8 and w_scale is not None else topk_weights
    grid = (triton.cdiv(sorted_ids.numel(), block_m) * triton.cdiv(n, block_n),)
    _grouped_gemm_kernel[grid](
        a,
        w,
        c,
        a_s,
        b_s,
        topk_weights,
        sorted_ids,
        expert_ids,
        post,
        n,
        k,
        c.shape[0],
        sorted_ids.numel(),
        topk,
        a_div,
        w.shape[0],
        a.stride(0),
        w.stride(0),
        w.stride(1),
        c.stride(0),
        a_s.stride(0),
        a_s.stride(1),
        b_s.stride(0) if fp8 else 0,
        b_s.stride(1) if fp8 else 0,
        b_s.stride(2) if fp8 else 0,
        topk_weights.stride(0),
        BLOCK_SIZE_M=block_m,
        BLOCK_SIZE_N=block_n,
        BLOCK_SIZE_K=block_k,
        GROUP_SIZE_M=config["GROUP_SIZE_M"],
        MUL_WEIGHT=mul_weight,
        FP8=fp8,
        IEEE=a.dtype == torch.float32,
        UPCAST=_INTERPRETED and a.dtype == torch.bfloat16,
        EVEN_K=k % block_k == 0,
        SCALE_N=SCALE_BLOCK,
        num_warps=config["num_warps"],
        num_stages=config["num_stages"],
    )


def launch_fused_experts(
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
) -> None:
    """Run the op with an explicit launch configuration (the tuner's entry); arguments as the
    contract's kernel arguments (already checked)."""
    m, k = hidden.shape
    if m == 0:
        return
    if config.get("DECODE"):
        launch_decode(
            out, hidden, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, expert_map,
            activation, apply_router_weight_on_input, config, vllm_rounding=vllm_rounding,
        )  # fmt: skip
        return
    experts, n2, _ = w1.shape
    n = n2 // 2
    topk = topk_ids.shape[1]
    slots = m * topk
    dt = hidden.dtype
    fp8 = w1_scale.numel() > 0
    has_map = expert_map.numel() > 0

    # 1. routing: local expert ids in [0, E) (a map is padded with -1 to at least E entries, the
    # align op's id range being its length)
    ids = topk_ids if topk_ids.is_contiguous() else topk_ids.contiguous()
    if has_map:
        num_ids = expert_map.numel()
        emap = expert_map
        if num_ids < experts:
            emap = torch.cat([expert_map, expert_map.new_full((experts - num_ids,), -1)])
        routing = ops.moe.moe_align_block_size(ids, config["BLOCK_SIZE_M"], emap.numel(), emap)
    else:
        num_ids = experts
        routing = ops.moe.moe_align_block_size(ids, config["BLOCK_SIZE_M"], experts)

    # the first product [slots, 2N]: the largest intermediate, as the definition's; its buffer
    # takes the second product's output too, in column chunks when K > 2N (``_down_chunks``)
    cache = torch.empty(slots * n2, dtype=dt, device=hidden.device)
    h1 = cache.view(slots, n2)

    # 2. first product
    a1_scale: torch.Tensor | None = None
    a2_scale: torch.Tensor | None = None
    if fp8:
        a1, a1_scale = quant_groups(hidden, vllm_rounding)
    else:
        a1 = hidden
    _grouped_gemm(
        h1, a1, w1, a1_scale, w1_scale, topk_weights, routing,
        k=k, topk=topk, a_div=topk, mul_weight=apply_router_weight_on_input, config=config,
    )  # fmt: skip

    # 3. activation (fp8: into a buffer of whole 128-groups, the tail zero, then quantized)
    n_pad = n + (-n % SCALE_BLOCK) if fp8 else n
    act = torch.empty((slots, n_pad), dtype=dt, device=hidden.device)
    if n_pad != n:
        act[:, n:].zero_()
    name, kw = _experts.gated_op(activation, vllm_rounding)
    getattr(ops.activation, name)(h1, out=act[:, :n], **kw)
    if fp8:
        a2, a2_scale = quant_groups(act, vllm_rounding)
    else:
        a2 = act

    # 4. second product, each expert's output times its weight, rounded to hidden's dtype, and
    # 5. the topk terms of each token, summed in fp32, rounded once: per chunk of K's columns
    for k0, width in _down_chunks(k, n2, fp8):
        y = (
            cache[: slots * width].view(slots, width)
            if width <= n2
            else torch.empty((slots, width), dtype=dt, device=hidden.device)
        )
        cols = slice(k0, k0 + width)
        w2_s = w2_scale[:, k0 // SCALE_BLOCK :] if fp8 else w2_scale
        _grouped_gemm(
            y, a2, w2[:, cols], a2_scale, w2_s, topk_weights, routing,
            k=n, topk=topk, a_div=1, mul_weight=not apply_router_weight_on_input, config=config,
        )  # fmt: skip
        block = min(_REDUCE_BLOCK, triton.next_power_of_2(width))
        _sum_topk_kernel[(m, triton.cdiv(width, block))](
            y,
            out[:, cols],
            topk_ids,
            expert_map if has_map else topk_ids,
            width,
            topk,
            num_ids,
            experts,
            out.stride(0),
            topk_ids.stride(0),
            HAS_MAP=has_map,
            BLOCK=block,
            num_warps=4,
        )


def _down_chunks(k: int, n2: int, fp8: bool) -> list[tuple[int, int]]:
    """(first column, width) of the second product's passes: all of K at once when it fits the
    first product's [slots, 2N] buffer, else chunks of at most 2N columns (fp8: whole 128-row
    weight blocks, so each chunk's scales start on a block; only a 2N below 128 then needs a
    buffer of its own, 128 wide). vLLM keeps one [slots, max(2N, K)] cache instead: larger than
    the definition's largest intermediate when K > 2N (Qwen3-30B-A3B: K 2048, 2N 1536)."""
    if k <= n2:
        return [(0, k)]
    width = max(SCALE_BLOCK, n2 // SCALE_BLOCK * SCALE_BLOCK) if fp8 else n2
    return [(k0, min(width, k - k0)) for k0 in range(0, k, width)]


def fused_experts(
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
    vllm_rounding: bool,
) -> None:
    """``out = sum_j w_j * W2[e_j] act(W1[e_j] hidden)`` per the op's contract (ops/moe/_experts.py),
    with the tuned (else default) launch configuration for (E, N), M, the device and the form."""
    args = (out, hidden, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, expert_map)
    if hidden.shape[0] == 0:
        return
    shape, m = _PROBLEM(*args)
    device, tags = tuned.device_name(hidden.device), _TAGS(*args)
    config = tuned.lookup(OP, BACKEND, device, shape, m, tags)
    launch_tuned(
        lambda cfg: launch_fused_experts(
            *args, activation, apply_router_weight_on_input, cfg, vllm_rounding=vllm_rounding
        ),
        config, OP, BACKEND, device, shape, m, tags,
    )  # fmt: skip
