"""The comm group's native CUDA unit (issue #31: all-reduce, fused with residual add + RMSNorm +
per-token fp8 quant): its layout header holds the numbers the Python side mirrors, and
(OPMUX_TEST_NVCC=1: nvcc, no GPU needed) the unit compiles for sm_90a and sm_80, exports both
functions and refuses arguments on the wrong device before touching memory."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

EXPORTS = ("comm_all_reduce_cuda", "comm_all_reduce_add_rmsnorm_cuda")


def _layout() -> dict[str, int]:
    """``constexpr <type> kName = <int>;`` lines of opmux/comm_layout.h."""
    from opmux.kernels.jit import KERNEL_PATH

    text = (Path(KERNEL_PATH) / "include" / "opmux" / "comm_layout.h").read_text(encoding="utf-8")
    return {m[1]: int(m[2]) for m in re.finditer(r"^constexpr \w+ (k\w+) = (\d+);", text, re.M)}


def test_layout_header_numbers() -> None:
    k = _layout()
    assert k["kMaxBlocks"] == 64 and k["kMaxWorld"] == 8
    assert k["kFlagsBytes"] == 4096 and k["kCapAlign"] == 4096
    assert k["kMaxBlocks"] * k["kMaxWorld"] * 4 <= k["kFlagsBytes"]  # uint32 flags[blocks][world]
    assert k["kCounters"] == 256
    # per-block epochs, then the call count and the finished-blocks count, inside the counters
    assert k["kCounterEpoch"] + k["kMaxBlocks"] <= k["kCounterCall"] < k["kCounterDone"] < k["kCounters"]
    assert (k["kAlgoOneShot"], k["kAlgoTwoShot"]) == (1, 2)


def test_python_mirrors_the_layout() -> None:
    """ops/comm/ipc.py allocates what the header lays out (buffer, counters, worlds, grid)."""
    from opmux.kernels.ops.comm import ipc

    k = _layout()
    assert (ipc.FLAG_BYTES, ipc.REGION_ALIGN, ipc.COUNTERS) == (
        k["kFlagsBytes"],
        k["kCapAlign"],
        k["kCounters"],
    )
    assert ipc.WORLDS == tuple(range(1, k["kMaxWorld"] + 1))
    assert dict(zip(ipc.ALGORITHMS, (1, 2), strict=True)) == ipc._ALGO


def test_cuda_unit_compiles_for_sm90a_and_sm80(nvcc_unit: Callable[[str], Any]) -> None:
    mod = nvcc_unit("comm_cuda")
    for name in EXPORTS:
        assert mod[name] is not None
    # the first checks need no GPU: CPU tensors are refused, naming the argument
    x = torch.zeros(4, 8, dtype=torch.bfloat16)
    ptrs = torch.zeros(2, dtype=torch.int64)
    counters = torch.zeros(256, dtype=torch.int32)
    with pytest.raises(ValueError, match="x is on device cpu"):
        mod["comm_all_reduce_cuda"](x, x, ptrs, counters, 0, 2, 4096, 1, 0)
    w = torch.ones(8, dtype=torch.bfloat16)
    none_q = torch.empty(0, dtype=torch.uint8)
    none_s = torch.empty(0)
    with pytest.raises(ValueError, match="x is on device cpu"):
        mod["comm_all_reduce_add_rmsnorm_cuda"](
            x, x.clone(), w, 1e-6, none_q, none_s, ptrs, counters, 0, 2, 4096, 2, 0
        )
