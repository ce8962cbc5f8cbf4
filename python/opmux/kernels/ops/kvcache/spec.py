"""Specs of the kvcache group (torch-free)."""

from __future__ import annotations

from ...spec import BackendSpec, OpSpec
from .._common import AOT, JIT, TORCH, TRITON, priority_without

_M = "opmux.kernels.ops.kvcache.op"

SPECS = (
    OpSpec(
        name="kvcache.reshape_and_cache",
        reference=f"{_M}:ReshapeAndCache.forward_native",
        backends=(
            BackendSpec("aot", f"{_M}:ReshapeAndCache.forward_aot", AOT),
            BackendSpec("jit", f"{_M}:ReshapeAndCache.forward_jit", JIT),
            BackendSpec("triton", f"{_M}:ReshapeAndCache.forward_triton", TRITON),
            BackendSpec("torch", f"{_M}:ReshapeAndCache.forward_torch", TORCH),
        ),
        default_priority=("torch",),
        priority=priority_without("torch_npu"),
        # a copy: every backend must be bit-exact
        tolerances=(("float32", (0.0, 0.0)), ("float16", (0.0, 0.0)), ("bfloat16", (0.0, 0.0))),
        samples="opmux.kernels.ops.kvcache.samples:reshape_and_cache_samples",
        invalid_samples="opmux.kernels.ops.kvcache.samples:reshape_and_cache_invalid",
        mutates=("key_cache", "value_cache"),
        doc="key/value [T, H, D] -> key_cache/value_cache[slot // bs, slot % bs] (slot -1: skip)",
    ),
)
