"""Parity cases for the quantization ops: made fresh per call, on the requested device."""

from __future__ import annotations

import torch

from opmux.kernels.ops._common import Sample

Invalid = list[tuple[str, tuple[object, ...], dict[str, object], type[Exception], str]]
FP8 = torch.float8_e4m3fn

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


def _f32(*v: float, device: str) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.float32, device=device)


def per_token_quant_fp8_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    g = torch.Generator(device="cpu").manual_seed(11)
    out = [Sample(n, (_randn(s, dtype, device, g),)) for n, s in _SHAPES]
    out.append(Sample("large-magnitude", (_randn((4, 256), dtype, device, g, 1e3),)))
    zeros = _randn((3, 40), dtype, device, g)
    zeros[1].zero_()  # all-zero row: scale is the minimum, q is 0
    out.append(Sample("zero-row", (zeros,)))
    big = _randn((6, 320), dtype, device, g)
    out.append(Sample("strided-rows", (big[:, :160],)))
    ub = _f32(0.5, device=device)  # clips: q saturates at 448
    out.append(Sample("scale-ub", (_randn((4, 96), dtype, device, g, 2.0), ub)))
    ub0 = torch.tensor(0.5, dtype=torch.float32, device=device)  # vLLM passes a 0-dim tensor
    out.append(Sample("scale-ub-0-dim", (_randn((4, 96), dtype, device, g, 2.0), ub0)))
    out.append(Sample("hidden-8192", (_randn((2, 8192), dtype, device, g),)))
    out.append(Sample("divide", (_randn((5, 200), dtype, device, g, 3.0),), {"divide_by_scale": True}))
    out.append(
        Sample("divide-hidden-20000", (_randn((2, 20000), dtype, device, g),), {"divide_by_scale": True})
    )
    # caller's buffers: q rows of a padded buffer (vLLM's num_token_padding), scales [T]
    x = _randn((3, 64), dtype, device, g)
    q_pad = torch.zeros((5, 64), dtype=FP8, device=device)
    out.append(
        Sample(
            "out-padded",
            (x,),
            {"out_q": q_pad[:3], "out_scale": torch.zeros(3, dtype=torch.float32, device=device)},
        )
    )
    out.append(
        Sample(
            "out-3d-divide",
            (_randn((2, 3, 48), dtype, device, g),),
            {
                "divide_by_scale": True,
                "out_q": torch.zeros((2, 3, 48), dtype=FP8, device=device),
                "out_scale": torch.zeros((2, 3, 1), dtype=torch.float32, device=device),
            },
        )
    )
    out.append(
        Sample(
            "out-scale-only",
            (_randn((4, 32), dtype, device, g),),
            {"out_scale": torch.zeros((4, 1), dtype=torch.float32, device=device)},
        )
    )
    return out


def per_tensor_quant_fp8_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    g = torch.Generator(device="cpu").manual_seed(13)
    out = [Sample(n, (_randn(s, dtype, device, g),)) for n, s in _SHAPES if n != "empty-batch"]
    out.append(Sample("large-magnitude", (_randn((4, 256), dtype, device, g, 1e3),)))
    big = _randn((6, 320), dtype, device, g)
    out.append(Sample("strided-rows", (big[:, :160],)))
    out.append(Sample("many-rows", (_randn((300, 40), dtype, device, g),)))
    out.append(Sample("static", (_randn((4, 96), dtype, device, g, 2.0), _f32(0.01, device=device))))
    out.append(
        Sample("static-saturates", (_randn((4, 96), dtype, device, g, 5.0), _f32(1e-3, device=device)))
    )
    out.append(Sample("static-0-dim", (_randn((3, 33), dtype, device, g), torch.tensor(0.02, device=device))))
    out.append(Sample("static-empty", (_randn((0, 16), dtype, device, g), _f32(0.5, device=device))))
    out.append(
        Sample(
            "out-dynamic",
            (_randn((3, 64), dtype, device, g),),
            {
                "out_q": torch.zeros((6, 64), dtype=FP8, device=device)[::2],
                "out_scale": torch.zeros(1, dtype=torch.float32, device=device),
            },
        )
    )
    out.append(
        Sample(
            "out-static",
            (_randn((3, 64), dtype, device, g), _f32(0.005, device=device)),
            {
                "out_q": torch.zeros((3, 64), dtype=FP8, device=device),
                "out_scale": torch.zeros(1, dtype=torch.float32, device=device),
            },
        )
    )
    return out


