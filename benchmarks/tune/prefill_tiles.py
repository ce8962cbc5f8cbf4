"""Sweep attention.paged_prefill's Triton launch (query rows x key rows, warps, pipeline stages, and
the kernel's SPLIT: key tiles below the diagonal without the causal mask) over the prefill
benchmark's shapes on one GPU: the data behind ``_prefill_triton.tile_config``.

    python benchmarks/tune/prefill_tiles.py --out DIR [--models Llama-3-8B,Qwen3-30B-A3B]
        [--tokens 1024,4096,16384] [--modes prefill,extend,ragged] [--budget-s 240] [--table-out DIR]
    python benchmarks/tune/prefill_tiles.py --tables-from DIR/prefill_tiles.json --table-out DIR

Every candidate is checked against the default launch's output on the same case (atol 2e-2: the
same arithmetic in another order) before it is timed; a candidate the compiler refuses (shared
memory, registers) is recorded as such. Timing: bench_gpu.time_impl (R calls in one CUDA graph,
median of the replays). Writes DIR/prefill_tiles.json (rewritten after every case) and
DIR/prefill_tiles.md: per case the default's time and the best candidate, and each candidate's
time over the default's (geometric mean and worst over the cases). ``--table-out DIR`` also writes
the tuned tables the launch reads (``write_tables``: per (DV, G) and query rows, the candidate the
cases of that row count favour, else the default), named for this GPU; ``--tables-from JSON
--table-out DIR`` writes those of an earlier run's record, without a GPU.
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
from bench_attention_prefill import MODELS, make_case, split  # noqa: E402
from bench_gpu import environment, time_impl  # noqa: E402

OP = "attention.paged_prefill"
#: (BLOCK_M query rows, BLOCK_N key rows, num_warps, num_stages, SPLIT); D = 128's default
#: (128, 64, 8, 2, off) is the baseline every case times first. SPLIT's two pipelined loops take
#: more registers (ptxas sm_90a, bf16: 192 -> 255 at 128 x 64; 128 x 128 then spills): only the
#: tiles that stay unspilled are swept with it
TILES = [
    (128, 64, 8, 3, False),
    (128, 64, 4, 2, False),
    (128, 32, 4, 3, False),
    (128, 128, 8, 2, False),
    (64, 64, 4, 2, False),
    (64, 64, 4, 3, False),
    (64, 32, 4, 3, False),
    (64, 128, 4, 2, False),
    (256, 64, 8, 2, False),
    (128, 64, 8, 2, True),
    (128, 32, 8, 3, True),
    (64, 64, 4, 3, True),
]
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def run_case(torch: Any, model: str, mode: str, n: int, args: Any) -> dict[str, Any]:
    from opmux.kernels.ops.attention import _prefill_triton
    from opmux.kernels.ops.attention import op as decls

    hq, hkv, d = MODELS[model]
    q_lens, prefix = split(mode, n)
    c = make_case(torch, q_lens, prefix, (hq, hkv, d), args.page)
    kernel_args, out = decls.paged_prefill.check(
        OP, c["query"], c["kc"], c["vc"], c["table"], c["lens"], c["cu"]
    )
    flops = sum(4 * q * (p + q / 2) * hq * d for q, p in zip(q_lens, prefix, strict=True))
    R = max(1, min(100, math.ceil(args.target_us / max(5.0, flops / 4e14 * 1e6))))

    def launch(tile: tuple[int, int, int, int, bool] | None) -> Any:
        if tile is None:
            _prefill_triton.launch(*kernel_args)
        else:
            bm, bn, w, st, sp = tile
            _prefill_triton.launch(*kernel_args, block_m=bm, block_n=bn, warps=w, stages=st, split=sp)
        return out

    launch(None)
    torch.cuda.synchronize()
    want = out.float().clone()
    rec: dict[str, Any] = {"model": model, "mode": mode, "N": n, "rows": sum(q_lens), "cands": {}}
    rec["shape"] = [max(16, 1 << (d - 1).bit_length()), hq // hkv]  # the tuned table's (DV, G)
    # the default launch as timed (a tuned table's entry where one is read, else tile_config's)
    from opmux.kernels import tuned

    rec["default_cfg"] = dict(
        tuned.lookup(OP, "triton", tuned.device_name(c["query"].device), tuple(rec["shape"]), rec["rows"])
    )
    rec["default_us"] = time_impl(torch, lambda _: launch(None), [None], R, args.replays)["us"]
    for tile in TILES:
        name = _name(tile)
        try:
            launch(tile)
            torch.cuda.synchronize()
            err = (out.float() - want).abs().max().item()
            if not err <= 2e-2:
                rec["cands"][name] = {"status": "wrong", "err": err}
                continue
            r = time_impl(torch, lambda _, tile=tile: launch(tile), [None], R, args.replays)
            rec["cands"][name] = {"us": r["us"], "TFLOPs": flops / (r["us"] * 1e-6) / 1e12}
        except Exception as exc:
            rec["cands"][name] = {"status": "error", "why": f"{type(exc).__name__}: {str(exc)[:200]}"}
    pick_best(rec, "default")
    log(
        f"{model} {mode} N={n}: default {rec['default_us']:.1f} us, best {rec.get('best')} {rec.get('best_us', math.nan):.1f} us"
    )
    del c
    torch.cuda.empty_cache()
    return rec


def _name(tile: tuple[int, int, int, int, bool]) -> str:
    return "{}x{} {}w s{}".format(*tile[:4]) + (" split" if tile[4] else "")


def _entry(tile: tuple[int, int, int, int, bool]) -> dict[str, int]:
    bm, bn, w, st, sp = tile
    return {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": st, "SPLIT": int(sp)}


def tables(record: dict[str, Any]) -> dict[tuple[int, ...], dict[int, dict[str, int]]]:
    """The tuned tables the sweep supports (``_sweep.table_rows``): per (DV, G) and query rows,
    the candidate the cases of that row count (the modes) favour, else the default as timed. The
    candidates are the record's own tiles (a record of an earlier tile list keeps its names)."""
    tiles = [tuple(t) for t in record["tiles"]]
    return table_rows(record["cases"], "rows", "default", lambda _: [(_name(t), _entry(t)) for t in tiles])


