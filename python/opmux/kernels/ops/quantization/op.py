"""Dynamic fp8 quantization ops: the reference and every backend, as static methods.

Semantics (all backends, computed in fp32):

* per token: ``amax = max |x[t, :]|`` (clamped to ``scale_ub`` when given),
  ``scale = max(amax / 448, 1 / (448 * 512))``;
* per token group: ``scale = max(max |x[t, group]|, eps) / 448``;
* then ``q = e4m3fn(x * (1 / scale))``: the reciprocal and the divisions are IEEE fp32 (round to
  nearest even), the fp8 conversion rounds to nearest even and saturates to +-448.

fp8 tensors cross into the native kernels as ``uint8`` views (a DLPack-safe byte view).
"""

from __future__ import annotations

import torch

from ...fused_op import BaseFusedOp
from .. import _checks, _native

_PT = "quantization.per_token_quant_fp8"
_PG = "quantization.per_token_group_quant_fp8"

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
#: smallest per-token scale (vLLM's MIN_SCALING_FACTOR): keeps 1/scale finite for zero rows
MIN_SCALE = 1.0 / (FP8_MAX * 512.0)

_NO_UB: dict[torch.device, torch.Tensor] = {}


def _to_fp8(y: torch.Tensor) -> torch.Tensor:
    """fp32 -> e4m3fn, round to nearest even, saturating (torch's cast maps >= 480 to NaN)."""
    return y.clamp(-FP8_MAX, FP8_MAX).to(FP8)


def _hidden(op: str, x: torch.Tensor) -> int:
    _checks.tensor(op, "x", x)
    _checks.float_dtype(op, "x", x)
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"{op}: x has shape {tuple(x.shape)}, expected [..., H] with H >= 1")
    return int(x.shape[-1])


