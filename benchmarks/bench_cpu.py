"""opmux's CPU kernels against torch eager and torch.compile (inductor), side by side.

    PYTHONPATH=python python benchmarks/bench_cpu.py --out docs/benchmarks/cpu

The op cases of the GPU suite and the ops added since (benchmarks/bench_cases.py, ``cases(extra=True)``;
kvcache.swap_blocks is not among them: it has no kernel, its copies are ``Tensor.copy_`` calls,
transfers between devices for the copy engine) at CPU token counts T = 1, 32, 256
and 4096, in bfloat16, float16 and float32 (``--big-dtypes`` can limit T = 4096 to fewer dtypes;
a T = 4096 call is timed once per round, so all three take a few minutes). For every (op, dtype,
T) one process times, interleaved in rounds on one input set (fresh copies for in-place ops):

* ``eager``: the plain PyTorch version as users write it, in the input dtype;
* ``compile``: ``torch.compile`` (inductor, static shapes) of that same function;
* every opmux backend this machine accepts for the call (``backend=`` forced: ``jit``, ``aot``,
  the ``torch`` reference), and the public call with no override (``default``);
* ``kernel``: the C++ kernel the default call chose, called directly with the arguments the op's
  contract computed once beforehand (no argument checks, no dispatch, no output allocation), so
  ``default - kernel`` is the Python host path around it.

Triton runs in its interpreter on CPU and is not timed. Every cell is set up first (inputs,
compiled graph, warm-up); then ``--rounds`` rounds each time every cell once, each candidate for
about ``--ms`` milliseconds of calls in windows of ``--window-ms`` (a call at least), the
candidates' windows interleaved in shuffled orders, the round's figure a candidate's fastest
window (a T = 4096 cell: two windows of one call). A cell's rounds are thereby
spread over the whole run, and a candidate's figure is its best round (the machine is shared, so a
busy spell only ever makes a round slower), with the median beside it in the JSON. Cells whose
default / compile ratio lands near 1 (``--close``) then get ``--extra-rounds`` more rounds, every
candidate alike, so a close call is not decided by one busy spell. The run starts and ends with a
memory bandwidth probe (a large ``copy_``) and every round copies 256 MiB once more (its best round
is the ``copy`` bandwidth of the quiet spells the best rounds come from), so a memory-bound case
can be judged against what the machine moves in the same run; the load average is recorded.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_cases as bc

SIZES = (1, 32, 256, 4096)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _time(fn: Any, sets: list[Any], reps: int) -> float:
    t0 = time.perf_counter_ns()
    for i in range(reps):
        fn(sets[i % len(sets)])
    return (time.perf_counter_ns() - t0) / reps / 1e3


def _cast(op: str, args: bc.Args, dtype: torch.dtype) -> bc.Args:
    """The case's activations in ``dtype``: its bfloat16 tensors, and topk_softmax's float32
    gating logits (index tensors, the rope cos/sin cache and fp8 tensors stay)."""
    wide = (torch.bfloat16, torch.float32) if op == "moe.topk_softmax" else (torch.bfloat16,)
    return tuple(a.to(dtype) if isinstance(a, torch.Tensor) and a.dtype in wide else a for a in args)


def _tensor_bytes(args: bc.Args) -> int:
    return sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))


def bandwidth_gbs(threads: int, mib: int = 512, rounds: int = 5) -> float:
    """Best of ``rounds`` large copies, read + write bytes per second (GB/s)."""
    torch.set_num_threads(threads)
    n = mib * 2**20 // 4
    src = torch.ones(n, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = min(_time(lambda _: dst.copy_(src), [None], 3) for _ in range(rounds))
    return 2 * n * 4 / (best * 1e-6) / 1e9


class CopyProbe:
    """A 256 MiB ``copy_`` timed once per round: the best round's bandwidth (read + write, GB/s)
    is what the machine moves in the quiet spells that the cells' best rounds also come from."""

    def __init__(self, mib: int = 256) -> None:
        n = mib * 2**20 // 4
        self.src = torch.ones(n, dtype=torch.float32)
        self.dst = torch.empty_like(self.src)
        self.dst.copy_(self.src)
        self.samples: list[float] = []

    def round(self) -> None:
        us = _time(lambda _: self.dst.copy_(self.src), [None], 1)
        self.samples.append(2 * self.src.numel() * 4 / (us * 1e-6) / 1e9)


