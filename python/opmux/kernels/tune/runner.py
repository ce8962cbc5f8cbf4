"""The tuning loop: time candidate configs per (N, K, M), keep the fastest, write tables.

Four backends of the GEMM are tuned the same way (:class:`Tunable`): ``triton`` (launch
configurations: tiles, warps, stages, split-K), ``cuda`` (which launch config of the CUTLASS
kernel, an instantiation with its CTA swizzle and raster order: ``config_id``), ``skinny`` (the
skinny-M kernel's tiles per warp and warps along K, at most 16 rows) and ``select`` (which
backend the dispatcher tries first for the shape and M: each accepted backend timed through the
public function with ``backend=`` forced). Tune
``select`` last: it times the other backends with the tables they have then. After the
per-shape select tables, the run writes the size classes by M over every shape it timed
(``N=0,K=0``: the backend with the least total time at each M), for shapes without a table;
the M it did not time keep the classes the table has.

Resumable: each table in the output directory is reread first and its finished M entries are
skipped; a table is rewritten atomically after every M, so a stopped run loses at most the M
it was timing. A wall-clock budget is shared by the remaining entries (each gets an equal share
of what is left, so an early entry cannot starve the rest); each entry times at least the
default config and the next candidate.

On a GPU each candidate is timed in a CUDA graph (``triton.testing.do_bench_cudagraph``),
after a check that it matches the default config's output; then the fastest few are timed again
with their replays interleaved and the fastest of that round is written (``interleaved.py``: one
after another, the GPU's clock drift favours some positions). Without one the kernels run in the
Triton interpreter and are timed with ``time.perf_counter``: that exercises the loop, the files
and the resume, and the numbers mean nothing (the report says so).

torch and triton are imported when a run starts, not when this module is imported.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from opmux.kernels import _env, tuned
from opmux.kernels.ops.gemm._skinny_launch import MAX_ROWS as SKINNY_ROWS  # plain Python
from opmux.kernels.tune.interleaved import FINALISTS, final_round
from opmux.kernels.tune.space import candidates

__all__ = ["BACKENDS", "Entry", "Report", "tune"]

OP = "gemm.w8a8_block_fp8_matmul"
BACKENDS = ("triton", "cuda", "skinny", "select")


def _label(config: dict[str, Any]) -> str:
    return ",".join(str(v) for v in config.values())


@dataclass
class Entry:
    n: int
    k: int
    m: int
    config: dict[str, int]
    us: float
    tried: int
    skipped: bool = False
    #: us per candidate timed (its label: the config's values)
    timings: dict[str, float] = field(default_factory=dict)
    #: the final round: the fastest candidates' us with their replays interleaved (the pick)
    final: dict[str, float] = field(default_factory=dict)


@dataclass
class Report:
    """A run's outcome (the GEMM's and the fused MoE's loops alike): its entries (``Entry`` or
    ``moe.MoeEntry``) and the problems the budget left untimed."""

    device_name: str
    timing: str
    out: str
    entries: list[Any] = field(default_factory=list)
    unfinished: list[tuple[Any, ...]] = field(default_factory=list)
    #: problems the backend cannot run on this device (not budget: a rerun refuses them too)
    refused: list[tuple[Any, ...]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "device_name": self.device_name,
            "timing": self.timing,
            "out": self.out,
            "entries": [e.__dict__ for e in self.entries],
            "unfinished": [list(x) for x in self.unfinished],
            "refused": [list(x) for x in self.refused],
        }


def _setup(device: str | None) -> tuple[Any, str]:
    """(torch, device) with the Triton interpreter on when there is no GPU."""
    import torch  # lazy: the CLI imports torch when a run starts, never at package import

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before triton loads the kernels
    return torch, device


@dataclass
class Tunable:
    """One backend's candidates and how to run one of them on (out, a, b, a_scale, b_scale)."""

    candidates: Callable[[int, tuple[int, int]], list[dict[str, Any]]]
    run: Callable[[tuple[Any, ...], dict[str, Any]], None]
    #: every candidate is timed before an entry is written (a race of some backends names no
    #: fastest): the budget is checked between entries only
    exhaustive: bool = False


