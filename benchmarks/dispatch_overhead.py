"""Cost of the public op call over calling the selected backend directly (CPU, tiny tensor).

    PYTHONPATH=python python benchmarks/dispatch_overhead.py [--out docs/benchmarks/dispatch_overhead]

Both paths run the same kernel on the same 1x8 tensor, interleaved in rounds; the
difference of the medians is what dispatch adds. The ``torch.ops.opmux`` path (what
torch.compile sees) is shown for scale.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def _per_call_ns(fn: Callable[[], Any], n: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t0) / n


def measure(rounds: int = 41, n: int = 20000) -> list[dict[str, Any]]:
    from opmux.kernels import explain
    from opmux.kernels.explain import op_instance
    from opmux.kernels.ops.activation import silu_and_mul
    from opmux.kernels.ops.layernorm import rmsnorm

    x, w = torch.randn(1, 8), torch.randn(8)
    cases = [
        ("layernorm.rmsnorm", lambda: rmsnorm(x, w), (x, w), lambda: torch.ops.opmux.rmsnorm(x, w, 1e-6)),
        (
            "activation.silu_and_mul",
            lambda: silu_and_mul(x),
            (x,),
            lambda: torch.ops.opmux.silu_and_mul(x, False),
        ),
    ]
    rows = []
    for op, public, args, library in cases:
        backend = explain(op, *args).chosen
        impl = op_instance(op).impl(backend)

        def direct(impl=impl, args=args):
            return impl(*args)

        public(), direct(), library()  # warm: compile/load, fill the dispatch cache
        samples: dict[str, list[float]] = {"public": [], "direct": [], "torch.ops": []}
        for _ in range(rounds):
            samples["direct"].append(_per_call_ns(direct, n))
            samples["public"].append(_per_call_ns(public, n))
            samples["torch.ops"].append(_per_call_ns(library, max(1, n // 10)))
        med = {k: statistics.median(v) for k, v in samples.items()}
        rows.append(
            {
                "op": op,
                "backend": backend,
                "direct_ns": round(med["direct"], 1),
                "public_ns": round(med["public"], 1),
                "added_ns": round(med["public"] - med["direct"], 1),
                "ratio": round(med["public"] / med["direct"], 4),
                "torch_ops_ns": round(med["torch.ops"], 1),
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=41)
    args = ap.parse_args()
    rows = measure(args.rounds)
    meta = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
    }
    lines = [
        "| op | backend | direct (ns) | public call (ns) | added (ns) | ratio | torch.ops.opmux (ns) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['op']} | {r['backend']} | {r['direct_ns']} | {r['public_ns']} | {r['added_ns']} | {r['ratio']} | {r['torch_ops_ns']} |"
        )
    print("\n".join(lines))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
        cmd = (
            "PYTHONPATH=python python benchmarks/dispatch_overhead.py --out docs/benchmarks/dispatch_overhead"
        )
        args.out.with_suffix(".md").write_text(
            f"# Dispatch overhead\n\n`{cmd}` on {meta['cpu']}, Python {meta['python']}, torch {meta['torch']}: "
            "median over interleaved rounds of 20,000 calls on a 1x8 fp32 tensor. `added` is what the public "
            "call costs over calling the selected backend's function directly. Goal: <= 100 ns.\n\n"
            + "\n".join(lines)
            + "\n"
        )


if __name__ == "__main__":
    main()
