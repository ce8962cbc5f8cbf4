"""Mixture-of-experts routing: top-k softmax gating and block alignment of the routed tokens.

>>> import torch
>>> from opmux.kernels.ops.moe import topk_softmax
>>> w, ids = topk_softmax(torch.tensor([[0.0, 1.0, 2.0]]), 2)
>>> ids.tolist()
[[2, 1]]
"""

from __future__ import annotations

from typing import Any

__all__ = ["moe_align_block_size", "topk_softmax"]


def __getattr__(name: str) -> Any:
    # torch and the op classes load on first use, so `import opmux.kernels.ops` stays cheap
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
