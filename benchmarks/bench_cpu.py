"""opmux's C++ CPU kernels against torch eager on this machine (issue: fused ops beat eager).

    PYTHONPATH=python python benchmarks/bench_cpu.py --out docs/benchmarks/cpu [--threads 2]

Same op cases as the GPU suite (benchmarks/bench_cases.py) at CPU sizes. For each case, the
opmux native backend (``jit``, the same code as the AOT library), torch eager as users write it
in the input dtype, and the fp32 reference are timed interleaved in rounds on fresh copies of one
input set; median per call. ``ratio`` = eager / opmux (above 1: opmux is faster).
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_cases as bc

SIZES = (1, 32, 256)


def _time(fn: Any, sets: list[Any], reps: int) -> float:
    t0 = time.perf_counter_ns()
    for i in range(reps):
        fn(sets[i % len(sets)])
    return (time.perf_counter_ns() - t0) / reps / 1e3


def run(threads: int, rounds: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    torch.set_num_threads(threads)
    rows = []
    from opmux.kernels import explain

    for case in bc.cases():
        mod, _, name = case.public.partition(":")
        fn = getattr(importlib.import_module(mod), name)
        for t in SIZES:  # the first GPU shape's dims (e.g. H=4096) at CPU token counts
            shape = bc.Shape(t, case.shapes[0].dims)
            g = bc._gen("cpu", 1234)
            base = case.make(shape, g, "cpu")
            sets = [bc.clone_args(base) for _ in range(4)]

            def native(a: Any, case: Any = case, fn: Any = fn) -> Any:
                # the public call, which dispatches to the native kernel here (the cached
                # choice: `jit` in a tree, `aot` in the cpu wheel; both the same C++ code)
                p, k = case.callargs(a)
                return fn(*p, **k)

            def eager(a: Any, case: Any = case) -> Any:
                return case.eager(*a)

            def reference(a: Any, case: Any = case) -> Any:
                return case.reference(a)

            p0, k0 = case.callargs(base)
            chosen = explain(case.op, *p0, **k0).chosen
            if chosen not in ("jit", "aot"):
                raise SystemExit(f"{case.op}: the default on this CPU is {chosen}, not the C++ kernel")
            impls = {"opmux jit": native, "torch eager": eager, "fp32 reference": reference}
            for f in impls.values():  # warm up: compile/load, allocator
                f(bc.clone_args(base))
            reps = max(3, int(2e5 / max(1, case.nbytes(shape) // 64)))
            reps = min(reps, 2000)
            samples: dict[str, list[float]] = {k: [] for k in impls}
            for _ in range(rounds):
                for k, f in impls.items():
                    samples[k].append(_time(f, sets, reps))
            med = {k: statistics.median(v) for k, v in samples.items()}
            rows.append(
                {
                    "op": case.op,
                    "shape": shape.label,
                    **{f"{k} us": round(v, 2) for k, v in med.items()},
                    "eager/opmux": round(med["torch eager"] / med["opmux jit"], 2),
                }
            )
            print(
                f"{case.op:34s} {shape.label:30s} "
                + "  ".join(f"{k} {v:9.2f}" for k, v in med.items())
                + f"  eager/opmux {med['torch eager'] / med['opmux jit']:.2f}",
                flush=True,
            )
    meta = {
        "cpu": platform.processor() or platform.machine(),
        "threads": threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "dtype": str(bc.DT),
    }
    return rows, meta


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    rows, meta = run(args.threads, args.rounds)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
        cols = ["opmux jit us", "torch eager us", "fp32 reference us", "eager/opmux"]
        lines = [
            "# CPU: opmux C++ kernels vs torch eager",
            "",
            f"`PYTHONPATH=python python benchmarks/bench_cpu.py --out docs/benchmarks/cpu` on {meta['cpu']}, "
            f"{meta['threads']} threads, torch {meta['torch']}, {meta['dtype']}; median of interleaved rounds, "
            "us per call. `eager/opmux` above 1 means opmux is faster.",
            "",
            "| op | shape | " + " | ".join(cols) + " |",
            "|---|---|" + "---:|" * len(cols),
        ]
        lines += [f"| {r['op']} | {r['shape']} | " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
        args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