def static_quant_fp8_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    g = torch.Generator(device="cpu").manual_seed(15)

    def sc(*shape: int) -> torch.Tensor:
        return (torch.rand(shape, generator=g) * 0.02 + 0.001).to(device=device)

    out = [
        Sample("per-tensor", (_randn((4, 96), dtype, device, g), sc(1))),
        Sample("per-tensor-0-dim", (_randn((3, 33), dtype, device, g), sc(1).reshape(()))),
        Sample("per-tensor-2d", (_randn((3, 40), dtype, device, g), sc(1, 1))),
        Sample("per-token", (_randn((6, 64), dtype, device, g), sc(6, 1))),
        Sample("per-channel", (_randn((5, 48), dtype, device, g), sc(1, 48))),
        Sample("blocks-2x4", (_randn((8, 64), dtype, device, g), sc(4, 4))),
        Sample("blocks-odd-group-7", (_randn((6, 21), dtype, device, g), sc(3, 3))),
        Sample("scale-strided", (_randn((4, 64), dtype, device, g), sc(4, 2).t().contiguous().t())),
        Sample("3d-leading", (_randn((2, 3, 32), dtype, device, g), sc(3, 2))),
        Sample("saturates", (_randn((4, 32), dtype, device, g, 10.0), sc(2, 2) * 0.01)),
        Sample("empty-batch", (_randn((0, 32), dtype, device, g), sc(1, 2))),
        Sample("strided-rows", (_randn((6, 320), dtype, device, g)[:, :160], sc(3, 5))),
        Sample("hidden-4099", (_randn((2, 4099), dtype, device, g), sc(1, 1))),
        Sample(
            "out",
            (_randn((5, 64), dtype, device, g), sc(5, 2)),
            {"out": torch.zeros((10, 64), dtype=FP8, device=device)[::2]},
        ),
    ]
    return out


def _group_cases(device: str, dtype: torch.dtype, g: torch.Generator) -> list[Sample]:
    """Cases every group op takes (fp8 and int8)."""
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
            "tma-aligned",
            (_randn((5, 256), dtype, device, g),),
            {"group_size": 64, "column_major_scales": True, "scale_tma_aligned": True},
        ),
        Sample(
            "tma-aligned-3d",
            (_randn((2, 3, 64), dtype, device, g),),
            {"group_size": 16, "column_major_scales": True, "scale_tma_aligned": True},
        ),
        Sample(
            "eps-zero-group",
            (torch.zeros((2, 256), dtype=dtype, device=device),),
            {"group_size": 128, "eps": 1e-4},
        ),
    ]
    big = _randn((6, 512), dtype, device, g)
    out.append(Sample("strided-rows", (big[:, :256],), {"group_size": 128}))
    # decode-size wide rows: the CUDA kernel splits each row over several blocks (224 threads x 4
    # for 16-bit 7168, 256 x 7 for fp32; 256 x 2 / x 4 at 4096), groups never across blocks
    out.append(Sample("wide-rows-split", (_randn((3, 7168), dtype, device, g),), {"group_size": 128}))
    out.append(
        Sample(
            "wide-rows-split-column-major",
            (_randn((2, 4096), dtype, device, g, 3.0),),
            {"group_size": 128, "column_major_scales": True},
        )
    )
    return out


