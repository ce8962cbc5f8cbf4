"""Gated activations: ``act(x[..., :d]) * x[..., d:]`` for SiLU (SwiGLU), GELU and GELU-tanh (GeGLU).

>>> import torch
>>> from opmux.kernels.ops.activation import silu_and_mul
>>> silu_and_mul(torch.ones(2, 8)).shape
torch.Size([2, 4])
"""

from __future__ import annotations

from typing import Any

__all__ = ["gelu_and_mul", "gelu_tanh_and_mul", "silu_and_mul"]


def __getattr__(name: str) -> Any:
    # torch and the op classes load on first use, so `import opmux.kernels.ops` stays cheap
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
