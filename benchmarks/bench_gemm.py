"""Block-scaled fp8 GEMM (gemm.w8a8_block_fp8_matmul) against its peers on one GPU, in one run.

    python benchmarks/bench_gemm.py --out DIR [--models deepseek-v3,llama-3.1-8b] [--m 1,16,64] [--budget-s 400]

For every linear-layer shape (N, K) of the models (``opmux.kernels.tune.MODELS``) and every M:
opmux's default call and each of its CUDA backends forced (``backend=``), and the peers a user
would pick: ``torch._scaled_mm`` with 1x128 / 128x128 blockwise scales (cuBLASLt; M a multiple of
4, scales laid out as it needs them), the Triton kernel with vLLM's untuned default configuration,
and bf16 ``torch.mm`` of the same shape. Each is checked once against the fp32 dequantized
product (vLLM's criterion: mean |out - ref| / mean |ref| < 1e-3; bf16 mm is not fp8 and is only
timed) and timed as R calls in one CUDA graph cycling over enough input sets to defeat L2
(bench_gpu.time_impls: every column's graph replayed in turn, rotated each round, the median per
column, so that clock drift under fp8 load treats them alike). TFLOP/s = 2MNK / t; ``B/copy`` is the weight
bytes (N*K) read per second over the copy bandwidth measured in the same run.

Writes DIR/gemm.json (rewritten after every shape) and DIR/gemm.md.
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

from bench_gpu import copy_bandwidth, environment, time_impls  # noqa: E402

OP = "gemm.w8a8_block_fp8_matmul"
#: shapes benchmarked beside the models' layers: SGLang's and DeepGEMM's published N=24576, K=7168
EXTRA_SHAPES = (("SGLang/DeepGEMM bench", "N=24576,K=7168", 24576, 7168),)
M_DEFAULT = (1, 16, 64, 128, 512, 2048, 8192)
#: vLLM's configuration when it has no tuned file (fp8_utils.w8a8_triton_block_scaled_mm)
VLLM_DEFAULT = {
    "BLOCK_SIZE_M": 64,
    "BLOCK_SIZE_N": 128,
    "BLOCK_SIZE_K": 128,
    "GROUP_SIZE_M": 32,
    "num_warps": 4,
    "num_stages": 2,
}
L2 = 60 * 2**20
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def inputs(torch: Any, m: int, n: int, k: int, seed: int) -> dict[str, Any]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    kt, nt = -(-k // 128), -(-n // 128)
    fp8 = torch.float8_e4m3fn
    a = torch.randn(m, k, device="cuda", generator=g).to(fp8)
    b = (torch.randn(n, k, device="cuda", generator=g) * 0.25).to(fp8)
    sa = torch.rand(m, kt, device="cuda", generator=g) * 0.01 + 0.005
    sb = torch.rand(nt, kt, device="cuda", generator=g) * 0.01 + 0.005
    return {"a": a, "b": b, "sa": sa, "sb": sb}


def impls(torch: Any, backends: list[str]) -> dict[str, Any]:
    from opmux.kernels.ops.gemm import triton_kernels, w8a8_block_fp8_matmul

    out: dict[str, Any] = {"opmux default": lambda s: w8a8_block_fp8_matmul(s["a"], s["b"], s["sa"], s["sb"])}
    # the same call with the activation scales M-major (SGLang's and DeepGEMM's layout, the one
    # torch._scaled_mm is given below): no scale relayout in front of cuBLASLt or CUTLASS
    out["opmux default, M-major scales"] = lambda s: w8a8_block_fp8_matmul(
        s["a"], s["b"], s["sa_cm"], s["sb"]
    )
    for be in backends:
        out[f"opmux {be}"] = lambda s, be=be: w8a8_block_fp8_matmul(
            s["a"], s["b"], s["sa"], s["sb"], backend=be
        )

    def scaled_mm(s: dict[str, Any]) -> Any:
        # cuBLASLt's layout: A scales M-major with stride M, B as a column-major [K, N] view
        return torch._scaled_mm(
            s["a"], s["b"].T, scale_a=s["sa_cm"], scale_b=s["sb"].T, out_dtype=torch.bfloat16
        )

    def vllm_triton(s: dict[str, Any]) -> Any:
        m, n = s["a"].shape[0], s["b"].shape[0]
        y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        triton_kernels.launch(y, s["a"], s["b"], s["sa"], s["sb"], config=VLLM_DEFAULT)
        return y

    out["torch._scaled_mm"] = scaled_mm
    out["Triton (vLLM default config)"] = vllm_triton
    out["torch.mm bf16"] = lambda s: torch.mm(s["a16"], s["b16"].T)
    return out


def error(torch: Any, y: Any, ref: Any) -> float:
    return float((y.float() - ref).abs().mean() / ref.abs().mean().clamp_min(1e-30))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--models", default="", help="comma-separated model names (default: all), tensor parallel 1"
    )
    ap.add_argument("--m", default=",".join(map(str, M_DEFAULT)), help="the M values (default %(default)s)")
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--target-us", type=float, default=3000.0, help="graph length aimed at")
    ap.add_argument("--budget-s", type=float, default=400.0, help="shapes left when it is spent are skipped")
    args = ap.parse_args(argv)

    import torch

    from opmux.kernels import registry
    from opmux.kernels.tune import MODELS

    models = [m for m in MODELS if not args.models or m in args.models.split(",")]
    ms = [int(v) for v in args.m.split(",")]
    spec = registry.get(OP)
    backends = [b.name for b in spec.backends if "cuda" in b.requires.devices and b.name != "torch"]
    args.out.mkdir(parents=True, exist_ok=True)
    bw = copy_bandwidth(torch)
    log(f"copy bandwidth {bw['GBps']:.0f} GB/s")
    record: dict[str, Any] = {
        "env": environment(torch),
        "copy": bw,
        "vllm_default": VLLM_DEFAULT,
        "cases": [],
    }
    fns = impls(torch, backends)
    seen: set[tuple[int, int]] = set()
    shapes = [(model, layer, n, k) for model in models for layer, n, k, _split in MODELS[model]]
    if not args.models:
        shapes += [(model, layer, n, k) for model, layer, n, k in EXTRA_SHAPES]
    for model, layer, n, k in shapes:
        if (n, k) in seen:
            continue
        seen.add((n, k))
        for m in ms:
            if time.perf_counter() - T0 > args.budget_s:
                record["cases"].append(
                    {"model": model, "layer": layer, "N": n, "K": k, "M": m, "skipped": "budget"}
                )
                continue
            record["cases"].append(run_case(torch, fns, model, layer, m, n, k, bw, args))
            (args.out / "gemm.json").write_text(json.dumps(record, indent=1) + "\n")
    (args.out / "gemm.json").write_text(json.dumps(record, indent=1) + "\n")
    (args.out / "gemm.md").write_text(render(record))
    log(f"wrote {args.out / 'gemm.json'} and gemm.md")
    return 0


def run_case(
    torch: Any,
    fns: dict[str, Any],
    model: str,
    layer: str,
    m: int,
    n: int,
    k: int,
    bw: dict[str, Any],
    args: Any,
) -> dict[str, Any]:
    from opmux.kernels import explain
    from opmux.kernels.ops.gemm.op import torch_w8a8

    per_set = n * k + m * k + 2 * m * n
    n_sets = max(1, min(8, math.ceil(3 * L2 / per_set)))
    sets = [inputs(torch, m, n, k, seed) for seed in range(n_sets)]
    for s in sets:
        kt = s["sa"].shape[1]
        mp = -(-m // 4) * 4
        cm = torch.empty(kt, mp, device="cuda")
        cm[:, :m] = s["sa"].T
        s["sa_cm"] = cm.T[:m] if mp == m else None
        s["a16"], s["b16"] = s["a"].to(torch.bfloat16), s["b"].to(torch.bfloat16)
    s0 = sets[0]
    ref = torch.empty(m, n, device="cuda")
    torch_w8a8(ref, s0["a"], s0["b"], s0["sa"], s0["sb"])
    ref = ref.to(torch.bfloat16).float()  # vLLM's criterion compares in the output dtype (bf16 here)
    flops = 2 * m * n * k
    est_us = max(3.0, flops / 600e12 * 1e6, n * k / 3.5e12 * 1e6)
    R = max(len(sets), min(200, math.ceil(args.target_us / est_us)))
    case: dict[str, Any] = {"model": model, "layer": layer, "M": m, "N": n, "K": k, "impls": {}}
    try:
        case["default_backend"] = explain(OP, s0["a"], s0["b"], s0["sa"], s0["sb"]).chosen
    except Exception as exc:  # the record says why
        case["default_backend"] = f"explain failed: {exc}"
    for name, fn in fns.items():
        if name in ("torch._scaled_mm", "opmux default, M-major scales") and s0["sa_cm"] is None:
            case["impls"][name] = {"status": "n/a", "why": "M is not a multiple of 4 (cuBLASLt refuses)"}
            continue
        rec: dict[str, Any] = {}
        try:
            y = fn(s0)
            torch.cuda.synchronize()
            if name != "torch.mm bf16":
                rec["rel_err"] = error(torch, y, ref)
                if not rec["rel_err"] < 1e-3:
                    rec["status"] = "wrong"
            rec.setdefault("status", "checked")
        except Exception as exc:
            rec = {"status": "error", "why": f"{type(exc).__name__}: {str(exc)[:300]}"}
        case["impls"][name] = rec
    # timed together, replays interleaved (bench_gpu.time_impls: clocks drift under fp8 load)
    timed = [nm for nm, r in case["impls"].items() if r["status"] == "checked"]
    try:
        times = time_impls(torch, {nm: fns[nm] for nm in timed}, sets, R, args.replays)
    except Exception as exc:
        times = {}
        for nm in timed:
            case["impls"][nm].update(status="error", why=f"{type(exc).__name__}: {str(exc)[:300]}")
    for nm, t in times.items():
        if "error" in t:
            case["impls"][nm].update(status="error", why=t["error"])
        else:
            case["impls"][nm].update(t)
    for name in timed:
        rec = case["impls"][name]
        if rec["status"] == "checked" and "us" in rec:
            rec["status"] = "ok"
            rec["TFLOPs"] = flops / (rec["us"] * 1e-6) / 1e12
            rec["B_over_copy"] = n * k / (rec["us"] * 1e-6) / (bw["GBps"] * 1e9)
    best = {nm: r["us"] for nm, r in case["impls"].items() if r.get("status") == "ok"}
    # the default in the layout each peer is given: the better of the two scale layouts
    dflt = min(
        (best[k] for k in ("opmux default", "opmux default, M-major scales") if k in best), default=None
    )
    peers = {nm: us for nm, us in best.items() if not nm.startswith("opmux")}
    if dflt and peers:
        fastest = min(peers, key=peers.__getitem__)
        case["fastest_peer"], case["default_vs_fastest_peer"] = fastest, dflt / peers[fastest]
    log(
        f"{model} {layer} M={m} N={n} K={k}: "
        + ", ".join(f"{nm} {us:.1f}" for nm, us in sorted(best.items(), key=lambda kv: kv[1]))
    )
    del sets
    torch.cuda.empty_cache()
    return case


def render(record: dict[str, Any]) -> str:
    env = record["env"]
    names: list[str] = []
    for c in record["cases"]:
        for nm in c.get("impls", {}):
            if nm not in names:
                names.append(nm)
    lines = [
        "# Block-scaled fp8 GEMM on the GPU",
        "",
        f"Generated by `benchmarks/bench_gemm.py` on {env.get('device', '?')} (torch {env.get('torch', '?')}); "
        f"copy bandwidth {record['copy']['GBps']:.0f} GB/s. us per call in CUDA graphs (TFLOP/s; for M <= 16 "
        "also the weight read as a fraction of copy bandwidth). `default/peer`: opmux's default call "
        "over the fastest peer (below 1: faster).",
        "",
        "| model | layer | M | N | K | default ran | " + " | ".join(names) + " | default/peer |",
        "|---|---|---:|---:|---:|---|" + "---:|" * len(names) + "---:|",
    ]
    for c in record["cases"]:
        if "skipped" in c:
            continue
        cells = []
        for nm in names:
            r = c["impls"].get(nm, {})
            if r.get("status") != "ok":
                cells.append(r.get("status", "-"))
                continue
            cell = f"{r['us']:.1f} ({r['TFLOPs']:.0f})"
            if c["M"] <= 16:
                cell += f" {r['B_over_copy']:.2f}"
            cells.append(cell)
        ratio = c.get("default_vs_fastest_peer")
        lines.append(
            f"| {c['model']} | {c['layer']} | {c['M']} | {c['N']} | {c['K']} | {c.get('default_backend', '')} | "
            + " | ".join(cells)
            + f" | {'' if ratio is None else f'{ratio:.2f}'} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
