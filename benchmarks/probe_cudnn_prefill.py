"""cuDNN's paged prefill (its SDPA graph over opmux's paged cache: ragged query / output rows, the
block table as its page table, the causal mask bottom-right) against SDPA cuDNN on contiguous K / V,
FlashInfer's paged prefill and opmux (its ``cudnn`` backend and its default, eagerly), one GPU:

    python benchmarks/probe_cudnn_prefill.py OUT.json     (needs nvidia-cudnn-frontend and flashinfer)

The question it answered (session 43, an H100: docs/benchmarks/attention_prefill_cudnn_paged_h100_s43.json):
whether opmux's ``cudnn`` backend should hand cuDNN the paged cache. Its paged graph took
1.18-1.27x cuDNN's dense time on plain prefill and trailed FlashInfer; the backend now gathers the
batch's positions and runs the dense ragged graph (``bench_attention_prefill.py`` times it).
Columns: ``cudnn paged`` (the graph built for the batch's exact runs) and ``cudnn paged bucket``
(runs rounded up to powers of two) in CUDA graphs, ``... eager`` between two events.
"""

import json
import math
import sys
import time

import torch

sys.path.insert(0, "benchmarks")
import cudnn
from bench_attention_prefill import MODELS, flashinfer_fn, make_case, sdpa_fn, split
from bench_gpu import time_impl, time_impls
from torch.nn.attention import SDPBackend

from opmux.kernels import ops

print(
    "cudnn frontend",
    cudnn.__version__,
    "backend",
    cudnn.backend_version(),
    "torch cudnn",
    torch.backends.cudnn.version(),
    flush=True,
)
HANDLE = cudnn.create_handle()


def cudnn_fn(c, hq, hkv, d, page, bucket):
    q, kc, vc, table, lens, cu = c["query"], c["kc"], c["vc"], c["table"], c["lens"], c["cu"]
    B, W = table.shape
    qlens = [c["cu_list"][i + 1] - c["cu_list"][i] for i in range(B)]
    sq = max(qlens)
    skv = max(c["lens_list"])
    if bucket:
        sq = 1 << (sq - 1).bit_length()
        skv = min(W * page, 1 << (skv - 1).bit_length())
    out = torch.empty_like(q)
    seq_q = (cu[1:] - cu[:-1]).reshape(B, 1, 1, 1).contiguous()
    seq_kv = lens.reshape(B, 1, 1, 1).contiguous()
    rag = (cu * (hq * d)).reshape(B + 1, 1, 1, 1).contiguous()
    tab = table.reshape(B, 1, W, 1)
    kcl, vcl = kc.permute(0, 2, 1, 3), vc.permute(0, 2, 1, 3)
    g = cudnn.pygraph(
        io_data_type=cudnn.data_type.BFLOAT16,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
        handle=HANDLE,
    )
    t0 = time.perf_counter()
    gq = g.tensor(
        name="q", dim=(B, hq, sq, d), stride=(sq * hq * d, d, hq * d, 1), data_type=cudnn.data_type.BFLOAT16
    )
    grq = g.tensor_like(rag)
    gq.set_ragged_offset(grq)
    gk = g.tensor(
        name="k", dim=tuple(kcl.shape), stride=tuple(kcl.stride()), data_type=cudnn.data_type.BFLOAT16
    )
    gv = g.tensor(
        name="v", dim=tuple(vcl.shape), stride=tuple(vcl.stride()), data_type=cudnn.data_type.BFLOAT16
    )
    gtk, gtv = g.tensor_like(tab), g.tensor_like(tab)
    gsq, gskv = g.tensor_like(seq_q), g.tensor_like(seq_kv)
    kw = dict(
        name="sdpa",
        q=gq,
        k=gk,
        v=gv,
        attn_scale=1.0 / math.sqrt(d),
        use_padding_mask=True,
        seq_len_q=gsq,
        seq_len_kv=gskv,
        use_causal_mask_bottom_right=True,
        paged_attention_k_table=gtk,
        paged_attention_v_table=gtv,
        paged_attention_max_seq_len_kv=skv,
    )
    try:
        o, _ = g.sdpa(generate_stats=False, **kw)
    except TypeError:
        o, _ = g.sdpa(is_inference=True, **kw)
    gro = g.tensor_like(rag)
    o.set_ragged_offset(gro)
    o.set_output(True).set_dim((B, hq, sq, d)).set_stride((sq * hq * d, d, hq * d, 1)).set_data_type(
        cudnn.data_type.BFLOAT16
    )
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    ws = torch.empty(max(1, g.get_workspace_size()), device="cuda", dtype=torch.uint8)
    build_s = time.perf_counter() - t0
    pack = {gq: q, gk: kcl, gv: vcl, gtk: tab, gtv: tab, gsq: seq_q, gskv: seq_kv, grq: rag, gro: rag, o: out}

    def run(_):
        cudnn.set_stream(handle=HANDLE, stream=torch.cuda.current_stream().cuda_stream)
        g.execute(pack, ws, handle=HANDLE)
        return out

    return run, build_s, g.get_workspace_size()