def _triton(op: str, torch: Any, device: str) -> Tunable:
    from opmux.kernels.ops.gemm import triton_kernels

    sms = {}
    if device != "cpu":  # the space's split-K and order follow the GPU's SM count
        sms["sms"] = torch.cuda.get_device_properties(device).multi_processor_count
    return Tunable(
        lambda m, shape: candidates(op, "triton", m, shape, **sms),
        lambda args, config: triton_kernels.launch(args[0], args[1], args[2], args[3], args[4], config),
    )


def _native_cfg(device: str) -> Any:
    """The CUDA kernel's ``_cfg`` entry: the AOT library's, else a JIT build (ValueError if neither)."""
    from opmux.kernels.errors import BackendUnavailable
    from opmux.kernels.ops._native import AOT, JIT

    errors = []
    for loader in (AOT, JIT):
        try:
            return loader._load("gemm", device, f"w8a8_block_fp8_matmul_{device}_cfg")
        except BackendUnavailable as err:
            errors.append(str(err))
    raise ValueError("the CUDA kernel is unavailable: " + "; ".join(errors))


def _cuda(op: str, device: str) -> Tunable:
    if device != "cuda":
        raise ValueError("--backend cuda tunes the CUDA kernel: it needs a GPU")
    from opmux.kernels.ops._native import AOT, JIT

    cfg = _native_cfg(device)
    count = default = None
    for loader in (AOT, JIT):
        try:
            count = int(loader._load("gemm", device, "w8a8_block_fp8_matmul_cuda_configs")())
            default = loader._load("gemm", device, "w8a8_block_fp8_matmul_cuda_default_config")
            break
        except Exception:
            continue
    if count is None or default is None:
        raise ValueError("the CUDA kernel's config list is unavailable")

    def cands(m: int, shape: tuple[int, int]) -> list[dict[str, Any]]:
        first = int(default(m, shape[0], shape[1]))
        return [{"config_id": first}] + [{"config_id": i} for i in range(count) if i != first]

    return Tunable(cands, lambda args, config: cfg(*args, config["config_id"], False))


def _skinny(op: str, device: str) -> Tunable:
    if device != "cuda":
        raise ValueError("--backend skinny tunes the skinny-M CUDA kernel: it needs a GPU")
    import itertools

    import torch

    from opmux.kernels.errors import BackendUnavailable
    from opmux.kernels.ops.gemm import _skinny_launch, skinny_cuda

    try:
        lib = skinny_cuda.library(torch.cuda.current_device())
    except BackendUnavailable as err:
        raise ValueError(f"the skinny kernel is unavailable: {err}") from err
    unit_default = lib["w8a8_block_fp8_matmul_skinny_cuda_default"]

    def cands(m: int, shape: tuple[int, int]) -> list[dict[str, Any]]:
        packed = int(unit_default(m, shape[0], shape[1]))  # tiles * 16 + warps along K
        first = dict(zip(_skinny_launch.KEYS, divmod(packed, 16), strict=True))
        pairs = itertools.product(_skinny_launch.TILES, _skinny_launch.K_WARPS)
        rest = [dict(zip(_skinny_launch.KEYS, p, strict=True)) for p in pairs]
        return [first] + [c for c in rest if c != first]

    def run(args: tuple[Any, ...], config: dict[str, Any]) -> None:
        out, a, b, sa, sb = args
        skinny_cuda.launch(out, a, b, sa, sb, config=(config["TILES"], config["K_WARPS"]))

    return Tunable(cands, run)


def _select(op: str, device: str) -> Tunable:
    import torch

    from opmux.kernels import ops
    from opmux.kernels.explain import op_instance
    from opmux.kernels.selector import Reason

    fn = ops.gemm.w8a8_block_fp8_matmul

    def cands(m: int, shape: tuple[int, int]) -> list[dict[str, Any]]:
        n, k = shape
        a = torch.empty(max(m, 1), k, device=device).to(torch.float8_e4m3fn)
        b = torch.empty(n, k, device=device).to(torch.float8_e4m3fn)
        sa = torch.ones(max(m, 1), math.ceil(k / 128), device=device)
        sb = torch.ones(math.ceil(n / 128), math.ceil(k / 128), device=device)
        sel = op_instance(op).select_for((a, b, sa, sb), {})
        return [
            {"backend": d.backend}
            for d in sel.decisions
            if (d.backend == sel.chosen or d.reason == Reason.LOWER_PRIORITY)
            and d.backend != "reference"
            and (device == "cpu" or d.backend != "torch")  # dequantize-and-mm: never fastest on a GPU
        ]

    def run(args: tuple[Any, ...], config: dict[str, Any]) -> None:
        out, a, b, sa, sb = args
        with _env.scope(OPMUX_FALLBACK="error"):  # a backend that cannot run is not timed as another
            fn(a, b, sa, sb, out=out, backend=config["backend"])

    return Tunable(cands, run, exhaustive=True)


