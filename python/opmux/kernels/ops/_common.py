"""Helpers shared by op groups: backend requirement presets, tolerances, sample type."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..spec import Requirement

FLOATS = ("float32", "float16", "bfloat16")

#: (atol, rtol) against the reference, per dtype: 1-2 output ulps of each format.
TOLERANCES: tuple[tuple[str, tuple[float, float]], ...] = (
    ("float32", (1e-5, 1e-5)),
    ("float16", (2e-3, 2e-3)),
    ("bfloat16", (1.6e-2, 1.6e-2)),
)

#: fp8 e4m3fn outputs (quantization): one e4m3 ulp. A normal e4m3 value v has spacing at most
#: v/8 (3 mantissa bits), so rtol 0.125 admits one ulp; atol 2**-9 is the subnormal spacing.
#: Backends compute the same fp32 value before rounding, so they normally agree bit for bit;
#: the ulp allows for a GPU compiler's different (but correctly rounded) fp32 arithmetic.
FP8_E4M3_TOLERANCE: tuple[str, tuple[float, float]] = ("float8_e4m3fn", (2.0**-9, 0.125))
#: Index outputs (expert ids, token positions) must match exactly.
INT32_EXACT: tuple[str, tuple[float, float]] = ("int32", (0.0, 0.0))

TORCH = Requirement(devices=("cpu", "cuda", "hip", "xpu", "npu", "mps"))
TRITON = Requirement(devices=("cuda", "hip", "xpu", "cpu"), capabilities=("triton",))
JIT = Requirement(devices=("cpu", "cuda"), capabilities=("jit:{device}",))
AOT = Requirement(devices=("cpu", "cuda"), capabilities=("aot:{device}",))
TORCH_NPU = Requirement(devices=("npu",), capabilities=("torch_npu",))

#: Default priorities per platform device type (benchmarks in docs/benchmarks decide).
PRIORITY: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cpu", ("aot", "jit", "torch")),
    ("cuda", ("aot", "jit", "triton", "torch")),
    ("hip", ("triton", "torch")),
    ("xpu", ("triton", "torch")),
    ("npu", ("torch_npu", "torch")),
)


@dataclass(frozen=True)
class Sample:
    """One parity case: the op's positional args and kwargs, freshly made per call."""

    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: backends that do not take this case (e.g. strided rows), with the reason
    skip: tuple[tuple[str, str], ...] = ()
