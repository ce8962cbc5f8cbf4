"""Parity cases for the moe ops: made fresh per call, on the requested device."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from opmux.kernels.ops._common import Sample

Invalid = list[tuple[str, tuple[object, ...], dict[str, object], type[Exception], str]]
Logits = Callable[..., torch.Tensor]


def _routing_logits(device: str, dtype: torch.dtype, seed: int) -> tuple[torch.Generator, Logits]:
    g = torch.Generator(device="cpu").manual_seed(seed)

    def logits(t: int, e: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn((t, e), generator=g) * scale).to(dtype=dtype, device=device)

    return g, logits


def _routing_shapes(logits: Logits, large_magnitude: bool) -> list[Sample]:
    """The routing ops' shape cases (topk_softmax's with large logits, where its fp32 softmax
    underflows to equal zeros and the ranking by logit stays defined)."""
    out = [
        Sample("1-token", (logits(1, 8), 2)),
        Sample("odd-experts-7", (logits(3, 7), 3)),
        Sample("renormalize", (logits(5, 64), 8), {"renormalize": True}),
        Sample("e-128-k-6", (logits(17, 128), 6)),
        Sample("empty-batch", (logits(0, 16), 2)),
        Sample("k-equals-e", (logits(2, 5), 5), {"renormalize": True}),
    ]
    if large_magnitude:
        out.append(Sample("large-magnitude", (logits(4, 32, 100.0), 4)))
    out += [
        Sample("e-256-k-8", (logits(3, 256), 8), {"renormalize": True}),
        Sample("e-1500", (logits(2, 1500), 3)),  # past the CUDA kernels' register rows
    ]
    return out


def _routing_ties_strided(logits: Logits, device: str, dtype: torch.dtype) -> list[Sample]:
    ties = torch.zeros((3, 12), dtype=dtype, device=device)
    ties[1, 5:9] = 1.0  # four equal best scores: ids 5, 6, 7 win (lower index first)
    ties[2] = torch.tensor([3.0, 1, 3, 3, 0, 1, 3, 2, 2, 1, 0, 3], dtype=dtype)
    big = logits(6, 96)
    return [Sample("ties-lower-index", (ties, 3)), Sample("strided-rows", (big[:, :48], 4))]


def _routing_caller_buffers(logits: Logits, device: str) -> Sample:
    t, k = 7, 3
    wide = torch.zeros((t, 8), dtype=torch.float32, device=device)
    buffers = {
        "topk_weights": wide[:, 2 : 2 + k],  # a strided caller buffer (row stride 8)
        "topk_ids": torch.zeros((t, k), dtype=torch.int64, device=device),  # int64: written directly
        "token_expert_indices": torch.zeros((t, k), dtype=torch.int32, device=device),
    }
    return Sample("caller-buffers-int64-ids", (logits(t, 16), k), buffers)


def topk_softmax_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    g, logits = _routing_logits(device, dtype, 21)
    out = _routing_shapes(logits, large_magnitude=True)
    out += _routing_ties_strided(logits, device, dtype)
    bias = (torch.rand(64, generator=g) * 0.05).to(device)  # float32 whatever the gating dtype
    out += [
        Sample("softcap", (logits(5, 64, 40.0), 6), {"moe_softcapping": 30.0}),
        Sample("deepseek-bias", (logits(9, 64), 6), {"correction_bias": bias, "renormalize": True}),
        Sample("bias-on-logits", (logits(9, 64), 4), {"correction_bias": bias * 20, "bias_on_logits": True}),
        Sample("softcap-bias", (logits(3, 64, 40.0), 2), {"correction_bias": bias, "moe_softcapping": 20.0}),
    ]
    out.append(_routing_caller_buffers(logits, device))
    out.append(
        Sample(
            "int32-buffers-bias",
            (logits(4, 64), 5),
            {
                "correction_bias": bias,
                "topk_weights": torch.zeros((4, 5), device=device),
                "topk_ids": torch.zeros((4, 5), dtype=torch.int32, device=device),
            },
        )
    )
    return out


def topk_sigmoid_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    g, logits = _routing_logits(device, dtype, 23)
    out = _routing_shapes(logits, large_magnitude=False)
    out.append(Sample("k-40", (logits(2, 64), 40), {"renormalize": True}))  # k > 32: lane 0 writes the rest
    out += _routing_ties_strided(logits, device, dtype)
    bias = (torch.rand(64, generator=g) * 0.5).to(device)  # float32 whatever the gating dtype
    out += [
        Sample("bias", (logits(9, 64), 6), {"correction_bias": bias, "renormalize": True}),
        Sample("bias-no-renormalize", (logits(9, 64), 4), {"correction_bias": bias}),
        Sample(
            "bias-e-1500", (logits(2, 1500), 4), {"correction_bias": torch.rand(1500, generator=g).to(device)}
        ),
    ]
    out.append(_routing_caller_buffers(logits, device))
    return out


def batched_moe_align_block_size_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    g = torch.Generator(device="cpu").manual_seed(24)

    def counts(e: int, m: int, empty: bool = False) -> torch.Tensor:
        c = torch.randint(0, m + 1, (e,), generator=g, dtype=torch.int32)
        if empty:
            c[torch.randperm(e, generator=g)[: e // 2]] = 0
        return c.to(device)

    full = torch.full((8,), 13, dtype=torch.int32, device=device)
    out = [
        Sample("e8-m13-bs8", (counts(8, 13), 13, 8)),
        Sample("e16-m16-bs16-empty", (counts(16, 16, True), 16, 16)),
        Sample("e32-m512-bs64", (counts(32, 512), 512, 64)),
        Sample("e64-m16-bs32", (counts(64, 16, True), 16, 32)),
        Sample("all-full", (full, 13, 4)),
        Sample("all-empty", (torch.zeros(5, dtype=torch.int32, device=device), 7, 4)),
        Sample("one-expert-bs1", (counts(1, 9), 9, 1)),
    ]
    c = counts(6, 20)
    out.append(
        Sample(
            "caller-buffers-longer",
            (c, 20, 8),
            {
                "sorted_ids": torch.full((6 * 24 + 5,), 7777, dtype=torch.int32, device=device),
                "expert_ids": torch.full((6 * 3 + 2,), 7777, dtype=torch.int32, device=device),
                "num_tokens_post_padded": torch.zeros(1, dtype=torch.int32, device=device),
            },
        )
    )
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
    base = [
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
    out = list(base)
    emap = torch.full((16,), -1, dtype=torch.int32)
    emap[::2] = torch.arange(8, dtype=torch.int32)  # even experts live here, as 0..7
    emap_rev = torch.full((16,), -1, dtype=torch.int32)
    emap_rev[1::3] = torch.arange(5, dtype=torch.int32).flip(0)  # a non-monotone map
    ids = routed(40, 4, 16)
    n, bs, e = ids.numel(), 8, 16
    out += [
        Sample("expert-map", (ids, bs, e), {"expert_map": emap.to(device)}),
        Sample(
            "expert-map-non-monotone", (ids, 4, e), {"expert_map": emap_rev.to(device), "unused_expert_id": 0}
        ),
        Sample(
            "caller-buffers",
            (ids, bs, e),
            {
                "unused_expert_id": 0,
                "sorted_token_ids": torch.zeros(n + e * bs + 5, dtype=torch.int32, device=device),
                "expert_ids": torch.zeros((n + e * bs) // bs + 3, dtype=torch.int32, device=device),
                "num_tokens_post_padded": torch.zeros(2, dtype=torch.int32, device=device),
                "cumsum_buffer": torch.zeros(e + 1, dtype=torch.int32, device=device),
            },
        ),
        Sample(
            "no-pad-keeps-slots",
            (ids, bs, e),
            {
                "pad_sorted_token_ids": False,
                "sorted_token_ids": torch.full((n + e * (bs - 1),), 7777, dtype=torch.int32, device=device),
            },
        ),
    ]
    few = routed(2, 2, 64)  # T*k < E: buffers sized T*k*block_size suffice (vLLM's small-batch sizing)
    out.append(
        Sample(
            "small-batch-buffers",
            (few, 16, 64),
            {
                "sorted_token_ids": torch.zeros(4 * 16, dtype=torch.int32, device=device),
                "expert_ids": torch.zeros(4, dtype=torch.int32, device=device),
            },
        )
    )
    return out


def _routing_invalid(device: str) -> Invalid:
    """The routing ops' common contract cases (topk_softmax, topk_sigmoid)."""
    x = torch.randn(4, 16, device=device)
    return [
        ("int-dtype", (torch.ones(4, 16, dtype=torch.int32, device=device), 2), {}, TypeError, "dtype"),
        ("topk-too-large", (x, 17), {}, ValueError, "exceeds the number of experts"),
        ("topk-zero", (x, 0), {}, ValueError, "topk must be a positive int"),
        ("3d-shape", (torch.randn(2, 4, 16, device=device), 2), {}, ValueError, "expected \\[T, E\\]"),
        ("non-contiguous", (torch.randn(16, 4, device=device).t(), 2), {}, ValueError, "non-contiguous"),
        ("renormalize-int", (x, 2), {"renormalize": 1}, TypeError, "renormalize must be a bool"),
        (
            "bias-dtype",
            (x, 2),
            {"correction_bias": torch.zeros(16, device=device).half()},
            TypeError,
            "correction_bias",
        ),
        (
            "bias-shape",
            (x, 2),
            {"correction_bias": torch.zeros(15, device=device)},
            ValueError,
            "correction_bias",
        ),
        ("ids-buffer-float", (x, 2), {"topk_ids": torch.zeros(4, 2, device=device)}, TypeError, "topk_ids"),
        (
            "weights-buffer-shape",
            (x, 2),
            {"topk_weights": torch.zeros(4, 3, device=device)},
            ValueError,
            "topk_weights",
        ),
        (
            "tei-int64",
            (x, 2),
            {"token_expert_indices": torch.zeros(4, 2, dtype=torch.int64, device=device)},
            TypeError,
            "token_expert_indices",
        ),
    ]


