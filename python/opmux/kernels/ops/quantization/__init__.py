"""fp8 (e4m3fn) and int8 quantization: per token, per tensor (dynamic or static), static block scales and per token group.

>>> import torch
>>> from opmux.kernels.ops.quantization import per_token_quant_fp8
>>> q, s = per_token_quant_fp8(torch.ones(2, 8))
>>> q.dtype, tuple(s.shape)
(torch.float8_e4m3fn, (2, 1))
"""

from .._group import exports

__all__, __getattr__ = exports(__name__)
