"""What a KV cache stores for the rows written into it, shared by every op that writes entries
(``reshape_and_cache`` in ``op.py``, ``concat_and_cache_mla`` in ``_blocks.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

__all__ = ["entries"]


def entries(x: Tensor, scale: Tensor | None, cache: Tensor) -> Tensor:
    """What the cache stores for rows ``x``: themselves, or fp8(x / scale) (an IEEE division,
    saturated to +-448; vLLM's convention) converted to the cache's dtype."""
    if scale is None:
        return x.to(cache.dtype)
    y = (x.float() / scale.float().reshape(())).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return y if cache.dtype == torch.float8_e4m3fn else y.to(cache.dtype)