def topk_softmax_invalid(device: str) -> Invalid:
    x = torch.randn(4, 16, device=device)
    return [
        *_routing_invalid(device),
        ("negative-softcap", (x, 2), {"moe_softcapping": -1.0}, ValueError, "moe_softcapping"),
        ("softcap-str", (x, 2), {"moe_softcapping": "1"}, TypeError, "moe_softcapping must be a float"),
        ("bias-on-logits-int", (x, 2), {"bias_on_logits": 1}, TypeError, "bias_on_logits must be a bool"),
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
        (
            "sorted-buffer-short",
            (ids, 16, 8),
            {"sorted_token_ids": torch.zeros(8, dtype=torch.int32, device=device)},
            ValueError,
            "sorted_token_ids",
        ),
        (
            "expert-map-shape",
            (ids, 16, 8),
            {"expert_map": torch.zeros(7, dtype=torch.int32, device=device)},
            ValueError,
            "expert_map",
        ),
        (
            "cumsum-short",
            (ids, 16, 8),
            {"cumsum_buffer": torch.zeros(8, dtype=torch.int32, device=device)},
            ValueError,
            "cumsum_buffer",
        ),
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
            (
                "expert-map-value",
                (ids, 16, 8),
                {"expert_map": torch.full((8,), 8, dtype=torch.int32, device=device)},
                ValueError,
                r"expert_map\[0\] = 8 is out of range",
            ),
        ]
    return cases


