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
block outside the cache, or a sequence of length 0, is ``CallRefused`` (that call falls back to a
backend that skips such blocks; later calls still come here) rather than letting FlashInfer read
out of bounds. The plan cache's rules (pinned index tensors, inference tensors) are
``_flashinfer``'s.

Where it runs (``supports``, the predicate, says why not otherwise): CUDA bf16 / fp16, head dims
64 / 128 / 256 (the value's the key's: no MLA), a cache that is an NHD tensor or the HND view of a contiguous HND one (FlashInfer's
two layouts), no sinks, no lse (FlashInfer's is base 2), no fp8 cache (its scales are host floats),
not while a CUDA graph is captured. Declared last but torch on CUDA: on the H200 Triton took
0.43-0.87x its time in every case of ``benchmarks/bench_attention_decode.py`` (a select table
would move it first where it wins).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import CallRefused
from . import _flashinfer
from ._flashinfer import BACKEND, HEAD_DIMS, csr, layout

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["BACKEND", "HEAD_DIMS", "csr", "layout", "paged_decode", "refusal", "supports"]


def refusal(**facts: Any) -> str | None:
    """Why FlashInfer's decode cannot run a call with these facts (None: it can). Pure."""
    return _flashinfer.refusal("decode", **facts)


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
    return _flashinfer.predicate("decode", query, key_cache, value_cache, sinks, lse)


def _decode_module() -> Any:
    return _flashinfer.vendor("flashinfer.decode")


_PLANS: dict[Any, Any] = {}


def _plan(
    query: Tensor, key_cache: Tensor, block_tables: Tensor, seq_lens: Tensor, kv_layout: str,
    scale: float, softcap: float, window_left: int,
) -> Any:  # fmt: skip
    """The planned wrapper of this batch (made on its first layer)."""
    bsz, hq, d = query.shape
    nb, page, hkv = key_cache.shape[0], key_cache.shape[1], key_cache.shape[2]
    version = _flashinfer.version
    key = (
        query.device, block_tables.data_ptr(), version(block_tables), tuple(block_tables.shape),
        seq_lens.data_ptr(), version(seq_lens), bsz, hq, hkv, d, page, nb, query.dtype, kv_layout,
        scale, softcap, window_left,
    )  # fmt: skip
    wrapper = _flashinfer.planned(_PLANS, key)
    if wrapper is None:
        indptr, indices, last = csr(block_tables, seq_lens, page, nb)
        ws = _flashinfer.workspace(query.device)
        wrapper = _flashinfer.plan(
            _PLANS, query.device, kv_layout, None not in key, lambda: _decode_module().BatchDecodeWithPagedKVCacheWrapper(ws, kv_layout),
            indptr, indices, last, hq, hkv, d, page,  # host tensors: FlashInfer copies them over
            window_left=window_left, logits_soft_cap=softcap if softcap > 0 else None,
            q_data_type=query.dtype, kv_data_type=key_cache.dtype, sm_scale=scale,
        )  # fmt: skip
        _flashinfer.remember(_PLANS, key, wrapper, (block_tables, seq_lens), query.device, kv_layout)
    return wrapper


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
    why = refusal(**_flashinfer.facts(query, key_cache, value_cache, has_sinks, has_lse))
    if why is not None:  # forced onto a call it cannot run (its facts, this call's)
        raise CallRefused(BACKEND, why)
    if query.shape[0] == 0:
        return
    assert kv_layout is not None
    wrapper = _plan(query, key_cache, block_tables, seq_lens, kv_layout, scale, softcap, window_left)
    wrapper.run(query, _flashinfer.caches(key_cache, value_cache, kv_layout), out=out)
