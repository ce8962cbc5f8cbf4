"""RMSNorm, fused residual-add RMSNorm, their Gemma (1 + w) variants and per-head qk_norm.

>>> import torch
>>> from opmux.kernels.ops.layernorm import rmsnorm
>>> rmsnorm(torch.ones(2, 8), torch.ones(8)).shape
torch.Size([2, 8])
"""

from __future__ import annotations

from typing import Any

__all__ = ["fused_add_rmsnorm", "gemma_fused_add_rmsnorm", "gemma_rmsnorm", "qk_norm", "rmsnorm"]


def __getattr__(name: str) -> Any:
    # torch and the op classes load on first use, so `import opmux.kernels.ops` stays cheap
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
