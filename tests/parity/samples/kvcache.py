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


# -- the block ops ----------------------------------------------------------------------------
# The cell dtype of copy_blocks / swap_blocks is block_mapping's (int64) and gather_cache's
# block_table's (int32): the caches of each case are float32, float16, bfloat16 and fp8.
_CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn)


def _rand(g: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype, device: str) -> torch.Tensor:
    return (torch.randn(shape, generator=g) * 4).to(dtype).to(device)


def _pairs(g: torch.Generator, nb: int, n: int, device: str) -> torch.Tensor:
    """n (src, dst) pairs: distinct destinations, none of them a source."""
    perm = torch.randperm(nb, generator=g)
    src = perm[:n]
    dst = perm[n : 2 * n]
    return torch.stack([src, dst], dim=1).to(device)


def copy_blocks_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    g = torch.Generator().manual_seed(11)
    out = []
    for i, dt in enumerate(_CACHE_DTYPES):
        out.append(Sample(f"paged-{dt}", (_rand(g, (9, 2, 4, 3, 8), dt, device), _pairs(g, 9, 4, device))))
        out.append(Sample(f"mla-{dt}", (_rand(g, (6, 4, 20 + i), dt, device), _pairs(g, 6, 3, device))))
    kv = _rand(g, (7, 2, 4, 3, 16), torch.bfloat16, device)  # NHD slices of a [nb, 2, bs, H, D] cache
    hnd = _rand(g, (7, 2, 3, 4, 16), torch.float16, device).transpose(2, 3)  # HND, as its NHD view
    m = _pairs(g, 7, 3, device)
    src_dup = torch.tensor([[1, 4], [1, 5], [2, 2]], device=device)  # one source, two copies; a no-op pair
    out += [
        Sample("kv-slice", (kv[:, 1], m)),
        Sample("hnd-view", (hnd[:, 0], m)),
        Sample("one-source-twice-and-self", (_rand(g, (6, 5, 3), torch.float32, device), src_dup)),
        Sample(
            "no-pairs",
            (_rand(g, (3, 4, 2), torch.float32, device), torch.zeros(0, 2, dtype=torch.long, device=device)),
        ),
        Sample(
            "int-cache", (torch.randint(-99, 99, (5, 3, 7), generator=g).to(device), _pairs(g, 5, 2, device))
        ),
    ]
    return out


def copy_blocks_invalid(device: str) -> Invalid:
    c = torch.zeros(4, 2, 8, device=device)
    m = torch.tensor([[0, 1]], device=device)
    out: Invalid = [
        ("mapping-int32", (c, m.int()), {}, TypeError, "(block_mapping has|unsupported) dtype int32"),
        (
            "mapping-shape",
            (c, m.view(-1)),
            {},
            ValueError,
            r"block_mapping has shape \(2,\), expected \[num_pairs, 2\]",
        ),
        (
            "mapping-strided",
            (c, torch.tensor([[0, 2], [1, 3]], device=device).t()),
            {},
            ValueError,
            "must be contiguous",
        ),
        ("cache-1d", (torch.zeros(4, device=device), m), {}, ValueError, "at least 2-D"),
        (
            "cache-strided-block",
            (torch.zeros(4, 2, 8, device=device)[:, :, ::2], m),
            {},
            ValueError,
            "one dense region",
        ),
        ("cache-not-tensor", ([c], m), {}, TypeError, "cache must be a torch.Tensor"),
    ]
    if device == "cpu":
        out += [
            (
                "src-out-of-range",
                (c, torch.tensor([[0, 1], [4, 2]])),
                {},
                ValueError,
                r"block_mapping\[1, 0\] = 4 is out of range",
            ),
            (
                "dst-negative",
                (c, torch.tensor([[0, -1]])),
                {},
                ValueError,
                r"block_mapping\[0, 1\] = -1 is out of range",
            ),
        ]
    return out


def swap_blocks_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    g = torch.Generator().manual_seed(12)
    out = []
    devices = [(device, device), ("cpu", device), (device, "cpu")] if device != "cpu" else [("cpu", "cpu")]
    for s_dev, d_dev in devices:
        for dt in _CACHE_DTYPES:
            src = _rand(g, (8, 2, 4, 16), dt, s_dev)
            dst = _rand(g, (5, 2, 4, 16), dt, d_dev)
            m = torch.tensor([[0, 4], [3, 1], [4, 2], [7, 0]])  # a run of two: (3, 1), (4, 2)
            out.append(Sample(f"{s_dev}-to-{d_dev}-{dt}", (src, dst, m)))
    kv = _rand(g, (6, 2, 3, 4, 8), torch.bfloat16, device)
    out.append(Sample("kv-slices", (kv[:, 0], kv[:, 1], torch.tensor([[0, 1], [1, 2], [5, 5]]))))
    return out