def first_touch_gbs(threads: int, mib: int = 256, rounds: int = 5) -> float:
    """Best of ``rounds`` writes of a freshly allocated tensor (``torch.empty(...).fill_``), GB/s:
    the rate at which a call can produce a large new output, page faults included."""
    torch.set_num_threads(threads)
    n = mib * 2**20 // 4
    best = min(
        _time(lambda _: torch.empty(n, dtype=torch.float32).fill_(1.0), [None], 2) for _ in range(rounds)
    )
    return n * 4 / (best * 1e-6) / 1e9


def cpu_model() -> dict[str, str]:
    info = {"model": platform.processor() or platform.machine(), "flags": ""}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return info
    for line in out.splitlines():
        key, _, val = line.partition(":")
        if key.strip() == "Model name":
            info["model"] = val.strip()
        elif key.strip() == "Flags":
            wanted = ("avx2", "avx512f", "avx512bw", "avx512_bf16", "avx512_fp16", "amx_bf16", "fma", "f16c")
            info["flags"] = " ".join(f for f in val.split() if f in wanted)
        elif key.strip() in ("L2 cache", "L3 cache"):
            info[key.strip()] = val.strip()
    return info


def _backends(case: bc.OpCase, p: Any, k: Any) -> tuple[str, list[str]]:
    from opmux.kernels import explain

    sel = explain(case.op, *p, **k)
    names = [d.backend for d in sel.decisions if d.accepted and d.backend != "triton"]
    return sel.chosen, names


def _kernel_args(case: bc.OpCase, chosen: str, p: Any, k: Any) -> tuple[Any, Any] | None:
    """The native kernel ``chosen`` binds for ``case`` and a function giving its arguments for
    one call's (p, k): the op's own contract (``check``) run once per input set, outside the
    timing. None where the default call is not a native kernel or the contract cannot be read."""
    if chosen not in ("jit", "aot"):
        return None
    try:
        from opmux.kernels.ops._native import AOT, JIT

        mod, _, name = case.public.partition(":")
        decl = getattr(importlib.import_module(mod + ".op"), name)
        kernel = (JIT if chosen == "jit" else AOT).kernel(case.op, "cpu")
        params = decl.params
        sig = ", ".join(q.name if q.default is None else f"{q.name}={q.default}" for q in params)
        scope: dict[str, Any] = {}
        exec(f"def full({sig}): return ({', '.join(q.name for q in params)},)", scope)

        def kargs(pp: Any, kk: Any) -> Any:
            return decl.check(decl.name, *scope["full"](*pp, **kk))[0]

        kargs(p, k)
    except Exception as exc:  # the contract's internals are another module's: never fatal here
        print(f"{case.op}: no kernel-only timing ({type(exc).__name__}: {exc})", flush=True)
        return None
    return kernel, kargs


def _fresh(fn: Any) -> Any:
    """``fn`` with a code object of its own: torch.compile caches per code object, so each cell's
    compiled graph is the only entry its guards check (no recompile chain across cells)."""
    return types.FunctionType(
        fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )


