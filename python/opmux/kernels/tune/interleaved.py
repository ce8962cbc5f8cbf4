"""An entry's final round: its fastest candidates timed again side by side.

Timed one after another, a kernel's time follows the GPU's clocks, and under fp8 load an H100's
clocks move within seconds: the same CUTLASS kernel timed 10% apart as the first and as a late
candidate of one entry (docs/benchmarks/gemm_cutlass_h100.md, call E). The tuner's first pass
ranks every candidate; this round re-times the few fastest with their work captured in one CUDA
graph each, the graphs replayed in turn and the order rotated every round, and keeps each one's
median replay. On the CPU (the interpreter: a test of the tuner only) the calls alternate the same
way, timed with ``time.perf_counter``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["FINALISTS", "time_interleaved"]

#: how many of the first pass's fastest candidates the final round times again
FINALISTS = 3


def _rotations(labels: list[str], rounds: int) -> list[list[str]]:
    return [labels[r % len(labels) :] + labels[: r % len(labels)] for r in range(rounds)]


def time_interleaved(
    torch: Any, fns: Mapping[str, Callable[[], None]], device: str, *, rounds: int
) -> dict[str, float]:
    """Microseconds per call of each function (the median over ``rounds``), calls interleaved.

    Each function is called once first, outside any graph (a Triton kernel compiles there)."""
    labels = list(fns)
    samples: dict[str, list[float]] = {label: [] for label in labels}
    for fn in fns.values():
        fn()
    if device == "cpu":
        for order in _rotations(labels, rounds):
            for label in order:
                start = time.perf_counter()
                fns[label]()
                samples[label].append((time.perf_counter() - start) * 1e6)
        return {label: statistics.median(v) for label, v in samples.items()}

    torch.cuda.synchronize()
    graphs = {}
    for label, fn in fns.items():
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        graphs[label] = graph
    for graph in graphs.values():  # one warm replay each before anything is timed
        graph.replay()
    events: list[tuple[str, Any, Any]] = []
    for order in _rotations(labels, rounds):
        for label in order:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graphs[label].replay()
            end.record()
            events.append((label, start, end))
    torch.cuda.synchronize()
    for label, start, end in events:
        samples[label].append(start.elapsed_time(end) * 1e3)
    return {label: statistics.median(v) for label, v in samples.items()}