def topk_sigmoid_invalid(device: str) -> Invalid:
    return _routing_invalid(device)


def batched_moe_align_block_size_invalid(device: str) -> Invalid:
    c = torch.tensor([3, 0, 5, 2], dtype=torch.int32, device=device)
    cases: Invalid = [
        ("int64-counts", (c.long(), 8, 4), {}, TypeError, "dtype int64"),
        ("2d-counts", (c.view(2, 2), 8, 4), {}, ValueError, "expected \\[E\\]"),
        ("no-experts", (c[:0], 8, 4), {}, ValueError, "expected \\[E\\] with E >= 1"),
        (
            "strided-counts",
            (torch.zeros(8, dtype=torch.int32, device=device)[::2], 8, 4),
            {},
            ValueError,
            "dense",
        ),
        ("max-tokens-0", (c, 0, 4), {}, ValueError, "max_tokens_per_batch must be a positive int"),
        ("block-size-0", (c, 8, 0), {}, ValueError, "block_size must be a positive int"),
        (
            "sorted-short",
            (c, 8, 4),
            {"sorted_ids": torch.zeros(31, dtype=torch.int32, device=device)},
            ValueError,
            "sorted_ids has shape \\(31,\\), expected a vector of at least 32",
        ),
        (
            "expert-ids-int64",
            (c, 8, 4),
            {"expert_ids": torch.zeros(8, dtype=torch.int64, device=device)},
            TypeError,
            "expert_ids",
        ),
        ("too-large", (c, 2**30, 4), {}, ValueError, "do not fit int32"),
    ]
    if device == "cpu":  # on CUDA the kernels clamp counts (no sync to check them)
        cases += [
            (
                "count-past-max",
                (c, 4, 4),
                {},
                ValueError,
                r"expert_num_tokens\[2\] = 5 is out of range \[0, 4\]",
            ),
            ("negative-count", (-c, 8, 4), {}, ValueError, r"expert_num_tokens\[0\] = -3 is out of range"),
        ]
    return cases


