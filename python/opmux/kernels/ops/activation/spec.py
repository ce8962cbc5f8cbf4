"""Specs of the activation group (torch-free)."""

from __future__ import annotations

from ...spec import BackendSpec, OpSpec
from .._common import AOT, JIT, PRIORITY, TOLERANCES, TORCH, TORCH_NPU, TRITON

_M = "opmux.kernels.ops.activation.op"


def _spec(name: str, cls: str, doc: str) -> OpSpec:
    backends = [
        BackendSpec("aot", f"{_M}:{cls}.forward_aot", AOT),
        BackendSpec("jit", f"{_M}:{cls}.forward_jit", JIT),
        BackendSpec("triton", f"{_M}:{cls}.forward_triton", TRITON),
        BackendSpec("torch", f"{_M}:{cls}.forward_torch", TORCH),
        BackendSpec("torch_npu", f"{_M}:{cls}.forward_torch_npu", TORCH_NPU),
    ]
    return OpSpec(
        name=f"activation.{name}",
        reference=f"{_M}:{cls}.forward_native",
        backends=tuple(backends),
        default_priority=("torch",),
        priority=PRIORITY,
        tolerances=TOLERANCES,
        samples=f"opmux.kernels.ops.activation.samples:{name}_samples",
        invalid_samples=f"opmux.kernels.ops.activation.samples:{name}_invalid",
        mutates=("out",),
        doc=doc,
    )


SPECS = (
    _spec("silu_and_mul", "SiluAndMul", "x: [..., 2d] -> silu(x[..., :d]) * x[..., d:]"),
    _spec("gelu_and_mul", "GeluAndMul", "x: [..., 2d] -> gelu(x[..., :d]) * x[..., d:] (exact erf gelu)"),
    _spec(
        "gelu_tanh_and_mul",
        "GeluTanhAndMul",
        "x: [..., 2d] -> gelu_tanh(x[..., :d]) * x[..., d:] (tanh approximation)",
    ),
)
