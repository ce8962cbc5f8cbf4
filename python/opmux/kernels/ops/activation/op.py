"""Gated activations ``act(x[..., :d]) * x[..., d:]``: one declaration each (``ops/_decl.py``).

Kernel arguments: ``(out, x)`` with x a [T, 2d] and out a [T, d] view, unit last stride.
NaN and Inf propagate as in the reference.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from .. import _checks
from .._decl import declare, variant

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

Act = Callable[["torch.Tensor"], "torch.Tensor"]


def check(op: str, x: Tensor, out: Tensor | None = None) -> tuple[tuple[Any, ...], Tensor]:
    try:  # the serving call ([T, 2d] rows, no out), each attribute read once; else the full checks
        xs = x.shape
        if (
            out is None
            and len(xs) == 2
            and xs[1] % 2 == 0
            and x.dtype in _checks.FLOAT_DTYPES
            and (xs[1] == 0 or x.stride()[1] == 1)
            and isinstance(x, torch.Tensor)
        ):
            out = x.new_empty(xs[0], xs[1] // 2)  # x's dtype and device, dense
            return (out, x), out
    except Exception:  # not a tensor, ...: the full checks say what is wrong
        pass
    _checks.tensor(op, "x", x)
    _checks.float_dtype(op, "x", x)
    if x.dim() < 1 or x.shape[-1] % 2:
        raise ValueError(f"{op}: x has shape {tuple(x.shape)}; its last dim must be even ([..., 2*d])")
    d = x.shape[-1] // 2
    if out is None:
        out = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
    else:
        _checks.tensor(op, "out", out)
        if tuple(out.shape) != (*x.shape[:-1], d):
            raise ValueError(f"{op}: out has shape {tuple(out.shape)}, expected {(*x.shape[:-1], d)}")
        _checks.like(op, "x", x, "out", out)
    return (_checks.rows(op, "out", out, d), _checks.rows(op, "x", x, 2 * d)), out


def _gated(act: Act, x: Tensor, fp32: bool) -> Tensor:
    d = x.shape[-1] // 2
    xf = x.float() if fp32 and x.dtype != torch.float64 else x
    return (act(xf[..., :d]) * xf[..., d:]).to(x.dtype)


# The references use tail-accurate forms: 1 + erf(x / sqrt 2) and 1 + tanh(z) cancel for
# negative gates (F.gelu's fp32 CPU path is off by ~1e-5 there), erfc and sigmoid do not.
def _silu(x: Tensor) -> Tensor:
    return torch.nn.functional.silu(x)


def _gelu(x: Tensor) -> Tensor:
    return 0.5 * x * torch.erfc(x * -math.sqrt(0.5))


def _gelu_tanh(x: Tensor) -> Tensor:
    # 0.5 * (1 + tanh(z)) == sigmoid(2z)
    return x * torch.sigmoid(2.0 * math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x))


def reference(x: Tensor, out: Tensor | None = None, *, act: Act) -> Tensor:
    y = _gated(act, x, fp32=True)
    return y if out is None else out.copy_(y)


def torch_gated(out: Tensor, x: Tensor, *, approximate: str | None) -> None:
    F = torch.nn.functional
    act = F.silu if approximate is None else partial(F.gelu, approximate=approximate)
    out.copy_(_gated(act, x, fp32=False))


# torch's own gelu ignores `approximate` on NPU (always tanh); npu_gelu honours it. npu_geglu
# is not used: which half it activates differs across torch_npu releases.
def npu_gated(out: Tensor, x: Tensor, *, approximate: str | None) -> None:
    import torch_npu  # vendor library, present only on Ascend hosts

    if approximate is None:
        out.copy_(torch_npu.npu_swiglu(x, dim=-1))
    else:
        out.copy_(_gated(partial(torch_npu.npu_gelu, approximate=approximate), x, fp32=False))


silu_and_mul = declare(
    "activation.silu_and_mul",
    "(Tensor x, Tensor(a!)? out=None) -> Tensor",
    doc="x: [..., 2d] -> silu(x[..., :d]) * x[..., d:], in fp32",
    check=check,
    reference=partial(reference, act=_silu),
    torch=partial(torch_gated, approximate=None),
    torch_npu=partial(npu_gated, approximate=None),
)
gelu_and_mul = variant(
    silu_and_mul,
    "activation.gelu_and_mul",
    doc="x: [..., 2d] -> gelu(x[..., :d]) * x[..., d:] (exact erf gelu), in fp32",
    reference=partial(reference, act=_gelu),
    torch=partial(torch_gated, approximate="none"),
    torch_npu=partial(npu_gated, approximate="none"),
    samples="gelu_and_mul",
)
gelu_tanh_and_mul = variant(
    gelu_and_mul,
    "activation.gelu_tanh_and_mul",
    doc="x: [..., 2d] -> gelu_tanh(x[..., :d]) * x[..., d:] (tanh approximation), in fp32",
    reference=partial(reference, act=_gelu_tanh),
    torch=partial(torch_gated, approximate="tanh"),
    torch_npu=partial(npu_gated, approximate="tanh"),
)