# -- fused_experts: tiny shapes (the Triton interpreter runs them on the CPU) ---------------------
def _experts(
    m: int,
    k: int,
    n: int,
    e: int,
    topk: int,
    device: str,
    dtype: torch.dtype,
    seed: int,
    *,
    fp8: bool = False,
    ids_dtype: torch.dtype = torch.int32,
    n_ids: int = 0,
) -> tuple[torch.Tensor, ...]:
    """(hidden, w1, w2, topk_weights, topk_ids[, w1_scale, w2_scale]): outputs of order 1."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(m, k, generator=g)
    w1 = torch.randn(e, 2 * n, k, generator=g) * k**-0.5
    w2 = torch.randn(e, k, n, generator=g) * n**-0.5
    weights = torch.rand(m, topk, generator=g)
    ids = torch.stack([torch.randperm(n_ids or e, generator=g)[:topk] for _ in range(m)]) if m else None
    ids = (ids if ids is not None else torch.zeros(0, topk, dtype=torch.int64)).to(ids_dtype)
    out = [hidden.to(dtype), w1.to(dtype), w2.to(dtype), weights, ids]
    if fp8:
        s1 = torch.rand(e, -(-2 * n // 128), -(-k // 128), generator=g) * 0.02 + 0.01
        s2 = torch.rand(e, -(-k // 128), -(-n // 128), generator=g) * 0.02 + 0.01
        out[1] = (w1 / s1.repeat_interleave(128, 1)[:, : 2 * n].repeat_interleave(128, 2)[..., :k]).to(FP8)
        out[2] = (w2 / s2.repeat_interleave(128, 1)[:, :k].repeat_interleave(128, 2)[..., :n]).to(FP8)
        out += [s1, s2]
    return tuple(t.to(device) for t in out)


FP8 = torch.float8_e4m3fn


def _fp8_kw(case: tuple[torch.Tensor, ...]) -> tuple[tuple[torch.Tensor, ...], dict[str, object]]:
    return case[:5], {"w1_scale": case[5], "w2_scale": case[6]}


def fused_experts_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    out = [
        Sample("m1-silu", _experts(1, 64, 32, 4, 2, device, dtype, 0)),
        Sample("m5-gelu", _experts(5, 64, 48, 4, 2, device, dtype, 1), {"activation": "gelu"}),
        Sample("m4-swigluoai", _experts(4, 32, 32, 3, 2, device, dtype, 2), {"activation": "swigluoai"}),
        Sample("m9-topk3-int64", _experts(9, 48, 40, 6, 3, device, dtype, 3, ids_dtype=torch.int64)),
        Sample("empty-m", _experts(0, 64, 32, 4, 2, device, dtype, 4)),
    ]
    h, w1, w2, tw, ids = _experts(6, 64, 32, 4, 3, device, dtype, 5)
    ids[1] = ids[1, 0]  # one expert chosen three times for a token: three terms, as any other
    ids[4, 1] = ids[4, 0]
    out.append(Sample("repeated-experts", (h, w1, w2, tw, ids)))
    h, w1, w2, tw, ids = _experts(7, 64, 32, 4, 2, device, dtype, 6, n_ids=8)
    emap = torch.tensor([0, -1, 1, -1, 2, 3, -1, -1], dtype=torch.int32, device=device)
    out.append(Sample("expert-map", (h, w1, w2, tw, ids), {"expert_map": emap}))
    h, w1, w2, tw, ids = _experts(5, 64, 32, 4, 1, device, dtype, 7)
    out.append(Sample("router-weight-on-input", (h, w1, w2, tw, ids), {"apply_router_weight_on_input": True}))
    wide = _experts(5, 128, 32, 4, 2, device, dtype, 8)
    out.append(Sample("strided-hidden", (wide[0][:, :64], *_experts(5, 64, 32, 4, 2, device, dtype, 9)[1:])))
    caller = torch.full((3, 64), 7.0, dtype=dtype, device=device)
    out.append(Sample("caller-out", _experts(3, 64, 32, 4, 2, device, dtype, 11), {"out": caller}))
    args, kw = _fp8_kw(_experts(4, 256, 128, 4, 2, device, dtype, 12, fp8=True))
    out.append(Sample("fp8-block", args, kw))
    args, kw = _fp8_kw(_experts(5, 200, 72, 3, 2, device, dtype, 13, fp8=True))
    # the native CUDA decode kernels read whole 16-byte chunks of a row (K, N multiples of 16 here)
    chunks = (("cuda", "K=200, N=72: not whole 16-byte fp8 chunks"),)
    out.append(Sample("fp8-block-tails-k200-n72", args, {**kw, "activation": "gelu"}, skip=chunks))
    # vLLM's rounding points (its compat entry's): the activation rounded twice, fp8 scales divided
    out.append(Sample("vllm-rounding", _experts(5, 64, 48, 4, 2, device, dtype, 14), {"vllm_rounding": True}))
    args, kw = _fp8_kw(_experts(3, 256, 128, 4, 2, device, dtype, 15, fp8=True))
    out.append(Sample("fp8-vllm-rounding", args, {**kw, "vllm_rounding": True}))
    # the CUTLASS backend runs the fp8 form in whole 128-blocks only (its predicate says so)
    blocks = (("cutlass", "the fp8 block-scaled form in whole 128x128 blocks only"),)
    return [
        s if s.name in ("fp8-block", "fp8-vllm-rounding") else dataclasses.replace(s, skip=s.skip + blocks)
        for s in out
    ]


def fused_experts_invalid(device: str) -> Invalid:
    h, w1, w2, tw, ids = _experts(4, 64, 32, 4, 2, device, torch.bfloat16, 0)
    _, q1, q2, _, _, s1, s2 = _experts(4, 64, 32, 4, 2, device, torch.bfloat16, 0, fp8=True)
    cases: Invalid = [
        (
            "activation-relu",
            (h, w1, w2, tw, ids),
            {"activation": "relu"},
            ValueError,
            "'silu', 'gelu', 'swigluoai'",
        ),
        ("w1-odd-rows", (h, w1[:, :63], w2, tw, ids), {}, ValueError, r"expected \[E, 2N, K\]"),
        ("w2-shape", (h, w1, w2[:, :, :16], tw, ids), {}, ValueError, r"w2 has shape \(4, 64, 16\)"),
        ("w1-dtype", (h, w1.half(), w2, tw, ids), {}, TypeError, "w1 has dtype float16"),
        ("weights-fp16", (h, w1, w2, tw.half(), ids), {}, TypeError, "topk_weights has dtype float16"),
        ("ids-float", (h, w1, w2, tw, ids.float()), {}, TypeError, "int32 or int64"),
        ("ids-rows", (h, w1, w2, tw, ids[:3]), {}, ValueError, r"topk_ids has shape \(3, 2\)"),
        (
            "scales-with-bf16",
            (h, w1, w2, tw, ids),
            {"w1_scale": s1, "w2_scale": s2},
            ValueError,
            "fp8 weights",
        ),
        (
            "fp8-without-scales",
            (h, q1, q2, tw, ids),
            {},
            ValueError,
            r"fp8 weights need their 128x128 block scales: w1_scale \[E, cdiv\(2N, 128\)",
        ),
        ("fp8-one-scale", (h, q1, q2, tw, ids), {"w1_scale": s1}, ValueError, "fp8 weights need their"),
        (
            "fp8-scale-blocks",
            (h, q1, q2, tw, ids),
            {"w1_scale": s1[:, :0], "w2_scale": s2},
            ValueError,
            "w1_scale",
        ),
        (
            "weight-on-input-topk2",
            (h, w1, w2, tw, ids),
            {"apply_router_weight_on_input": True},
            ValueError,
            "needs topk == 1",
        ),
        (
            "w1-columns-strided",
            (h, w1.transpose(1, 2).contiguous().transpose(1, 2), w2, tw, ids),
            {},
            ValueError,
            "w1",
        ),
        ("out-shape", (h, w1, w2, tw, ids), {"out": h[:, :32]}, ValueError, r"out has shape \(4, 32\)"),
        (
            "expert-map-2d",
            (h, w1, w2, tw, ids),
            {"expert_map": ids},
            ValueError,
            r"expert_map has shape \(4, 2\)",
        ),
    ]
    empty_map = torch.zeros(0, dtype=torch.int32, device=device)
    cases.append(
        ("expert-map-empty", (h, w1, w2, tw, ids), {"expert_map": empty_map}, ValueError, "is empty")
    )
    if device == "cpu":  # on CUDA bad ids are skipped by the routing (no sync to check them)
        bad = ids.clone()
        bad[2, 1] = 4
        cases.append(
            ("id-past-experts", (h, w1, w2, tw, bad), {}, ValueError, r"topk_ids\[2, 1\] = 4 is out of range")
        )
        emap = torch.tensor([0, 1, 7, -1], dtype=torch.int32, device=device)
        cases.append(
            (
                "expert-map-value",
                (h, w1, w2, tw, ids),
                {"expert_map": emap},
                ValueError,
                r"expert_map\[2\] = 7",
            )
        )
    return cases
