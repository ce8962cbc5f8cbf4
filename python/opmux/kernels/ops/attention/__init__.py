"""Attention over opmux's own paged KV cache (``kvcache.reshape_and_cache``'s layouts): paged decode,
one query token per sequence, and paged prefill (new tokens over a cached prefix, ragged batches),
with GQA / MQA, softcap, a sliding window, attention sinks and fp8 caches.

>>> import torch
>>> from opmux.kernels.ops.attention import paged_decode
>>> q = torch.ones(1, 2, 8); kc = torch.ones(3, 4, 1, 8); vc = torch.full((3, 4, 1, 8), 2.0)
>>> paged_decode(q, kc, vc, torch.tensor([[2, 0]], dtype=torch.int32), torch.tensor([5], dtype=torch.int32))[0, 1, :3]
tensor([2., 2., 2.])
>>> from opmux.kernels.ops.attention import paged_prefill
>>> q3 = torch.ones(3, 2, 8); cu = torch.tensor([0, 3], dtype=torch.int32)
>>> paged_prefill(q3, kc, vc, torch.tensor([[2, 0]], dtype=torch.int32), torch.tensor([5], dtype=torch.int32), cu).shape
torch.Size([3, 2, 8])
"""

from .._group import exports

__all__, __getattr__ = exports(__name__)
