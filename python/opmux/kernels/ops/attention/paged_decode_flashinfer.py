"""The ``flashinfer`` backend of ``attention.paged_decode``: FlashInfer's
``BatchDecodeWithPagedKVCacheWrapper`` where the package is installed (the ``flashinfer``
capability).

FlashInfer plans a batch once (CSR page table: ``indptr``, ``indices``, ``last_page_len``, read on
the host) and runs each layer on that plan; opmux's op takes vLLM's block table and lengths per
call. So the backend keeps one plan per batch: keyed by the table's and the lengths' storage and
their version counters (an in-place update of either, as an engine's next step makes, plans
again) and by the shapes and knobs. The first call of a batch converts the table (one host read:
it is refused inside a CUDA-graph capture, where Triton runs instead); every later layer of the
step runs on the plan with no host work. Block ids are checked while planning: a table naming a
block outside the cache raises ``BackendUnavailable`` (dispatch falls back to a backend that
skips such blocks) rather than letting FlashInfer read out of bounds.

Where it runs (``supports``, the predicate, says why not otherwise): CUDA bf16 / fp16, head dims
64 / 128 / 256 (the value's the key's: no MLA), a cache that is an NHD tensor or the HND view of a contiguous HND one (FlashInfer's
two layouts), no sinks, no lse (FlashInfer's is base 2), no fp8 cache (its scales are host floats),
not while a CUDA graph is captured. Declared last but torch on CUDA until an H200 benchmark
(``benchmarks/bench_attention_decode.py``) shows it faster.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from ...errors import BackendUnavailable

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

BACKEND = "flashinfer"
HEAD_DIMS = (64, 128, 256)
#: FlashInfer's float workspace per device (its examples' 128 MB)
WORKSPACE_BYTES = 128 << 20
#: plans kept (one per live batch: a few engines' steps)
MAX_PLANS = 8


def layout(cache: Any) -> str | None:
    """``"NHD"`` for a dense [nb, page, Hkv, D] cache, ``"HND"`` for the [nb, page, Hkv, D] view of a
    dense [nb, Hkv, page, D] one, else None."""
    if cache.is_contiguous():
        return "NHD"
    if cache.transpose(1, 2).is_contiguous():
        return "HND"
    return None


def refusal(
    *,
    device: str,
    dtype: str,
    cache_dtype: str,
    head_dim: int,
    layouts: tuple[str | None, str | None],
    sinks: bool,
    value_dim: int | None = None,
    lse: bool,
    capturing: bool,
) -> str | None:
    """Why FlashInfer's decode cannot run a call with these facts (None: it can). Pure."""
    if device != "cuda":
        return "FlashInfer's decode runs on CUDA tensors"
    if dtype not in ("bfloat16", "float16") or cache_dtype != dtype:
        return f"FlashInfer's decode here takes bf16 / fp16 queries and caches of that dtype ({dtype}, {cache_dtype})"
    if head_dim not in HEAD_DIMS:
        return f"head dim {head_dim}: FlashInfer's decode is built for {HEAD_DIMS}"
    if value_dim is not None and value_dim != head_dim:
        return f"value head dim {value_dim} != key head dim {head_dim} (MLA): the Triton backend takes it"
    if layouts[0] is None or layouts[0] != layouts[1]:
        return "FlashInfer takes NHD caches or HND views of dense HND ones, the same for K and V"
    if sinks:
        return "attention sinks: the next backend runs them"
    if lse:
        return "lse: FlashInfer's is in base 2; the next backend writes the op's"
    if capturing:
        return "FlashInfer plans a batch on the host: not inside a CUDA-graph capture"
    return None


def supports(
    query: Any,
    key_cache: Any,
    value_cache: Any,
    block_tables: Any = None,
    seq_lens: Any = None,
    scale: Any = 0.0,
    softcap: Any = 0.0,
    window_left: Any = -1,
    sinks: Any = None,
    k_scale: Any = None,
    v_scale: Any = None,
    lse: Any = None,
    out: Any = None,
) -> str | None:
    """The backend's predicate (the op's public arguments)."""
    try:
        capturing = query.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        return refusal(
            device=query.device.type,
            dtype=str(query.dtype).removeprefix("torch."),
            cache_dtype=str(key_cache.dtype).removeprefix("torch."),
            head_dim=int(query.shape[-1]),
            layouts=(layout(key_cache), layout(value_cache)),
            sinks=sinks is not None,
            value_dim=int(value_cache.shape[-1]),
            lse=lse is not None,
            capturing=capturing,
        )
    except Exception:  # not tensors, wrong ranks: the contract names the problem
        return None


