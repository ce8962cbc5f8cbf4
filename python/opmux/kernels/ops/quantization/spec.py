"""Specs of the quantization group (torch-free)."""

from __future__ import annotations

from ...spec import BackendSpec, OpSpec
from .._common import AOT, FP8_E4M3_TOLERANCE, JIT, TORCH, TRITON, priority_without

_M = "opmux.kernels.ops.quantization.op"

#: Scales (float32) are computed from the exact row/group max with IEEE division in every
#: backend, so they agree to fp32 rounding whatever the input dtype. The fp8 output is compared
#: as float with one e4m3 ulp of slack (see ``_common.FP8_E4M3_TOLERANCE``); the parity harness
#: uses the float8_e4m3fn entry for fp8 outputs and the float32 entry for the scales.
_TOLERANCES = (
    ("float32", (1e-6, 1e-6)),
    ("float16", (1e-6, 1e-6)),
    ("bfloat16", (1e-6, 1e-6)),
    FP8_E4M3_TOLERANCE,
)


def _spec(
    name: str, cls: str, doc: str, size_priority: tuple[tuple[str, int, tuple[str, ...]], ...] = ()
) -> OpSpec:
    return OpSpec(
        name=f"quantization.{name}",
        reference=f"{_M}:{cls}.forward_native",
        backends=(
            BackendSpec("aot", f"{_M}:{cls}.forward_aot", AOT),
            BackendSpec("jit", f"{_M}:{cls}.forward_jit", JIT),
            BackendSpec("triton", f"{_M}:{cls}.forward_triton", TRITON),
            BackendSpec("torch", f"{_M}:{cls}.forward_torch", TORCH),
        ),
        default_priority=("torch",),
        priority=priority_without("torch_npu"),
        tolerances=_TOLERANCES,
        samples=f"opmux.kernels.ops.quantization.samples:{name}_samples",
        invalid_samples=f"opmux.kernels.ops.quantization.samples:{name}_invalid",
        doc=doc,
        size_priority=size_priority,
    )


SPECS = (
    _spec(
        "per_token_quant_fp8",
        "PerTokenQuantFP8",
        "x: [..., H] -> (q fp8 [..., H], scale fp32 [..., 1]); scale = max(min(amax, ub)/448, 1/(448*512))",
    ),
    _spec(
        "per_token_group_quant_fp8",
        "PerTokenGroupQuantFP8",
        "x: [..., H] -> (q fp8 [..., H], scale fp32 [..., H/g]); scale = max(group amax, eps)/448",
        # measured on the H200 (docs/benchmarks/h200.md): Triton is 2-4% faster from 64M elements
        size_priority=(("cuda", 1 << 26, ("triton", "aot", "jit", "torch")),),
    ),
)
