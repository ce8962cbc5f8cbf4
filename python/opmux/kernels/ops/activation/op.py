"""SiLU-and-mul: the reference and every backend, as static methods the spec points at."""

from __future__ import annotations

import torch

from ...fused_op import BaseFusedOp
from .. import _checks, _native

_OP = "activation.silu_and_mul"


def _check(x: torch.Tensor, out: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _checks.tensor(_OP, "x", x)
    _checks.float_dtype(_OP, "x", x)
    if x.dim() < 1 or x.shape[-1] % 2:
        raise ValueError(f"{_OP}: x has shape {tuple(x.shape)}; its last dim must be even ([..., 2*d])")
    d = x.shape[-1] // 2
    if out is None:
        out = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
    else:
        _checks.tensor(_OP, "out", out)
        if tuple(out.shape) != (*x.shape[:-1], d):
            raise ValueError(f"{_OP}: out has shape {tuple(out.shape)}, expected {(*x.shape[:-1], d)}")
        _checks.same_dtype(_OP, "x", x, out=out)
        _checks.same_device(_OP, "x", x, out=out)
    return _checks.rows(_OP, "x", x, 2 * d), _checks.rows(_OP, "out", out, d), out


def _device(x: torch.Tensor) -> str:
    return "cuda" if x.is_cuda else "cpu"


class SiluAndMul(BaseFusedOp):
    op_name = _OP

    @staticmethod
    def forward_native(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        d = x.shape[-1] // 2
        xf = x.float()
        y = (torch.nn.functional.silu(xf[..., :d]) * xf[..., d:]).to(x.dtype)
        return y if out is None else out.copy_(y)

    @staticmethod
    def forward_torch(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        d = x.shape[-1] // 2
        y = torch.nn.functional.silu(x[..., :d]) * x[..., d:]
        return y if out is None else out.copy_(y)

    @staticmethod
    def forward_triton(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        x2, o2, out = _check(x, out)
        from . import triton_kernels

        triton_kernels.silu_and_mul(x2, o2)
        return out

    @staticmethod
    def forward_jit(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        x2, o2, out = _check(x, out)
        d = _device(x)
        _native.function("jit", "activation", d, f"silu_and_mul_{d}")(o2, x2)
        return out

    @staticmethod
    def forward_aot(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        x2, o2, out = _check(x, out)
        d = _device(x)
        _native.function("aot", "activation", d, f"silu_and_mul_{d}")(o2, x2)
        return out

    @staticmethod
    def forward_torch_npu(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        import torch_npu  # vendor library, present only on Ascend hosts

        y = torch_npu.npu_swiglu(x, dim=-1)
        return y if out is None else out.copy_(y)
