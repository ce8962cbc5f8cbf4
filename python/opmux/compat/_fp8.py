"""fp8 constants shared by the compat modules.

The quantization conventions of the engines (vLLM's division by the scale, sgl-kernel's int8
truncation, UE8M0 scales and their packed layout, static and per-tensor scales) are features of
opmux's quantization ops (``divide_by_scale``, ``scale_ue8m0``, ``out_q`` / ``out_scale``, ...),
run by their kernels on every backend: the compat modules compose no quantization in torch.
"""

from __future__ import annotations

__all__ = ["FP8_MAX"]

FP8_MAX = 448.0
