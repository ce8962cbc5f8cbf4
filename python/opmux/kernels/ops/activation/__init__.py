"""Gated activations: ``act(x[..., :d]) * x[..., d:]`` for silu, gelu (erf) and gelu (tanh).

>>> import torch
>>> from opmux.kernels.ops.activation import silu_and_mul
>>> silu_and_mul(torch.ones(2, 8)).shape
torch.Size([2, 4])
"""

from .._group import exports

__all__, __getattr__ = exports(__name__)
