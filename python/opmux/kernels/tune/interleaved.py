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

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, TypeVar

__all__ = ["FINALISTS", "final_round", "time_interleaved"]

#: how many of the first pass's fastest candidates the final round times again
FINALISTS = 3
#: a replay at least this long (us): the graph's launch cost spread over its calls
_REPLAY_US = 200.0
#: the round's length on a GPU (us of replays, all finalists together)
_ROUND_US = 3e5

C = TypeVar("C")


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


def final_round(
    torch: Any,
    device: str,
    timed: Sequence[tuple[float, C]],
    label: Callable[[C], str],
    make: Callable[[C, int], Callable[[], None]],
    calls: int,
    progress: IO[str],
    finalists: int = FINALISTS,
) -> tuple[tuple[float, C], dict[str, float]]:
    """The first pass's ``finalists`` fastest of ``timed`` (us per call, candidate) timed again
    side by side: (the fastest, us per call of each finalist). ``make(candidate, reps)`` gives a
    function of ``reps`` repetitions of ``calls`` calls; one replay repeats enough for about
    200 us. A failure (a candidate that cannot be captured) keeps the first pass's pick."""
    ranked = sorted(timed, key=lambda t: t[0])[:finalists]
    picked = {label(c): c for _, c in ranked}
    if device == "cpu":
        reps, rounds = 1, 2
    else:
        reps = max(1, min(64, math.ceil(_REPLAY_US / max(ranked[0][0] * calls, 1e-3))))
        per_round = sum(us for us, _ in ranked) * calls * reps
        rounds = max(5, min(40, math.ceil(_ROUND_US / max(per_round, 1.0))))
        rounds = math.ceil(rounds / len(picked)) * len(picked)  # each one first equally often
    try:
        us = time_interleaved(torch, {lb: make(c, reps) for lb, c in picked.items()}, device, rounds=rounds)
    except Exception as err:  # a finalist that cannot be captured: the first pass's pick stands
        print(f"  final round skipped: {type(err).__name__}: {err}".splitlines()[0], file=progress)
        return ranked[0], {}
    final = {lb: t / (reps * calls) for lb, t in us.items()}
    best = min(final, key=final.__getitem__)
    return (final[best], picked[best]), final
