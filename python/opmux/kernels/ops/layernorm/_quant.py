"""RMSNorm (and fused residual-add RMSNorm) with static fp8 quantization: the contract, the
reference and the torch backend of ``rmsnorm_static_quant_fp8`` and
``fused_add_rmsnorm_static_quant_fp8`` (declared in ``op.py``).

Semantics, every backend: ``y = rmsnorm(x, weight, eps)`` exactly as ``layernorm.rmsnorm``
computes and rounds it (x's dtype), then ``q = e4m3(y * (1 / scale))`` as
``quantization.static_quant_fp8`` does (the reciprocal is an IEEE fp32 division; the fp8
conversion rounds to nearest even and saturates to +-448; NaN stays NaN). So on one backend
``q`` is bit-equal to ``static_quant_fp8(rmsnorm(x, weight, eps), scale)`` (vLLM's
``rms_norm_static_fp8_quant`` test compares them within 1e-3), and the fused add is
``residual += x`` (rounded to residual's dtype, in place) followed by the same on the residual
as stored; x is only read and must be another tensor than residual (as for fused_add_rmsnorm). ``scale`` is one float32 element (a per-tensor static scale).

Kernel arguments: ``(q, x, weight, scale, eps)`` and ``(q, x, residual, weight, scale, eps)``:
q the uint8 view of the fp8 output as [T, H] rows, x and residual [T, H] rows with a unit last
stride, weight dense [H], scale a [1] float32 view, eps > 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import _checks
from ..quantization.op import FP8_MAX, _out_q, _to_fp8
from . import op as _ln  # rmsnorm's contract and math; op.py imports this module (read at call time)

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

Kernel = tuple[tuple[Any, ...], Any]


# -- the contract ---------------------------------------------------------------------------
def _scale(op: str, x: Tensor, scale: Tensor) -> Tensor:
    """The static per-tensor scale: one float32 element on x's device, as a [1] view."""
    _checks.tensor(op, "scale", scale)
    _checks.exact_dtype(op, "scale", scale, torch.float32)
    if scale.numel() != 1:
        raise ValueError(
            f"{op}: scale has shape {tuple(scale.shape)}, expected one element (a per-tensor static scale)"
        )
    _checks.same_device(op, "x", x, scale=scale)
    return scale.reshape(1)


def _q(op: str, x: Tensor, out: Tensor | None, hidden: int) -> tuple[Tensor, Tensor]:
    """(the fp8 result, its uint8 [T, H] rows view for the kernels)."""
    if out is None:
        q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
        q2 = q.view(-1, hidden) if x.dim() != 2 else q
    else:
        q, q2 = out, _out_q(op, x, out, hidden, torch.float8_e4m3fn, "out")
    return q, q2.view(torch.uint8)


def check_norm_quant(
    op: str, x: Tensor, weight: Tensor, scale: Tensor, eps: float = 1e-6, out: Tensor | None = None
) -> Kernel:
    hidden = _ln._x_weight(op, x, weight, eps)
    s1 = _scale(op, x, scale)
    x2 = _checks.rows(op, "x", x, hidden)
    q, q2 = _q(op, x, out, hidden)
    return (q2, x2, weight, s1, float(eps)), q


def check_add_quant(
    op: str,
    x: Tensor,
    residual: Tensor,
    weight: Tensor,
    scale: Tensor,
    eps: float = 1e-6,
    out: Tensor | None = None,
) -> Kernel:
    (x2, r2, w, e), _ = _ln.check_add(op, x, residual, weight, eps)
    # partial overlaps: the generated alias check; fakes (torch.compile) are checked at the real call
    if x2.numel() and not _checks.is_fake(x2) and x2.data_ptr() == r2.data_ptr():
        raise ValueError(
            f"{op}: x and residual must be different tensors (residual is updated in place, x is read)"
        )
    s1 = _scale(op, x, scale)
    q, q2 = _q(op, x, out, x2.shape[-1])
    return (q2, x2, r2, w, s1, e), q


# -- the reference (fp32 math; also run in float64 as the parity oracle) ---------------------
def _ref_quant(y: Tensor, scale: Tensor) -> Tensor:
    yf = y if y.dtype == torch.float64 else y.float()
    inv = scale.reshape(()).to(yf.dtype).reciprocal()
    return _to_fp8(yf * inv)


def ref_norm_quant(
    x: Tensor, weight: Tensor, scale: Tensor, eps: float = 1e-6, out: Tensor | None = None
) -> Tensor:
    q = _ref_quant(_ln._ref(x, weight, eps, False), scale)
    return q if out is None else out.copy_(q)


def ref_add_quant(
    x: Tensor,
    residual: Tensor,
    weight: Tensor,
    scale: Tensor,
    eps: float = 1e-6,
    out: Tensor | None = None,
) -> Tensor:
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    residual.copy_((x.to(acc) + residual).to(residual.dtype))
    q = _ref_quant(_ln._ref(residual, weight, eps, False), scale)
    return q if out is None else out.copy_(q)


# -- the torch backend (kernel arguments) ----------------------------------------------------
def _quantize_into(q: Tensor, y: Tensor, scale: Tensor) -> None:
    q.view(torch.float8_e4m3fn).copy_(torch.clamp(y.float() * scale.reciprocal(), -FP8_MAX, FP8_MAX))


def torch_norm_quant(q: Tensor, x: Tensor, weight: Tensor, scale: Tensor, eps: float) -> None:
    _quantize_into(q, _ln._norm(x, weight, eps, False), scale)


def torch_add_quant(
    q: Tensor, x: Tensor, residual: Tensor, weight: Tensor, scale: Tensor, eps: float
) -> None:
    residual.add_(x)
    _quantize_into(q, _ln._norm(residual, weight, eps, False), scale)
