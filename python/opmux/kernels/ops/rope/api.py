"""Public rope op: eager calls dispatch directly; torch.compile sees a torch library op."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .op import RotaryEmbedding, _check

__all__ = ["rotary_embedding"]

_rope = RotaryEmbedding()
# bound once: dynamo folds this function to True while tracing; eager pays one call
_compiling = torch.compiler.is_compiling


@torch.library.custom_op("opmux::rotary_embedding", mutates_args=("query", "key"))
def _rotary_embedding_op(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> None:
    _rope(positions, query, key, head_size, cos_sin_cache, is_neox)


@_rotary_embedding_op.register_fake
def _(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> None:
    _check(positions, query, key, head_size, cos_sin_cache)


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
    *,
    backend: str | Sequence[str] | None = None,
) -> None:
    """In place, vLLM style: rotate ``query`` [T, Hq * head_size] or [T, Hq, head_size] and
    ``key`` (kv heads, same layouts) by ``cos_sin_cache[positions]`` ([max_position, rotary_dim],
    float32 or the query dtype: cos in the first half, sin in the second). ``positions`` is int64
    [T] (or any shape that leads query / key). Only the first ``rotary_dim`` elements of each
    head rotate; ``is_neox`` pairs i with i + rotary_dim / 2, else (GPT-J) 2i with 2i + 1.
    fp32 math. Out-of-range positions: ValueError on the CPU; NaN for that token on accelerators
    (no device sync; see ``op.py``)."""
    fn = None if backend is not None or _compiling() else _rope.lookup(query)
    if fn is not None:  # the hot path: a cached backend, called directly
        fn(positions, query, key, head_size, cos_sin_cache, is_neox)
        return
    if _compiling():
        torch.ops.opmux.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)
        return
    _rope(positions, query, key, head_size, cos_sin_cache, is_neox, backend=backend)