#: a candidate agrees with the exact product when mean |out - exact| / mean |exact| is below this
#: (twice vLLM's 1e-3: elementwise tolerances fail correct results, bf16 rounding of long-K sums
#: that cancel near zero) ...
_AGREE = 2e-3
#: ... and no element is off by more than this fraction of the largest |exact| (bf16 rounds to
#: 2^-8 of a value; a wrong row, tile or split-K slice is off by a good part of the scale)
_LOCAL = 1e-2


def _relative_error(out: Any, reference: Any) -> float:
    """Mean |out - reference| / mean |reference|; inf unless both are finite everywhere (a NaN
    would pass any ``err > bound`` test)."""
    if not (bool(out.isfinite().all()) and bool(reference.isfinite().all())):
        return math.inf
    return float((out - reference).abs().mean() / reference.abs().mean().clamp_min(1e-30))


def _disagreement(out: Any, exact: Any) -> str | None:
    """Why ``out`` (the candidate's result, its buffer filled with NaN before the run) is not
    the product ``exact`` (float32), or None: every element written and finite, the mean and
    the largest error within bounds."""
    out = out.float()
    if not bool(out.isfinite().all()):
        bad = int((~out.isfinite()).sum())
        return f"{bad} of {out.numel()} elements not written or not finite"
    err = _relative_error(out, exact)
    if not err <= _AGREE:
        return f"mean |diff| / mean |exact| = {err:.2e}"
    worst = float((out - exact).abs().max())
    scale = float(exact.abs().max())
    if not worst <= _LOCAL * scale:
        return f"max |diff| = {worst:.3g}, above {_LOCAL:g} x max |exact| ({scale:.3g})"
    return None


def _exact(torch: Any, args: tuple[Any, ...]) -> Any:
    """The float32 product of the entry's inputs (dequantize both operands, one float32 mm):
    what every candidate is checked against, so a wrong first candidate cannot become the
    reference."""
    from opmux.kernels.ops.gemm.op import torch_w8a8

    out, a, b, a_scale, b_scale = args
    exact = torch.empty(out.shape, dtype=torch.float32, device=out.device)
    torch_w8a8(exact, a, b, a_scale, b_scale)
    return exact


def _inputs(torch: Any, n: int, k: int, m: int, device: str, out_dtype: Any) -> tuple[Any, ...]:
    gen = torch.Generator(device="cpu").manual_seed(n * 31 + k * 7 + m)
    kb = math.ceil(k / 128)
    a = torch.randn(m, k, generator=gen).clamp(-448, 448).to(torch.float8_e4m3fn).to(device)
    b = torch.randn(n, k, generator=gen).clamp(-448, 448).to(torch.float8_e4m3fn).to(device)
    a_scale = (torch.rand(m, kb, generator=gen) + 0.5).to(device)
    b_scale = (torch.rand(math.ceil(n / 128), kb, generator=gen) + 0.5).to(device)
    out = torch.empty(m, n, dtype=out_dtype, device=device)
    return out, a, b, a_scale, b_scale


#: bytes of L2 the timed inputs must overflow (the H200's is 60 MiB; larger parts are rare)
_L2_BYTES = 60 << 20


def _copies(n: int, k: int, m: int, device: str) -> int:
    """How many input sets the timing cycles through: 3x L2 worth, at most 8 (1 on the CPU)."""
    if device == "cpu":
        return 1
    per_set = n * k + m * k + 2 * m * n
    return max(1, min(8, math.ceil(3 * _L2_BYTES / per_set)))


def _run_all(
    run: Callable[[tuple[Any, ...], dict[str, Any]], None],
    sets: list[tuple[Any, ...]],
    config: dict[str, Any],
) -> None:
    for args in sets:
        run(args, config)