def swap_blocks_invalid(device: str) -> Invalid:
    src = torch.zeros(4, 2, 8, device=device)
    m = torch.tensor([[0, 1]])
    return [
        ("dtype", (src, src.half(), m), {}, TypeError, "dst has dtype float16, expected float32"),
        (
            "block-shape",
            (src, torch.zeros(4, 2, 4, device=device), m),
            {},
            ValueError,
            "dst has blocks of shape",
        ),
        (
            "mapping-int32",
            (src, src.clone(), m.int()),
            {},
            TypeError,
            "(block_mapping has|unsupported) dtype int32",
        ),
        (
            "dst-out-of-range",
            (src, src.clone(), torch.tensor([[0, 4]])),
            {},
            ValueError,
            r"block_mapping\[0, 1\] = 4 is out of range",
        ),
        (
            "src-negative",
            (src, src.clone(), torch.tensor([[-1, 0]])),
            {},
            ValueError,
            r"block_mapping\[0, 0\] = -1",
        ),
    ]


def _mla(
    name: str,
    t: int,
    r: int,
    p: int,
    nb: int,
    bs: int,
    dtype: torch.dtype,
    device: str,
    seed: int,
    pad: tuple[int, ...] = (),
    fp8: float | None = None,
    scale: float = 1.0,
) -> Sample:
    g = torch.Generator().manual_seed(seed)
    kv_c = (torch.randn(t, r, generator=g) * scale).to(dtype).to(device)
    k_pe = (torch.randn(t, p, generator=g) * scale).to(dtype).to(device)
    slots = torch.randperm(nb * bs, generator=g)[:t]
    for i in pad:
        slots[i] = -1
    if fp8 is None:
        cache = torch.randn(nb, bs, r + p, generator=g).to(dtype).to(device)
        return Sample(name, (kv_c, k_pe, cache, slots.to(device)))
    cache = (torch.randn(nb, bs, r + p, generator=g) * 8).to(torch.float8_e4m3fn).to(device)
    return Sample(name, (kv_c, k_pe, cache, slots.to(device)), {"scale": torch.tensor(fp8, device=device)})


def concat_and_cache_mla_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    g = torch.Generator().manual_seed(13)
    big = 1e4 if dtype != torch.float16 else 6e4
    out = [
        _mla("1-token", 1, 16, 8, 2, 4, dtype, device, 1),
        _mla("odd-r37-p5-bs3", 7, 37, 5, 4, 3, dtype, device, 2, pad=(2,)),
        _mla("r512-p64-bs16", 21, 512, 64, 3, 16, dtype, device, 3, pad=(0, 20)),
        _mla("empty", 0, 32, 16, 2, 4, dtype, device, 4),
        _mla("large-magnitude", 5, 64, 32, 2, 4, dtype, device, 5, scale=big),
        _mla("fp8", 9, 128, 64, 2, 8, dtype, device, 6, pad=(3,), fp8=0.1),
        _mla("fp8-saturating-odd", 6, 35, 7, 3, 5, dtype, device, 7, fp8=0.02, scale=20.0),
    ]
    t, r, p, nb, bs = 6, 64, 32, 3, 4
    fused = torch.randn(t, 2 * r + p, generator=g).to(dtype).to(device)  # strided rows of one projection
    cache = torch.randn(nb, 2, bs, r + p, generator=g).to(dtype).to(device)[:, 1]  # strided blocks
    slots = torch.randperm(nb * bs, generator=g)[:t].to(device)
    out.append(Sample("strided-rows-and-blocks", (fused[:, r : 2 * r], fused[:, 2 * r :], cache, slots)))
    return out


