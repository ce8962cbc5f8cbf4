"""Parity and timing of moe.fused_experts' CUTLASS backend (fp8 block-scaled, sm_90a) on one H200.

    python benchmarks/check_moe_cutlass.py [--quick] [--out moe_cutlass.json] [--select-out DIR]

1. Builds (or loads) the unit ``moe_grouped_cuda``; a failed build prints the compiler's tail.
2. Parity: the backend (forced, ``OPMUX_FALLBACK=error``) and each of its two GEMM configs
   against the op's definition (``_experts.reference``, fp32 sums) and against the Triton
   backend, over small / Qwen3-like / DeepSeek-like shapes and M in 1, 7, 64, 1000, 4096;
   ``expert_map`` with -1 entries; ids out of range (>= E and negative: skipped, never read);
   int64 ids; fp16; ``apply_router_weight_on_input`` (topk 1); one case captured in a CUDA graph
   (replayed bit-equal to eager); N or K not multiples of 128 refused by the predicate.
   Criterion: mean |out - ref| / mean |ref| <= 0.035 (vLLM's block-fp8 MoE test) and max
   |out - ref| <= 0.05 * max |ref| + 2e-2; against Triton (same quantization): mean rel <= 1e-2.
3. Timing (CUDA graphs, median of replays): E=256, N=2048, K=7168, topk=8 (DeepSeek-V3) at
   M = 1024, 4096, 16384: cutlass (default config, config 0, config 1), Triton fp8, Triton bf16;
   fp8/bf16 ratios (the issue's goal: <= 2/3 at M >= 1024) and TFLOP/s.

Prints one compact summary; exits 1 on any parity failure (or a build failure), 0 otherwise.
``--select-out DIR`` writes the measured-fastest fp8 backend per M as an opmux select table
(``E=256,N=2048,device_name=...,dtype=fp8_w8a8,block_shape=[128,128],backend=select.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gpu import _time_graph

os.environ.setdefault("OPMUX_FALLBACK", "error")

MEAN_TOL, MAX_TOL, VS_TRITON = 0.035, 0.05, 1e-2
TIMED_M = (64, 256, 1024, 4096, 16384)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def weights(torch: Any, e: int, n: int, k: int, form: str) -> dict[str, Any]:
    from opmux.kernels.tune.moe import make_weights

    return make_weights(torch, e, n, k, form, "cuda")


def routing(torch: Any, m: int, e: int, k: int, topk: int, seed: int, dtype: Any) -> dict[str, Any]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    hidden = torch.randn(m, k, device="cuda", dtype=dtype, generator=g)
    logits = torch.randn(m, e, device="cuda", generator=g)
    tw, ids = torch.topk(torch.softmax(logits, dim=-1), topk, dim=-1)
    tw = (tw / tw.sum(-1, keepdim=True)).contiguous()
    return {"hidden": hidden, "tw": tw, "ids": ids.to(torch.int32).contiguous()}


def rel(torch: Any, y: Any, ref: Any) -> tuple[float, float]:
    d = (y.float() - ref.float()).abs()
    r = ref.float().abs()
    return float(d.mean() / r.mean().clamp_min(1e-12)), float(d.max() / r.max().clamp_min(1e-12))


def parity_cases(quick: bool) -> list[dict[str, Any]]:
    shapes = [
        ("small", 8, 256, 512, 2),
        ("qwen3-like", 64, 768, 2048, 8),
        ("deepseek-like", 256, 2048, 7168, 8),
    ]
    ms = (1, 7, 64, 1000, 4096) if not quick else (1, 64, 1000)
    cases = []
    for name, e, n, k, topk in shapes:
        for m in ms if name != "deepseek-like" else (1, 64, 1000, 4096):
            cases.append({"shape": name, "E": e, "N": n, "K": k, "topk": topk, "M": m, "variant": "plain"})
    for variant in ("expert_map", "bad_ids", "int64_ids", "fp16", "on_input", "graph"):
        cases.append({"shape": "small", "E": 8, "N": 256, "K": 512, "topk": 2, "M": 64, "variant": variant})
    cases.append(
        {"shape": "qwen3-like", "E": 64, "N": 768, "K": 2048, "topk": 8, "M": 1000, "variant": "expert_map"}
    )
    cases.append(
        {"shape": "qwen3-like", "E": 64, "N": 768, "K": 2048, "topk": 8, "M": 1000, "variant": "bad_ids"}
    )
    return cases


def run_parity(torch: Any, case: dict[str, Any], cache: dict[Any, Any]) -> dict[str, Any]:
    from opmux.kernels.ops.moe import _experts, fused_experts
    from opmux.kernels.ops.moe import fused_experts_cutlass as fc

    e, n, k, topk, m, variant = case["E"], case["N"], case["K"], case["topk"], case["M"], case["variant"]
    if variant == "on_input":
        topk = 1
    key = (e, n, k)
    if key not in cache:
        cache.clear()
        cache[key] = weights(torch, e, n, k, "fp8")
    w = cache[key]
    dtype = torch.float16 if variant == "fp16" else torch.bfloat16
    s = routing(torch, m, e, k, topk, seed=m * 7 + e, dtype=dtype)
    ids, emap = s["ids"], None
    if variant == "expert_map":  # 2E global experts; odd ones on another rank (-1), even ones local
        g = torch.Generator(device="cuda").manual_seed(5)
        ids = torch.randint(0, 2 * e, ids.shape, device="cuda", dtype=torch.int32, generator=g)
        emap = torch.full((2 * e,), -1, dtype=torch.int32, device="cuda")
        emap[0::2] = torch.randperm(e, device="cuda", generator=g).to(torch.int32)
    elif variant == "bad_ids":  # >= E and negative: never read, contribute nothing
        ids = ids.clone()
        ids[::3, 0] = e + 5
        ids[1::5, -1] = -3
    elif variant == "int64_ids":
        ids = ids.long()
    kw = {
        "expert_map": emap,
        "w1_scale": w["w1_scale"],
        "w2_scale": w["w2_scale"],
        "apply_router_weight_on_input": variant == "on_input",
    }
    args = (s["hidden"], w["w1"], w["w2"], s["tw"], ids)
    ref = _experts.reference(*args, **kw)
    out = fused_experts(*args, backend="cutlass", **kw)
    tri = fused_experts(*args, backend="triton", **kw)
    res: dict[str, Any] = {**case}
    res["mean"], res["max"] = rel(torch, out, ref)
    res["vs_triton"] = rel(torch, out, tri)[0]
    res["triton_mean"] = rel(torch, tri, ref)[0]
    ok = res["mean"] <= MEAN_TOL and res["max"] <= MAX_TOL + 2e-2 and res["vs_triton"] <= VS_TRITON
    ok = ok and bool(torch.isfinite(out).all())
    # each config on its own (the default picks one of them)
    empty = torch.empty(0, dtype=torch.int32, device="cuda")
    for cfg in (fc.COOPERATIVE, fc.SWAP_AB):
        y = torch.empty_like(s["hidden"])
        fc.launch_fused_experts(
            y, s["hidden"], w["w1"], w["w2"], s["tw"], ids, w["w1_scale"], w["w2_scale"],
            emap if emap is not None else empty, "silu", variant == "on_input", configs=(cfg, cfg),
        )  # fmt: skip
        mean, mx = rel(torch, y, ref)
        res[f"cfg{cfg}_mean"] = mean
        ok = ok and mean <= MEAN_TOL and mx <= MAX_TOL + 2e-2
    if variant == "graph":  # captured and replayed: bit-equal to the eager call
        y = torch.empty_like(s["hidden"])
        fused_experts(*args, backend="cutlass", out=y, **kw)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        z = torch.zeros_like(y)
        with torch.cuda.graph(graph):
            fused_experts(*args, backend="cutlass", out=z, **kw)
        graph.replay()
        torch.cuda.synchronize()
        res["graph_equal"] = bool(torch.equal(y, z))
        ok = ok and res["graph_equal"]
    res["ok"] = ok
    return res


def refusals(torch: Any) -> list[dict[str, Any]]:
    """N or K not multiples of 128: the predicate refuses, the forced call raises, default runs Triton."""
    from opmux.kernels import FallbackError, use_backends
    from opmux.kernels.errors import BackendUnavailable
    from opmux.kernels.ops.moe import fused_experts
    from opmux.kernels.ops.moe import fused_experts_cutlass as fc

    out = []
    for e, n, k in ((4, 192, 256), (4, 256, 320)):
        w = weights(torch, e, n, k, "fp8")
        s = routing(torch, 16, e, k, 2, seed=3, dtype=torch.bfloat16)
        args = (s["hidden"], w["w1"], w["w2"], s["tw"], s["ids"])
        kw = {"w1_scale": w["w1_scale"], "w2_scale": w["w2_scale"]}
        why = fc.supports(*args, **kw)
        raised = None
        try:
            with use_backends("moe.fused_experts=cutlass"):
                fused_experts(*args, **kw)
        except (FallbackError, BackendUnavailable) as exc:
            raised = type(exc).__name__
        y = fused_experts(*args, **kw)  # the default path runs (Triton)
        ok = why is not None and raised is not None and bool(torch.isfinite(y).all())
        out.append({"N": n, "K": k, "reason": why, "forced": raised, "ok": ok})
    return out


def time_graph(torch: Any, fn: Any, R: int, replays: int = 7) -> float:
    """Median us per call of ``fn()`` in a graph of R calls (bench_gpu's timing; two warm-up calls
    on a side stream first; a capture that fails raises)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    return _time_graph(torch, lambda _: fn(), [None], R, replays)["us"]


