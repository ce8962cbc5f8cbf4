"""The ``cudnn`` backend of ``attention.paged_prefill``: cuDNN's fused attention (its SDPA graph,
the causal mask aligned to the end of each sequence's keys as the op aligns it) through the cuDNN
frontend's graph API, where ``nvidia-cudnn-frontend`` is installed (the ``cudnn`` capability).

cuDNN's paged graph is slower than its kernel over dense rows: on an H100 (session 43,
docs/benchmarks/attention_prefill_h200.md; not side by side with the dense graph over gathered
rows) the paged graph took 1.18-1.27x SDPA cuDNN's dense time on a plain prefill of 4k-32k tokens,
behind FlashInfer's paged kernel. So the backend gathers the positions a batch reads into dense
[total, Hkv, D] keys and values (one index copy of each per layer: 0.4-0.7% of the backend's time
at 32k tokens, timed eagerly; at 1k-4k tokens the eager figures, about 50 us, are host time) and
runs cuDNN's ragged graph over them. A batch with more than ``GATHER_PER_ROW`` cached positions per
new token (counting at least ``MIN_RUN`` tokens, so small batches may gather up to
``GATHER_PER_ROW * MIN_RUN`` positions) is declined: the copy would cost more than it saves.

A batch is planned once, on its first layer (as the ``flashinfer`` backend; keyed by the block
table's, the lengths' and ``cu_seqlens_q``'s storage and version counters, the shapes and the
knobs): one host read of the three checks what the contract checks on the CPU and the kernels
otherwise clamp (offsets that do not rise from 0 to the query's rows, more new tokens than
positions, a used block id outside the cache send the call to the next backend: ``CallRefused``,
so nothing is read out of bounds; lengths past the table's capacity are clamped, as the kernels
clamp them), and derives the device tensors the gather and cuDNN read (each position's block and
offset, per-sequence lengths, row offsets). Later layers run with no host work but the gather's
and the graph's launches; a declined batch is remembered under its key too, so its later layers
are declined without a host read. Inference tensors (``torch.inference_mode``) have no version
counter: their batches are planned, with a host read, on every call. Graphs are built per shape class (batch size, the longest query and key
runs rounded up to a power of two) and kept, so a serving engine's steps reuse a few; a build
cuDNN refuses is remembered and declined at once next time.

Where it runs (``supports``, the predicate, says why not otherwise): CUDA bf16 / fp16 with caches
of that dtype, head dims 64 / 128 with the value's the key's, NHD caches or HND views of dense
HND ones, a dense query, output and lse (cuDNN's statistics: the natural log of each row's
softmax denominator, the op's lse), no softcap, no window, no sinks, no custom mask, no fp8 cache,
not while a CUDA graph is captured (the plan reads the host). Declared after FlashInfer on CUDA;
select tables (``benchmarks/bench_attention_prefill.py --select-out``) put it first where it was
measured fastest.
"""

from __future__ import annotations

import atexit
import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import BackendUnavailable, CallRefused
from ._flashinfer import capturing, layout, version
from ._prefill import host_offsets

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

__all__ = ["BACKEND", "HEAD_DIMS", "paged_prefill", "refusal", "supports"]

BACKEND = "cudnn"
HEAD_DIMS = (64, 128)
#: the oldest cuDNN the backend asks for: ragged Q / K / V / statistics offsets with a padding
#: mask and bottom-right causal alignment (the GPU runs so far: 9.19)
MIN_CUDNN = 90500
#: batches planned and graphs built kept (a few engines' steps; a graph per shape class)
MAX_PLANS = 8
MAX_GRAPHS = 32
#: the shortest run a graph is built for (shorter batches share its graph)
MIN_RUN = 128
#: cached positions gathered per new token at most (past it a chunk over a long prefix: the copy
#: would cost more than cuDNN's kernel saves over the paged readers)
GATHER_PER_ROW = 8
#: cuDNN's ragged offsets are int32 element offsets
OFFSET_LIMIT = 2**31

_PLANS: dict[Any, _Plan] = {}
_GRAPHS: dict[Any, _Graph] = {}
_REFUSED: dict[Any, str] = {}
_DECLINED: dict[Any, str] = {}
_HANDLES: dict[Any, Any] = {}
_WORKSPACES: dict[Any, Any] = {}


