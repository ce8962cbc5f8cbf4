"""The KV cache ops, each one declaration (``ops/_decl.py``): reshape_and_cache (vLLM's
``reshape_and_cache_flash`` and ``reshape_and_cache``), described here; the block ops
(``copy_blocks``, ``swap_blocks``, ``concat_and_cache_mla``, ``gather_cache``) are declared at the end,
their contracts and references in ``_blocks.py``. ``copy_blocks`` / ``swap_blocks`` / ``gather_cache``
are selected by their index tensor (int64 ``block_mapping``, int32 ``block_table``): their caches
may have any dtype, fp8 bytes included.

``key``/``value`` ``[T, H, D]`` (last dim contiguous; token and head strides free, e.g. slices
of a fused qkv tensor); ``key_cache``/``value_cache`` ``[num_blocks, block_size, H, D]`` with a
dense head_dim and any other (non-negative) strides: the NHD layout, or the HND layout
(``[num_blocks, H, block_size, D]`` in memory) passed as its permuted view, as vLLM does;
``slot_mapping`` int64 ``[T]``, ``slot = block * block_size + offset``; a negative slot (vLLM
pads with -1) skips the token. Slots must be distinct (which token lands in a repeated slot is
unspecified). The caches have key's dtype, or are float8_e4m3fn with ``k_scale`` / ``v_scale``
(float32, one element each): entries are ``fp8(x / scale)`` (an IEEE division, saturated to
+-448), vLLM's ``kv_cache_dtype="fp8"`` convention. A 5-D ``key_cache`` is vLLM's paged layout of
``reshape_and_cache``: key ``[num_blocks, H, D // x, block_size, x]`` (x dense), value
``[num_blocks, H, D, block_size]``.

Out-of-range slots (``>= num_blocks * block_size`` or ``< -1``): CPU tensors raise ValueError
naming the first bad slot BEFORE anything is written. CUDA kernels do not check on the host
(that would synchronise) and instead skip such tokens, so they never write out of bounds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import _checks
from .._decl import declare
from . import _blocks
from ._entries import entries as _entries

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

_OP = "kvcache.reshape_and_cache"


def _check_slots(slot_mapping: Tensor, num_slots: int) -> None:
    # in_range: a decode-sized mapping read as one list, an empty one passes; the rest only when
    # something is wrong
    if slot_mapping.is_cpu and not _checks.in_range(slot_mapping, -1, num_slots):
        bad = ((slot_mapping < -1) | (slot_mapping >= num_slots)).nonzero()
        if bad.numel():
            t = int(bad[0, 0])
            raise ValueError(
                f"{_OP}: slot_mapping[{t}] = {int(slot_mapping[t])} is out of range: "
                f"valid slots are [0, {num_slots}) (num_blocks * block_size), or -1 to skip"
            )


def _scale(name: str, s: Tensor, ref: Tensor) -> None:
    _checks.tensor(_OP, name, s)
    _checks.exact_dtype(_OP, name, s, torch.float32)
    _checks.same_device(_OP, "key", ref, **{name: s})
    if s.numel() != 1:
        raise ValueError(
            f"{_OP}: {name} has shape {tuple(s.shape)}, expected one element (a per-tensor scale)"
        )


def check(
    op: str,
    key: Tensor,
    value: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    slot_mapping: Tensor,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
) -> tuple[tuple[Any, ...], None]:
    """-> ((key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale, fp8), None); for a
    cache that is not fp8 the scales are passed as slot_mapping (unread)."""
    try:  # the usual call (a cache of key's dtype), each attribute read once; else the full checks
        if (
            k_scale is None
            and v_scale is None
            and type(key) is torch.Tensor  # plain tensors (fake ones, subclasses: the full checks)
            and type(value) is torch.Tensor
            and type(key_cache) is torch.Tensor
            and type(value_cache) is torch.Tensor
            and type(slot_mapping) is torch.Tensor
        ):
            ks, kcs, dt = key.shape, key_cache.shape, key.dtype
            t, h, d = ks  # not [T, H, D] / a 4-D cache / a 1-D slot_mapping raises: the full checks
            _, _, ch, cd = kcs
            (ts,) = slot_mapping.shape
            if (
                h >= 1
                and d >= 1
                and ch == h
                and cd == d
                and ts == t
                and dt in _checks.FLOAT_DTYPES
                and value.dtype is dt
                and key_cache.dtype is dt
                and value_cache.dtype is dt
                and slot_mapping.dtype is torch.int64
                and value.shape == ks
                and value_cache.shape == kcs
            ):
                if key.is_cpu:  # the CPU serving call: one bool a tensor, no device objects
                    one_device = (
                        value.is_cpu and key_cache.is_cpu and value_cache.is_cpu and slot_mapping.is_cpu
                    )
                else:
                    dev = key.device
                    one_device = (
                        value.device == dev
                        and key_cache.device == dev
                        and value_cache.device == dev
                        and slot_mapping.device == dev
                    )
                kst, vst = key.stride(), value.stride()
                cst, vcst = key_cache.stride(), value_cache.stride()
                if (
                    one_device
                    and (d == 1 or (kst[2] == 1 and vst[2] == 1))
                    and (t <= 1 or slot_mapping.stride()[0] == 1)
                    # the caches: a dense head_dim, no stride negative
                    and (cst[3] == 1 or (d == 1 and cst[3] >= 0))
                    and (vcst[3] == 1 or (d == 1 and vcst[3] >= 0))
                    and cst[0] >= 0
                    and cst[1] >= 0
                    and cst[2] >= 0
                    and vcst[0] >= 0
                    and vcst[1] >= 0
                    and vcst[2] >= 0
                ):
                    sm = slot_mapping  # the scales' places (unread for a cache that is not fp8)
                    return (key, value, key_cache, value_cache, sm, sm, sm, False), None
    except Exception:  # not tensors, ...: the full checks say what is wrong
        pass
    for name, arg in (
        ("key", key),
        ("value", value),
        ("key_cache", key_cache),
        ("value_cache", value_cache),
        ("slot_mapping", slot_mapping),
    ):
        _checks.tensor(_OP, name, arg)
    _checks.float_dtype(_OP, "key", key)
    _checks.same_dtype(_OP, "key", key, value=value)
    fp8 = key_cache.dtype == torch.float8_e4m3fn
    if fp8:
        _checks.same_dtype(_OP, "key_cache", key_cache, value_cache=value_cache)
        if k_scale is None or v_scale is None:
            raise ValueError(f"{_OP}: an fp8 cache needs k_scale and v_scale (entries are fp8(x / scale))")
        _scale("k_scale", k_scale, key)
        _scale("v_scale", v_scale, key)
    else:
        _checks.same_dtype(_OP, "key", key, key_cache=key_cache, value_cache=value_cache)
        if k_scale is not None or v_scale is not None:
            raise ValueError(
                f"{_OP}: k_scale / v_scale apply to an fp8 cache (float8_e4m3fn); this cache is {key_cache.dtype}"
            )
    _checks.exact_dtype(_OP, "slot_mapping", slot_mapping, torch.int64)
    _checks.same_device(
        _OP, "key", key, value=value, key_cache=key_cache, value_cache=value_cache, slot_mapping=slot_mapping
    )
    if key.dim() != 3:
        raise ValueError(f"{_OP}: key has shape {tuple(key.shape)}, expected [T, H, D]")
    t, h, d = key.shape
    if h < 1 or d < 1:
        raise ValueError(
            f"{_OP}: key has shape {tuple(key.shape)}: {'H (heads)' if h < 1 else 'D (head_dim)'} is 0; "
            f"H and D must be at least 1"
        )
    if value.shape != key.shape:
        raise ValueError(f"{_OP}: value has shape {tuple(value.shape)}, expected {tuple(key.shape)} like key")
    paged = key_cache.dim() == 5
    if paged:  # vLLM's paged layout: key [nb, H, D/x, bs, x], value [nb, H, D, bs]
        nb, _, _, bs, x = key_cache.shape
        if x < 1 or d % x or key_cache.shape[1:3] != (h, d // x):
            raise ValueError(
                f"{_OP}: key_cache has shape {tuple(key_cache.shape)}, expected the paged "
                f"[num_blocks, {h}, {d} // x, block_size, x] with x dividing {d}"
            )
        if value_cache.shape != (nb, h, d, bs):
            raise ValueError(
                f"{_OP}: value_cache has shape {tuple(value_cache.shape)}, expected the paged [{nb}, {h}, {d}, {bs}]"
            )
    elif key_cache.dim() != 4 or key_cache.shape[2:] != (h, d):
        raise ValueError(
            f"{_OP}: key_cache has shape {tuple(key_cache.shape)}, expected [num_blocks, block_size, {h}, {d}]"
            " (or vLLM's paged [num_blocks, H, D // x, block_size, x])"
        )
    elif value_cache.shape != key_cache.shape:
        raise ValueError(
            f"{_OP}: value_cache has shape {tuple(value_cache.shape)}, expected {tuple(key_cache.shape)}"
        )
    if slot_mapping.shape != (t,):
        raise ValueError(f"{_OP}: slot_mapping has shape {tuple(slot_mapping.shape)}, expected [{t}]")
    for name, r in (("key", key), ("value", value), ("slot_mapping", slot_mapping)):
        if r.shape[-1] > 1 and r.stride(-1) != 1:
            raise ValueError(
                f"{_OP}: {name} has a non-contiguous last dimension (stride {r.stride(-1)}); pass .contiguous()"
            )
    for name, c in (("key_cache", key_cache), ("value_cache", value_cache)):
        if min(c.stride()) < 0:
            raise ValueError(f"{_OP}: {name} has strides {c.stride()}; no stride may be negative")
        if paged and c is key_cache and key_cache.shape[4] > 1 and key_cache.stride(4) != 1:
            raise ValueError(f"{_OP}: key_cache has strides {c.stride()}; its x dimension must be dense")
        if not paged and d > 1 and c.stride(3) != 1:
            raise ValueError(
                f"{_OP}: {name} has strides {c.stride()}; its head_dim must be dense (stride 1) and no "
                f"stride negative (NHD [num_blocks, block_size, H, D] and HND [num_blocks, H, block_size, D] "
                f"caches, as their [num_blocks, block_size, H, D] view, are both fine)"
            )
    if fp8:
        assert k_scale is not None and v_scale is not None
        return (key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale, True), None
    return (key, value, key_cache, value_cache, slot_mapping, slot_mapping, slot_mapping, False), None


def values(
    key: Tensor,
    value: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    slot_mapping: Tensor,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
) -> None:
    _check_slots(slot_mapping, key_cache.shape[0] * _block_size(key_cache))


def _block_size(key_cache: Tensor) -> int:
    s = key_cache.shape  # [nb, bs, h, d] or the paged [nb, h, d / x, bs, x]
    return int(s[3] if len(s) == 5 else s[1])


def _put(cache: Tensor, blk: Tensor, off: Tensor, rows: Tensor, paged: bool = False) -> None:
    """cache[blk, off] = rows [n, H, D]; a paged cache is written through its permuted view (key
    [nb, H, D/x, bs, x]: rows as [n, H, D/x, x]; value [nb, H, D, bs])."""
    if cache.dtype == torch.float8_e4m3fn:  # index_put has no fp8 kernel: write the bytes
        cache, rows = cache.view(torch.uint8), rows.view(torch.uint8)
    if paged and cache.dim() == 5:
        n, h = rows.shape[:2]
        cache.permute(0, 3, 1, 2, 4).index_put_((blk, off), rows.reshape(n, h, -1, cache.shape[4]))
    elif paged:
        cache.permute(0, 3, 1, 2).index_put_((blk, off), rows)
    else:
        cache.index_put_((blk, off), rows)


def reference(
    key: Tensor,
    value: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    slot_mapping: Tensor,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
) -> None:
    nb, bs, paged = key_cache.shape[0], _block_size(key_cache), key_cache.dim() == 5
    _check_slots(slot_mapping.cpu(), nb * bs)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    blk, off = slots // bs, slots % bs
    _put(key_cache, blk, off, _entries(key[keep], k_scale, key_cache), paged)
    _put(value_cache, blk, off, _entries(value[keep], v_scale, value_cache), paged)


def torch_write(
    key: Tensor,
    value: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    slot_mapping: Tensor,
    k_scale: Tensor,
    v_scale: Tensor,
    fp8: bool,
) -> None:
    nb, bs, paged = key_cache.shape[0], _block_size(key_cache), key_cache.dim() == 5
    keep = (slot_mapping >= 0) & (slot_mapping < nb * bs)  # CUDA: skip bad slots (CPU raised)
    slots = slot_mapping[keep]
    blk, off = slots // bs, slots % bs
    _put(key_cache, blk, off, _entries(key[keep], k_scale if fp8 else None, key_cache), paged)
    _put(value_cache, blk, off, _entries(value[keep], v_scale if fp8 else None, value_cache), paged)


reshape_and_cache = declare(
    _OP,
    "(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(a!) value_cache, Tensor slot_mapping, "
    "Tensor? k_scale=None, Tensor? v_scale=None) -> ()",
    doc="key/value [T, H, D] -> key_cache/value_cache[slot // bs, slot % bs] (slot -1: skip); "
    "NHD or HND caches (any head/page strides) or vLLM's paged layout; fp8 cache: fp8(x / scale)",
    check=check,
    values=values,
    reference=reference,
    torch=torch_write,
    # a copy (or one fp8 rounding): every backend must be bit-exact
    tolerances=(("float32", (0.0, 0.0)), ("float16", (0.0, 0.0)), ("bfloat16", (0.0, 0.0))),
)


# -- the block ops (contracts, references and torch backends in _blocks.py) ----------------------
_EXACT = tuple(
    (d, (0.0, 0.0)) for d in ("float32", "float16", "bfloat16", "float8_e4m3fn", "uint8", "int64", "int32")
)

copy_blocks = declare(
    _blocks.COPY,
    "(Tensor(a!) cache, Tensor block_mapping) -> ()",
    doc="cache[dst] = cache[src] for each (src, dst) row of block_mapping (int64 [n, 2]); any cache dtype, "
    "dense blocks (NHD, HND, paged, MLA) at any block stride; vLLM's copy_blocks / copy_blocks_mla per cache",
    check=_blocks.copy_blocks_check,
    values=_blocks.copy_blocks_values,
    reference=_blocks.copy_blocks_reference,
    torch=_blocks.torch_copy_blocks,
    dtypes=("int64",),  # chosen by block_mapping: the cache may be of any dtype (fp8 bytes included)
    key_arg=1,
    tolerances=_EXACT,
)

swap_blocks = declare(
    _blocks.SWAP,
    "(Tensor src, Tensor(a!) dst, Tensor block_mapping) -> ()",
    doc="dst[d] = src[s] for each (s, d) row of the CPU block_mapping, src and dst on any devices "
    "(CPU <-> GPU swaps): one copy-engine transfer (cudaMemcpyAsync) per run of consecutive blocks",
    check=_blocks.swap_blocks_check,
    values=_blocks.swap_blocks_values,
    reference=_blocks.swap_blocks_reference,
    torch=_blocks.torch_swap_blocks,
    native=False,  # a transfer between devices is the copy engine's job, not a kernel's
    triton=False,
    dtypes=("int64",),
    key_arg=2,
    tolerances=_EXACT,
)

concat_and_cache_mla = declare(
    _blocks.MLA,
    "(Tensor kv_c, Tensor k_pe, Tensor(a!) kv_cache, Tensor slot_mapping, Tensor? scale=None) -> ()",
    doc="kv_cache[slot // bs, slot % bs] = [kv_c | k_pe] (slot -1: skip); MLA's latent cache "
    "[num_blocks, block_size, kv_lora_rank + pe_dim]; fp8 cache: fp8(x / scale)",
    check=_blocks.mla_check,
    values=_blocks.mla_values,
    reference=_blocks.mla_reference,
    torch=_blocks.torch_mla,
    tolerances=_EXACT,
)

gather_cache = declare(
    _blocks.GATHER,
    "(Tensor src_cache, Tensor(a!) dst, Tensor block_table, Tensor cu_seq_lens, Tensor? seq_starts=None) -> ()",
    doc="dst[cu_seq_lens[b] + i] = src_cache[block_table[b, seq_starts[b] // bs + i // bs], i % bs] for "
    "each sequence b (int32 block_table / cu_seq_lens / seq_starts); any cache dtype",
    check=_blocks.gather_check,
    values=_blocks.gather_values,
    reference=_blocks.gather_reference,
    torch=_blocks.torch_gather,
    dtypes=("int32",),  # chosen by block_table: the cache may be of any dtype
    key_arg=2,
    tolerances=_EXACT,
)