def _impls(
    s: dict[str, Any], out: Any, fp8: dict[str, Any], bf16: dict[str, Any], empty: Any
) -> dict[str, Any]:
    """The timed calls of one M (each writes ``out``)."""
    from opmux.kernels.ops.moe import fused_experts
    from opmux.kernels.ops.moe import fused_experts_cutlass as fc

    a8 = (s["hidden"], fp8["w1"], fp8["w2"], s["tw"], s["ids"])
    kw8 = {"w1_scale": fp8["w1_scale"], "w2_scale": fp8["w2_scale"], "out": out}

    def cfg_fn(c: int) -> Any:
        return lambda: fc.launch_fused_experts(
            out, s["hidden"], fp8["w1"], fp8["w2"], s["tw"], s["ids"], fp8["w1_scale"], fp8["w2_scale"],
            empty, "silu", False, configs=(c, c),
        )  # fmt: skip

    return {
        "cutlass": lambda: fused_experts(*a8, backend="cutlass", **kw8),
        "cutlass_cfg0": cfg_fn(fc.COOPERATIVE),
        "cutlass_cfg1": cfg_fn(fc.SWAP_AB),
        "triton_fp8": lambda: fused_experts(*a8, backend="triton", **kw8),
        "triton_bf16": lambda: fused_experts(
            s["hidden"], bf16["w1"], bf16["w2"], s["tw"], s["ids"], backend="triton", out=out
        ),
    }