def write_tables(record: dict[str, Any], folder: Path) -> list[Path]:
    """The tables as ``DV=..,G=..,device_name=<the record's GPU>.json`` files in ``folder``."""
    return _sweep.write_tables(OP, record, tables(record), folder)


def render(record: dict[str, Any]) -> str:
    env = record["env"]
    lines = [
        "# paged_prefill Triton launch sweep",
        "",
        f"{env.get('device')} (torch {env.get('torch')}, Triton {env.get('triton')}). us per call in CUDA graphs.",
        "",
        "| model | mode | N | default | best | best us | best/default |",
        "|---|---|---:|---:|---|---:|---:|",
    ]
    for r in record["cases"]:
        lines.append(
            f"| {r['model']} | {r['mode']} | {r['N']} | {r['default_us']:.1f} | {r.get('best', '-')} | "
            f"{r.get('best_us', math.nan):.1f} | {r.get('best_over_default', math.nan):.3f} |"
        )
    lines += ["", *candidate_rows(record["cases"], "default", "geomean over default")]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_table_options(p)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--tokens", default="1024,4096,16384")
    p.add_argument("--modes", default="prefill,extend,ragged")
    p.add_argument("--page", type=int, default=16)
    p.add_argument("--budget-s", type=float, default=240.0)
    p.add_argument("--target-us", type=float, default=3000.0, help="graph length per timing")
    p.add_argument("--replays", type=int, default=5)
    args = p.parse_args(argv)
    if tables_only(p, args, write_tables):
        return 0
    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"env": environment(torch), "tiles": TILES, "cases": []}
    deadline = time.monotonic() + args.budget_s
    for model in args.models.split(","):
        for mode in args.modes.split(","):
            for n in (int(x) for x in args.tokens.split(",")):
                if time.monotonic() > deadline:
                    log("budget spent; the cases so far are written")
                    break
                record["cases"].append(run_case(torch, model, mode, n, args))
                (args.out / "prefill_tiles.json").write_text(json.dumps(record, indent=1))
                (args.out / "prefill_tiles.md").write_text(render(record))  # a killed run keeps it
    (args.out / "prefill_tiles.md").write_text(render(record))
    print(render(record))
    if args.table_out is not None:
        for path in write_tables(record, args.table_out):
            log(f"table {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
