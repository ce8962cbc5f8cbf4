"""Dynamic fp8 quantization: one declaration per op (``ops/_decl.py``).

Semantics (all backends, computed in fp32):

* per token: ``amax = max |x[t, :]|`` (clamped to ``scale_ub`` when given),
  ``scale = max(amax / 448, 1 / (448 * 512))``;
* per token group: ``scale = max(max |x[t, group]|, eps) / 448``;
* then ``q = e4m3fn(x * (1 / scale))``: the reciprocal and the divisions are IEEE fp32 (round to
  nearest even), the fp8 conversion rounds to nearest even and saturates to +-448.

fp8 tensors cross into the native kernels as ``uint8`` views (a DLPack-safe byte view).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import _checks
from .._common import FP8_E4M3_TOLERANCE
from .._decl import declare

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

_PT = "quantization.per_token_quant_fp8"
_PG = "quantization.per_token_group_quant_fp8"

FP8_MAX = 448.0
#: smallest per-token scale (vLLM's MIN_SCALING_FACTOR): keeps 1/scale finite for zero rows
MIN_SCALE = 1.0 / (FP8_MAX * 512.0)

_NO_UB: dict[torch.device, Tensor] = {}


def _to_fp8(y: Tensor) -> Tensor:
    """fp32 -> e4m3fn, round to nearest even, saturating (torch's cast maps >= 480 to NaN)."""
    return y.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def _hidden(op: str, x: Tensor) -> int:
    _checks.tensor(op, "x", x)
    _checks.float_dtype(op, "x", x)
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"{op}: x has shape {tuple(x.shape)}, expected [..., H] with H >= 1")
    return int(x.shape[-1])


def check_per_token(op: str, x: Tensor, scale_ub: Tensor | None = None) -> tuple[tuple[Any, ...], Any]:
    """-> ((q2 as uint8 [T, H], scales2 [T], x2 [T, H], scale_ub or an empty tensor), (q, scales))."""
    h = _hidden(_PT, x)
    if scale_ub is not None:
        _checks.tensor(_PT, "scale_ub", scale_ub)
        _checks.exact_dtype(_PT, "scale_ub", scale_ub, torch.float32)
        if scale_ub.numel() != 1:
            raise ValueError(f"{_PT}: scale_ub has shape {tuple(scale_ub.shape)}, expected one element")
        _checks.same_device(_PT, "x", x, scale_ub=scale_ub)
    x2 = _checks.rows(_PT, "x", x, h)
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
    if scale_ub is None:
        ub = _NO_UB.get(x.device)
        if ub is None:
            ub = _NO_UB.setdefault(x.device, torch.empty(0, dtype=torch.float32, device=x.device))
    else:
        ub = scale_ub.reshape(1)
    return (q.view(torch.uint8).view(-1, h), s.view(-1), x2, ub), (q, s)


def check_group(
    op: str, x: Tensor, group_size: int = 128, eps: float = 1e-10, column_major_scales: bool = False
) -> tuple[tuple[Any, ...], Any]:
    """-> ((q2 as uint8 [T, H], scales2 [T, G] (strided when column-major), x2 [T, H], group_size,
    eps), (q, scales))."""
    h = _hidden(_PG, x)
    gs = _checks.positive_int(_PG, "group_size", group_size)
    if h % gs:
        raise ValueError(f"{_PG}: x's last dim {h} is not a multiple of group_size {gs}")
    eps = _checks.positive_float(_PG, "eps", eps)
    x2 = _checks.rows(_PG, "x", x, h)
    t, g = x2.shape[0], h // gs
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    if column_major_scales:  # a [T, G] view of a contiguous [G, T] tensor
        s2 = torch.empty((g, t), dtype=torch.float32, device=x.device).t()
    else:
        s2 = torch.empty((t, g), dtype=torch.float32, device=x.device)
    return (q.view(torch.uint8).view(-1, h), s2, x2, gs, eps), (q, s2.view(*x.shape[:-1], g))


