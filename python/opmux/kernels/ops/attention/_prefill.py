"""``attention.paged_prefill``: its contract as data, its values hook, its definition and its
torch backend (the op's description is ``op.py``'s docstring). Shares paged_decode's cache
conventions (``_decode``): the same cache forms, scale, softcap, window, sinks and fp8 scales.

Kernel arguments: ``(out, lse, has_lse, query, key_cache, value_cache, block_tables, seq_lens,
cu_seqlens_q, sinks, has_sinks, k_scale, v_scale, fp8, scale, softcap, window_left, custom_mask,
mask_indptr, has_mask, mask_prefix, causal)``: ``scale`` resolved (0.0 -> ``1 / sqrt(D)``), an absent
``lse`` / ``sinks`` an empty float32 tensor, in the plain form ``seq_lens`` in the places of the
scales (unread), as paged_decode does, and without a custom mask empty bool / int32 tensors in the
places of ``custom_mask`` / ``mask_indptr`` (unread).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import CallRefused
from .. import _checks
from .._contract import FLOATS, Arg, Contract, Forms, Rule, Scalar, When
from ._decode import _I32, _POSITIONS, _rows, attend_rows, cache_items, cache_scales, knob_items

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

OP = "attention.paged_prefill"


def _items(fp8: bool) -> tuple[Any, ...]:
    scales = cache_scales(fp8)
    return (
        Arg(
            "query",
            "T, Hq, D",
            dtypes=FLOATS,
            layout="dense_last",
            expect="[total_q_tokens, num_heads, head_dim]",
            layout_hint="has strides {{t}.stride()}; its head_dim must be dense (stride 1)",
        ),
        Rule(
            "Hq >= 1 and D >= 1",
            "query has shape {tuple(query.shape)}: num_heads and head_dim must be at least 1",
        ),
        *cache_items(fp8, value_dim="Dv"),
        Arg(
            "block_tables",
            "B, MB",
            dtypes=("int32",),
            device_of="query",
            layout="strided",
            expect="[num_seqs, max_blocks_per_seq]",
        ),
        Arg(
            "seq_lens",
            "B",
            dtypes=("int32",),
            device_of="query",
            layout="dense_last",
            note=" (one total KV length per sequence: cached prefix + new tokens)",
            layout_hint="has stride {{t}.stride(0)}; pass {t}.contiguous()",
        ),
        Arg(
            "cu_seqlens_q",
            "B + 1",
            dtypes=("int32",),
            device_of="query",
            layout="dense_last",
            expect="[{B + 1}] (num_seqs + 1 offsets into query's rows: 0, q_len_0, q_len_0 + q_len_1, ...)",
            layout_hint="has stride {{t}.stride(0)}; pass {t}.contiguous()",
        ),
        *knob_items(),
        *scales,
        Rule(
            f"MB * PS <= {_POSITIONS} and T * Hq <= {_I32} and T + B <= {_I32}",
            "block_tables [{B}, {MB}] of {PS}-token pages, query {T} x {Hq}: sizes exceed the kernel's "
            f"32-bit positions (at most {_POSITIONS} table positions)",
            device="cuda",
        ),
        *_mask_items(),
        Arg("lse", "T, Hq", dtypes=("float32",), device_of="query", layout="strided", expect="[{T}, {Hq}]"),
        Arg(
            "out",
            "T, Hq, Dv",
            like="query",
            layout="dense_last",
            expect="[{T}, {Hq}, {Dv}] (value_cache's head dim {Dv})",
            out=True,
        ),
    )


def _mask_items() -> tuple[Any, ...]:
    """The custom mask (speculative decoding's tree masks; FlashInfer's ``custom_mask``, SGLang's
    ``custom_mask`` / ``mask_indptr``): one flat bool vector holding each sequence's
    ``[q_len, seq_len]`` matrix row-major from its ``mask_indptr`` offset."""
    return (
        Rule(
            "(custom_mask is None) == (mask_indptr is None)",
            "custom_mask and mask_indptr come together (the flat bool mask and its {B + 1} offsets: sequence "
            "b's [q_len, seq_len] matrix starts at mask_indptr[b])",
        ),
        Arg(
            "custom_mask",
            "NM",
            dtypes=("bool",),
            device_of="query",
            layout="dense_last",
            expect="[sum over sequences of q_len * seq_len] (flat, row-major per sequence)",
            layout_hint="has stride {{t}.stride(0)}; pass {t}.contiguous()",
        ),
        Arg(
            "mask_indptr",
            "B + 1",
            dtypes=("int32", "int64"),
            device_of="query",
            layout="dense_last",
            expect="[{B + 1}] (offsets into custom_mask: sequence b's matrix starts at mask_indptr[b])",
            layout_hint="has stride {{t}.stride(0)}; pass {t}.contiguous()",
        ),
        Scalar("mask_prefix", "bool"),
        Scalar("causal", "bool"),
    )


_ARGS: tuple[str, ...] = (
    "out",
    "lse",
    "lse is not None",
    "query",
    "key_cache",
    "value_cache",
    "block_tables",
)
_ARGS += ("seq_lens", "cu_seqlens_q", "sinks", "sinks is not None")
_TAIL: tuple[str, ...] = ("scale if scale > 0 else D ** -0.5", "softcap", "window_left")
_TAIL += ("custom_mask", "mask_indptr", "custom_mask is not None", "mask_prefix", "causal")
PAGED_PREFILL = Forms(
    "paged_prefill",
    cases=(
        (
            (When("key_cache", dtype="float8_e4m3fn"),),
            Contract("prefill_fp8", _items(True), (*_ARGS, "k_scale", "v_scale", "True", *_TAIL), "out"),
        ),
    ),
    default=Contract("prefill", _items(False), (*_ARGS, "seq_lens", "seq_lens", "False", *_TAIL), "out"),
)


def values(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    cu_seqlens_q: Tensor,
    scale: float = 0.0,
    softcap: float = 0.0,
    window_left: int = -1,
    sinks: Tensor | None = None,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
    custom_mask: Tensor | None = None,
    mask_indptr: Tensor | None = None,
    *_: Any,
) -> None:
    """CPU tensors (free there): ``cu_seqlens_q`` from 0 to query's rows, non-decreasing; every
    length within the table's capacity and at least its sequence's new tokens; each sequence's
    custom mask ``q_len * seq_len`` entries inside ``custom_mask``; every block id a sequence uses
    a block of the cache. On CUDA the kernels clamp instead (no sync)."""
    if not (seq_lens.is_cpu and block_tables.is_cpu and cu_seqlens_q.is_cpu):
        return
    nb, ps = key_cache.shape[0], key_cache.shape[1]
    width = block_tables.shape[1]
    cap = width * ps
    cu = cu_seqlens_q.tolist()
    rows = query.shape[0]
    if cu[0] != 0:
        raise ValueError(
            f"{OP}: cu_seqlens_q[0] = {cu[0]}: the offsets into query's rows start at 0 "
            "(cu_seqlens_q = [0, q_len_0, q_len_0 + q_len_1, ...])"
        )
    for b in range(len(cu) - 1):
        if cu[b + 1] < cu[b]:
            raise ValueError(
                f"{OP}: cu_seqlens_q[{b + 1}] = {cu[b + 1]} < cu_seqlens_q[{b}] = {cu[b]}: the offsets must be "
                f"non-decreasing (sequence {b}'s q_len would be {cu[b + 1] - cu[b]})"
            )
    if cu[-1] != rows:
        raise ValueError(
            f"{OP}: cu_seqlens_q[{len(cu) - 1}] = {cu[-1]} but query has {rows} rows: the last offset is the "
            "total number of new tokens"
        )
    if not _checks.in_range(seq_lens, 0, cap + 1):
        b = int(((seq_lens < 0) | (seq_lens > cap)).nonzero()[0, 0])
        raise ValueError(
            f"{OP}: seq_lens[{b}] = {int(seq_lens[b])} is out of range [0, {cap}] (block_tables has {width} "
            f"entries per sequence of {ps}-token pages)"
        )
    for b, n in enumerate(seq_lens.tolist()):
        if cu[b + 1] - cu[b] > n:
            raise ValueError(
                f"{OP}: sequence {b} has {cu[b + 1] - cu[b]} new tokens (cu_seqlens_q[{b + 1}] - "
                f"cu_seqlens_q[{b}]) but seq_lens[{b}] = {n}: seq_lens counts the cached prefix plus the new "
                "tokens, so it is at least q_len"
            )
    if custom_mask is not None and mask_indptr is not None:
        _mask_values(custom_mask.shape[0], mask_indptr.tolist(), cu, seq_lens.tolist())
    if not block_tables.numel() or _checks.in_range(block_tables, 0, nb):
        return
    need = (seq_lens.long() + ps - 1) // ps
    used = torch.arange(width)[None, :] < need[:, None]
    bad = (used & ((block_tables < 0) | (block_tables >= nb))).nonzero()
    if bad.numel():
        r, c = int(bad[0, 0]), int(bad[0, 1])
        raise ValueError(
            f"{OP}: block_tables[{r}, {c}] = {int(block_tables[r, c])} is out of range [0, {nb}) (key_cache's "
            f"blocks): sequence {r} (seq_len {int(seq_lens[r])}) uses the first {int(need[r])} entries of its row"
        )


def _mask_values(entries: int, ind: list[int], cu: list[int], lens: list[int]) -> None:
    """Each sequence's ``[q_len, seq_len]`` mask matrix: ``mask_indptr`` steps by exactly its size
    and the matrix lies inside ``custom_mask``'s ``entries``."""
    for b, n in enumerate(lens):
        q = cu[b + 1] - cu[b]
        if ind[b + 1] - ind[b] != q * n:
            raise ValueError(
                f"{OP}: mask_indptr[{b + 1}] - mask_indptr[{b}] = {ind[b + 1] - ind[b]}, but sequence {b}'s "
                f"custom mask is its [q_len, seq_len] = [{q}, {n}] matrix: {q * n} entries"
            )
        if q * n and (ind[b] < 0 or ind[b] + q * n > entries):
            raise ValueError(
                f"{OP}: sequence {b}'s custom mask, entries [{ind[b]}, {ind[b] + q * n}) (mask_indptr[{b}] = "
                f"{ind[b]}), is outside custom_mask's {entries} entries"
            )


