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

from .._contract import FP8, Arg, Contract, Rule
from ..quantization.op import FP8_MAX, _to_fp8
from . import _contract_items as _ln_c
from . import _rms

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

Kernel = tuple[tuple[Any, ...], Any]


# -- the contracts (their checks are generated into _contracts.py) ---------------------------
_SCALE = Arg(
    "scale", "", dtypes=("float32",), device_of="x", layout="element", note=" (a per-tensor static scale)"
)
_Q = Arg("out", "=x", dtypes=FP8, device_of="x", out=True, kernel_dtype="uint8")
#: q = e4m3(norm(x) / scale): kernel arguments (q, x, weight, scale, eps)
NORM_QUANT = Contract(
    "norm_quant",
    (_ln_c.X, _ln_c.WEIGHT, _ln_c.EPS, _ln_c.CUDA_HIDDEN, _SCALE, _Q),
    kernel=("out", "x", "weight", "scale", "eps"),
    result="out",
)
#: residual += x; q = e4m3(norm(residual) / scale): kernel arguments (q, x, residual, weight, scale, eps)
ADD_QUANT = Contract(
    "add_quant",
    (
        _ln_c.X,
        _ln_c.WEIGHT,
        _ln_c.EPS,
        _ln_c.CUDA_HIDDEN,
        _ln_c.RESIDUAL,
        Rule(
            "not _checks.same_address(x, residual)",
            "x and residual must be different tensors (residual is updated in place, x is read)",
        ),
        _SCALE,
        _Q,
    ),
    kernel=("out", "x", "residual", "weight", "scale", "eps"),
    result="out",
)


# -- the reference (fp32 math; also run in float64 as the parity oracle) ---------------------
def _ref_quant(y: Tensor, scale: Tensor) -> Tensor:
    yf = y if y.dtype == torch.float64 else y.float()
    inv = scale.reshape(()).to(yf.dtype).reciprocal()
    return _to_fp8(yf * inv)


def ref_norm_quant(
    x: Tensor, weight: Tensor, scale: Tensor, eps: float = 1e-6, out: Tensor | None = None
) -> Tensor:
    q = _ref_quant(_rms.ref(x, weight, eps, False), scale)
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
    q = _ref_quant(_rms.ref(residual, weight, eps, False), scale)
    return q if out is None else out.copy_(q)


# -- the torch backend (kernel arguments) ----------------------------------------------------
def _quantize_into(q: Tensor, y: Tensor, scale: Tensor) -> None:
    q.view(torch.float8_e4m3fn).copy_(torch.clamp(y.float() * scale.reciprocal(), -FP8_MAX, FP8_MAX))


def torch_norm_quant(q: Tensor, x: Tensor, weight: Tensor, scale: Tensor, eps: float) -> None:
    _quantize_into(q, _rms.norm(x, weight, eps, False), scale)


def torch_add_quant(
    q: Tensor, x: Tensor, residual: Tensor, weight: Tensor, scale: Tensor, eps: float
) -> None:
    residual.add_(x)
    _quantize_into(q, _rms.norm(residual, weight, eps, False), scale)
