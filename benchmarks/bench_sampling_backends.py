"""The sampling ops' CUDA backends side by side (eager, 20 calls between two events; one run,
ratios), the measurement behind the CUDA order in ``ops/sampling/op.py``:

    python benchmarks/bench_sampling_backends.py

Recorded in docs/benchmarks/sampling_h200.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from opmux.kernels.ops import sampling as S

SHAPES = ((1, 151936), (16, 151936), (64, 128256), (256, 32000), (256, 151936))
BACKENDS = ("triton", "jit", "torch")


def time_us(fn: Callable[[], Any], n: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        fn()
    b.record()
    b.synchronize()
    return float(a.elapsed_time(b)) * 1e3 / n


def run_shape(bsz: int, v: int, g: torch.Generator) -> None:
    logits = torch.randn(bsz, v, device="cuda", generator=g) * 3
    probs = logits.softmax(-1)
    k = torch.randint(20, 101, (bsz,), device="cuda", generator=g, dtype=torch.int32)
    p = 0.7 + 0.25 * torch.rand(bsz, device="cuda", generator=g)
    seed, off = torch.tensor([1], device="cuda"), torch.tensor([0], device="cuda")
    ops: dict[str, Callable[[str], Any]] = {
        "top_k_top_p": lambda be: S.top_k_top_p_sampling_from_probs(
            probs, top_k_arr=k, top_p_arr=p, seed_tensor=seed, offset_tensor=off, backend=be
        ),
        "top_k_renorm": lambda be: S.top_k_renorm_probs(probs, top_k_arr=k, backend=be),
        "top_p_renorm": lambda be: S.top_p_renorm_probs(probs, top_p_arr=p, backend=be),
        "top_k_mask": lambda be: S.top_k_mask_logits(logits, top_k_arr=k, backend=be),
        "greedy": lambda be: S.greedy(logits, backend=be),
    }
    for name, op in ops.items():
        us = {be: time_us(lambda op=op, be=be: op(be)) for be in BACKENDS}
        cells = " | ".join(f"{us[be]:.1f}" for be in BACKENDS)
        print(f"| {bsz} | {v} | {name} | {cells} | {us['jit'] / us['triton']:.2f} |", flush=True)


def main() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    print("| B | V | op | " + " | ".join(BACKENDS) + " | jit / triton |")
    for bsz, v in SHAPES:
        run_shape(bsz, v, g)


if __name__ == "__main__":
    main()
