"""Parity cases for the layernorm ops: made fresh per call, on the requested device."""

from __future__ import annotations

import torch

from opmux.kernels.ops._common import Sample

_SHAPES = (
    ("1-token", (1, 64)),
    ("odd-hidden-7", (3, 7)),
    ("odd-hidden-129", (5, 129)),
    ("3d-leading", (2, 3, 96)),
    ("hidden-4099", (2, 4099)),
    ("empty-batch", (0, 64)),
)


def _gen(device: str, dtype: torch.dtype, seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


def _randn(
    shape: tuple[int, ...], dtype: torch.dtype, device: str, g: torch.Generator, scale: float = 1.0
) -> torch.Tensor:
    return (torch.randn(shape, generator=g) * scale).to(dtype=dtype, device=device)


def rmsnorm_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    out = []
    for i, (name, shape) in enumerate(_SHAPES):
        g = _gen(device, dtype, i)
        x = _randn(shape, dtype, device, g)
        w = _randn(shape[-1:], dtype, device, g)
        out.append(Sample(name, (x, w), {"eps": 1e-6}))
    g = _gen(device, dtype, 100)
    out.append(
        Sample(
            "large-magnitude",
            (_randn((4, 256), dtype, device, g, 1e3), _randn((256,), dtype, device, g)),
            {"eps": 1e-5},
        )
    )
    big = _randn((6, 320), dtype, device, g)
    out.append(Sample("strided-rows", (big[:, :160], _randn((160,), dtype, device, g)), {}))
    x = _randn((4, 96), dtype, device, g)
    out.append(Sample("with-out", (x, _randn((96,), dtype, device, g)), {"out": torch.empty_like(x)}))
    return out


def _fused_add_cases(
    device: str, dtype: torch.dtype, seed: int, tail_seed: int, quant: bool
) -> tuple[list[Sample], torch.Generator]:
    """The fused add's shape, large-magnitude and strided-rows cases (x, residual, weight), from
    seeds ``seed + i`` per shape and ``tail_seed`` after; ``quant`` appends each case's scale.
    Returns them and the generator, for the caller's further cases."""

    def scale(value: float) -> tuple[torch.Tensor, ...]:
        return (_scale(device, value),) if quant else ()

    out = []
    for i, (name, shape) in enumerate(_SHAPES):
        g = _gen(device, dtype, seed + i)
        x, r = _randn(shape, dtype, device, g), _randn(shape, dtype, device, g)
        out.append(Sample(name, (x, r, _randn(shape[-1:], dtype, device, g), *scale(0.02)), {"eps": 1e-6}))
    g = _gen(device, dtype, tail_seed)
    out.append(
        Sample(
            "large-magnitude",
            (
                _randn((4, 256), dtype, device, g, 1e2),
                _randn((4, 256), dtype, device, g, 1e2),
                _randn((256,), dtype, device, g),
                *scale(0.01),
            ),
            {},
        )
    )
    bx, br = _randn((5, 256), dtype, device, g), _randn((5, 384), dtype, device, g)
    out.append(
        Sample("strided-rows", (bx[:, :128], br[:, :128], _randn((128,), dtype, device, g), *scale(0.05)), {})
    )
    return out, g


def fused_add_rmsnorm_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    return _fused_add_cases(device, dtype, 50, 200, quant=False)[0]


def rmsnorm_invalid(
    device: str,
) -> list[tuple[str, tuple[object, ...], dict[str, object], type[Exception], str]]:
    """(name, args, kwargs, exception type, message pattern) cases that must be rejected."""
    f = torch.float32
    x = torch.randn(4, 16, device=device)
    return [
        (
            "int-dtype",
            (
                torch.ones(4, 16, dtype=torch.int32, device=device),
                torch.ones(16, dtype=torch.int32, device=device),
            ),
            {},
            TypeError,
            "dtype",
        ),
        ("weight-shape", (x, torch.ones(15, device=device)), {}, ValueError, "weight has shape"),
        (
            "dtype-mismatch",
            (x, torch.ones(16, dtype=torch.float16, device=device)),
            {},
            TypeError,
            "weight has dtype",
        ),
        (
            "out-shape",
            (x, torch.ones(16, device=device)),
            {"out": torch.empty(4, 8, device=device)},
            ValueError,
            "out has shape",
        ),
        (
            "non-contiguous",
            (torch.randn(16, 4, device=device, dtype=f).t(), torch.ones(16, device=device)),
            {},
            ValueError,
            "non-contiguous",
        ),
        ("not-a-tensor", ([1.0, 2.0], torch.ones(2, device=device)), {}, TypeError, "Tensor"),
    ]


def fused_add_rmsnorm_invalid(
    device: str,
) -> list[tuple[str, tuple[object, ...], dict[str, object], type[Exception], str]]:
    x = torch.randn(4, 16, device=device)
    w = torch.ones(16, device=device)
    return [
        ("residual-shape", (x, torch.randn(4, 8, device=device), w), {}, ValueError, "residual has shape"),
        (
            "residual-dtype",
            (x, torch.randn(4, 16, device=device, dtype=torch.float16), w),
            {},
            TypeError,
            "residual has dtype",
        ),
        (
            "non-contiguous",
            (torch.randn(16, 4, device=device).t(), torch.randn(4, 16, device=device), w),
            {},
            ValueError,
            "non-contiguous",
        ),
        (
            "weight-shape",
            (x, torch.randn(4, 16, device=device), torch.ones(3, device=device)),
            {},
            ValueError,
            "weight has shape",
        ),
    ]


# (name, q shape, k shape): [..., heads, head_dim]
_QK_SHAPES = (
    ("1-token", (1, 4, 64), (1, 2, 64)),
    ("odd-head-dim-7", (3, 2, 7), (3, 1, 7)),
    ("head-dim-129", (2, 3, 129), (2, 1, 129)),
    ("4d-leading", (2, 3, 4, 32), (2, 3, 2, 32)),
    ("empty-batch", (0, 4, 64), (0, 2, 64)),
)


def qk_norm_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    out = []
    for i, (name, qs, ks) in enumerate(_QK_SHAPES):
        g = _gen(device, dtype, 300 + i)
        d = qs[-1]
        out.append(
            Sample(
                name,
                (
                    _randn(qs, dtype, device, g),
                    _randn(ks, dtype, device, g),
                    _randn((d,), dtype, device, g),
                    _randn((d,), dtype, device, g),
                ),
                {"eps": 1e-6},
            )
        )
    g = _gen(device, dtype, 400)
    out.append(
        Sample(
            "large-magnitude",
            (
                _randn((3, 4, 128), dtype, device, g, 1e3),
                _randn((3, 2, 128), dtype, device, g, 1e3),
                _randn((128,), dtype, device, g),
                _randn((128,), dtype, device, g),
            ),
            {},
        )
    )
    # q and k as views of a fused qkv projection: token stride (4 + 2 + 2) * 64, heads 64 apart
    qkv = _randn((5, 8 * 64), dtype, device, g)
    out.append(
        Sample(
            "qkv-slices",
            (
                qkv[:, :256].view(5, 4, 64),
                qkv[:, 256:384].view(5, 2, 64),
                _randn((64,), dtype, device, g),
                _randn((64,), dtype, device, g),
            ),
            {},
        )
    )
    # padded heads: head stride 80 for head_dim 64 (no common row stride)
    qp, kp = _randn((4, 3, 80), dtype, device, g), _randn((4, 2, 80), dtype, device, g)
    out.append(
        Sample(
            "padded-heads",
            (qp[..., :64], kp[..., :64], _randn((64,), dtype, device, g), _randn((64,), dtype, device, g)),
            {},
        )
    )
    # one decode token of each kind: its heads are the rows (CPU: one pass, not one per head)
    qkv1 = _randn((1, 8 * 64), dtype, device, g)
    for name, q1, k1 in (
        ("1-token-qkv-slices", qkv1[:, :256].view(1, 4, 64), qkv1[:, 256:384].view(1, 2, 64)),
        (
            "1-token-padded-heads",
            _randn((1, 3, 80), dtype, device, g)[..., :64],
            _randn((1, 2, 80), dtype, device, g)[..., :64],
        ),
    ):
        w1, w2 = _randn((64,), dtype, device, g), _randn((64,), dtype, device, g)
        out.append(Sample(name, (q1, k1, w1, w2), {}))
    return out


def qk_norm_invalid(
    device: str,
) -> list[tuple[str, tuple[object, ...], dict[str, object], type[Exception], str]]:
    q, k = torch.randn(4, 4, 64, device=device), torch.randn(4, 2, 64, device=device)
    w = torch.ones(64, device=device)
    return [
        ("k-head-dim", (q, torch.randn(4, 2, 32, device=device), w, w), {}, ValueError, "head_dim must be"),
        ("weight-shape", (q, k, torch.ones(32, device=device), w), {}, ValueError, "q_weight has shape"),
        ("k-dtype", (q, k.half(), w, w), {}, TypeError, "k has dtype"),
        ("int-dtype", (q.int(), k.int(), w.int(), w.int()), {}, TypeError, "dtype"),
        (
            "non-contiguous",
            (torch.randn(4, 64, 4, device=device).transpose(1, 2), k, w, w),
            {},
            ValueError,
            "non-contiguous",
        ),
        ("same-tensor", (q, q, w, w), {}, ValueError, "distinct tensors"),
    ]


def _scale(device: str, value: float, shape: tuple[int, ...] = (1,)) -> torch.Tensor:
    return torch.full(shape, value, dtype=torch.float32, device=device)


def rmsnorm_static_quant_fp8_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    out = []
    for i, (name, shape) in enumerate(_SHAPES):
        g = _gen(device, dtype, 500 + i)
        x, w = _randn(shape, dtype, device, g), _randn(shape[-1:], dtype, device, g)
        out.append(Sample(name, (x, w, _scale(device, 0.02)), {"eps": 1e-6}))
    g = _gen(device, dtype, 600)
    # y / scale far above 448 (saturates) and far below the smallest subnormal (rounds to 0)
    out.append(
        Sample(
            "saturating",
            (_randn((4, 96), dtype, device, g), _randn((96,), dtype, device, g), _scale(device, 1e-3)),
            {},
        )
    )
    out.append(
        Sample(
            "tiny",
            (_randn((4, 96), dtype, device, g), _randn((96,), dtype, device, g), _scale(device, 1e3)),
            {},
        )
    )
    out.append(
        Sample(
            "0d-scale",
            (_randn((3, 64), dtype, device, g), _randn((64,), dtype, device, g), _scale(device, 0.1, ())),
            {},
        )
    )
    big = _randn((6, 320), dtype, device, g)
    out.append(
        Sample("strided-rows", (big[:, :160], _randn((160,), dtype, device, g), _scale(device, 0.05)), {})
    )
    x = _randn((4, 96), dtype, device, g)
    q = torch.empty(4, 96, dtype=torch.float8_e4m3fn, device=device)
    out.append(Sample("with-out", (x, _randn((96,), dtype, device, g), _scale(device, 0.05)), {"out": q}))
    return out


def fused_add_rmsnorm_static_quant_fp8_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    out, g = _fused_add_cases(device, dtype, 700, 800, quant=True)
    x = _randn((3, 64), dtype, device, g)
    q = torch.empty(3, 64, dtype=torch.float8_e4m3fn, device=device)
    out.append(
        Sample(
            "with-out",
            (x, _randn((3, 64), dtype, device, g), _randn((64,), dtype, device, g), _scale(device, 0.1, ())),
            {"out": q},
        )
    )
    return out


def _quant_invalid(
    device: str, fused: bool
) -> list[tuple[str, tuple[object, ...], dict[str, object], type[Exception], str]]:
    x, w, s = torch.randn(4, 16, device=device), torch.ones(16, device=device), _scale(device, 0.1)

    def args(xx: torch.Tensor = x, ww: torch.Tensor = w, ss: object = s) -> tuple[object, ...]:
        return (xx, torch.randn(xx.shape, device=device).to(xx.dtype), ww, ss) if fused else (xx, ww, ss)

    return [
        ("scale-dtype", args(ss=s.half()), {}, TypeError, "scale has dtype"),
        ("scale-shape", args(ss=_scale(device, 0.1, (2,))), {}, ValueError, "scale has shape"),
        ("scale-not-a-tensor", args(ss=0.1), {}, TypeError, "scale"),
        ("weight-shape", args(ww=torch.ones(15, device=device)), {}, ValueError, "weight has shape"),
        ("weight-dtype", args(ww=w.half()), {}, TypeError, "weight has dtype"),
        ("int-dtype", args(xx=x.int(), ww=w.int()), {}, TypeError, "dtype"),
        ("out-dtype", args(), {"out": torch.empty(4, 16, device=device)}, TypeError, "out has dtype"),
        (
            "out-shape",
            args(),
            {"out": torch.empty(4, 8, dtype=torch.float8_e4m3fn, device=device)},
            ValueError,
            "out has shape",
        ),
        ("eps-zero", (*args(), 0.0), {}, ValueError, "eps"),
        (
            "non-contiguous",
            args(xx=torch.randn(16, 4, device=device).t()),
            {},
            ValueError,
            "non-contiguous",
        ),
    ]


def rmsnorm_static_quant_fp8_invalid(
    device: str,
) -> list[tuple[str, tuple[object, ...], dict[str, object], type[Exception], str]]:
    return _quant_invalid(device, False)


def fused_add_rmsnorm_static_quant_fp8_invalid(
    device: str,
) -> list[tuple[str, tuple[object, ...], dict[str, object], type[Exception], str]]:
    x, w, s = torch.randn(4, 16, device=device), torch.ones(16, device=device), _scale(device, 0.1)
    return [
        *_quant_invalid(device, True),
        ("residual-shape", (x, torch.randn(4, 8, device=device), w, s), {}, ValueError, "residual has shape"),
        ("residual-dtype", (x, x.half(), w, s), {}, TypeError, "residual has dtype"),
        ("residual-is-x", (x, x, w, s), {}, ValueError, "x and residual must be different tensors"),
    ]
