"""benchmarks/tune/moe_decode_pdl.py on the CPU (Triton's interpreter, a tiny bf16 preset, a
stand-in timer): the MoE decode launch with and without PDL gives the same bits, both columns go
to one interleaved timing, and the table renders."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.syspath_prepend(str(BENCH / "tune"))
    for name in ("moe_decode_pdl", "bench_gpu"):
        sys.modules.pop(name, None)
    mod = importlib.import_module("moe_decode_pdl")
    yield mod
    for name in ("moe_decode_pdl", "bench_gpu"):
        sys.modules.pop(name, None)


def test_pdl_and_plain_timed_together(script: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    from opmux.kernels.tune import models

    monkeypatch.setattr(script, "DEVICE", "cpu")
    monkeypatch.setitem(models.MOE_MODELS, "Tiny", (8, 256, 256, 2, "bf16"))
    calls: list[list[str]] = []

    def fake(torch_: Any, fns: dict[str, Any], sets: list[Any], R: int, replays: int) -> dict[str, Any]:
        calls.append(list(fns))
        for f in fns.values():
            for s in sets:
                f(s)
        return {n: {"us": 5.0 + i, "method": "graph, interleaved", "R": R} for i, n in enumerate(fns)}

    monkeypatch.setattr(script, "time_impls", fake)
    case = script.run_case(torch, "Tiny", 2, 3000.0, 3)
    assert case["identical"] and case["config"]["DECODE"] == 1
    assert calls == [["PDL (default)", "plain"]]
    assert case["impls"]["plain"]["copy_frac"] > 0
    md = script.render({"env": {"device": "cpu"}, "copy": {"GBps": 3000.0}, "cases": [case]})
    assert "| Tiny | bf16 | 2 |" in md and "0.833" in md


class _Recorder:
    """A stand-in kernel: ``kernel[grid](*args, **kw)`` records the launch's keywords."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __getitem__(self, grid: Any) -> Any:
        return lambda *a, **kw: self.calls.append(kw)


def test_pdl_false_launches_the_down_kernel_plainly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the device has PDL the up kernel triggers and the down kernel waits and launches
    programmatically; ``pdl=False`` turns all three off together."""
    from opmux.kernels.ops.moe import fused_experts_decode as fed

    up, down = _Recorder(), _Recorder()
    monkeypatch.setattr(fed, "_up_kernel", up)
    monkeypatch.setattr(fed, "_down_kernel", down)
    monkeypatch.setattr(fed, "_pdl", lambda device: True)
    e, n, k, m, topk = 4, 64, 128, 2, 2
    w1, w2 = torch.randn(e, 2 * n, k).bfloat16(), torch.randn(e, k, n).bfloat16()
    hidden, out = torch.randn(m, k).bfloat16(), torch.empty(m, k).bfloat16()
    tw, ti = torch.rand(m, topk), torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    empty, emap = torch.empty(0), torch.empty(0, dtype=torch.int32)
    cfg = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
           "num_stages": 2, "DECODE": 1}  # fmt: skip
    for pdl, on in ((None, True), (False, False)):
        fed.launch_decode(out, hidden, w1, w2, tw, ti, empty, empty, emap, "silu", False, cfg, pdl=pdl)
        assert up.calls[-1]["USE_PDL"] is on and down.calls[-1]["USE_PDL"] is on
        assert down.calls[-1].get("launch_pdl", False) is on
