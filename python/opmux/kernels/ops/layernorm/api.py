"""Public layernorm ops: eager calls dispatch directly; torch.compile sees torch library ops."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .op import FusedAddRMSNorm, RMSNorm, _check_add, _check_rmsnorm

__all__ = ["fused_add_rmsnorm", "rmsnorm"]

_rms = RMSNorm()
_add = FusedAddRMSNorm()
# bound once: dynamo folds this function to True while tracing; eager pays one call
_compiling = torch.compiler.is_compiling
Backend = str | Sequence[str] | None


@torch.library.custom_op("opmux::rmsnorm", mutates_args=())
def _rmsnorm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _rms(x, weight, eps)


@_rmsnorm_op.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    _check_rmsnorm(RMSNorm.op_name, x, weight, None)
    return torch.empty_like(x)


@torch.library.custom_op("opmux::rmsnorm_out", mutates_args=("out",))
def _rmsnorm_out_op(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    _rms(x, weight, eps, out)


@_rmsnorm_out_op.register_fake
def _(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    _check_rmsnorm(RMSNorm.op_name, x, weight, out)


@torch.library.custom_op("opmux::fused_add_rmsnorm", mutates_args=("x", "residual"))
def _fused_add_rmsnorm_op(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    _add(x, residual, weight, eps)


@_fused_add_rmsnorm_op.register_fake
def _(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    _check_add(FusedAddRMSNorm.op_name, x, residual, weight)


def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    *,
    backend: Backend = None,
) -> torch.Tensor:
    """RMSNorm over the last dim: ``x * rsqrt(mean(x**2) + eps) * weight``, computed in fp32.

    ``backend`` forces a backend (or an ordered list) for this call, validated like
    ``OPMUX_KERNEL_BACKEND``; with ``out`` the result is written there and returned.
    """
    if _compiling():
        if out is None:
            return torch.ops.opmux.rmsnorm(x, weight, eps)
        torch.ops.opmux.rmsnorm_out(out, x, weight, eps)
        return out
    return _rms(x, weight, eps, out, backend=backend)


def fused_add_rmsnorm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    backend: Backend = None,
) -> None:
    """In place: ``residual += x``, then ``x = rmsnorm(residual, weight, eps)``."""
    if _compiling():
        torch.ops.opmux.fused_add_rmsnorm(x, residual, weight, eps)
        return
    _add(x, residual, weight, eps, backend=backend)