def timing(torch: Any, ms: tuple[int, ...]) -> list[dict[str, Any]]:
    e, n, k, topk = 256, 2048, 7168, 8
    fp8 = weights(torch, e, n, k, "fp8")
    bf16 = weights(torch, e, n, k, "bf16")
    empty = torch.empty(0, dtype=torch.int32, device="cuda")
    rows = []
    for m in ms:
        s = routing(torch, m, e, k, topk, seed=11, dtype=torch.bfloat16)
        out = torch.empty_like(s["hidden"])
        impls = _impls(s, out, fp8, bf16, empty)
        R = max(2, min(20, 40000 // m))
        row: dict[str, Any] = {"M": m}
        for name, fn in impls.items():
            try:
                row[name] = time_graph(torch, fn, R)
            except Exception as exc:
                row[name] = None
                row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[-300:]
                torch.cuda.synchronize()
            log(f"  M={m} {name}: {row[name]}")
        flops = 6.0 * m * topk * n * k
        for name in impls:
            if row.get(name):
                row[f"{name}_tflops"] = flops / (row[name] * 1e-6) / 1e12
        if row.get("triton_bf16"):
            for name in ("cutlass", "cutlass_cfg0", "cutlass_cfg1", "triton_fp8"):
                if row.get(name):
                    row[f"{name}/bf16"] = row[name] / row["triton_bf16"]
        rows.append(row)
    return rows


def write_select(rows: list[dict[str, Any]], folder: Path, device: str) -> Path:
    from opmux.kernels import tuned

    table = {}
    for r in rows:
        cands = {b: r[b] for b in ("cutlass", "triton_fp8") if r.get(b)}
        if cands:
            best = min(cands, key=cands.__getitem__)
            table[str(r["M"])] = {"backend": "cutlass" if best == "cutlass" else "triton"}
    key = tuned.table_key("moe.fused_experts", "select", device, (256, 2048), tuned.FP8_BLOCK_TAGS)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / key.file_name()
    path.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer parity cases; timing at M=4096 only")
    ap.add_argument("--out", default="moe_cutlass.json", help="the full record (JSON)")
    ap.add_argument("--select-out", default=None, help="folder for the measured select table")
    ap.add_argument("--no-timing", action="store_true")
    args = ap.parse_args(argv)

    import torch

    record: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    cap = torch.cuda.get_device_capability()
    if cap != (9, 0):
        print(f"check_moe_cutlass: needs an sm_90 GPU, this is sm_{cap[0]}{cap[1]}")
        return 1
    from opmux.kernels.errors import BackendUnavailable
    from opmux.kernels.ops.moe import fused_experts_cutlass as fc

    try:
        fc.library()
    except BackendUnavailable as exc:
        cause = exc.__cause__
        tail = getattr(cause, "stderr", "") or str(cause or exc)
        print(
            "check_moe_cutlass: BUILD FAILED\n"
            + str(exc)[:2000]
            + "\n--- compiler output (tail) ---\n"
            + tail[-6000:]
        )
        return 1

    failures = 0
    cache: dict[Any, Any] = {}
    parity = []
    for case in parity_cases(args.quick):
        try:
            res = run_parity(torch, case, cache)
        except Exception as exc:
            res = {**case, "ok": False, "error": f"{type(exc).__name__}: {exc}"[-500:]}
            traceback.print_exc()
        failures += not res["ok"]
        parity.append(res)
        log(f"parity {res}")
        if "illegal" in res.get("error", "") or "CUDA error" in res.get("error", ""):
            break  # a device fault poisons the context: stop here, report what we have
    cache.clear()
    record["parity"] = parity
    try:
        record["refusals"] = refusals(torch)
    except Exception as exc:
        record["refusals"] = [{"ok": False, "error": f"{type(exc).__name__}: {exc}"[-500:]}]
    failures += sum(not r["ok"] for r in record["refusals"])
    if not args.no_timing and failures == 0:
        torch.cuda.empty_cache()
        record["timing"] = timing(torch, (4096,) if args.quick else TIMED_M)
    Path(args.out).write_text(json.dumps(record, indent=1, default=str) + "\n", encoding="utf-8")

    print(f"== moe.fused_experts cutlass on {record['device']} ==")
    print("parity (mean rel / max rel vs reference; mean rel vs triton; cfg0 / cfg1 mean rel):")
    for r in parity:
        tag = "ok  " if r["ok"] else "FAIL"
        if "error" in r:
            print(f"  {tag} {r['shape']:13s} M={r['M']:<5d} {r['variant']:10s} {r['error'][:160]}")
            continue
        extra = f" graph_equal={r['graph_equal']}" if "graph_equal" in r else ""
        print(
            f"  {tag} {r['shape']:13s} M={r['M']:<5d} {r['variant']:10s} {r['mean']:.4f} / {r['max']:.4f}; "
            f"vs triton {r['vs_triton']:.4f} (triton {r['triton_mean']:.4f}); "
            f"cfg {r['cfg0_mean']:.4f} / {r['cfg1_mean']:.4f}{extra}"
        )
    for r in record["refusals"]:
        print(
            f"  {'ok  ' if r['ok'] else 'FAIL'} refusal N={r.get('N')} K={r.get('K')}: {r.get('reason') or r.get('error')}"
        )
    for r in record.get("timing", []):
        cells = []
        for b in ("cutlass", "cutlass_cfg0", "cutlass_cfg1", "triton_fp8", "triton_bf16"):
            us = r.get(b)
            cells.append(f"{b} {us:.0f}us ({r.get(f'{b}_tflops', 0):.0f}TF)" if us else f"{b} n/a")
        ratio = " ".join(
            f"{b}/bf16={r[f'{b}/bf16']:.3f}" for b in ("cutlass", "triton_fp8") if f"{b}/bf16" in r
        )
        print(f"  M={r['M']}: " + ", ".join(cells) + f"; {ratio}")
    if args.select_out and record.get("timing"):
        from opmux.kernels import tuned

        dev = tuned.device_name(torch.device("cuda"))
        print(f"select table: {write_select(record['timing'], Path(args.select_out), dev)}")
    print(f"{'PASS' if failures == 0 else f'FAIL ({failures} failures)'}; record: {args.out}")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
