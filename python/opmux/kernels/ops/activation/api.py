"""Public activation ops: eager calls dispatch directly; torch.compile sees torch library ops."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .op import SiluAndMul, _check

__all__ = ["silu_and_mul"]

_op = SiluAndMul()
# bound once: dynamo folds this function to True while tracing; eager pays one call
_compiling = torch.compiler.is_compiling


@torch.library.custom_op("opmux::silu_and_mul", mutates_args=())
def _silu_and_mul_op(x: torch.Tensor) -> torch.Tensor:
    return _op(x)


@_silu_and_mul_op.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return _check(x, None)[2]


@torch.library.custom_op("opmux::silu_and_mul_out", mutates_args=("out",))
def _silu_and_mul_out_op(out: torch.Tensor, x: torch.Tensor) -> None:
    _op(x, out)


@_silu_and_mul_out_op.register_fake
def _(out: torch.Tensor, x: torch.Tensor) -> None:
    _check(x, out)


def silu_and_mul(
    x: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    backend: str | Sequence[str] | None = None,
) -> torch.Tensor:
    """``silu(x[..., :d]) * x[..., d:]`` for ``x`` of shape ``[..., 2*d]``, computed in fp32."""
    if _compiling():
        if out is None:
            return torch.ops.opmux.silu_and_mul(x)
        torch.ops.opmux.silu_and_mul_out(out, x)
        return out
    return _op(x, out, backend=backend)
