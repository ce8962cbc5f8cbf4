"""moe.fused_experts' Triton decode path (two launches: the up kernel, then the down kernel behind
it with PDL on sm_90+) with and without PDL, side by side: the data for whether its down kernel
goes behind PDL (the paged decode's merge lost up to 1.33x to a plain launch on an H100 where its
split grid was one round: docs/benchmarks/attention_decode_h200.md).

    python benchmarks/tune/moe_decode_pdl.py --out DIR [--models DeepSeek-V3,Qwen3-30B-A3B] [--m 1,2,4,8]

Per (model, M): the tuned table's configuration where it is a decode one (``DECODE: 1``), else the
decode path's first seed; the two launches checked bit-identical, then timed together in CUDA
graphs (``bench_gpu.time_impls``) over two routings; the weights' bytes over the time as a
fraction of the copy bandwidth of the same run. Writes DIR/moe_decode_pdl.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench_gpu import copy_bandwidth, environment, time_impls  # noqa: E402

OP = "moe.fused_experts"
DEVICE = "cuda"  # a test runs the script's path on the CPU (the interpreter)


def decode_config(
    torch: Any, w: dict[str, Any], s: dict[str, Any], form: str, topk: int
) -> tuple[dict[str, Any], str]:
    from opmux.kernels import tuned
    from opmux.kernels.ops.moe import fused_experts_triton as fet
    from opmux.kernels.tune.moe import _decode_space

    args = (s["out"], s["hidden"], w["w1"], w["w2"], s["tw"], s["ti"], w["s1"], w["s2"], w["map"])
    shape, m = fet._PROBLEM(*args)
    cfg = tuned.lookup(OP, "triton", tuned.device_name(s["hidden"].device), shape, m, fet._TAGS(*args))
    if cfg.get("DECODE"):
        return dict(cfg), "table"
    return _decode_space(form, topk, 0)[0][0], "seed"


def run_case(torch: Any, model: str, m: int, copy: float, replays: int) -> dict[str, Any]:
    from opmux.kernels.ops.moe.fused_experts_decode import launch_decode
    from opmux.kernels.tune.models import moe_shapes
    from opmux.kernels.tune.moe import _routing, make_weights

    e, n, k, topk, form = moe_shapes(model)
    raw = make_weights(torch, e, n, k, form, DEVICE)
    empty = torch.empty(0, device=DEVICE)
    w = {
        "w1": raw["w1"],
        "w2": raw["w2"],
        "s1": raw.get("w1_scale") if raw.get("w1_scale") is not None else empty,
        "s2": raw.get("w2_scale") if raw.get("w2_scale") is not None else empty,
        "map": torch.empty(0, dtype=torch.int32, device=DEVICE),
    }
    sets = []
    for seed in range(2):
        r = _routing(torch, m, e, k, topk, DEVICE, seed)
        sets.append({**r, "out": torch.empty_like(r["hidden"])})
    cfg, src = decode_config(torch, w, sets[0], form, topk)

    def launcher(pdl: bool | None) -> Any:
        def f(s: dict[str, Any]) -> Any:
            out = torch.empty_like(s["hidden"])
            launch_decode(
                out, s["hidden"], w["w1"], w["w2"], s["tw"], s["ti"], w["s1"], w["s2"], w["map"],
                "silu", False, cfg, pdl=pdl,
            )  # fmt: skip
            return out

        return f

    fns = {"PDL (default)": launcher(None), "plain": launcher(False)}
    a, b = fns["PDL (default)"](sets[0]), fns["plain"](sets[0])
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    case: dict[str, Any] = {"model": model, "form": form, "E": e, "N": n, "K": k, "topk": topk, "M": m}
    case.update(config=cfg, config_from=src, identical=bool(torch.equal(a, b)))
    if not case["identical"]:
        case["error"] = "the two launches differ"
        return case
    # the weight bytes a call reads: each distinct expert's up and down rows (fp8: one byte)
    experts = sum(len(set(s["ti"].flatten().tolist())) for s in sets) / len(sets)
    nbytes = experts * 3 * n * k * (1 if form == "fp8" else 2)
    times = time_impls(torch, fns, sets, max(1, min(200, int(2000 / max(2.0, nbytes / 3e12 * 1e6)))), replays)
    case["impls"] = times
    for t in times.values():
        if "us" in t:
            t["copy_frac"] = nbytes / (t["us"] * 1e-6) / 1e9 / copy
    return case


def render(record: dict[str, Any]) -> str:
    lines = [
        f"moe.fused_experts' Triton decode path with and without PDL on {record['env'].get('device', '?')}; "
        f"copy bandwidth {record['copy']['GBps']:.0f} GB/s in the same run. us per call in CUDA graphs "
        "(fraction of the copy bandwidth for the weights read).",
        "",
        "| model | form | M | config | PDL us | plain us | PDL / plain |",
        "|---|---|---:|---|---:|---:|---:|",
    ]
    for c in record["cases"]:
        im = c.get("impls", {})
        p, q = im.get("PDL (default)", {}).get("us"), im.get("plain", {}).get("us")
        ratio = f"{p / q:.3f}" if p and q else c.get("error", "-")
        cfg = c.get("config", {})
        tag = f"{c.get('config_from')} {cfg.get('BLOCK_SIZE_N')}/{cfg.get('BLOCK_SIZE_M')}/{cfg.get('BLOCK_SIZE_K')}"
        ps = f"{p:.1f} ({im['PDL (default)'].get('copy_frac', 0):.2f})" if p else "-"
        qs = f"{q:.1f} ({im['plain'].get('copy_frac', 0):.2f})" if q else "-"
        lines.append(f"| {c['model']} | {c['form']} | {c['M']} | {tag} | {ps} | {qs} | {ratio} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--models", default="DeepSeek-V3,Qwen3-30B-A3B")
    p.add_argument("--m", default="1,2,4,8")
    p.add_argument("--replays", type=int, default=15)
    args = p.parse_args(argv)
    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"env": environment(torch), "copy": copy_bandwidth(torch), "cases": []}
    for model in args.models.split(","):
        for m in (int(x) for x in args.m.split(",")):
            try:
                case = run_case(torch, model, m, record["copy"]["GBps"], args.replays)
            except Exception as exc:  # one case's failure is recorded; the others still run
                case = {
                    "model": model,
                    "form": "?",
                    "M": m,
                    "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                }
            record["cases"].append(case)
            print(render({**record, "cases": [case]}).splitlines()[-1], flush=True)
            (args.out / "moe_decode_pdl.json").write_text(json.dumps(record, indent=1))
    (args.out / "moe_decode_pdl.md").write_text(render(record))
    print(render(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