def concat_and_cache_mla_invalid(device: str) -> Invalid:
    def mk(dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
        return [
            torch.randn(3, 8, device=device).to(dtype),
            torch.randn(3, 4, device=device).to(dtype),
            torch.zeros(2, 4, 12, device=device).to(dtype),
            torch.arange(3, device=device),
        ]

    a = mk()
    wrong_entry = [a[0], a[1], torch.zeros(2, 4, 10, device=device), a[3]]
    fp8_cache = [a[0], a[1], torch.zeros(2, 4, 12, device=device).to(torch.float8_e4m3fn), a[3]]
    out: Invalid = [
        ("int-kv_c", (a[0].int(), a[1], a[2], a[3]), {}, TypeError, "dtype int32"),
        (
            "k_pe-dtype",
            (a[0], a[1].half(), a[2], a[3]),
            {},
            TypeError,
            "k_pe has dtype float16, expected float32",
        ),
        (
            "cache-entry",
            tuple(wrong_entry),
            {},
            ValueError,
            r"kv_cache has shape \(2, 4, 10\), expected \[num_blocks, block_size, 12\]",
        ),
        ("slot-int32", (a[0], a[1], a[2], a[3].int()), {}, TypeError, "slot_mapping has dtype int32"),
        ("fp8-no-scale", tuple(fp8_cache), {}, ValueError, "needs scale"),
        (
            "scale-without-fp8",
            tuple(a),
            {"scale": torch.tensor(1.0, device=device)},
            ValueError,
            "scale applies to an fp8",
        ),
        (
            "kv_c-strided",
            (torch.randn(3, 16, device=device)[:, ::2], a[1], a[2], a[3]),
            {},
            ValueError,
            "kv_c has a non-contiguous",
        ),
    ]
    if device == "cpu":
        out += [
            (
                "slot-out-of-range",
                (a[0], a[1], a[2], torch.tensor([0, 8, 1])),
                {},
                ValueError,
                r"slot_mapping\[1\] = 8 is out of range",
            ),
            (
                "slot-below-minus-1",
                (a[0], a[1], a[2], torch.tensor([0, 1, -3])),
                {},
                ValueError,
                r"slot_mapping\[2\] = -3",
            ),
        ]
    return out


def _gather_case(
    name: str,
    g: torch.Generator,
    nb: int,
    bs: int,
    entry: tuple[int, ...],
    lens: list[int],
    dt: torch.dtype,
    device: str,
    starts: list[int] | None = None,
    extra_cols: int = 1,
    extra_rows: int = 3,
) -> Sample:
    src = _rand(g, (nb, bs, *entry), dt, device)
    b = len(lens)
    first = [s // bs for s in starts] if starts is not None else [0] * b
    width = max(f + (n + bs - 1) // bs for f, n in zip(first, lens, strict=True)) + extra_cols
    table = (
        torch.stack([torch.randperm(nb, generator=g)[:width] for _ in range(b)]).int()
        if nb >= width
        else (torch.randint(0, nb, (b, width), generator=g).int())
    )
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    dst = _rand(g, (int(cu[-1]) + extra_rows, *entry), dt, device)  # rows past the last stay untouched
    kw = {} if starts is None else {"seq_starts": torch.tensor(starts, dtype=torch.int32, device=device)}
    return Sample(name, (src, dst, table.to(device), cu.to(device)), kw)


def gather_cache_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    g = torch.Generator().manual_seed(14)
    out = []
    for dt in _CACHE_DTYPES:
        out.append(_gather_case(f"mla-{dt}", g, 12, 4, (24,), [5, 0, 8, 3], dt, device))
    out += [
        _gather_case("multi-dim-entry", g, 10, 3, (2, 5), [4, 7], torch.bfloat16, device),
        _gather_case("seq-starts", g, 16, 4, (8,), [6, 3, 9], torch.float16, device, starts=[5, 0, 8]),
        _gather_case("odd-entry", g, 9, 5, (7,), [11, 1, 2], torch.float32, device),
        _gather_case("all-empty", g, 4, 4, (8,), [0, 0], torch.float32, device),
        _gather_case("r576-bs16", g, 8, 16, (576,), [40, 17], torch.bfloat16, device),
    ]
    # strided blocks: one half of a [nb, 2, bs, entry] cache
    src = _rand(g, (6, 2, 4, 16), torch.float32, device)[:, 1]
    out.append(
        Sample(
            "strided-blocks",
            (
                src,
                torch.zeros(7, 16, device=device),
                torch.tensor([[5, 0], [2, 3]], dtype=torch.int32, device=device),
                torch.tensor([0, 5, 7], dtype=torch.int32, device=device),
            ),
        )
    )
    return out


def gather_cache_invalid(device: str) -> Invalid:
    src = torch.randn(4, 2, 8, device=device)
    dst = torch.zeros(5, 8, device=device)
    table = torch.tensor([[0, 1, 2], [3, 2, 1]], dtype=torch.int32, device=device)
    cu = torch.tensor([0, 3, 5], dtype=torch.int32, device=device)
    out: Invalid = [
        ("dst-dtype", (src, dst.half(), table, cu), {}, TypeError, "dst has dtype float16, expected float32"),
        (
            "table-int64",
            (src, dst, table.long(), cu),
            {},
            TypeError,
            "(block_table has|unsupported) dtype int64",
        ),
        (
            "cu-shape",
            (src, dst, table, cu[:2]),
            {},
            ValueError,
            r"cu_seq_lens has shape \(2,\), expected \[3\]",
        ),
        ("dst-entry", (src, torch.zeros(5, 6, device=device), table, cu), {}, ValueError, "dst has shape"),
        ("src-2d", (torch.randn(4, 8, device=device), dst, table, cu), {}, ValueError, "src_cache has shape"),
        (
            "starts-int64",
            (src, dst, table, cu),
            {"seq_starts": torch.zeros(2, dtype=torch.long, device=device)},
            TypeError,
            "seq_starts has dtype int64",
        ),
    ]
    if device == "cpu":
        out += [
            (
                "block-out-of-range",
                (src, dst, torch.tensor([[0, 4, 2], [3, 2, 1]], dtype=torch.int32), cu),
                {},
                ValueError,
                r"block_table\[0, 1\] = 4 is out of range",
            ),
            (
                "too-many-rows",
                (src, dst, table, torch.tensor([0, 3, 6], dtype=torch.int32)),
                {},
                ValueError,
                "exceeds dst's 5 rows",
            ),
            (
                "decreasing",
                (src, dst, table, torch.tensor([0, 3, 2], dtype=torch.int32)),
                {},
                ValueError,
                "non-decreasing",
            ),
            (
                "table-too-narrow",
                (src, dst, table, cu),
                {"seq_starts": torch.tensor([4, 0], dtype=torch.int32)},
                ValueError,
                r"sequence 0 needs 4 entries",
            ),
        ]
    return out