def _timer(torch: Any, device: str) -> Callable[[Callable[[], None]], float]:
    if device != "cpu":
        import triton.testing

        def bench_gpu(fn: Callable[[], None]) -> float:
            fn()  # compile outside the graph
            torch.cuda.synchronize()
            return float(triton.testing.do_bench_cudagraph(fn, rep=20)) * 1e3

        return bench_gpu

    def bench_cpu(fn: Callable[[], None]) -> float:
        fn()
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e6

    return bench_cpu


def _final_round(
    torch: Any,
    device: str,
    tunable: Tunable,
    sets: list[tuple[Any, ...]],
    timed: list[tuple[float, dict[str, Any]]],
    progress: IO[str],
) -> tuple[tuple[float, dict[str, Any]], dict[str, float]]:
    """The first pass's fastest candidates timed again side by side (``interleaved.final_round``):
    (best, us per finalist). A race of backends (``exhaustive``) takes every backend it timed, so
    its size classes compare times of one method."""

    def make(config: dict[str, Any], reps: int) -> Callable[[], None]:
        def run() -> None:
            for _ in range(reps):
                _run_all(tunable.run, sets, config)

        return run

    n = len(timed) if tunable.exhaustive else FINALISTS
    return final_round(torch, device, timed, _label, make, len(sets), progress, finalists=n)


def tune(
    shapes: Sequence[tuple[int, int]],
    ms: Sequence[int],
    *,
    out: Path,
    budget_s: float,
    op: str = OP,
    backend: str = "triton",
    device: str | None = None,
    max_configs: int | None = None,
    progress: IO[str] | None = None,
    retune: bool = False,
) -> Report:
    """Tune ``op`` for every (N, K) in ``shapes`` and M in ``ms``; tables go to ``out``.
    Entries already in a table are kept, or with ``retune`` timed again with their config
    tried first (a wider space then never writes a slower config than the one it replaces).
    Progress lines go to ``progress`` (``sys.stderr`` when None, looked up at the call)."""
    progress = sys.stderr if progress is None else progress
    if op != OP or backend not in BACKENDS:
        raise ValueError(f"cannot tune {op} on {backend!r}; tunable: {OP} on {', '.join(BACKENDS)}")
    refused: list[tuple[int, int, int]] = []
    if backend == "skinny":  # the kernel's own limits: M (its rows) and K (16-byte chunks)
        rows = SKINNY_ROWS
        if dropped := [m for m in ms if m > rows]:
            print(
                f"M {', '.join(map(str, dropped))} left out: the skinny kernel takes at most {rows} rows",
                file=progress,
            )
        ms = [m for m in ms if m <= rows]
        if not ms:
            raise ValueError(f"--backend skinny tunes M up to {rows} (the kernel's rows); none given")
        refused = [(n, k, m) for n, k in shapes if k % 16 for m in ms]
        shapes = [(n, k) for n, k in shapes if not k % 16]
        if refused:
            ks = sorted({k for _, k, _ in refused})
            print(
                f"K {', '.join(map(str, ks))} left out: the skinny kernel needs K a multiple of 16",
                file=progress,
            )
    torch, device = _setup(device)
    makers = {"triton": lambda: _triton(op, torch, device), "cuda": lambda: _cuda(op, device)}
    makers |= {"skinny": lambda: _skinny(op, device), "select": lambda: _select(op, device)}
    tunable = makers[backend]()
    dev_name = tuned.device_name(torch.device(device))
    timing = (
        "CUDA graphs (triton.testing.do_bench_cudagraph)"
        if device != "cpu"
        else "time.perf_counter in the Triton interpreter: NOT meaningful, a test of the tuner only"
    )
    report = Report(dev_name, timing, str(out), refused=list(refused))
    bench = _timer(torch, device)
    deadline = time.monotonic() + budget_s

    tables: dict[tuple[int, int], dict[int, dict[str, Any]]] = {}
    todo: list[tuple[int, int, int]] = []
    for n, k in shapes:
        key = tuned.table_key(op, backend, dev_name, (n, k))
        path = out / key.file_name()
        table: dict[int, dict[str, Any]] = {}
        if path.exists():  # resume: what a previous run finished stays
            table = {m: dict(c) for m, c in tuned.read_table(path, key).items()}
        tables[(n, k)] = table
        for m in ms:
            if m in table and not retune:
                report.entries.append(Entry(n, k, m, table[m], math.nan, 0, skipped=True))
            else:
                todo.append((n, k, m))
    total = len(todo)
    print(
        f"tuning {op} on {dev_name}: {total} entries, budget {budget_s:g} s; timing: {timing}", file=progress
    )

    for done, (n, k, m) in enumerate(todo):
        share = (deadline - time.monotonic()) / (total - done)
        if share <= 0:
            report.unfinished = todo[done:]
            break
        entry_deadline = time.monotonic() + share
        args = _inputs(torch, n, k, m, device, torch.bfloat16)
        # timed over copies that together overflow L2 three times (the weights are read from
        # HBM, as in a model's forward; one set alone would be L2-resident for small N x K)
        sets = [args] + [
            _inputs(torch, n, k, m, device, torch.bfloat16) for _ in range(1, _copies(n, k, m, device))
        ]
        exact = _exact(torch, args)
        best: tuple[float, dict[str, Any]] | None = None
        tried = 0
        timings: dict[str, float] = {}
        timed: list[tuple[float, dict[str, Any]]] = []
        previous = tables[(n, k)].get(m)
        space = tunable.candidates(m, (n, k))
        for config in [previous, *(c for c in space if c != previous)] if previous else space:
            if tried >= 2 and time.monotonic() > entry_deadline and not tunable.exhaustive:
                break
            if max_configs is not None and tried >= max_configs:
                break
            tried += 1
            try:
                args[0].fill_(math.nan)  # an element a config leaves unwritten shows
                tunable.run(args, config)
                if why := _disagreement(args[0], exact):
                    print(f"  wrong {config}: {why}", file=progress)
                    continue  # a wrong config is never written
                us = bench(functools.partial(_run_all, tunable.run, sets, config)) / len(sets)
                timings[_label(config)] = us
                timed.append((us, config))
            except Exception as err:  # out of resources, a compile failure: skip the config
                print(f"  skipped {config}: {type(err).__name__}: {err}".splitlines()[0], file=progress)
                continue
            if best is None or us < best[0]:
                best = (us, config)
        if best is None:
            report.unfinished.append((n, k, m))
            continue
        final: dict[str, float] = {}
        if len(timed) > 1:
            best, final = _final_round(torch, device, tunable, sets, timed, progress)
        tables[(n, k)][m] = best[1]
        path = out / tuned.table_key(op, backend, dev_name, (n, k)).file_name()
        tuned.write_table(path, tables[(n, k)])
        report.entries.append(Entry(n, k, m, best[1], best[0], tried, timings=timings, final=final))
        print(
            f"[{done + 1}/{total}] N={n} K={k} M={m} best {best[0]:.1f} us ({tried} configs)", file=progress
        )
    if backend == "select":
        _write_size_classes(report, out, op, dev_name, progress)
    if report.unfinished:
        print(
            f"budget spent: {len(report.unfinished)} entries left; run again to continue (finished ones are kept)",
            file=progress,
        )
    return report


