"""The fused MoE experts (moe.fused_experts) against their peers on one GPU, in one run.

    python benchmarks/bench_moe.py --out DIR [--models Mixtral-8x7B,DeepSeek-V3] [--m 1,8,64]
        [--peer-configs DIR] [--budget-s 400] [--forced cuda,triton] [--cuda-splits 1x1,2x4,4x8]
        [--select-out DIR]

For each model's experts (``opmux.kernels.tune.MOE_MODELS``: E, N, K, topk and the weight form)
and every M (tokens): opmux's default call, and the peers a user would pick:

* ``torch._grouped_mm`` (bf16; sm90 CUTLASS): tokens sorted by expert on the GPU, two grouped
  products with the gated activation between, the weighted scatter-add back (graph-safe: no
  host sync);
* a per-expert ``torch.mm`` loop over precomputed per-expert token lists (the routing's host
  sync left out of its time, so the loop is timed at its best);
* the Triton fused-MoE kernel run with vLLM's shipped H200 configuration for that (E, N) when
  vLLM ships one (``--peer-configs``: a folder of vLLM's files, read as they are), else vLLM's
  default configuration (``get_default_config``): what vLLM runs on that shape.

Each is checked once against the op's definition (vLLM's criterion: mean |out - ref| / mean |ref|
below 2e-2 for bf16 here, where the peers' rounding differs) and timed as R calls in one CUDA
graph per column, the columns' replays interleaved (bench_gpu.time_impls), median of the
replays. Weight-bound decode (M <= 64): ``W/copy`` is
the bytes of the experts the batch touches read per second over the copy bandwidth measured in
the same run. For DeepSeek-V3 the bf16 form of the same shape is timed too: the fp8 form's time
over the bf16 one is ``fp8/bf16``. ``--layer``: a whole Qwen3-30B-A3B MoE layer (router GEMM,
``topk_softmax``, ``fused_experts``) in one graph beside the sum of its parts. ``--forced``: opmux's
call forced onto each named backend too (``opmux <backend>``; not peers); ``--cuda-splits``: at
M <= 64 the native decode kernels with their columns per warp forced (up x down: tuning data for
the unit's own choice); ``--select-out``: the fastest forced backend per shape and M as opmux
select tables (merged into the shipped table of the device).

Writes DIR/moe.json (rewritten after every case) and DIR/moe.md.
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

from bench_gpu import copy_bandwidth, environment, time_impl, time_impls  # noqa: E402

OP = "moe.fused_experts"
M_DEFAULT = (1, 8, 64, 256, 1024, 4096, 16384)
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def vllm_default_config(m: int, e: int, fp8: bool) -> dict[str, int]:
    """vLLM's ``get_default_config`` (fused_moe.py) for the forms here: block-fp8 and bf16."""
    if fp8:
        return {
            "BLOCK_SIZE_M": 64,
            "BLOCK_SIZE_N": 128,
            "BLOCK_SIZE_K": 128,
            "GROUP_SIZE_M": 32,
            "num_warps": 4,
            "num_stages": 3,
        }
    if m <= e:
        return {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
                "num_stages": 4}  # fmt: skip
    return {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8, "num_warps": 4,
            "num_stages": 4}  # fmt: skip


def peer_config(folder: Path | None, e: int, n: int, fp8: bool, m: int) -> tuple[dict[str, int], str]:
    """vLLM's shipped H200 config for (E, N) at the nearest M, else its default; and which."""
    if folder is not None:
        name = f"E={e},N={n},device_name=NVIDIA_H200" + (
            ",dtype=fp8_w8a8,block_shape=[128,128]" if fp8 else ""
        )
        path = folder / f"{name}.json"
        if path.exists():
            table = {int(k): v for k, v in json.loads(path.read_text()).items()}
            best = min(table, key=lambda key: (abs(key - m), key))
            return dict(table[best]), f"vLLM H200 file {path.name}"
    return vllm_default_config(m, e, fp8), "vLLM default config"