def _tma_scales(t: int, groups: int, device: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """sgl's TMA-aligned column-major scales: a [T, G] view of [G, ceil(T / 4) * 4]."""
    m = (t + 3) // 4 * 4
    return torch.zeros((groups, m), dtype=dtype, device=device).t()[:t]


def per_token_group_quant_fp8_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    g = torch.Generator(device="cpu").manual_seed(12)
    out = _group_cases(device, dtype, g)
    out += [
        Sample("ue8m0", (_randn((4, 256), dtype, device, g, 5.0),), {"group_size": 64, "scale_ue8m0": True}),
        Sample(
            "ue8m0-tma",
            (_randn((6, 512), dtype, device, g),),
            {"group_size": 128, "column_major_scales": True, "scale_tma_aligned": True, "scale_ue8m0": True},
        ),
        Sample(
            "divide", (_randn((4, 256), dtype, device, g, 3.0),), {"group_size": 32, "divide_by_scale": True}
        ),
        Sample(
            "out-tma",
            (_randn((5, 128), dtype, device, g),),
            {
                "group_size": 32,
                "out_q": torch.zeros((5, 128), dtype=FP8, device=device),
                "out_scale": _tma_scales(5, 4, device),
            },
        ),
        # sgl-kernel's packed UE8M0: int32 [T, ceil(G / 4)], TMA-aligned column-major
        Sample(
            "out-packed-ue8m0",
            (_randn((5, 1024), dtype, device, g, 4.0),),
            {"group_size": 128, "scale_ue8m0": True, "out_scale": _tma_scales(5, 2, device, torch.int32)},
        ),
        Sample(
            "out-packed-ue8m0-wide-rows-split",
            (_randn((2, 4096), dtype, device, g, 4.0),),
            {"group_size": 128, "scale_ue8m0": True, "out_scale": _tma_scales(2, 8, device, torch.int32)},
        ),
        Sample(
            "out-packed-ue8m0-one-column",
            (_randn((5, 512), dtype, device, g),),
            {"group_size": 128, "scale_ue8m0": True, "out_scale": _tma_scales(5, 1, device, torch.int32)},
        ),
        Sample(
            "out-packed-ue8m0-g6",
            (_randn((3, 96), dtype, device, g),),
            {
                "group_size": 16,
                "scale_ue8m0": True,
                "out_scale": torch.zeros((3, 2), dtype=torch.int32, device=device),
            },
        ),
        Sample(
            "out-q-strided-divide",
            (_randn((3, 64), dtype, device, g),),
            {
                "group_size": 16,
                "divide_by_scale": True,
                "out_q": torch.zeros((3, 128), dtype=FP8, device=device)[:, :64],
            },
        ),
    ]
    return out


def per_token_group_quant_int8_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    g = torch.Generator(device="cpu").manual_seed(14)
    out = _group_cases(device, dtype, g)
    out.append(
        Sample(
            "out-tma",
            (_randn((5, 128), dtype, device, g, 2.0),),
            {
                "group_size": 32,
                "out_q": torch.zeros((5, 128), dtype=torch.int8, device=device),
                "out_scale": _tma_scales(5, 4, device),
            },
        )
    )
    out.append(
        Sample(
            "out-scale-row-major-3d",
            (_randn((2, 2, 64), dtype, device, g),),
            {"group_size": 32, "out_scale": torch.zeros((2, 2, 2), dtype=torch.float32, device=device)},
        )
    )
    return out


def silu_and_mul_per_token_group_quant_fp8_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    g = torch.Generator(device="cpu").manual_seed(16)

    def pairs(rows: int | tuple[int, ...], d: int, scale: float = 2.0) -> torch.Tensor:
        shape = (rows,) if isinstance(rows, int) else rows
        return _randn((*shape, 2 * d), dtype, device, g, scale)

    big = pairs(6, 512)
    return [
        Sample("1-token", (pairs(1, 128),), {}),
        Sample("serving-4-tokens", (pairs(4, 1024),), {"group_size": 128}),
        Sample("group-64", (pairs(3, 256),), {"group_size": 64}),
        Sample("group-256", (pairs(2, 512),), {"group_size": 256}),
        Sample("group-512", (pairs(2, 1024),), {"group_size": 512}),
        Sample("odd-group-7", (pairs(3, 21),), {"group_size": 7}),
        Sample("odd-half-width-3", (pairs(5, 3),), {"group_size": 1}),
        Sample("3d-leading", (pairs((2, 3), 128),), {"group_size": 64}),
        Sample("empty-batch", (pairs(0, 256),), {}),
        Sample("large-magnitude", (pairs(4, 256, 1e2),), {}),
        Sample("eps-zero-group", (torch.zeros((2, 512), dtype=dtype, device=device),), {"eps": 1e-4}),
        Sample("strided-rows", (big[:, :512],), {"group_size": 128}),
        # rows that start one element off a 16-byte boundary: the CUDA kernel's scalar path
        Sample("unaligned-rows", (pairs(3, 129)[:, 1:257],), {"group_size": 64}),
        Sample("column-major", (pairs(5, 384),), {"column_major_scales": True}),
        Sample(
            "tma-aligned",
            (pairs(5, 256),),
            {"group_size": 64, "column_major_scales": True, "scale_tma_aligned": True},
        ),
        Sample("ue8m0", (pairs(4, 256, 5.0),), {"group_size": 64, "scale_ue8m0": True}),
        Sample(
            "ue8m0-tma",
            (pairs(6, 512),),
            {"column_major_scales": True, "scale_tma_aligned": True, "scale_ue8m0": True},
        ),
        Sample(
            "out-packed-ue8m0",
            (pairs(5, 1024, 4.0),),
            {"scale_ue8m0": True, "out_scale": _tma_scales(5, 2, device, torch.int32)},
        ),
        Sample(
            "out-packed-ue8m0-wide-rows",
            (pairs(2, 4096, 4.0),),
            {"scale_ue8m0": True, "out_scale": _tma_scales(2, 8, device, torch.int32)},
        ),
        # one packed int32 column (<= 4 groups), column-major: the view the reference must not
        # take of a [T, 1] tensor whose stride(-1) is T
        Sample(
            "out-packed-ue8m0-one-column",
            (pairs(5, 512),),
            {"scale_ue8m0": True, "out_scale": _tma_scales(5, 1, device, torch.int32)},
        ),
        Sample(
            "out-q-strided",
            (pairs(3, 64),),
            {"group_size": 16, "out_q": torch.zeros((3, 128), dtype=FP8, device=device)[:, :64]},
        ),
    ]


def silu_and_mul_per_token_group_quant_fp8_invalid(device: str) -> Invalid:
    x = torch.randn(4, 512, device=device)
    return [
        ("odd-last-dim", (torch.randn(4, 255, device=device),), {}, ValueError, "must be even"),
        (
            "half-not-multiple",
            (torch.randn(4, 200, device=device),),
            {"group_size": 64},
            ValueError,
            "not a multiple",
        ),
        ("int-dtype", (torch.ones(4, 256, dtype=torch.int64, device=device),), {}, TypeError, "dtype"),
        ("bad-group-size", (x,), {"group_size": 0}, ValueError, "group_size must be a positive int"),
        ("negative-eps", (x,), {"eps": -1.0}, ValueError, "eps must be"),
        ("non-contiguous", (torch.randn(512, 4, device=device).t(),), {}, ValueError, "non-contiguous"),
        ("tma-row-major", (x,), {"scale_tma_aligned": True}, ValueError, "needs column_major_scales"),
        (
            "out-q-full-width",
            (x,),
            {"out_q": torch.empty(4, 512, dtype=FP8, device=device)},
            ValueError,
            "out_q has shape",
        ),
        (
            "out-scale-shape",
            (x,),
            {"out_scale": torch.empty(4, 4, device=device)},
            ValueError,
            "out_scale has shape",
        ),
        (
            "packed-without-ue8m0",
            (x,),
            {"out_scale": torch.empty(4, 1, dtype=torch.int32, device=device)},
            TypeError,
            "needs scale_ue8m0",
        ),
    ]


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
        ("divide-not-bool", (x,), {"divide_by_scale": 1}, TypeError, "divide_by_scale must be a bool"),
        ("out-q-dtype", (x,), {"out_q": torch.empty(4, 16, device=device)}, TypeError, "out_q has dtype"),
        (
            "out-q-shape",
            (x,),
            {"out_q": torch.empty(4, 8, dtype=FP8, device=device)},
            ValueError,
            "out_q has shape",
        ),
        (
            "out-scale-numel",
            (x,),
            {"out_scale": torch.empty(5, device=device)},
            ValueError,
            "out_scale has shape",
        ),
        (
            "out-scale-strided",
            (x,),
            {"out_scale": torch.empty(8, device=device)[::2]},
            ValueError,
            "cannot be viewed",
        ),
    ]


