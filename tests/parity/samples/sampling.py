"""Parity cases of the sampling ops: made fresh per call, on the requested device.

The harness compares outputs exactly (ids) or at the op's tolerance, so the sampling ops' cases
are degenerate: after filtering one token holds all the mass (top_k = 1, a tiny top_p, min_p = 1,
a row with one positive probability), whatever the uniform draw. Their distributions are tested in
tests/unit/test_sampling_stats.py.
"""

from __future__ import annotations

import torch

from opmux.kernels.ops._common import Sample

Invalid = list[tuple[str, tuple[object, ...], dict[str, object], type[Exception], str]]
_F32 = torch.float32


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _probs(b: int, v: int, device: str, seed: int, scale: float = 2.0) -> torch.Tensor:
    x = torch.randn(b, v, generator=_gen(seed)) * scale
    return torch.softmax(x, -1).to(device)


def _rows(values: list[list[float]], device: str, dtype: torch.dtype = _F32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)


def _ints(values: list[int], device: str, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)


# -- top_k_renorm_probs ----------------------------------------------------------------------------
def top_k_renorm_probs_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    ties = _rows([[0.4, 0.2, 0.2, 0.1, 0.1], [0.2, 0.2, 0.2, 0.2, 0.2]], device)
    wide = _probs(3, 96, device, 3)
    return [
        Sample("k3-v40", (_probs(5, 40, device, 0),), {"top_k": 3}),
        Sample("k-per-row", (_probs(4, 33, device, 1),), {"top_k_arr": _ints([0, 1, 5, 33], device)}),
        Sample(
            "k-per-row-int64",
            (_probs(3, 16, device, 2),),
            {"top_k_arr": _ints([2, 16, 7], device, torch.int64)},
        ),
        Sample("ties-at-kth-kept", (ties,), {"top_k": 2}),
        Sample("k-off", (_probs(2, 24, device, 4),)),
        Sample("v1", (_probs(3, 1, device, 5),), {"top_k": 1}),
        Sample("v3000-blocks", (_probs(2, 3000, device, 6),), {"top_k": 50}),
        Sample("empty-batch", (_probs(0, 16, device, 7),), {"top_k": 2}),
        Sample("strided-rows", (wide[:, :64],), {"top_k": 7}),
        Sample(
            "caller-out", (_probs(3, 20, device, 8),), {"top_k": 4, "out": torch.zeros(3, 20, device=device)}
        ),
    ]


def top_k_renorm_probs_invalid(device: str) -> Invalid:
    p = _probs(2, 8, device, 0)
    return [
        ("fp16-probs", (p.half(),), {"top_k": 2}, TypeError, "dtype float16"),
        ("k-above-v", (p,), {"top_k": 9}, ValueError, r"top_k must be in \[0, V\]"),
        ("k-negative", (p,), {"top_k": -1}, ValueError, "top_k must be in"),
        ("both", (p,), {"top_k": 2, "top_k_arr": _ints([1, 2], device)}, ValueError, "not both"),
        ("arr-shape", (p,), {"top_k_arr": _ints([1, 2, 3], device)}, ValueError, "top_k_arr has shape"),
        ("arr-float", (p,), {"top_k_arr": torch.ones(2, device=device)}, TypeError, "int32 or int64"),
        ("one-dim", (p[0],), {"top_k": 2}, ValueError, "probs has shape"),
    ]


# -- top_p_renorm_probs ----------------------------------------------------------------------------
def top_p_renorm_probs_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    exact = _rows([[0.5, 0.25, 0.125, 0.125], [0.125, 0.25, 0.125, 0.5]], device)
    ties = _rows([[0.3, 0.3, 0.3, 0.1], [0.25, 0.25, 0.25, 0.25]], device)
    return [
        Sample("p0.5-v40", (_probs(5, 40, device, 10),), {"top_p": 0.5}),
        Sample(
            "p-per-row",
            (_probs(4, 33, device, 11),),
            {"top_p_arr": torch.tensor([0.1, 0.5, 0.9, 1.0], device=device)},
        ),
        Sample("dominant", (_rows([[0.9, 0.05, 0.05], [0.02, 0.96, 0.02]], device),), {"top_p": 0.5}),
        Sample("p-at-boundary", (exact,), {"top_p": 0.75}),
        Sample("ties-at-boundary-kept", (ties,), {"top_p": 0.35}),
        Sample("p-off", (_probs(2, 24, device, 12),), {"top_p": 1.0}),
        Sample("v3000-blocks", (_probs(2, 3000, device, 13, 4.0),), {"top_p": 0.8}),
        Sample("empty-batch", (_probs(0, 16, device, 14),), {"top_p": 0.5}),
        Sample(
            "caller-out",
            (_probs(3, 20, device, 15),),
            {"top_p": 0.3, "out": torch.zeros(3, 20, device=device)},
        ),
    ]


