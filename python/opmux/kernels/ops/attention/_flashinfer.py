"""What the two ``flashinfer`` backends of the attention group share (``paged_decode_flashinfer``,
``paged_prefill_flashinfer``): the cache layouts FlashInfer takes, the reasons a call cannot run
there, the block table as FlashInfer's CSR page table, the per-device workspace and the plan cache.

FlashInfer plans a batch once on the host (CSR page table read there) and runs each layer on
that plan; opmux's ops take vLLM's block table and lengths per call. Each backend keeps one plan
per batch, keyed by the index tensors' storage and version counters (an in-place update, as an
engine's next step makes, plans again), by the shapes and by the knobs; the cache entry holds the
index tensors themselves, so no new tensor can take a cached one's address while its plan lives
(a fresh tensor at a freed tensor's address would otherwise find a stale plan). Inference
tensors have no version counter: their batches are planned on every call. What the planner
refuses of a call's data (a block outside the cache, offsets past the query) is ``CallRefused``:
that call runs on the next backend, later calls still come here. Use is single-threaded per
device (one stream), as FlashInfer's shared float workspace already assumes: a recycled wrapper
is planned again while nothing else runs on it.
"""

from __future__ import annotations

import functools
import importlib
import subprocess
from typing import TYPE_CHECKING, Any

from ...errors import BackendUnavailable, CallRefused

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

BACKEND = "flashinfer"
HEAD_DIMS = (64, 128, 256)
#: FlashInfer's float workspace per device (its examples' 128 MB)
WORKSPACE_BYTES = 128 << 20
#: plans kept per backend (one per live batch: a few engines' steps)
MAX_PLANS = 8

_WORKSPACES: dict[Any, Any] = {}
#: per plan cache, device and layout: the wrapper uncacheable batches (inference tensors) plan on
_SCRATCH: dict[Any, Any] = {}


def layout(cache: Any) -> str | None:
    """``"NHD"`` for a dense [nb, page, Hkv, D] cache, ``"HND"`` for the [nb, page, Hkv, D] view of a
    dense [nb, Hkv, page, D] one, else None."""
    if cache.is_contiguous():
        return "NHD"
    if cache.transpose(1, 2).is_contiguous():
        return "HND"
    return None


