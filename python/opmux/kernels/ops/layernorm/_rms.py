"""RMSNorm's math, shared by the norms (``op.py``) and the norms with an fp8 epilogue
(``_quant.py``): the reference, and the torch backends' ``rms_norm``."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

__all__ = ["norm", "ref"]


def ref(x: Tensor, weight: Tensor, eps: float, gemma: bool) -> Tensor:
    """The reference: in float32 (float64 kept), ``(1 + weight)`` for Gemma."""
    xf = x.float() if x.dtype != torch.float64 else x
    w = weight.to(xf.dtype) + 1.0 if gemma else weight.to(xf.dtype)
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w).to(x.dtype)


def norm(x: Tensor, weight: Tensor, eps: float, gemma: bool) -> Tensor:
    """The torch backends' RMSNorm: ``torch.nn.functional.rms_norm`` in float32."""
    w = weight.float() + 1.0 if gemma else weight.float()
    return torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), w, eps).to(x.dtype)
