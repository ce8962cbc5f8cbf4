"""Sampling, the last op of a decode step: top-k / top-p renormalisation, top-k masking of logits,
greedy ids, and top-k / top-p / min-p sampling with a Philox seed and offset.

>>> import torch
>>> from opmux.kernels.ops.sampling import greedy, top_k_renorm_probs
>>> greedy(torch.tensor([[0.0, 2.0, 2.0, 1.0]])).tolist()
[1]
>>> [round(v, 4) for v in top_k_renorm_probs(torch.tensor([[0.1, 0.4, 0.2, 0.3]]), top_k=2)[0].tolist()]
[0.0, 0.5714, 0.0, 0.4286]
"""

from .._group import exports

__all__, __getattr__ = exports(__name__)