@atexit.register
def release() -> None:
    """Drop the plans, graphs and handles (at exit, before the frontend's bindings go: graphs still
    alive then make nanobind report them as leaked)."""
    for kept in (_PLANS, _GRAPHS, _REFUSED, _DECLINED, _HANDLES, _WORKSPACES):
        kept.clear()


def refusal(
    *,
    device: str,
    dtype: str,
    cache_dtype: str,
    head_dim: int,
    value_dim: int,
    layouts: tuple[str | None, str | None],
    dense: bool,
    softcap: bool,
    window: bool,
    sinks: bool,
    lse: bool,
    mask: bool,
    capturing: bool,
) -> str | None:
    """Why cuDNN's paged prefill cannot run a call with these facts (None: it can). Pure."""
    if device != "cuda":
        return "cuDNN's attention runs on CUDA tensors"
    if dtype not in ("bfloat16", "float16") or cache_dtype != dtype:
        return f"cuDNN's paged attention here takes bf16 / fp16 queries and caches of that dtype ({dtype}, {cache_dtype})"
    if head_dim not in HEAD_DIMS:
        return f"head dim {head_dim}: the cudnn backend is wired for {HEAD_DIMS}"
    if value_dim != head_dim:
        return f"value head dim {value_dim} != key head dim {head_dim} (MLA): the Triton backend takes it"
    if layouts[0] is None or layouts[0] != layouts[1]:
        return "the cudnn backend takes NHD caches or HND views of dense HND ones, the same for K and V"
    if not dense:
        return "the cudnn backend takes a dense query, output and lse ([T, Hq, D] / [T, Hq], row-major)"
    for on, what in ((softcap, "softcap"), (window, "a sliding window"), (sinks, "attention sinks"),
                     (mask, "a custom mask")):  # fmt: skip
        if on:
            return f"{what}: not wired to cuDNN's graph; the next backend runs it"
    if capturing:
        return "the cudnn backend plans a batch on the host: not inside a CUDA-graph capture"
    return None


def facts(
    query: Any, key_cache: Any, value_cache: Any, out: Any, *, softcap: bool, window: bool, sinks: bool,
    lse: Any, mask: bool,
) -> dict[str, Any]:  # fmt: skip
    """The facts ``refusal`` weighs, read from a call's tensors (``lse``: the tensor, or None)."""
    return dict(
        device=query.device.type,
        dtype=str(query.dtype).removeprefix("torch."),
        cache_dtype=str(key_cache.dtype).removeprefix("torch."),
        head_dim=int(query.shape[-1]),
        value_dim=int(value_cache.shape[-1]),
        layouts=(layout(key_cache), layout(value_cache)),
        dense=all(t is None or t.is_contiguous() for t in (query, out, lse)),
        softcap=softcap,
        window=window,
        sinks=sinks,
        lse=lse is not None,
        mask=mask,
        capturing=capturing(query),
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
    """The backend's predicate (the op's public arguments); None where they are not tensors of
    the expected ranks (the contract names that problem)."""
    try:
        return refusal(
            **facts(
                query, key_cache, value_cache, out, softcap=bool(softcap and softcap > 0),
                window=bool(isinstance(window_left, int) and window_left >= 0), sinks=sinks is not None,
                lse=lse, mask=custom_mask is not None,
            )
        )  # fmt: skip
    except Exception:
        return None


@functools.cache
def _cudnn() -> Any:
    """The cuDNN frontend, imported on first use (after torch, whose libcudnn it then shares)."""
    try:
        module = importlib.import_module("cudnn")  # vendor library, present only where installed
        found = int(module.backend_version())
    except Exception as exc:  # not installed, or a build that cannot load libcudnn here
        raise BackendUnavailable(BACKEND, f"the cuDNN frontend cannot be loaded: {exc}") from exc
    if found < MIN_CUDNN:
        raise BackendUnavailable(BACKEND, f"cuDNN {found} is older than {MIN_CUDNN} (ragged SDPA)")
    return module


def _handle(device: Any) -> Any:
    """The device's cuDNN handle, on the current stream."""
    cudnn = _cudnn()
    handle = _HANDLES.get(device)
    if handle is None:
        with torch.cuda.device(device):
            handle = _HANDLES[device] = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream(device).cuda_stream)
    return handle


