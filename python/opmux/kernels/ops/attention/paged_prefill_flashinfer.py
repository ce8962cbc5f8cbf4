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
rows, a sequence with more new tokens than positions, or a block outside the cache send that call
to the next backend (``CallRefused``: later calls still come here), so FlashInfer never reads out
of bounds; an empty sequence is planned as no pages and no rows.

Where it runs (``supports``, the predicate, says why not otherwise): CUDA bf16 / fp16, head dims
64 / 128 / 256 with the value's the key's (no MLA), NHD caches or HND views of dense HND ones, no
sinks, no lse (FlashInfer's is base 2), no fp8 cache, no custom mask, ``causal=False`` only without a
window (FlashInfer's plan takes the flag; its non-causal window is not checked against the op's),
not while a CUDA graph is captured. Declared
after Triton on CUDA; the H200's select tables (``benchmarks/bench_attention_prefill.py
--select-out``, shipped in ``configs/attention.paged_prefill/``) put it first for eager calls:
0.39-0.77x Triton's time from 2,048 new tokens (docs/benchmarks/attention_prefill_h200.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import CallRefused
from . import _flashinfer
from ._flashinfer import BACKEND, csr, layout
from ._prefill import host_offsets

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

__all__ = ["BACKEND", "paged_prefill", "query_indptr", "refusal", "supports"]

_PLANS: dict[Any, Any] = {}


def refusal(**facts: Any) -> str | None:
    """Why FlashInfer's prefill cannot run a call with these facts (None: it can). Pure."""
    return _flashinfer.refusal("prefill", **facts)


#: FlashInfer's custom masks are bit-packed per plan and replace its causal flag; opmux's flat
#: bool form is not wired to them: the next backend (Triton) takes custom masks
_CUSTOM_MASK = "a custom mask (the backend passes none to FlashInfer's plan)"
_NON_CAUSAL_WINDOW = (
    "causal=False with a window (FlashInfer's non-causal window is not checked against the op's)"
)


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
    custom_mask: Any = None,
    mask_indptr: Any = None,
    mask_prefix: Any = True,
    causal: Any = True,
    lse: Any = None,
    out: Any = None,
) -> str | None:
    """The backend's predicate (the op's public arguments)."""
    if custom_mask is not None:
        return _CUSTOM_MASK
    if causal is False and isinstance(window_left, int) and window_left >= 0:
        return _NON_CAUSAL_WINDOW
    return _flashinfer.predicate("prefill", query, key_cache, value_cache, sinks, lse)


def query_indptr(cu_seqlens_q: Tensor, seq_lens: Tensor, rows: int, capacity: int) -> Tensor:
    """``cu_seqlens_q`` as FlashInfer's ``qo_indptr`` (int32, host), checked as the contract
    checks it on the CPU (``_prefill.host_offsets``: CallRefused otherwise)."""
    return host_offsets(BACKEND, cu_seqlens_q, seq_lens, rows, capacity)[0].to(torch.int32)


def _prefill_module() -> Any:
    return _flashinfer.vendor("flashinfer.prefill")


def _plan(
    query: Tensor, key_cache: Tensor, block_tables: Tensor, seq_lens: Tensor, cu_seqlens_q: Tensor,
    kv_layout: str, scale: float, softcap: float, window_left: int, causal: bool = True,
) -> Any:  # fmt: skip
    """The planned wrapper of this batch (made on its first layer)."""
    rows, hq, d = query.shape
    nb, page, hkv = key_cache.shape[0], key_cache.shape[1], key_cache.shape[2]
    version = _flashinfer.version
    key = (
        query.device, block_tables.data_ptr(), version(block_tables), tuple(block_tables.shape),
        seq_lens.data_ptr(), version(seq_lens), cu_seqlens_q.data_ptr(), version(cu_seqlens_q),
        rows, hq, hkv, d, page, nb, query.dtype, kv_layout, scale, softcap, window_left, causal,
    )  # fmt: skip
    wrapper = _flashinfer.planned(_PLANS, key)
    if wrapper is None:
        qo = query_indptr(cu_seqlens_q, seq_lens, rows, block_tables.shape[1] * page)
        indptr, indices, last = csr(block_tables, seq_lens, page, nb, empty_ok=True)
        ws = _flashinfer.workspace(query.device)
        wrapper = _flashinfer.plan(
            _PLANS, query.device, kv_layout, None not in key, lambda: _prefill_module().BatchPrefillWithPagedKVCacheWrapper(ws, kv_layout),
            qo, indptr, indices, last, hq, hkv, d, page, causal=causal,  # host tensors: FlashInfer copies
            window_left=window_left, logits_soft_cap=softcap if softcap > 0 else None,
            q_data_type=query.dtype, kv_data_type=key_cache.dtype, sm_scale=scale,
        )  # fmt: skip
        _flashinfer.remember(
            _PLANS, key, wrapper, (block_tables, seq_lens, cu_seqlens_q), query.device, kv_layout
        )
    return wrapper


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
    custom_mask: Tensor,
    mask_indptr: Tensor,
    has_mask: bool,
    mask_prefix: bool,
    causal: bool,
) -> None:
    """``attention.paged_prefill`` per its contract (the kernel arguments, already checked)."""
    if has_mask:
        raise CallRefused(BACKEND, _CUSTOM_MASK)
    if not causal and window_left >= 0:
        raise CallRefused(BACKEND, _NON_CAUSAL_WINDOW)
    kv_layout = layout(key_cache)
    why = refusal(**_flashinfer.facts(query, key_cache, value_cache, has_sinks, has_lse))
    if why is not None:  # forced onto a call it cannot run (its facts, this call's)
        raise CallRefused(BACKEND, why)
    if query.shape[0] == 0 or block_tables.shape[0] == 0:
        return
    assert kv_layout is not None
    wrapper = _plan(
        query, key_cache, block_tables, seq_lens, cu_seqlens_q, kv_layout, scale, softcap, window_left, causal
    )
    wrapper.run(query, _flashinfer.caches(key_cache, value_cache, kv_layout), out=out)
