"""Parity cases for reshape_and_cache: made fresh per call, on the requested device."""

from __future__ import annotations

import torch

from opmux.kernels.ops._common import Sample

Invalid = list[tuple[str, tuple[object, ...], dict[str, object], type[Exception], str]]


def _case(
    name: str,
    t: int,
    h: int,
    d: int,
    nb: int,
    bs: int,
    dtype: torch.dtype,
    device: str,
    seed: int,
    pad: tuple[int, ...] = (),
    scale: float = 1.0,
) -> Sample:
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rnd(*shape: int) -> torch.Tensor:
        return (torch.randn(shape, generator=g) * scale).to(dtype=dtype, device=device)

    slots = torch.randperm(nb * bs, generator=g)[:t]
    for i in pad:
        slots[i] = -1
    # caches start random, so untouched slots are compared too
    return Sample(name, (rnd(t, h, d), rnd(t, h, d), rnd(nb, bs, h, d), rnd(nb, bs, h, d), slots.to(device)))


def reshape_and_cache_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    out = [
        _case("1-token", 1, 2, 8, 4, 4, dtype, device, 1),
        _case("odd-h3-d7-bs5", 5, 3, 7, 3, 5, dtype, device, 2),
        _case("padding-slots", 6, 2, 16, 4, 8, dtype, device, 3, pad=(0, 3, 5)),
        _case("empty-batch", 0, 2, 16, 2, 4, dtype, device, 4),
        _case(
            "large-magnitude", 4, 2, 32, 2, 4, dtype, device, 5, scale=1e4 if dtype != torch.float16 else 6e4
        ),
        _case("t37-h8-d128-bs16", 37, 8, 128, 4, 16, dtype, device, 6, pad=(36,)),
    ]
    g = torch.Generator(device="cpu").manual_seed(7)
    t, h, d, nb, bs = 5, 2, 64, 3, 4
    qkv = torch.randn((t, 3 * h, d), generator=g).to(dtype=dtype, device=device)  # fused qkv slices
    kv = torch.randn((nb, 2, bs, h, d), generator=g).to(dtype=dtype, device=device)  # [nb, 2, ...]
    slots = torch.randperm(nb * bs, generator=g)[:t].to(device)
    out.append(
        Sample("strided-qkv-and-cache", (qkv[:, h : 2 * h], qkv[:, 2 * h :], kv[:, 0], kv[:, 1], slots))
    )
    # HND: [nb, H, bs, D] in memory, passed as its [nb, bs, H, D] view (vLLM's cache layout option)
    t, h, d, nb, bs = 7, 4, 32, 3, 8
    hnd = torch.randn((2, nb, h, bs, d), generator=g).to(dtype=dtype, device=device)
    key, value = (torch.randn((t, h, d), generator=g).to(dtype=dtype, device=device) for _ in range(2))
    slots = torch.randperm(nb * bs, generator=g)[:t]
    slots[2] = -1
    out.append(
        Sample("hnd-cache", (key, value, hnd[0].transpose(1, 2), hnd[1].transpose(1, 2), slots.to(device)))
    )
    # fp8 caches (e4m3fn) with per-tensor scales: entries are fp8(x / scale), saturated
    fp8 = torch.float8_e4m3fn

    def fp8_cache(*shape: int) -> torch.Tensor:
        return (torch.randn(shape, generator=g) * 8).to(fp8).to(device)

    big = (torch.randn((t, h, d), generator=g) * 300).to(dtype=dtype, device=device)  # some saturate
    out += [
        Sample(
            "fp8-cache",
            (key, big, fp8_cache(nb, bs, h, d), fp8_cache(nb, bs, h, d), slots.to(device)),
            {"k_scale": torch.tensor(0.05, device=device), "v_scale": torch.tensor([0.5], device=device)},
        ),
        Sample(
            "fp8-hnd-cache",
            (
                key,
                value,
                fp8_cache(nb, h, bs, d).transpose(1, 2),
                fp8_cache(nb, h, bs, d).transpose(1, 2),
                slots.to(device),
            ),
            {"k_scale": torch.tensor(1.5, device=device), "v_scale": torch.tensor(0.25, device=device)},
        ),
    ]
    # vLLM's paged layout (reshape_and_cache): key [nb, H, D/x, bs, x] (x: 16 bytes), value [nb, H, D, bs]
    x = 16 // torch.empty((), dtype=dtype).element_size()
    kp = torch.randn((nb, h, d // x, bs, x), generator=g).to(dtype=dtype, device=device)
    vp = torch.randn((nb, h, d, bs), generator=g).to(dtype=dtype, device=device)
    out.append(Sample("paged-layout", (key, value, kp, vp, slots.to(device))))
    out.append(
        Sample(
            "paged-fp8",
            (key, big, fp8_cache(nb, h, d // 16, bs, 16), fp8_cache(nb, h, d, bs), slots.to(device)),
            {"k_scale": torch.tensor(0.05, device=device), "v_scale": torch.tensor(0.5, device=device)},
        )
    )
    return out


def reshape_and_cache_invalid(device: str) -> Invalid:
    def mk(
        t: int = 3, h: int = 2, d: int = 8, nb: int = 2, bs: int = 4, dtype: torch.dtype = torch.float32
    ) -> list[torch.Tensor]:
        k = torch.randn(t, h, d, device=device).to(dtype)
        return [
            k,
            k.clone(),
            torch.zeros(nb, bs, h, d, device=device, dtype=dtype),
            torch.zeros(nb, bs, h, d, device=device, dtype=dtype),
            torch.arange(t, device=device),
        ]

    int_key = mk()
    int_key[0] = int_key[0].to(torch.int32)
    value_shape = mk()
    value_shape[1] = torch.randn(3, 2, 4, device=device)
    cache_dtype = mk()
    cache_dtype[2] = cache_dtype[2].half()
    slot_dtype = mk()
    slot_dtype[4] = slot_dtype[4].int()
    cache_layout = mk()
    cache_layout[2] = torch.zeros(2, 4, 8, 2, device=device).transpose(2, 3)  # head_dim strided
    key_stride = mk()
    key_stride[0] = torch.randn(3, 8, 2, device=device).transpose(1, 2)
    cases: Invalid = [
        ("int-key", tuple(int_key), {}, TypeError, "dtype"),
        ("value-shape", tuple(value_shape), {}, ValueError, "value has shape"),
        ("cache-dtype", tuple(cache_dtype), {}, TypeError, "key_cache has dtype"),
        ("slot-int32", tuple(slot_dtype), {}, TypeError, "slot_mapping has dtype"),
        ("cache-head-dim-strided", tuple(cache_layout), {}, ValueError, "head_dim must be dense"),
        (
            "fp8-cache-no-scale",
            tuple(mk()[:2] + [torch.zeros(2, 4, 2, 8, device=device).to(torch.float8_e4m3fn)] * 2 + mk()[4:]),
            {},
            ValueError,
            "needs k_scale and v_scale",
        ),
        (
            "scale-without-fp8",
            tuple(mk()),
            {"k_scale": torch.tensor(1.0, device=device), "v_scale": torch.tensor(1.0, device=device)},
            ValueError,
            "apply to an fp8 cache",
        ),
        ("key-last-dim-strided", tuple(key_stride), {}, ValueError, "non-contiguous last dimension"),
    ]
    if device == "cpu":  # CUDA kernels skip bad slots instead (no host sync)
        oob = mk()
        oob[4] = torch.tensor([0, 8, 1], device=device)
        neg = mk()
        neg[4] = torch.tensor([0, -2, 1], device=device)
        cases += [
            ("slot-out-of-range", tuple(oob), {}, ValueError, r"slot_mapping\[1\] = 8 is out of range"),
            ("slot-below-minus-1", tuple(neg), {}, ValueError, r"slot_mapping\[1\] = -2"),
        ]
    return cases