def _write_size_classes(report: Report, out: Path, op: str, dev_name: str, progress: IO[str]) -> None:
    """The ``N=0,K=0`` select table: per M, the backend whose summed time over this run's
    shapes is least (only shapes where every summed backend was timed count). The M this run
    did not time keep the entries the table already has (a prefill race keeps the decode sizes)."""
    by_m: dict[int, list[dict[str, float]]] = {}
    for e in report.entries:
        if e.timings:  # the final round's times where it ran (interleaved), else the first pass's
            by_m.setdefault(e.m, []).append({**e.timings, **e.final})
    table: dict[int, dict[str, Any]] = {}
    for m, rows in sorted(by_m.items()):
        common = set.intersection(*(set(r) for r in rows))
        if common:
            table[m] = {"backend": min(common, key=lambda b: sum(r[b] for r in rows))}
    if table:
        key = tuned.table_key(op, "select", dev_name, (tuned.ANY_SHAPE, tuned.ANY_SHAPE))
        path = out / key.file_name()
        kept: dict[int, dict[str, Any]] = {}
        if path.is_file():
            try:
                kept = {m: dict(c) for m, c in tuned.read_table(path, key).items()}
            except tuned.TableError as err:  # this run's classes replace an unusable file
                print(f"size classes: {err}; rewritten with this run's M only", file=progress)
        tuned.write_table(path, {**kept, **table})
        print(f"size classes by M over {len(report.entries)} entries: {path.name}", file=progress)
