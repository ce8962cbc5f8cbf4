"""Dynamic fp8 (e4m3fn) quantization: per token and per token group.

>>> import torch
>>> from opmux.kernels.ops.quantization import per_token_quant_fp8
>>> q, s = per_token_quant_fp8(torch.ones(2, 8))
>>> q.dtype, tuple(s.shape)
(torch.float8_e4m3fn, (2, 1))
"""

from __future__ import annotations

from typing import Any

__all__ = ["per_token_group_quant_fp8", "per_token_quant_fp8"]


def __getattr__(name: str) -> Any:
    # torch and the op classes load on first use, so `import opmux.kernels.ops` stays cheap
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
