"""Parity cases for rotary_embedding: made fresh per call, on the requested device."""

from __future__ import annotations

from collections.abc import Callable

import torch

from opmux.kernels.ops._common import Sample

Invalid = list[tuple[str, tuple[object, ...], dict[str, object], type[Exception], str]]


def _cache(max_pos: int, rot: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float64), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype=dtype, device=device)


def _case(
    name: str,
    device: str,
    dtype: torch.dtype,
    seed: int,
    *,
    lead: tuple[int, ...],
    hq: int,
    hk: int,
    head: int,
    rot: int,
    neox: bool = True,
    split: bool = False,
    max_pos: int = 64,
    f32_cache: bool = False,
    scale: float = 1.0,
) -> Sample:
    g = torch.Generator(device="cpu").manual_seed(seed)
    positions = torch.randint(0, max_pos, lead, generator=g).to(device)
    shape: Callable[[int], tuple[int, ...]] = (
        (lambda h: (*lead, h, head)) if split else (lambda h: (*lead, h * head))
    )
    q = (torch.randn(shape(hq), generator=g) * scale).to(dtype=dtype, device=device)
    k = (torch.randn(shape(hk), generator=g) * scale).to(dtype=dtype, device=device)
    cache = _cache(max_pos, rot, torch.float32 if f32_cache else dtype, device)
    return Sample(name, (positions, q, k, head, cache), {"is_neox": neox})


def rotary_embedding_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    out = [
        _case("1-token", device, dtype, 1, lead=(1,), hq=4, hk=2, head=64, rot=64),
        _case("gptj-3d", device, dtype, 2, lead=(3,), hq=4, hk=2, head=64, rot=64, neox=False, split=True),
        _case("partial-rotary-neox", device, dtype, 3, lead=(5,), hq=3, hk=1, head=64, rot=32),
        _case("partial-rotary-gptj", device, dtype, 4, lead=(5,), hq=3, hk=1, head=64, rot=16, neox=False),
        _case("odd-head-size", device, dtype, 5, lead=(4,), hq=3, hk=1, head=9, rot=6, split=True),
        _case("odd-head-size-gptj", device, dtype, 6, lead=(4,), hq=1, hk=3, head=9, rot=6, neox=False),
        _case("2d-positions", device, dtype, 7, lead=(2, 3), hq=2, hk=2, head=32, rot=32),
        _case("empty-batch", device, dtype, 8, lead=(0,), hq=4, hk=2, head=64, rot=64),
        _case("float32-cache", device, dtype, 9, lead=(6,), hq=4, hk=2, head=128, rot=128, f32_cache=True),
        _case(
            "large-magnitude",
            device,
            dtype,
            10,
            lead=(4,),
            hq=2,
            hk=1,
            head=64,
            rot=64,
            max_pos=8192,
            scale=1e3,
        ),
    ]
    # query / key as slices of a fused qkv projection: token stride (4 + 2 + 2) * 64
    g = torch.Generator(device="cpu").manual_seed(11)
    for neox in (True, False):
        qkv = torch.randn(5, 8 * 64, generator=g).to(dtype=dtype, device=device)
        positions = torch.randint(0, 64, (5,), generator=g).to(device)
        out.append(
            Sample(
                f"qkv-slices-{'neox' if neox else 'gptj'}",
                (positions, qkv[:, :256], qkv[:, 256:384], 64, _cache(64, 64, dtype, device)),
                {"is_neox": neox},
            )
        )
    # vLLM's rounding (the mode vLLM's compat entry selects) on a few layouts
    for s in (out[0], out[1], out[3], out[8], out[-1]):
        args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in s.args)  # rotated in place
        out.append(Sample(f"{s.name}-vllm-rounding", args, {**s.kwargs, "vllm_rounding": True}))
    return out


def rotary_embedding_invalid(device: str) -> Invalid:
    pos = torch.arange(4, device=device)
    q, k = torch.randn(4, 2 * 64, device=device), torch.randn(4, 64, device=device)
    cache = _cache(16, 64, torch.float32, device)
    cases: Invalid = [
        ("positions-dtype", (pos.int(), q, k, 64, cache), {}, TypeError, "positions has dtype"),
        ("rounding-not-bool", (pos, q, k, 64, cache), {"vllm_rounding": 1}, TypeError, "vllm_rounding"),
        (
            "rotary-dim-too-large",
            (pos, q, k, 32, _cache(16, 64, torch.float32, device)),
            {},
            ValueError,
            "rotary_dim",
        ),
        (
            "head-size-mismatch",
            (pos, torch.randn(4, 100, device=device), k, 64, cache),
            {},
            ValueError,
            "head_size 64",
        ),
        ("cache-dtype", (pos, q, k, 64, cache.half()), {}, TypeError, "cos_sin_cache has dtype"),
        ("same-tensor", (pos, q, q, 64, cache), {}, ValueError, "distinct tensors"),
        ("query-tokens", (torch.arange(3, device=device), q, k, 64, cache), {}, ValueError, "leading dims"),
    ]
    if device == "cpu":  # accelerators poison the token with NaN instead of syncing to check
        cases += [
            (
                "position-too-large",
                (torch.tensor([0, 1, 16, 2], device=device), q, k, 64, cache),
                {},
                ValueError,
                r"positions\[2\] = 16 is out of range",
            ),
            (
                "position-negative",
                (torch.tensor([-1, 1, 2, 3], device=device), q, k, 64, cache),
                {},
                ValueError,
                r"positions\[0\] = -1 is out of range",
            ),
        ]
    return cases
