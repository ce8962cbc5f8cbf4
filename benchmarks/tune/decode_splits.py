"""The split-count curve of attention.paged_decode's Triton launch: per case, a ladder of split
counts (and a few key tiles) timed side by side in CUDA graphs, with the copy bandwidth of the same
run. ``decode_tiles.py`` times the wave targets a tuned table can hold (2, 3, 4 or 8 programs an
SM); this times the counts themselves, the data for the split rule where the cache is read below the copy
bandwidth (few (sequence, KV head) pairs at long contexts, short sequences at large batches).

    python benchmarks/tune/decode_splits.py --out DIR [--cases Llama-3-8B:1:32768,Qwen3-30B-A3B:16:32768]
        [--tiles 32x4pf,16x4pf,64x4] [--budget-s 300] [--previous OLD/decode_splits.json] [--resume]

Every candidate is checked against the default launch's output (atol 2e-2) before it is timed;
all candidates of a case are timed together (``bench_gpu.time_impls``: interleaved replays).
Writes DIR/decode_splits.json after every case (``--resume`` skips the cases it holds) and
DIR/decode_splits.md: per case the default's split count and time, the best candidate, and the
fraction of the copy bandwidth each reaches, and beside it the default launch with the merge
behind each other PDL trigger (``off``: launched plainly; ``start`` / ``end``: the split kernel
lets it launch at its programs' first instruction / after their stores; checked bit-identical),
the data of ``triton_kernels.pdl_trigger``. The ladder's candidates take the default's trigger
rule at their own split count.
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

from bench_attention_decode import MODELS, make_case  # noqa: E402
from bench_gpu import copy_bandwidth, environment, time_impls  # noqa: E402

OP = "attention.paged_decode"
#: the cases below 0.9 of the copy bandwidth on the H200 (docs/benchmarks/attention_decode_h200.md)
#: and a neighbour of each that reaches it
DEFAULT_CASES = (
    "Llama-3-8B:1:32768,Llama-3-8B:16:32768,Llama-3-8B:64:32768,Qwen3-30B-A3B:16:32768,"
    "Qwen3-30B-A3B:64:32768,Llama-3-8B:256:512,Qwen3-30B-A3B:256:512,Llama-3-8B:16:4096,Qwen3-30B-A3B:1:32768"
)
LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
#: the most programs a candidate launches, in waves of the SMs
MAX_WAVES = 64
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def parse_tile(text: str) -> tuple[int, int, int, bool]:
    """``32x4pf`` -> (32 key rows, 4 warps, 3 stages, prefetch); ``64x8s1``: 1 stage."""
    pf = text.endswith("pf")
    body = text[:-2] if pf else text
    stages = 3
    if "s" in body:
        body, st = body.split("s")
        stages = int(st)
    rows, warps = body.split("x")
    return int(rows), int(warps), stages, pf


def run_case(torch: Any, model: str, bsz: int, n: int, tiles: list[str], args: Any) -> dict[str, Any]:
    from opmux.kernels.ops.attention import _decode_tile_config as dtc
    from opmux.kernels.ops.attention import op as decls
    from opmux.kernels.ops.attention import triton_kernels as tk

    hq, hkv, d = MODELS[model]
    c = make_case(torch, bsz, n, (hq, hkv, d), args.page, False, args.table_positions)
    kernel_args, out = decls.paged_decode.check(OP, c["query"], c["kc"], c["vc"], c["table"], c["lens"])
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    block_dv, g = max(16, 1 << (d - 1).bit_length()), hq // hkv
    heads = dtc.programs(1, hkv, g, block_dv)
    capacity = c["table"].shape[1] * c["kc"].shape[1]
    tile0, waves0, splits0 = tk.launch_config(
        c["query"].device, bsz, heads, capacity, block_dv, g, True, False
    )
    cache_bytes = 2 * bsz * n * hkv * d * 2
    R = max(1, min(200, math.ceil(args.target_us / max(5.0, cache_bytes / 4e12 * 1e6))))
    tk.launch(*kernel_args)
    torch.cuda.synchronize()
    want = out.float().clone()

    def fn(tile: Any, splits: int | None) -> Any:
        o = torch.empty_like(out)
        # the checked arguments with this column's own output (kernel_args[0] is ``out``)
        tk.launch(o, *kernel_args[1:], splits=splits, tile=tile)
        return o

    def triggered(mode: tk.PdlTrigger) -> Any:  # the default launch with the merge behind another trigger
        def f(_: Any) -> Any:
            o = torch.empty_like(out)
            tk.launch(o, *kernel_args[1:], pdl=mode)
            return o

        return f

    fns: dict[str, Any] = {"default": lambda _: fn(None, None)}
    rec: dict[str, Any] = {"model": model, "B": bsz, "N": n, "M": bsz * heads, "sms": sms, "R": R}
    mode0 = tk.pdl_trigger(splits0) if pdl_ok(c["query"].device) else "off"
    rec.update(
        default={"tile": list(tile0), "waves": waves0, "splits": splits0, "pdl": mode0}, cands={}, pdl={}
    )
    modes: tuple[tk.PdlTrigger, ...] = ("off", "start", "end")
    for mode in modes if pdl_ok(c["query"].device) else ():
        if mode == mode0:
            continue
        o = triggered(mode)(None)
        torch.cuda.synchronize()
        if (o.float() - want).abs().max().item() == 0.0:  # the same launch: the same bits
            fns[f"default, PDL {mode}"] = triggered(mode)
        else:
            rec["pdl"][mode] = {"status": "wrong", "err": (o.float() - want).abs().max().item()}
    most = max(1, min(dtc.MAX_SPLITS, -(-capacity // dtc.MIN_SPLIT_TOKENS), MAX_WAVES * sms // (bsz * heads)))
    # the counts the ladder lacks: this default's, and an earlier record's default for the case
    extra = {splits0, *args.previous.get((model, bsz, n), ())}
    for text in tiles:
        tile = tk.TileConfig(*parse_tile(text))
        for s in sorted({x for x in LADDER if x <= most} | extra):
            name = f"{text} S{s}"
            try:
                o = fn(tile, s)
                torch.cuda.synchronize()
                err = (o.float() - want).abs().max().item()
            except Exception as exc:
                rec["cands"][name] = {"status": "error", "why": f"{type(exc).__name__}: {str(exc)[:200]}"}
                continue
            if not err <= 2e-2:
                rec["cands"][name] = {"status": "wrong", "err": err}
                continue
            rec["cands"][name] = {"tile": text, "splits": s}
            fns[name] = lambda _, tile=tile, s=s: fn(tile, s)
    times = time_impls(torch, fns, [None], R, args.replays)
    copy = args.copy_GBps
    for name, t in times.items():
        slot = (
            rec["default"]
            if name == "default"
            else rec["pdl"].setdefault(name.rsplit(" ", 1)[1], {})
            if name.startswith("default, PDL ")
            else rec["cands"][name]
        )
        slot.update(t)
        if "us" in t:
            gbs = cache_bytes / (t["us"] * 1e-6) / 1e9
            slot.update(GBs=gbs, copy_frac=gbs / copy, copy_GBps=copy)
    timed = [(v["us"], k) for k, v in rec["cands"].items() if "us" in v]
    if timed:
        best_us, best = min(timed)
        rec.update(best=best, best_us=best_us)
        if "us" in rec["default"]:
            rec["best_over_default"] = best_us / rec["default"]["us"]
    log(
        f"{model} B={bsz} N={n}: default S{splits0} {rec['default'].get('us', float('nan')):.1f} us "
        f"({rec['default'].get('copy_frac', 0):.2f} copy), best {rec.get('best')} "
        f"{rec.get('best_us', float('nan')):.1f} us ({cache_bytes / (rec.get('best_us', 1e9) * 1e-6) / 1e9 / copy:.2f})"
    )
    del c, fns
    torch.cuda.empty_cache()
    return rec


def pdl_ok(device: Any) -> bool:
    from opmux.kernels.ops._triton_pdl import triton_pdl

    return triton_pdl(device)


def _pdl_of(r: dict[str, Any]) -> dict[str, Any]:
    """A case's other-trigger columns; a record of session 34 (the merge always from the start)
    kept its one plain column as ``no_pdl``."""
    return r.get("pdl") or ({"off": r["no_pdl"]} if "no_pdl" in r else {})


def render(record: dict[str, Any]) -> str:
    lines = [
        f"Split counts of attention.paged_decode (Triton) on {record['env'].get('device', '?')}; copy "
        f"bandwidth {record['copy']['GBps']:.0f} GB/s in the same run. us per call in CUDA graphs "
        "(fraction of the copy bandwidth).",
        "",
        "The default's split count with the merge behind each PDL trigger (off: a plain launch; start /"
        " end: the split kernel lets it launch at its programs' start / after their stores); the"
        " default column names its own.",
        "",
        "| model | B | N | M | default | default us | PDL off / start / end us | best | best us | best/default |",
        "|---|---:|---:|---:|---|---:|---:|---|---:|---:|",
    ]
    for r in record["cases"]:
        dfl = r["default"]
        pdl = {**_pdl_of(r), dfl.get("pdl", "start"): dfl}
        trig = " / ".join(
            f"{pdl[m]['us']:.1f}" if "us" in pdl.get(m, {}) else "-" for m in ("off", "start", "end")
        )
        lines.append(
            f"| {r['model']} | {r['B']} | {r['N']} | {r['M']} | S{dfl['splits']} {dfl.get('pdl', 'start')} | "
            f"{dfl.get('us', float('nan')):.1f} ({dfl.get('copy_frac', 0):.2f}) | "
            f"{trig} | {r.get('best', '-')} | "
            f"{r.get('best_us', float('nan')):.1f} ({r['cands'].get(r.get('best', ''), {}).get('copy_frac', 0):.2f}) | "
            f"{r.get('best_over_default', float('nan')):.3f} |"
        )
    lines += ["", "Per case, each tile's curve (us per split count):", ""]
    for r in record["cases"]:
        curves: dict[str, list[str]] = {}
        for name, v in r["cands"].items():
            tile, s = name.split(" ")
            curves.setdefault(tile, []).append(
                f"{s}={v['us']:.1f}" if "us" in v else f"{s}={v.get('status', 'error')}"
            )
        for tile, pts in curves.items():
            lines.append(f"- {r['model']} B={r['B']} N={r['N']} {tile}: {' '.join(pts)}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--cases", default=DEFAULT_CASES, help="model:batch:context, comma-separated")
    p.add_argument("--tiles", default="32x4pf,16x4pf,64x4", help="rows x warps [sN] [pf]")
    p.add_argument("--page", type=int, default=16)
    p.add_argument("--table-positions", type=int, default=0)
    p.add_argument("--budget-s", type=float, default=300.0)
    p.add_argument("--target-us", type=float, default=1500.0, help="graph length per timing")
    p.add_argument("--replays", type=int, default=7)
    p.add_argument("--resume", action="store_true", help="keep the cases DIR/decode_splits.json holds")
    p.add_argument(
        "--previous",
        type=Path,
        help="an earlier record (decode_splits.json): its default's split count per case is raced too",
    )
    args = p.parse_args(argv)
    previous: dict[tuple[str, int, int], tuple[int, ...]] = {}
    if args.previous is not None:
        for r in json.loads(args.previous.read_text())["cases"]:
            previous[(r["model"], r["B"], r["N"])] = (r["default"]["splits"],)
    args.previous = previous
    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "decode_splits.json"
    terms = {"tiles": args.tiles, "page": args.page, "table_positions": args.table_positions}
    record: dict[str, Any] = {"env": environment(torch), "terms": terms, "cases": []}
    if args.resume and path.exists():
        record = json.loads(path.read_text())
        if record.get("terms") != terms:
            p.error(f"--resume: {path} holds a run of other terms ({record.get('terms')}), not {terms}")
    # each run measures its own copy bandwidth; a resumed record's cases keep their own run's
    record.setdefault("copies", []).append(copy_bandwidth(torch))
    record["copy"] = record["copies"][-1]
    args.copy_GBps = record["copy"]["GBps"]
    done = {(r["model"], r["B"], r["N"]) for r in record["cases"]}
    deadline = time.monotonic() + args.budget_s
    tiles = args.tiles.split(",")
    for spec in args.cases.split(","):
        model, b, n = spec.split(":")
        if (model, int(b), int(n)) in done:
            continue
        if time.monotonic() > deadline:
            log("budget spent; the cases so far are written (--resume goes on)")
            break
        record["cases"].append(run_case(torch, model, int(b), int(n), tiles, args))
        path.write_text(json.dumps(record, indent=1))
        (args.out / "decode_splits.md").write_text(render(record))
    (args.out / "decode_splits.md").write_text(render(record))
    print(render(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
