"""Rotary position embedding (vLLM style), in place on query and key.

>>> import torch
>>> from opmux.kernels.ops.rope import rotary_embedding
>>> q, k = torch.ones(2, 8), torch.ones(2, 8)
>>> rotary_embedding(torch.arange(2), q, k, 8, torch.ones(4, 8))
"""

from .._group import exports

__all__, __getattr__ = exports(__name__)
