"""The ``cudnn`` backend of attention.paged_prefill: its gather (the batch's positions copied into
dense keys and values, two index_select calls) timed alone beside the whole backend, eagerly (events
around 20 calls), on the prefill bench's plain-prefill shapes, one GPU:

    python benchmarks/probe_cudnn_gather.py     (needs nvidia-cudnn-frontend)

Session 43's H100 figures: docs/benchmarks/attention_prefill_cudnn_gather_h100_s43.txt.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

sys.path.insert(0, "benchmarks")
from bench_attention_prefill import MODELS, make_case, split

from opmux.kernels import ops
from opmux.kernels.ops.attention import paged_prefill_cudnn as cdp

CASES = (
    ("Llama-3-8B", 1024),
    ("Llama-3-8B", 4096),
    ("Llama-3-8B", 32768),
    ("Qwen3-30B-A3B", 32768),
)


def per_call_us(fn: Callable[[], Any], calls: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(calls):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / calls


def main() -> None:
    for model, n in CASES:
        hq, hkv, d = MODELS[model]
        q_lens, prefix = split("prefill", n)
        c = make_case(torch, q_lens, prefix, (hq, hkv, d), 16)
        args = (c["query"], c["kc"], c["vc"], c["table"], c["lens"], c["cu"])
        ops.attention.paged_prefill(*args, backend="cudnn")
        plan = next(iter(cdp._PLANS.values()))
        gather = per_call_us(lambda c=c, p=plan: (cdp.gather(c["kc"], p), cdp.gather(c["vc"], p)))
        backend = per_call_us(lambda a=args: ops.attention.paged_prefill(*a, backend="cudnn"))
        moved = 2 * 2 * n * hkv * d * 2  # K and V, read and written, bf16
        print(
            f"{model} prefill {n}: gather {gather:.1f} us ({moved / gather / 1e3:.0f} GB/s r+w), "
            f"backend {backend:.1f} us, share {gather / backend:.3f}",
            flush=True,
        )
        cdp._PLANS.clear()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
