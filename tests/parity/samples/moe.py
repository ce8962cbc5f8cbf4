"""Parity cases for the moe ops: made fresh per call, on the requested device."""

from __future__ import annotations

import torch

from opmux.kernels.ops._common import Sample

Invalid = list[tuple[str, tuple[object, ...], dict[str, object], type[Exception], str]]


def topk_softmax_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    g = torch.Generator(device="cpu").manual_seed(21)

    def logits(t: int, e: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn((t, e), generator=g) * scale).to(dtype=dtype, device=device)

    out = [
        Sample("1-token", (logits(1, 8), 2)),
        Sample("odd-experts-7", (logits(3, 7), 3)),
        Sample("renormalize", (logits(5, 64), 8), {"renormalize": True}),
        Sample("e-128-k-6", (logits(17, 128), 6)),
        Sample("empty-batch", (logits(0, 16), 2)),
        Sample("k-equals-e", (logits(2, 5), 5), {"renormalize": True}),
        # large logits: fp32 softmax underflows to equal zeros; ranking by logit stays defined
        Sample("large-magnitude", (logits(4, 32, 100.0), 4)),
        Sample("e-256-k-8", (logits(3, 256), 8), {"renormalize": True}),
        Sample("e-1500", (logits(2, 1500), 3)),
    ]
    ties = torch.zeros((3, 12), dtype=dtype, device=device)
    ties[1, 5:9] = 1.0  # four equal best logits: ids 5, 6, 7 win (lower index first)
    ties[2] = torch.tensor([3.0, 1, 3, 3, 0, 1, 3, 2, 2, 1, 0, 3], dtype=dtype)
    out.append(Sample("ties-lower-index", (ties, 3)))
    big = logits(6, 96)
    out.append(Sample("strided-rows", (big[:, :48], 4)))
    return out


def moe_align_block_size_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    g = torch.Generator(device="cpu").manual_seed(22)
    dtype = dtype if dtype in (torch.int32, torch.int64) else torch.int32  # ids: int32 or int64

    def routed(t: int, k: int, e: int) -> torch.Tensor:
        # like real top-k output: k distinct experts per token
        rows = [torch.randperm(e, generator=g)[:k] for _ in range(t)]
        ids = torch.stack(rows) if rows else torch.empty((0, k), dtype=torch.long)
        return ids.to(dtype=dtype, device=device)

    skew = torch.zeros((100, 1), dtype=dtype, device=device)
    skew[::7] = 3
    dup = torch.randint(0, 4, (9, 3), generator=g).to(dtype=dtype, device=device)  # repeats
    return [
        Sample("1-token", (routed(1, 2, 8), 4, 8)),
        Sample("odd-7x3-e5-bs3", (routed(7, 3, 5), 3, 5)),
        Sample("t64-k8-e64-bs16", (routed(64, 8, 64), 16, 64)),
        Sample("empty-batch", (torch.empty((0, 2), dtype=dtype, device=device), 8, 4)),
        Sample("block-size-1", (routed(5, 2, 6), 1, 6)),
        Sample("skewed", (skew, 32, 4)),
        Sample("duplicate-ids", (dup, 4, 4)),
        Sample("t300-k4-e16-bs64", (routed(300, 4, 16), 64, 16)),
        Sample("many-experts-512", (routed(33, 8, 512), 16, 512)),
    ]


def topk_softmax_invalid(device: str) -> Invalid:
    x = torch.randn(4, 16, device=device)
    return [
        ("int-dtype", (torch.ones(4, 16, dtype=torch.int32, device=device), 2), {}, TypeError, "dtype"),
        ("topk-too-large", (x, 17), {}, ValueError, "exceeds the number of experts"),
        ("topk-zero", (x, 0), {}, ValueError, "topk must be a positive int"),
        ("3d-shape", (torch.randn(2, 4, 16, device=device), 2), {}, ValueError, "expected \\[T, E\\]"),
        ("non-contiguous", (torch.randn(16, 4, device=device).t(), 2), {}, ValueError, "non-contiguous"),
    ]


def moe_align_block_size_invalid(device: str) -> Invalid:
    ids = torch.zeros((4, 2), dtype=torch.int32, device=device)
    cases: Invalid = [
        ("int16-ids", (ids.short(), 16, 8), {}, TypeError, "dtype"),
        ("float-ids", (ids.float(), 16, 8), {}, TypeError, "dtype"),
        ("1d-shape", (ids.flatten(), 16, 8), {}, ValueError, "expected \\[T, k\\]"),
        (
            "non-contiguous",
            (torch.zeros((2, 4), dtype=torch.int32, device=device).t(), 16, 8),
            {},
            ValueError,
            "non-contiguous",
        ),
        ("block-size-0", (ids, 0, 8), {}, ValueError, "block_size must be a positive int"),
    ]
    if device == "cpu":  # on CUDA bad ids are skipped by the kernels (no sync to check them)
        bad = ids.clone()
        bad[2, 1] = 8
        neg = ids.clone()
        neg[0, 0] = -1
        cases += [
            ("id-out-of-range", (bad, 16, 8), {}, ValueError, r"topk_ids\[2, 1\] = 8 is out of range"),
            ("negative-id", (neg, 16, 8), {}, ValueError, "out of range"),
            ("int64-id-past-int32", (bad.long() + 2**32, 16, 8), {}, ValueError, "out of range"),
        ]
    return cases
