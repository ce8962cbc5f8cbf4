"""Rotary position embedding (vLLM style), in place on query and key.

>>> import torch
>>> from opmux.kernels.ops.rope import rotary_embedding
>>> q, k = torch.ones(2, 8), torch.ones(2, 8)
>>> rotary_embedding(torch.arange(2), q, k, 8, torch.ones(4, 8))
"""

from __future__ import annotations

from typing import Any

__all__ = ["rotary_embedding"]


def __getattr__(name: str) -> Any:
    # torch and the op classes load on first use, so `import opmux.kernels.ops` stays cheap
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
