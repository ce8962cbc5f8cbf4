"""Sweep attention.paged_decode's Triton launch (key tile rows, warps, pipeline stages, the register
double buffer, the split count) over the decode benchmark's shapes on one GPU: the data behind
``triton_kernels.tile_config`` and ``num_splits``.

    python benchmarks/tune/decode_tiles.py --out DIR [--models Llama-3-8B,Qwen3-30B-A3B]
        [--batches 1,16,64,256] [--contexts 512,4096,32768] [--fp8] [--budget-s 240]

Every candidate is checked against the heuristic launch's output on the same case (atol 2e-2: the
same arithmetic in another order) before it is timed; timing is bench_gpu.time_impl (R calls in one
CUDA graph, median of the replays). Writes DIR/decode_tiles.json (rewritten after every case) and
DIR/decode_tiles.md: per case the heuristic's time, the best candidate and its ratio, and each
candidate's time relative to the heuristic's summed over the cases (the candidate that is best
everywhere, if any).
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
sys.path.insert(0, str(HERE.parent))

from _sweep import candidate_rows, pick_best  # noqa: E402
from bench_attention_decode import MODELS, make_case  # noqa: E402
from bench_gpu import environment, time_impl  # noqa: E402

OP = "attention.paged_decode"
#: (block_n, num_warps, num_stages, prefetch)
TILES = [
    (32, 8, 3, False),
    (32, 8, 3, True),
    (32, 8, 1, True),
    (64, 8, 3, False),
    (64, 8, 3, True),
    (16, 4, 3, False),
    (16, 4, 3, True),
    (32, 4, 3, True),
    (16, 2, 3, True),
    (64, 4, 3, False),
]
#: the split count times these (1: the heuristic's)
SPLIT_FACTORS = (1, 2, 4)
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def run_case(torch: Any, model: str, bsz: int, n: int, fp8: bool, args: Any) -> dict[str, Any]:
    from opmux.kernels.ops.attention import op as decls
    from opmux.kernels.ops.attention import triton_kernels as tk

    hq, hkv, d = MODELS[model]
    c = make_case(torch, bsz, n, (hq, hkv, d), args.page, fp8)
    kernel_args, out = decls.paged_decode.check(
        OP, c["query"], c["kc"], c["vc"], c["table"], c["lens"], **c["kw"]
    )
    # the launcher's own count (D 128 here: one chunk per KV head)
    base_splits = tk.num_splits(
        bsz, hkv, n, torch.cuda.get_device_properties(0).multi_processor_count, not fp8
    )
    cache_bytes = 2 * bsz * n * hkv * d * (1 if fp8 else 2)
    R = max(1, min(200, math.ceil(args.target_us / max(5.0, cache_bytes / 4e12 * 1e6))))

    def launch(tile: Any, splits: int) -> Any:
        tk.launch(*kernel_args, splits=splits, tile=tile)
        return out

    launch(None, base_splits)
    torch.cuda.synchronize()
    want = out.float().clone()
    rec: dict[str, Any] = {"model": model, "B": bsz, "N": n, "fp8": fp8, "splits": base_splits, "cands": {}}
    t = time_impl(torch, lambda _: launch(None, base_splits), [None], R, args.replays)
    rec["heuristic_us"] = t["us"]
    for tile in TILES:
        seen: set[int] = set()
        for f in SPLIT_FACTORS:
            splits = min(tk.MAX_SPLITS, base_splits * f)
            if splits in seen:  # clamped to a count already timed
                continue
            seen.add(splits)
            name = f"{tile[0]}x{tile[1]}w s{tile[2]}{' pf' if tile[3] else ''} split*{f}"
            try:
                launch(tk.TileConfig(*tile), splits)
                torch.cuda.synchronize()
                err = (out.float() - want).abs().max().item()
                if not err <= 2e-2 * (8 if fp8 else 1):
                    rec["cands"][name] = {"status": "wrong", "err": err}
                    continue
                r = time_impl(
                    torch,
                    lambda _, tile=tile, splits=splits: launch(tk.TileConfig(*tile), splits),
                    [None],
                    R,
                    args.replays,
                )
                rec["cands"][name] = {"us": r["us"], "GBs": cache_bytes / (r["us"] * 1e-6) / 1e9}
            except Exception as exc:
                rec["cands"][name] = {"status": "error", "why": f"{type(exc).__name__}: {str(exc)[:200]}"}
    if pick_best(rec, "heuristic") is not None:
        rec["heuristic_GBs"] = cache_bytes / (rec["heuristic_us"] * 1e-6) / 1e9
        rec["best_GBs"] = cache_bytes / (rec["best_us"] * 1e-6) / 1e9
    log(
        f"{model} B={bsz} N={n}{' fp8' if fp8 else ''}: heuristic {rec['heuristic_us']:.1f} us, "
        f"best {rec.get('best')} {rec.get('best_us', float('nan')):.1f} us"
    )
    del c
    torch.cuda.empty_cache()
    return rec


def render(record: dict[str, Any]) -> str:
    env = record["env"]
    lines = [
        "# paged_decode Triton launch sweep",
        "",
        f"{env.get('device')} (torch {env.get('torch')}, Triton {env.get('triton')}). us per call in CUDA "
        "graphs (GB/s of K and V read).",
        "",
        "| model | B | N | cache | splits | heuristic | best | best us | best/heuristic |",
        "|---|---:|---:|---|---:|---:|---|---:|---:|",
    ]
    for r in record["cases"]:
        lines.append(
            f"| {r['model']} | {r['B']} | {r['N']} | {'fp8' if r['fp8'] else 'bf16'} | {r['splits']} | "
            f"{r['heuristic_us']:.1f} ({r.get('heuristic_GBs', 0):.0f}) | {r.get('best', '-')} | "
            f"{r.get('best_us', float('nan')):.1f} ({r.get('best_GBs', 0):.0f}) | {r.get('best_over_heuristic', float('nan')):.3f} |"
        )
    lines += ["", "Each candidate over the heuristic (geometric mean over the cases it ran; worst case):", ""]
    lines += candidate_rows(record["cases"], "heuristic", "geomean")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--batches", default="1,16,64,256")
    p.add_argument("--contexts", default="512,4096,32768")
    p.add_argument("--page", type=int, default=16)
    p.add_argument("--fp8", action="store_true", help="also the e4m3 cache")
    p.add_argument("--budget-s", type=float, default=240.0)
    p.add_argument("--target-us", type=float, default=1500.0, help="graph length per timing")
    p.add_argument("--replays", type=int, default=5)
    args = p.parse_args(argv)
    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {
        "env": environment(torch),
        "tiles": TILES,
        "split_factors": SPLIT_FACTORS,
        "cases": [],
    }
    deadline = time.monotonic() + args.budget_s
    forms = [False, True] if args.fp8 else [False]
    for fp8 in forms:
        for model in args.models.split(","):
            for bsz in (int(x) for x in args.batches.split(",")):
                for n in (int(x) for x in args.contexts.split(",")):
                    if 2 * bsz * n * MODELS[model][1] * MODELS[model][2] * 2 > 24 << 30:
                        continue
                    if time.monotonic() > deadline:
                        log("budget spent; the cases so far are written")
                        break
                    record["cases"].append(run_case(torch, model, bsz, n, fp8, args))
                    (args.out / "decode_tiles.json").write_text(json.dumps(record, indent=1))
                    (args.out / "decode_tiles.md").write_text(render(record))  # a killed run keeps it
    (args.out / "decode_tiles.md").write_text(render(record))
    print(render(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
