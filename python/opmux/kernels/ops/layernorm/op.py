"""RMSNorm ops: the reference and every backend, as static methods the spec points at.

The plain and Gemma (weight applied as ``1 + w``) variants share every helper; the classes only
name their op and the ``gemma`` flag."""

from __future__ import annotations

from typing import cast

import torch

from ...fused_op import BaseFusedOp
from .. import _checks, _native

_RMS = "layernorm.rmsnorm"
_ADD = "layernorm.fused_add_rmsnorm"
_GEMMA_RMS = "layernorm.gemma_rmsnorm"
_GEMMA_ADD = "layernorm.gemma_fused_add_rmsnorm"
_QK = "layernorm.qk_norm"


def _check_rmsnorm(
    op: str, x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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


def _check_add(
    op: str, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    _checks.tensor(op, "residual", residual)
    x2, _, _ = _check_rmsnorm(op, x, weight, x)
    if residual.shape != x.shape:
        raise ValueError(
            f"{op}: residual has shape {tuple(residual.shape)}, expected {tuple(x.shape)} like x"
        )
    _checks.same_dtype(op, "x", x, residual=residual)
    _checks.same_device(op, "x", x, residual=residual)
    return x2, _checks.rows(op, "residual", residual, x.shape[-1])


def _check_qk(
    q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [..., Hq, D] and k [..., Hk, D] as [tokens, heads, D] views; weights [D]."""
    op = _QK
    for name, t in (("q", q), ("k", k), ("q_weight", q_weight), ("k_weight", k_weight)):
        _checks.tensor(op, name, t)
    _checks.float_dtype(op, "q", q)
    _checks.same_dtype(op, "q", q, k=k, q_weight=q_weight, k_weight=k_weight)
    _checks.same_device(op, "q", q, k=k, q_weight=q_weight, k_weight=k_weight)
    if q.dim() < 2 or k.dim() < 2:
        raise ValueError(
            f"{op}: q and k must be [..., heads, head_dim], got shapes {tuple(q.shape)} and {tuple(k.shape)}"
        )
    d = q.shape[-1]
    if k.shape[-1] != d:
        raise ValueError(f"{op}: k has shape {tuple(k.shape)}; its head_dim must be {d} like q's")
    for name, w in (("q_weight", q_weight), ("k_weight", k_weight)):
        if tuple(w.shape) != (d,):
            raise ValueError(f"{op}: {name} has shape {tuple(w.shape)}, expected [{d}] (head_dim)")
    _checks.distinct(op, "q", q, "k", k)

    def view(name: str, t: torch.Tensor) -> torch.Tensor:
        heads = t.shape[-2]
        tokens = t.numel() // (heads * d) if heads * d else t.shape[:-2].numel()
        return _checks.heads(op, name, t, tokens, heads, d)

    return view("q", q), view("k", k)


# -- shared implementations ------------------------------------------------------------
def _ref(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    xf = x.float()
    w = weight.float() + 1.0 if gemma else weight.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w).to(x.dtype)


def _torch(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    w = weight.float() + 1.0 if gemma else weight.float()
    return torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), w, eps).to(x.dtype)


def _maybe_out(y: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    return y if out is None else out.copy_(y)


def _norm_triton(
    op: str, x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None, gemma: bool
) -> torch.Tensor:
    x2, o2, out = _check_rmsnorm(op, x, weight, out)
    from . import triton_kernels

    triton_kernels.rmsnorm(x2, weight, eps, o2, None, gemma)
    return out


def _norm_native(
    kind: str, op: str, x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None
) -> torch.Tensor:
    x2, o2, out = _check_rmsnorm(op, x, weight, out)
    _native.kernel(kind, op, x)(o2, x2, weight, float(eps))
    return out


def _add_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> None:
    residual.copy_((x.float() + residual.float()).to(residual.dtype))
    x.copy_(_ref(residual, weight, eps, gemma))


def _add_torch(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool
) -> None:
    residual.add_(x)
    x.copy_(_torch(residual, weight, eps, gemma))


def _add_triton(
    op: str, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool
) -> None:
    x2, r2 = _check_add(op, x, residual, weight)
    from . import triton_kernels

    triton_kernels.rmsnorm(x2, weight, eps, x2, r2, gemma)


def _add_native(
    kind: str, op: str, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> None:
    x2, r2 = _check_add(op, x, residual, weight)
    _native.kernel(kind, op, x)(x2, r2, weight, float(eps))


def _npu_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    import torch_npu  # vendor library, present only on Ascend hosts

    return cast(torch.Tensor, torch_npu.npu_rms_norm(x, weight, epsilon=eps)[0])


# -- the ops ---------------------------------------------------------------------------
class RMSNorm(BaseFusedOp[torch.Tensor]):
    op_name = _RMS

    @staticmethod
    def forward_native(
        x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        return _maybe_out(_ref(x, weight, eps, False), out)

    @staticmethod
    def forward_torch(
        x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        return _maybe_out(_torch(x, weight, eps, False), out)

    @staticmethod
    def forward_triton(
        x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        return _norm_triton(_RMS, x, weight, eps, out, False)

    @staticmethod
    def forward_jit(
        x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        return _norm_native("jit", _RMS, x, weight, eps, out)

    @staticmethod
    def forward_aot(
        x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        return _norm_native("aot", _RMS, x, weight, eps, out)

    @staticmethod
    def forward_torch_npu(
        x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        return _maybe_out(_npu_rms_norm(x, weight, eps), out)


class FusedAddRMSNorm(BaseFusedOp[None]):
    op_name = _ADD

    @staticmethod
    def forward_native(
        x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
    ) -> None:
        _add_ref(x, residual, weight, eps, False)

    @staticmethod
    def forward_torch(
        x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
    ) -> None:
        _add_torch(x, residual, weight, eps, False)

    @staticmethod
    def forward_triton(
        x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
    ) -> None:
        _add_triton(_ADD, x, residual, weight, eps, False)

    @staticmethod
    def forward_jit(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> None:
        _add_native("jit", _ADD, x, residual, weight, eps)

    @staticmethod
    def forward_aot(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> None:
        _add_native("aot", _ADD, x, residual, weight, eps)

    @staticmethod
    def forward_torch_npu(
        x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
    ) -> None:
        residual.add_(x)
        x.copy_(_npu_rms_norm(residual, weight, eps))


# No torch_npu backend for the Gemma ops: npu_rms_norm takes gamma in x's dtype, so 1 + w
# would be rounded to bf16/fp16 before use (not the fp32 weight the op promises).
class GemmaRMSNorm(BaseFusedOp[torch.Tensor]):
    op_name = _GEMMA_RMS

    @staticmethod
    def forward_native(
        x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        return _maybe_out(_ref(x, weight, eps, True), out)

    @staticmethod
    def forward_torch(
        x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        return _maybe_out(_torch(x, weight, eps, True), out)

    @staticmethod
    def forward_triton(
        x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        return _norm_triton(_GEMMA_RMS, x, weight, eps, out, True)

    @staticmethod
    def forward_jit(
        x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        return _norm_native("jit", _GEMMA_RMS, x, weight, eps, out)

    @staticmethod
    def forward_aot(
        x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        return _norm_native("aot", _GEMMA_RMS, x, weight, eps, out)


class GemmaFusedAddRMSNorm(BaseFusedOp[None]):
    op_name = _GEMMA_ADD

    @staticmethod
    def forward_native(
        x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
    ) -> None:
        _add_ref(x, residual, weight, eps, True)

    @staticmethod
    def forward_torch(
        x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
    ) -> None:
        _add_torch(x, residual, weight, eps, True)

    @staticmethod
    def forward_triton(
        x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
    ) -> None:
        _add_triton(_GEMMA_ADD, x, residual, weight, eps, True)

    @staticmethod
    def forward_jit(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> None:
        _add_native("jit", _GEMMA_ADD, x, residual, weight, eps)

    @staticmethod
    def forward_aot(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> None:
        _add_native("aot", _GEMMA_ADD, x, residual, weight, eps)


def _qk_native(
    kind: str, q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float
) -> None:
    q3, k3 = _check_qk(q, k, q_weight, k_weight)
    _native.kernel(kind, _QK, q)(q3, k3, q_weight, k_weight, float(eps))


class QKNorm(BaseFusedOp[None]):
    """In place: per-head RMSNorm of q [..., Hq, D] and k [..., Hk, D] (weights [D])."""

    op_name = _QK

    @staticmethod
    def forward_native(
        q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float = 1e-6
    ) -> None:
        q.copy_(_ref(q, q_weight, eps, False))
        k.copy_(_ref(k, k_weight, eps, False))

    @staticmethod
    def forward_torch(
        q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float = 1e-6
    ) -> None:
        q.copy_(_torch(q, q_weight, eps, False))
        k.copy_(_torch(k, k_weight, eps, False))

    @staticmethod
    def forward_triton(
        q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float = 1e-6
    ) -> None:
        q3, k3 = _check_qk(q, k, q_weight, k_weight)
        from . import triton_kernels

        triton_kernels.qk_norm(q3, q_weight, eps)
        triton_kernels.qk_norm(k3, k_weight, eps)

    @staticmethod
    def forward_jit(
        q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float = 1e-6
    ) -> None:
        _qk_native("jit", q, k, q_weight, k_weight, eps)

    @staticmethod
    def forward_aot(
        q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float = 1e-6
    ) -> None:
        _qk_native("aot", q, k, q_weight, k_weight, eps)

    @staticmethod
    def forward_torch_npu(
        q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float = 1e-6
    ) -> None:
        q.copy_(_npu_rms_norm(q, q_weight, eps))
        k.copy_(_npu_rms_norm(k, k_weight, eps))
