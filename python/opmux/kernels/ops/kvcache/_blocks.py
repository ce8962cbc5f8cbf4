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

from typing import TYPE_CHECKING, Any

from .. import _checks
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


# -- shared ----------------------------------------------------------------------------------
def _dense_blocks(t: Tensor) -> bool:
    """Each block ``t[b]`` is one dense region (inner strides a permutation of a contiguous
    layout, none negative) and blocks do not overlap."""
    st, sh = t.stride(), t.shape
    if min(st) < 0:
        return False
    if 0 in sh:
        return True
    expect = 1
    for s, n in sorted((s, n) for s, n in zip(st[1:], sh[1:], strict=True) if n > 1):
        if s != expect:
            return False
        expect *= n
    return sh[0] <= 1 or st[0] >= expect


def _block_cache(op: str, name: str, t: Tensor) -> None:
    if t.dim() < 2:
        raise ValueError(
            f"{op}: {name} has shape {tuple(t.shape)}, expected [num_blocks, ...] (at least 2-D)"
        )
    if not _dense_blocks(t):
        raise ValueError(
            f"{op}: {name} has shape {tuple(t.shape)} and strides {t.stride()}; each block {name}[b] must be "
            "one dense region (its dimensions a permutation of a contiguous layout, e.g. NHD or HND), "
            "blocks apart, no stride negative"
        )


def _mapping(op: str, m: Tensor) -> None:
    _checks.exact_dtype(op, "block_mapping", m, torch.int64)
    if m.dim() != 2 or m.shape[1] != 2:
        raise ValueError(
            f"{op}: block_mapping has shape {tuple(m.shape)}, expected [num_pairs, 2] (src, dst)"
        )
    if (m.shape[0] > 1 and m.stride() != (2, 1)) or (m.shape[0] == 1 and m.stride(1) != 1):
        raise ValueError(
            f"{op}: block_mapping has strides {m.stride()}; it must be contiguous: pass block_mapping.contiguous()"
        )


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
def copy_blocks_check(op: str, cache: Tensor, block_mapping: Tensor) -> tuple[tuple[Any, ...], None]:
    """-> ((cache, block_mapping), None)."""
    _checks.tensor(op, "cache", cache)
    _checks.tensor(op, "block_mapping", block_mapping)
    _mapping(op, block_mapping)
    _checks.same_device(op, "cache", cache, block_mapping=block_mapping)
    _block_cache(op, "cache", cache)
    return (cache, block_mapping), None


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
def swap_blocks_check(
    op: str, src: Tensor, dst: Tensor, block_mapping: Tensor
) -> tuple[tuple[Any, ...], None]:
    """-> ((src, dst, block_mapping), None)."""
    for name, t in (("src", src), ("dst", dst), ("block_mapping", block_mapping)):
        _checks.tensor(op, name, t)
    _checks.same_dtype(op, "src", src, dst=dst)
    _mapping(op, block_mapping)
    if not block_mapping.is_cpu:
        raise ValueError(
            f"{op}: block_mapping is on {block_mapping.device}; it must be a CPU tensor (its pairs are read "
            "on the host to issue the copies)"
        )
    _block_cache(op, "src", src)
    _block_cache(op, "dst", dst)
    if src.shape[1:] != dst.shape[1:]:
        raise ValueError(
            f"{op}: dst has blocks of shape {tuple(dst.shape[1:])}, expected {tuple(src.shape[1:])} like src"
        )
    return (src, dst, block_mapping), None


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
def _slots(op: str, slot_mapping: Tensor, num_slots: int) -> None:
    """CPU ``slot_mapping`` in ``[-1, num_slots)``; else ValueError naming the first bad slot."""
    if slot_mapping.is_cpu and not _checks.in_range(slot_mapping, -1, num_slots):
        t = int(((slot_mapping < -1) | (slot_mapping >= num_slots)).nonzero()[0, 0])
        raise ValueError(
            f"{op}: slot_mapping[{t}] = {int(slot_mapping[t])} is out of range: valid slots are "
            f"[0, {num_slots}) (num_blocks * block_size), or -1 to skip"
        )


def _dense_last(t: Tensor) -> bool:
    """A unit last stride (or at most one element there) and no stride negative: the layout the
    full checks of concat_and_cache_mla take."""
    st = t.stride()
    return (st[-1] == 1 or t.shape[-1] <= 1) and min(st) >= 0


