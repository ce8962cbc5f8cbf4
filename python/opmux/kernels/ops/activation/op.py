"""Gated activations ``act(x[..., :d]) * x[..., d:]``: one declaration each (``ops/_decl.py``).

Kernel arguments: ``(out, x)`` with x a [T, 2d] and out a [T, d] view, unit last stride.
NaN and Inf propagate as in the reference.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from .._contract import FLOATS, Arg, Contract, Rule, Scalar
from .._decl import declare, variant

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

Act = Callable[["torch.Tensor"], "torch.Tensor"]


# -- the contracts (ops/_contract.py; their checks are generated into _contracts.py) ---------------
_X_PAIRS = Arg("x", "*T, D2", dtypes=FLOATS, shape_hint="its last dim must be even ([..., 2*d])")
_EVEN = Rule("D2 % 2 == 0", "x has shape {tuple(x.shape)}; its last dim must be even ([..., 2*d])")
_OUT_HALF = Arg("out", "*T, D2 // 2", like="x", out=True)


def _gated_contract(name: str, *scalars: Scalar) -> Contract:
    """x [*T, 2d] -> out [*T, d]: kernel arguments (out, x, *scalars), rows views."""
    items: tuple[Arg | Scalar | Rule, ...] = (*scalars, _X_PAIRS, _EVEN, _OUT_HALF)
    return Contract(name, items, kernel=("out", "x", *(s.name for s in scalars)), result="out")


GATED_ROUNDING = _gated_contract("gated_rounding", Scalar("vllm_rounding", "bool"))
GATED_THRESHOLD = _gated_contract("gated_threshold", Scalar("threshold", "finite"))
GATED_LIMIT = _gated_contract("gated_limit", Scalar("limit", "positive"))
GATED_OAI = _gated_contract("gated_oai", Scalar("alpha", "finite"), Scalar("limit", "positive"))


def _elementwise_contract(name: str, *scalars: Scalar) -> Contract:
    """x [*T, n] -> out [*T, n]: kernel arguments (out, x, *scalars), rows views."""
    x = Arg("x", "*T, N", dtypes=FLOATS, shape_hint="expected at least one dim ([..., n])")
    items: tuple[Arg | Scalar | Rule, ...] = (*scalars, x, Arg("out", "*T, N", like="x", out=True))
    return Contract(name, items, kernel=("out", "x", *(s.name for s in scalars)), result="out")


ELEMENTWISE = _elementwise_contract("elementwise")
ELEMENTWISE_ROUNDING = _elementwise_contract("elementwise_rounding", Scalar("vllm_rounding", "bool"))


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


def _gated_vllm(act: Act, x: Tensor) -> Tensor:
    """vLLM's rounding: act of the gate in fp32, rounded to x's dtype, then the product in it."""
    d = x.shape[-1] // 2
    return act(x[..., :d].float()).to(x.dtype) * x[..., d:]


def reference(x: Tensor, vllm_rounding: bool = False, out: Tensor | None = None, *, act: Act) -> Tensor:
    y = _gated_vllm(act, x) if vllm_rounding else _gated(act, x, fp32=True)
    return y if out is None else out.copy_(y)


def torch_gated(out: Tensor, x: Tensor, vllm_rounding: bool, *, approximate: str | None) -> None:
    F = torch.nn.functional
    act = F.silu if approximate is None else partial(F.gelu, approximate=approximate)
    out.copy_(_gated_vllm(act, x) if vllm_rounding else _gated(act, x, fp32=False))


# torch's own gelu ignores `approximate` on NPU (always tanh); npu_gelu honours it. npu_geglu
# is not used: which half it activates differs across torch_npu releases.
def npu_gated(out: Tensor, x: Tensor, vllm_rounding: bool, *, approximate: str | None) -> None:
    import torch_npu  # vendor library, present only on Ascend hosts

    if vllm_rounding:
        torch_gated(out, x, vllm_rounding, approximate=approximate)
    elif approximate is None:
        out.copy_(torch_npu.npu_swiglu(x, dim=-1))
    else:
        out.copy_(_gated(partial(torch_npu.npu_gelu, approximate=approximate), x, fp32=False))


silu_and_mul = declare(
    "activation.silu_and_mul",
    "(Tensor x, bool vllm_rounding=False, Tensor(a!)? out=None) -> Tensor",
    doc="x: [..., 2d] -> silu(x[..., :d]) * x[..., d:], in fp32; vllm_rounding: the activation by IEEE "
    "expf / erff / tanhf and division, rounded to x's dtype, then the product in x's dtype (vLLM's kernel)",
    contract=GATED_ROUNDING,
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


# -- the other gated forms (vLLM's activation set) ---------------------------------------------
def _clamp_abs(u: Tensor, limit: float) -> Tensor:
    return u.clamp(min=-limit, max=limit)


def ref_mul_and_silu(x: Tensor, vllm_rounding: bool = False, out: Tensor | None = None) -> Tensor:
    d = x.shape[-1] // 2
    if vllm_rounding:  # silu rounded to x's dtype, then the product in x's dtype
        s = torch.nn.functional.silu(x[..., d:].float()).to(x.dtype)
        y = x[..., :d] * s
    else:
        y = _gated(_silu, torch.cat([x[..., d:], x[..., :d]], -1), fp32=True)
    return y if out is None else out.copy_(y)


def torch_mul_and_silu(out: Tensor, x: Tensor, vllm_rounding: bool) -> None:
    ref_mul_and_silu(x, vllm_rounding, out)


def _fatrelu(x: Tensor, threshold: float) -> Tensor:
    d = x.shape[-1] // 2
    xf = x.float() if x.dtype != torch.float64 else x
    return (torch.nn.functional.threshold(xf[..., :d], threshold, 0.0) * xf[..., d:]).to(x.dtype)


def ref_fatrelu(x: Tensor, threshold: float = 0.0, out: Tensor | None = None) -> Tensor:
    y = _fatrelu(x, threshold)
    return y if out is None else out.copy_(y)


def torch_fatrelu(out: Tensor, x: Tensor, threshold: float) -> None:
    out.copy_(_fatrelu(x, threshold))


def _swiglustep(x: Tensor, limit: float) -> Tensor:
    d = x.shape[-1] // 2
    xf = x.float() if x.dtype != torch.float64 else x
    gate = torch.nn.functional.silu(xf[..., :d]).clamp(max=limit)
    return (gate * _clamp_abs(xf[..., d:], limit)).to(x.dtype)


def ref_swiglustep(x: Tensor, limit: float = 7.0, out: Tensor | None = None) -> Tensor:
    y = _swiglustep(x, limit)
    return y if out is None else out.copy_(y)


def torch_swiglustep(out: Tensor, x: Tensor, limit: float) -> None:
    out.copy_(_swiglustep(x, limit))


def _swigluoai(x: Tensor, alpha: float, limit: float) -> Tensor:
    xf = x.float() if x.dtype != torch.float64 else x
    gate = xf[..., ::2].clamp(max=limit)
    up = _clamp_abs(xf[..., 1::2], limit)
    return ((up + 1) * (gate * torch.sigmoid(gate * alpha))).to(x.dtype)


def ref_swigluoai(x: Tensor, alpha: float = 1.702, limit: float = 7.0, out: Tensor | None = None) -> Tensor:
    y = _swigluoai(x, alpha, limit)
    return y if out is None else out.copy_(y)


def torch_swigluoai(out: Tensor, x: Tensor, alpha: float, limit: float) -> None:
    out.copy_(_swigluoai(x, alpha, limit))


mul_and_silu = declare(
    "activation.mul_and_silu",
    "(Tensor x, bool vllm_rounding=False, Tensor(a!)? out=None) -> Tensor",
    doc="x: [..., 2d] -> x[..., :d] * silu(x[..., d:]), in fp32; vllm_rounding: silu by IEEE expf "
    "and division, rounded to x's dtype, then the product in x's dtype (vLLM's kernel, bit for bit)",
    contract=GATED_ROUNDING,
    reference=ref_mul_and_silu,
    torch=torch_mul_and_silu,
    samples="mul_and_silu",
)
fatrelu_and_mul = declare(
    "activation.fatrelu_and_mul",
    "(Tensor x, float threshold=0.0, Tensor(a!)? out=None) -> Tensor",
    doc="x: [..., 2d] -> threshold(x[..., :d]) * x[..., d:] (gate kept where > threshold, else 0)",
    contract=GATED_THRESHOLD,
    reference=ref_fatrelu,
    torch=torch_fatrelu,
    samples="fatrelu_and_mul",
)
swiglustep_and_mul = declare(
    "activation.swiglustep_and_mul",
    "(Tensor x, float limit=7.0, Tensor(a!)? out=None) -> Tensor",
    doc="x: [..., 2d] -> min(silu(x[..., :d]), limit) * clamp(x[..., d:], -limit, limit), in fp32",
    contract=GATED_LIMIT,
    reference=ref_swiglustep,
    torch=torch_swiglustep,
    samples="swiglustep_and_mul",
)
swigluoai_and_mul = declare(
    "activation.swigluoai_and_mul",
    "(Tensor x, float alpha=1.702, float limit=7.0, Tensor(a!)? out=None) -> Tensor",
    doc="x: [..., 2d] of interleaved (gate, up) pairs -> (clamp(up, -limit, limit) + 1) * g * "
    "sigmoid(alpha * g), g = min(gate, limit) (gpt-oss), in fp32",
    contract=GATED_OAI,
    reference=ref_swigluoai,
    torch=torch_swigluoai,
    samples="swigluoai_and_mul",
)


# -- element-wise activations -------------------------------------------------------------------
# tanh forms as sigmoids (0.5 (1 + tanh z) == sigmoid(2z)): no cancellation in the negative tail.
def _gelu_new(x: Tensor) -> Tensor:
    return _gelu_tanh(x)


def _gelu_fast(x: Tensor) -> Tensor:
    return x * torch.sigmoid(2.0 * 0.7978845608 * x * (1.0 + 0.044715 * x * x))


def _gelu_quick(x: Tensor) -> Tensor:
    return x * torch.sigmoid(1.702 * x)


def ref_elementwise(x: Tensor, out: Tensor | None = None, *, act: Act) -> Tensor:
    y = act(x.float() if x.dtype != torch.float64 else x).to(x.dtype)
    return y if out is None else out.copy_(y)


def torch_elementwise(out: Tensor, x: Tensor, *, act: Act) -> None:
    out.copy_(act(x.float() if x.dtype != torch.float64 else x))


# vLLM's kernels round to x's dtype after each step (csrc/activation_kernels.cu gelu_new_kernel /
# gelu_fast_kernel; its tests' references, in that dtype, do too): `r` rounds a float32 value.
def _gelu_new_vllm(x: Tensor) -> Tensor:
    dt, f = x.dtype, x.float()

    def r(v: Tensor) -> Tensor:
        return v.to(dt).float()

    x3 = r(r(f * f) * f)
    t = r(torch.tanh(r(0.79788456 * r(f + r(0.044715 * x3)))))
    return r(0.5 * f) * r(1.0 + t)


def _gelu_fast_vllm(x: Tensor) -> Tensor:
    dt, f = x.dtype, x.float()

    def r(v: Tensor) -> Tensor:
        return v.to(dt).float()

    t = r(torch.tanh(r(r(f * 0.79788456) * r(1.0 + r(r(0.044715 * f) * f)))))
    return r(0.5 * f) * r(1.0 + t)


def ref_gelu_vllm(
    x: Tensor, vllm_rounding: bool = False, out: Tensor | None = None, *, act: Act, vllm: Act
) -> Tensor:
    y = (vllm(x) if vllm_rounding else act(x.float())).to(x.dtype)
    return y if out is None else out.copy_(y)


def torch_gelu_vllm(out: Tensor, x: Tensor, vllm_rounding: bool, *, act: Act, vllm: Act) -> None:
    ref_gelu_vllm(x, vllm_rounding, out, act=act, vllm=vllm)


gelu_new = declare(
    "activation.gelu_new",
    "(Tensor x, bool vllm_rounding=False, Tensor(a!)? out=None) -> Tensor",
    doc="x -> 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (GPT-2's gelu), in fp32; "
    "vllm_rounding: rounded to x's dtype after each step, as vLLM's kernel",
    contract=ELEMENTWISE_ROUNDING,
    reference=partial(ref_gelu_vllm, act=_gelu_new, vllm=_gelu_new_vllm),
    torch=partial(torch_gelu_vllm, act=_gelu_new, vllm=_gelu_new_vllm),
    samples="gelu_new",
)
gelu_fast = variant(
    gelu_new,
    "activation.gelu_fast",
    doc="x -> 0.5 x (1 + tanh(0.7978845608 x (1 + 0.044715 x^2))), in fp32 (gelu_new's function); "
    "vllm_rounding: rounded to x's dtype after each step, as vLLM's kernel",
    reference=partial(ref_gelu_vllm, act=_gelu_fast, vllm=_gelu_fast_vllm),
    torch=partial(torch_gelu_vllm, act=_gelu_fast, vllm=_gelu_fast_vllm),
)
gelu_quick = declare(
    "activation.gelu_quick",
    "(Tensor x, Tensor(a!)? out=None) -> Tensor",
    doc="x -> x * sigmoid(1.702 x), in fp32 (vLLM's kernel computes it in float too)",
    contract=ELEMENTWISE,
    reference=partial(ref_elementwise, act=_gelu_quick),
    torch=partial(torch_elementwise, act=_gelu_quick),
    samples="gelu_quick",
)