def main():
    outp = sys.argv[1]
    cases = [("Llama-3-8B", "prefill", n) for n in (1024, 4096, 16384, 32768)]
    cases += [("Qwen3-30B-A3B", "prefill", 4096), ("Qwen3-30B-A3B", "prefill", 32768)]
    cases += [("Llama-3-8B", "extend", 32768), ("Llama-3-8B", "ragged", 32768)]
    rec = {
        "device": torch.cuda.get_device_name(),
        "cudnn_frontend": cudnn.__version__,
        "cudnn_backend": cudnn.backend_version(),
        "cases": [],
    }
    for model, mode, n in cases:
        hq, hkv, d = MODELS[model]
        q_lens, prefix = split(mode, n)
        c = make_case(torch, q_lens, prefix, (hq, hkv, d), 16)
        pairs = sum(q * p + q * (q + 1) // 2 for q, p in zip(q_lens, prefix, strict=True))
        flops = 4 * hq * d * pairs
        row = {"model": model, "mode": mode, "N": n}
        fns = {}
        try:
            fns["cudnn paged"], row["build_s"], row["ws"] = cudnn_fn(c, hq, hkv, d, 16, False)
            fns["cudnn paged bucket"], row["build_s_bucket"], _ = cudnn_fn(c, hq, hkv, d, 16, True)
        except Exception as e:
            row["cudnn_error"] = f"{type(e).__name__}: {str(e)[:400]}"
            print(model, mode, n, row["cudnn_error"], flush=True)
        fns["SDPA cuDNN"] = sdpa_fn(torch, c, SDPBackend.CUDNN_ATTENTION, hq, hkv)
        fns["FlashInfer"] = flashinfer_fn(torch, c, hq, hkv, d, 16)
        args = (c["query"], c["kc"], c["vc"], c["table"], c["lens"], c["cu"])
        mine = lambda _, a=args: ops.attention.paged_prefill(*a, backend="cudnn")  # noqa: E731
        ref = fns["FlashInfer"](None).float()
        try:
            y = mine(None).float()
            torch.cuda.synchronize()
            row["err opmux cudnn"] = ((y - ref).abs() - 1e-2 * ref.abs()).max().item()
            if row["err opmux cudnn"] > 1.5e-2:
                print("WRONG opmux cudnn", model, mode, n, row["err opmux cudnn"], flush=True)
        except Exception as e:
            mine = None
            row["opmux cudnn error"] = f"{type(e).__name__}: {str(e)[:600]}"
            print(model, mode, n, row["opmux cudnn error"], flush=True)
        for nm, f in list(fns.items()):
            y = f(None).float()
            torch.cuda.synchronize()
            err = ((y - ref).abs() - 1e-2 * ref.abs()).max().item()
            row[f"err {nm}"] = err
            if err > 1.5e-2:
                print("WRONG", model, mode, n, nm, err, flush=True)
        est = max(20.0, flops / 400e12 * 1e6)
        R = max(1, min(30, math.ceil(3000 / est)))
        t = time_impls(torch, fns, [None], R, 7)
        if "cudnn paged" in fns:
            t["cudnn paged eager"] = time_impl(torch, fns["cudnn paged"], [None], R, 5, graph=False)
            if mine is not None:
                t["opmux cudnn eager"] = time_impl(torch, mine, [None], R, 5, graph=False)
            t["opmux default eager"] = time_impl(
                torch, lambda _, a=args: ops.attention.paged_prefill(*a), [None], R, 5, graph=False
            )
        for nm, r in t.items():
            row[nm] = r.get("us", r.get("error"))
        rec["cases"].append(row)
        print(
            f"{model} {mode} {n}: "
            + ", ".join(
                f"{nm} {row[nm]:.1f} ({flops / row[nm] / 1e6:.0f} TF)"
                for nm in t
                if isinstance(row[nm], float)
            )
            + f" build {row.get('build_s', 0):.2f}s/{row.get('build_s_bucket', 0):.2f}s",
            flush=True,
        )
        json.dump(rec, open(outp, "w"), indent=1)
        del c, fns
        torch.cuda.empty_cache()


main()