def refusal(
    what: str,
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
    """Why FlashInfer's ``what`` (decode, prefill) cannot run a call with these facts (None: it
    can). Pure."""
    if device != "cuda":
        return f"FlashInfer's {what} runs on CUDA tensors"
    if dtype not in ("bfloat16", "float16") or cache_dtype != dtype:
        return f"FlashInfer's {what} here takes bf16 / fp16 queries and caches of that dtype ({dtype}, {cache_dtype})"
    if head_dim not in HEAD_DIMS:
        return f"head dim {head_dim}: FlashInfer's {what} is built for {HEAD_DIMS}"
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


def facts(query: Any, key_cache: Any, value_cache: Any, sinks: bool, lse: bool) -> dict[str, Any]:
    """The facts ``refusal`` weighs, read from a call's tensors."""
    return dict(
        device=query.device.type,
        dtype=str(query.dtype).removeprefix("torch."),
        cache_dtype=str(key_cache.dtype).removeprefix("torch."),
        head_dim=int(query.shape[-1]),
        layouts=(layout(key_cache), layout(value_cache)),
        sinks=sinks,
        value_dim=int(value_cache.shape[-1]),
        lse=lse,
        capturing=capturing(query),
    )


def predicate(what: str, query: Any, key_cache: Any, value_cache: Any, sinks: Any, lse: Any) -> str | None:
    """A backend's predicate from the op's public arguments: ``refusal`` of them, or None where
    they are not tensors of the expected ranks (the contract names that problem)."""
    try:
        return refusal(what, **facts(query, key_cache, value_cache, sinks is not None, lse is not None))
    except Exception:
        return None


@functools.cache
def vendor(module: str) -> Any:
    """FlashInfer's ``module`` (``flashinfer.decode``, ``flashinfer.prefill``), imported on first use."""
    try:
        return importlib.import_module(module)  # vendor library, present only where installed
    except Exception as exc:  # not installed, or a build that fails to import here
        raise BackendUnavailable(BACKEND, f"{module} cannot be imported: {exc}") from exc


def capturing(query: Any) -> bool:
    """Whether ``query``'s stream is being captured into a CUDA graph."""
    return bool(query.device.type == "cuda" and torch.cuda.is_current_stream_capturing())


def csr(
    block_tables: Tensor, seq_lens: Tensor, page: int, num_blocks: int, empty_ok: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    """(indptr, indices, last_page_len) int32 on the host: each sequence's first
    ``ceil(len / page)`` blocks, its last page holding 1 to ``page`` entries. Lengths are clamped
    to the table's capacity (as the op's kernels do); a used block id outside the cache, or a
    sequence of length 0 unless ``empty_ok`` (prefill: no pages, no query rows, nothing to do),
    is CallRefused (the call goes to the next backend)."""
    table = block_tables.to("cpu", torch.int64)
    lens = seq_lens.to("cpu", torch.int64).clamp(0, table.shape[1] * page)
    pages = (lens + page - 1) // page
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int64)
    indptr[1:] = pages.cumsum(0)
    if not empty_ok and bool((lens == 0).any()):  # FlashInfer decode's last pages hold 1 to page_size
        raise CallRefused(BACKEND, "a sequence of length 0 (FlashInfer plans none)")
    cols = torch.arange(table.shape[1])
    indices = table[cols[None, :] < pages[:, None]]
    if indices.numel() and bool(((indices < 0) | (indices >= num_blocks)).any()):
        raise CallRefused(BACKEND, f"a block table names a block outside [0, {num_blocks})")
    last = torch.where(pages > 0, lens - (pages - 1) * page, 0)
    return indptr.to(torch.int32), indices.to(torch.int32), last.to(torch.int32)


def workspace(device: Any) -> Any:
    """The device's FlashInfer float workspace (one, shared by the wrappers of both backends)."""
    ws = _WORKSPACES.get(device)
    if ws is None:
        ws = _WORKSPACES[device] = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return ws


def caches(key_cache: Tensor, value_cache: Tensor, kv_layout: str) -> tuple[Tensor, Tensor]:
    """The caches as FlashInfer's run takes them (HND: its [nb, Hkv, page, D] tensors)."""
    if kv_layout == "HND":
        return key_cache.transpose(1, 2), value_cache.transpose(1, 2)
    return key_cache, value_cache


def version(t: Any) -> int | None:
    """``t``'s version counter (bumped by in-place writes), None for an inference tensor."""
    try:
        return int(t._version)
    except RuntimeError:  # "Inference tensors do not track version counter"
        return None


def plan(
    plans: dict[Any, Any], device: Any, kv_layout: str, cacheable: bool, make: Any, *args: Any, **kw: Any
) -> Any:
    """A wrapper planned with ``*args, **kw``: for a cacheable batch ``wrapper_for``'s (a recycled
    one, or ``make()``), else this cache's scratch wrapper for the device and layout (inference
    tensors: planned every call, never evicting a cached batch). Importing FlashInfer or making
    the wrapper happens outside the guard: its BackendUnavailable, out of memory, propagate.
    Planning that fails declines this call (CallRefused with FlashInfer's words: a shape its
    kernels lack, a JIT module missing where JIT is off: both fail at once next time), unless
    it is a failed build or a broken install (BackendUnavailable: the backend is off, so no
    engine step waits for the same failing build again) or a CUDA error (propagates)."""
    if cacheable:
        wrapper = wrapper_for(plans, device, kv_layout, make)
    else:
        slot = (id(plans), device, kv_layout)
        wrapper = _SCRATCH.get(slot)
        if wrapper is None:
            wrapper = _SCRATCH[slot] = make()
    try:
        wrapper.plan(*args, **kw)
    except (BackendUnavailable, torch.cuda.OutOfMemoryError):
        raise
    except Exception as exc:
        text = str(exc)
        if "CUDA error" in text:
            raise
        detail = f"FlashInfer could not plan the batch: {type(exc).__name__}: {text}"
        if (
            isinstance(exc, (ImportError, OSError, subprocess.CalledProcessError))
            or "build failed" in text.lower()
        ):
            raise BackendUnavailable(BACKEND, detail) from exc
        raise CallRefused(BACKEND, detail) from exc
    return wrapper


def planned(plans: dict[Any, Any], key: Any) -> Any:
    """The wrapper planned under ``key``, or None."""
    entry = plans.get(key)
    return None if entry is None else entry[0]


def wrapper_for(plans: dict[Any, Any], device: Any, kv_layout: str, make: Any) -> Any:
    """A wrapper to plan a new batch on: once MAX_PLANS batches are kept, the oldest one's (its
    plan dropped; FlashInfer plans a wrapper again and again) when it has this device and layout,
    else ``make()``. A wrapper holds device and pinned host buffers (8 MiB each in 0.7): making one
    per engine step would allocate them every step."""
    if len(plans) >= MAX_PLANS:
        oldest = next(iter(plans))
        wrapper, _, where = plans.pop(oldest)
        if where == (device, kv_layout):
            return wrapper
    return make()


def remember(
    plans: dict[Any, Any], key: Any, wrapper: Any, index_tensors: tuple[Any, ...], device: Any, kv_layout: str
) -> Any:
    """Keep ``wrapper`` under ``key`` with the index tensors the key names (they pin the
    addresses in the key), dropping the oldest batch past MAX_PLANS. A key holding a None version
    (inference tensors) is not kept: such a batch plans on every call."""
    if None in key:
        return wrapper
    while len(plans) >= MAX_PLANS:
        plans.pop(next(iter(plans)))
    plans[key] = (wrapper, index_tensors, (device, kv_layout))
    return wrapper
