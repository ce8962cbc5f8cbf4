"""Paged decode attention (attention.paged_decode): opmux's Triton and native CUDA backends side by
side, with FlashInfer's batch decode as the peer, on one GPU.

    python benchmarks/bench_attention_decode.py --out DIR [--models Llama-3-8B,Qwen3-30B-A3B]
        [--batches 1,16,64,256] [--contexts 512,4096,32768] [--page 16] [--fp8] [--budget-s 300]
        [--select-out DIR] [--select-from JSON]

Shapes (bf16, D 128): Llama-3-8B (32 query heads, 8 KV heads) and Qwen3-30B-A3B (32 / 4); every
sequence of a batch has the context's length, its pages shuffled in the cache (``--page`` tokens
each); ``--fp8`` adds the e4m3 cache form (k_scale / v_scale). Implementations: ``opmux default``
(what dispatch picks: Triton unless a select table says otherwise), ``opmux triton``, ``opmux cuda``
(the native unit, jit/csrc/attention_decode_cuda.cu), ``opmux torch`` (small cases only), each
forced through the public op (``backend=``), and FlashInfer's ``BatchDecodeWithPagedKVCacheWrapper``
(bf16 caches, when flashinfer imports; its ``plan`` outside the timed graph; opmux's own
``flashinfer`` backend plans on the host, so it is refused inside a graph and not timed here).

Each result is checked once against the op's definition on the first two sequences (atol 1.5e-2,
rtol 1e-2; fp8 0.15). Timing: R calls in one CUDA graph per column, the columns' replays
interleaved (bench_gpu.time_impls), median of the replays; GB/s counts the K and V bytes read.
Writes DIR/attention_decode.json (rewritten after every case) and DIR/attention_decode.md with
``cuda/triton`` ratios (below 1: the native unit faster). ``--select-out DIR`` writes from the
bf16 cases the ``select`` tables the dispatcher reads (per (value head dim, GQA group) and batch:
the backend fastest over the contexts, select_tables.py's rule); ``--select-from JSON`` writes them
from a recorded run, without a GPU.
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
from select_tables import write_select_tables  # noqa: E402

OP = "attention.paged_decode"
#: model -> (query heads, KV heads, head dim)
MODELS = {"Llama-3-8B": (32, 8, 128), "Qwen3-30B-A3B": (32, 4, 128)}
#: opmux's backends timed forced (``backend=``) in the op's declared order: the select tables
#: name the fastest (``--select-out``)
BACKENDS = ("triton", "cuda")
#: issue #28's grid: batch x context
BATCHES = (1, 16, 64, 256)
CONTEXTS = (512, 4096, 32768)
#: the most of the GPU's memory one case's cache (K + V) takes (Llama-3-8B at batch 256 x 32k:
#: 32 GiB, inside an H200's 140, not an 80 GiB card's)
MAX_CACHE_FRACTION = 0.35
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def make_case(
    torch: Any, bsz: int, n: int, shape: tuple[int, int, int], page: int, fp8: bool, positions: int = 0
) -> dict[str, Any]:
    """One case: ``bsz`` sequences of ``n`` positions over their own shuffled blocks. The block
    table is as wide as ``positions`` when that is longer (an engine sizes it for the model's
    longest context, and the split count follows the table's width, not the lengths): its columns
    past the sequence hold block 0, never read."""
    hq, hkv, d = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    need = -(-n // page)
    width = max(need, -(-positions // page))
    nb = bsz * need
    dt = torch.bfloat16
    ks, vs = torch.tensor([0.02], device="cuda"), torch.tensor([0.015], device="cuda")

    def cache(scale: Any) -> Any:
        c = torch.randn(nb, page, hkv, d, device="cuda", dtype=dt, generator=g)
        return (c.float() / scale).to(torch.float8_e4m3fn) if fp8 else c

    case = {"kc": cache(ks), "vc": cache(vs)}
    used = torch.randperm(nb, device="cuda", generator=g).reshape(bsz, need).to(torch.int32)
    case["table"] = torch.zeros(bsz, width, dtype=torch.int32, device="cuda")
    case["table"][:, :need] = used
    case["query"] = torch.randn(bsz, hq, d, device="cuda", dtype=dt, generator=g)
    case["lens"] = torch.full((bsz,), n, dtype=torch.int32, device="cuda")
    case["kw"] = {"k_scale": ks, "v_scale": vs} if fp8 else {}
    case["kv_indptr"] = torch.arange(0, (bsz + 1) * need, need, dtype=torch.int32, device="cuda")
    case["kv_indices"] = used.reshape(-1).contiguous()
    case["kv_last"] = torch.full((bsz,), n - (need - 1) * page, dtype=torch.int32, device="cuda")
    return case


def flashinfer_fn(torch: Any, c: dict[str, Any], hq: int, hkv: int, d: int, page: int) -> Any:
    import flashinfer

    ws = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(c["kv_indptr"], c["kv_indices"], c["kv_last"], hq, hkv, d, page, q_data_type=torch.bfloat16)
    return lambda _: w.run(c["query"], (c["kc"], c["vc"]))


def run_case(torch: Any, model: str, bsz: int, n: int, fp8: bool, args: Any) -> dict[str, Any]:
    from opmux.kernels import explain, ops
    from opmux.kernels.ops.attention._decode import reference

    hq, hkv, d = MODELS[model]
    c = make_case(torch, bsz, n, (hq, hkv, d), args.page, fp8, args.table_positions)
    op_args = (c["query"], c["kc"], c["vc"], c["table"], c["lens"])
    kw = c["kw"]
    cache_bytes = 2 * bsz * n * hkv * d * (1 if fp8 else 2)
    rec: dict[str, Any] = {"model": model, "B": bsz, "N": n, "page": args.page, "fp8": fp8}
    rec["table_positions"] = c["table"].shape[1] * args.page
    rec["shape"], rec["M"] = [max(16, 1 << (d - 1).bit_length()), hq // hkv], bsz  # tuned's select key
    try:
        rec["default_backend"] = explain(OP, *op_args, **kw).chosen
    except Exception as exc:
        rec["default_backend"] = f"explain failed: {exc}"
    fns: dict[str, Any] = {"opmux default": lambda _: ops.attention.paged_decode(*op_args, **kw)}
    for be in (*BACKENDS, "torch"):  # each forced: the data of the select tables
        if be == "torch" and bsz * c["table"].shape[1] * args.page > 64 * 1024:  # whole table rows
            continue
        fns[f"opmux {be}"] = lambda _, be=be: ops.attention.paged_decode(*op_args, backend=be, **kw)
    if not fp8:
        try:
            fns["FlashInfer"] = flashinfer_fn(torch, c, hq, hkv, d, args.page)
        except Exception as exc:
            rec["flashinfer"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    rows = min(2, bsz)
    want = reference(c["query"][:rows], c["kc"], c["vc"], c["table"][:rows], c["lens"][:rows], **kw)
    tol = 0.15 if fp8 else 1.5e-2
    est_us = max(5.0, cache_bytes / 4e12 * 1e6)
    R = max(1, min(200, math.ceil(args.target_us / est_us)))
    rec["impls"] = {}
    checked: dict[str, Any] = {}  # the columns that match the reference, timed together below
    for name, fn in fns.items():
        r: dict[str, Any] = {}
        try:
            y = fn(None)
            torch.cuda.synchronize()
            err = (y[:rows].float() - want.float()).abs().max().item()
            r["max_abs_err"] = err
            if torch.allclose(y[:rows].float(), want.float(), atol=tol, rtol=tol if fp8 else 1e-2):
                checked[name] = fn
            else:
                r["status"] = "wrong"
        except Exception as exc:
            r = {"status": "error", "why": f"{type(exc).__name__}: {str(exc)[:300]}"}
        rec["impls"][name] = r
    # replays interleaved (bench_gpu.time_impls): each column sees the same clocks
    for name, t in time_impls(torch, checked, [None], R, args.replays).items():
        r = rec["impls"][name]
        if "us" in t:
            r.update(t, status="ok", GBs=cache_bytes / (t["us"] * 1e-6) / 1e9)
        else:
            r.update(status="error", why=t["error"])
    best = {nm: r["us"] for nm, r in rec["impls"].items() if r.get("status") == "ok"}
    if "opmux cuda" in best and "opmux triton" in best:
        rec["cuda_over_triton"] = best["opmux cuda"] / best["opmux triton"]
    if "FlashInfer" in best:
        rec["over_flashinfer"] = {
            nm: us / best["FlashInfer"] for nm, us in best.items() if nm.startswith("opmux")
        }
    log(
        f"{model} B={bsz} N={n}{' fp8' if fp8 else ''}: "
        + ", ".join(f"{nm} {us:.1f} us" for nm, us in sorted(best.items(), key=lambda kv: kv[1]))
    )
    del c, fns
    torch.cuda.empty_cache()
    return rec


NAMES = ["opmux default", "opmux triton", "opmux cuda", "opmux torch", "FlashInfer"]


def render(record: dict[str, Any]) -> str:
    env = record["env"]
    lines = [
        "# Paged decode attention on the GPU",
        "",
        f"Generated by `benchmarks/bench_attention_decode.py` on {env.get('device', '?')} (torch "
        f"{env.get('torch', '?')}, flashinfer {env.get('flashinfer', '?')}). bf16 queries, D 128, page size "
        f"{record['page']}. us per call in CUDA graphs (GB/s of K and V read). `cuda/triton`: the native "
        "unit's time over the Triton backend's (below 1: the native unit faster); `default/FlashInfer`: "
        "opmux's default over FlashInfer's; `%copy`: the default's GB/s over the copy bandwidth measured "
        f"in the same run ({record.get('copy', {}).get('GBps', 0):.0f} GB/s, a 2 GiB device copy).",
        "",
        "| model | B | N | cache | default ran | " + " | ".join(NAMES)
        + " | cuda/triton | default/FlashInfer | %copy |",
        "|---|---:|---:|---|---|" + "---:|" * (len(NAMES) + 3),
    ]  # fmt: skip
    copy = record.get("copy", {}).get("GBps")
    for c in record["cases"]:
        form = "fp8" if c.get("fp8") else "bf16"
        if "skipped" in c:
            lines.append(f"| {c['model']} | {c['B']} | {c['N']} | {form} | skipped ({c['skipped']}) |")
            continue
        cells = []
        for nm in NAMES:
            r = c["impls"].get(nm, {})
            cells.append(
                f"{r['us']:.1f} ({r['GBs']:.0f})" if r.get("status") == "ok" else r.get("status", "-")
            )
        ratio = f"{c['cuda_over_triton']:.2f}" if "cuda_over_triton" in c else "-"
        fi = c.get("over_flashinfer", {}).get("opmux default")
        default = c["impls"].get("opmux default", {})
        frac = f"{100 * default['GBs'] / copy:.0f}" if copy and default.get("status") == "ok" else "-"
        lines.append(
            f"| {c['model']} | {c['B']} | {c['N']} | {form} | {c.get('default_backend', '')} | "
            + " | ".join(cells)
            + f" | {ratio} | {f'{fi:.2f}' if fi is not None else '-'} | {frac} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated (default %(default)s)")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    ap.add_argument("--page", type=int, default=16, help="tokens per page of the paged cache")
    ap.add_argument(
        "--table-positions",
        type=int,
        default=0,
        help="size every block table for this many positions (an engine's max_model_len; the split "
        "count follows the table's width); default: the context's own",
    )
    ap.add_argument("--fp8", action="store_true", help="also the fp8 e4m3 cache form")
    ap.add_argument("--replays", type=int, default=7)
    ap.add_argument("--target-us", type=float, default=5000.0, help="graph length aimed at")
    ap.add_argument("--budget-s", type=float, default=300.0, help="cases left when it is spent are skipped")
    ap.add_argument("--select-out", type=Path, help="also write the select tables (select_tables.py) here")
    ap.add_argument("--select-from", type=Path, help="write --select-out's tables from this record (no GPU)")
    args = ap.parse_args(argv)
    if args.select_from is not None:
        if args.select_out is None:
            ap.error("--select-from needs --select-out")
        write_selects(json.loads(args.select_from.read_text()), args.select_out)
        return 0
    models = [m for m in args.models.split(",") if m]
    bad = [m for m in models if m not in MODELS]
    if bad:
        ap.error(f"unknown {', '.join(bad)}; models: {', '.join(MODELS)}")

    import torch

    from opmux.kernels import _env

    args.out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"env": environment(torch), "page": args.page, "cases": []}
    record["table_positions"] = args.table_positions  # 0: each case's table as long as its context
    record["copy"] = copy_bandwidth(torch)  # the same run's yardstick: the default's %copy
    with _env.scope(OPMUX_FALLBACK="error"):  # a forced backend that cannot run fails its case
        run_all(torch, args, models, record)
    (args.out / "attention_decode.md").write_text(render(record))
    log(f"wrote {args.out / 'attention_decode.json'} and attention_decode.md")
    if args.select_out is not None:
        write_selects(record, args.select_out)
    return 0


def run_all(torch: Any, args: Any, models: list[str], record: dict[str, Any]) -> None:
    max_cache = MAX_CACHE_FRACTION * torch.cuda.get_device_properties(0).total_memory
    for fp8 in (False, True) if args.fp8 else (False,):
        for model in models:
            for bsz in (int(v) for v in args.batches.split(",")):
                for n in (int(v) for v in args.contexts.split(",")):
                    base = {"model": model, "B": bsz, "N": n, "fp8": fp8}
                    hkv, d = MODELS[model][1], MODELS[model][2]
                    if 2 * bsz * n * hkv * d * (1 if fp8 else 2) > max_cache:
                        record["cases"].append({**base, "skipped": "cache too large"})
                        continue
                    if time.perf_counter() - T0 > args.budget_s:
                        record["cases"].append({**base, "skipped": "budget"})
                        continue
                    try:
                        record["cases"].append(run_case(torch, model, bsz, n, fp8, args))
                    except Exception as exc:  # one case's failure (memory, ...) does not end the run
                        record["cases"].append({**base, "skipped": f"{type(exc).__name__}: {str(exc)[:200]}"})
                        torch.cuda.empty_cache()
                    (args.out / "attention_decode.json").write_text(json.dumps(record, indent=1) + "\n")


def write_selects(record: dict[str, Any], folder: Path) -> None:
    """The select tables of the record's bf16 cases (fp8 caches are another form: no table)."""
    cases = [c for c in record["cases"] if not c.get("fp8")]
    for path in write_select_tables(OP, record, BACKENDS, folder, cases):
        log(f"table {path}")


if __name__ == "__main__":
    raise SystemExit(main())
