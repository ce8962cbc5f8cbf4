"""RMSNorm, fused residual-add RMSNorm, their Gemma (weight applied as ``1 + w``) variants,
per-head qk_norm, and RMSNorm / fused add + RMSNorm with static fp8 quantization (``_quant.py``):
one declaration each (see ``ops/_decl.py``).

Kernel arguments: ``(out, x, weight, eps)`` for the norms, ``(x, residual, weight, eps)`` for
the fused adds, ``(q, k, q_weight, k_weight, eps)`` for qk_norm; rows are [T, H] views with a
unit last stride, weights dense [H], eps > 0. NaN and Inf propagate as in the reference.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from .._common import FP8_E4M3_TOLERANCE, TOLERANCES
from .._contract import FLOATS, Arg, Contract, Rule
from .._decl import declare, variant
from . import _contract_items as _c
from . import _quant
from ._rms import norm as _norm
from ._rms import ref as _ref

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

# -- the contracts (ops/_contract.py; their checks are generated into _contracts.py) ------------
#: y = norm(x): out like x; kernel arguments (out, x, weight, eps)
NORM = Contract(
    "norm",
    (_c.X, _c.WEIGHT, _c.EPS, _c.CUDA_HIDDEN, Arg("out", "=x", like="x", out=True)),
    kernel=("out", "x", "weight", "eps"),
    result="out",
)
#: in place: residual += x; x = norm(residual); kernel arguments (x, residual, weight, eps)
ADD = Contract(
    "add", (_c.X, _c.WEIGHT, _c.EPS, _c.CUDA_HIDDEN, _c.RESIDUAL), kernel=("x", "residual", "weight", "eps")
)


#: in place, per head: q [..., Hq, D] and k [..., Hk, D] as [tokens, heads, D] views (token
#: counts may differ); kernel arguments (q, k, q_weight, k_weight, eps)
QK_NORM = Contract(
    "qk_norm",
    (
        Arg("q", "*Tq, Hq, D", dtypes=FLOATS, layout="heads", shape_hint="expected [..., heads, head_dim]"),
        Arg("k", "*Tk, Hk, D", like="q", layout="heads", shape_hint="its head_dim must be {D} like q's"),
        Arg("q_weight", "D", like="q", layout="vector", note=" (head_dim)"),
        Arg("k_weight", "D", like="q", layout="vector", note=" (head_dim)"),
        _c.EPS,
        Rule("D <= 2**30", "head_dim {D} exceeds 2^30", device="cuda", name="qk_head_dim"),
    ),
    kernel=("q", "k", "q_weight", "k_weight", "eps"),
)


# -- the reference (fp32 math; also run in float64 as the parity oracle) ---------------------
def ref_norm(
    x: Tensor, weight: Tensor, eps: float = 1e-6, out: Tensor | None = None, *, gemma: bool
) -> Tensor:
    y = _ref(x, weight, eps, gemma)
    return y if out is None else out.copy_(y)


def ref_add(x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6, *, gemma: bool) -> None:
    residual.copy_(
        (x.to(torch.float64 if x.dtype == torch.float64 else torch.float32) + residual).to(residual.dtype)
    )
    x.copy_(_ref(residual, weight, eps, gemma))


def ref_qk_norm(q: Tensor, k: Tensor, q_weight: Tensor, k_weight: Tensor, eps: float = 1e-6) -> None:
    q.copy_(_ref(q, q_weight, eps, False))
    k.copy_(_ref(k, k_weight, eps, False))


# -- the torch backends (kernel arguments) ---------------------------------------------------
def torch_norm(out: Tensor, x: Tensor, weight: Tensor, eps: float, *, gemma: bool) -> None:
    out.copy_(_norm(x, weight, eps, gemma))


def torch_add(x: Tensor, residual: Tensor, weight: Tensor, eps: float, *, gemma: bool) -> None:
    residual.add_(x)
    x.copy_(_norm(residual, weight, eps, gemma))


def torch_qk_norm(q: Tensor, k: Tensor, q_weight: Tensor, k_weight: Tensor, eps: float) -> None:
    q.copy_(_norm(q, q_weight, eps, False))
    k.copy_(_norm(k, k_weight, eps, False))


# torch_npu: npu_rms_norm takes gamma in x's dtype, so the Gemma ops (1 + w, kept in fp32)
# have no torch_npu backend.
def _npu(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    import torch_npu  # vendor library, present only on Ascend hosts

    return torch_npu.npu_rms_norm(x, weight, epsilon=eps)[0]  # type: ignore[no-any-return]


def npu_rmsnorm(out: Tensor, x: Tensor, weight: Tensor, eps: float) -> None:
    out.copy_(_npu(x, weight, eps))


def npu_fused_add(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> None:
    residual.add_(x)
    x.copy_(_npu(residual, weight, eps))


def npu_qk_norm(q: Tensor, k: Tensor, q_weight: Tensor, k_weight: Tensor, eps: float) -> None:
    q.copy_(_npu(q, q_weight, eps))
    k.copy_(_npu(k, k_weight, eps))


# -- the declarations ------------------------------------------------------------------------
# torch_npu: npu_rms_norm takes gamma in x's dtype, so the Gemma ops (1 + w, kept in fp32) have
# no torch_npu backend.
rmsnorm = declare(
    "layernorm.rmsnorm",
    "(Tensor x, Tensor weight, float eps=1e-06, Tensor(a!)? out=None) -> Tensor",
    doc="y = x * rsqrt(mean(x^2) + eps) * weight over the last dim, in fp32",
    contract=NORM,
    reference=partial(ref_norm, gemma=False),
    torch=partial(torch_norm, gemma=False),
    torch_npu=npu_rmsnorm,
)
gemma_rmsnorm = variant(
    rmsnorm,
    "layernorm.gemma_rmsnorm",
    doc="y = x * rsqrt(mean(x^2) + eps) * (1 + weight) over the last dim, all in fp32",
    reference=partial(ref_norm, gemma=True),
    torch=partial(torch_norm, gemma=True),
    torch_npu=None,
)
fused_add_rmsnorm = declare(
    "layernorm.fused_add_rmsnorm",
    "(Tensor(a!) x, Tensor(a!) residual, Tensor weight, float eps=1e-06) -> ()",
    doc="in place: residual += x; x = rmsnorm(residual, weight, eps)",
    contract=ADD,
    reference=partial(ref_add, gemma=False),
    torch=partial(torch_add, gemma=False),
    torch_npu=npu_fused_add,
    # no size class: the C++ kernel's two-pass loop at prefill (benchmarks/tune, H200) is faster
    # than the Triton kernel that used to take over from 2^25 elements
)
gemma_fused_add_rmsnorm = variant(
    fused_add_rmsnorm,
    "layernorm.gemma_fused_add_rmsnorm",
    doc="in place: residual += x; x = gemma_rmsnorm(residual, weight, eps)",
    reference=partial(ref_add, gemma=True),
    torch=partial(torch_add, gemma=True),
    torch_npu=None,
)
qk_norm = declare(
    "layernorm.qk_norm",
    "(Tensor(a!) q, Tensor(a!) k, Tensor q_weight, Tensor k_weight, float eps=1e-06) -> ()",
    doc="in place: rmsnorm of every head of q [..., Hq, D] and k [..., Hk, D] over D, weights [D] (fp32 math)",
    contract=QK_NORM,
    reference=ref_qk_norm,
    torch=torch_qk_norm,
    torch_npu=npu_qk_norm,
)

# fp8 outputs (one e4m3 ulp against the reference) and the fused add's residual
_QUANT_TOLERANCES = (*TOLERANCES, FP8_E4M3_TOLERANCE)
rmsnorm_static_quant_fp8 = declare(
    "layernorm.rmsnorm_static_quant_fp8",
    "(Tensor x, Tensor weight, Tensor scale, float eps=1e-06, Tensor(a!)? out=None) -> Tensor",
    doc="q fp8 = e4m3(rmsnorm(x, weight, eps) * (1 / scale)); scale: one float32 (static, per tensor)",
    contract=_quant.NORM_QUANT,
    reference=_quant.ref_norm_quant,
    torch=_quant.torch_norm_quant,
    tolerances=_QUANT_TOLERANCES,
)
fused_add_rmsnorm_static_quant_fp8 = declare(
    "layernorm.fused_add_rmsnorm_static_quant_fp8",
    "(Tensor x, Tensor(a!) residual, Tensor weight, Tensor scale, float eps=1e-06, Tensor(a!)? out=None) -> Tensor",
    doc="residual += x (in place); q fp8 = e4m3(rmsnorm(residual, weight, eps) * (1 / scale)); x is only read",
    contract=_quant.ADD_QUANT,
    reference=_quant.ref_add_quant,
    torch=_quant.torch_add_quant,
    tolerances=_QUANT_TOLERANCES,
)