def per_tensor_quant_fp8_invalid(device: str) -> Invalid:
    x = torch.randn(4, 16, device=device)
    return [
        ("int-dtype", (torch.ones(4, 16, dtype=torch.int32, device=device),), {}, TypeError, "dtype"),
        (
            "scale-dtype",
            (x, torch.ones(1, dtype=torch.float16, device=device)),
            {},
            TypeError,
            "scale has dtype",
        ),
        ("scale-shape", (x, torch.ones(2, device=device)), {}, ValueError, "scale has shape"),
        ("empty-hidden", (torch.randn(4, 0, device=device),), {}, ValueError, "H >= 1"),
        (
            "out-scale-numel",
            (x,),
            {"out_scale": torch.empty(2, device=device)},
            ValueError,
            "out_scale has shape",
        ),
        (
            "out-q-dtype",
            (x,),
            {"out_q": torch.empty(4, 16, dtype=torch.int8, device=device)},
            TypeError,
            "out_q",
        ),
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
        ("tma-row-major", (x,), {"scale_tma_aligned": True}, ValueError, "needs column_major_scales"),
        (
            "packed-without-ue8m0",
            (x,),
            {"out_scale": torch.empty(4, 1, dtype=torch.int32, device=device)},
            TypeError,
            "needs scale_ue8m0",
        ),
        (
            "out-scale-shape",
            (x,),
            {"out_scale": torch.empty(4, 3, device=device)},
            ValueError,
            "out_scale has shape",
        ),
        (
            "out-scale-overlap",
            (x,),
            {"out_scale": torch.empty(1, device=device).expand(4, 2)},
            ValueError,
            "overlapping",
        ),
    ]