def mla_check(
    op: str, kv_c: Tensor, k_pe: Tensor, kv_cache: Tensor, slot_mapping: Tensor, scale: Tensor | None = None
) -> tuple[tuple[Any, ...], None]:
    """-> ((kv_c, k_pe, kv_cache, slot_mapping, scale, fp8), None); for a cache that is not
    fp8 the scale is passed as slot_mapping (unread)."""
    try:  # the serving call (CPU tensors, a cache of kv_c's dtype, no scale), each attribute read once
        if (
            scale is None
            and type(kv_c) is torch.Tensor  # plain tensors (fake ones, subclasses: the full checks)
            and type(k_pe) is torch.Tensor
            and type(kv_cache) is torch.Tensor
            and type(slot_mapping) is torch.Tensor
            and kv_c.is_cpu
            and k_pe.is_cpu
            and kv_cache.is_cpu
            and slot_mapping.is_cpu
        ):
            dt = kv_c.dtype
            t, r = kv_c.shape  # a wrong number of dims raises: the full checks name it
            tp, p = k_pe.shape
            nb, bs, entry = kv_cache.shape
            (ts,) = slot_mapping.shape
            if (
                t > 0  # nothing empty: an empty tensor counts as contiguous whatever its strides
                and r > 0
                and p > 0
                and nb > 0
                and bs > 0
                and dt in _checks.FLOAT_DTYPES
                and k_pe.dtype == dt
                and kv_cache.dtype == dt
                and slot_mapping.dtype == torch.int64
                and tp == t
                and ts == t
                and entry == r + p
                # contiguous (and not empty): a unit last stride (or one element there), no stride negative
                and (kv_c.is_contiguous() or _dense_last(kv_c))
                and (k_pe.is_contiguous() or _dense_last(k_pe))
                and (kv_cache.is_contiguous() or _dense_last(kv_cache))
                and (slot_mapping.is_contiguous() or _dense_last(slot_mapping))
            ):
                return (kv_c, k_pe, kv_cache, slot_mapping, slot_mapping, False), None
    except Exception:  # not tensors, other dims, ...: the full checks say what is wrong
        pass
    for name, arg in (("kv_c", kv_c), ("k_pe", k_pe), ("kv_cache", kv_cache), ("slot_mapping", slot_mapping)):
        _checks.tensor(op, name, arg)
    _checks.float_dtype(op, "kv_c", kv_c)
    _checks.same_dtype(op, "kv_c", kv_c, k_pe=k_pe)
    fp8 = kv_cache.dtype == torch.float8_e4m3fn
    if fp8:
        if scale is None:
            raise ValueError(f"{op}: an fp8 kv_cache needs scale (entries are fp8(x / scale))")
        _checks.tensor(op, "scale", scale)
        _checks.exact_dtype(op, "scale", scale, torch.float32)
        _checks.same_device(op, "kv_c", kv_c, scale=scale)
        if scale.numel() != 1:
            raise ValueError(
                f"{op}: scale has shape {tuple(scale.shape)}, expected one element (a per-tensor scale)"
            )
    else:
        _checks.same_dtype(op, "kv_c", kv_c, kv_cache=kv_cache)
        if scale is not None:
            raise ValueError(
                f"{op}: scale applies to an fp8 kv_cache (float8_e4m3fn); this cache is {kv_cache.dtype}"
            )
    _checks.exact_dtype(op, "slot_mapping", slot_mapping, torch.int64)
    _checks.same_device(op, "kv_c", kv_c, k_pe=k_pe, kv_cache=kv_cache, slot_mapping=slot_mapping)
    if kv_c.dim() != 2:
        raise ValueError(f"{op}: kv_c has shape {tuple(kv_c.shape)}, expected [T, kv_lora_rank]")
    t, r = int(kv_c.shape[0]), int(kv_c.shape[1])
    if k_pe.dim() != 2 or k_pe.shape[0] != t:
        raise ValueError(f"{op}: k_pe has shape {tuple(k_pe.shape)}, expected [{t}, pe_dim]")
    p = int(k_pe.shape[1])
    if kv_cache.dim() != 3 or kv_cache.shape[2] != r + p:
        raise ValueError(
            f"{op}: kv_cache has shape {tuple(kv_cache.shape)}, expected [num_blocks, block_size, {r + p}] "
            f"(kv_lora_rank {r} + pe_dim {p})"
        )
    if slot_mapping.shape != (t,):
        raise ValueError(f"{op}: slot_mapping has shape {tuple(slot_mapping.shape)}, expected [{t}]")
    for name, x in (("kv_c", kv_c), ("k_pe", k_pe), ("kv_cache", kv_cache), ("slot_mapping", slot_mapping)):
        if x.shape[-1] > 1 and x.stride(-1) != 1:
            raise ValueError(
                f"{op}: {name} has a non-contiguous last dimension (stride {x.stride(-1)}); pass .contiguous()"
            )
        if min(x.stride(), default=0) < 0:
            raise ValueError(f"{op}: {name} has strides {x.stride()}; no stride may be negative")
    s = scale if fp8 and scale is not None else slot_mapping
    return (kv_c, k_pe, kv_cache, slot_mapping, s, fp8), None