def _check_per_token(
    x: torch.Tensor, scale_ub: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (x2 [T, H], q, scales, q2 as uint8 [T, H], scales2 [T], scale_ub or an empty tensor)."""
    h = _hidden(_PT, x)
    if scale_ub is not None:
        _checks.tensor(_PT, "scale_ub", scale_ub)
        _checks.exact_dtype(_PT, "scale_ub", scale_ub, torch.float32)
        if scale_ub.numel() != 1:
            raise ValueError(f"{_PT}: scale_ub has shape {tuple(scale_ub.shape)}, expected one element")
        _checks.same_device(_PT, "x", x, scale_ub=scale_ub)
    x2 = _checks.rows(_PT, "x", x, h)
    q = torch.empty(x.shape, dtype=FP8, device=x.device)
    s = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
    if scale_ub is None:
        ub = _NO_UB.get(x.device)
        if ub is None:
            ub = _NO_UB.setdefault(x.device, torch.empty(0, dtype=torch.float32, device=x.device))
    else:
        ub = scale_ub.reshape(1)
    return x2, q, s, q.view(torch.uint8).view(-1, h), s.view(-1), ub


def _check_group(
    x: torch.Tensor, group_size: int, eps: float, column_major_scales: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (x2 [T, H], q, scales, q2 as uint8 [T, H], scales2 [T, G] (strided when column-major))."""
    h = _hidden(_PG, x)
    gs = _checks.positive_int(_PG, "group_size", group_size)
    if h % gs:
        raise ValueError(f"{_PG}: x's last dim {h} is not a multiple of group_size {gs}")
    if not eps >= 0.0:
        raise ValueError(f"{_PG}: eps must be a non-negative number, got {eps}")
    x2 = _checks.rows(_PG, "x", x, h)
    t, g = x2.shape[0], h // gs
    q = torch.empty(x.shape, dtype=FP8, device=x.device)
    if column_major_scales:  # a [T, G] view of a contiguous [G, T] tensor
        s2 = torch.empty((g, t), dtype=torch.float32, device=x.device).t()
    else:
        s2 = torch.empty((t, g), dtype=torch.float32, device=x.device)
    return x2, q, s2.view(*x.shape[:-1], g), q.view(torch.uint8).view(-1, h), s2


class PerTokenQuantFP8(BaseFusedOp[tuple[torch.Tensor, torch.Tensor]]):
    op_name = _PT

    @staticmethod
    def forward_native(
        x: torch.Tensor, scale_ub: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        xf = x.float()
        amax = xf.abs().amax(-1, keepdim=True)
        if scale_ub is not None:
            amax = torch.minimum(amax, scale_ub.float().reshape(()))
        scale = (amax / FP8_MAX).clamp(min=MIN_SCALE)
        return _to_fp8(xf * scale.reciprocal()), scale

    @staticmethod
    def forward_torch(
        x: torch.Tensor, scale_ub: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        xf = x.float()
        amax = torch.linalg.vector_norm(xf, float("inf"), dim=-1, keepdim=True)  # exact max |x|
        if scale_ub is not None:
            amax = amax.clamp(max=scale_ub.float().reshape(()))
        scale = torch.clamp_min(amax / FP8_MAX, MIN_SCALE)
        return torch.clamp(xf * scale.reciprocal(), -FP8_MAX, FP8_MAX).to(FP8), scale

    @staticmethod
    def forward_triton(
        x: torch.Tensor, scale_ub: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x2, q, s, q2, s2, ub = _check_per_token(x, scale_ub)
        from . import triton_kernels

        triton_kernels.per_token_quant(x2, q2.view(FP8), s2, ub)
        return q, s

    @staticmethod
    def forward_jit(
        x: torch.Tensor, scale_ub: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x2, q, s, q2, s2, ub = _check_per_token(x, scale_ub)
        _native.kernel("jit", _PT, x)(q2, s2, x2, ub)
        return q, s

    @staticmethod
    def forward_aot(
        x: torch.Tensor, scale_ub: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x2, q, s, q2, s2, ub = _check_per_token(x, scale_ub)
        _native.kernel("aot", _PT, x)(q2, s2, x2, ub)
        return q, s


class PerTokenGroupQuantFP8(BaseFusedOp[tuple[torch.Tensor, torch.Tensor]]):
    op_name = _PG

    @staticmethod
    def forward_native(
        x: torch.Tensor, group_size: int = 128, eps: float = 1e-10, column_major_scales: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h = x.shape[-1]
        xg = x.float().reshape(*x.shape[:-1], h // group_size, group_size)
        scale = xg.abs().amax(-1, keepdim=True).clamp(min=eps) / FP8_MAX
        q = _to_fp8(xg * scale.reciprocal()).flatten(-2)
        scale = scale.squeeze(-1)
        if column_major_scales:
            scale = scale.reshape(-1, scale.shape[-1]).t().contiguous().t().view(scale.shape)
        return q, scale

    @staticmethod
    def forward_torch(
        x: torch.Tensor, group_size: int = 128, eps: float = 1e-10, column_major_scales: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        _, q, s, _, _s2 = _check_group(x, group_size, eps, column_major_scales)
        xg = x.float().reshape(*x.shape[:-1], x.shape[-1] // group_size, group_size)
        amax = torch.linalg.vector_norm(xg, float("inf"), dim=-1, keepdim=True)
        scale = torch.clamp_min(amax, eps) / FP8_MAX
        q.copy_(torch.clamp(xg * scale.reciprocal(), -FP8_MAX, FP8_MAX).view(x.shape))
        s.copy_(scale.squeeze(-1))
        return q, s

    @staticmethod
    def forward_triton(
        x: torch.Tensor, group_size: int = 128, eps: float = 1e-10, column_major_scales: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x2, q, s, q2, s2 = _check_group(x, group_size, eps, column_major_scales)
        from . import triton_kernels

        triton_kernels.per_token_group_quant(x2, q2.view(FP8), s2, group_size, float(eps))
        return q, s

    @staticmethod
    def forward_jit(
        x: torch.Tensor, group_size: int = 128, eps: float = 1e-10, column_major_scales: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x2, q, s, q2, s2 = _check_group(x, group_size, eps, column_major_scales)
        _native.kernel("jit", _PG, x)(q2, s2, x2, int(group_size), float(eps))
        return q, s

    @staticmethod
    def forward_aot(
        x: torch.Tensor, group_size: int = 128, eps: float = 1e-10, column_major_scales: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x2, q, s, q2, s2 = _check_group(x, group_size, eps, column_major_scales)
        _native.kernel("aot", _PG, x)(q2, s2, x2, int(group_size), float(eps))
        return q, s
