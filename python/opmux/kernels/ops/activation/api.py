"""Public activation ops: eager calls dispatch directly; torch.compile sees torch library ops."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import torch

from ...fused_op import BaseFusedOp
from .op import GeluAndMul, GeluTanhAndMul, SiluAndMul, _check

__all__ = ["gelu_and_mul", "gelu_tanh_and_mul", "silu_and_mul"]

# bound once: dynamo folds this function to True while tracing; eager pays one call
_compiling = torch.compiler.is_compiling
Backend = str | Sequence[str] | None


def _register(
    name: str, op: BaseFusedOp[torch.Tensor]
) -> tuple[Callable[..., torch.Tensor], Callable[..., None]]:
    """Registers ``opmux::<name>`` (returns a new tensor) and ``opmux::<name>_out`` (writes
    ``out``) with fake impls; returns their overloads, which is what a compiled graph calls."""

    @torch.library.custom_op(f"opmux::{name}", mutates_args=())
    def functional(x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, op(x))

    @functional.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:
        return _check(op.op_name, x, None)[2]

    @torch.library.custom_op(f"opmux::{name}_out", mutates_args=("out",))
    def with_out(out: torch.Tensor, x: torch.Tensor) -> None:
        op(x, out)

    @with_out.register_fake
    def _(out: torch.Tensor, x: torch.Tensor) -> None:
        _check(op.op_name, x, out)

    return getattr(torch.ops.opmux, name).default, getattr(torch.ops.opmux, f"{name}_out").default


_silu = SiluAndMul()
_gelu = GeluAndMul()
_gelu_tanh = GeluTanhAndMul()
_silu_ops = _register("silu_and_mul", _silu)
_gelu_ops = _register("gelu_and_mul", _gelu)
_gelu_tanh_ops = _register("gelu_tanh_and_mul", _gelu_tanh)


def _call(
    op: BaseFusedOp[torch.Tensor],
    ops: tuple[Callable[..., torch.Tensor], Callable[..., None]],
    x: torch.Tensor,
    out: torch.Tensor | None,
    backend: Backend,
) -> torch.Tensor:
    if _compiling():
        if out is None:
            return ops[0](x)
        ops[1](out, x)
        return out
    return cast(torch.Tensor, op(x, out, backend=backend))


def silu_and_mul(
    x: torch.Tensor, out: torch.Tensor | None = None, *, backend: Backend = None
) -> torch.Tensor:
    """``silu(x[..., :d]) * x[..., d:]`` for ``x`` of shape ``[..., 2*d]``, computed in fp32."""
    fn = None if backend is not None or _compiling() else _silu.lookup(x)
    if fn is not None:  # the hot path: a cached backend, called directly
        return fn(x, out)
    return _call(_silu, _silu_ops, x, out, backend)


def gelu_and_mul(
    x: torch.Tensor, out: torch.Tensor | None = None, *, backend: Backend = None
) -> torch.Tensor:
    """``gelu(x[..., :d]) * x[..., d:]`` with the exact (erf) gelu, computed in fp32."""
    fn = None if backend is not None or _compiling() else _gelu.lookup(x)
    if fn is not None:  # the hot path: a cached backend, called directly
        return fn(x, out)
    return _call(_gelu, _gelu_ops, x, out, backend)


def gelu_tanh_and_mul(
    x: torch.Tensor, out: torch.Tensor | None = None, *, backend: Backend = None
) -> torch.Tensor:
    """``gelu(x[..., :d], approximate="tanh") * x[..., d:]``, computed in fp32."""
    fn = None if backend is not None or _compiling() else _gelu_tanh.lookup(x)
    if fn is not None:  # the hot path: a cached backend, called directly
        return fn(x, out)
    return _call(_gelu_tanh, _gelu_tanh_ops, x, out, backend)
