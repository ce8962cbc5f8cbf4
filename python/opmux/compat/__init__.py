"""Engine-compatible entry points: ``opmux.compat.sgl_kernel`` and ``opmux.compat.vllm``.

Each module has the exact signatures and conventions of the sgl_kernel functions / the
``vllm._custom_ops`` entries that opmux covers, each a thin call into the opmux op that writes
into the caller's buffers. Where the engines' conventions differ from opmux's own (the MoE fill
value, vLLM's activation rounding, division vs reciprocal in fp8 quantization, ...) these
modules follow the engine; ``docs/compat.md`` lists every difference in one table.

Importing this package (or either module) imports no torch; torch loads at the first call.
"""

from __future__ import annotations

__all__ = ["sgl_kernel", "vllm"]