def ref_per_token(x: Tensor, scale_ub: Tensor | None = None) -> tuple[Tensor, Tensor]:
    xf = x.float()
    amax = xf.abs().amax(-1, keepdim=True)
    if scale_ub is not None:
        amax = torch.minimum(amax, scale_ub.float().reshape(()))
    scale = (amax / FP8_MAX).clamp(min=MIN_SCALE)
    return _to_fp8(xf * scale.reciprocal()), scale


def torch_per_token(q: Tensor, s: Tensor, x: Tensor, ub: Tensor) -> None:
    xf = x.float()
    amax = torch.linalg.vector_norm(xf, float("inf"), dim=-1, keepdim=True)  # exact max |x|
    if ub.numel():
        amax = amax.clamp(max=ub.reshape(()))
    scale = torch.clamp_min(amax / FP8_MAX, MIN_SCALE)
    q.view(torch.float8_e4m3fn).copy_(torch.clamp(xf * scale.reciprocal(), -FP8_MAX, FP8_MAX))
    s.copy_(scale.view(-1))


def ref_group(
    x: Tensor, group_size: int = 128, eps: float = 1e-10, column_major_scales: bool = False
) -> tuple[Tensor, Tensor]:
    h = x.shape[-1]
    xg = x.float().reshape(*x.shape[:-1], h // group_size, group_size)
    scale = xg.abs().amax(-1, keepdim=True).clamp(min=eps) / FP8_MAX
    q = _to_fp8(xg * scale.reciprocal()).flatten(-2)
    scale = scale.squeeze(-1)
    if column_major_scales:
        scale = scale.reshape(-1, scale.shape[-1]).t().contiguous().t().view(scale.shape)
    return q, scale


def torch_group(q: Tensor, s: Tensor, x: Tensor, group_size: int, eps: float) -> None:
    xg = x.float().reshape(x.shape[0], x.shape[1] // group_size, group_size)
    amax = torch.linalg.vector_norm(xg, float("inf"), dim=-1, keepdim=True)
    scale = torch.clamp_min(amax, eps) / FP8_MAX
    q.view(torch.float8_e4m3fn).copy_(torch.clamp(xg * scale.reciprocal(), -FP8_MAX, FP8_MAX).view(q.shape))
    s.copy_(scale.squeeze(-1))


#: Scales (float32) are computed from the exact row/group max with IEEE division in every
#: backend, so they agree to fp32 rounding whatever the input dtype. The fp8 output is compared
#: as float with one e4m3 ulp of slack (see ``_common.FP8_E4M3_TOLERANCE``).
_TOLERANCES = (
    ("float32", (1e-6, 1e-6)),
    ("float16", (1e-6, 1e-6)),
    ("bfloat16", (1e-6, 1e-6)),
    FP8_E4M3_TOLERANCE,
)
per_token_quant_fp8 = declare(
    _PT,
    "(Tensor x, Tensor? scale_ub=None) -> (Tensor, Tensor)",
    doc="x: [..., H] -> (q fp8 [..., H], scale fp32 [..., 1]); scale = max(min(amax, ub)/448, 1/(448*512))",
    check=check_per_token,
    reference=ref_per_token,
    torch=torch_per_token,
    tolerances=_TOLERANCES,
)
per_token_group_quant_fp8 = declare(
    _PG,
    "(Tensor x, int group_size=128, float eps=1e-10, bool column_major_scales=False) -> (Tensor, Tensor)",
    doc="x: [..., H] -> (q fp8 [..., H], scale fp32 [..., H/g]); scale = max(group amax, eps)/448",
    check=check_group,
    reference=ref_group,
    torch=torch_group,
    tolerances=_TOLERANCES,
    # measured on the H200 (docs/benchmarks/h200.md): Triton is 2-4% faster from 64M elements
    size_priority=(("cuda", 1 << 26, ("triton", "aot", "jit", "torch")),),
)
