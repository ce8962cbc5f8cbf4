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
from ...errors import BackendUnavailable, CallRefused
from ._skinny_launch import KEYS, MAX_ROWS

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

OP, BACKEND = "gemm.w8a8_block_fp8_matmul", "skinny"
UNIT = "gemm_skinny_cuda"
_RUN, _DEFAULT, _READY = (f"w8a8_block_fp8_matmul_skinny_cuda{s}" for s in ("", "_default", "_ready"))
_FUNCTIONS = (_RUN, _DEFAULT, _READY)


def refusal(*, device: str, capability: tuple[int, int] | None, m: int, k: int, aligned: bool) -> str | None:
    """Why the kernel cannot run a call with these facts (None: it can). Pure: the predicate
    gathers the facts, tests call this directly."""
    if device != "cuda":
        return f"the skinny kernel runs on CUDA tensors, not {device}"
    if capability is None or capability < (8, 9):
        got = "unknown" if capability is None else f"sm_{capability[0]}{capability[1]}"
        return f"the skinny kernel needs the fp8 MMA of sm_89 or newer; this GPU is {got}"
    if m > MAX_ROWS:  # the text names no M: dispatch caches verdicts by their reasons
        return f"the skinny kernel takes at most {MAX_ROWS} rows of a (decode sizes)"
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
    """The backend's predicate (the op's public arguments): None to run, else the reason. Reads
    facts only (no copy, no device work): it runs on every call the dispatch considers."""
    try:
        device = a.device
        k = int(a.shape[-1])
        m = a.numel() // max(k, 1)
        if m > MAX_ROWS or device.type != "cuda":
            return refusal(device=device.type, capability=(9, 0), m=m, k=k, aligned=True)
        rows = a if a.dim() == 2 else a.view(m, k)  # the contract's rows view, when one exists
        aligned = _aligned(rows) and _aligned(b)
    except Exception:  # not tensors, wrong ranks, rows that are no view: the contract names it
        return None
    try:
        capability = _capability(device.index if device.index is not None else torch.cuda.current_device())
    except Exception as exc:  # a GPU whose properties cannot be read: say so, run nothing
        return f"the skinny kernel could not read the GPU's properties: {type(exc).__name__}: {exc}"
    return refusal(device=device.type, capability=capability, m=m, k=k, aligned=aligned)


@functools.cache
def library(index: int) -> dict[str, Any]:
    """The unit's functions for GPU ``index``, loaded once: the AOT library's when its code for
    that GPU holds the kernel, else the unit JIT-built for it (an AOT library without sm_89 code
    runs its sm_80 image on an sm_89 GPU, where the kernel is absent). ``BackendUnavailable``
    with the reason when neither can be had."""
    from ...jit import load_module
    from .._native import unit_functions

    functions = unit_functions(UNIT, _FUNCTIONS, BACKEND)
    if _ready(functions, index):
        return functions
    try:
        module = load_module(UNIT)
        functions = {name: module[name] for name in _FUNCTIONS}
    except Exception as exc:  # no toolchain, a failed build, JIT off: dispatch falls back
        raise BackendUnavailable(
            BACKEND, f"the unit could not be built for this GPU: {type(exc).__name__}: {exc}"
        ) from exc
    if not _ready(functions, index):
        raise BackendUnavailable(BACKEND, "the unit's code for this GPU lacks the fp8 MMA of sm_89 or newer")
    return functions


def _ready(functions: dict[str, Any], index: int) -> bool:
    """Whether these functions' code for GPU ``index`` holds the kernel (a library with no code
    for the GPU at all fails the query: not ready either)."""
    try:
        return bool(functions[_READY](index))
    except Exception:
        return False


def tuned_launch(a: Tensor, b: Tensor) -> tuple[int, int]:
    """(tiles per warp, warps along K) for this call from the device's tuned table (the op's
    schema states its key: (N, K) and M), else 0, 0: the unit's own choice."""
    schema = tuned.SCHEMAS[OP]
    assert schema.kernel_problem is not None
    shape, m = schema.kernel_problem(None, a, b)
    config = tuned.lookup(OP, BACKEND, tuned.device_name(a.device), shape, m)
    tiles, k_warps = (config[key] for key in KEYS)
    return tiles, k_warps


def _index(t: Tensor) -> int:
    return t.device.index if t.device.index is not None else torch.cuda.current_device()


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
    index = _index(a)
    pdl = _capability(index)[0] >= 9  # the unit's launch also checks the binary has griddepcontrol
    library(index)[_RUN](out, a, b, a_scale, b_scale, tiles, k_warps, pdl)


def matmul(out: Tensor, a: Tensor, b: Tensor, a_scale: Tensor, b_scale: Tensor) -> None:
    """``out = a @ b.T`` per the op's definition at decode sizes (the kernel arguments, already
    checked). A call the kernel cannot take (forced onto it) raises ``CallRefused`` with
    the reason and computes nothing."""
    why = supports(a, b)
    if why:
        raise CallRefused(BACKEND, why)
    if not a.shape[0] or not b.shape[0]:
        return
    launch(out, a, b, a_scale, b_scale)