def _workspace(device: Any, nbytes: int) -> Tensor:
    """A device workspace of at least ``nbytes`` (one per device, grown to the largest graph's)."""
    ws = _WORKSPACES.get(device)
    if ws is None or ws.numel() < nbytes:
        ws = _WORKSPACES[device] = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)
    return ws


def run_length(n: int, cap: int | None = None) -> int:
    """The run a graph is built for: ``n`` rounded up to a power of two, at least MIN_RUN, at most
    ``cap``. Pure."""
    r = max(MIN_RUN, 1 << max(0, n - 1).bit_length())
    return r if cap is None else max(1, min(r, cap))


@dataclass(frozen=True)
class _Graph:
    """A built graph and its tensors' handles (what ``execute``'s variant pack maps)."""

    graph: Any
    q: Any
    k: Any
    v: Any
    q_lens: Any
    kv_lens: Any
    q_rows: Any
    k_rows: Any
    v_rows: Any
    o_rows: Any
    o: Any
    stats: Any
    stats_rows: Any
    workspace: int


def _build(
    device: Any, dtype: Any, hq: int, hkv: int, d: int, batch: int, s_q: int, s_kv: int, scale: float,
    causal: bool, lse: bool,
) -> _Graph:  # fmt: skip
    """cuDNN's SDPA over ragged rows: the query / output [T, Hq, D], the gathered keys and values
    [total, Hkv, D] and the statistics (``lse``, [T, Hq]) of sequence ``b`` at its offsets, lengths
    from tensors."""
    cudnn = _cudnn()
    dt = cudnn.data_type
    io = dt.BFLOAT16 if dtype == torch.bfloat16 else dt.HALF
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=dt.FLOAT, compute_data_type=dt.FLOAT,
                      handle=_handle(device))  # fmt: skip
    rows = dict(dim=(batch, hq, s_q, d), stride=(s_q * hq * d, d, hq * d, 1))
    keys = dict(dim=(batch, hkv, s_kv, d), stride=(s_kv * hkv * d, d, hkv * d, 1), data_type=io)
    one = dict(dim=(batch, 1, 1, 1), stride=(1, 1, 1, 1), data_type=dt.INT32)
    offsets = dict(dim=(batch + 1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=dt.INT32)
    q = g.tensor(name="q", data_type=io, **rows)
    k, v = g.tensor(name="k", **keys), g.tensor(name="v", **keys)
    q_rows, k_rows, v_rows = (g.tensor(name=n, **offsets) for n in ("q_rows", "k_rows", "v_rows"))
    q.set_ragged_offset(q_rows)
    k.set_ragged_offset(k_rows)
    v.set_ragged_offset(v_rows)
    q_lens, kv_lens = g.tensor(name="q_lens", **one), g.tensor(name="kv_lens", **one)
    o, stats = g.sdpa(
        name="sdpa", q=q, k=k, v=v, generate_stats=lse, attn_scale=scale, use_padding_mask=True,
        seq_len_q=q_lens, seq_len_kv=kv_lens, use_causal_mask_bottom_right=causal,
    )  # fmt: skip
    o_rows = g.tensor(name="o_rows", **offsets)
    o.set_ragged_offset(o_rows)
    o.set_output(True).set_dim(rows["dim"]).set_stride(rows["stride"]).set_data_type(io)
    stats_rows = None
    if lse:  # [T, Hq] float32: token stride Hq, head stride 1
        stats_rows = g.tensor(name="stats_rows", **offsets)
        stats.set_ragged_offset(stats_rows)
        stats.set_output(True).set_dim((batch, hq, s_q, 1)).set_stride((s_q * hq, 1, hq, 1))
        stats.set_data_type(dt.FLOAT)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return _Graph(
        g, q, k, v, q_lens, kv_lens, q_rows, k_rows, v_rows, o_rows, o, stats if lse else None, stats_rows,
        int(g.get_workspace_size()),
    )  # fmt: skip


def _graph(key: Any, build: Callable[[], _Graph]) -> _Graph:
    """The graph built under ``key`` (``build()`` on first use; a refusal of cuDNN's remembered:
    CallRefused with its words, at once on later calls of the class; a failure to load cuDNN is
    BackendUnavailable, a CUDA error or out of memory propagates)."""
    found = _GRAPHS.get(key)
    if found is not None:
        return found
    if key in _REFUSED:
        raise CallRefused(BACKEND, _REFUSED[key])
    try:
        found = build()
    except (BackendUnavailable, torch.cuda.OutOfMemoryError):
        raise
    except Exception as exc:
        text = f"{type(exc).__name__}: {exc}"
        if "CUDA error" in text:
            raise
        _REFUSED[key] = f"cuDNN built no graph for this shape class: {text[:400]}"
        raise CallRefused(BACKEND, _REFUSED[key]) from exc
    while len(_GRAPHS) >= MAX_GRAPHS:
        _GRAPHS.pop(next(iter(_GRAPHS)))
    _GRAPHS[key] = found
    return found


@dataclass(frozen=True)
class _Plan:
    """One batch: its graph, the cache entries to gather (block and offset of every position of
    every sequence, in order), the device tensors cuDNN reads, and the index tensors the key names
    (held: no new tensor takes their addresses while the plan lives)."""

    graph: _Graph
    blocks: Tensor
    offsets: Tensor
    slots: Tensor
    q_lens: Tensor
    kv_lens: Tensor
    rows: Tensor
    kv_rows: Tensor
    stats_rows: Tensor
    pinned: tuple[Any, ...]


@dataclass(frozen=True)
class Batch:
    """A batch's index data, read on the host and checked (``check_batch``)."""

    lens: Tensor  #: int64, clamped to the table's capacity
    longest_q: int
    longest_kv: int
    blocks: Tensor  #: int64 [sum(lens)]: each position's block, sequence by sequence
    offsets: Tensor  #: int64 [sum(lens)]: its offset in the block


def check_batch(
    cu: Tensor, lens: Tensor, table: Tensor, rows: int, page: int, num_blocks: int, max_positions: int
) -> Batch:
    """Host copies of ``cu_seqlens_q``, ``seq_lens`` and the block table, checked as the contract
    checks CPU tensors, and the cache entries each sequence reads. Lengths are clamped to the
    table's capacity (as the kernels clamp them); offsets that do not rise from 0 to ``rows``, more
    new tokens than a sequence's clamped length, more than ``max_positions`` positions in all
    (checked before any per-position array is made), a used block id outside
    ``[0, num_blocks)``: CallRefused (the call goes to the next backend)."""
    cu64, lens64 = host_offsets(BACKEND, cu, lens, rows, table.shape[1] * page)
    new = cu64[1:] - cu64[:-1]
    total = int(lens64.sum())
    if total > max_positions:
        raise CallRefused(
            BACKEND, f"{total} cached positions for {rows} new tokens: the gather would copy more than "
            f"{GATHER_PER_ROW} positions a row (FlashInfer's or Triton's paged reads take it)",
        )  # fmt: skip
    seq = torch.repeat_interleave(torch.arange(len(lens64)), lens64)
    starts = torch.cumsum(lens64, 0) - lens64
    pos = torch.arange(total) - starts[seq]
    blocks = table.to("cpu", torch.int64)[seq, pos // page]
    if blocks.numel() and bool(((blocks < 0) | (blocks >= num_blocks)).any()):
        raise CallRefused(BACKEND, f"a block table names a block outside [0, {num_blocks})")
    longest_q = int(new.max()) if len(new) else 0
    return Batch(lens64, longest_q, int(lens64.max()) if len(lens64) else 0, blocks, pos % page)


def _plan(
    query: Tensor, key_cache: Tensor, block_tables: Tensor, seq_lens: Tensor, cu_seqlens_q: Tensor,
    scale: float, causal: bool, lse: bool,
) -> _Plan:  # fmt: skip
    """The plan of this batch (made on its first layer)."""
    rows, hq, d = query.shape
    nb, page, hkv, _ = key_cache.shape
    key = (
        query.device, block_tables.data_ptr(), version(block_tables), tuple(block_tables.shape),
        tuple(block_tables.stride()), seq_lens.data_ptr(), version(seq_lens), cu_seqlens_q.data_ptr(),
        version(cu_seqlens_q), rows, hq, hkv, d, query.dtype, nb, page, scale, causal, lse,
    )  # fmt: skip
    found = _PLANS.get(key)
    if found is not None:
        return found
    if key in _DECLINED:  # a later layer of a declined batch: no host read again
        raise CallRefused(BACKEND, _DECLINED[key])
    try:
        plan = _make_plan(query, key_cache, block_tables, seq_lens, cu_seqlens_q, scale, causal, lse)
    except CallRefused as exc:
        if None not in key:
            while len(_DECLINED) >= MAX_PLANS:
                _DECLINED.pop(next(iter(_DECLINED)))
            _DECLINED[key] = exc.detail
        raise
    if None not in key:  # inference tensors (no version counter): planned on every call
        while len(_PLANS) >= MAX_PLANS:
            _PLANS.pop(next(iter(_PLANS)))
        _PLANS[key] = plan
    return plan


def _make_plan(
    query: Tensor, key_cache: Tensor, block_tables: Tensor, seq_lens: Tensor, cu_seqlens_q: Tensor,
    scale: float, causal: bool, lse: bool,
) -> _Plan:  # fmt: skip
    """Read, check and plan a batch (``_plan``'s miss)."""
    rows, hq, d = query.shape
    nb, page, hkv, _ = key_cache.shape
    limit = GATHER_PER_ROW * max(rows, MIN_RUN)
    batch = check_batch(cu_seqlens_q, seq_lens, block_tables, rows, page, nb, limit)
    total = int(batch.lens.sum())
    if max(rows * hq, total * hkv) * d >= OFFSET_LIMIT:
        raise CallRefused(BACKEND, f"{rows} rows, {total} positions: offsets past int32")
    n = len(batch.lens)
    s_q, s_kv = run_length(batch.longest_q), run_length(batch.longest_kv)
    gkey = (query.device, query.dtype, hq, hkv, d, n, s_q, s_kv, scale, causal, lse)
    graph = _graph(
        gkey, lambda: _build(query.device, query.dtype, hq, hkv, d, n, s_q, s_kv, scale, causal, lse)
    )
    dev = query.device
    cu = cu_seqlens_q.to(torch.int32)
    kv_cu = torch.zeros(n + 1, dtype=torch.int64)
    kv_cu[1:] = torch.cumsum(batch.lens, 0)
    return _Plan(
        graph=graph,
        blocks=batch.blocks.to(dev),
        offsets=batch.offsets.to(dev),
        slots=(batch.blocks * page + batch.offsets).to(dev),
        q_lens=(cu[1:] - cu[:-1]).reshape(n, 1, 1, 1).contiguous(),
        kv_lens=batch.lens.to(dev, torch.int32).reshape(n, 1, 1, 1),
        rows=(cu * (hq * d)).reshape(n + 1, 1, 1, 1).contiguous(),
        kv_rows=(kv_cu * (hkv * d)).to(dev, torch.int32).reshape(n + 1, 1, 1, 1),
        stats_rows=(cu * hq).reshape(n + 1, 1, 1, 1).contiguous(),
        pinned=(block_tables, seq_lens, cu_seqlens_q),
    )


def gather(cache: Tensor, plan: _Plan) -> Tensor:
    """The positions the batch reads, sequence by sequence: [total, Hkv, D], dense (an NHD cache
    as rows of its flat [num_blocks * page, Hkv, D] view, any other by block and offset)."""
    if cache.is_contiguous():
        return cache.flatten(0, 1).index_select(0, plan.slots)
    return cache[plan.blocks, plan.offsets]


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
    why = refusal(
        **facts(
            query, key_cache, value_cache, out, softcap=softcap > 0, window=window_left >= 0,
            sinks=has_sinks, lse=lse if has_lse else None, mask=has_mask,
        )
    )  # fmt: skip
    if why is not None:  # forced onto a call it cannot run
        raise CallRefused(BACKEND, why)
    if query.shape[0] == 0 or block_tables.shape[0] == 0:
        return
    plan = _plan(query, key_cache, block_tables, seq_lens, cu_seqlens_q, scale, causal, has_lse)
    g = plan.graph
    pack = {
        g.q: query, g.k: gather(key_cache, plan), g.v: gather(value_cache, plan), g.q_lens: plan.q_lens,
        g.kv_lens: plan.kv_lens, g.q_rows: plan.rows, g.k_rows: plan.kv_rows, g.v_rows: plan.kv_rows,
        g.o_rows: plan.rows, g.o: out,
    }  # fmt: skip
    if has_lse:
        pack[g.stats], pack[g.stats_rows] = lse, plan.stats_rows
    handle = _handle(query.device)
    g.graph.execute(pack, _workspace(query.device, g.workspace), handle=handle)
