"""Sweep attention.paged_decode's Triton launch (key tile rows, warps, pipeline stages, the register
double buffer, the split count's wave target) over the decode benchmark's shapes on one GPU: the
data behind ``triton_kernels.tile_config`` and ``num_splits``, and the tuned tables the launch reads.

    python benchmarks/tune/decode_tiles.py --out DIR [--models Llama-3-8B,Qwen3-30B-A3B]
        [--batches 1,16,64,256] [--contexts 512,4096,32768] [--fp8] [--budget-s 240] [--table-out DIR]
    python benchmarks/tune/decode_tiles.py --tables-from DIR/decode_tiles.json --table-out DIR

Every candidate is a table entry: a tile and a wave target ``WAVES`` of 2, 3, 4 or 8 programs per
SM (one round of a tile that fits 2, 3 or 4 programs on an SM, two rounds of one that fits 4; the
split count follows from the waves as the launch derives it, rounded down to whole rounds, so a
table entry measured at one batch carries to its neighbours). Each is checked against the default
launch's output on the same case (atol 2e-2: the same arithmetic in another order) before it is
timed; a wave target whose split count equals one already timed for the tile (bounded by the
length or MAX_SPLITS) reuses that time. Timing is
bench_gpu.time_impl (R calls in one CUDA graph, median of the replays). Writes DIR/decode_tiles.json
(rewritten after every case) and DIR/decode_tiles.md: per case the default's time, the best
candidate and its ratio, and each candidate's time relative to the default's over the cases.
``--table-out DIR`` also writes the tuned tables (``write_tables``: per (DV, G) and programs of a
split, the candidate that M's bf16 cases favour by more than 2%, else the default as timed), named
for this GPU; ``--tables-from JSON --table-out DIR`` writes those of an earlier run's record,
without a GPU. Records of earlier sweeps are refused: raw split counts
(docs/benchmarks/attention_decode_tiles_h200.json: no table's terms) and wave targets of the rule
that rounded the split count up (docs/benchmarks/attention_decode_tiles_tables_h200.json: the same
WAVES give other counts now).
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

import _sweep  # noqa: E402
from _sweep import add_table_options, candidate_rows, pick_best, table_rows, tables_only  # noqa: E402
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
#: the wave targets raced (programs per SM: ``_decode_tile_config.num_splits``)
WAVES = (2, 3, 4, 8)
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def _entry(tile: Any, waves: int) -> dict[str, int]:
    bn, w, st, pf = tile
    return {"BLOCK_N": bn, "num_warps": w, "num_stages": st, "PREFETCH": int(pf), "WAVES": waves}


def run_case(torch: Any, model: str, bsz: int, n: int, fp8: bool, args: Any) -> dict[str, Any]:
    from opmux.kernels.ops.attention import _decode_tile_config as dtc
    from opmux.kernels.ops.attention import op as decls
    from opmux.kernels.ops.attention import triton_kernels as tk

    hq, hkv, d = MODELS[model]
    c = make_case(torch, bsz, n, (hq, hkv, d), args.page, fp8, args.table_positions)
    kernel_args, out = decls.paged_decode.check(
        OP, c["query"], c["kc"], c["vc"], c["table"], c["lens"], **c["kw"]
    )
    # the launch's own terms: the table's shape and M, the default's tile and wave target
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    block_dv, g = max(16, 1 << (d - 1).bit_length()), hq // hkv
    heads = dtc.programs(1, hkv, g, block_dv)  # KV head chunks a sequence
    capacity = c["table"].shape[1] * c["kc"].shape[1]
    cache_bytes = 2 * bsz * n * hkv * d * (1 if fp8 else 2)
    R = max(1, min(200, math.ceil(args.target_us / max(5.0, cache_bytes / 4e12 * 1e6))))

    def launch(tile: Any, splits: int | None) -> Any:
        tk.launch(*kernel_args, splits=splits, tile=tile)
        return out

    launch(None, None)
    torch.cuda.synchronize()
    want = out.float().clone()
    # after the first launch: an entry the compiler refused there reads as the default it ran
    tile0, waves0, base_splits = tk.launch_config(
        c["query"].device, bsz, heads, capacity, block_dv, g, True, fp8
    )  # a table's entry where one is read, else the heuristic's
    rec: dict[str, Any] = {"model": model, "B": bsz, "N": n, "fp8": fp8, "splits": base_splits, "cands": {}}
    rec.update(shape=[block_dv, g], M=bsz * heads, sms=sms, default_cfg=_entry(tile0, waves0))
    t = time_impl(torch, lambda _: launch(None, None), [None], R, args.replays)
    rec["heuristic_us"] = t["us"]
    for tile in TILES:
        seen: dict[int, str] = {}
        for waves in WAVES:
            splits = dtc.num_splits(bsz, heads, capacity, sms, not fp8, waves)
            name = f"{tile[0]}x{tile[1]}w s{tile[2]}{' pf' if tile[3] else ''} waves{waves}"
            if splits in seen:  # bounded to a split count already timed: the same launch
                rec["cands"][name] = {
                    **rec["cands"][seen[splits]],
                    "cfg": _entry(tile, waves),
                    "same_as": seen[splits],
                }
                continue
            seen[splits] = name
            cand: dict[str, Any] = {"cfg": _entry(tile, waves), "splits": splits}
            rec["cands"][name] = cand
            try:
                launch(tk.TileConfig(*tile), splits)
                torch.cuda.synchronize()
                err = (out.float() - want).abs().max().item()
                if not err <= 2e-2 * (8 if fp8 else 1):
                    cand.update(status="wrong", err=err)
                    continue
                r = time_impl(
                    torch,
                    lambda _, tile=tile, splits=splits: launch(tk.TileConfig(*tile), splits),
                    [None],
                    R,
                    args.replays,
                )
                cand.update(us=r["us"], GBs=cache_bytes / (r["us"] * 1e-6) / 1e9)
            except Exception as exc:
                cand.update(status="error", why=f"{type(exc).__name__}: {str(exc)[:200]}")
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


def tables(record: dict[str, Any]) -> dict[tuple[int, ...], dict[int, dict[str, int]]]:
    """The tuned tables the sweep supports (``_sweep.table_rows``): per (DV, G) and programs of a
    split (M), the candidate that M's cases favour (their contexts, bf16 caches only: fp8 ones
    read no table), else the default as timed. ValueError for a record of an earlier sweep: raw
    split counts (``split_factors``: no table's terms), or wave targets of the rule that rounded
    the split count up (``wave_factors``: the same WAVES now gives other counts)."""
    if "split_factors" in record:
        raise ValueError(
            "a record of the earlier decode sweep (raw split counts, no wave targets): its candidates "
            "are no table entries; rerun benchmarks/tune/decode_tiles.py"
        )
    if record.get("split_rule") != "floor":
        raise ValueError(
            "a record of the decode sweep under the earlier split rule (split counts rounded up): its "
            "WAVES give other split counts now; rerun benchmarks/tune/decode_tiles.py"
        )
    cases = [r for r in record["cases"] if not r["fp8"]]
    return table_rows(
        cases, "M", "heuristic", lambda group: [(k, v["cfg"]) for k, v in group[0]["cands"].items()]
    )


def write_tables(record: dict[str, Any], folder: Path) -> list[Path]:
    """The tables as ``DV=..,G=..,device_name=<the record's GPU>.json`` files in ``folder``."""
    return _sweep.write_tables(OP, record, tables(record), folder)


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
    add_table_options(p)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--batches", default="1,16,64,256")
    p.add_argument("--contexts", default="512,4096,32768")
    p.add_argument("--page", type=int, default=16)
    p.add_argument(
        "--table-positions",
        type=int,
        default=0,
        help="block tables sized for this many positions (an engine's max_model_len), as bench_attention_decode",
    )
    p.add_argument("--fp8", action="store_true", help="also the e4m3 cache")
    p.add_argument("--budget-s", type=float, default=240.0)
    p.add_argument("--target-us", type=float, default=1500.0, help="graph length per timing")
    p.add_argument("--replays", type=int, default=5)
    args = p.parse_args(argv)
    if tables_only(p, args, write_tables):
        return 0
    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {
        "env": environment(torch),
        "tiles": TILES,
        "waves": WAVES,
        "split_rule": "floor",  # the split count rounded down to whole rounds (num_splits)
        "table_positions": args.table_positions,  # 0: each case's table as long as its context
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
    if args.table_out is not None:
        for path in write_tables(record, args.table_out):
            log(f"table {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
