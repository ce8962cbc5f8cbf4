"""Parity cases for the attention ops: tiny shapes (the Triton interpreter runs them on the CPU),
made fresh per call, on the requested device."""

from __future__ import annotations

from typing import Any

import torch

from opmux.kernels.ops._common import Sample

Invalid = list[tuple[str, tuple[object, ...], dict[str, object], type[Exception], str]]
FP8 = torch.float8_e4m3fn
I32 = torch.int32


def _decode(
    device: str,
    dtype: torch.dtype,
    seed: int,
    lens: list[int],
    hq: int = 4,
    hkv: int = 2,
    d: int = 64,
    page: int = 16,
    width: int = 0,
    spare: int = 3,
    hnd: bool = False,
    shuffle: bool = True,
) -> tuple[torch.Tensor, ...]:
    """(query, key_cache, value_cache, block_tables, seq_lens): each sequence's blocks distinct,
    in a shuffled order (not the cache's), the unused entries of a row -1 (never read)."""
    g = torch.Generator().manual_seed(seed)
    bsz = len(lens)
    width = width or max(1, max(-(-n // page) for n in lens))
    nb = bsz * width + spare
    query = torch.randn(bsz, hq, d, generator=g)
    if hnd:  # HND in memory [nb, Hkv, page, D], passed as its [nb, page, Hkv, D] view
        kc = torch.randn(nb, hkv, page, d, generator=g).transpose(1, 2)
        vc = torch.randn(nb, hkv, page, d, generator=g).transpose(1, 2)
    else:
        kc = torch.randn(nb, page, hkv, d, generator=g)
        vc = torch.randn(nb, page, hkv, d, generator=g)
    order = torch.randperm(nb, generator=g) if shuffle else torch.arange(nb)
    table = torch.full((bsz, width), -1, dtype=I32)
    for b, n in enumerate(lens):
        used = -(-n // page)
        table[b, :used] = order[b * width : b * width + used].to(I32)
    seq = torch.tensor(lens, dtype=I32)
    return tuple(t.to(device) for t in (query.to(dtype), kc.to(dtype), vc.to(dtype), table, seq))


def _fp8(args: tuple[torch.Tensor, ...]) -> tuple[tuple[torch.Tensor, ...], dict[str, object]]:
    """The caches as kvcache writes fp8 ones: fp8(x / scale) with one scale each."""
    q, kc, vc, table, seq = args
    ks = torch.tensor([0.02], device=q.device)
    vs = torch.tensor([0.015], device=q.device)
    kq = (kc.float() / ks).to(FP8)
    vq = (vc.float() / vs).to(FP8)
    return (q, kq, vq, table, seq), {"k_scale": ks, "v_scale": vs}


def _mla(
    device: str,
    dtype: torch.dtype,
    seed: int,
    lens: list[int],
    hq: int = 16,
    page: int = 16,
    view: bool = True,
) -> tuple[torch.Tensor, ...]:
    """Absorbed MLA (DeepSeek-V2 / V3, Kimi): one KV head of a 576-dim latent cache, V its first
    512 dims: ``key_cache[..., :512]`` (a view of the same memory, as engines pass it) or a value
    cache of its own."""
    q, kc, vc, table, seq = _decode(device, dtype, seed, lens, hq=hq, hkv=1, d=576, page=page)
    return q, kc, kc[..., :512] if view else vc[..., 64:].contiguous(), table, seq


#: DeepSeek's softmax scale (qk_nope 128 + rope 64 head dims)
MLA_SCALE = 192**-0.5
#: the native CUDA decode takes Dv == D only (its predicate refuses MLA)
NO_CUDA = (("cuda", "the native CUDA decode reads values of the key's head dim (no MLA)"),)


def paged_decode_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    out = [
        Sample("gqa-4-2-d64-page16", _decode(device, dtype, 0, [37, 100, 16])),
        Sample("mqa-8-1-d80-page5", _decode(device, dtype, 1, [23, 1, 61], hq=8, hkv=1, d=80, page=5)),
        Sample("mha-2-2-d128-page1", _decode(device, dtype, 2, [9, 30], hq=2, hkv=2, d=128, page=1)),
        Sample("ragged-lens-0-1", _decode(device, dtype, 3, [0, 1, 57, 0], page=16)),
        # a table wider than the lengths: several splits, some of them empty
        Sample("wide-table-splits", _decode(device, dtype, 4, [100, 3], page=16, width=24)),
        Sample("in-order-blocks", _decode(device, dtype, 5, [40, 20], shuffle=False)),
        Sample("softcap", _decode(device, dtype, 6, [50, 33], page=5), {"softcap": 0.5}),
        Sample("scale", _decode(device, dtype, 7, [29, 64]), {"scale": 0.3}),
        Sample("window-left-15", _decode(device, dtype, 8, [80, 10, 16], page=16), {"window_left": 15}),
        Sample("window-left-0", _decode(device, dtype, 9, [31, 1], page=5), {"window_left": 0}),
        Sample("hnd-view", _decode(device, dtype, 10, [45, 70], hq=8, hkv=2, page=16, hnd=True)),
    ]
    g = torch.Generator().manual_seed(11)
    sinks = (torch.randn(4, generator=g) * 2).to(device)
    out.append(Sample("sinks", _decode(device, dtype, 11, [44, 0, 5]), {"sinks": sinks}))
    lse = torch.full((3, 8), 7.0, device=device)
    out.append(
        Sample(
            "lse-sinks-softcap-window",
            _decode(device, dtype, 12, [90, 0, 12], hq=8, hkv=1, page=5),
            {
                "lse": lse,
                "sinks": (torch.randn(8, generator=g)).to(device),
                "softcap": 4.0,
                "window_left": 40,
            },
        )
    )
    out.append(
        Sample(
            "lse-strided", _decode(device, dtype, 13, [33, 66]), {"lse": torch.zeros(4, 2, device=device).t()}
        )
    )
    q, kc, vc, table, seq = _decode(device, dtype, 14, [35, 52], d=64)
    wide = torch.randn(2, 4, 160, generator=g).to(dtype=dtype, device=device)
    out.append(Sample("strided-query", (wide[:, :, 32:96], kc, vc, table, seq)))
    out.append(
        Sample("query-heads-strided", (q.transpose(0, 1).contiguous().transpose(0, 1), kc, vc, table, seq))
    )
    args, kw = _fp8(_decode(device, dtype, 15, [60, 17, 0], page=16))
    out.append(Sample("fp8-cache", args, kw))
    args, kw = _fp8(_decode(device, dtype, 16, [41, 8], hq=8, hkv=1, d=80, page=5, hnd=True))
    out.append(
        Sample(
            "fp8-hnd-sinks-lse",
            args,
            {**kw, "sinks": sinks.new_zeros(8), "lse": torch.empty(2, 8, device=device)},
        )
    )
    caller = torch.full((2, 4, 64), 3.0, dtype=dtype, device=device)
    out.append(Sample("caller-out", _decode(device, dtype, 17, [12, 25]), {"out": caller}))
    mla = {"scale": MLA_SCALE}
    out += [
        Sample("mla-576-512-h16-page1-view", _mla(device, dtype, 18, [23, 9], page=1), mla, NO_CUDA),
        Sample("mla-576-512-h16-page16-own", _mla(device, dtype, 19, [40, 0, 17], view=False), mla, NO_CUDA),
        Sample(
            "mla-576-512-h128-page64-view-lse",
            _mla(device, dtype, 20, [70, 3], hq=128, page=64),
            {**mla, "lse": torch.empty(2, 128, device=device)},
            NO_CUDA,
        ),
        Sample(
            "mla-576-512-h16-page16-softcap-sinks",
            _mla(device, dtype, 21, [50, 33]),
            {**mla, "softcap": 5.0, "sinks": torch.randn(16, generator=g).to(device)},
            NO_CUDA,
        ),
        Sample(
            "mla-576-512-h128-page16-own-window",
            _mla(device, dtype, 22, [45, 12], hq=128, view=False),
            {**mla, "window_left": 20},
            NO_CUDA,
        ),
        Sample(
            "mla-caller-out",
            _mla(device, dtype, 23, [19, 30]),
            {**mla, "out": torch.full((2, 16, 512), 3.0, dtype=dtype, device=device)},
            NO_CUDA,
        ),
    ]
    (q8, kq, _, t8, s8), kw = _fp8(_mla(device, dtype, 24, [33, 6]))
    kw["v_scale"] = kw["k_scale"]  # one scale for the latent rows
    out.append(Sample("mla-fp8-view", (q8, kq, kq[..., :512], t8, s8), {**kw, **mla}, NO_CUDA))
    return out


def paged_decode_invalid(device: str) -> Invalid:
    q, kc, vc, table, seq = _decode(device, torch.bfloat16, 0, [20, 7])
    cases: Invalid = [
        ("query-int", (q.int(), kc, vc, table, seq), {}, TypeError, "dtype int32"),
        ("cache-dtype", (q, kc.half(), vc.half(), table, seq), {}, TypeError, "key_cache has dtype float16"),
        ("value-dtype", (q, kc, vc.float(), table, seq), {}, TypeError, "value_cache"),
        ("heads-not-multiple", (q[:, :3], kc, vc, table, seq), {}, ValueError, "multiple of the KV heads"),
        (
            "head-dim-mismatch",
            (q, kc[..., :32], vc[..., :32], table, seq),
            {},
            ValueError,
            r"key_cache has shape",
        ),
        ("table-int64", (q, kc, vc, table.long(), seq), {}, TypeError, "block_tables has dtype int64"),
        ("lens-int64", (q, kc, vc, table, seq.long()), {}, TypeError, "seq_lens has dtype int64"),
        ("table-rows", (q, kc, vc, table[:1], seq), {}, ValueError, r"block_tables has shape \(1, 2\)"),
        (
            "query-head-dim-strided",
            (q.transpose(1, 2).contiguous().transpose(1, 2)[:, :, :], kc, vc, table, seq),
            {},
            ValueError,
            "query has strides",
        ),
        ("negative-softcap", (q, kc, vc, table, seq), {"softcap": -1.0}, ValueError, "softcap must be"),
        ("window-left", (q, kc, vc, table, seq), {"window_left": -2}, ValueError, "window_left = -2"),
        (
            "sinks-shape",
            (q, kc, vc, table, seq),
            {"sinks": torch.zeros(2, device=device)},
            ValueError,
            r"sinks has shape \(2,\)",
        ),
        (
            "lse-dtype",
            (q, kc, vc, table, seq),
            {"lse": torch.zeros(2, 4, device=device, dtype=torch.bfloat16)},
            TypeError,
            "lse has dtype bfloat16",
        ),
        (
            "scales-plain-cache",
            (q, kc, vc, table, seq),
            {"k_scale": torch.ones(1, device=device), "v_scale": torch.ones(1, device=device)},
            ValueError,
            "fp8 cache",
        ),
    ]
    mq, mk, mv, mt, ms = _mla(device, torch.bfloat16, 0, [20, 7])
    cases += [
        (
            "mla-value-dim-past-key",
            (mq, mk, torch.zeros(*mk.shape[:3], 640, dtype=mk.dtype, device=device), mt, ms),
            {},
            ValueError,
            r"value_cache has head dim 640 and key_cache 576: the value head dim must be between 1 and",
        ),
        (
            "mla-out-key-dim",
            (mq, mk, mv, mt, ms),
            {"out": torch.empty(2, 16, 576, dtype=mq.dtype, device=device)},
            ValueError,
            r"out has shape \(2, 16, 576\), expected \[2, 16, 512\] \(value_cache's head dim 512\)",
        ),
        (
            "mla-value-blocks",
            (mq, mk, mv[:3], mt, ms),
            {},
            ValueError,
            r"value_cache has shape \(3, 16, 1, 512\), expected \[7, 16, 1, Dv\] like key_cache \(Dv <= 576",
        ),
        (
            "mla-value-dtype",
            (mq, mk, mv.float(), mt, ms),
            {},
            TypeError,
            "value_cache",
        ),
    ]
    (q8, kq, vq, t8, s8), kw = _fp8((q, kc, vc, table, seq))
    cases += [
        ("fp8-without-scales", (q8, kq, vq, t8, s8), {}, ValueError, "needs k_scale and v_scale"),
        (
            "fp8-scale-dtype",
            (q8, kq, vq, t8, s8),
            {**kw, "k_scale": kw["k_scale"].double()},
            TypeError,
            "k_scale has dtype float64",
        ),
    ]
    if device == "cpu":  # on CUDA the kernels clamp lengths and skip bad blocks (no sync to check)
        bad = table.clone()
        bad[1, 0] = kc.shape[0]
        cases.append(
            (
                "block-past-num-blocks",
                (q, kc, vc, bad, seq),
                {},
                ValueError,
                r"block_tables\[1, 0\] = 7 is out of range \[0, 7\)",
            )
        )
        bad = table.clone()
        bad[0, 1] = -3
        cases.append(
            (
                "negative-block",
                (q, kc, vc, bad, seq),
                {},
                ValueError,
                r"block_tables\[0, 1\] = -3 .*sequence 0",
            )
        )
        cases.append(
            (
                "len-past-capacity",
                (q, kc, vc, table, torch.tensor([20, 33], dtype=I32)),
                {},
                ValueError,
                r"seq_lens\[1\] = 33 is out of range \[0, 32\]",
            )
        )
        cases.append(
            (
                "negative-len",
                (q, kc, vc, table, torch.tensor([-1, 3], dtype=I32)),
                {},
                ValueError,
                r"seq_lens\[0\] = -1",
            )
        )
    return cases


def _prefill(
    device: str,
    dtype: torch.dtype,
    seed: int,
    q_lens: list[int],
    prefix: list[int],
    hq: int = 4,
    hkv: int = 2,
    d: int = 64,
    page: int = 16,
    width: int = 0,
    hnd: bool = False,
) -> tuple[torch.Tensor, ...]:
    """(query, key_cache, value_cache, block_tables, seq_lens, cu_seqlens_q): sequence ``b`` has
    ``prefix[b]`` cached tokens and ``q_lens[b]`` new ones (all in the cache), its blocks shuffled."""
    lens = [p + n for p, n in zip(prefix, q_lens, strict=True)]
    _, kc, vc, table, seq = _decode(device, dtype, seed, lens, hq, hkv, d, page, width, hnd=hnd)
    g = torch.Generator().manual_seed(seed + 1000)
    query = torch.randn(sum(q_lens), hq, d, generator=g).to(dtype=dtype, device=device)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=I32, device=device)
    return query, kc, vc, table, seq, cu


def _prefill_mla(
    device: str,
    dtype: torch.dtype,
    seed: int,
    q_lens: list[int],
    prefix: list[int],
    hq: int = 16,
    page: int = 16,
    view: bool = True,
    d: int = 576,
    dv: int = 512,
    hkv: int = 1,
) -> tuple[torch.Tensor, ...]:
    """A prefill over an MLA cache (as ``_mla``): the value cache ``key_cache[..., :dv]`` (the
    latent cache's prefix view) or one of its own ``[.., dv]``."""
    q, kc, vc, table, seq, cu = _prefill(device, dtype, seed, q_lens, prefix, hq, hkv, d, page)
    return q, kc, kc[..., :dv] if view else vc[..., d - dv :].contiguous(), table, seq, cu


def _tree_mask(
    device: str, cu: torch.Tensor, lens: torch.Tensor, seed: int, indptr_dtype: torch.dtype = torch.int64
) -> dict[str, torch.Tensor]:
    """A custom mask for each sequence's ``[q_len, seq_len]``: random (future positions too: the
    mask replaces the causal rule), each query seeing its own position, and its offsets."""
    g = torch.Generator().manual_seed(seed)
    parts, ind = [], [0]
    for b, n in enumerate(lens.tolist()):
        q = int(cu[b + 1] - cu[b])
        m = torch.rand(q, n, generator=g) < 0.4
        m[torch.arange(q), n - q + torch.arange(q)] = True
        parts.append(m.flatten())
        ind.append(ind[-1] + q * n)
    mask = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.bool)
    return {
        "custom_mask": mask.to(device),
        "mask_indptr": torch.tensor(ind, dtype=indptr_dtype, device=device),
    }


def _mask_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    """Custom (tree) masks: with a cached prefix, int32 offsets with the prefix always seen
    (``mask_prefix=False``) and a window, a row left empty (0 and the sink's lse), MLA; and no
    mask at all (``causal=False``), with a window, lse and sinks."""
    args = _prefill(device, dtype, 50, [9, 30, 1], [40, 17, 70])
    out = [Sample("custom-mask", args, _tree_mask(device, args[5].cpu(), args[4].cpu(), 50))]
    args = _prefill(device, dtype, 51, [7, 12], [20, 0], page=5)
    kw: dict[str, Any] = {**_tree_mask(device, args[5].cpu(), args[4].cpu(), 51, I32), "mask_prefix": False}
    out.append(Sample("custom-mask-i32-prefix-seen-window", args, {**kw, "window_left": 6}))
    args = _prefill(device, dtype, 52, [5, 3], [4, 0])
    kw = _tree_mask(device, args[5].cpu(), args[4].cpu(), 52)
    kw["custom_mask"][:9] = False  # sequence 0's first query sees nothing
    g = torch.Generator().manual_seed(52)
    kw |= {"lse": torch.empty(8, 4, device=device), "sinks": torch.randn(4, generator=g).to(device)}
    out.append(Sample("custom-mask-empty-row-lse-sinks", args, kw))
    q, kc, vc, table, seq, cu = _prefill(device, dtype, 56, [7, 3], [9, 14], hq=8, hkv=2, hnd=True)
    (q8, kq, vq, t8, s8), kw8 = _fp8((q, kc, vc, table, seq))
    kw8 |= _tree_mask(device, cu.cpu(), seq.cpu(), 56)
    out.append(Sample("custom-mask-fp8-hnd", (q8, kq, vq, t8, s8, cu), kw8))
    args = _prefill(device, dtype, 54, [12, 5, 1], [0, 9, 20], page=5)
    out.append(Sample("non-causal", args, {"causal": False}))
    args = _prefill(device, dtype, 55, [9, 4], [6, 0])
    g2 = torch.Generator().manual_seed(55)
    kw = {"causal": False, "window_left": 3, "lse": torch.empty(13, 4, device=device)}
    out.append(
        Sample("non-causal-window-lse-sinks", args, {**kw, "sinks": torch.randn(4, generator=g2).to(device)})
    )
    args = _prefill_mla(device, dtype, 53, [6, 2], [11, 5])
    out.append(
        Sample(
            "mla-custom-mask",
            args,
            {**_tree_mask(device, args[5].cpu(), args[4].cpu(), 53), "scale": MLA_SCALE},
        )
    )
    return out


def paged_prefill_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    out = [
        Sample("causal-prefill-gqa-4-2", _prefill(device, dtype, 0, [37, 20], [0, 0])),
        Sample("extend-gqa-4-2-page16", _prefill(device, dtype, 1, [9, 30, 1], [40, 17, 70])),
        Sample("ragged-empty-q", _prefill(device, dtype, 2, [0, 12, 0, 5], [8, 3, 0, 0])),
        Sample("mqa-8-1-d80-page5", _prefill(device, dtype, 3, [13, 6], [11, 0], hq=8, hkv=1, d=80, page=5)),
        Sample("mha-2-2-d128-page1", _prefill(device, dtype, 4, [7, 3], [5, 9], hq=2, hkv=2, d=128, page=1)),
        Sample("group-3-d96-page3", _prefill(device, dtype, 5, [10], [7], hq=3, hkv=1, d=96, page=3)),
        Sample("d256-page128", _prefill(device, dtype, 6, [6, 4], [130, 0], hq=2, hkv=1, d=256, page=128)),
        Sample("wide-table", _prefill(device, dtype, 7, [5, 3], [20, 0], width=9)),
        Sample("softcap", _prefill(device, dtype, 8, [14, 6], [9, 30], page=5), {"softcap": 0.5}),
        Sample("scale", _prefill(device, dtype, 9, [11, 4], [0, 21]), {"scale": 0.3}),
        Sample("window-left-7", _prefill(device, dtype, 10, [20, 9], [25, 0], page=5), {"window_left": 7}),
        Sample("window-left-0", _prefill(device, dtype, 11, [6, 1], [4, 9]), {"window_left": 0}),
        Sample("hnd-view", _prefill(device, dtype, 12, [12, 8], [19, 33], hq=8, hkv=2, hnd=True)),
    ]
    g = torch.Generator().manual_seed(13)
    sinks = (torch.randn(4, generator=g) * 2).to(device)
    out.append(Sample("sinks", _prefill(device, dtype, 13, [9, 0, 4], [30, 2, 0]), {"sinks": sinks}))
    args = _prefill(device, dtype, 14, [10, 7], [15, 0], hq=8, hkv=1, page=5)
    kw = {"lse": torch.full((17, 8), 7.0, device=device), "sinks": torch.randn(8, generator=g).to(device)}
    out.append(Sample("lse-sinks-softcap-window", args, {**kw, "softcap": 4.0, "window_left": 9}))
    args = _prefill(device, dtype, 15, [6, 5], [3, 20])
    out.append(Sample("lse-strided", args, {"lse": torch.zeros(4, 11, device=device).t()}))
    q, kc, vc, table, seq, cu = _prefill(device, dtype, 16, [8, 4], [10, 2])
    wide = torch.randn(12, 4, 160, generator=g).to(dtype=dtype, device=device)
    out.append(Sample("strided-query", (wide[:, :, 32:96], kc, vc, table, seq, cu)))
    (q8, kq, vq, t8, s8), kw8 = _fp8((q, kc, vc, table, seq))
    out.append(Sample("fp8-cache", (q8, kq, vq, t8, s8, cu), kw8))
    q, kc, vc, table, seq, cu = _prefill(
        device, dtype, 17, [9, 3], [13, 0], hq=8, hkv=1, d=80, page=5, hnd=True
    )
    (q8, kq, vq, t8, s8), kw8 = _fp8((q, kc, vc, table, seq))
    kw = {**kw8, "sinks": sinks.new_zeros(8), "lse": torch.empty(12, 8, device=device), "window_left": 5}
    out.append(Sample("fp8-hnd-sinks-lse-window", (q8, kq, vq, t8, s8, cu), kw))
    caller = torch.full((9, 4, 64), 3.0, dtype=dtype, device=device)
    out.append(Sample("caller-out", _prefill(device, dtype, 18, [4, 5], [6, 0]), {"out": caller}))
    return out + _prefill_mla_samples(device, dtype) + _mask_samples(device, dtype)


def _prefill_mla_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    """MLA's value head dim below the key's: 576 / 512 with the value cache as the key's prefix
    view or its own, groups of 16 and 128, fp8, softcap / sinks / window / lse; 192 / 128."""
    mla = {"scale": MLA_SCALE}
    g = torch.Generator().manual_seed(40)
    out = [
        Sample("mla-576-512-h16-page16-view", _prefill_mla(device, dtype, 30, [9, 0, 3], [20, 4, 0]), mla),
        Sample(
            "mla-576-512-h16-page1-own",
            _prefill_mla(device, dtype, 31, [5, 4], [7, 0], page=1, view=False),
            mla,
        ),
        Sample(
            "mla-576-512-h128-page64-view-lse",
            _prefill_mla(device, dtype, 32, [3, 2], [70, 0], hq=128, page=64),
            {**mla, "lse": torch.empty(5, 128, device=device)},
        ),
        Sample(
            "mla-576-512-softcap-sinks-window",
            _prefill_mla(device, dtype, 33, [8, 5], [12, 30], page=5, view=False),
            {**mla, "softcap": 5.0, "window_left": 9, "sinks": torch.randn(16, generator=g).to(device)},
        ),
        Sample(
            "mla-192-128-gqa-8-2",
            _prefill_mla(device, dtype, 34, [10, 6], [9, 0], hq=8, hkv=2, d=192, dv=128),
        ),
        Sample(
            "mla-caller-out",
            _prefill_mla(device, dtype, 35, [4, 3], [6, 0]),
            {**mla, "out": torch.full((7, 16, 512), 3.0, dtype=dtype, device=device)},
        ),
    ]
    q, kc, _, table, seq, cu = _prefill_mla(device, dtype, 36, [6, 2], [11, 5])
    (q8, kq, _, t8, s8), kw = _fp8((q, kc, kc, table, seq))
    kw["v_scale"] = kw["k_scale"]  # one latent cache: one scale for its rows
    out.append(Sample("mla-fp8-view", (q8, kq, kq[..., :512], t8, s8, cu), {**kw, **mla}))
    return out


def paged_prefill_invalid(device: str) -> Invalid:
    q, kc, vc, table, seq, cu = _prefill(device, torch.bfloat16, 0, [5, 3], [15, 4])
    a = (q, kc, vc, table, seq, cu)
    cases: Invalid = [
        ("query-int", (q.int(), *a[1:]), {}, TypeError, "dtype int32"),
        ("query-rank", (q[0], *a[1:]), {}, ValueError, r"total_q_tokens, num_heads, head_dim"),
        ("cache-dtype", (q, kc.half(), vc.half(), *a[3:]), {}, TypeError, "key_cache has dtype float16"),
        ("heads-not-multiple", (q[:, :3], *a[1:]), {}, ValueError, "multiple of the KV heads"),
        ("table-int64", (q, kc, vc, table.long(), seq, cu), {}, TypeError, "block_tables has dtype int64"),
        ("lens-rows", (q, kc, vc, table, seq[:1], cu), {}, ValueError, r"seq_lens has shape \(1,\)"),
        ("cu-int64", (q, kc, vc, table, seq, cu.long()), {}, TypeError, "cu_seqlens_q has dtype int64"),
        (
            "cu-length",
            (q, kc, vc, table, seq, cu[:2]),
            {},
            ValueError,
            r"cu_seqlens_q has shape \(2,\), expected \[3\]",
        ),
        ("window-left", a, {"window_left": -2}, ValueError, "window_left = -2"),
        ("negative-softcap", a, {"softcap": -1.0}, ValueError, "softcap must be"),
        ("sinks-shape", a, {"sinks": torch.zeros(2, device=device)}, ValueError, r"sinks has shape \(2,\)"),
        (
            "lse-shape",
            a,
            {"lse": torch.zeros(2, 4, device=device)},
            ValueError,
            r"lse has shape \(2, 4\), expected \[8, 4\]",
        ),
        (
            "out-shape",
            a,
            {"out": torch.zeros(2, 4, 64, device=device, dtype=torch.bfloat16)},
            ValueError,
            "out has shape",
        ),
    ]
    (q8, kq, vq, t8, s8), _ = _fp8((q, kc, vc, table, seq))
    cases.append(
        ("fp8-without-scales", (q8, kq, vq, t8, s8, cu), {}, ValueError, "needs k_scale and v_scale")
    )
    vbig = torch.zeros(*vc.shape[:3], 96, dtype=vc.dtype, device=device)
    cases += [  # the value head dim Dv <= D (MLA's Dv < D, as paged_decode)
        (
            "value-dim-past-key",
            (q, kc, vbig, table, seq, cu),
            {},
            ValueError,
            r"value_cache has head dim 96 and key_cache 64: the value head dim must be between 1 and",
        ),
        (
            "mla-out-key-dim",
            (q, kc, vc[..., :32], table, seq, cu),
            {"out": torch.empty(8, 4, 64, dtype=q.dtype, device=device)},
            ValueError,
            r"out has shape \(8, 4, 64\), expected \[8, 4, 32\] \(value_cache's head dim 32\)",
        ),
        (
            "mla-value-blocks",
            (q, kc, vc[:3, ..., :32], table, seq, cu),
            {},
            ValueError,
            r"value_cache has shape \(3, 16, 2, 32\), expected \[7, 16, 2, Dv\] like key_cache \(Dv <= 64",
        ),
    ]
    m = _tree_mask(device, cu.cpu(), seq.cpu(), 0)
    mask, ind = m["custom_mask"], m["mask_indptr"]
    cases += [  # the custom mask: both or neither, bool, flat, offsets per sequence
        (
            "mask-without-indptr",
            a,
            {"custom_mask": mask},
            ValueError,
            "custom_mask and mask_indptr come together",
        ),
        (
            "indptr-without-mask",
            a,
            {"mask_indptr": ind},
            ValueError,
            "custom_mask and mask_indptr come together",
        ),
        (
            "mask-uint8",
            a,
            {"custom_mask": mask.to(torch.uint8), "mask_indptr": ind},
            TypeError,
            "custom_mask has dtype uint8",
        ),
        (
            "indptr-float",
            a,
            {"custom_mask": mask, "mask_indptr": ind.float()},
            TypeError,
            "mask_indptr has dtype float32",
        ),
        (
            "indptr-length",
            a,
            {"custom_mask": mask, "mask_indptr": ind[:2]},
            ValueError,
            r"mask_indptr has shape \(2,\), expected \[3\]",
        ),
        ("mask-2d", a, {"custom_mask": mask[None], "mask_indptr": ind}, ValueError, "custom_mask has shape"),
    ]
    if device == "cpu":  # on CUDA the kernels clamp offsets and lengths and skip bad blocks (no sync)

        def i32(v: list[int]) -> torch.Tensor:
            return torch.tensor(v, dtype=I32)

        cases += [
            (
                "mask-span",
                a,
                {"custom_mask": mask, "mask_indptr": torch.tensor([0, 5 * 20, 5 * 20 + 12])},
                ValueError,
                r"mask_indptr\[2\] - mask_indptr\[1\] = 12, but sequence 1's custom mask is its \[q_len, "
                r"seq_len\] = \[3, 7\] matrix: 21 entries",
            ),
            (
                "mask-past-end",
                a,
                {"custom_mask": mask[:-1], "mask_indptr": ind},
                ValueError,
                r"sequence 1's custom mask, entries \[100, 121\) \(mask_indptr\[1\] = 100\), is outside "
                r"custom_mask's 120 entries",
            ),
        ]
        bad = table.clone()
        bad[1, 0] = kc.shape[0]
        cases += [
            (
                "block-past-num-blocks",
                (q, kc, vc, bad, seq, cu),
                {},
                ValueError,
                r"block_tables\[1, 0\] = 7 is out of range \[0, 7\)",
            ),
            (
                "len-past-capacity",
                (q, kc, vc, table, i32([20, 33]), cu),
                {},
                ValueError,
                r"seq_lens\[1\] = 33 is out of range \[0, 32\]",
            ),
            ("negative-len", (q, kc, vc, table, i32([-1, 7]), cu), {}, ValueError, r"seq_lens\[0\] = -1"),
            (
                "q-len-past-seq-len",
                (q, kc, vc, table, i32([20, 2]), cu),
                {},
                ValueError,
                r"sequence 1 has 3 new tokens .* seq_lens\[1\] = 2",
            ),
            ("cu-start", (q, kc, vc, table, seq, i32([1, 5, 8])), {}, ValueError, r"cu_seqlens_q\[0\] = 1"),
            (
                "cu-decreasing",
                (q, kc, vc, table, seq, i32([0, 9, 8])),
                {},
                ValueError,
                r"cu_seqlens_q\[2\] = 8 < cu_seqlens_q\[1\] = 9",
            ),
            (
                "cu-end",
                (q, kc, vc, table, seq, i32([0, 5, 7])),
                {},
                ValueError,
                r"cu_seqlens_q\[2\] = 7 but query has 8 rows",
            ),
        ]
    return cases