def make_weights(torch: Any, e: int, n: int, k: int, fp8: bool) -> dict[str, Any]:
    from opmux.kernels.tune.moe import make_weights as experts

    w = experts(torch, e, n, k, "fp8" if fp8 else "bf16", "cuda")
    return {name: t for name, t in w.items() if t is not None}


def routing(torch: Any, m: int, e: int, k: int, topk: int, seed: int) -> dict[str, Any]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    hidden = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    logits = torch.randn(m, e, device="cuda", generator=g)
    weights, ids = torch.topk(torch.softmax(logits, dim=-1), topk, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    return {"hidden": hidden, "tw": weights.contiguous(), "ti": ids.to(torch.int32).contiguous()}


def grouped_mm_experts(torch: Any, w: dict[str, Any], s: dict[str, Any]) -> Any:
    """bf16 experts on ``torch._grouped_mm``, graph-safe: sort the (token, slot) rows by expert,
    two grouped products, the weighted rows added back per token."""
    hidden, ids, tw = s["hidden"], s["ti"], s["tw"]
    m, topk = ids.shape
    e = w["w1"].shape[0]
    flat = ids.flatten().long()
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(e, dtype=torch.int32, device="cuda").index_add_(
        0, flat, torch.ones_like(flat, dtype=torch.int32)
    )
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    x = hidden.index_select(0, order // topk)
    h = torch._grouped_mm(x, w["w1"].transpose(-2, -1), offs=offs)
    n = h.shape[-1] // 2
    a = torch.nn.functional.silu(h[:, :n]) * h[:, n:]
    y = torch._grouped_mm(a, w["w2"].transpose(-2, -1), offs=offs)
    y = y * tw.flatten()[order, None].to(y.dtype)
    out = torch.zeros(m, hidden.shape[1], dtype=torch.float32, device="cuda")
    out.index_add_(0, order // topk, y.float())
    return out.to(hidden.dtype)


def loop_lists(torch: Any, s: dict[str, Any], e: int) -> list[tuple[int, Any, Any]]:
    """Per expert: (e, token rows, slot weights), computed once outside the timed calls."""
    ids = s["ti"].long()
    lists = []
    for ex in range(e):
        tok, slot = (ids == ex).nonzero(as_tuple=True)
        if tok.numel():
            lists.append((ex, tok, s["tw"][tok, slot][:, None]))
    return lists


def loop_experts(torch: Any, w: dict[str, Any], s: dict[str, Any]) -> Any:
    hidden = s["hidden"]
    out = torch.zeros(hidden.shape, dtype=torch.float32, device="cuda")
    for ex, tok, weight in s["lists"]:
        h = hidden.index_select(0, tok) @ w["w1"][ex].T
        n = h.shape[-1] // 2
        y = (torch.nn.functional.silu(h[:, :n]) * h[:, n:]) @ w["w2"][ex].T
        out.index_add_(0, tok, (y.float() * weight))
    return out.to(hidden.dtype)


def error(y: Any, ref: Any) -> float:
    return float((y.float() - ref.float()).abs().mean() / ref.float().abs().mean().clamp_min(1e-30))


def cuda_split(
    torch: Any, w: dict[str, Any], s: dict[str, Any], scales: dict[str, Any], split: tuple[int, int]
) -> Any:
    """The native CUDA decode backend with its columns per warp forced (up, down)."""
    from opmux.kernels.ops.moe.fused_experts_cuda import launch

    out = torch.empty_like(s["hidden"])
    empty = torch.empty(0, device="cuda")
    emap = torch.empty(0, dtype=torch.int32, device="cuda")
    launch(
        out, s["hidden"], w["w1"], w["w2"], s["tw"], s["ti"], scales.get("w1_scale", empty),
        scales.get("w2_scale", empty), emap, "silu", False, rows_per_warp=split,
    )  # fmt: skip
    return out


def run_case(
    torch: Any,
    model: str,
    form: str,
    shape: tuple[int, int, int, int],
    m: int,
    w: dict[str, Any],
    bw: dict[str, Any],
    args: Any,
) -> dict[str, Any]:
    from opmux.kernels import explain, ops
    from opmux.kernels.ops.moe import _experts
    from opmux.kernels.ops.moe.fused_experts_triton import launch_fused_experts

    e, n, k, topk = shape
    fp8 = form == "fp8"
    sets = [routing(torch, m, e, k, topk, seed) for seed in range(2 if m <= 4096 else 1)]
    s0 = sets[0]
    scales = {"w1_scale": w["w1_scale"], "w2_scale": w["w2_scale"]} if fp8 else {}
    empty = torch.empty(0, device="cuda")
    emap = torch.empty(0, dtype=torch.int32, device="cuda")
    cfg, cfg_src = peer_config(args.peer_configs, e, n, fp8, m)

    def default(s: dict[str, Any]) -> Any:
        return ops.moe.fused_experts(s["hidden"], w["w1"], w["w2"], s["tw"], s["ti"], **scales)

    def triton_peer(s: dict[str, Any]) -> Any:
        out = torch.empty_like(s["hidden"])
        launch_fused_experts(
            out,
            s["hidden"],
            w["w1"],
            w["w2"],
            s["tw"],
            s["ti"],
            scales.get("w1_scale", empty),
            scales.get("w2_scale", empty),
            emap,
            "silu",
            False,
            config=cfg,
        )
        return out

    fns: dict[str, Any] = {"opmux default": default, f"Triton ({cfg_src.split(' file')[0]})": triton_peer}
    from opmux.kernels.explain import op_instance

    op = op_instance(OP)
    for b in args.forced:  # opmux's call forced onto a backend (a refusal is recorded, not timed)
        forced = op.impl(b)
        fns[f"opmux {b}"] = lambda s, f=forced: f(s["hidden"], w["w1"], w["w2"], s["tw"], s["ti"], **scales)
    for split in args.cuda_splits if m <= 64 else ():  # the native decode kernels' columns per warp
        fns[f"opmux cuda {split[0]}x{split[1]}"] = lambda s, sp=split: cuda_split(torch, w, s, scales, sp)
    if not fp8:
        fns["torch._grouped_mm"] = lambda s: grouped_mm_experts(torch, w, s)
        if m <= args.loop_max_m:
            for s in sets:
                s["lists"] = loop_lists(torch, s, e)
            fns["torch.mm loop"] = lambda s: loop_experts(torch, w, s)
    # the definition at M <= 1024 (its loop is slow past that; checked on the first 1024 rows then)
    mr = min(m, 1024)
    ref = _experts.reference(s0["hidden"][:mr], w["w1"], w["w2"], s0["tw"][:mr], s0["ti"][:mr], **scales)
    case: dict[str, Any] = {"model": model, "form": form, "E": e, "N": n, "K": k, "topk": topk, "M": m}
    case["peer_config"] = cfg_src
    try:
        case["default_backend"] = explain(
            OP, s0["hidden"], w["w1"], w["w2"], s0["tw"], s0["ti"], **scales
        ).chosen
    except Exception as exc:
        case["default_backend"] = f"explain failed: {exc}"
    touched = int(torch.unique(s0["ti"]).numel())
    wbytes = touched * 3 * n * k * (1 if fp8 else 2)
    flops = 2 * m * topk * 3 * n * k
    est_us = max(5.0, flops / 400e12 * 1e6, wbytes / 3.5e12 * 1e6)
    R = max(len(sets), min(100, math.ceil(args.target_us / est_us)))
    case["impls"] = {}
    # one untimed graph first: the first timing after the definition's products above ran slow
    # (DeepSeek-V3 fp8 M=1: opmux's default 149 us in three runs, the same launch 130 in the next
    # column and in a script of its own, either order; docs/benchmarks/moe_decode_cuda_h100.md)
    try:
        time_impl(torch, fns["opmux default"], sets, R, 1)
    except Exception:
        torch.cuda.synchronize()  # its failure is recorded below, where it is timed
    checked: dict[str, Any] = {}  # the columns that match the reference, timed together below
    for name, fn in fns.items():
        rec: dict[str, Any] = {}
        try:
            y = fn(s0)
            torch.cuda.synchronize()
            rec["rel_err"] = error(y[:mr], ref)
            if rec["rel_err"] < (5e-2 if fp8 else 2e-2):
                checked[name] = fn
            else:
                rec["status"] = "wrong"
        except Exception as exc:
            rec = {"status": "error", "why": f"{type(exc).__name__}: {str(exc)[:300]}"}
        case["impls"][name] = rec
    # replays interleaved (bench_gpu.time_impls): each column sees the same clocks
    for name, t in time_impls(torch, checked, sets, R, args.replays).items():
        rec = case["impls"][name]
        if "us" in t:
            rec.update(t, status="ok", TFLOPs=flops / (t["us"] * 1e-6) / 1e12)
            rec["W_over_copy"] = wbytes / (t["us"] * 1e-6) / (bw["GBps"] * 1e9)
        else:
            rec.update(status="error", why=t["error"])
    best = {nm: r["us"] for nm, r in case["impls"].items() if r.get("status") == "ok"}
    peers = {nm: us for nm, us in best.items() if not nm.startswith("opmux")}
    if "opmux default" in best and peers:
        fastest = min(peers, key=peers.__getitem__)
        case["fastest_peer"] = fastest
        case["default_vs_fastest_peer"] = best["opmux default"] / peers[fastest]
    log(
        f"{model} {form} M={m}: "
        + ", ".join(f"{nm} {us:.1f}" for nm, us in sorted(best.items(), key=lambda kv: kv[1]))
    )
    del sets
    return case


def layer_case(torch: Any, bw: dict[str, Any], args: Any) -> list[dict[str, Any]]:
    """Qwen3-30B-A3B's MoE layer (router, topk, experts) in one graph beside its parts."""
    from opmux.kernels import ops
    from opmux.kernels.tune import moe_shapes

    e, n, k, topk, _ = moe_shapes("Qwen3-30B-A3B")
    w = make_weights(torch, e, n, k, False)
    gate = torch.randn(e, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
    rows = []
    for m in (1, 64, 1024):
        s = routing(torch, m, e, k, topk, 0)
        logits = s["hidden"] @ gate.T
        tw, ti = ops.moe.topk_softmax(logits, topk, renormalize=True)
        parts = {
            "router GEMM": lambda s: s["hidden"] @ gate.T,
            "topk_softmax": lambda s, lg=logits: ops.moe.topk_softmax(lg, topk, renormalize=True),
            "fused_experts": lambda s, tw=tw, ti=ti: ops.moe.fused_experts(
                s["hidden"], w["w1"], w["w2"], tw, ti
            ),
        }

        def whole(s: dict[str, Any]) -> Any:
            tw, ti = ops.moe.topk_softmax(s["hidden"] @ gate.T, topk, renormalize=True)
            return ops.moe.fused_experts(s["hidden"], w["w1"], w["w2"], tw, ti)

        rec: dict[str, Any] = {"M": m, "parts": {}}
        for name, fn in parts.items():
            rec["parts"][name] = time_impl(torch, fn, [s], 50, args.replays)["us"]
        rec["layer_us"] = time_impl(torch, whole, [s], 50, args.replays)["us"]
        rec["sum_of_parts_us"] = sum(rec["parts"].values())
        log(f"Qwen3-30B-A3B layer M={m}: {rec['layer_us']:.1f} us (parts {rec['sum_of_parts_us']:.1f})")
        rows.append(rec)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", default="", help="comma-separated MoE presets (default: all)")
    ap.add_argument("--m", default=",".join(map(str, M_DEFAULT)), help="tokens M (default %(default)s)")
    ap.add_argument(
        "--peer-configs", type=Path, default=None, help="a folder of vLLM's fused-MoE config files"
    )
    ap.add_argument("--replays", type=int, default=7)
    ap.add_argument("--target-us", type=float, default=4000.0, help="graph length aimed at")
    ap.add_argument("--loop-max-m", type=int, default=4096, help="the torch.mm loop up to this M")
    ap.add_argument("--layer", action="store_true", help="also the whole Qwen3-30B-A3B layer in one graph")
    ap.add_argument("--budget-s", type=float, default=400.0, help="cases left when it is spent are skipped")
    ap.add_argument(
        "--forced", default="", help="also opmux's call forced onto these backends (comma-separated)"
    )
    ap.add_argument(
        "--cuda-splits",
        default="",
        help="at M <= 64 also the cuda backend with these columns per warp: UPxDOWN,...",
    )
    ap.add_argument(
        "--select-out",
        type=Path,
        default=None,
        help="write the fastest --forced backend per shape and M as opmux select tables here",
    )
    args = ap.parse_args(argv)
    args.forced = [b for b in args.forced.split(",") if b]
    args.cuda_splits = [tuple(int(v) for v in sp.split("x")) for sp in args.cuda_splits.split(",") if sp]

    import torch

    from opmux.kernels.tune import MOE_MODELS

    models = [m for m in args.models.split(",") if m] or list(MOE_MODELS)
    unknown = [m for m in models if m not in MOE_MODELS]
    if unknown:
        ap.error(f"unknown --models {', '.join(unknown)}; presets: {', '.join(MOE_MODELS)}")
    ms = [int(v) for v in args.m.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    bw = copy_bandwidth(torch)
    log(f"copy bandwidth {bw['GBps']:.0f} GB/s")
    record: dict[str, Any] = {"env": environment(torch), "copy": bw, "cases": [], "layer": []}
    for model in models:
        e, n, k, topk, form = MOE_MODELS[model]
        forms = [form] + (["bf16"] if form == "fp8" else [])
        for f in forms:
            w = make_weights(torch, e, n, k, f == "fp8")
            for m in ms:
                if time.perf_counter() - T0 > args.budget_s:
                    record["cases"].append({"model": model, "form": f, "M": m, "skipped": "budget"})
                    continue
                record["cases"].append(run_case(torch, model, f, (e, n, k, topk), m, w, bw, args))
                (args.out / "moe.json").write_text(json.dumps(record, indent=1) + "\n")
            del w
            torch.cuda.empty_cache()
    if args.layer and time.perf_counter() - T0 < args.budget_s:
        record["layer"] = layer_case(torch, bw, args)
    (args.out / "moe.json").write_text(json.dumps(record, indent=1) + "\n")
    (args.out / "moe.md").write_text(render(record))
    if args.select_out is not None:
        from opmux.kernels import tuned

        for path in write_select(record, args.select_out, tuned.device_name(torch.device("cuda"))):
            log(f"select table {path}")
    log(f"wrote {args.out / 'moe.json'} and moe.md")
    return 0


def write_select(record: dict[str, Any], folder: Path, device_name: str) -> list[Path]:
    """The measured-fastest of the forced backends (``--forced``) per (E, N, form) and M, merged
    into the shipped select table of this device where one exists (its other M kept): opmux select
    tables for ``python/opmux/kernels/configs/moe.fused_experts/``."""
    from opmux.kernels import tuned
    from opmux.kernels.tune.moe import form_tags

    picks: dict[tuple[int, int, str], dict[int, str]] = {}
    for c in record["cases"]:
        times = {
            nm.removeprefix("opmux "): r["us"]
            for nm, r in c.get("impls", {}).items()
            if nm.startswith("opmux ")
            and nm != "opmux default"
            and " " not in nm.removeprefix("opmux ")
            and r.get("status") == "ok"
        }
        if len(times) >= 2:
            picks.setdefault((c["E"], c["N"], c["form"]), {})[c["M"]] = min(times, key=times.__getitem__)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for (e, n, form), entries in picks.items():
        key = tuned.table_key(OP, "select", device_name, (e, n), form_tags(form))
        shipped = tuned.shipped_dir(OP) / key.file_name()
        table = json.loads(shipped.read_text()) if shipped.is_file() else {}
        table.update({str(m): {"backend": b} for m, b in entries.items()})
        path = folder / key.file_name()
        path.write_text(json.dumps(dict(sorted(table.items(), key=lambda kv: int(kv[0]))), indent=1) + "\n")
        written.append(path)
    return written


def render(record: dict[str, Any]) -> str:
    env = record["env"]
    names: list[str] = []
    for c in record["cases"]:
        for nm in c.get("impls", {}):
            label = "Triton (vLLM config)" if nm.startswith("Triton") else nm
            if label not in names:
                names.append(label)
    lines = [
        "# Fused MoE experts on the GPU",
        "",
        f"Generated by `benchmarks/bench_moe.py` on {env.get('device', '?')} (torch {env.get('torch', '?')}); "
        f"copy bandwidth {record['copy']['GBps']:.0f} GB/s. us per call in CUDA graphs (TFLOP/s; for M <= 64 also "
        "the touched experts' weight bytes read as a fraction of copy bandwidth). `default/peer`: opmux's "
        "default over the fastest peer (below 1: faster). `Triton (vLLM config)`: the Triton kernel with "
        "vLLM's shipped H200 file for that (E, N) where one exists, else vLLM's default config (column `peer config`).",
        "",
        "| model | form | M | default ran | peer config | " + " | ".join(names) + " | default/peer |",
        "|---|---|---:|---|---|" + "---:|" * len(names) + "---:|",
    ]
    for c in record["cases"]:
        if "skipped" in c:
            continue
        cells = []
        impls = {("Triton (vLLM config)" if k.startswith("Triton") else k): v for k, v in c["impls"].items()}
        for nm in names:
            r = impls.get(nm, {})
            if r.get("status") != "ok":
                cells.append(r.get("status", "-"))
                continue
            cell = f"{r['us']:.1f} ({r['TFLOPs']:.0f})"
            if c["M"] <= 64:
                cell += f" {r['W_over_copy']:.2f}"
            cells.append(cell)
        ratio = c.get("default_vs_fastest_peer")
        lines.append(
            f"| {c['model']} | {c['form']} | {c['M']} | {c.get('default_backend', '')} | {c.get('peer_config', '')} | "
            + " | ".join(cells)
            + f" | {'' if ratio is None else f'{ratio:.2f}'} |"
        )
    fp8 = {(c["model"], c["M"]): c for c in record["cases"] if c.get("form") == "fp8" and "impls" in c}
    ratios = []
    for c in record["cases"]:
        f = fp8.get((c.get("model"), c.get("M")))
        if c.get("form") == "bf16" and f is not None:
            a, b = f["impls"].get("opmux default", {}), c["impls"].get("opmux default", {})
            if a.get("status") == b.get("status") == "ok":
                ratios.append(
                    f"| {c['model']} | {c['M']} | {a['us']:.1f} | {b['us']:.1f} | {a['us'] / b['us']:.2f} |"
                )
    if ratios:
        lines += ["", "## fp8 block-scaled over bf16 (opmux default, same shape)", "",
                  "| model | M | fp8 us | bf16 us | fp8/bf16 |", "|---|---:|---:|---:|---:|", *ratios]  # fmt: skip
    if record.get("layer"):
        lines += ["", "## Qwen3-30B-A3B MoE layer in one graph", "",
                  "| M | layer us | sum of parts us | router | topk_softmax | fused_experts |",
                  "|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for r in record["layer"]:
            p = r["parts"]
            lines.append(
                f"| {r['M']} | {r['layer_us']:.1f} | {r['sum_of_parts_us']:.1f} | {p['router GEMM']:.1f} | "
                f"{p['topk_softmax']:.1f} | {p['fused_experts']:.1f} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
