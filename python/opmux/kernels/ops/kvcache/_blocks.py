"""The block ops of the KV cache group (declared in ``op.py``): contracts, references, torch backends.

* ``copy_blocks(cache, block_mapping)``: ``cache[dst] = cache[src]`` for each ``(src, dst)`` row
  of ``block_mapping`` (int64 ``[n, 2]``, on the cache's device); vLLM's ``copy_blocks`` /
  ``copy_blocks_mla`` run it once per cache.
* ``swap_blocks(src, dst, block_mapping)``: ``dst[d] = src[s]`` between caches on any devices
  (CPU <-> GPU swaps); ``block_mapping`` is a CPU tensor. A copy-engine transfer per run of
  consecutive blocks (``Tensor.copy_``, i.e. ``cudaMemcpyAsync``, as vLLM), no kernel.
* ``concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, scale=None)``: MLA's latent cache
  write, ``kv_cache[slot // bs, slot % bs] = [kv_c | k_pe]``, or ``fp8([kv_c | k_pe] / scale)``.
* ``gather_cache(src_cache, dst, block_table, cu_seq_lens, seq_starts=None)``: the tokens of
  each sequence, read through its block table, into consecutive rows of ``dst``.

A cache of ``copy_blocks`` / ``swap_blocks`` is ``[num_blocks, ...]`` of any dtype (blocks are
copied as bytes) whose blocks are each one dense region (the inner dimensions a permutation of
a contiguous layout: NHD, HND, vLLM's paged layouts, MLA's ``[nb, bs, entry]``) at any block
stride; a block copied onto itself is left alone. Destination blocks should be distinct and not
sources (as in vLLM): which copy lands otherwise is unspecified. Out-of-range block ids: CPU
tensors raise ValueError before anything is written; CUDA kernels do not synchronise to check
and skip such pairs (or tokens) instead, never touching memory out of bounds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import _checks
from .._contract import ANY, FLOATS, FP8, Arg, Contract, Forms, Rule, When
from ._entries import entries as _entries

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

COPY = "kvcache.copy_blocks"
SWAP = "kvcache.swap_blocks"
MLA = "kvcache.concat_and_cache_mla"
GATHER = "kvcache.gather_cache"


# -- the contracts (ops/_contract.py; their checks are generated into _contracts.py) ------------
I32 = 2147483647  # the CUDA kernels' 32-bit grids
_BLOCKS = "[num_blocks, ...] (at least 2-D)"
_PAIRS = "[num_pairs, 2] (src, dst)"
COPY_CONTRACT = Contract(
    "copy_blocks",
    (
        Arg("cache", "NB, B...", dtypes=ANY, layout="paged", expect=_BLOCKS),
        Arg(
            "block_mapping", "P, 2", dtypes=("int64",), device_of="cache", layout="contiguous", expect=_PAIRS
        ),
        Rule(f"P <= {I32}", "more than 2^31 - 1 pairs", device="cuda"),
    ),
    kernel=("cache", "block_mapping"),
    values_cpp="pairs_ok(device_type, block_mapping, cache.size(0))",
    values_header="opmux/kvcache_values.h",
)
SWAP_CONTRACT = Contract(
    "swap_blocks",
    (
        Arg("src", "NS, B...", dtypes=ANY, layout="paged", expect=_BLOCKS),
        Arg("dst", "ND, C...", like="src", any_device=True, layout="paged", expect=_BLOCKS),
        Arg("block_mapping", "P, 2", dtypes=("int64",), layout="contiguous", expect=_PAIRS),
        Rule(
            "block_mapping.is_cpu",
            "block_mapping is on {block_mapping.device}; it must be a CPU tensor (its pairs are read on the host "
            "to issue the copies)",
        ),
        Rule(
            "C == B",
            "dst has blocks of shape {tuple(dst.shape[1:])}, expected {tuple(src.shape[1:])} like src",
        ),
    ),
    kernel=("src", "dst", "block_mapping"),
)

_KV_C = Arg("kv_c", "T, R", dtypes=FLOATS, layout="dense_last", expect="[T, kv_lora_rank]")
_K_PE = Arg("k_pe", "T, P", like="kv_c", layout="dense_last", expect="[{T}, pe_dim]")
_ENTRY = "[num_blocks, block_size, {R + P}] (kv_lora_rank {R} + pe_dim {P})"
_MLA_SLOTS = Arg("slot_mapping", "T", dtypes=("int64",), device_of="kv_c", layout="dense_last")
_MLA_LIMITS = Rule(
    f"T <= {I32} and R + P <= {I32}", "sizes exceed the kernel's 32-bit indexing", device="cuda"
)
_MLA_ARGS = ("kv_c", "k_pe", "kv_cache", "slot_mapping")
MLA_CONTRACT = Forms(
    "concat_and_cache_mla",
    cases=(
        (
            (When("kv_cache", dtype="float8_e4m3fn"),),
            Contract(
                "mla_fp8",
                (
                    _KV_C,
                    _K_PE,
                    Arg(
                        "kv_cache",
                        "NB, BS, R + P",
                        dtypes=FP8,
                        device_of="kv_c",
                        layout="dense_last",
                        expect=_ENTRY,
                    ),
                    Rule("scale is not None", "an fp8 kv_cache needs scale (entries are fp8(x / scale))"),
                    Arg(
                        "scale",
                        "",
                        dtypes=("float32",),
                        device_of="kv_c",
                        layout="element",
                        note=" (a per-tensor scale)",
                    ),
                    _MLA_SLOTS,
                    _MLA_LIMITS,
                ),
                kernel=(*_MLA_ARGS, "scale", "True"),
            ),
        ),
    ),
    default=Contract(
        "mla",
        (
            _KV_C,
            _K_PE,
            Arg("kv_cache", "NB, BS, R + P", like="kv_c", layout="dense_last", expect=_ENTRY),
            Rule(
                "scale is None",
                "scale applies to an fp8 kv_cache (float8_e4m3fn); this cache is {kv_cache.dtype}",
            ),
            _MLA_SLOTS,
            _MLA_LIMITS,
        ),
        kernel=(*_MLA_ARGS, "slot_mapping", "False"),  # no scale: slot_mapping in its place (unread)
        values_cpp="slots_ok(device_type, slot_mapping, kv_cache.size(0) * kv_cache.size(1))",
        values_header="opmux/kvcache_values.h",
    ),
)


def _per_sequence(name: str, n: str) -> Arg:
    """A dense int32 [n] of a value per sequence (block_table's rows), on src_cache's device."""
    hint = "has stride {{t}.stride(0)}; pass {t}.contiguous()"
    return Arg(
        name,
        n,
        dtypes=("int32",),
        device_of="src_cache",
        layout="dense_last",
        note=" (block_table has {B} rows)",
        layout_hint=hint,
    )


_GATHER_ITEMS = (
    Arg(
        "src_cache",
        "NB, BS, E...",
        dtypes=ANY,
        layout="entries",
        expect="[num_blocks, block_size >= 1, entry...]",
    ),
    Rule(
        "BS >= 1",
        "src_cache has shape {tuple(src_cache.shape)}, expected [num_blocks, block_size >= 1, entry...]",
    ),
    Arg(
        "dst", "N, E...", like="src_cache", layout="entries", expect="[num_tokens, {', '.join(map(str, E))}]"
    ),
    Arg(
        "block_table",
        "B, W",
        dtypes=("int32",),
        device_of="src_cache",
        layout="dense_last",
        expect="[batch, max_blocks]",
        layout_hint="has strides {block_table.stride()}; its rows must be contiguous",
    ),
    _per_sequence("cu_seq_lens", "B + 1"),
    Rule(f"B <= {I32}", "more than 2^31 - 1 sequences", device="cuda"),
)
_GATHER_ARGS = ("src_cache", "dst", "block_table", "cu_seq_lens")
_GATHER_VALUES = "gather_values_ok(device_type, src_cache, dst, block_table, cu_seq_lens, {})"
GATHER_CONTRACT = Forms(
    "gather_cache",
    cases=(
        (
            (When("seq_starts", given=True),),
            Contract(
                "gather_from",
                (
                    *_GATHER_ITEMS,
                    _per_sequence("seq_starts", "B"),
                ),
                kernel=(*_GATHER_ARGS, "seq_starts", "True"),
                values_cpp=_GATHER_VALUES.format("&*seq_starts"),
                values_header="opmux/kvcache_values.h",
            ),
        ),
    ),
    # no seq_starts: cu_seq_lens in its place (unread)
    default=Contract(
        "gather",
        _GATHER_ITEMS,
        kernel=(*_GATHER_ARGS, "cu_seq_lens", "False"),
        values_cpp=_GATHER_VALUES.format("nullptr"),
        values_header="opmux/kvcache_values.h",
    ),
)


# -- shared ----------------------------------------------------------------------------------
def _mapping_range(op: str, m: Tensor, col: int, what: str, n: int) -> None:
    """``m[:, col]`` (a CPU tensor) in ``[0, n)``; else ValueError naming the first bad entry."""
    c = m[:, col]
    if _checks.in_range(c, 0, n):
        return
    i = int(((c < 0) | (c >= n)).nonzero()[0, 0])
    raise ValueError(
        f"{op}: block_mapping[{i}, {col}] = {int(c[i])} is out of range: valid {what} blocks are [0, {n})"
    )


def _byte_view(t: Tensor) -> Tensor:
    """fp8 has no index kernels in torch: its bytes instead (same strides)."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


# -- copy_blocks -----------------------------------------------------------------------------
def copy_blocks_values(cache: Tensor, block_mapping: Tensor) -> None:
    if block_mapping.is_cpu:
        for col, what in ((0, "source"), (1, "destination")):
            _mapping_range(COPY, block_mapping, col, what, cache.shape[0])


def copy_blocks_reference(cache: Tensor, block_mapping: Tensor) -> None:
    m = block_mapping.cpu()
    for col, what in ((0, "source"), (1, "destination")):
        _mapping_range(COPY, m, col, what, cache.shape[0])
    for s, d in m.tolist():
        if s != d:
            cache[d].copy_(cache[s])


def torch_copy_blocks(cache: Tensor, block_mapping: Tensor) -> None:
    nb = cache.shape[0]
    src, dst = block_mapping[:, 0], block_mapping[:, 1]
    keep = (src >= 0) & (src < nb) & (dst >= 0) & (dst < nb) & (src != dst)  # CUDA: skip bad pairs
    c = _byte_view(cache)
    c.index_copy_(0, dst[keep], c.index_select(0, src[keep]))


# -- swap_blocks -----------------------------------------------------------------------------
def swap_blocks_values(src: Tensor, dst: Tensor, block_mapping: Tensor) -> None:
    _mapping_range(SWAP, block_mapping, 0, "src", src.shape[0])
    _mapping_range(SWAP, block_mapping, 1, "dst", dst.shape[0])


def swap_blocks_reference(src: Tensor, dst: Tensor, block_mapping: Tensor) -> None:
    swap_blocks_values(src, dst, block_mapping)
    for s, d in block_mapping.tolist():
        dst[d].copy_(src[s].to(dst.device))


def torch_swap_blocks(src: Tensor, dst: Tensor, block_mapping: Tensor) -> None:
    """One ``copy_`` (a ``cudaMemcpyAsync`` where a GPU is involved, on the current stream, as
    vLLM's kernel-free ``swap_blocks``) per run of pairs whose source and destination blocks
    both advance by one: a run of dense blocks at their block stride is one transfer."""
    pairs = block_mapping.tolist()
    i, n = 0, len(pairs)
    while i < n:
        s, d = pairs[i]
        k = 1
        while i + k < n and pairs[i + k][0] == s + k and pairs[i + k][1] == d + k:
            k += 1
        if not (src is dst and s == d):
            dst[d : d + k].copy_(src[s : s + k], non_blocking=True)
        i += k


# -- concat_and_cache_mla --------------------------------------------------------------------
def slots_in_range(op: str, slot_mapping: Tensor, num_slots: int) -> None:
    """CPU ``slot_mapping`` in ``[-1, num_slots)``; else ValueError naming the first bad slot."""
    if slot_mapping.is_cpu and not _checks.in_range(slot_mapping, -1, num_slots):
        t = int(((slot_mapping < -1) | (slot_mapping >= num_slots)).nonzero()[0, 0])
        raise ValueError(
            f"{op}: slot_mapping[{t}] = {int(slot_mapping[t])} is out of range: valid slots are "
            f"[0, {num_slots}) (num_blocks * block_size), or -1 to skip"
        )


def mla_values(
    kv_c: Tensor, k_pe: Tensor, kv_cache: Tensor, slot_mapping: Tensor, scale: Tensor | None = None
) -> None:
    slots_in_range(MLA, slot_mapping, kv_cache.shape[0] * kv_cache.shape[1])


def _mla_write(
    kv_c: Tensor, k_pe: Tensor, kv_cache: Tensor, slot_mapping: Tensor, scale: Tensor | None
) -> None:
    nb, bs = kv_cache.shape[:2]
    keep = (slot_mapping >= 0) & (slot_mapping < nb * bs)
    slots = slot_mapping[keep]
    rows = torch.cat([kv_c[keep], k_pe[keep].to(kv_c.dtype)], dim=-1)
    _byte_view(kv_cache).index_put_((slots // bs, slots % bs), _byte_view(_entries(rows, scale, kv_cache)))


def mla_reference(
    kv_c: Tensor, k_pe: Tensor, kv_cache: Tensor, slot_mapping: Tensor, scale: Tensor | None = None
) -> None:
    slots_in_range(MLA, slot_mapping.cpu(), kv_cache.shape[0] * kv_cache.shape[1])
    _mla_write(kv_c, k_pe, kv_cache, slot_mapping, scale)


def torch_mla(
    kv_c: Tensor, k_pe: Tensor, kv_cache: Tensor, slot_mapping: Tensor, scale: Tensor, fp8: bool
) -> None:
    _mla_write(kv_c, k_pe, kv_cache, slot_mapping, scale if fp8 else None)  # CUDA: bad slots skipped


# -- gather_cache ----------------------------------------------------------------------------
def _gather_plan(
    src_cache: Tensor, dst: Tensor, block_table: Tensor, cu_seq_lens: Tensor, seq_starts: Tensor | None
) -> tuple[list[int], list[int], list[int]]:
    """(dst rows, blocks, offsets) of every token copied (CPU index tensors). Bad values skip the
    sequence (``cu_seq_lens``, ``seq_starts``) or the token (a block-table column or block id out
    of range), as the CUDA kernels do; on the CPU ``gather_values`` has raised before."""
    nb, bs, rows = src_cache.shape[0], src_cache.shape[1], dst.shape[0]
    cu = cu_seq_lens.tolist()
    starts = seq_starts.tolist() if seq_starts is not None else [0] * (len(cu) - 1)
    table = block_table.tolist()
    out: tuple[list[int], list[int], list[int]] = ([], [], [])
    for b in range(len(cu) - 1):
        lo, hi, first = cu[b], cu[b + 1], starts[b]
        if lo < 0 or hi < lo or hi > rows or first < 0:
            continue
        for i in range(hi - lo):
            col = first // bs + i // bs
            if col >= len(table[b]):
                break
            blk = table[b][col]
            if 0 <= blk < nb:
                out[0].append(lo + i)
                out[1].append(blk)
                out[2].append(i % bs)
    return out


def _first(mask: Tensor) -> int | None:
    i = mask.nonzero()
    return int(i[0, 0]) if i.numel() else None


#: block tables of at most this many entries are checked on Python lists (gather_values)
_GATHER_LIST_MAX = 4096


def _gather_values_lists(
    nb: int,
    bs: int,
    rows: int,
    width: int,
    block_table: Tensor,
    cu_seq_lens: Tensor,
    seq_starts: Tensor | None,
) -> None:
    """gather_values' rules on Python lists, rule by rule over the sequences as there."""
    cu = cu_seq_lens.tolist()
    batch = len(cu) - 1
    starts = seq_starts.tolist() if seq_starts is not None else [0] * batch
    for b in range(batch):
        if cu[b] < 0 or cu[b + 1] < cu[b]:
            raise ValueError(
                f"{GATHER}: cu_seq_lens[{b}] = {cu[b]}, cu_seq_lens[{b + 1}] = {cu[b + 1]}: they must be "
                "non-decreasing from 0"
            )
    for b in range(batch):
        if cu[b + 1] > rows:
            raise ValueError(f"{GATHER}: cu_seq_lens[{b + 1}] = {cu[b + 1]} exceeds dst's {rows} rows")
    for b in range(batch):
        if starts[b] < 0:
            raise ValueError(f"{GATHER}: seq_starts[{b}] = {starts[b]} is negative")
    spans = [(starts[b] // bs, starts[b] // bs + (cu[b + 1] - cu[b] + bs - 1) // bs) for b in range(batch)]
    for b, (_, need) in enumerate(spans):
        if need > width:
            raise ValueError(
                f"{GATHER}: sequence {b} needs {need} entries of block_table[{b}], which has {width}"
            )
    table = block_table.tolist()
    for b, (col0, need) in enumerate(spans):
        for c in range(col0, need):
            if not 0 <= table[b][c] < nb:
                raise ValueError(
                    f"{GATHER}: block_table[{b}, {c}] = {table[b][c]} is out of range: valid blocks are [0, {nb})"
                )


def gather_values(
    src_cache: Tensor, dst: Tensor, block_table: Tensor, cu_seq_lens: Tensor, seq_starts: Tensor | None = None
) -> None:
    """The CPU contract on values, vectorized (one pass per rule, not a Python loop per token);
    the same messages as ``_gather_plan(strict=True)``. A small block table (the decode and
    short-prefill calls) is checked on Python lists instead: the same rules in the same order,
    a few microseconds where the tensor passes cost some 60 (more than the copy itself)."""
    if not cu_seq_lens.is_cpu or cu_seq_lens.shape[0] < 2:
        return
    nb, bs, rows, width = src_cache.shape[0], src_cache.shape[1], dst.shape[0], block_table.shape[1]
    if block_table.numel() <= _GATHER_LIST_MAX:
        _gather_values_lists(nb, bs, rows, width, block_table, cu_seq_lens, seq_starts)
        return
    cu = cu_seq_lens.long()
    lo, hi = cu[:-1], cu[1:]
    b = _first((lo < 0) | (hi < lo))
    if b is not None:
        raise ValueError(
            f"{GATHER}: cu_seq_lens[{b}] = {int(lo[b])}, cu_seq_lens[{b + 1}] = {int(hi[b])}: they must be "
            "non-decreasing from 0"
        )
    b = _first(hi > rows)
    if b is not None:
        raise ValueError(f"{GATHER}: cu_seq_lens[{b + 1}] = {int(hi[b])} exceeds dst's {rows} rows")
    starts = seq_starts.long() if seq_starts is not None else torch.zeros_like(lo)
    b = _first(starts < 0)
    if b is not None:
        raise ValueError(f"{GATHER}: seq_starts[{b}] = {int(starts[b])} is negative")
    col0 = starts // bs
    need = col0 + (hi - lo + bs - 1) // bs
    b = _first(need > width)
    if b is not None:
        raise ValueError(
            f"{GATHER}: sequence {b} needs {int(need[b])} entries of block_table[{b}], which has {width}"
        )
    cols = torch.arange(width)
    used = (cols >= col0[:, None]) & (cols < need[:, None])
    bad = (used & ((block_table < 0) | (block_table >= nb))).nonzero()
    if bad.numel():
        r, c = int(bad[0, 0]), int(bad[0, 1])
        raise ValueError(
            f"{GATHER}: block_table[{r}, {c}] = {int(block_table[r, c])} is out of range: valid blocks are [0, {nb})"
        )


def _gather(src_cache: Tensor, dst: Tensor, plan: tuple[list[int], list[int], list[int]]) -> None:
    dev = src_cache.device
    r, blk, off = (torch.tensor(v, dtype=torch.int64, device=dev) for v in plan)
    _byte_view(dst)[r] = _byte_view(src_cache)[blk, off].to(_byte_view(dst).dtype)


def gather_reference(
    src_cache: Tensor, dst: Tensor, block_table: Tensor, cu_seq_lens: Tensor, seq_starts: Tensor | None = None
) -> None:
    table, cu = block_table.cpu(), cu_seq_lens.cpu()
    starts = None if seq_starts is None else seq_starts.cpu()
    gather_values(src_cache, dst, table, cu, starts)
    _gather(src_cache, dst, _gather_plan(src_cache, dst, table, cu, starts))


def torch_gather(
    src_cache: Tensor,
    dst: Tensor,
    block_table: Tensor,
    cu_seq_lens: Tensor,
    seq_starts: Tensor,
    has_starts: bool,
) -> None:
    plan = _gather_plan(
        src_cache, dst, block_table.cpu(), cu_seq_lens.cpu(), seq_starts.cpu() if has_starts else None
    )
    _gather(src_cache, dst, plan)
