"""Every launch config of the CUTLASS fp8 block-scaled GEMM (unit ``gemm_cuda``) beside
``torch._scaled_mm`` (cuBLASLt, blockwise scales) at prefill sizes, on one Hopper GPU.

    python benchmarks/gemm_cuda_configs.py --out gemm_cuda_configs.json [--m 8192,4096,2048,512] [--budget-s 300]
        [--ids 0,7,8]    # only these config ids (default: all of them)

Each case checks every config against the float32 reference once (mean relative error; a wrong
one is recorded and not timed), then times the right ones and cuBLASLt in CUDA graphs (L2-defeating
input sets) with their replays interleaved (``bench_gpu.time_impls``), after a few seconds of
warm-up. TFLOP/s = 2MNK / t. Session 31's run of it (docs/benchmarks/gemm_cutlass_h100.md,
call G) is the data behind the unit's default rule above M = 256.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_gpu import time_impls  # noqa: E402
from gemm_cuda_selftest import make_inputs, reference, rel_errors  # noqa: E402

#: (N, K): DeepSeek-V3's q_b / dense gate-up / o_proj, Llama-3.1-70B's qkv, a 4096-wide and a short-K shape
SHAPES = ((24576, 7168), (36864, 7168), (7168, 16384), (10240, 8192), (4096, 7168), (7168, 2048))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--m", default="8192,4096,2048,512")
    ap.add_argument("--budget-s", type=float, default=300.0, help="cases left when it is spent are skipped")
    ap.add_argument("--ids", default="", help="comma-separated config ids (default: every config)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()

    import torch

    sys.path.insert(0, str(HERE.parent / "python"))
    from opmux.kernels import jit

    mod = jit.load_module("gemm_cuda")
    cfg = mod["w8a8_block_fp8_matmul_cuda_cfg"]
    count = int(mod["w8a8_block_fp8_matmul_cuda_configs"]())
    ids = [int(v) for v in args.ids.split(",")] if args.ids else list(range(count))
    if any(not 0 <= i < count for i in ids):
        ap.error(f"--ids: the unit has configs 0..{count - 1}; got {args.ids}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    a, b, sa, sb = make_inputs(torch, 4096, 8192, 8192, "mmajor", gen)
    warm = torch.empty(4096, 8192, dtype=torch.bfloat16, device="cuda")
    while time.perf_counter() - t0 < 3:
        for _ in range(20):
            cfg(warm, a, b, sa, sb, 0, False)
        torch.cuda.synchronize()
    record: dict[str, Any] = {"device": torch.cuda.get_device_name(), "ids": ids, "cases": []}
    for n, k in SHAPES:
        for m in (int(v) for v in args.m.split(",")):
            if time.perf_counter() - t0 > args.budget_s:
                record["cases"].append({"M": m, "N": n, "K": k, "skipped": "budget"})
                continue
            record["cases"].append(run_case(torch, cfg, ids, m, n, k, gen))
            args.out.write_text(json.dumps(record, indent=1) + "\n")
            c = record["cases"][-1]
            top = sorted(c["tflops"].items(), key=lambda kv: -kv[1])[:3]
            print(
                f"[{time.perf_counter() - t0:5.0f}s] M={m} N={n} K={k}: "
                + " ".join(f"{name}={v:.0f}" for name, v in top),
                flush=True,
            )
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


def run_case(torch: Any, cfg: Any, ids: list[int], m: int, n: int, k: int, gen: Any) -> dict[str, Any]:
    per_set = n * k + m * k + 2 * m * n
    n_sets = max(2, min(6, math.ceil(3 * 60e6 / per_set)))
    sets = []
    for _ in range(n_sets):
        a, b, sa, sb = make_inputs(torch, m, n, k, "mmajor", gen)
        sets.append(
            {
                "a": a,
                "b": b,
                "sa": sa,
                "sb": sb,
                "out": torch.empty(m, n, dtype=torch.bfloat16, device="cuda"),
            }
        )
    s0 = sets[0]
    ref = reference(torch, s0["a"], s0["b"], s0["sa"], s0["sb"]).to(torch.bfloat16).float()
    flops = 2.0 * m * n * k
    reps = max(n_sets, min(100, math.ceil(4000 / max(3.0, flops / 900e12 * 1e6))))
    impls: dict[str, Any] = {
        f"cfg{c}": (lambda s, c=c: cfg(s["out"], s["a"], s["b"], s["sa"], s["sb"], c, False)) for c in ids
    }
    impls["scaled_mm"] = lambda s: torch._scaled_mm(
        s["a"], s["b"].T, scale_a=s["sa"], scale_b=s["sb"].T, out_dtype=torch.bfloat16
    )
    case: dict[str, Any] = {"M": m, "N": n, "K": k, "err": {}, "tflops": {}}
    for name, fn in impls.items():
        try:
            y = fn(s0)
            torch.cuda.synchronize()
            case["err"][name] = rel_errors(torch, s0["out"] if y is None else y, ref)[1]
        except Exception as exc:  # the record says why
            case["err"][name] = str(exc)[:200]
    # timed only where right: vLLM's criterion (mean relative error < 1e-3) against the
    # reference rounded to the bf16 output, every config's replays interleaved
    names = [name for name in impls if isinstance(case["err"][name], float) and case["err"][name] < 1e-3]
    times = time_impls(torch, {nm: impls[nm] for nm in names}, sets, reps, 9)
    best = {name: t["us"] for name, t in times.items() if "us" in t}
    case["timing_errors"] = {name: t["error"] for name, t in times.items() if "error" in t}
    case["tflops"] = {name: flops / us / 1e6 for name, us in best.items()}
    return case


if __name__ == "__main__":
    raise SystemExit(main())
