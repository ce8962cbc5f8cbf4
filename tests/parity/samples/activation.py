"""Parity cases for the gated activations: made fresh per call, on the requested device.

All three ops take the same inputs, so they share one case list; the gelu ops get extra
gate values around the erf / tanh knees."""

from __future__ import annotations

import torch

from opmux.kernels.ops._common import Sample

_SHAPES = (
    ("1-token", (1, 128)),
    ("odd-d-7", (3, 14)),
    ("odd-d-129", (5, 258)),
    ("3d-leading", (2, 3, 192)),
    ("d-4099", (2, 8198)),
    ("empty-batch", (0, 64)),
)

Invalid = list[tuple[str, tuple[object, ...], dict[str, object], type[Exception], str]]


def _samples(device: str, dtype: torch.dtype) -> list[Sample]:
    g = torch.Generator(device="cpu").manual_seed(7)
    out = [Sample(n, ((torch.randn(s, generator=g) * 2).to(dtype=dtype, device=device),)) for n, s in _SHAPES]
    out.append(
        Sample("large-magnitude", ((torch.randn((4, 256), generator=g) * 30).to(dtype=dtype, device=device),))
    )
    big = torch.randn((6, 640), generator=g).to(dtype=dtype, device=device)
    out.append(Sample("strided-rows", (big[:, :320],)))
    x = torch.randn((4, 96), generator=g).to(dtype=dtype, device=device)
    out.append(Sample("with-out", (x,), {"out": torch.empty((4, 48), dtype=dtype, device=device)}))
    return out


def _gelu_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    gate = torch.linspace(-8.0, 8.0, 96)  # both tails and the knee of erf / tanh
    up = torch.randn(96, generator=torch.Generator(device="cpu").manual_seed(11))
    sweep = torch.stack([torch.cat([gate, up]), torch.cat([gate.flip(0), up])]).to(dtype=dtype, device=device)
    return [*_samples(device, dtype), Sample("gate-sweep", (sweep,))]


def silu_and_mul_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    return _samples(device, dtype)


def gelu_and_mul_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    return _gelu_samples(device, dtype)


def _invalid(device: str) -> Invalid:
    x = torch.randn(4, 16, device=device)
    return [
        ("odd-last-dim", (torch.randn(4, 15, device=device),), {}, ValueError, "must be even"),
        ("int-dtype", (torch.ones(4, 16, dtype=torch.int64, device=device),), {}, TypeError, "dtype"),
        ("out-shape", (x,), {"out": torch.empty(4, 16, device=device)}, ValueError, "out has shape"),
        (
            "out-dtype",
            (x,),
            {"out": torch.empty(4, 8, dtype=torch.float16, device=device)},
            TypeError,
            "out has dtype",
        ),
        ("non-contiguous", (torch.randn(16, 4, device=device).t(),), {}, ValueError, "non-contiguous"),
    ]


def silu_and_mul_invalid(device: str) -> Invalid:
    return _invalid(device)


gelu_and_mul_invalid = silu_and_mul_invalid