class Cell:
    """One (op, dtype, T): its inputs, its candidates (compiled and warm), its samples."""

    def __init__(
        self,
        case: bc.OpCase,
        fn: Any,
        dtype: torch.dtype,
        t: int,
        ms: float,
        big_t: int = 4096,
        window_ms: float = 0.25,
    ) -> None:
        self.case, self.dtype, self.shape = case, dtype, bc.Shape(t, case.shapes[0].dims)
        raw = case.make(self.shape, bc._gen("cpu", 1234), "cpu")
        base = _cast(case.op, raw, dtype)
        self.nbytes = case.nbytes(self.shape) * _tensor_bytes(base) / max(1, _tensor_bytes(raw))
        self.base = base
        self.sets = [bc.clone_args(base)] if case.mutates else [base]
        p0, k0 = case.callargs(base)
        self.chosen, names = _backends(case, p0, k0)

        # the public call's arguments built once per argument set (a set's tensors are the same
        # objects all run long, refreshed in place), as eager gets its tuple: the harness's own
        # per-call work (callargs, a kwargs dict) would otherwise be timed on opmux's side only
        def opmux(backend: str | None) -> Any:
            # id(set) -> (set, args, kwargs), for the sets of self.sets only (a replaced list's
            # entries are dropped, not kept alive)
            calls: dict[int, tuple[Any, Any, dict[str, Any]]] = {}

            def call(a: Any) -> Any:
                pk = calls.get(id(a))
                if pk is None or pk[0] is not a:
                    p, k = case.callargs(a)
                    pk = (a, p, k if backend is None else {**k, "backend": backend})
                    if any(a is st for st in self.sets):  # not a warm-up's throwaway copy
                        live = {id(st) for st in self.sets}
                        for stale in [i for i in calls if i not in live]:
                            del calls[stale]
                        calls[id(a)] = pk
                return fn(*pk[1], **pk[2])

            return call

        compiled = torch.compile(_fresh(case.eager), dynamic=False)
        self.impls: dict[str, Any] = {
            "eager": lambda a: case.eager(*a),
            "compile": lambda a: compiled(*a),
            "default": opmux(None),
        }
        # at the big sizes a call is milliseconds and the host path nothing: the forced backends
        # (the default's own kernel among them) and the kernel-only call are left out there
        big = self.big = t >= big_t
        if not big:
            self.impls.update({b: opmux(b) for b in names})
        for f in self.impls.values():  # warm up: compile / load, allocator
            f(bc.clone_args(base))
            f(self.sets[0])
        once = max(1.0, min(_time(self.impls["default"], self.sets, 1) for _ in range(3)))
        # A round gives each candidate ~ms of calls in windows of ~window_ms (reps calls each),
        # the candidates' windows interleaved; the round's figure is a candidate's fastest
        # window: on the shared machine a short window is often undisturbed where a long one is
        # not. A big cell's call is a window of its own, two a round.
        self.reps = int(min(1000, max(1, window_ms * 1e3 / once)))
        self.windows = 2 if big else int(min(16, max(1, ms * 1e3 / (self.reps * once))))
        if case.mutates:
            # An in-place op applied to its own output many times drifts (qk_norm's repeated
            # weight scaling reaches subnormals, which are slow everywhere): every round starts
            # from fresh copies, and each copy takes at most 4 calls a round (within ~256 MiB).
            per_set = max(1, _tensor_bytes(base))
            n = min(-(-self.reps // 4), max(1, (256 << 20) // per_set))
            self.sets = [bc.clone_args(base) for _ in range(n)]
        direct = None if big else _kernel_args(case, self.chosen, p0, k0)
        if direct is not None:
            kernel, kargs = direct
            prepared = {id(st): kargs(*case.callargs(st)) for st in self.sets}
            self.impls["kernel"] = lambda a: kernel(*prepared[id(a)])
            self.impls["kernel"](self.sets[0])
        self.samples: dict[str, list[float]] = {k: [] for k in self.impls}

    def round(self, rng: random.Random, big_eager_rounds: int = 1 << 30) -> None:
        fastest: dict[str, float] = {}
        for _ in range(self.windows):
            order = list(self.impls.items())
            rng.shuffle(order)
            for name, f in order:
                if name == "eager" and self.big and len(self.samples[name]) >= big_eager_rounds:
                    continue  # the slowest candidate at T = 4096, and not the one compared against
                if self.case.mutates:
                    for st in self.sets:
                        for a, b in zip(st, self.base, strict=True):
                            if isinstance(a, torch.Tensor):
                                a.copy_(b)
                us = _time(f, self.sets, self.reps)
                fastest[name] = min(fastest.get(name, us), us)
        for name, us in fastest.items():
            self.samples[name].append(us)

    def row(self) -> dict[str, Any]:
        best = {k: min(v) for k, v in self.samples.items()}
        med = {k: statistics.median(v) for k, v in self.samples.items()}
        return {
            "op": self.case.op,
            "shape": self.shape.label,
            "T": self.shape.T,
            "dtype": str(self.dtype).removeprefix("torch."),
            "chosen": self.chosen,
            "reps": self.reps,
            "samples": len(self.samples["default"]),
            "best_us": {k: round(v, 2) for k, v in best.items()},
            "median_us": {k: round(v, 2) for k, v in med.items()},
            "bytes": int(self.nbytes),
            "default_gbs": round(self.nbytes / (best["default"] * 1e-6) / 1e9, 1),
            "compile_gbs": round(self.nbytes / (best["compile"] * 1e-6) / 1e9, 1),
            "default/compile": round(best["default"] / best["compile"], 2),
            "default/eager": round(best["default"] / best["eager"], 2),
        }


def _close(c: Cell, band: float) -> bool:
    """A close or unsettled cell: default / compile (best rounds) within ``band`` of 1, either
    side; or the two best rounds of default or of compile more than ``band`` apart (the best is
    not settled yet); or the default and the forced backend it chose (the same kernel) more than
    ``band`` apart. Nothing here looks at which candidate is ahead."""
    best = {k: min(v) for k, v in c.samples.items()}
    r = best["default"] / best["compile"]
    same = best.get(c.chosen, best["default"]) / best["default"]
    unsettled = any(
        len(c.samples[k]) > 1 and sorted(c.samples[k])[1] > (1 + band) * best[k]
        for k in ("default", "compile")
    )
    return 1 / (1 + band) <= r <= 1 + band or unsettled or not 1 / (1 + band) <= same <= 1 + band


def _enable_bridge() -> str:
    """The torch-linked bridge (torch_kernels: the default calls' entries into lanes that allocate
    their outputs), built and loaded before any cell, as a server would (prewarm): a user's first
    calls otherwise start its build in the background and run without it until it is done."""
    try:
        from opmux.kernels import torch_kernels
    except ImportError:
        return "absent"
    if not torch_kernels.enabled():
        return "off (OPMUX_TORCH_KERNELS)"
    try:
        torch_kernels.enable()
    except Exception as exc:
        print(
            f"bench_cpu: the bridge is unavailable: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True
        )
        return f"unavailable: {type(exc).__name__}"
    return "on" if torch_kernels.module() is not None else "off"


def run(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    torch.set_num_threads(args.threads)
    torch._dynamo.config.recompile_limit = 1024
    torch._dynamo.config.accumulated_recompile_limit = 4096
    t_start = time.time()
    load0 = os.getloadavg()
    bw0 = bandwidth_gbs(args.threads)
    ft0 = first_touch_gbs(args.threads)
    bridge = _enable_bridge()
    cells: list[Cell] = []
    for case in bc.cases(extra=True):
        if args.ops and not any(s in case.op for s in args.ops.split(",")):
            continue
        mod, _, name = case.public.partition(":")
        fn = getattr(importlib.import_module(mod), name)
        for t in args.sizes:
            dtypes = args.big_dtypes if t >= 4096 else args.dtypes
            probe = case.make(bc.Shape(1, case.shapes[0].dims), bc._gen("cpu", 1), "cpu")
            if all(a is b for a, b in zip(_cast(case.op, probe, torch.float16), probe, strict=True)):
                dtypes = dtypes[:1]  # no activation tensor (moe_align_block_size): one dtype
            for dn in dtypes:
                cells.append(Cell(case, fn, DTYPES[dn], t, args.ms, window_ms=args.window_ms))
    print(f"{len(cells)} cells ready in {time.time() - t_start:.0f} s", flush=True)
    # Rounds over all cells, so each cell's rounds are spread over the whole run: a busy spell of
    # the shared machine then costs a cell a few rounds, not all of them.
    rng = random.Random(0)
    probe = CopyProbe()
    budget = args.budget_min * 60 if args.budget_min else float("inf")
    done = 0
    for i in range(args.rounds):
        t_round = time.time()
        probe.round()
        for c in cells:
            c.round(rng, args.big_eager_rounds)
        done = i + 1
        now = time.time()
        print(f"round {done}/{args.rounds} at {now - t_start:.0f} s", flush=True)
        # a time budget (the shared machine's load sets how long a round takes): stop the main
        # rounds where one more would pass 80% of it, keeping the rest for the close cells
        if done >= args.min_rounds and now - t_start + (now - t_round) > 0.8 * budget:
            break
    # Close or noisy cells: more rounds, every candidate of the cell alike, chosen once (not
    # re-chosen as results come in, so no cell is sampled until it happens to come out ahead).
    close = [c for c in cells if _close(c, args.close)]
    extra = 0
    for i in range(args.extra_rounds if close else 0):
        if time.time() - t_start > budget:
            break
        extra = i + 1
        probe.round()
        for c in close:
            c.round(rng)
        print(
            f"extra round {i + 1}/{args.extra_rounds} ({len(close)} cells) at {time.time() - t_start:.0f} s",
            flush=True,
        )
    bw1 = bandwidth_gbs(args.threads)
    ft1 = first_touch_gbs(args.threads)
    rows = [c.row() for c in cells]
    for row in rows:
        print(
            f"{row['op']:34s} {row['dtype']:9s} T={row['T']:<5d} "
            + " ".join(f"{k} {v:9.2f}" for k, v in row["best_us"].items())
            + f"  default/compile {row['default/compile']:.2f} ({row['chosen']})",
            flush=True,
        )
    meta = {
        **cpu_model(),
        "threads": args.threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "rounds": done,
        "ms": args.ms,
        "window_ms": args.window_ms,
        "extra_rounds": extra,
        "big_eager_rounds": args.big_eager_rounds,
        "close": args.close,
        "close_cells": len(close),
        "copy_bandwidth_gbs": [round(bw0, 1), round(bw1, 1)],
        "copy_per_round_gbs": {
            "best": round(max(probe.samples), 1),
            "median": round(statistics.median(probe.samples), 1),
        },
        "loadavg": [round(x, 2) for x in (*load0, *os.getloadavg())],
        "first_touch_gbs": [round(ft0, 1), round(ft1, 1)],
        "wall_s": round(time.time() - t_start, 1),
        "bridge": bridge,
    }
    return rows, meta


def render(rows: list[dict[str, Any]], meta: dict[str, Any], cmd: str, notes: str) -> str:
    per_round = meta.get("copy_per_round_gbs", {})
    bw = max(*meta["copy_bandwidth_gbs"], per_round.get("best", 0.0))
    load = meta.get("loadavg")
    ok = sum(r["default/compile"] <= 1.0 for r in rows)
    backs = sorted({b for r in rows for b in r["best_us"]} - {"eager", "compile", "default"})
    lines = [
        "# CPU: opmux C++ kernels vs torch eager and torch.compile",
        "",
        f"`{cmd}`: {meta['model']} ({meta['flags']}; L2 {meta.get('L2 cache', '?')}, "
        f"L3 {meta.get('L3 cache', '?')}), {meta['threads']} threads, torch {meta['torch']}, "
        f"Python {meta['python']}; one process, {meta['wall_s']} s; the torch-linked bridge "
        f"(`torch_kernels`: the default calls' entries of the ops returning several tensors): "
        f"{meta.get('bridge', 'not recorded')}.",
        "",
        "Every candidate is timed in the same process, interleaved: all cells are set up first "
        f"(inputs, compiled graphs, warm-up), then {meta['rounds']} rounds each time every cell, "
        f"each candidate for ~{meta.get('ms', 3.0):g} ms of calls in windows of ~"
        f"{meta.get('window_ms', meta.get('ms', 3.0)):g} ms (a call at least), the candidates' "
        "windows interleaved in shuffled orders and a round's figure a candidate's fastest "
        "window, so a cell's rounds are spread over the whole run. This machine's 2 cores are shared with other engineers' builds and tests"
        + (
            f" (load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} when the run began, "
            f"{load[3]:.1f} / {load[4]:.1f} / {load[5]:.1f} when it ended)"
            if load
            else ""
        )
        + ", so the figure is a candidate's best round (another process only ever makes a round "
        "slower), µs per call; the median round is in `cpu.json`. "
        + (
            f"The {meta['close_cells']} cells whose default / compile came out within "
            f"{meta['close']:.0%} of 1, or whose two best rounds of default or of compile were "
            "further apart than that (not settled), or whose `default` and forced backend (the "
            f"same kernel) disagreed by more, got {meta['extra_rounds']} more rounds, every "
            "candidate alike (`samples` per cell in `cpu.json`; at T = 4096 a round is two windows "
            "of one call). "
            if meta.get("extra_rounds")
            else ""
        )
        + "`compile` is `torch.compile` "
        "(inductor, static shapes) of the eager function; "
        "`default` is the public call with no override (the backend in brackets); `kernel` is "
        "the C++ kernel it chose called directly with arguments prepared once (no checks, no "
        "dispatch, no allocation), so `default` - `kernel` is the Python host path around it. "
        + (
            f"At T = 4096 eager ran in the first {meta['big_eager_rounds']} rounds only, and the "
            "forced backends and `kernel` not at all (`-`: the default is that kernel, and a call "
            "of milliseconds has no host path to speak of). "
            if meta.get("big_eager_rounds")
            else ""
        )
        + "`÷compile` = default / compile (at most 1: opmux is as fast or faster). "
        "`GB/s` = bytes the call must move / time, against the copy bandwidth measured at the "
        f"start and end of the same run: {meta['copy_bandwidth_gbs'][0]} and "
        f"{meta['copy_bandwidth_gbs'][1]} GB/s (read + write of a 512 MiB `copy_`)"
        + (
            f", and {per_round['best']} GB/s in the best round of a 256 MiB copy timed every round "
            f"(median {per_round['median']})"
            if per_round
            else ""
        )
        + "; a freshly "
        f"allocated output is written at only {meta['first_touch_gbs'][0]} and "
        f"{meta['first_touch_gbs'][1]} GB/s (`torch.empty(256 MiB).fill_`: a page fault per "
        "4 KiB), which bounds eager and torch.compile wherever they return a new tensor at "
        "T = 4096 (opmux's kernels ask for huge pages for a new output of 8 MiB or more, see below).",
        "",
        "| op | shape | dtype | eager | compile | default | " + " | ".join(backs) + " | ÷compile | GB/s (of "
        f"{bw}) |",
        "|---|---|---|---:|---:|---|" + "---:|" * len(backs) + "---:|---:|",
    ]
    for r in rows:
        b = r["best_us"]
        mark = "" if r["default/compile"] <= 1.0 else " ✗"
        lines.append(
            f"| {r['op']} | {r['shape']} | {r['dtype']} | {b['eager']} | {b['compile']} | "
            f"{b['default']} ({r['chosen']}) | "
            + " | ".join(str(b.get(k, "-")) for k in backs)
            + f" | {r['default/compile']}{mark} | {r['default_gbs']} |"
        )
    lines += [
        "",
        f"opmux's default is at or below torch.compile in {ok} of the {len(rows)} cases"
        + ("." if ok == len(rows) else "; the others are marked ✗."),
    ]
    if notes:
        lines += ["", notes.rstrip()]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--out", type=Path, default=None, help="writes OUT.json and OUT.md")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--extra-rounds", type=int, default=10, help="more rounds for close or noisy cells")
    ap.add_argument("--budget-min", type=float, default=0.0, help="wall-clock budget of the run (0: none)")
    ap.add_argument("--min-rounds", type=int, default=3, help="rounds run whatever the budget")
    ap.add_argument("--big-eager-rounds", type=int, default=3, help="rounds that time eager at T >= 4096")
    ap.add_argument(
        "--close", type=float, default=0.15, help="a cell is close if default/compile is within this of 1"
    )
    ap.add_argument("--ms", type=float, default=3.0, help="milliseconds of calls per candidate and round")
    ap.add_argument("--window-ms", type=float, default=0.25, help="milliseconds of calls per timed window")
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=list(SIZES))
    ap.add_argument("--dtypes", type=lambda s: s.split(","), default=list(DTYPES))
    ap.add_argument(
        "--big-dtypes", type=lambda s: s.split(","), default=list(DTYPES), help="dtypes at T >= 4096"
    )
    ap.add_argument("--ops", default="", help="comma-separated substrings of op names")
    ap.add_argument("--notes", type=Path, default=None, help="markdown appended to OUT.md")
    ap.add_argument(
        "--from-json", type=Path, default=None, help="render OUT.md from this run's JSON, no timing"
    )
    args = ap.parse_args()
    if args.from_json:
        data = json.loads(args.from_json.read_text())
        rows, meta = data["rows"], data["meta"]
    else:
        rows, meta = run(args)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        if not args.from_json:
            meta["command"] = "PYTHONPATH=python python " + " ".join(
                ["benchmarks/bench_cpu.py", *sys.argv[1:]]
            )
            args.out.with_suffix(".json").write_text(
                json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n"
            )
        cmd = meta.get(
            "command", "PYTHONPATH=python python benchmarks/bench_cpu.py --out docs/benchmarks/cpu"
        )
        notes = args.notes.read_text() if args.notes else ""
        args.out.with_suffix(".md").write_text(render(rows, meta, cmd, notes))


if __name__ == "__main__":
    main()
