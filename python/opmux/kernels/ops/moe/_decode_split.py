"""The launch choice of the native MoE decode kernels (``jit/csrc/moe_decode_cuda.cu``): the output
columns each warp of the up and of the down kernel takes. Plain Python, so the tuned tables'
checks (``kernels/tuned.py``) and the tuner read the same rule as the backend without importing
torch.

A tuned table entry is ``{"UP_ROWS": u, "DOWN_ROWS": d}`` in
``E=..,N=..,device_name=..[,dtype=fp8_w8a8,block_shape=[128,128]],backend=cuda.json``: ``u`` one
of :data:`UP_ROWS`, ``d`` one of :data:`DOWN_ROWS` (the unit's instantiations; its host check
refuses others), or :data:`AUTO` (0) for the unit's own choice: the grid that fills whole waves of
resident blocks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import _launch_choices

__all__ = ["AUTO", "DOWN_ROWS", "KEYS", "MULTI_TOKEN", "UP_ROWS", "default_split", "problems"]

#: the up kernel's columns per warp (gate and up rows of each column), as instantiated
UP_ROWS = (1, 2, 4)
#: the down kernel's columns per warp, as instantiated
DOWN_ROWS = (1, 2, 4, 8)
#: "the unit chooses" (whole waves of resident blocks)
AUTO = _launch_choices.AUTO
#: a table entry's keys: (up, down)
KEYS = ("UP_ROWS", "DOWN_ROWS")
#: with no table, from this many tokens 4 columns a warp each (fewer blocks staging the same
#: rows): on an H100 (docs/benchmarks/moe_decode_cuda_h100.md) against the unit's choice at M = 4
#: to 16, 0.59-0.94x the time on DeepSeek-V3 fp8, 0.86-0.98x on Mixtral-8x7B, 0.98-1.03x on the
#: other bf16 shapes; below it the unit's choice (at one token 4 x 4 took up to 1.16x its time on
#: the bf16 shapes, the same on DeepSeek-V3 fp8)
MULTI_TOKEN = 4


def default_split(m: int) -> tuple[int, int]:
    """The (up, down) columns per warp with no tuned table for the shape and M."""
    return (4, 4) if m >= MULTI_TOKEN else (AUTO, AUTO)


def problems(entry: Mapping[str, Any]) -> list[str]:
    """What is wrong with a table entry (empty: usable)."""
    return _launch_choices.problems(entry, dict(zip(KEYS, (UP_ROWS, DOWN_ROWS), strict=True)))
