"""Matrix products of serving engines' linear layers: ``w8a8_block_fp8_matmul`` (DeepSeek-V3's
fp8 recipe: 1x128 activation scales, 128x128 weight scales).

>>> import torch
>>> from opmux.kernels.ops.gemm import w8a8_block_fp8_matmul
>>> a = torch.ones(2, 256).to(torch.float8_e4m3fn)
>>> b = torch.ones(128, 256).to(torch.float8_e4m3fn)
>>> w8a8_block_fp8_matmul(a, b, torch.ones(2, 2), torch.ones(1, 2), backend="torch")[0, :3]
tensor([256., 256., 256.], dtype=torch.bfloat16)
"""

from .._group import exports

__all__, __getattr__ = exports(__name__)
