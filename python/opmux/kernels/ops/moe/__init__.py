"""Mixture-of-experts routing: top-k softmax or sigmoid gating, block alignment of the routed tokens
(sorted by expert, or vLLM's batched layout).

>>> import torch
>>> from opmux.kernels.ops.moe import topk_softmax
>>> w, ids = topk_softmax(torch.tensor([[0.0, 1.0, 2.0]]), 2)
>>> ids.tolist()
[[2, 1]]
"""

from .._group import exports

__all__, __getattr__ = exports(__name__)
