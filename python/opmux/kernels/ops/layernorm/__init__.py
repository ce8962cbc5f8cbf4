"""RMSNorm, fused residual-add RMSNorm, their Gemma (1 + w) variants and per-head qk_norm.

>>> import torch
>>> from opmux.kernels.ops.layernorm import rmsnorm
>>> rmsnorm(torch.ones(2, 8), torch.ones(8)).shape
torch.Size([2, 8])
"""

from .._group import exports

__all__, __getattr__ = exports(__name__)
