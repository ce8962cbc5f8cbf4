"""benchmarks/bench_gpu.time_impls without a GPU: a stand-in ``torch.cuda`` whose graphs record
their calls and whose events read a clock the replays advance. The columns come back in the
caller's order with their own input sets, a column whose capture fails is timed alone, and a
fault during the shared replays reports every column instead of ending the caller's run."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


class _Cuda:
    """Graph capture replays the captured calls; an event's time is the clock in us."""

    def __init__(self) -> None:
        self.clock = 0.0
        self.capturing: list[Callable[[], None]] | None = None
        self.fail_replay = False

    def _run(self, fn: Callable[[], None]) -> None:
        if self.capturing is not None:
            self.capturing.append(fn)
        else:
            fn()

    def synchronize(self) -> None:
        pass

    def Stream(self) -> Any:  # torch's name
        return SimpleNamespace(wait_stream=lambda _s: None)

    def current_stream(self) -> Any:
        return SimpleNamespace(wait_stream=lambda _s: None)

    @contextlib.contextmanager
    def stream(self, _s: Any) -> Iterator[None]:
        yield

    def CUDAGraph(self) -> Any:
        cuda = self

        class Graph:
            def __init__(self) -> None:
                self.calls: list[Callable[[], None]] = []

            def replay(self) -> None:
                if cuda.fail_replay:
                    raise RuntimeError("an illegal memory access was encountered")
                for c in self.calls:
                    c()

        return Graph()

    @contextlib.contextmanager
    def graph(self, g: Any) -> Iterator[None]:
        self.capturing = []
        try:
            yield
        finally:
            g.calls, self.capturing = self.capturing, None

    def Event(self, enable_timing: bool = False) -> Any:
        cuda = self

        class Event:
            t = 0.0

            def record(self) -> None:
                self.t = cuda.clock

            def synchronize(self) -> None:
                pass

            def elapsed_time(self, other: Any) -> float:
                return float(other.t - self.t) / 1e3  # ms

        return Event()


@pytest.fixture
def bench_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.syspath_prepend(str(BENCH))
    sys.modules.pop("bench_gpu", None)
    yield importlib.import_module("bench_gpu")
    sys.modules.pop("bench_gpu", None)


def _kernel(cuda: _Cuda, us: float, seen: list[Any] | None = None) -> Callable[[Any], Any]:
    def fn(a: Any) -> Any:
        def work() -> None:
            cuda.clock += us

        cuda._run(work)
        if seen is not None:
            seen.append(a)
        return a

    return fn


def test_columns_in_order_with_their_own_sets(bench_gpu: ModuleType) -> None:
    cuda = _Cuda()
    torch = SimpleNamespace(cuda=cuda)
    seen: list[Any] = []
    fns = {"slow": _kernel(cuda, 3.0), "fast": _kernel(cuda, 1.0, seen), "mid": _kernel(cuda, 2.0)}
    out = bench_gpu.time_impls(torch, fns, ["s0", "s1"], 4, 5, sets_of={"fast": ["p0", "p1"]})
    assert list(out) == ["slow", "fast", "mid"]
    assert {n: round(r["us"], 6) for n, r in out.items()} == {"slow": 3.0, "fast": 1.0, "mid": 2.0}
    assert all(r["method"] == "graph, interleaved" and r["R"] == 4 for r in out.values())
    assert set(seen) == {"p0", "p1"}  # the peer's own layout of the inputs, never the shared one


def test_a_failed_capture_is_timed_alone_and_keeps_its_place(bench_gpu: ModuleType) -> None:
    cuda = _Cuda()
    torch = SimpleNamespace(cuda=cuda)

    def uncapturable(a: Any) -> Any:
        if cuda.capturing is not None:
            raise RuntimeError("operation not permitted when stream is capturing")
        cuda.clock += 5.0
        return a

    out = bench_gpu.time_impls(torch, {"a": _kernel(cuda, 1.0), "b": uncapturable}, [0], 3, 3)
    assert list(out) == ["a", "b"]
    assert out["b"]["method"] == "events" and "capturing" in out["b"]["capture_error"]
    assert out["b"]["us"] == pytest.approx(5.0) and out["a"]["us"] == pytest.approx(1.0)


def test_a_fault_in_the_replays_reports_every_column(
    bench_gpu: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    cuda = _Cuda()
    torch = SimpleNamespace(cuda=cuda)
    fns = {"a": _kernel(cuda, 1.0), "b": _kernel(cuda, 2.0)}
    original_capture = bench_gpu._capture

    captured: list[Any] = []

    def capture(*args: Any) -> Any:
        captured.append(original_capture(*args))  # captured and replayed once, cleanly
        # every replay after the last capture fails, as a sticky fault would
        cuda.fail_replay = len(captured) == len(fns)
        return captured[-1]

    monkeypatch.setattr(bench_gpu, "_capture", capture)
    out = bench_gpu.time_impls(torch, fns, [0], 2, 3)
    assert list(out) == ["a", "b"]
    assert all("illegal memory access" in r["error"] for r in out.values())
