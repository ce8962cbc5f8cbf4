"""Public layernorm ops: eager calls dispatch directly; torch.compile sees torch library ops."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import torch

from ...fused_op import BaseFusedOp
from .op import (
    FusedAddRMSNorm,
    GemmaFusedAddRMSNorm,
    GemmaRMSNorm,
    QKNorm,
    RMSNorm,
    _check_add,
    _check_qk,
    _check_rmsnorm,
)

__all__ = ["fused_add_rmsnorm", "gemma_fused_add_rmsnorm", "gemma_rmsnorm", "qk_norm", "rmsnorm"]

_rms = RMSNorm()
_add = FusedAddRMSNorm()
_gemma_rms = GemmaRMSNorm()
_gemma_add = GemmaFusedAddRMSNorm()
_qk = QKNorm()
# bound once: dynamo folds this function to True while tracing; eager pays one call
_compiling = torch.compiler.is_compiling
Backend = str | Sequence[str] | None
Overload = Callable[..., object]


def _register_norm(name: str, op: BaseFusedOp[torch.Tensor]) -> tuple[Overload, Overload]:
    """``opmux::<name>`` (new tensor) and ``opmux::<name>_out`` (writes ``out``) with fake impls;
    returns their overloads, which is what a compiled graph calls."""

    @torch.library.custom_op(f"opmux::{name}", mutates_args=())
    def functional(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return cast(torch.Tensor, op(x, weight, eps))

    @functional.register_fake
    def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        _check_rmsnorm(op.op_name, x, weight, None)
        return torch.empty_like(x)

    @torch.library.custom_op(f"opmux::{name}_out", mutates_args=("out",))
    def with_out(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
        op(x, weight, eps, out)

    @with_out.register_fake
    def _(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
        _check_rmsnorm(op.op_name, x, weight, out)

    return getattr(torch.ops.opmux, name).default, getattr(torch.ops.opmux, f"{name}_out").default


def _register_add(name: str, op: BaseFusedOp[None]) -> Overload:
    @torch.library.custom_op(f"opmux::{name}", mutates_args=("x", "residual"))
    def fused(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
        op(x, residual, weight, eps)

    @fused.register_fake
    def _(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
        _check_add(op.op_name, x, residual, weight)

    return cast(Overload, getattr(torch.ops.opmux, name).default)


@torch.library.custom_op("opmux::qk_norm", mutates_args=("q", "k"))
def _qk_norm_op(
    q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float
) -> None:
    _qk(q, k, q_weight, k_weight, eps)


@_qk_norm_op.register_fake
def _(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float) -> None:
    _check_qk(q, k, q_weight, k_weight)


_rms_ops = _register_norm("rmsnorm", _rms)
_gemma_rms_ops = _register_norm("gemma_rmsnorm", _gemma_rms)
_add_op = _register_add("fused_add_rmsnorm", _add)
_gemma_add_op = _register_add("gemma_fused_add_rmsnorm", _gemma_add)


def _norm(
    op: BaseFusedOp[torch.Tensor],
    ops: tuple[Overload, Overload],
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor | None,
    backend: Backend,
) -> torch.Tensor:
    if _compiling():
        if out is None:
            return ops[0](x, weight, eps)  # type: ignore[return-value]
        ops[1](out, x, weight, eps)
        return out
    return op(x, weight, eps, out, backend=backend)  # type: ignore[no-any-return]


def _fused_add(
    op: BaseFusedOp[None],
    overload: Overload,
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    backend: Backend,
) -> None:
    if _compiling():
        overload(x, residual, weight, eps)
        return
    op(x, residual, weight, eps, backend=backend)


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
    fn = None if backend is not None or _compiling() else _rms.lookup(x)
    if fn is not None:  # the hot path: a cached backend, called directly
        return fn(x, weight, eps, out)
    return _norm(_rms, _rms_ops, x, weight, eps, out, backend)


def fused_add_rmsnorm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    backend: Backend = None,
) -> None:
    """In place: ``residual += x``, then ``x = rmsnorm(residual, weight, eps)``."""
    fn = None if backend is not None or _compiling() else _add.lookup(x)
    if fn is not None:  # the hot path: a cached backend, called directly
        fn(x, residual, weight, eps)
        return
    _fused_add(_add, _add_op, x, residual, weight, eps, backend)


def gemma_rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    *,
    backend: Backend = None,
) -> torch.Tensor:
    """Gemma RMSNorm: ``x * rsqrt(mean(x**2) + eps) * (1 + weight)``, all in fp32."""
    fn = None if backend is not None or _compiling() else _gemma_rms.lookup(x)
    if fn is not None:  # the hot path: a cached backend, called directly
        return fn(x, weight, eps, out)
    return _norm(_gemma_rms, _gemma_rms_ops, x, weight, eps, out, backend)


def gemma_fused_add_rmsnorm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    backend: Backend = None,
) -> None:
    """In place: ``residual += x``, then ``x = gemma_rmsnorm(residual, weight, eps)``."""
    fn = None if backend is not None or _compiling() else _gemma_add.lookup(x)
    if fn is not None:  # the hot path: a cached backend, called directly
        fn(x, residual, weight, eps)
        return
    _fused_add(_gemma_add, _gemma_add_op, x, residual, weight, eps, backend)


def qk_norm(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    backend: Backend = None,
) -> None:
    """In place: RMSNorm of every head of ``q`` [..., Hq, D] and ``k`` [..., Hk, D] over D, with
    ``q_weight`` / ``k_weight`` [D] (fp32 math). One kernel launch for both on CUDA."""
    fn = None if backend is not None or _compiling() else _qk.lookup(q)
    if fn is not None:  # the hot path: a cached backend, called directly
        fn(q, k, q_weight, k_weight, eps)
        return
    if _compiling():
        torch.ops.opmux.qk_norm(q, k, q_weight, k_weight, eps)
        return
    _qk(q, k, q_weight, k_weight, eps, backend=backend)