def csr(block_tables: Tensor, seq_lens: Tensor, page: int, num_blocks: int) -> tuple[Tensor, Tensor, Tensor]:
    """(indptr, indices, last_page_len) int32 on the host: each sequence's first
    ``ceil(len / page)`` blocks, its last page holding 1 to ``page`` entries. Lengths are clamped
    to the table's capacity (as the op's kernels do); a sequence of length 0 or a used block id
    outside the cache raises BackendUnavailable (the call goes to the next backend)."""
    table = block_tables.to("cpu", torch.int64)
    lens = seq_lens.to("cpu", torch.int64).clamp(0, table.shape[1] * page)
    pages = (lens + page - 1) // page
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int64)
    indptr[1:] = pages.cumsum(0)
    if bool((lens == 0).any()):  # FlashInfer's last pages hold 1 to page_size entries
        raise BackendUnavailable(BACKEND, "a sequence of length 0 (FlashInfer plans none)")
    cols = torch.arange(table.shape[1])
    indices = table[cols[None, :] < pages[:, None]]
    if indices.numel() and bool(((indices < 0) | (indices >= num_blocks)).any()):
        raise BackendUnavailable(BACKEND, f"a block table names a block outside [0, {num_blocks})")
    last = lens - (pages - 1) * page
    return indptr.to(torch.int32), indices.to(torch.int32), last.to(torch.int32)


@functools.cache
def _decode_module() -> Any:
    try:
        import flashinfer.decode as fd  # vendor library, present only where installed
    except Exception as exc:  # not installed, or a build that fails to import here
        raise BackendUnavailable(BACKEND, f"flashinfer.decode cannot be imported: {exc}") from exc
    return fd


_WORKSPACES: dict[Any, Any] = {}
_PLANS: dict[Any, Any] = {}


def _wrapper(device: Any, kv_layout: str) -> Any:
    ws = _WORKSPACES.get(device)
    if ws is None:
        ws = _WORKSPACES[device] = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return _decode_module().BatchDecodeWithPagedKVCacheWrapper(ws, kv_layout)


def _plan(
    query: Tensor, key_cache: Tensor, block_tables: Tensor, seq_lens: Tensor, kv_layout: str,
    scale: float, softcap: float, window_left: int,
) -> Any:  # fmt: skip
    """The planned wrapper of this batch (made on its first layer)."""
    bsz, hq, d = query.shape
    nb, page, hkv = key_cache.shape[0], key_cache.shape[1], key_cache.shape[2]
    key = (
        query.device, block_tables.data_ptr(), block_tables._version, tuple(block_tables.shape),
        seq_lens.data_ptr(), seq_lens._version, bsz, hq, hkv, d, page, nb, query.dtype, kv_layout,
        scale, softcap, window_left,
    )  # fmt: skip
    planned = _PLANS.get(key)
    if planned is None:
        indptr, indices, last = csr(block_tables, seq_lens, page, nb)
        planned = _wrapper(query.device, kv_layout)
        planned.plan(
            indptr.to(query.device), indices.to(query.device), last.to(query.device), hq, hkv, d, page,
            window_left=window_left, logits_soft_cap=softcap if softcap > 0 else None,
            q_data_type=query.dtype, kv_data_type=key_cache.dtype, sm_scale=scale,
        )  # fmt: skip
        if len(_PLANS) >= MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = planned
    return planned


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
    """``attention.paged_decode`` per its contract (the kernel arguments, already checked)."""
    kv_layout = layout(key_cache)
    why = refusal(
        device=query.device.type,
        dtype=str(query.dtype).removeprefix("torch."),
        cache_dtype=str(key_cache.dtype).removeprefix("torch."),
        head_dim=int(query.shape[-1]),
        layouts=(kv_layout, layout(value_cache)),
        sinks=has_sinks,
        value_dim=int(value_cache.shape[-1]),
        lse=has_lse,
        capturing=query.device.type == "cuda" and torch.cuda.is_current_stream_capturing(),
    )
    if why is not None:  # forced onto a call it cannot run
        raise BackendUnavailable(BACKEND, why)
    if query.shape[0] == 0:
        return
    assert kv_layout is not None
    caches = (key_cache, value_cache)
    if kv_layout == "HND":  # FlashInfer's HND tensors: [nb, Hkv, page, D]
        caches = (key_cache.transpose(1, 2), value_cache.transpose(1, 2))
    wrapper = _plan(query, key_cache, block_tables, seq_lens, kv_layout, scale, softcap, window_left)
    wrapper.run(query, caches, out=out)