def top_p_renorm_probs_invalid(device: str) -> Invalid:
    p = _probs(2, 8, device, 0)
    return [
        ("p-zero", (p,), {"top_p": 0.0}, ValueError, "top_p must be"),
        ("p-above-1", (p,), {"top_p": 1.5}, ValueError, r"top_p must be in \(0, 1\]"),
        ("both", (p,), {"top_p": 0.5, "top_p_arr": torch.ones(2, device=device)}, ValueError, "not both"),
        ("arr-int", (p,), {"top_p_arr": _ints([1, 1], device)}, TypeError, "top_p_arr has dtype"),
        ("bf16-probs", (p.bfloat16(),), {"top_p": 0.5}, TypeError, "dtype bfloat16"),
    ]


# -- top_k_mask_logits -----------------------------------------------------------------------------
def top_k_mask_logits_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    def logits(b: int, v: int, seed: int) -> torch.Tensor:
        return (torch.randn(b, v, generator=_gen(seed)) * 3).to(dtype=dtype, device=device)

    ties = _rows([[1.0, 3.0, 2.0, 3.0, 2.0, -1.0], [-2.0, -2.0, -2.0, -5.0, -2.0, -3.0]], device, dtype)
    inf = logits(2, 12, 24)
    inf[0, ::2] = -torch.inf
    inf[1, 3] = torch.inf
    return [
        Sample("k5-v40", (logits(5, 40, 20),), {"top_k": 5}),
        Sample("k-per-row", (logits(4, 33, 21),), {"top_k_arr": _ints([0, 1, 5, 33], device)}),
        Sample("ties-kept-negative", (ties,), {"top_k": 2}),
        Sample("infinities", (inf,), {"top_k": 3}),
        Sample("k-off", (logits(2, 24, 22),)),
        Sample("v3000-blocks", (logits(2, 3000, 23),), {"top_k": 20}),
        Sample("empty-batch", (logits(0, 16, 25),), {"top_k": 2}),
        Sample("strided-rows", (logits(3, 96, 26)[:, :50],), {"top_k": 4}),
        Sample(
            "caller-out",
            (logits(3, 20, 27),),
            {"top_k": 4, "out": torch.zeros(3, 20, dtype=dtype, device=device)},
        ),
    ]


def top_k_mask_logits_invalid(device: str) -> Invalid:
    x = torch.randn(2, 8, device=device)
    return [
        ("int-logits", (x.int(),), {"top_k": 2}, TypeError, "dtype int32"),
        ("k-above-v", (x,), {"top_k": 9}, ValueError, "top_k must be in"),
        ("out-dtype", (x,), {"top_k": 2, "out": x.half()}, TypeError, "out has dtype"),
    ]


# -- greedy ----------------------------------------------------------------------------------------
def greedy_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    def logits(b: int, v: int, seed: int) -> torch.Tensor:
        return (torch.randn(b, v, generator=_gen(seed)) * 3).to(dtype=dtype, device=device)

    ties = _rows([[1.0, 3.0, 2.0, 3.0], [-1.0, -1.0, -1.0, -1.0], [-torch.inf] * 4], device, dtype)
    far = logits(2, 3000, 31)
    far[:, 2500] = 50.0
    far[1, 7] = 50.0  # equal maxima in different blocks: the lower index
    return [
        Sample("v40", (logits(5, 40, 30),)),
        Sample("ties-lowest-index", (ties,)),
        Sample("v3000-blocks", (far,)),
        Sample("probs", (_probs(3, 17, device, 32).to(dtype),)),
        Sample("empty-batch", (logits(0, 8, 33),)),
        Sample("strided-rows", (logits(3, 64, 34)[:, :40],)),
    ]


