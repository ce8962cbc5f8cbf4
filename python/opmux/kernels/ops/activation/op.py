"""Gated activations (``act(x[..., :d]) * x[..., d:]``): the reference and every backend, as
static methods the spec points at. The three ops share one set of helpers; each class only
names its activation."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F

from ...fused_op import BaseFusedOp
from .. import _checks, _native

_SILU = "activation.silu_and_mul"
_GELU = "activation.gelu_and_mul"
_GELU_TANH = "activation.gelu_tanh_and_mul"


def _check(
    op: str, x: torch.Tensor, out: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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
        _checks.same_dtype(op, "x", x, out=out)
        _checks.same_device(op, "x", x, out=out)
    return _checks.rows(op, "x", x, 2 * d), _checks.rows(op, "out", out, d), out


def _gated(
    act: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, out: torch.Tensor | None, fp32: bool
) -> torch.Tensor:
    d = x.shape[-1] // 2
    xf = x.float() if fp32 else x
    y = (act(xf[..., :d]) * xf[..., d:]).to(x.dtype)
    return y if out is None else out.copy_(y)


def _triton(op: str, act: str, x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    x2, o2, out = _check(op, x, out)
    from . import triton_kernels

    triton_kernels.gated(x2, o2, act)
    return out


def _compiled(kind: str, op: str, x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """The JIT or AOT kernel ``<name>_<device>`` (``name`` is the op name after the group)."""
    x2, o2, out = _check(op, x, out)
    _native.kernel(kind, op, x)(o2, x2)
    return out


# The references use tail-accurate forms: 1 + erf(x / sqrt 2) and 1 + tanh(z) cancel for
# negative gates (F.gelu's fp32 CPU path is off by ~1e-5 there), erfc and sigmoid do not.
def _gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * torch.erfc(x * -math.sqrt(0.5))


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    # 0.5 * (1 + tanh(z)) == sigmoid(2z)
    return x * torch.sigmoid(2.0 * math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x))


def _torch_gelu(approximate: str) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: F.gelu(x, approximate=approximate)


class SiluAndMul(BaseFusedOp[torch.Tensor]):
    op_name = _SILU

    @staticmethod
    def forward_native(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return _gated(F.silu, x, out, fp32=True)

    @staticmethod
    def forward_torch(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return _gated(F.silu, x, out, fp32=False)

    @staticmethod
    def forward_triton(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return _triton(_SILU, "silu", x, out)

    @staticmethod
    def forward_jit(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return _compiled("jit", _SILU, x, out)

    @staticmethod
    def forward_aot(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return _compiled("aot", _SILU, x, out)

    @staticmethod
    def forward_torch_npu(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        import torch_npu  # vendor library, present only on Ascend hosts

        y = torch_npu.npu_swiglu(x, dim=-1)
        return y if out is None else out.copy_(y)


def _npu_gelu(approximate: str) -> Callable[[torch.Tensor], torch.Tensor]:
    # torch's own gelu ignores `approximate` on NPU (always tanh); npu_gelu honours it.
    # npu_geglu is not used: which half it activates differs across torch_npu releases.
    def act(x: torch.Tensor) -> torch.Tensor:
        import torch_npu  # vendor library, present only on Ascend hosts

        return cast(torch.Tensor, torch_npu.npu_gelu(x, approximate=approximate))

    return act


class GeluAndMul(BaseFusedOp[torch.Tensor]):
    op_name = _GELU

    @staticmethod
    def forward_native(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return _gated(_gelu, x, out, fp32=True)

    @staticmethod
    def forward_torch(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return _gated(_torch_gelu("none"), x, out, fp32=False)

    @staticmethod
    def forward_triton(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return _triton(_GELU, "gelu", x, out)

    @staticmethod
    def forward_jit(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return _compiled("jit", _GELU, x, out)

    @staticmethod
    def forward_aot(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return _compiled("aot", _GELU, x, out)

    @staticmethod
    def forward_torch_npu(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return _gated(_npu_gelu("none"), x, out, fp32=False)


class GeluTanhAndMul(BaseFusedOp[torch.Tensor]):
    op_name = _GELU_TANH

    @staticmethod
    def forward_native(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return _gated(_gelu_tanh, x, out, fp32=True)

    @staticmethod
    def forward_torch(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return _gated(_torch_gelu("tanh"), x, out, fp32=False)

    @staticmethod
    def forward_triton(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return _triton(_GELU_TANH, "gelu_tanh", x, out)

    @staticmethod
    def forward_jit(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return _compiled("jit", _GELU_TANH, x, out)

    @staticmethod
    def forward_aot(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return _compiled("aot", _GELU_TANH, x, out)

    @staticmethod
    def forward_torch_npu(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return _gated(_npu_gelu("tanh"), x, out, fp32=False)
