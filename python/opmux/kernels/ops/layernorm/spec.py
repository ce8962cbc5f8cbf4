"""Specs of the layernorm group (torch-free: the CLI and the registry read them)."""

from __future__ import annotations

from ...spec import BackendSpec, OpSpec
from .._common import AOT, JIT, PRIORITY, TOLERANCES, TORCH, TORCH_NPU, TRITON

_M = "opmux.kernels.ops.layernorm.op"


#: Measured on the H200 (docs/benchmarks/h200.md): with the residual add, from ~32M elements
#: (e.g. 4096 tokens x 8192) the Triton kernel moves bytes faster than the C++ one.
_CUDA_LARGE_ADD = (("cuda", 1 << 25, ("triton", "aot", "jit", "torch")),)


def _spec(
    name: str,
    cls: str,
    doc: str,
    mutates: tuple[str, ...],
    npu: bool = True,
    size_priority: tuple[tuple[str, int, tuple[str, ...]], ...] = (),
) -> OpSpec:
    backends = [
        BackendSpec("aot", f"{_M}:{cls}.forward_aot", AOT),
        BackendSpec("jit", f"{_M}:{cls}.forward_jit", JIT),
        BackendSpec("triton", f"{_M}:{cls}.forward_triton", TRITON),
        BackendSpec("torch", f"{_M}:{cls}.forward_torch", TORCH),
    ]
    if npu:  # the Gemma ops have no torch_npu equivalent (see op.py)
        backends.append(BackendSpec("torch_npu", f"{_M}:{cls}.forward_torch_npu", TORCH_NPU))
    return OpSpec(
        name=f"layernorm.{name}",
        reference=f"{_M}:{cls}.forward_native",
        backends=tuple(backends),
        default_priority=("torch",),
        priority=PRIORITY
        if npu
        else tuple((dev, tuple(b for b in order if b != "torch_npu")) for dev, order in PRIORITY),
        tolerances=TOLERANCES,
        samples=f"opmux.kernels.ops.layernorm.samples:{name}_samples",
        invalid_samples=f"opmux.kernels.ops.layernorm.samples:{name}_invalid",
        mutates=mutates,
        doc=doc,
        size_priority=size_priority,
    )


SPECS = (
    _spec("rmsnorm", "RMSNorm", "y = x * rsqrt(mean(x^2) + eps) * weight, over the last dim", ("out",)),
    _spec(
        "fused_add_rmsnorm",
        "FusedAddRMSNorm",
        "in place: residual += x; x = rmsnorm(residual)",
        ("x", "residual"),
        size_priority=_CUDA_LARGE_ADD,
    ),
    _spec(
        "gemma_rmsnorm",
        "GemmaRMSNorm",
        "y = x * rsqrt(mean(x^2) + eps) * (1 + weight), over the last dim, in fp32",
        ("out",),
        npu=False,
    ),
    _spec(
        "gemma_fused_add_rmsnorm",
        "GemmaFusedAddRMSNorm",
        "in place: residual += x; x = gemma_rmsnorm(residual)",
        ("x", "residual"),
        npu=False,
    ),
    _spec(
        "qk_norm",
        "QKNorm",
        "in place: per-head rmsnorm of q [..., Hq, D] and k [..., Hk, D] with weights [D]",
        ("q", "k"),
    ),
)
