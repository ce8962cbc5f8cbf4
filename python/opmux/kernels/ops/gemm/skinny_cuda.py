"""The skinny-M CUDA backend of ``gemm.w8a8_block_fp8_matmul`` (``skinny``): opmux's own unit
``gemm_skinny_cuda`` (``jit/csrc/gemm_skinny_cuda.cu``: the kernel, its thread layout and its
bounds guarantees) for at most 16 rows of ``a``, the decode regime of a linear layer.

There the GEMM is one read of the weights. The CUTLASS and Triton kernels tile M to 64-128 rows
and cover N with few wide tiles; on the H200 they read weights of 15-120 MB at 0.3-0.7 of the copy
bandwidth (``docs/benchmarks/gemm_h200.md``). This kernel gives each warp 8-32 weight rows and a
share of K, loads each lane's 32 bytes of a row per 128-wide K block straight into the operand
registers of ``mma.sync`` m16n8k32 (e4m3, sm_89+; the 16 padded rows of ``a`` are the MMA's M),
promotes each block's fp32 tile by its two scales as the definition does, and sums the warps'
K shares in a fixed order: deterministic, no workspace, one launch.

Where it runs (``supports``, the predicate, says why not otherwise): CUDA sm_89 or newer, at most
:data:`MAX_ROWS` rows, K a multiple of 16, 16-byte aligned ``a`` and ``b`` with row strides of
16-byte multiples. Its launch (tiles per warp, warps along K) comes from the device's tuned
``backend=skinny`` table for the shape and M (``python -m opmux.kernels.tune
gemm.w8a8_block_fp8_matmul --backend skinny`` writes them), else the unit's own choice.

A vendor-style backend (its own ``Requirement`` and unit, like ``moe.fused_experts``' ``cuda``):
it loads from the wheel's AOT library when that has the functions, else JIT-compiles the unit
once (seconds; a failed build or a disabled JIT raises ``BackendUnavailable``: dispatch falls
back under ``OPMUX_FALLBACK``). Declared after Triton; a device's select table (the tuner's
``--backend select`` race) puts it first where it was measured faster.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from ... import tuned
from ...errors import BackendUnavailable
from ._skinny_launch import KEYS, MAX_ROWS

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

OP, BACKEND = "gemm.w8a8_block_fp8_matmul", "skinny"
_FUNCTIONS = ("w8a8_block_fp8_matmul_skinny_cuda", "w8a8_block_fp8_matmul_skinny_cuda_default")


def refusal(*, device: str, capability: tuple[int, int] | None, m: int, k: int, aligned: bool) -> str | None:
    """Why the kernel cannot run a call with these facts (None: it can). Pure: the predicate
    gathers the facts, tests call this directly."""
    if device != "cuda":
        return f"the skinny kernel runs on CUDA tensors, not {device}"
    if capability is None or capability < (8, 9):
        got = "unknown" if capability is None else f"sm_{capability[0]}{capability[1]}"
        return f"the skinny kernel needs the fp8 MMA of sm_89 or newer; this GPU is {got}"
    if m > MAX_ROWS:
        return f"the skinny kernel takes at most {MAX_ROWS} rows of a (decode sizes); this call has {m}"
    if k % 16:
        return f"the skinny kernel reads rows 16 bytes at a time: K must be a multiple of 16 (K={k})"
    if not aligned:
        return "the skinny kernel needs 16-byte aligned a and b and row strides of 16-byte multiples"
    return None


def _aligned(t: Any) -> bool:
    return bool(t.data_ptr() % 16 == 0 and (t.shape[0] <= 1 or t.stride(0) % 16 == 0))


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def supports(
    a: Any, b: Any, a_scale: Any = None, b_scale: Any = None, out_dtype: Any = None, out: Any = None
) -> str | None:
    """The backend's predicate (the op's public arguments): None to run, else the reason."""
    try:
        device = a.device
        k = int(a.shape[-1])
        m = a.numel() // max(k, 1)
        rows = a.reshape(m, k) if a.dim() != 2 else a
        aligned = _aligned(rows) and _aligned(b)
    except Exception:  # not tensors, wrong ranks, rows that are no view: the contract names it
        return None
    capability = None
    if device.type == "cuda":
        try:
            capability = _capability(
                device.index if device.index is not None else torch.cuda.current_device()
            )
        except Exception as exc:  # a GPU whose properties cannot be read: say so, run nothing
            return f"the skinny kernel could not read the GPU's properties: {type(exc).__name__}: {exc}"
    return refusal(device=device.type, capability=capability, m=m, k=k, aligned=aligned)


@functools.cache
def library() -> dict[str, Any]:
    """Load ``gemm_skinny_cuda`` once per process (``BackendUnavailable`` if it cannot be)."""
    from .._native import unit_functions

    return unit_functions("gemm_skinny_cuda", _FUNCTIONS, BACKEND)


def tuned_launch(a: Tensor, b: Tensor) -> tuple[int, int]:
    """(tiles per warp, warps along K) for this call from the device's tuned table (nearest M),
    else 0, 0: the unit's own choice."""
    config = tuned.lookup(OP, BACKEND, tuned.device_name(a.device), (b.shape[0], a.shape[1]), a.shape[0])
    tiles, k_warps = (config[key] for key in KEYS)
    return tiles, k_warps


def launch(
    out: Tensor,
    a: Tensor,
    b: Tensor,
    a_scale: Tensor,
    b_scale: Tensor,
    *,
    config: tuple[int, int] | None = None,
) -> None:
    """The unit's kernel on the checked kernel arguments; ``config`` (tiles, warps along K; 0: the
    unit's choice) overrides the tuned table (the tuner and tests)."""
    tiles, k_warps = tuned_launch(a, b) if config is None else config
    index = a.device.index if a.device.index is not None else torch.cuda.current_device()
    pdl = _capability(index)[0] >= 9  # the unit's launch also checks the binary has griddepcontrol
    library()["w8a8_block_fp8_matmul_skinny_cuda"](out, a, b, a_scale, b_scale, tiles, k_warps, pdl)


def matmul(out: Tensor, a: Tensor, b: Tensor, a_scale: Tensor, b_scale: Tensor) -> None:
    """``out = a @ b.T`` per the op's definition at decode sizes (the kernel arguments, already
    checked). A call the kernel cannot take (forced onto it) raises ``BackendUnavailable`` with
    the reason and computes nothing."""
    why = supports(a, b)
    if why:
        raise BackendUnavailable(BACKEND, why)
    if not a.shape[0] or not b.shape[0]:
        return
    launch(out, a, b, a_scale, b_scale)
