"""fp8 / int8 conversions shared by the compat modules (engine conventions, in torch)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from opmux.kernels.ops._torch import torch

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["FP8_MAX", "divide_into", "multiply_into", "ue8m0"]

FP8_MAX = 448.0


def divide_into(q: Tensor, x: Tensor, scale: Tensor) -> None:
    """``q = fp8(clamp(x / scale))``: IEEE fp32 division (vLLM's per-token and group quant)."""
    y = torch.div(x.float(), scale).clamp_(-FP8_MAX, FP8_MAX)
    q.copy_(y)


def multiply_into(q: Tensor, x: Tensor, scale: Tensor) -> None:
    """``q = fp8(clamp(x * (1 / scale)))``: the reciprocal once, then products (static and
    per-tensor quant in both engines)."""
    y = torch.mul(x.float(), torch.reciprocal(scale.float())).clamp_(-FP8_MAX, FP8_MAX)
    q.copy_(y)


def ue8m0(scale: Tensor) -> Tensor:
    """Round scales up to a power of two (the UE8M0 scale format), in place."""
    return scale.copy_(torch.exp2(torch.ceil(torch.log2(scale))))