def greedy_invalid(device: str) -> Invalid:
    x = torch.randn(2, 8, device=device)
    return [
        ("int-logits", (x.int(),), {}, TypeError, "dtype int32"),
        (
            "out-int64",
            (x,),
            {"out": torch.zeros(2, dtype=torch.int64, device=device)},
            TypeError,
            "out has dtype",
        ),
        ("zero-columns", (x[:, :0],), {}, ValueError, "V >= 1"),
    ]


# -- sampling (degenerate: the id is determined) --------------------------------------------------
def _one_hot_rows(device: str) -> torch.Tensor:
    p = torch.zeros(3, 24, device=device)
    p[0, 5] = p[1, 23] = p[2, 0] = 1.0
    return p


def top_k_top_p_sampling_from_probs_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    seed = torch.tensor([1234], dtype=torch.int64, device=device)
    offset = torch.tensor([2**40 + 3], dtype=torch.int64, device=device)
    return [
        Sample("k1", (_probs(6, 40, device, 40),), {"top_k": 1, "seed": 7}),
        Sample("tiny-p", (_probs(5, 33, device, 41),), {"top_p": 1e-4, "seed": 8, "offset": 5}),
        Sample("tiny-p-joint", (_probs(4, 33, device, 42),), {"top_k": 10, "top_p": 1e-4, "filter_apply_order": "joint"}),
        Sample("k1-per-row-tensors", (_probs(3, 50, device, 43),), {"top_k_arr": _ints([1, 1, 1], device), "seed_tensor": seed, "offset_tensor": offset}),
        Sample("p-per-row", (_probs(3, 20, device, 44),), {"top_p_arr": torch.full((3,), 1e-3, device=device), "top_k": 5}),
        Sample("one-token-rows", (_one_hot_rows(device),), {"seed": 3}),
        Sample("v3000-blocks-k1", (_probs(2, 3000, device, 45),), {"top_k": 1, "top_p": 0.5}),
        Sample("empty-batch", (_probs(0, 16, device, 46),), {"top_k": 1}),
    ]  # fmt: skip


def top_k_top_p_sampling_from_probs_invalid(device: str) -> Invalid:
    p = _probs(2, 8, device, 0)
    seed = torch.tensor([1], device=device)
    return [
        ("order", (p,), {"filter_apply_order": "top_p_first"}, ValueError, "'top_k_first', 'joint'"),
        ("seed-both", (p,), {"seed": 1, "seed_tensor": seed}, ValueError, "not both"),
        ("seed-int32", (p,), {"seed_tensor": seed.int()}, TypeError, "seed_tensor has dtype int32"),
        ("seed-float", (p,), {"seed": 1.5}, ValueError, "seed must be an int64"),
        (
            "offset-two",
            (p,),
            {"offset_tensor": torch.tensor([1, 2], device=device)},
            ValueError,
            "offset_tensor",
        ),
        ("p-zero", (p,), {"top_p": 0.0}, ValueError, "top_p must be"),
        ("k-above-v", (p,), {"top_k": 10}, ValueError, "top_k must be in"),
    ]


def min_p_sampling_from_probs_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    return [
        Sample("min-p-1", (_probs(6, 40, device, 50),), {"min_p": 1.0, "seed": 11}),
        Sample(
            "min-p-per-row",
            (_probs(3, 40, device, 51),),
            {"min_p_arr": torch.ones(3, device=device), "offset": 9},
        ),
        Sample(
            "dominant", (_rows([[0.01, 0.97, 0.01, 0.01], [0.98, 0.0, 0.01, 0.01]], device),), {"min_p": 0.5}
        ),
        Sample("one-token-rows", (_one_hot_rows(device),), {"seed_tensor": torch.tensor([5], device=device)}),
        Sample("v3000-blocks", (_probs(2, 3000, device, 52),), {"min_p": 1.0}),
        Sample("empty-batch", (_probs(0, 16, device, 53),), {"min_p": 0.5}),
    ]


def min_p_sampling_from_probs_invalid(device: str) -> Invalid:
    p = _probs(2, 8, device, 0)
    return [
        ("min-p-above-1", (p,), {"min_p": 1.5}, ValueError, r"min_p must be in \[0, 1\]"),
        ("min-p-negative", (p,), {"min_p": -0.1}, ValueError, "min_p must be"),
        ("both", (p,), {"min_p": 0.5, "min_p_arr": torch.ones(2, device=device)}, ValueError, "not both"),
        ("fp16", (p.half(),), {}, TypeError, "dtype float16"),
    ]
