"""Self-test of the CUTLASS (sm_90a) backend of gemm.w8a8_block_fp8_matmul on one Hopper GPU.

Loads the JIT module ``gemm_cuda`` (or a prebuilt library, ``--lib``), then for every config id
(``w8a8_block_fp8_matmul_cuda_configs()``; -1 is the heuristic) and every shape of a grid runs
the kernel against a float32 torch reference (dequantised operands, fp32 matmul without TF32),
prints max / mean relative error per config, and times each config with CUDA graphs (TFLOP/s).
Robust by design: a config that the entry refuses (alignment, arch) is recorded as "refused"
with the message; any other exception is recorded and the run continues (a device fault that
poisons the CUDA context stops the grid, and what was measured so far is still written).

    python benchmarks/gemm_cuda_selftest.py --out gemm_cuda_selftest.json
    python benchmarks/gemm_cuda_selftest.py --quick --out x.json          # a smaller grid
    python benchmarks/gemm_cuda_selftest.py --lib path/gemm_cuda.so ...    # no JIT build

Errors are relative to the reference's scale: max |out - ref| / max |ref| and
mean |out - ref| / mean |ref|. bf16 output rounding alone gives max ~4e-3, mean ~2e-3;
``--tol`` (default 1e-2 on the mean, 3e-2 on the max) flags a config as FAIL.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
import traceback
from pathlib import Path

M_GRID = (1, 7, 64, 83, 128, 1024, 4096)
# (N, K): DeepSeek-V3 shapes, tails in N and K (7752 % 128 = 72, 3888 % 128 = 48, both
# 16-byte aligned), 7748 x 3884 (rows not 16-byte multiples: refused by design), and K = 128.
NK_GRID = ((24576, 7168), (576, 7168), (7168, 2048), (7752, 3888), (7748, 3884), (7748, 4096), (2112, 128))
QUICK_M = (1, 7, 83, 1024)
# one k-tile (K = 128: the consumer loop's first exit), an odd count (3888: 31) and an even one
QUICK_NK = ((576, 7168), (7752, 3888), (7748, 3884), (2112, 128))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def load(lib: str | None):
    if lib:
        import tvm_ffi

        return tvm_ffi.load_module(lib)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
    from opmux.kernels import jit

    return jit.load_module("gemm_cuda")


def make_inputs(torch, m: int, n: int, k: int, scale_layout: str, gen):
    dev = "cuda"
    kb, nb = _cdiv(k, 128), _cdiv(n, 128)
    a = (torch.randn(m, k, device=dev, generator=gen) * 2).to(torch.float8_e4m3fn)
    b = (torch.randn(n, k, device=dev, generator=gen) * 2).to(torch.float8_e4m3fn)
    sa = torch.rand(m, kb, device=dev, generator=gen) * 0.02 + 0.005
    if scale_layout == "mmajor":  # DeepGEMM / SGLang TMA-aligned: columns padded to 4 floats
        mp = _cdiv(m, 4) * 4
        buf = torch.zeros(kb, mp, device=dev)
        buf[:, :m] = sa.t()
        sa = buf.t()[:m]
    elif scale_layout == "mmajor_unaligned":  # M-major, column stride M (copied by the entry)
        sa = sa.t().contiguous().t()
    sb = torch.rand(nb, kb, device=dev, generator=gen) * 0.02 + 0.005
    return a, b, sa, sb


def reference(torch, a, b, sa, sb):
    k = a.shape[1]
    n = b.shape[0]
    af = a.float() * sa.float().repeat_interleave(128, dim=1)[:, :k]
    bf = b.float() * sb.float().repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)[:, :k]
    return af @ bf.t()


def rel_errors(torch, out, ref) -> tuple[float, float]:
    diff = (out.float() - ref).abs()
    denom_max = ref.abs().max().item() or 1.0
    denom_mean = ref.abs().mean().item() or 1.0
    return diff.max().item() / denom_max, diff.mean().item() / denom_mean


def time_graph(torch, fn, flops: float, target_ms: float = 20.0) -> dict:
    """us per call: R calls captured in one CUDA graph, replayed; R sized to ~target_ms."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    est = max(time.perf_counter() - t0, 1e-6)
    reps = int(min(200, max(5, target_ms / 1e3 / est)))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = math.inf
    for _ in range(5):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / reps)
    us = best * 1e3
    return {"us": us, "tflops": flops / (us * 1e-6) / 1e12, "reps": reps}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON results path")
    ap.add_argument("--lib", default=None, help="a built gemm_cuda library (skips the JIT build)")
    ap.add_argument("--quick", action="store_true", help="a smaller grid")
    ap.add_argument("--no-time", action="store_true", help="correctness only")
    ap.add_argument("--configs", default="", help="comma-separated ids (default: all, and -1)")
    ap.add_argument("--tol", type=float, default=1e-2, help="mean relative error limit (max: 3x)")
    ap.add_argument("--pdl", action="store_true", help="launch with enable_pdl=True")
    args = ap.parse_args(argv)

    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    results: dict = {"device": None, "configs": None, "runs": [], "errors": []}
    out_path = Path(args.out)

    def dump() -> None:
        out_path.write_text(json.dumps(results, indent=1))

    try:
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device")
        results["device"] = torch.cuda.get_device_name()
        t0 = time.perf_counter()
        mod = load(args.lib)
        results["load_s"] = time.perf_counter() - t0
        fn = mod["w8a8_block_fp8_matmul_cuda_cfg"]
        n_cfg = int(mod["w8a8_block_fp8_matmul_cuda_configs"]())
        default_cfg = mod["w8a8_block_fp8_matmul_cuda_default_config"]
    except Exception as exc:
        results["errors"].append(f"setup: {type(exc).__name__}: {exc}")
        dump()
        print(results["errors"][-1])
        return 2
    results["configs"] = n_cfg
    ids = [int(x) for x in args.configs.split(",") if x.strip()] if args.configs else [*range(n_cfg), -1]
    m_grid = QUICK_M if args.quick else M_GRID
    nk_grid = QUICK_NK if args.quick else NK_GRID
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    dead = False
    fails = 0
    print(f"{results['device']}: {n_cfg} configs, module loaded in {results['load_s']:.1f} s")
    print(
        f"{'M':>5} {'N':>6} {'K':>5} {'cfg':>3} {'out':>4} {'scales':>7}  {'max_rel':>8} {'mean_rel':>8}  "
        f"{'us':>9} {'TFLOP/s':>8}  note"
    )

    cases = []
    for n, k in nk_grid:
        for m in m_grid:
            cases.append((m, n, k, torch.bfloat16, "mmajor", True))
            cases.append((m, n, k, torch.bfloat16, "kmajor", False))
    # other output dtypes and the unaligned M-major copy path, on a subset
    for m, n, k in ((7, 576, 7168), (83, 7752, 3888), (1024, 7168, 2048)):
        for dt in (torch.float16, torch.float32):
            cases.append((m, n, k, dt, "kmajor", False))
        cases.append((m, n, k, torch.bfloat16, "mmajor_unaligned", False))

    for m, n, k, dt, layout, timed in cases:
        if dead:
            break
        try:
            a, b, sa, sb = make_inputs(torch, m, n, k, layout, gen)
            ref = reference(torch, a, b, sa, sb)
            heur = int(default_cfg(m, n, k))
        except Exception as exc:
            results["errors"].append(f"inputs M={m} N={n} K={k}: {type(exc).__name__}: {exc}")
            dead = "CUDA" in str(exc)
            continue
        for cfg in ids:
            rec = {
                "M": m,
                "N": n,
                "K": k,
                "config": cfg,
                "heuristic": heur,
                "out": str(dt).split(".")[-1],
                "scales": layout,
            }
            out = torch.full((m, n), float("nan"), device="cuda", dtype=dt)
            try:
                fn(out, a, b, sa, sb, cfg, args.pdl)
                torch.cuda.synchronize()
            except Exception as exc:
                msg = f"{type(exc).__name__}: {exc}"
                rec["status"] = "refused" if isinstance(exc, ValueError) or "needs" in str(exc) else "error"
                rec["message"] = msg
                results["runs"].append(rec)
                print(
                    f"{m:>5} {n:>6} {k:>5} {cfg:>3} {rec['out'][:4]:>4} {layout[:7]:>7}  {rec['status']}: "
                    f"{msg.splitlines()[0][:110]}"
                )
                if "illegal" in msg or "unspecified launch failure" in msg:
                    dead = True
                    break
                continue
            mx, mean = rel_errors(torch, out, ref)
            ok = math.isfinite(mx) and mean <= args.tol and mx <= 3 * args.tol
            rec.update(status="ok" if ok else "FAIL", max_rel=mx, mean_rel=mean)
            fails += not ok
            if timed and ok and not args.no_time:
                try:
                    call = functools.partial(fn, out, a, b, sa, sb, cfg, args.pdl)  # this iteration's
                    rec.update(time_graph(torch, call, 2.0 * m * n * k))
                except Exception as exc:
                    rec["time_error"] = f"{type(exc).__name__}: {exc}"
            results["runs"].append(rec)
            tflops = f"{rec['tflops']:8.1f}" if "tflops" in rec else " " * 8
            us = f"{rec['us']:9.2f}" if "us" in rec else " " * 9
            print(
                f"{m:>5} {n:>6} {k:>5} {cfg:>3} {rec['out'][:4]:>4} {layout[:7]:>7}  {mx:8.2e} {mean:8.2e}  "
                f"{us} {tflops}  {rec['status']}{' (heuristic)' if cfg == heur else ''}"
            )
        dump()

    # best config per shape (timed runs)
    best: dict = {}
    for r in results["runs"]:
        if "tflops" in r and r["config"] >= 0:
            key = f"{r['M']}x{r['N']}x{r['K']}"
            if key not in best or r["tflops"] > best[key]["tflops"]:
                best[key] = {
                    "config": r["config"],
                    "tflops": r["tflops"],
                    "us": r["us"],
                    "heuristic": r["heuristic"],
                }
    results["best"] = best
    results["fails"] = fails
    dump()
    print("\nbest config per shape (bf16 out, M-major scales):")
    for key, v in best.items():
        print(
            f"  {key:>18}: cfg {v['config']} {v['tflops']:7.1f} TFLOP/s {v['us']:9.2f} us (heuristic {v['heuristic']})"
        )
    print(
        f"{fails} FAIL, {sum(r.get('status') == 'error' for r in results['runs'])} errors; wrote {out_path}"
    )
    return 1 if fails or dead else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception:
        traceback.print_exc()
        sys.exit(3)
