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
    # more 16-byte vectors than 256-thread blocks on any serving GPU's SMs: the CUDA unit's exact
    # GELU takes its full-vector launch here (below a block per SM it spreads each vector over
    # four threads, which every sample above takes)
    wave = (torch.randn((24, 2 * 14336), generator=torch.Generator(device="cpu").manual_seed(13)) * 2).to(
        dtype=dtype, device=device
    )
    return [*_samples(device, dtype), Sample("gate-sweep", (sweep,)), Sample("past-one-wave", (wave,))]


def silu_and_mul_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    base = _samples(device, dtype)
    return [*base, *_with(base, "vllm-rounding", vllm_rounding=True)]


def gelu_and_mul_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    base = _gelu_samples(device, dtype)
    return [*base, *_with(base, "vllm-rounding", vllm_rounding=True)]


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
    x = torch.randn(4, 16, device=device)
    return [*_invalid(device), ("rounding-not-bool", (x,), {"vllm_rounding": 1}, TypeError, "vllm_rounding")]


gelu_and_mul_invalid = silu_and_mul_invalid


# -- vLLM's other activations ---------------------------------------------------------------------
def _with(samples: list[Sample], tag: str, **kw: object) -> list[Sample]:
    return [Sample(f"{s.name}-{tag}", s.args, {**kw, **s.kwargs}) for s in samples]


def _clamp_sweep(device: str, dtype: torch.dtype, pairs: bool) -> Sample:
    """Gate and up values across the clamps (limit 7) and the sigmoid knee, NaN and Inf kept out."""
    gate = torch.linspace(-12.0, 12.0, 96)
    up = torch.linspace(9.0, -9.0, 96)
    row = torch.stack([gate, up], -1).flatten() if pairs else torch.cat([gate, up])
    return Sample("clamp-sweep", (torch.stack([row, row.flip(0)]).to(dtype=dtype, device=device),))


mul_and_silu_samples = silu_and_mul_samples


def fatrelu_and_mul_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    base = _samples(device, dtype)
    return [*base, *_with(base[:3], "t0.37", threshold=0.37), *_with(base[3:5], "t-0.5", threshold=-0.5)]


def swiglustep_and_mul_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    base = [*_samples(device, dtype), _clamp_sweep(device, dtype, pairs=False)]
    return [*base, *_with(base[:2], "limit1.5", limit=1.5)]


def swigluoai_and_mul_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    base = [*_samples(device, dtype), _clamp_sweep(device, dtype, pairs=True)]
    return [*base, *_with(base[:2], "a1-l2.5", alpha=1.0, limit=2.5)]


def gelu_quick_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    g = torch.Generator(device="cpu").manual_seed(13)
    shapes = (
        ("1-token", (1, 128)),
        ("odd-7", (3, 7)),
        ("3d", (2, 3, 96)),
        ("d-4099", (2, 4099)),
        ("empty", (0, 64)),
    )
    out = [Sample(n, ((torch.randn(s, generator=g) * 2).to(dtype=dtype, device=device),)) for n, s in shapes]
    out.append(
        Sample("sweep", (torch.linspace(-10.0, 10.0, 257).to(dtype=dtype, device=device).view(1, -1),))
    )
    big = torch.randn((5, 300), generator=g).to(dtype=dtype, device=device)
    out.append(Sample("strided-rows", (big[:, :160],)))
    x = torch.randn((4, 96), generator=g).to(dtype=dtype, device=device)
    out.append(Sample("with-out", (x,), {"out": torch.empty((4, 96), dtype=dtype, device=device)}))
    return out


mul_and_silu_invalid = silu_and_mul_invalid


def fatrelu_and_mul_invalid(device: str) -> Invalid:
    x = torch.randn(4, 16, device=device)
    return [*_invalid(device), ("threshold-nan", (x,), {"threshold": float("nan")}, ValueError, "threshold")]


def swiglustep_and_mul_invalid(device: str) -> Invalid:
    x = torch.randn(4, 16, device=device)
    return [*_invalid(device), ("limit-zero", (x,), {"limit": 0.0}, ValueError, "limit")]


def swigluoai_and_mul_invalid(device: str) -> Invalid:
    x = torch.randn(4, 16, device=device)
    return [
        *_invalid(device),
        ("limit-negative", (x,), {"limit": -1.0}, ValueError, "limit"),
        ("alpha-inf", (x,), {"alpha": float("inf")}, ValueError, "alpha"),
    ]


def gelu_new_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    base = gelu_quick_samples(device, dtype)
    return [*base, *_with(base, "vllm-rounding", vllm_rounding=True)]


def gelu_new_invalid(device: str) -> Invalid:
    x = torch.randn(4, 16, device=device)
    return [
        *gelu_quick_invalid(device),
        ("rounding-not-bool", (x,), {"vllm_rounding": 0}, TypeError, "vllm_rounding"),
    ]


def gelu_quick_invalid(device: str) -> Invalid:
    x = torch.randn(4, 16, device=device)
    return [
        ("int-dtype", (torch.ones(4, 16, dtype=torch.int64, device=device),), {}, TypeError, "dtype"),
        ("scalar", (torch.tensor(1.0, device=device),), {}, ValueError, "at least one dim"),
        ("out-shape", (x,), {"out": torch.empty(4, 8, device=device)}, ValueError, "out has shape"),
        (
            "out-dtype",
            (x,),
            {"out": torch.empty(4, 16, dtype=torch.float16, device=device)},
            TypeError,
            "out has dtype",
        ),
        ("non-contiguous", (torch.randn(16, 4, device=device).t(),), {}, ValueError, "non-contiguous"),
    ]
