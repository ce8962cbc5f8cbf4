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
