"""Specs of the rope group (torch-free)."""

from __future__ import annotations

from ...spec import BackendSpec, OpSpec
from .._common import AOT, JIT, PRIORITY, TOLERANCES, TORCH, TORCH_NPU, TRITON

_M = "opmux.kernels.ops.rope.op"
_C = "RotaryEmbedding"

SPECS = (
    OpSpec(
        name="rope.rotary_embedding",
        reference=f"{_M}:{_C}.forward_native",
        backends=(
            BackendSpec("aot", f"{_M}:{_C}.forward_aot", AOT),
            BackendSpec("jit", f"{_M}:{_C}.forward_jit", JIT),
            BackendSpec("triton", f"{_M}:{_C}.forward_triton", TRITON),
            BackendSpec("torch", f"{_M}:{_C}.forward_torch", TORCH),
            BackendSpec("torch_npu", f"{_M}:{_C}.forward_torch_npu", TORCH_NPU),
        ),
        default_priority=("torch",),
        priority=PRIORITY,
        tolerances=TOLERANCES,
        samples="opmux.kernels.ops.rope.samples:rotary_embedding_samples",
        invalid_samples="opmux.kernels.ops.rope.samples:rotary_embedding_invalid",
        mutates=("query", "key"),
        doc="in place: rotate query/key heads by cos_sin_cache[positions] (neox or gptj, partial rotary)",
    ),
)
