"""Paged prefill / extend attention (attention.paged_prefill) against its peers on one GPU.

    python benchmarks/bench_attention_prefill.py --out DIR [--models Llama-3-8B,Qwen3-30B-A3B]
        [--tokens 1024,4096,16384,32768] [--modes prefill,extend,ragged] [--page 16] [--budget-s 500]

Shapes (bf16, D 128): Llama-3-8B (32 query heads, 8 KV heads) and Qwen3-30B-A3B (32 / 4). For
each context of N tokens: ``prefill`` (one sequence of N new tokens, no prefix), ``extend`` (a
chunk of ``min(2048, N / 2)`` new tokens over the rest of the N as a cached prefix), ``ragged``
(8 sequences of N / 8 new tokens, no prefix). opmux reads the KV from a paged cache (``--page``
tokens per page, the pages shuffled); its peers:

* torch SDPA with the flash backend and with cuDNN, on contiguous K / V of the same values (no
  paging: their best case), GQA through ``enable_gqa`` (else K / V expanded before timing), the
  causal mask aligned to the end of the KV (``causal_lower_right``) for extend; a ragged batch as
  one SDPA call per sequence;
* FlashInfer's ``BatchPrefillWithPagedKVCacheWrapper`` on the same paged cache (its CSR form of the
  block table: ``kv_indptr`` / ``kv_indices`` / ``kv_last_page_len``), when flashinfer imports;
  its ``plan`` runs outside the timed graph.

Each result is checked once: opmux against the op's definition on the last 128 query rows of the
first sequence (the extend property: those rows over the same KV), each peer against opmux (atol
1.5e-2, rtol 1e-2). Timing (bench_gpu.time_impl), median of the replays: the peers R calls in one
CUDA graph; opmux's entries R calls between two events (host work included: a serving engine
runs prefill eagerly, and opmux's FlashInfer backend plans on the host, refused inside a
capture), forced backends with ``OPMUX_FALLBACK=error`` (one that cannot run fails its case);
TFLOP/s count ``4 * Hq * D`` per (query, visible key) pair. Writes DIR/attention_prefill.json
(rewritten after every case) and DIR/attention_prefill.md with ``opmux/peer`` ratios (below 1:
opmux faster). opmux's CUDA backends (``BACKENDS``) are also timed forced (``backend=``);
``--select-out DIR`` writes from them the ``select`` tables the dispatcher reads (per (value head
dim, GQA group) and new tokens: the backend measured fastest; ``--select-from JSON`` writes them
from a recorded run, without a GPU).
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

from bench_gpu import environment, time_impl  # noqa: E402
from select_tables import write_select_tables  # noqa: E402

OP = "attention.paged_prefill"
#: opmux's backends on CUDA timed on their own (``backend=``), in the op's declared order: the
#: select tables name the fastest (``--select-out``; select_tables.py's rule)
BACKENDS = ("triton", "flashinfer", "cudnn")
#: model -> (query heads, KV heads, head dim)
MODELS = {"Llama-3-8B": (32, 8, 128), "Qwen3-30B-A3B": (32, 4, 128)}
TOKENS = (1024, 4096, 16384, 32768)
MODES = ("prefill", "extend", "ragged")
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def split(mode: str, n: int) -> tuple[list[int], list[int]]:
    """(new tokens, cached prefix) per sequence for a context of ``n`` tokens."""
    if mode == "prefill":
        return [n], [0]
    if mode == "extend":
        q = min(2048, n // 2)
        return [q], [n - q]
    return [n // 8] * 8, [0] * 8


def make_case(
    torch: Any, q_lens: list[int], prefix: list[int], shape: tuple[int, int, int], page: int
) -> dict[str, Any]:
    """The paged cache (pages shuffled), its block table and CSR form, and contiguous K / V
    [B][Hkv, n, D] of the same values for the SDPA peers."""
    hq, hkv, d = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    lens = [p + q for p, q in zip(prefix, q_lens, strict=True)]
    width = max(-(-n // page) for n in lens)
    nb = len(lens) * width
    kc = torch.randn(nb, page, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    vc = torch.randn(nb, page, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    table = torch.randperm(nb, device="cuda", generator=g).reshape(len(lens), width).to(torch.int32)
    query = torch.randn(sum(q_lens), hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    cu = [0]
    for q in q_lens:
        cu.append(cu[-1] + q)
    pages = [-(-n // page) for n in lens]
    indptr = [0]
    for p in pages:
        indptr.append(indptr[-1] + p)
    case = {
        "query": query,
        "kc": kc,
        "vc": vc,
        "table": table,
        "lens": torch.tensor(lens, dtype=torch.int32, device="cuda"),
        "cu": torch.tensor(cu, dtype=torch.int32, device="cuda"),
        "cu_list": cu,
        "lens_list": lens,
        "kv_indptr": torch.tensor(indptr, dtype=torch.int32, device="cuda"),
        "kv_indices": torch.cat([table[b, : pages[b]] for b in range(len(lens))]).contiguous(),
        "kv_last": torch.tensor(
            [n - (p - 1) * page for n, p in zip(lens, pages, strict=True)], dtype=torch.int32, device="cuda"
        ),
    }
    k_seq, v_seq = [], []
    for b, n in enumerate(lens):
        pos = torch.arange(n, device="cuda")
        blk = table[b].long()[pos // page]
        k_seq.append(kc[blk, pos % page].transpose(0, 1).unsqueeze(0).contiguous())  # [1, Hkv, n, D]
        v_seq.append(vc[blk, pos % page].transpose(0, 1).unsqueeze(0).contiguous())
    case["k_seq"], case["v_seq"] = k_seq, v_seq
    return case


def sdpa_fn(torch: Any, case: dict[str, Any], backend: Any, hq: int, hkv: int) -> Any:
    """SDPA per sequence with ``backend`` on contiguous K / V (GQA native, else expanded)."""
    from torch.nn.attention import sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    fa = torch.nn.functional.scaled_dot_product_attention
    cu, lens = case["cu_list"], case["lens_list"]
    qs = [case["query"][cu[b] : cu[b + 1]].transpose(0, 1).unsqueeze(0) for b in range(len(lens))]
    ks, vs = case["k_seq"], case["v_seq"]

    def call(b: int, ks: list[Any], vs: list[Any], gqa: dict[str, Any]) -> Any:
        q = qs[b]
        if q.shape[2] == ks[b].shape[2]:
            return fa(q, ks[b], vs[b], is_causal=True, **gqa)
        return fa(q, ks[b], vs[b], attn_mask=causal_lower_right(q.shape[2], ks[b].shape[2]), **gqa)

    gqa: dict[str, Any] = {"enable_gqa": True}
    try:  # GQA inside the kernel where this torch and backend have it
        with sdpa_kernel(backend):
            call(0, ks, vs, gqa)
    except Exception:
        ks = [k.repeat_interleave(hq // hkv, 1) for k in ks]
        vs = [v.repeat_interleave(hq // hkv, 1) for v in vs]
        gqa = {}

    def run(_: Any) -> Any:
        with sdpa_kernel(backend):
            outs = [call(b, ks, vs, gqa)[0].transpose(0, 1) for b in range(len(lens))]
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    return run


def flashinfer_fn(torch: Any, case: dict[str, Any], hq: int, hkv: int, d: int, page: int) -> Any:
    import flashinfer

    ws = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(case["cu"], case["kv_indptr"], case["kv_indices"], case["kv_last"], hq, hkv, d, page, causal=True,
           q_data_type=torch.bfloat16)  # fmt: skip
    return lambda _: w.run(case["query"], (case["kc"], case["vc"]))


def run_case(torch: Any, model: str, mode: str, n: int, args: Any) -> dict[str, Any]:
    from torch.nn.attention import SDPBackend

    from opmux.kernels import explain, ops
    from opmux.kernels.ops.attention._prefill import reference

    hq, hkv, d = MODELS[model]
    q_lens, prefix = split(mode, n)
    c = make_case(torch, q_lens, prefix, (hq, hkv, d), args.page)
    op_args = (c["query"], c["kc"], c["vc"], c["table"], c["lens"], c["cu"])
    pairs = sum(q * p + q * (q + 1) // 2 for q, p in zip(q_lens, prefix, strict=True))
    flops = 4 * hq * d * pairs
    rec: dict[str, Any] = {"model": model, "mode": mode, "N": n, "q_lens": q_lens[:1], "B": len(q_lens)}
    rec["shape"], rec["M"] = [max(16, 1 << (d - 1).bit_length()), hq // hkv], sum(q_lens)  # tuned's key
    rec["prefix"], rec["page"] = prefix[0], args.page
    try:
        rec["default_backend"] = explain(OP, *op_args).chosen
    except Exception as exc:
        rec["default_backend"] = f"explain failed: {exc}"
    fns: dict[str, Any] = {"opmux default": lambda _: ops.attention.paged_prefill(*op_args)}
    for be in BACKENDS:  # each opmux backend forced (no fallback): the data of the select tables
        fns[f"opmux {be}"] = lambda _, be=be: ops.attention.paged_prefill(*op_args, backend=be)
    fns["SDPA flash"] = sdpa_fn(torch, c, SDPBackend.FLASH_ATTENTION, hq, hkv)
    fns["SDPA cuDNN"] = sdpa_fn(torch, c, SDPBackend.CUDNN_ATTENTION, hq, hkv)
    try:
        fns["FlashInfer"] = flashinfer_fn(torch, c, hq, hkv, d, args.page)
    except Exception as exc:
        rec["flashinfer"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    # the definition on the last rows of the first sequence (its KV, the same positions)
    rows = min(128, q_lens[0])
    q0 = c["cu_list"][1] - rows
    want = reference(c["query"][q0 : c["cu_list"][1]], c["kc"], c["vc"], c["table"][:1], c["lens"][:1],
                     torch.tensor([0, rows], dtype=torch.int32, device="cuda"))  # fmt: skip
    est_us = max(20.0, flops / 300e12 * 1e6)
    R = max(1, min(50, math.ceil(args.target_us / est_us)))
    rec["impls"] = {}
    mine = None
    for name, fn in fns.items():
        r: dict[str, Any] = {}
        try:
            y = fn(None)
            torch.cuda.synchronize()
            if name == "opmux default":
                mine = y
                err = (y[q0 : c["cu_list"][1]].float() - want.float()).abs().max().item()
                ok = torch.allclose(y[q0 : c["cu_list"][1]].float(), want.float(), atol=1.5e-2, rtol=1e-2)
            else:
                assert mine is not None
                err = (y.float() - mine.float()).abs().max().item()
                ok = torch.allclose(y.float(), mine.float(), atol=1.5e-2, rtol=1e-2)
            r["max_abs_err"] = err
            if not ok:
                r["status"] = "wrong"
                rec["impls"][name] = r
                continue
            # opmux eagerly, as a serving engine runs its prefill (FlashInfer's backend plans on
            # the host: refused inside a capture); the peers in a graph
            r.update(time_impl(torch, fn, [None], R, args.replays, graph=not name.startswith("opmux")))
            r["status"] = "ok"
            r["TFLOPs"] = flops / (r["us"] * 1e-6) / 1e12
        except Exception as exc:
            r = {"status": "error", "why": f"{type(exc).__name__}: {str(exc)[:300]}"}
        rec["impls"][name] = r
    best = {nm: r["us"] for nm, r in rec["impls"].items() if r.get("status") == "ok"}
    peers = {nm: us for nm, us in best.items() if not nm.startswith("opmux")}
    if "opmux default" in best:
        rec["opmux_over"] = {nm: best["opmux default"] / us for nm, us in peers.items()}
        if peers:
            fastest = min(peers, key=peers.__getitem__)
            rec["fastest_peer"] = fastest
            rec["default_vs_fastest_peer"] = best["opmux default"] / peers[fastest]
    log(
        f"{model} {mode} N={n}: "
        + ", ".join(f"{nm} {us:.1f} us" for nm, us in sorted(best.items(), key=lambda kv: kv[1]))
    )
    del c, fns
    torch.cuda.empty_cache()
    return rec


def render(record: dict[str, Any]) -> str:
    env = record["env"]
    peers = ["SDPA flash", "SDPA cuDNN", "FlashInfer"]
    names = ["opmux default", *(f"opmux {be}" for be in BACKENDS), *peers]
    lines = [
        "# Paged prefill / extend attention on the GPU",
        "",
        f"Generated by `benchmarks/bench_attention_prefill.py` on {env.get('device', '?')} (torch "
        f"{env.get('torch', '?')}, flashinfer {env.get('flashinfer', '?')}). bf16, D 128, page size "
        f"{record['page']}. us per call in CUDA graphs, `*`: between two events, host work included "
        "(opmux's entries: prefill runs eagerly) (TFLOP/s, causal pairs only). SDPA reads contiguous "
        "K / V (no paging); FlashInfer and opmux the same paged cache. `opmux/x`: opmux's time over x's "
        "(below 1: opmux faster).",
        "",
        "| model | mode | N | B | new tokens | default ran | " + " | ".join(names)
        + " | " + " | ".join(f"opmux/{nm}" for nm in peers) + " |",
        "|---|---|---:|---:|---:|---|" + "---:|" * (len(names) + len(peers)),
    ]  # fmt: skip
    for c in record["cases"]:
        if "skipped" in c:
            lines.append(f"| {c['model']} | {c['mode']} | {c['N']} | | | skipped ({c['skipped']}) |")
            continue
        cells = []
        for nm in names:
            r = c["impls"].get(nm, {})
            cells.append(
                f"{r['us']:.0f}{'*' if r.get('method') == 'events' else ''} ({r['TFLOPs']:.0f})"
                if r.get("status") == "ok"
                else r.get("status", "-")
            )
        ratios = [
            f"{c.get('opmux_over', {})[nm]:.2f}" if nm in c.get("opmux_over", {}) else "-" for nm in peers
        ]
        lines.append(
            f"| {c['model']} | {c['mode']} | {c['N']} | {c['B']} | {c['q_lens'][0]} | {c.get('default_backend', '')} | "
            + " | ".join(cells) + " | " + " | ".join(ratios) + " |"
        )  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated (default %(default)s)")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="contexts N (default %(default)s)")
    ap.add_argument("--modes", default=",".join(MODES), help="prefill, extend, ragged (default all)")
    ap.add_argument("--page", type=int, default=16, help="tokens per page of the paged cache")
    ap.add_argument("--replays", type=int, default=7)
    ap.add_argument("--target-us", type=float, default=20000.0, help="graph length aimed at")
    ap.add_argument("--budget-s", type=float, default=500.0, help="cases left when it is spent are skipped")
    ap.add_argument("--select-out", type=Path, help="also write the select tables (select_tables.py) here")
    ap.add_argument("--select-from", type=Path, help="write --select-out's tables from this record (no GPU)")
    args = ap.parse_args(argv)
    if args.select_from is not None:
        if args.select_out is None:
            ap.error("--select-from needs --select-out")
        for path in write_select_tables(
            OP, json.loads(args.select_from.read_text()), BACKENDS, args.select_out
        ):
            log(f"table {path}")
        return 0
    models = [m for m in args.models.split(",") if m]
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in models if m not in MODELS] + [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"unknown {', '.join(bad)}; models: {', '.join(MODELS)}; modes: {', '.join(MODES)}")

    import torch

    from opmux.kernels import _env

    args.out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"env": environment(torch), "page": args.page, "cases": []}
    with _env.scope(OPMUX_FALLBACK="error"):  # a forced backend that cannot run fails its case
        run_all(torch, args, models, modes, record)
    (args.out / "attention_prefill.md").write_text(render(record))
    log(f"wrote {args.out / 'attention_prefill.json'} and attention_prefill.md")
    if args.select_out is not None:
        for path in write_select_tables(OP, record, BACKENDS, args.select_out):
            log(f"table {path}")
    return 0


def run_all(torch: Any, args: Any, models: list[str], modes: list[str], record: dict[str, Any]) -> None:
    for model in models:
        for mode in modes:
            for n in (int(v) for v in args.tokens.split(",")):
                if time.perf_counter() - T0 > args.budget_s:
                    record["cases"].append({"model": model, "mode": mode, "N": n, "skipped": "budget"})
                    continue
                try:
                    record["cases"].append(run_case(torch, model, mode, n, args))
                except Exception as exc:  # one case's failure (memory, ...) does not end the run
                    record["cases"].append({"model": model, "mode": mode, "N": n, "skipped": f"{type(exc).__name__}: {str(exc)[:200]}"})  # fmt: skip
                    torch.cuda.empty_cache()
                (args.out / "attention_prefill.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