def mla_values(
    kv_c: Tensor, k_pe: Tensor, kv_cache: Tensor, slot_mapping: Tensor, scale: Tensor | None = None
) -> None:
    _slots(MLA, slot_mapping, kv_cache.shape[0] * kv_cache.shape[1])


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
    _slots(MLA, slot_mapping.cpu(), kv_cache.shape[0] * kv_cache.shape[1])
    _mla_write(kv_c, k_pe, kv_cache, slot_mapping, scale)


def torch_mla(
    kv_c: Tensor, k_pe: Tensor, kv_cache: Tensor, slot_mapping: Tensor, scale: Tensor, fp8: bool
) -> None:
    _mla_write(kv_c, k_pe, kv_cache, slot_mapping, scale if fp8 else None)  # CUDA: bad slots skipped


# -- gather_cache ----------------------------------------------------------------------------
def _c_dense(t: Tensor, first: int) -> bool:
    """Dimensions ``first..`` of ``t`` are C-contiguous (size-1 dimensions aside)."""
    expect = 1
    for s, n in reversed(list(zip(t.stride()[first:], t.shape[first:], strict=True))):
        if n > 1 and s != expect:
            return False
        expect *= n
    return True


def gather_check(
    op: str,
    src_cache: Tensor,
    dst: Tensor,
    block_table: Tensor,
    cu_seq_lens: Tensor,
    seq_starts: Tensor | None = None,
) -> tuple[tuple[Any, ...], None]:
    """-> ((src_cache, dst, block_table, cu_seq_lens, seq_starts, has_starts), None); without
    seq_starts, cu_seq_lens is passed in its place (unread)."""
    named = [
        ("src_cache", src_cache),
        ("dst", dst),
        ("block_table", block_table),
        ("cu_seq_lens", cu_seq_lens),
    ]
    if seq_starts is not None:
        named.append(("seq_starts", seq_starts))
    for name, t in named:
        _checks.tensor(op, name, t)
    _checks.same_dtype(op, "src_cache", src_cache, dst=dst)
    for name, t in named[2:]:
        _checks.exact_dtype(op, name, t, torch.int32)
    _checks.same_device(op, "src_cache", src_cache, **dict(named[1:]))
    if src_cache.dim() < 3 or src_cache.shape[1] < 1:
        raise ValueError(
            f"{op}: src_cache has shape {tuple(src_cache.shape)}, expected [num_blocks, block_size >= 1, entry...]"
        )
    if dst.dim() != src_cache.dim() - 1 or dst.shape[1:] != src_cache.shape[2:]:
        raise ValueError(
            f"{op}: dst has shape {tuple(dst.shape)}, expected [num_tokens, {', '.join(map(str, src_cache.shape[2:]))}]"
        )
    if not _c_dense(src_cache, 2) or min(src_cache.stride()) < 0:
        raise ValueError(
            f"{op}: src_cache has strides {src_cache.stride()}; its entries (dims 2..) must be contiguous and "
            "no stride negative"
        )
    if not _c_dense(dst, 1) or min(dst.stride()) < 0:
        raise ValueError(
            f"{op}: dst has strides {dst.stride()}; its entries (dims 1..) must be contiguous and no stride negative"
        )
    if block_table.dim() != 2:
        raise ValueError(
            f"{op}: block_table has shape {tuple(block_table.shape)}, expected [batch, max_blocks]"
        )
    b = block_table.shape[0]
    if (block_table.shape[1] > 1 and block_table.stride(1) != 1) or min(block_table.stride()) < 0:
        raise ValueError(f"{op}: block_table has strides {block_table.stride()}; its rows must be contiguous")
    for name, v, n in (("cu_seq_lens", cu_seq_lens, b + 1), ("seq_starts", seq_starts, b)):
        if v is None:
            continue
        if v.shape != (n,):
            raise ValueError(
                f"{op}: {name} has shape {tuple(v.shape)}, expected [{n}] (block_table has {b} rows)"
            )
        if n > 1 and v.stride(0) != 1:
            raise ValueError(f"{op}: {name} has stride {v.stride(0)}; pass {name}.contiguous()")
    starts = seq_starts if seq_starts is not None else cu_seq_lens
    return (src_cache, dst, block_table, cu_seq_lens, starts, seq_starts is not None), None


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
