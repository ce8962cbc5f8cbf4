"""Native CUDA backend of ``attention.paged_decode``: split-KV flash decoding in opmux's own unit
``attention_decode_cuda`` (``jit/csrc/attention_decode_cuda.cu``: the kernels, their thread
layout and their bounds guarantees).

Two kernels, PDL between them: the split kernel (one CTA per sequence, KV head (or chunk of its
GQA group, at most 8 query heads) and split; the group's heads share each K / V row, copied
into shared memory with 16-byte ``cp.async``, double-buffered; an fp32 online softmax) writes
each split's unnormalised output, max and sum into a float32 workspace, the merge kernel
(one CTA per sequence and query head) rescales the splits, adds the sinks and writes ``out``
and ``lse``. With one split the split kernel finalizes in place and the merge is not launched.

Workspace: ``B * Hq * S * (D + 2)`` float32 elements, allocated per call with ``torch.empty``
(the caching allocator; inside a CUDA-graph capture, the graph's pool), none when ``S = 1``.
``S`` (:func:`num_splits`) is a function of the shapes and the SM count alone, so the call
never synchronises and a captured graph replays with new lengths and tables.

Where it runs (``supports``, the predicate, says why not otherwise): CUDA sm_80+, head dims
64 / 80 / 96 / 128 / 256 with the value head dim the key's (not MLA's 576 / 512), caches whose rows start 16-byte aligned (a fresh cache, its HND
permuted view, kvcache's layouts all are). Bad tables on CUDA: lengths clamped to the table's
capacity, block ids outside ``[0, num_blocks)`` skipped, as the Triton kernel.

A vendor-style backend (named ``cuda``, with its own ``Requirement``) rather than the op's
native one, as ``moe.fused_experts``' ``cutlass``: the op has no CPU unit (``native=False``),
and its own unit keeps this compile out of every other group's. It loads from the wheel's AOT
library when it has the function, else JIT-compiles the unit once (a failed build or a
disabled JIT raises ``BackendUnavailable``: dispatch falls back under ``OPMUX_FALLBACK``).
Ordered after Triton on CUDA: on the H200 it took 2.3-6.9x Triton's time
(``benchmarks/bench_attention_decode.py``; a select table would move it first where it wins).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...errors import CallRefused

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

BACKEND = "cuda"
#: the head dims the unit instantiates
HEAD_DIMS = (64, 80, 96, 128, 256)
#: the split rule's bounds (the unit's ``num_splits``: kMinSplitTokens, kRuleMaxSplits) and the
#: most splits the kernels take (kMaxSplits)
MIN_SPLIT_TOKENS = 128
MAX_SPLITS = 64
KERNEL_MAX_SPLITS = 256
_FUNCTIONS = ("attention_decode_split_cuda", "attention_decode_num_splits")


def heads_per_cta(group: int) -> int:
    """Query heads per CTA for a GQA group of ``group`` heads (the unit's ``heads_per_cta``)."""
    return 1 if group <= 1 else 2 if group <= 2 else 4 if group <= 4 else 8


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def num_splits(batch: int, q_heads: int, kv_heads: int, bound: int, sm_count: int) -> int:
    """Splits per (sequence, KV head chunk), the unit's rule (``attention_decode_num_splits``):
    enough CTAs for two waves of the SMs, each split at least ``MIN_SPLIT_TOKENS`` positions of
    ``bound`` (the longest attended range the shapes allow: the table's capacity, or
    ``window_left + 1``), at most ``MAX_SPLITS``. Host values only: no sync."""
    g = q_heads // kv_heads if kv_heads > 0 else 1
    hc = heads_per_cta(g)
    programs = max(1, batch * kv_heads * _cdiv(g, hc))
    want = _cdiv(2 * sm_count, programs)
    by_len = _cdiv(max(1, bound), MIN_SPLIT_TOKENS)
    return max(1, min(want, by_len, MAX_SPLITS))


def context_bound(width: int, page_size: int, window_left: int) -> int:
    """The most positions one sequence attends: the table's capacity, or the window's length."""
    cap = width * page_size
    return min(cap, window_left + 1) if window_left >= 0 else cap


def refusal(
    *,
    device: str,
    capability: tuple[int, int] | None,
    query_dtype: str,
    cache_dtype: str,
    head_dim: int,
    aligned: bool,
    value_head_dim: int | None = None,
) -> str | None:
    """Why the backend cannot run a call with these facts (None: it can). Pure: the predicate
    gathers the facts, tests call this directly. ``value_head_dim``: the value cache's (None:
    ``head_dim``); the unit takes only ``Dv = D`` (not MLA's 512 of 576)."""
    if device != "cuda":
        return f"the native CUDA decode runs on CUDA tensors, not {device}"
    if capability is None or capability < (8, 0):
        got = "unknown" if capability is None else f"sm_{capability[0]}{capability[1]}"
        return f"the native CUDA decode needs sm_80 or newer (cp.async); this GPU is {got}"
    if query_dtype not in ("float32", "float16", "bfloat16"):
        return f"the native CUDA decode takes float32, float16 or bfloat16 queries, not {query_dtype}"
    if cache_dtype not in (query_dtype, "float8_e4m3fn"):
        return f"the native CUDA decode reads caches of the query's dtype or float8_e4m3fn, not {cache_dtype}"
    if value_head_dim is not None and value_head_dim != head_dim:
        return (
            f"the native CUDA decode reads values of the key's head dim; this call has key head dim "
            f"{head_dim} and value head dim {value_head_dim} (MLA): the Triton backend takes it"
        )
    if head_dim not in HEAD_DIMS:
        dims = ", ".join(map(str, HEAD_DIMS))
        return f"the native CUDA decode is built for head dims {dims}; this call has {head_dim}"
    if not aligned:
        return (
            "the native CUDA decode copies cache rows 16 bytes at a time: key_cache / value_cache need a "
            "16-byte aligned start and block, page and head strides of whole 16-byte units"
        )
    return None


def _aligned(t: Any) -> bool:
    unit = 16 // t.element_size()
    return t.data_ptr() % 16 == 0 and all(
        t.shape[i] <= 1 or t.stride(i) % unit == 0 for i in range(min(3, t.dim()))
    )


def supports(
    query: Any,
    key_cache: Any,
    value_cache: Any,
    block_tables: Any = None,
    seq_lens: Any = None,
    *_: Any,
    **__: Any,
) -> str | None:
    """The backend's predicate (the op's public arguments): None to run, else the reason. It runs
    on every call the dispatch considers: the GPU's capability is read once per device and the
    verdict once per set of facts."""
    try:
        device = query.device
        capability = None
        if device.type == "cuda":
            capability = _capability(
                device.index if device.index is not None else torch.cuda.current_device()
            )
        aligned = _aligned(key_cache) and _aligned(value_cache)
        return _verdict(
            device.type,
            capability,
            query.dtype,
            key_cache.dtype,
            int(query.shape[-1]),
            aligned,
            int(value_cache.shape[-1]),
        )
    except Exception:  # not tensors, wrong ranks: the contract names the problem
        return None


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.lru_cache(maxsize=256)
def _verdict(
    device: str,
    capability: tuple[int, int] | None,
    query_dtype: Any,
    cache_dtype: Any,
    head_dim: int,
    aligned: bool,
    value_head_dim: int,
) -> str | None:
    return refusal(
        device=device,
        capability=capability,
        query_dtype=str(query_dtype).removeprefix("torch."),
        cache_dtype=str(cache_dtype).removeprefix("torch."),
        head_dim=head_dim,
        aligned=aligned,
        value_head_dim=value_head_dim,
    )


class _Library:
    """The unit's functions, from the AOT library when it has them, else the JIT module."""

    def __init__(self, get: Callable[[str], Any]) -> None:
        self.split = get("attention_decode_split_cuda")
        self.num_splits = get("attention_decode_num_splits")


@functools.cache
def library() -> _Library:
    """Load ``attention_decode_cuda`` once per process (``BackendUnavailable`` if it cannot be)."""
    from .._native import unit_functions

    return _Library(unit_functions("attention_decode_cuda", _FUNCTIONS, BACKEND).__getitem__)


def launch(
    out: Tensor,
    lse: Tensor,
    has_lse: bool,
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    sinks: Tensor,
    has_sinks: bool,
    k_scale: Tensor,
    v_scale: Tensor,
    fp8: bool,
    scale: float,
    softcap: float,
    window_left: int,
    splits: int | None = None,
) -> None:
    """Both kernels on the checked kernel arguments; ``splits`` overrides :func:`num_splits`
    (tests, tuning; 1 to ``KERNEL_MAX_SPLITS``)."""
    bsz, hq, d = query.shape
    if bsz == 0:
        return
    ps, hkv = key_cache.shape[1], key_cache.shape[2]
    index = query.device.index if query.device.index is not None else torch.cuda.current_device()
    if splits is None:
        bound = context_bound(block_tables.shape[1], ps, window_left)
        splits = num_splits(bsz, hq, hkv, bound, _sm_count(index))
    size = bsz * hq * splits * (d + 2) if splits > 1 else 0
    workspace = torch.empty(size, dtype=torch.float32, device=query.device)
    pdl = _capability(index)[0] >= 9  # the unit also checks the binary has griddepcontrol
    library().split(
        out, lse, has_lse, query, key_cache, value_cache, block_tables, seq_lens, sinks, has_sinks,
        k_scale, v_scale, fp8, scale, softcap, window_left, workspace, splits, pdl,
    )  # fmt: skip


def paged_decode(
    out: Tensor,
    lse: Tensor,
    has_lse: bool,
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    sinks: Tensor,
    has_sinks: bool,
    k_scale: Tensor,
    v_scale: Tensor,
    fp8: bool,
    scale: float,
    softcap: float,
    window_left: int,
) -> None:
    """``attention.paged_decode`` per its contract (the kernel arguments, already checked). A
    call the backend cannot run (forced onto it) raises ``CallRefused`` with the reason
    and computes nothing."""
    why = supports(query, key_cache, value_cache)
    if why:
        raise CallRefused(BACKEND, why)
    launch(
        out, lse, has_lse, query, key_cache, value_cache, block_tables, seq_lens, sinks, has_sinks,
        k_scale, v_scale, fp8, scale, softcap, window_left,
    )  # fmt: skip
