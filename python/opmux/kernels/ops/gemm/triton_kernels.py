"""Triton kernel of ``gemm.w8a8_block_fp8_matmul`` (imported only when the triton backend runs).

``out[m, n] = sum_kb a_scale[m, kb] * b_scale[n // 128, kb] * (a[m, kb-block] . b[n, kb-block])``
with 128x128 weight blocks and 1x128 activation groups: every K step of the kernel is one
scale block (``BLOCK_SIZE_K == 128``), its fp8 tiles go through ``tl.dot`` into an fp32 block
product that is scaled and added to the fp32 accumulator.

The launch configuration (tile sizes, grouping, warps, stages, split-K) comes from
:mod:`opmux.kernels.tuned`: a tuned table for (N, K, device) when one exists, else the tested
default heuristic; nothing here picks tile sizes.

Split-K (``SPLIT_K > 1``, wherever the M x N tile grid leaves SMs idle: decode M, small N)
writes fp32 partial sums to a ``[SPLIT_K, M, N]`` workspace and a second kernel adds them in a
fixed order and casts: deterministic (no atomics), so results do not depend on scheduling.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import triton
import triton.language as tl

from opmux.kernels import tuned
from opmux.kernels.ops._triton_tuned import launch_tuned

OP = "gemm.w8a8_block_fp8_matmul"
BACKEND = "triton"
#: the weight-block edge and activation group size of the contract
SCALE_BLOCK = 128
_REDUCE_BLOCK = 1024


@triton.jit
def _cast(x, dtype: tl.constexpr):
    """fp32 -> out dtype, rounded to nearest even. For bf16 the rounding is done on the bits
    first, so the cast only drops zeros: GPUs round so anyway, the CPU interpreter's cast
    truncates (-36.99 -> -36.75). A few integer ops per output element, once per tile."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
        return tl.where(x != x, x, bits.to(tl.float32, bitcast=True)).to(tl.bfloat16)
    elif dtype == tl.float16:
        return x.to(tl.float16)
    else:
        return x


@triton.jit
def _w8a8_block_fp8_matmul_kernel(
    A,
    B,
    C,
    AS,
    BS,
    W,
    M,
    N,
    K,
    stride_am,
    stride_bn,
    stride_cm,
    stride_as_m,
    stride_as_k,
    stride_bs_n,
    stride_bs_k,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    SCALE_N: tl.constexpr,
):
    # grouped ordering: GROUP_SIZE_M row tiles walk the N tiles together, so a band of B stays
    # in L2 while the group's A rows are reused
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    # rows past M / columns past N load row M-1 / column N-1 (always in bounds, no mask in the
    # loop) and are dropped by the store mask; int64: m * stride_am reaches past 2**31
    rows = tl.minimum(offs_m, M - 1).to(tl.int64)
    cols = tl.minimum(offs_n, N - 1).to(tl.int64)
    a_ptrs = A + rows[:, None] * stride_am + offs_k[None, :]
    b_ptrs = B + cols[None, :] * stride_bn + offs_k[:, None]
    as_ptrs = AS + rows * stride_as_m
    bs_ptrs = BS + (cols // SCALE_N) * stride_bs_n

    num_kb = tl.cdiv(K, BLOCK_SIZE_K)
    kb_per_split = tl.cdiv(num_kb, SPLIT_K)
    kb_lo = tl.program_id(1) * kb_per_split
    kb_hi = tl.minimum(kb_lo + kb_per_split, num_kb)

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for kb in range(kb_lo, kb_hi):
        # int32 is enough from here: k0 < K, and kb * stride_as_k < ceil(K / 128) * M
        k0 = kb * BLOCK_SIZE_K
        if EVEN_K:
            a = tl.load(a_ptrs + k0)
            b = tl.load(b_ptrs + k0)
        else:
            k_left = K - k0
            a = tl.load(a_ptrs + k0, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs + k0, mask=offs_k[:, None] < k_left, other=0.0)
        a_s = tl.load(as_ptrs + kb * stride_as_k)
        b_s = tl.load(bs_ptrs + kb * stride_bs_k)
        acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]

    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if SPLIT_K == 1:
        c_ptrs = C + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
        tl.store(c_ptrs, _cast(acc, C.dtype.element_ty), mask=mask)
    else:
        # workspace [SPLIT_K, M, N], contiguous
        w_ptrs = W + (tl.program_id(1) * M + offs_m.to(tl.int64))[:, None] * N + offs_n[None, :]
        tl.store(w_ptrs, acc, mask=mask)


@triton.jit
def _split_k_reduce_kernel(W, C, M, N, stride_cm, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    """C[m, n] = sum over s (in order) of W[s, m, n], cast to C's dtype; one row per program."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLIT_K):
        acc += tl.load(W + (s * M + row) * N + cols, mask=mask, other=0.0)
    tl.store(C + row * stride_cm + cols, _cast(acc, C.dtype.element_ty), mask=mask)


def launch(
    out: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    config: Mapping[str, int],
) -> None:
    """Run the kernel with an explicit launch configuration (the tuner's entry)."""
    m, k = a.shape
    n = b.shape[0]
    if m == 0 or n == 0:
        return
    block_m = config["BLOCK_SIZE_M"]
    block_n = config["BLOCK_SIZE_N"]
    split_k = min(config.get("SPLIT_K", 1), triton.cdiv(k, SCALE_BLOCK)) if k > 0 else 1
    workspace = torch.empty((split_k, m, n), dtype=torch.float32, device=out.device) if split_k > 1 else out
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n), split_k)
    _w8a8_block_fp8_matmul_kernel[grid](
        a,
        b,
        out,
        a_scale,
        b_scale,
        workspace,
        m,
        n,
        k,
        a.stride(0),
        b.stride(0),
        out.stride(0),
        a_scale.stride(0),
        a_scale.stride(1),
        b_scale.stride(0),
        b_scale.stride(1),
        BLOCK_SIZE_M=block_m,
        BLOCK_SIZE_N=block_n,
        BLOCK_SIZE_K=config["BLOCK_SIZE_K"],
        GROUP_SIZE_M=config["GROUP_SIZE_M"],
        SPLIT_K=split_k,
        EVEN_K=k % config["BLOCK_SIZE_K"] == 0,
        SCALE_N=SCALE_BLOCK,
        num_warps=config["num_warps"],
        num_stages=config["num_stages"],
    )
    if split_k > 1:
        _split_k_reduce_kernel[(m, triton.cdiv(n, _REDUCE_BLOCK))](
            workspace, out, m, n, out.stride(0), SPLIT_K=split_k, BLOCK=_REDUCE_BLOCK, num_warps=4
        )


def w8a8_block_fp8_matmul(
    out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor
) -> None:
    """``out = (a * a_scale) @ (b * b_scale).T`` blockwise, per the op's contract (ops/gemm/op.py)."""
    m, k = a.shape
    n = b.shape[0]
    if m == 0 or n == 0:
        return
    device = tuned.device_name(a.device)
    config = tuned.lookup(OP, BACKEND, device, (n, k), m)
    launch_tuned(lambda cfg: launch(out, a, b, a_scale, b_scale, cfg), config, OP, BACKEND, device, (n, k), m)
