"""RMSNorm ops: the reference and every backend, as static methods the spec points at."""

from __future__ import annotations

import torch

from ...fused_op import BaseFusedOp
from .. import _checks, _native

_RMS = "layernorm.rmsnorm"
_ADD = "layernorm.fused_add_rmsnorm"


def _check_rmsnorm(op: str, x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _checks.tensor(op, "x", x)
    _checks.tensor(op, "weight", weight)
    _checks.float_dtype(op, "x", x)
    hidden = x.shape[-1] if x.dim() else 0
    if weight.dim() != 1 or weight.shape[0] != hidden:
        raise ValueError(f"{op}: weight has shape {tuple(weight.shape)}, expected [{hidden}] (x's last dim)")
    _checks.same_dtype(op, "x", x, weight=weight)
    _checks.same_device(op, "x", x, weight=weight)
    if out is None:
        out = torch.empty_like(x)
    else:
        _checks.tensor(op, "out", out)
        if out.shape != x.shape:
            raise ValueError(f"{op}: out has shape {tuple(out.shape)}, expected {tuple(x.shape)} like x")
        _checks.same_dtype(op, "x", x, out=out)
        _checks.same_device(op, "x", x, out=out)
    return _checks.rows(op, "x", x, hidden), _checks.rows(op, "out", out, hidden), out


def _check_add(op: str, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    _checks.tensor(op, "residual", residual)
    x2, _, _ = _check_rmsnorm(op, x, weight, x)
    if residual.shape != x.shape:
        raise ValueError(f"{op}: residual has shape {tuple(residual.shape)}, expected {tuple(x.shape)} like x")
    _checks.same_dtype(op, "x", x, residual=residual)
    _checks.same_device(op, "x", x, residual=residual)
    return x2, _checks.rows(op, "residual", residual, x.shape[-1])


def _device(x: torch.Tensor) -> str:
    return "cuda" if x.is_cuda else "cpu"


class RMSNorm(BaseFusedOp):
    op_name = _RMS

    @staticmethod
    def forward_native(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None) -> torch.Tensor:
        xf = x.float()
        y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)
        if out is None:
            return y
        return out.copy_(y)

    @staticmethod
    def forward_torch(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None) -> torch.Tensor:
        y = torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(x.dtype)
        return y if out is None else out.copy_(y)

    @staticmethod
    def forward_triton(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None) -> torch.Tensor:
        x2, o2, out = _check_rmsnorm(_RMS, x, weight, out)
        from . import triton_kernels

        triton_kernels.rmsnorm(x2, weight, eps, o2, None)
        return out

    @staticmethod
    def forward_jit(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None) -> torch.Tensor:
        x2, o2, out = _check_rmsnorm(_RMS, x, weight, out)
        d = _device(x)
        _native.function("jit", "layernorm", d, f"rmsnorm_{d}")(o2, x2, weight, float(eps))
        return out

    @staticmethod
    def forward_aot(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None) -> torch.Tensor:
        x2, o2, out = _check_rmsnorm(_RMS, x, weight, out)
        d = _device(x)
        _native.function("aot", "layernorm", d, f"rmsnorm_{d}")(o2, x2, weight, float(eps))
        return out

    @staticmethod
    def forward_torch_npu(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None) -> torch.Tensor:
        import torch_npu  # vendor library, present only on Ascend hosts

        y = torch_npu.npu_rms_norm(x, weight, epsilon=eps)[0]
        return y if out is None else out.copy_(y)


class FusedAddRMSNorm(BaseFusedOp):
    op_name = _ADD

    @staticmethod
    def forward_native(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> None:
        residual.copy_((x.float() + residual.float()).to(residual.dtype))
        x.copy_(RMSNorm.forward_native(residual, weight, eps))

    @staticmethod
    def forward_torch(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> None:
        residual.add_(x)
        x.copy_(RMSNorm.forward_torch(residual, weight, eps))

    @staticmethod
    def forward_triton(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> None:
        x2, r2 = _check_add(_ADD, x, residual, weight)
        from . import triton_kernels

        triton_kernels.rmsnorm(x2, weight, eps, x2, r2)

    @staticmethod
    def forward_jit(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> None:
        x2, r2 = _check_add(_ADD, x, residual, weight)
        d = _device(x)
        _native.function("jit", "layernorm", d, f"fused_add_rmsnorm_{d}")(x2, r2, weight, float(eps))

    @staticmethod
    def forward_aot(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> None:
        x2, r2 = _check_add(_ADD, x, residual, weight)
        d = _device(x)
        _native.function("aot", "layernorm", d, f"fused_add_rmsnorm_{d}")(x2, r2, weight, float(eps))

    @staticmethod
    def forward_torch_npu(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> None:
        import torch_npu  # vendor library, present only on Ascend hosts

        residual.add_(x)
        x.copy_(torch_npu.npu_rms_norm(residual, weight, epsilon=eps)[0])
