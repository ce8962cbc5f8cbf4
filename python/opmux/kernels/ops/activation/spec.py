"""Specs of the activation group (torch-free)."""

from __future__ import annotations

from ...spec import BackendSpec, OpSpec
from .._common import AOT, JIT, PRIORITY, TOLERANCES, TORCH, TORCH_NPU, TRITON

_M = "opmux.kernels.ops.activation.op"

SPECS = (
    OpSpec(
        name="activation.silu_and_mul",
        reference=f"{_M}:SiluAndMul.forward_native",
        backends=(
            BackendSpec("aot", f"{_M}:SiluAndMul.forward_aot", AOT),
            BackendSpec("jit", f"{_M}:SiluAndMul.forward_jit", JIT),
            BackendSpec("triton", f"{_M}:SiluAndMul.forward_triton", TRITON),
            BackendSpec("torch", f"{_M}:SiluAndMul.forward_torch", TORCH),
            BackendSpec("torch_npu", f"{_M}:SiluAndMul.forward_torch_npu", TORCH_NPU),
        ),
        default_priority=("torch",),
        priority=PRIORITY,
        tolerances=TOLERANCES,
        samples="opmux.kernels.ops.activation.samples:silu_and_mul_samples",
        invalid_samples="opmux.kernels.ops.activation.samples:silu_and_mul_invalid",
        mutates=("out",),
        doc="x: [..., 2d] -> silu(x[..., :d]) * x[..., d:]",
    ),
)
