"""Tensor-parallel communication over a torch.distributed group the caller created: all-reduce,
alone and fused with the residual add, RMSNorm and per-token fp8 quantization after it.

>>> import torch, torch.distributed as dist
>>> from opmux.kernels.ops import comm
>>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
>>> comm.all_reduce(torch.ones(2, 4), dist.group.WORLD.group_name).tolist()
[[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]]
>>> dist.destroy_process_group()
"""

from .._group import exports

__all__, __getattr__ = exports(__name__)
