"""The launch choice of the skinny-M GEMM kernel (``jit/csrc/gemm_skinny_cuda.cu``): the 8-column
tiles each warp takes and the warps of a block that split K. Plain Python, so the tuned tables'
checks (``kernels/tuned.py``), the tuner and the backend read one rule without importing torch.

A tuned table entry is ``{"TILES": t, "K_WARPS": w}`` in
``N=..,K=..,device_name=..,dtype=fp8_w8a8,block_shape=[128,128],backend=skinny.json``: ``t`` one of
:data:`TILES`, ``w`` one of :data:`K_WARPS` (the unit's instantiations; its host check refuses
others), or :data:`AUTO` (0) for the unit's own choice (``default_launch`` in the unit: one tile a warp,
and as many warps along K as keep four K blocks each and at most 32 warps per SM in all). The
kernel runs one instantiation for M up to 8 (the MMA's first 8 rows) and another for 9 to 16;
tables hold M = 1, 8 and 16, and an M with no entry within 4x (``tuned``'s reach) runs the unit's
own choice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import _launch_choices

__all__ = ["AUTO", "KEYS", "K_WARPS", "MAX_ROWS", "TILES", "default_launch", "problems"]

#: 8-column tiles per warp, as instantiated
TILES = (1, 2, 4)
#: warps of a block (of 8) along K, as the unit takes them
K_WARPS = (1, 2, 4, 8)
#: "the unit chooses"
AUTO = _launch_choices.AUTO
#: a table entry's keys
KEYS = ("TILES", "K_WARPS")
#: the most rows of ``a`` the kernel takes (the MMA's M)
MAX_ROWS = 16


def default_launch(m: int) -> dict[str, int]:
    """The launch with no tuned table for the shape and M: the unit's own choice."""
    return dict.fromkeys(KEYS, AUTO)


def problems(entry: Mapping[str, Any]) -> list[str]:
    """What is wrong with a table entry (empty: usable)."""
    return _launch_choices.problems(entry, dict(zip(KEYS, (TILES, K_WARPS), strict=True)))
