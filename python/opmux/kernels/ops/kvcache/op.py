"""reshape_and_cache: one declaration (``ops/_decl.py``); kernel arguments are the op's own.

Layout (vLLM NHD): ``key``/``value`` ``[T, H, D]`` (last dim contiguous; token and head strides
free, e.g. slices of a fused qkv tensor); ``key_cache``/``value_cache`` ``[num_blocks,
block_size, H, D]`` with each block dense (the block stride is free); ``slot_mapping`` int64
``[T]``, ``slot = block * block_size + offset``; a negative slot (vLLM pads with -1) skips the
token. Slots must be distinct (which token lands in a repeated slot is unspecified).

Out-of-range slots (``>= num_blocks * block_size`` or ``< -1``): CPU tensors raise ValueError
naming the first bad slot BEFORE anything is written. CUDA kernels do not check on the host
(that would synchronise) and instead skip such tokens, so they never write out of bounds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import _checks
from .._decl import declare

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

_OP = "kvcache.reshape_and_cache"


def _check_slots(slot_mapping: Tensor, num_slots: int) -> None:
    if slot_mapping.is_cpu and slot_mapping.numel():
        lo, hi = torch.aminmax(slot_mapping)  # one pass; the rest only when something is wrong
        if int(lo) >= -1 and int(hi) < num_slots:
            return
        bad = ((slot_mapping < -1) | (slot_mapping >= num_slots)).nonzero()
        if bad.numel():
            t = int(bad[0, 0])
            raise ValueError(
                f"{_OP}: slot_mapping[{t}] = {int(slot_mapping[t])} is out of range: "
                f"valid slots are [0, {num_slots}) (num_blocks * block_size), or -1 to skip"
            )


def check(
    op: str, key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor, slot_mapping: Tensor
) -> tuple[tuple[Any, ...], None]:
    for name, arg in (
        ("key", key),
        ("value", value),
        ("key_cache", key_cache),
        ("value_cache", value_cache),
        ("slot_mapping", slot_mapping),
    ):
        _checks.tensor(_OP, name, arg)
    _checks.float_dtype(_OP, "key", key)
    _checks.same_dtype(_OP, "key", key, value=value, key_cache=key_cache, value_cache=value_cache)
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
    if key_cache.dim() != 4 or key_cache.shape[2:] != (h, d):
        raise ValueError(
            f"{_OP}: key_cache has shape {tuple(key_cache.shape)}, expected [num_blocks, block_size, {h}, {d}]"
        )
    if value_cache.shape != key_cache.shape:
        raise ValueError(
            f"{_OP}: value_cache has shape {tuple(value_cache.shape)}, expected {tuple(key_cache.shape)}"
        )
    if slot_mapping.shape != (t,):
        raise ValueError(f"{_OP}: slot_mapping has shape {tuple(slot_mapping.shape)}, expected [{t}]")
    for name, x in (("key", key), ("value", value), ("slot_mapping", slot_mapping)):
        if x.shape[-1] > 1 and x.stride(-1) != 1:
            raise ValueError(
                f"{_OP}: {name} has a non-contiguous last dimension (stride {x.stride(-1)}); pass .contiguous()"
            )
    key_cache.shape[1]
    for name, c in (("key_cache", key_cache), ("value_cache", value_cache)):
        dense = all(c.stride(i) == s for i, s in ((1, h * d), (2, d), (3, 1)) if c.shape[i] > 1)
        if not dense or c.stride(0) < 0:
            raise ValueError(
                f"{_OP}: {name} is non-contiguous within a block (strides {c.stride()}); "
                f"each [block_size, H, D] block must be dense"
            )
    return (key, value, key_cache, value_cache, slot_mapping), None


def values(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor, slot_mapping: Tensor) -> None:
    _check_slots(slot_mapping, key_cache.shape[0] * key_cache.shape[1])


def reference(
    key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor, slot_mapping: Tensor
) -> None:
    nb, bs = key_cache.shape[:2]
    _check_slots(slot_mapping.cpu(), nb * bs)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    key_cache[slots // bs, slots % bs] = key[keep].to(key_cache.dtype)
    value_cache[slots // bs, slots % bs] = value[keep].to(value_cache.dtype)


def torch_write(
    key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor, slot_mapping: Tensor
) -> None:
    nb, bs = key_cache.shape[:2]
    keep = (slot_mapping >= 0) & (slot_mapping < nb * bs)  # CUDA: skip bad slots (CPU raised)
    slots = slot_mapping[keep]
    blk, off = slots // bs, slots % bs
    key_cache.index_put_((blk, off), key[keep])
    value_cache.index_put_((blk, off), value[keep])


reshape_and_cache = declare(
    _OP,
    "(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(a!) value_cache, Tensor slot_mapping) -> ()",
    doc="key/value [T, H, D] -> key_cache/value_cache[slot // bs, slot % bs] (slot -1: skip)",
    check=check,
    values=values,
    reference=reference,
    torch=torch_write,
    # a copy: every backend must be bit-exact
    tolerances=(("float32", (0.0, 0.0)), ("float16", (0.0, 0.0)), ("bfloat16", (0.0, 0.0))),
)
