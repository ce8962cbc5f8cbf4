"""The ``flashinfer`` backend of ``attention.paged_prefill``: FlashInfer's
``BatchPrefillWithPagedKVCacheWrapper`` (causal, on sm_90 its FA3 kernels) where the package is
installed (the ``flashinfer`` capability).

As the decode backend (``paged_decode_flashinfer``; the shared pieces in ``_flashinfer``): one plan
per batch, keyed by the block table's, the lengths' and ``cu_seqlens_q``'s storage and version
counters and by the shapes and knobs, made on the batch's first layer from one host read of the
three (so refused inside a CUDA-graph capture, where Triton runs instead) and run by every later
layer with no host work. The query rows of sequence ``b`` are ``cu_seqlens_q[b] ..
cu_seqlens_q[b + 1]``, the last ones of its ``seq_lens[b]`` positions: FlashInfer's causal mask
aligns them to the end of the keys as the op does. Planning checks what the op's contract
checks on the CPU and the kernels otherwise clamp: offsets that do not rise within the query's
rows, a sequence with more new tokens than positions, a block outside the cache, or an empty
sequence send the call to the next backend (``BackendUnavailable``), so FlashInfer never reads
out of bounds.

Where it runs (``supports``, the predicate, says why not otherwise): CUDA bf16 / fp16, head dims
64 / 128 / 256 with the value's the key's (no MLA), NHD caches or HND views of dense HND ones, no
sinks, no lse (FlashInfer's is base 2), no fp8 cache, not while a CUDA graph is captured. Declared
after Triton on CUDA until an H200 run of ``benchmarks/bench_attention_prefill.py`` (which times
FlashInfer's wrapper on the same paged cache) shows where it is faster.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from ...errors import BackendUnavailable
from . import _flashinfer
from ._flashinfer import BACKEND, csr, layout

if TYPE_CHECKING:
    from torch import Tensor
else:
    from .._torch import torch

__all__ = ["BACKEND", "paged_prefill", "query_indptr", "refusal", "supports"]

_PLANS: dict[Any, Any] = {}


def refusal(**facts: Any) -> str | None:
    """Why FlashInfer's prefill cannot run a call with these facts (None: it can). Pure."""
    return _flashinfer.refusal("prefill", **facts)


def supports(
    query: Any,
    key_cache: Any,
    value_cache: Any,
    block_tables: Any = None,
    seq_lens: Any = None,
    cu_seqlens_q: Any = None,
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
        return refusal(
            device=query.device.type,
            dtype=str(query.dtype).removeprefix("torch."),
            cache_dtype=str(key_cache.dtype).removeprefix("torch."),
            head_dim=int(query.shape[-1]),
            layouts=(layout(key_cache), layout(value_cache)),
            sinks=sinks is not None,
            value_dim=int(value_cache.shape[-1]),
            lse=lse is not None,
            capturing=_flashinfer.capturing(query),
        )
    except Exception:  # not tensors, wrong ranks: the contract names the problem
        return None


def query_indptr(cu_seqlens_q: Tensor, seq_lens: Tensor, rows: int, capacity: int) -> Tensor:
    """``cu_seqlens_q`` as FlashInfer's ``qo_indptr`` (int32, host), checked as the contract
    checks it on the CPU: it starts at 0, never falls, ends at the query's ``rows``, and no
    sequence has more new tokens than its length (clamped to the table's ``capacity``, as the
    kernels clamp it). Else BackendUnavailable: the next backend, whose kernels clamp."""
    cu = cu_seqlens_q.to("cpu", torch.int64)
    lens = seq_lens.to("cpu", torch.int64).clamp(0, capacity)
    new = cu[1:] - cu[:-1]
    if int(cu[0]) != 0 or int(cu[-1]) != rows or bool((new < 0).any()):
        raise BackendUnavailable(BACKEND, f"cu_seqlens_q does not rise from 0 to the query's {rows} rows")
    if bool((new > lens).any()):
        raise BackendUnavailable(BACKEND, "a sequence has more new tokens than its length")
    return cu.to(torch.int32)


@functools.cache
def _prefill_module() -> Any:
    try:
        import flashinfer.prefill as fp  # vendor library, present only where installed
    except Exception as exc:  # not installed, or a build that fails to import here
        raise BackendUnavailable(BACKEND, f"flashinfer.prefill cannot be imported: {exc}") from exc
    return fp


def _plan(
    query: Tensor, key_cache: Tensor, block_tables: Tensor, seq_lens: Tensor, cu_seqlens_q: Tensor,
    kv_layout: str, scale: float, softcap: float, window_left: int,
) -> Any:  # fmt: skip
    """The planned wrapper of this batch (made on its first layer)."""
    rows, hq, d = query.shape
    nb, page, hkv = key_cache.shape[0], key_cache.shape[1], key_cache.shape[2]
    key = (
        query.device, block_tables.data_ptr(), block_tables._version, tuple(block_tables.shape),
        seq_lens.data_ptr(), seq_lens._version, cu_seqlens_q.data_ptr(), cu_seqlens_q._version,
        rows, hq, hkv, d, page, nb, query.dtype, kv_layout, scale, softcap, window_left,
    )  # fmt: skip
    planned = _PLANS.get(key)
    if planned is None:
        qo = query_indptr(cu_seqlens_q, seq_lens, rows, block_tables.shape[1] * page)
        indptr, indices, last = csr(block_tables, seq_lens, page, nb)
        planned = _prefill_module().BatchPrefillWithPagedKVCacheWrapper(
            _flashinfer.workspace(query.device), kv_layout
        )
        dev = query.device
        _flashinfer.plan(
            planned,
            qo.to(dev), indptr.to(dev), indices.to(dev), last.to(dev), hq, hkv, d, page, causal=True,
            window_left=window_left, logits_soft_cap=softcap if softcap > 0 else None,
            q_data_type=query.dtype, kv_data_type=key_cache.dtype, sm_scale=scale,
        )  # fmt: skip
        _flashinfer.remember(_PLANS, key, planned)
    return planned


def paged_prefill(
    out: Tensor,
    lse: Tensor,
    has_lse: bool,
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    cu_seqlens_q: Tensor,
    sinks: Tensor,
    has_sinks: bool,
    k_scale: Tensor,
    v_scale: Tensor,
    fp8: bool,
    scale: float,
    softcap: float,
    window_left: int,
) -> None:
    """``attention.paged_prefill`` per its contract (the kernel arguments, already checked)."""
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
        capturing=_flashinfer.capturing(query),
    )
    if why is not None:  # forced onto a call it cannot run
        raise BackendUnavailable(BACKEND, why)
    if query.shape[0] == 0 or block_tables.shape[0] == 0:
        return
    assert kv_layout is not None
    wrapper = _plan(
        query, key_cache, block_tables, seq_lens, cu_seqlens_q, kv_layout, scale, softcap, window_left
    )
    wrapper.run(query, _flashinfer.caches(key_cache, value_cache, kv_layout), out=out)
