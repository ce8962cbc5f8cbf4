"""The sampling ops (ops/sampling) against vLLM's sort-based sampler and FlashInfer, on one GPU.

    python benchmarks/bench_sampling.py --out DIR [--batch 1,16,64,256] [--vocab 32000,128256,151936]
        [--budget-s 400] [--forced jit,flashinfer] [--select-out DIR] [--select-from JSON]

For every batch B and vocabulary V, with per-row k (20..100) and p (0.7..0.95) tensors (the
serving form: a CUDA graph replays them):

* ``top_k_top_p`` sampling from probs: opmux's default call (``top_k_top_p_sampling_from_probs``,
  seed / offset tensors); vLLM v1's torch path (``apply_top_k_top_p``: a full sort of the logits,
  masks, scatter back; then ``softmax`` and the exponential race ``probs.div_(q).argmax()``),
  reimplemented below as vLLM writes it, timed from the logits (its input) while opmux is timed from
  the probs plus the same ``softmax`` (so both include it); FlashInfer's
  ``top_k_top_p_sampling_from_probs`` when importable;
* ``top_k_renorm_probs``, ``top_p_renorm_probs``, ``top_k_mask_logits``: opmux against FlashInfer's
  op of the same name and a sort-based torch version (vLLM's masks).

``--forced`` adds opmux's call forced to each named backend (columns ``opmux[jit]``, ...; under
``OPMUX_FALLBACK=error``, so a backend that cannot run fails its cell instead of timing another):
the data that orders the backends (``ops/sampling/op.py``'s ``_CUDA_ORDER``).

``--select-out DIR`` writes, from the forced columns, the ops' select tables (``DIR/<op>/``, for
``python/opmux/kernels/configs/``): per vocabulary and batch the backend timed fastest, the
declared first (FlashInfer where installed) unless another wins by more than 2%
(``select_tables.py``'s rule; a file for every vocabulary timed, also where the first won at every
batch, so that it replaces an older table and, as ``OPMUX_TUNED_CONFIG_DIR``, alone decides the default);
``--select-from JSON`` writes them from a recorded run, no GPU.

``--ops`` / ``--columns`` time only some ops / columns (an A/B call, e.g. with
``benchmarks/ab_sources.sh``: ``--columns 'opmux[jit]' --forced jit``); the id check before timing
always runs.

Each is timed as R calls in one CUDA graph, the columns of one op's case replayed in turn
(bench_gpu.time_impls: rotated each round), median of the replays; ratios are
the peer's time over opmux's (> 1: opmux is faster). Writes DIR/sampling.json (rewritten after every
case) and DIR/sampling.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_gpu import environment, time_impls  # noqa: E402
from select_tables import write_select_tables  # noqa: E402

BATCH = (1, 16, 64, 256)
VOCAB = (32000, 128256, 151936)
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


# -- vLLM v1's torch sampler (vllm/v1/sample/ops/topk_topp_sampler.py), as vLLM writes it ---------
def vllm_apply_top_k_top_p(torch: Any, logits: Any, k: Any, p: Any) -> Any:
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    if k is not None:
        top_k_mask = logits_sort.size(1) - k.to(torch.long)
        top_k_mask = logits_sort.gather(1, top_k_mask.unsqueeze(dim=1))
        top_k_mask = logits_sort < top_k_mask
        logits_sort.masked_fill_(top_k_mask, -float("inf"))
    if p is not None:
        probs_sort = logits_sort.softmax(dim=-1)
        probs_sum = torch.cumsum(probs_sort, dim=-1, out=probs_sort)
        top_p_mask = probs_sum <= 1 - p.unsqueeze(dim=1)
        top_p_mask[:, -1] = False
        logits_sort.masked_fill_(top_p_mask, -float("inf"))
    return logits.scatter_(dim=-1, index=logits_idx, src=logits_sort)


def vllm_random_sample(torch: Any, probs: Any) -> Any:
    q = torch.empty_like(probs)
    q.exponential_()
    return probs.div_(q).argmax(dim=-1).view(-1)


def vllm_sample(torch: Any, logits: Any, k: Any, p: Any) -> Any:
    logits = vllm_apply_top_k_top_p(torch, logits, k, p)
    return vllm_random_sample(torch, logits.softmax(dim=-1, dtype=torch.float32))


def torch_top_k_renorm(torch: Any, probs: Any, k: Any) -> Any:
    kth = probs.sort(dim=-1, descending=True).values.gather(1, (k.long() - 1)[:, None])
    q = torch.where(probs >= kth, probs, 0.0)
    return q / q.sum(1, keepdim=True)


def torch_top_p_renorm(torch: Any, probs: Any, p: Any) -> Any:
    s, idx = probs.sort(dim=-1, descending=False)
    drop = s.cumsum(-1) <= 1 - p[:, None]
    drop[:, -1] = False
    q = probs.scatter(1, idx, s.masked_fill(drop, 0.0))
    return q / q.sum(1, keepdim=True)


def flashinfer_sampling() -> Any:
    try:
        import flashinfer.sampling as fs
    except Exception:
        return None
    return fs


def run_case(torch: Any, b: int, v: int, args: Any) -> dict[str, Any]:
    from opmux.kernels.ops import sampling as S

    g = torch.Generator(device="cuda").manual_seed(b * 7 + v)
    sets = []
    for _ in range(3):
        logits = torch.randn(b, v, device="cuda", generator=g) * 3
        k = torch.randint(20, 101, (b,), device="cuda", generator=g, dtype=torch.int32)
        p = 0.7 + 0.25 * torch.rand(b, device="cuda", generator=g)
        sets.append({"logits": logits, "probs": logits.softmax(-1), "k": k, "p": p})
    seed = torch.tensor([1234], device="cuda", dtype=torch.int64)
    offset = torch.tensor([0], device="cuda", dtype=torch.int64)
    fs = flashinfer_sampling()
    R = max(4, min(200, int(args.target_us / max(1.0, b * v / 2e5))))
    impls: dict[str, dict[str, Any]] = {
        "top_k_top_p": {
            "opmux": lambda s: S.top_k_top_p_sampling_from_probs(
                s["logits"].softmax(-1),
                top_k_arr=s["k"],
                top_p_arr=s["p"],
                seed_tensor=seed,
                offset_tensor=offset,
            ),
            "vLLM (sort + exponential)": lambda s: vllm_sample(torch, s["logits"].clone(), s["k"], s["p"]),
        },
        "top_k_renorm_probs": {
            "opmux": lambda s: S.top_k_renorm_probs(s["probs"], top_k_arr=s["k"]),
            "torch sort": lambda s: torch_top_k_renorm(torch, s["probs"], s["k"]),
        },
        "top_p_renorm_probs": {
            "opmux": lambda s: S.top_p_renorm_probs(s["probs"], top_p_arr=s["p"]),
            "torch sort": lambda s: torch_top_p_renorm(torch, s["probs"], s["p"]),
        },
        "top_k_mask_logits": {
            "opmux": lambda s: S.top_k_mask_logits(s["logits"], top_k_arr=s["k"]),
            "vLLM sort (top-k)": lambda s: vllm_apply_top_k_top_p(torch, s["logits"].clone(), s["k"], None),
        },
    }
    for backend in [x for x in args.forced.split(",") if x]:
        col = f"opmux[{backend}]"
        impls["top_k_top_p"][col] = lambda s, b=backend: S.top_k_top_p_sampling_from_probs(
            s["logits"].softmax(-1),
            top_k_arr=s["k"],
            top_p_arr=s["p"],
            seed_tensor=seed,
            offset_tensor=offset,
            backend=b,
        )
        impls["top_k_renorm_probs"][col] = lambda s, b=backend: S.top_k_renorm_probs(
            s["probs"], top_k_arr=s["k"], backend=b
        )
        impls["top_p_renorm_probs"][col] = lambda s, b=backend: S.top_p_renorm_probs(
            s["probs"], top_p_arr=s["p"], backend=b
        )
        impls["top_k_mask_logits"][col] = lambda s, b=backend: S.top_k_mask_logits(
            s["logits"], top_k_arr=s["k"], backend=b
        )
    if fs is not None:
        impls["top_k_top_p"]["FlashInfer"] = lambda s: fs.top_k_top_p_sampling_from_probs(
            s["logits"].softmax(-1), s["k"], s["p"]
        )
        impls["top_k_renorm_probs"]["FlashInfer"] = lambda s: fs.top_k_renorm_probs(s["probs"], s["k"])
        impls["top_p_renorm_probs"]["FlashInfer"] = lambda s: fs.top_p_renorm_probs(s["probs"], s["p"])
        impls["top_k_mask_logits"]["FlashInfer"] = lambda s: fs.top_k_mask_logits(s["logits"], s["k"])
    # a check before timing: opmux's ids stay in vLLM's kept set (ties aside: random logits have none)
    s0 = sets[0]
    ids = impls["top_k_top_p"]["opmux"](s0).long()
    kept = vllm_apply_top_k_top_p(torch, s0["logits"].clone(), s0["k"], s0["p"]).isfinite()
    checked = bool(kept.gather(1, ids[:, None]).all())
    case: dict[str, Any] = {"B": b, "V": v, "R": R, "checked": checked, "ops": {}}
    for op, fns in impls.items():
        if args.ops and op not in args.ops:
            continue
        # replays interleaved (bench_gpu.time_impls): each column sees the same clocks; a column
        # that fails is reported ({"error": ...}), not fatal
        timed = {n: fn for n, fn in fns.items() if not args.columns or n in args.columns}
        res = time_impls(torch, timed, sets, R, args.replays)
        case["ops"][op] = res
        us = {n: r["us"] for n, r in res.items() if "us" in r}
        log(f"B={b} V={v} {op}: " + ", ".join(f"{n} {u:.1f} us" for n, u in us.items()))
    return case


#: the benchmark's op keys -> opmux's ops (their select tables)
OPS = {
    "top_k_top_p": "sampling.top_k_top_p_sampling_from_probs",
    "top_k_renorm_probs": "sampling.top_k_renorm_probs",
    "top_p_renorm_probs": "sampling.top_p_renorm_probs",
    "top_k_mask_logits": "sampling.top_k_mask_logits",
}


def write_selects(record: dict[str, Any], folder: Path) -> list[Path]:
    """The select tables of the record's forced columns (``opmux[<backend>]``), per op: shape
    (V,), M the batch; backends in the ops' declared CUDA order."""
    from opmux.kernels import registry

    written: list[Path] = []
    for key, op in OPS.items():
        order = dict(registry.get(op).priority)["cuda"]
        cases = []
        for c in record["cases"]:
            res = c.get("ops", {}).get(key, {})
            impls = {
                f"opmux {col[6:-1]}": {"status": "ok", "us": r["us"]}
                for col, r in res.items()
                if col.startswith("opmux[") and "us" in r
            }
            cases.append({"shape": [c["V"]], "M": c["B"], "impls": impls})
        timed = [be for be in order if any(f"opmux {be}" in c["impls"] for c in cases)]
        if len(timed) < 2:
            continue
        # every vocabulary's table, also one naming the declared first at every batch: copied into
        # configs/ it replaces an older table of that GPU, and as OPMUX_TUNED_CONFIG_DIR it is what
        # the default runs (a missing file would let the shipped table speak instead)
        for path in write_select_tables(op, record, timed, folder / op, cases):
            log(f"table {path}")
            written.append(path)
    return written


