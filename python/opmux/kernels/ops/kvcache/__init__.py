"""Paged KV cache ops: writes (vLLM's ``reshape_and_cache``, MLA's ``concat_and_cache_mla``), block
copies and swaps (``copy_blocks``, ``swap_blocks``) and ``gather_cache``.

>>> import torch
>>> from opmux.kernels.ops.kvcache import reshape_and_cache
>>> k = torch.ones(1, 2, 4); kc = torch.zeros(2, 4, 2, 4)
>>> reshape_and_cache(k, k, kc, kc.clone(), torch.tensor([5]))
>>> kc[1, 1].sum().item()
8.0
"""

from .._group import exports

__all__, __getattr__ = exports(__name__)