def per_token_group_quant_int8_invalid(device: str) -> Invalid:
    x = torch.randn(4, 256, device=device)
    return [
        (
            "not-multiple",
            (torch.randn(4, 100, device=device),),
            {"group_size": 64},
            ValueError,
            "not a multiple",
        ),
        (
            "out-q-fp8",
            (x,),
            {"out_q": torch.empty(4, 256, dtype=FP8, device=device)},
            TypeError,
            "out_q has dtype",
        ),
        (
            "packed-scales",
            (x,),
            {"out_scale": torch.empty(4, 1, dtype=torch.int32, device=device)},
            TypeError,
            "needs scale_ue8m0",
        ),
    ]


def static_quant_fp8_invalid(device: str) -> Invalid:
    x = torch.randn(4, 64, device=device)
    return [
        (
            "int-dtype",
            (torch.ones(4, 16, dtype=torch.int32, device=device), torch.ones(1, device=device)),
            {},
            TypeError,
            "dtype",
        ),
        (
            "scale-dtype",
            (x, torch.ones(1, dtype=torch.float16, device=device)),
            {},
            TypeError,
            "scale has dtype",
        ),
        ("scale-not-dividing", (x, torch.ones(3, 2, device=device)), {}, ValueError, "must divide"),
        ("scale-3d", (x, torch.ones(1, 1, 1, device=device)), {}, ValueError, "expected one element or"),
        ("scale-1d", (x, torch.ones(4, device=device)), {}, ValueError, "expected one element or"),
        (
            "out-dtype",
            (x, torch.ones(1, device=device)),
            {"out": torch.empty(4, 64, device=device)},
            TypeError,
            "out has dtype",
        ),
    ]
