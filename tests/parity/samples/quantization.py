"""Parity cases for the fp8 quantization ops: made fresh per call, on the requested device."""

from __future__ import annotations

import torch

from opmux.kernels.ops._common import Sample

Invalid = list[tuple[str, tuple[object, ...], dict[str, object], type[Exception], str]]

_SHAPES = (
    ("1-token", (1, 64)),
    ("odd-hidden-7", (3, 7)),
    ("odd-hidden-129", (5, 129)),
    ("3d-leading", (2, 3, 96)),
    ("hidden-4099", (2, 4099)),
    ("empty-batch", (0, 64)),
)


def _randn(
    shape: tuple[int, ...], dtype: torch.dtype, device: str, g: torch.Generator, scale: float = 1.0
) -> torch.Tensor:
    return (torch.randn(shape, generator=g) * scale).to(dtype=dtype, device=device)


def per_token_quant_fp8_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    g = torch.Generator(device="cpu").manual_seed(11)
    out = [Sample(n, (_randn(s, dtype, device, g),)) for n, s in _SHAPES]
    out.append(Sample("large-magnitude", (_randn((4, 256), dtype, device, g, 1e3),)))
    zeros = _randn((3, 40), dtype, device, g)
    zeros[1].zero_()  # all-zero row: scale is the minimum, q is 0
    out.append(Sample("zero-row", (zeros,)))
    big = _randn((6, 320), dtype, device, g)
    out.append(Sample("strided-rows", (big[:, :160],)))
    ub = torch.tensor([0.5], dtype=torch.float32, device=device)  # clips: q saturates at 448
    out.append(Sample("scale-ub", (_randn((4, 96), dtype, device, g, 2.0), ub)))
    out.append(Sample("hidden-8192", (_randn((2, 8192), dtype, device, g),)))
    return out


def per_token_group_quant_fp8_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    g = torch.Generator(device="cpu").manual_seed(12)
    out = [
        Sample("1-token", (_randn((1, 256), dtype, device, g),), {"group_size": 128}),
        Sample("odd-group-7", (_randn((3, 21), dtype, device, g),), {"group_size": 7}),
        Sample("group-32", (_randn((5, 96), dtype, device, g),), {"group_size": 32}),
        Sample("3d-leading", (_randn((2, 3, 128), dtype, device, g),), {"group_size": 64}),
        Sample("empty-batch", (_randn((0, 256), dtype, device, g),), {"group_size": 128}),
        Sample("large-magnitude", (_randn((4, 256), dtype, device, g, 1e3),), {"group_size": 128}),
        Sample(
            "column-major",
            (_randn((5, 384), dtype, device, g),),
            {"group_size": 128, "column_major_scales": True},
        ),
        Sample(
            "column-major-1-token",
            (_randn((1, 256), dtype, device, g),),
            {"group_size": 128, "column_major_scales": True},
        ),
        Sample(
            "eps-zero-group",
            (torch.zeros((2, 256), dtype=dtype, device=device),),
            {"group_size": 128, "eps": 1e-4},
        ),
    ]
    big = _randn((6, 512), dtype, device, g)
    out.append(Sample("strided-rows", (big[:, :256],), {"group_size": 128}))
    return out


def per_token_quant_fp8_invalid(device: str) -> Invalid:
    x = torch.randn(4, 16, device=device)
    return [
        ("int-dtype", (torch.ones(4, 16, dtype=torch.int32, device=device),), {}, TypeError, "dtype"),
        ("non-contiguous", (torch.randn(16, 4, device=device).t(),), {}, ValueError, "non-contiguous"),
        (
            "ub-dtype",
            (x, torch.ones(1, dtype=torch.float16, device=device)),
            {},
            TypeError,
            "scale_ub has dtype",
        ),
        ("ub-shape", (x, torch.ones(2, device=device)), {}, ValueError, "scale_ub has shape"),
        ("empty-hidden", (torch.randn(4, 0, device=device),), {}, ValueError, "H >= 1"),
        ("not-a-tensor", ([1.0, 2.0],), {}, TypeError, "Tensor"),
    ]


def per_token_group_quant_fp8_invalid(device: str) -> Invalid:
    x = torch.randn(4, 256, device=device)
    return [
        (
            "not-multiple",
            (torch.randn(4, 100, device=device),),
            {"group_size": 64},
            ValueError,
            "not a multiple",
        ),
        ("int-dtype", (torch.ones(4, 128, dtype=torch.int64, device=device),), {}, TypeError, "dtype"),
        ("bad-group-size", (x,), {"group_size": 0}, ValueError, "group_size must be a positive int"),
        ("negative-eps", (x,), {"eps": -1.0}, ValueError, "eps must be"),
        ("non-contiguous", (torch.randn(256, 4, device=device).t(),), {}, ValueError, "non-contiguous"),
    ]
