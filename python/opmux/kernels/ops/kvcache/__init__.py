"""Paged KV cache writes (vLLM's ``reshape_and_cache``, NHD layout).

>>> import torch
>>> from opmux.kernels.ops.kvcache import reshape_and_cache
>>> k = torch.ones(1, 2, 4); kc = torch.zeros(2, 4, 2, 4)
>>> reshape_and_cache(k, k, kc, kc.clone(), torch.tensor([5]))
>>> kc[1, 1].sum().item()
8.0
"""

from __future__ import annotations

from typing import Any

__all__ = ["reshape_and_cache"]


def __getattr__(name: str) -> Any:
    # torch and the op classes load on first use, so `import opmux.kernels.ops` stays cheap
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
