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

from .._contract import FLOATS, FP8, Arg, Contract, Forms, Rule, When
from .._decl import declare
from . import _blocks
from ._entries import entries as _entries

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

_OP = "kvcache.reshape_and_cache"


# -- the contract: four forms (a cache of key's dtype or fp8 with its scales; NHD / HND views or
# vLLM's paged layout), their checks generated into _contracts.py ------------------------------
_I32 = _blocks.I32
_KEY = Arg("key", "T, H, D", dtypes=FLOATS, layout="dense_last", expect="[T, H, D]")
_HEADS = Rule(
    "H >= 1 and D >= 1",
    "key has shape {tuple(key.shape)}: {'H (heads)' if H < 1 else 'D (head_dim)'} is 0; H and D must be at least 1",
)
_VALUE = Arg("value", "=key", like="key", layout="dense_last")
_SLOTS = Arg("slot_mapping", "T", dtypes=("int64",), device_of="key", layout="dense_last")
_NO_SCALES = Rule(
    "k_scale is None and v_scale is None",
    "k_scale / v_scale apply to an fp8 cache (float8_e4m3fn); this cache is {key_cache.dtype}",
)
_SCALES: tuple[Rule | Arg, ...] = (
    Rule(
        "k_scale is not None and v_scale is not None",
        "an fp8 cache needs k_scale and v_scale (entries are fp8(x / scale))",
    ),
    *(
        Arg(n, "", dtypes=("float32",), device_of="key", layout="element", note=" (a per-tensor scale)")
        for n in ("k_scale", "v_scale")
    ),
)
_CUDA_LIMITS = Rule(
    f"T <= {_I32} and H * D <= {_I32} and BS <= {_I32}",
    "sizes exceed the kernel's 32-bit indexing",
    device="cuda",
)
_NHD_HINT = (
    "has strides {{t}.stride()}; its head_dim must be dense (stride 1) and no stride negative (NHD [num_blocks, "
    "block_size, H, D] and HND [num_blocks, H, block_size, D] caches, as their [num_blocks, block_size, H, D] "
    "view, are both fine)"
)


def _nhd(dtype: dict[str, Any]) -> tuple[Arg, Arg]:
    """key_cache / value_cache [num_blocks, block_size, H, D] (NHD, or HND as its permuted view)."""
    expect = "[num_blocks, block_size, {H}, {D}] (or vLLM's paged [num_blocks, H, D // x, block_size, x])"
    kc = Arg("key_cache", "NB, BS, H, D", layout="dense_last", expect=expect, layout_hint=_NHD_HINT, **dtype)
    like = {"like": "key_cache"} if "dtypes" in dtype else dtype
    vc = Arg(
        "value_cache",
        "NB, BS, H, D",
        layout="dense_last",
        expect="{tuple(key_cache.shape)}",
        layout_hint=_NHD_HINT,
        **like,
    )
    return kc, vc


def _paged(dtype: dict[str, Any]) -> tuple[Arg, Rule, Arg]:
    """vLLM's paged layout: key [num_blocks, H, D // x, block_size, x] (x dense), value [num_blocks, H, D, block_size]."""
    expect = "the paged [num_blocks, {H}, {D} // x, block_size, x] with x dividing {D}"
    kc = Arg(
        "key_cache",
        "NB, H, DX, BS, X",
        layout="dense_last",
        expect=expect,
        layout_hint="has strides {{t}.stride()}; its x dimension must be dense",
        **dtype,
    )
    x = Rule(
        "X >= 1 and D % X == 0 and DX == D // X",
        "key_cache has shape {tuple(key_cache.shape)}, expected " + expect,
    )
    like = {"like": "key_cache"} if "dtypes" in dtype else dtype
    vc = Arg(
        "value_cache", "NB, H, D, BS", layout="strided", expect="the paged [{NB}, {H}, {D}, {BS}]", **like
    )
    return kc, x, vc


_OF_KEY = {"like": "key"}
_FP8_CACHE = {"dtypes": FP8, "device_of": "key"}
_ARGS = ("key", "value", "key_cache", "value_cache", "slot_mapping")
#: a cache of key's dtype: the scales' places hold slot_mapping (unread)
_PLAIN = (*_ARGS, "slot_mapping", "slot_mapping", "False")
_FP8 = (*_ARGS, "k_scale", "v_scale", "True")
CONTRACT = Forms(
    "reshape_and_cache",
    cases=(
        (
            (When("key_cache", ndim=5), When("key_cache", dtype="float8_e4m3fn")),
            Contract(
                "cache_paged_fp8",
                (_KEY, _HEADS, _VALUE, *_paged(_FP8_CACHE), *_SCALES, _SLOTS, _CUDA_LIMITS),
                kernel=_FP8,
            ),
        ),
        (
            (When("key_cache", ndim=5),),
            Contract(
                "cache_paged",
                (_KEY, _HEADS, _VALUE, *_paged(_OF_KEY), _NO_SCALES, _SLOTS, _CUDA_LIMITS),
                kernel=_PLAIN,
            ),
        ),
        (
            (When("key_cache", dtype="float8_e4m3fn"),),
            Contract(
                "cache_nhd_fp8",
                (_KEY, _HEADS, _VALUE, *_nhd(_FP8_CACHE), *_SCALES, _SLOTS, _CUDA_LIMITS),
                kernel=_FP8,
            ),
        ),
    ),
    default=Contract(
        "cache_nhd",
        (_KEY, _HEADS, _VALUE, *_nhd(_OF_KEY), _NO_SCALES, _SLOTS, _CUDA_LIMITS),
        kernel=_PLAIN,
        values_cpp="slots_ok(device_type, slot_mapping, key_cache.size(0) * key_cache.size(1))",
        values_header="opmux/kvcache_values.h",
    ),
)


def values(
    key: Tensor,
    value: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    slot_mapping: Tensor,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
) -> None:
    _blocks.slots_in_range(_OP, slot_mapping, key_cache.shape[0] * _block_size(key_cache))


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
    _blocks.slots_in_range(_OP, slot_mapping.cpu(), nb * bs)
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
    contract=CONTRACT,
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
    contract=_blocks.COPY_CONTRACT,
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
    contract=_blocks.SWAP_CONTRACT,
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
    contract=_blocks.MLA_CONTRACT,
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
    contract=_blocks.GATHER_CONTRACT,
    values=_blocks.gather_values,
    reference=_blocks.gather_reference,
    torch=_blocks.torch_gather,
    dtypes=("int32",),  # chosen by block_table: the cache may be of any dtype
    key_arg=2,
    tolerances=_EXACT,
)
