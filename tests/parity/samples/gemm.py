"""Parity cases of the gemm ops: made fresh per call, on the requested device (tiny shapes: the
Triton interpreter runs them on the CPU). The H200 grid (vLLM's M, N, K) is in
tests/parity/test_gemm_grid.py."""

from __future__ import annotations

import torch

from opmux.kernels.ops._common import Sample

Invalid = list[tuple[str, tuple[object, ...], dict[str, object], type[Exception], str]]
FP8 = torch.float8_e4m3fn


def _case(
    m: int, n: int, k: int, device: str, seed: int, *, lead: tuple[int, ...] = ()
) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    kt, nt = -(-k // 128), -(-n // 128)
    a = torch.randn(*lead, m, k, generator=g).to(FP8)
    b = (torch.randn(n, k, generator=g) * 0.25).to(FP8)
    sa = torch.rand(*lead, m, kt, generator=g) + 0.5
    sb = torch.rand(nt, kt, generator=g) * 0.1 + 0.05
    return tuple(t.to(device) for t in (a, b, sa, sb))


# Cases outside a backend's stated coverage (its ``supports`` refuses them and the dispatcher moves
# on; forced, it says why): on a GPU the CUTLASS kernel (jit, aot) takes 16-byte row strides only
# (the CPU kernel behind the same names takes every layout), cuBLASLt (scaled_mm) K and N multiples
# of 16, K of 512 with several weight blocks, and bf16 results, the skinny-M kernel (skinny) at most
# 16 rows and K a multiple of 16.
_TMA_WHY = "the CUTLASS kernel needs row strides of 16 bytes"


def _tma(device: str) -> tuple[tuple[str, str], ...]:
    return (("jit", _TMA_WHY), ("aot", _TMA_WHY)) if torch.device(device).type == "cuda" else ()


def _cublas(why: str) -> tuple[tuple[str, str], ...]:
    return (("scaled_mm", why),)


def _skinny(why: str) -> tuple[tuple[str, str], ...]:
    return (("skinny", why),)


def w8a8_block_fp8_matmul_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    del dtype  # the operands are e4m3; the output dtype is a case of its own
    out = [
        Sample("m1", _case(1, 128, 128, device, 0)),
        Sample(
            "tails-m7-n200-k300",
            _case(7, 200, 300, device, 1),
            skip=_tma(device) + _cublas("K, N not multiples of 16") + _skinny("K not a multiple of 16"),
        ),
        Sample(
            "m33-fp16",
            _case(33, 256, 256, device, 2),
            {"out_dtype": torch.float16},
            skip=_cublas("fp16 out") + _skinny("33 rows"),
        ),
        Sample(
            "m5-fp32",
            _case(5, 130, 260, device, 3),
            {"out_dtype": torch.float32},
            skip=_tma(device) + _cublas("fp32 out") + _skinny("K not a multiple of 16"),
        ),
        Sample("k-below-block", _case(4, 64, 48, device, 4), skip=_cublas("K not a multiple of 128")),
        Sample("3d-leading", _case(3, 128, 256, device, 5, lead=(2,))),
        Sample("empty-m", _case(0, 128, 128, device, 6)),
    ]
    a, b, sa, sb = _case(9, 160, 384, device, 7)
    out.append(
        Sample(
            "scales-column-major", (a, b, sa.T.contiguous().T, sb), skip=_cublas("K=384, two weight blocks")
        )
    )
    wide = _case(6, 128, 512, device, 8)[0]
    out.append(Sample("strided-a-rows", (wide[:, :256], *_case(6, 128, 256, device, 9)[1:])))
    a, b, sa, sb = _case(3, 256, 128, device, 10)
    caller = torch.full((3, 256), 7.0, device=device)
    out.append(Sample("caller-out", (a, b, sa, sb), {"out": caller}, skip=_cublas("fp32 out")))
    out.append(
        Sample(
            "caller-out-bf16",
            _case(5, 256, 512, device, 11),
            {"out": torch.full((5, 256), 7.0, device=device, dtype=torch.bfloat16)},
        )
    )
    return out


def w8a8_block_fp8_matmul_invalid(device: str) -> Invalid:
    a, b, sa, sb = _case(4, 256, 256, device, 0)
    return [
        ("a-bf16", (a.to(torch.bfloat16), b, sa, sb), {}, TypeError, "dtype bfloat16.*float8_e4m3fn"),
        (
            "b-k-mismatch",
            (a, b[:, :128], sa, sb),
            {},
            ValueError,
            r"b has shape \(256, 128\), expected \[256, 256\]",
        ),
        (
            "a-scale-blocks",
            (a, b, sa[:, :1], sb),
            {},
            ValueError,
            r"a_scale has shape \(4, 1\), expected \[\.\.\., 2\]",
        ),
        (
            "b-scale-blocks",
            (a, b, sa, sb[:1]),
            {},
            ValueError,
            r"b_scale has shape \(1, 2\), expected \[2, 2\]",
        ),
        ("a-scale-fp16", (a, b, sa.half(), sb), {}, TypeError, "a_scale has dtype float16, expected float32"),
        (
            "a-scale-no-unit-stride",
            (a, b, torch.rand(4, 4, device=device)[:, ::2], sb),
            {},
            ValueError,
            "unit stride",
        ),
        ("b-scale-transposed", (a, b, sa, sb.T.contiguous().T[:, :]), {}, ValueError, "contiguous"),
        (
            "a-columns-strided",
            (torch.randn(4, 512).to(FP8).to(device)[:, ::2], b, sa, sb),
            {},
            ValueError,
            "last dimension",
        ),
        (
            "out-dtype-int",
            (a, b, sa, sb),
            {"out_dtype": torch.int8},
            TypeError,
            "out_dtype must be None or one of",
        ),
        (
            "out-and-dtype-disagree",
            (a, b, sa, sb),
            {"out": torch.empty(4, 256, device=device), "out_dtype": torch.float16},
            TypeError,
            "make them agree",
        ),
        (
            "out-shape",
            (a, b, sa, sb),
            {"out": torch.empty(4, 128, dtype=torch.bfloat16, device=device)},
            ValueError,
            r"out has shape \(4, 128\)",
        ),
        ("k-zero", (a[:, :0], b[:, :0], sa[:, :0], sb[:, :0]), {}, ValueError, "must be at least 1"),
    ]