# -- the definition --------------------------------------------------------------------------------
def reference(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    cu_seqlens_q: Tensor,
    scale: float = 0.0,
    softcap: float = 0.0,
    window_left: int = -1,
    sinks: Tensor | None = None,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
    custom_mask: Tensor | None = None,
    mask_indptr: Tensor | None = None,
    mask_prefix: bool = True,
    causal: bool = True,
    lse: Tensor | None = None,
    out: Tensor | None = None,
) -> Tensor:
    """The definition, one sequence at a time: its keys and values gathered through its block
    table, scores in float32 (float64 for a float64 call), the causal mask aligned to the end of
    the KV (query ``i`` of ``q_len`` sees positions ``<= seq_len - q_len + i``) or the sequence's
    custom mask matrix (the prefix's columns all True with ``mask_prefix=False``), or, not
    ``causal``, every position; the window,
    softcap, the sinks in the denominator, the weighted sum in float32, one cast. Scores over
    the key head dim ``D``, values over the value cache's ``Dv`` (MLA: ``Dv < D``)."""
    f = torch.float64 if query.dtype == torch.float64 else torch.float32
    rows, hq, d = query.shape
    ps, hkv, dv = key_cache.shape[1], key_cache.shape[2], value_cache.shape[3]
    g = hq // hkv
    sm = scale if scale > 0 else d**-0.5
    dev = query.device
    o = torch.zeros((rows, hq, dv), dtype=f, device=dev)
    lses = torch.full((rows, hq), float("-inf"), dtype=f, device=dev)
    cu = cu_seqlens_q.tolist()
    for b, n in enumerate(seq_lens.tolist()):
        q0, q1 = cu[b], cu[b + 1]
        if q1 == q0:
            continue
        pos = torch.arange(n, device=dev)
        blocks = block_tables[b].long()[pos // ps]
        k = _rows(key_cache, blocks, pos % ps).to(f)  # [n, Hkv, D]
        v = _rows(value_cache, blocks, pos % ps).to(f)  # [n, Hkv, Dv]
        if k_scale is not None and v_scale is not None:
            k, v = k * k_scale.to(f).reshape(()), v * v_scale.to(f).reshape(())
        qb = query[q0:q1].to(f).reshape(q1 - q0, hkv, g, d)
        s = torch.einsum("ihgd,nhd->ihgn", qb, k) * sm
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        last = (n - (q1 - q0) + torch.arange(q1 - q0, device=dev))[:, None]  # [q, 1]
        keep = pos[None, :] <= last if causal else torch.ones(q1 - q0, n, dtype=torch.bool, device=dev)
        if custom_mask is not None and mask_indptr is not None:
            m0 = int(mask_indptr[b])
            keep = custom_mask[m0 : m0 + (q1 - q0) * n].reshape(q1 - q0, n).to(dev, copy=True)
            if not mask_prefix:
                keep = keep | (pos[None, :] < n - (q1 - q0))
        if window_left >= 0:
            keep &= pos[None, :] >= last - window_left
        s = s.reshape(q1 - q0, hq, n).masked_fill(~keep[:, None, :], float("-inf"))
        logits = (
            torch.cat([s, sinks.to(f)[None, :, None].expand(q1 - q0, hq, 1)], 2) if sinks is not None else s
        )
        lse_b = torch.logsumexp(logits, 2) if logits.shape[2] else lses[q0:q1]
        p = torch.exp(s - lse_b.clamp_min(torch.finfo(f).min)[:, :, None])  # an empty row: 0
        o[q0:q1] = torch.einsum("ihgn,nhd->ihgd", p.reshape(q1 - q0, hkv, g, n), v).reshape(q1 - q0, hq, dv)
        lses[q0:q1] = lse_b
    if lse is not None:
        lse.copy_(lses)
    y = o.to(query.dtype)
    return y if out is None else out.copy_(y)


#: the torch backend gathers whole block-table rows for this many cache elements at a time
_CHUNK_ELEMENTS = 1 << 25


def torch_prefill(
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
    """The definition's arithmetic a chunk of query tokens at a time, each against its
    sequence's whole block-table row: static shapes, the lengths and offsets kept on the device
    (no sync, CUDA-graph safe), lengths clamped to the table's capacity, bad block ids masked and
    mask entries outside ``custom_mask`` read as False, as the Triton kernel does. A fallback
    (memory ~ tokens x table capacity per chunk)."""
    rows, hq, d = query.shape
    nb, ps, hkv = key_cache.shape[0], key_cache.shape[1], key_cache.shape[2]
    bsz, width = block_tables.shape
    cap = width * ps
    if rows == 0 or bsz == 0:
        return
    if nb == 0 or cap == 0:  # no key at all: the sinks alone
        out.zero_()
        if has_lse:
            lse.copy_(sinks[None, :].expand(rows, hq) if has_sinks else torch.full_like(lse, float("-inf")))
        return
    dev = query.device
    cu = cu_seqlens_q.long().clamp(0, rows)
    tok = torch.arange(rows, device=dev)
    seq = torch.searchsorted(cu[1:].contiguous(), tok, right=True).clamp(0, bsz - 1)  # cu[b] <= t < cu[b+1]
    n_t = seq_lens.long().clamp(0, cap)[seq]
    q_len_t = cu[seq + 1] - cu[seq]
    last_t = n_t - q_len_t + (tok - cu[seq])  # the last position token t sees
    pos = torch.arange(cap, device=dev)
    entries = custom_mask.shape[0]
    if has_mask:  # each token's row of its sequence's [q_len, seq_len] mask matrix
        row_t = mask_indptr.long()[seq] + (tok - cu[seq]) * n_t
    step = max(1, _CHUNK_ELEMENTS // max(1, cap * hkv * d))  # the key rows: Dv <= D
    for t0 in range(0, rows, step):
        t1 = min(rows, t0 + step)
        blocks = block_tables.long()[seq[t0:t1]][:, pos // ps]  # [t, cap]
        last = last_t[t0:t1, None]
        if has_mask:
            at = row_t[t0:t1, None] + pos[None, :]
            seen = (at >= 0) & (at < entries)
            seen &= custom_mask[at.clamp(0, max(0, entries - 1))] if entries else seen
            if not mask_prefix:
                seen |= pos[None, :] < (n_t - q_len_t)[t0:t1, None]
        elif causal:
            seen = pos[None, :] <= last
        else:
            seen = torch.ones(1, cap, dtype=torch.bool, device=dev)
        keep = seen & (pos[None, :] < n_t[t0:t1, None]) & (blocks >= 0) & (blocks < nb)
        if window_left >= 0:
            keep &= pos[None, :] >= last - window_left
        attend_rows(
            out[t0:t1], lse[t0:t1] if has_lse else None, query[t0:t1], key_cache, value_cache,
            blocks.clamp(0, nb - 1), keep, sinks if has_sinks else None,
            k_scale if fp8 else None, v_scale if fp8 else None, scale, softcap,
        )  # fmt: skip


def host_offsets(
    backend: str, cu_seqlens_q: Tensor, seq_lens: Tensor, rows: int, capacity: int
) -> tuple[Tensor, Tensor]:
    """Host copies (int64) of ``cu_seqlens_q`` and of ``seq_lens`` clamped to the table's
    ``capacity`` (as the kernels clamp them), checked as the contract checks CPU tensors, for the
    vendor backends that plan a batch on the host: offsets that do not rise from 0 to the query's
    ``rows``, or a sequence with more new tokens than its length, are CallRefused (the call goes
    to the next backend, whose kernels clamp)."""
    cu = cu_seqlens_q.to("cpu", torch.int64)
    lens = seq_lens.to("cpu", torch.int64).clamp(0, capacity)
    new = cu[1:] - cu[:-1]
    if int(cu[0]) != 0 or int(cu[-1]) != rows or bool((new < 0).any()):
        raise CallRefused(backend, f"cu_seqlens_q does not rise from 0 to the query's {rows} rows")
    if bool((new > lens).any()):
        raise CallRefused(backend, "a sequence has more new tokens than its length")
    return cu, lens