def render(record: dict[str, Any]) -> str:
    env = record["env"]
    lines = [
        "# Sampling on the GPU",
        "",
        f"Generated by `benchmarks/bench_sampling.py` on {env.get('device', '?')} (torch {env.get('torch', '?')}, "
        f"FlashInfer {env.get('flashinfer', '?')}). us per call in CUDA graphs, per-row k in 20..100 and p in "
        "0.7..0.95; in brackets the peer's time over opmux's (> 1: opmux faster). `top_k_top_p` includes the "
        "softmax of the logits for every entry.",
        "",
    ]
    ops: list[str] = []
    for c in record["cases"]:
        for op in c.get("ops", {}):
            if op not in ops:
                ops.append(op)
    for op in ops:
        names: list[str] = []
        for c in record["cases"]:
            for n in c.get("ops", {}).get(op, {}):
                if n not in names:
                    names.append(n)
        lines += [f"## {op}", "", "| B | V | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
        for c in record["cases"]:
            res = c.get("ops", {}).get(op)
            if res is None:
                continue
            base = res.get("opmux", {}).get("us")
            cells = []
            for n in names:
                r = res.get(n, {})
                if "us" not in r:
                    cells.append("error" if "error" in r else "-")
                elif n == "opmux" or not base:
                    cells.append(f"{r['us']:.1f}")
                else:
                    cells.append(f"{r['us']:.1f} ({r['us'] / base:.2f}x)")
            lines.append(f"| {c['B']} | {c['V']} | " + " | ".join(cells) + " |")
        lines.append("")
    bad = [f"B={c['B']} V={c['V']}" for c in record["cases"] if c.get("checked") is False]
    if bad:
        lines += [f"**Check failed** (an opmux id outside vLLM's kept set): {', '.join(bad)}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--batch", default=",".join(map(str, BATCH)))
    ap.add_argument("--vocab", default=",".join(map(str, VOCAB)))
    ap.add_argument("--replays", type=int, default=7)
    ap.add_argument("--target-us", type=float, default=2000.0, help="graph length aimed at")
    ap.add_argument("--budget-s", type=float, default=400.0, help="cases left when it is spent are skipped")
    ap.add_argument("--forced", default="", help="backends to time opmux's call forced to (comma-separated)")
    ap.add_argument("--select-out", type=Path, help="also write the select tables here (needs --forced)")
    ap.add_argument("--select-from", type=Path, help="write --select-out's tables from this record (no GPU)")
    ap.add_argument("--ops", default="", help=f"time only these of {', '.join(OPS)} (comma-separated)")
    ap.add_argument(
        "--columns",
        default="",
        help="time only these columns, e.g. 'opmux[jit],FlashInfer' (an A/B's cheap call)",
    )
    args = ap.parse_args(argv)
    args.ops = [x for x in args.ops.split(",") if x]
    args.columns = [x for x in args.columns.split(",") if x]
    if unknown := sorted(set(args.ops) - set(OPS)):
        ap.error(f"--ops: unknown {', '.join(unknown)}; valid: {', '.join(OPS)}")
    if args.select_from is not None:
        if args.select_out is None:
            ap.error("--select-from needs --select-out")
        write_selects(json.loads(args.select_from.read_text()), args.select_out)
        return 0

    import torch

    from opmux.kernels import _env

    args.out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"env": environment(torch), "forced": args.forced, "cases": []}
    with _env.scope(OPMUX_FALLBACK="error"):  # a forced backend that cannot run fails its cell
        for v in (int(x) for x in args.vocab.split(",")):
            for b in (int(x) for x in args.batch.split(",")):
                if time.perf_counter() - T0 > args.budget_s:
                    record["cases"].append({"B": b, "V": v, "skipped": "budget"})
                    continue
                record["cases"].append(run_case(torch, b, v, args))
                (args.out / "sampling.json").write_text(json.dumps(record, indent=1) + "\n")
                torch.cuda.empty_cache()
    (args.out / "sampling.json").write_text(json.dumps(record, indent=1) + "\n")
    (args.out / "sampling.md").write_text(render(record))
    log(f"wrote {args.out / 'sampling.json'} and sampling.md")
    if args.select_out is not None:
        write_selects(record, args.select_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
