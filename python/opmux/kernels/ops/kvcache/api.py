"""Public kvcache ops: eager calls dispatch directly; torch.compile sees torch library ops."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .op import ReshapeAndCache, _check

__all__ = ["reshape_and_cache"]

_op = ReshapeAndCache()
# bound once: dynamo folds this function to True while tracing; eager pays one call
_compiling = torch.compiler.is_compiling


@torch.library.custom_op("opmux::reshape_and_cache", mutates_args=("key_cache", "value_cache"))
def _reshape_and_cache_op(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    _op(key, value, key_cache, value_cache, slot_mapping)


@_reshape_and_cache_op.register_fake
def _(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    _check(key, value, key_cache, value_cache, slot_mapping, values=False)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    backend: str | Sequence[str] | None = None,
) -> None:
    """In place: ``key_cache[s // bs, s % bs] = key[t]`` (and value) for ``s = slot_mapping[t]``.

    NHD paged layout (see ``opmux.kernels.ops.kvcache.op``): key/value ``[T, H, D]``, caches
    ``[num_blocks, block_size, H, D]`` of key's dtype, slot_mapping int64 ``[T]``; slot -1 skips
    a padding token. Out-of-range slots: ValueError naming the slot on CPU (before any write);
    skipped on CUDA (no host check, no out-of-bounds write).
    """
    fn = None if backend is not None or _compiling() else _op.lookup(key)
    if fn is not None:  # the hot path: a cached backend, called directly
        fn(key, value, key_cache, value_cache, slot_mapping)
        return
    if _compiling():
        torch.ops.opmux.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
        return
    _op(key, value, key_cache, value_cache, slot_mapping, backend=backend)
