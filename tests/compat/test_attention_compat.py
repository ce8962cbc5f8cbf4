"""The engines' attention entry points (opmux.compat.vllm.unified_attention,
opmux.compat.sgl_kernel.decode_attention_fwd / extend_attention_fwd) against a float32 reference
written here, one sequence at a time with einsum: mixed prefill + decode batches, GQA, page sizes
1 and 16, softcap, sliding window, sinks, fp8 caches, MLA's 576 / 512 decode and extend, and the
refused arguments."""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import pytest
import torch

import opmux.compat.sgl_kernel as sgl
import opmux.compat.vllm as vllm

FP8 = torch.float8_e4m3fn
HQ, HKV, D = 4, 2, 16


@pytest.fixture(params=("triton", "torch"))
def attn_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each attention backend that runs on the CPU, forced (a fallback fails the test)."""
    import opmux.kernels as K

    monkeypatch.setenv("OPMUX_FALLBACK", "error")
    K.refresh()
    with K.use_backends(f"attention.*={request.param}"):
        yield request.param


def ref_seq(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    softcap: float = 0.0,
    window: int = -1,
    sinks: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """One sequence: q [ql, Hq, D] are the last ql positions of k / v [n, Hkv, D]; causal (or
    ``mask [ql, n]`` in its place), window (positions >= qpos - window), softcap, sinks in the
    denominator; float32."""
    q, k, v = q.float(), k.float(), v.float()
    ql, hq, _ = q.shape
    n, hkv = k.shape[0], k.shape[1]
    kk, vv = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
    s = torch.einsum("qhd,nhd->hqn", q, kk) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    qpos = (n - ql + torch.arange(ql))[:, None]
    pos = torch.arange(n)[None, :]
    keep = pos <= qpos if mask is None else mask
    if window >= 0:
        keep = keep & (pos >= qpos - window)
    s = s.masked_fill(~keep[None], float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.float()[:, None, None].expand(hq, ql, 1)], 2)
    p = torch.softmax(s, -1)[..., :n]
    return torch.einsum("hqn,nhd->qhd", p, vv)


# -- vLLM unified_attention --------------------------------------------------------------------
UNIFIED = [
    "q",
    "k",
    "v",
    "out",
    "cu_seqlens_q",
    "max_seqlen_q",
    "seqused_k",
    "max_seqlen_k",
    "softmax_scale",
    "causal",
    "window_size",
    "block_table",
    "softcap",
    "q_descale",
    "k_descale",
    "v_descale",
]
DECODE = ["q", "k_buffer", "v_buffer", "o", "kv_indptr", "kv_indices", "attn_logits", "attn_lse"]
DECODE += ["num_kv_splits", "max_kv_splits", "sm_scale", "k_scale", "v_scale", "logit_cap", "sinks"]
EXTEND = ["q_extend", "k_extend", "v_extend", "o_extend", "k_buffer", "v_buffer", "qo_indptr", "kv_indptr"]
EXTEND += ["kv_indices", "custom_mask", "is_causal", "mask_indptr", "max_len_extend", "k_scale", "v_scale"]
EXTEND += ["sm_scale", "logit_cap", "skip_prefix_custom_mask", "sliding_window_size", "sinks"]


def test_signatures_are_the_engines() -> None:
    assert list(inspect.signature(vllm.unified_attention).parameters)[: len(UNIFIED)] == UNIFIED
    assert list(inspect.signature(sgl.decode_attention_fwd).parameters)[: len(DECODE)] == DECODE
    assert list(inspect.signature(sgl.extend_attention_fwd).parameters)[: len(EXTEND)] == EXTEND
    assert "unified_attention" in vllm.__all__
    assert {"decode_attention_fwd", "extend_attention_fwd"} <= set(sgl.__all__)


def _paged_batch(ps: int, q_lens: list[int], kv_lens: list[int], seed: int) -> dict[str, torch.Tensor]:
    """A flash-layout cache [nb, ps, Hkv, D] with each sequence's blocks scattered at random."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // ps) for n in kv_lens]
    nb = sum(need) + 3
    perm = torch.randperm(nb, generator=g)
    width = max(need)
    table = torch.zeros((len(kv_lens), width), dtype=torch.int32)
    at = 0
    for b, m in enumerate(need):
        table[b, :m] = perm[at : at + m]
        at += m
    return {
        "q": torch.randn(sum(q_lens), HQ, D, generator=g),
        "kc": torch.randn(nb, ps, HKV, D, generator=g),
        "vc": torch.randn(nb, ps, HKV, D, generator=g),
        "table": table,
        "cu": torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32),
        "lens": torch.tensor(kv_lens, dtype=torch.int32),
        "sinks": torch.randn(HQ, generator=g),
    }


def _seq_kv(cache: torch.Tensor, table: torch.Tensor, b: int, n: int) -> torch.Tensor:
    ps = cache.shape[1]
    pos = torch.arange(n)
    return cache[table[b, pos // ps].long(), pos % ps]


# a mixed batch: a decode, a chunked prefill over a prefix, a decode of a 1-token sequence, a
# plain prefill
Q_LENS, KV_LENS = [1, 4, 1, 3], [9, 21, 1, 3]


@pytest.mark.parametrize("ps", [1, 16])
@pytest.mark.parametrize(
    ("softcap", "window", "use_sinks"), [(0.0, -1, False), (5.0, -1, True), (0.0, 4, False), (3.0, 2, True)]
)
def test_unified_attention_mixed_batch(
    attn_backend: str, ps: int, softcap: float, window: int, use_sinks: bool
) -> None:
    t = _paged_batch(ps, Q_LENS, KV_LENS, seed=ps + window)
    scale = 0.3
    pad = 2  # CUDA-graph padding rows past cu_seqlens_q[-1]: left as they are
    q = torch.cat([t["q"], torch.randn(pad, HQ, D)])
    out = torch.full_like(q, 7.0)
    # float32 sinks, and a model-dtype (bf16) one converted by the entry
    sinks = t["sinks"].to(torch.bfloat16 if softcap > 4 else torch.float32) if use_sinks else None
    vllm.unified_attention(
        q=q,
        k=t["kc"],
        v=t["vc"],
        out=out,
        cu_seqlens_q=t["cu"],
        max_seqlen_q=max(Q_LENS),
        seqused_k=t["lens"],
        max_seqlen_k=max(KV_LENS),
        softmax_scale=scale,
        causal=True,
        window_size=(window, 0) if window >= 0 else (-1, -1),
        block_table=t["table"],
        softcap=softcap,
        q_descale=None,
        k_descale=None,
        v_descale=None,
        sinks=sinks,
    )
    for b, n in enumerate(KV_LENS):
        r0, r1 = int(t["cu"][b]), int(t["cu"][b + 1])
        k, v = _seq_kv(t["kc"], t["table"], b, n), _seq_kv(t["vc"], t["table"], b, n)
        s = sinks.float() if sinks is not None else None
        want = ref_seq(q[r0:r1], k, v, scale, softcap, window, s)
        torch.testing.assert_close(out[r0:r1], want, atol=2e-5, rtol=2e-5)
    assert bool((out[-pad:] == 7.0).all())


@pytest.mark.parametrize("as_bytes", [False, True])
def test_unified_attention_fp8_cache(attn_backend: str, as_bytes: bool) -> None:
    """fp8 caches with vLLM's [num_seqs, Hkv] descales: the first element dequantizes (vLLM's
    per-tensor mode), uint8 bytes read as e4m3."""
    t = _paged_batch(16, Q_LENS, KV_LENS, seed=5)
    kq, vq = (t["kc"] / 0.5).to(FP8), (t["vc"] / 0.25).to(FP8)
    nseq = len(Q_LENS)
    out = torch.empty_like(t["q"])
    vllm.unified_attention(
        t["q"],
        kq.view(torch.uint8) if as_bytes else kq,
        vq.view(torch.uint8) if as_bytes else vq,
        out,
        t["cu"],
        max(Q_LENS),
        t["lens"],
        max(KV_LENS),
        D**-0.5,
        True,
        (-1, -1),
        t["table"],
        0,
        None,
        torch.full((nseq, HKV), 0.5),
        torch.full((nseq, HKV), 0.25),
    )
    for b, n in enumerate(KV_LENS):
        r0, r1 = int(t["cu"][b]), int(t["cu"][b + 1])
        k = _seq_kv(kq, t["table"], b, n).float() * 0.5
        v = _seq_kv(vq, t["table"], b, n).float() * 0.25
        torch.testing.assert_close(out[r0:r1], ref_seq(t["q"][r0:r1], k, v, D**-0.5), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"alibi_slopes": torch.ones(HQ)}, "alibi_slopes"),
        ({"qq_bias": torch.zeros(4, 4)}, "qq_bias"),
        ({"output_scale": torch.ones(1)}, "output_scale"),
        ({"causal": False}, "causal=False"),
        ({"q_descale": torch.ones(1)}, "q_descale"),
        ({"mm_prefix_range": torch.zeros(1, 1, 2, dtype=torch.int32)}, "mm_prefix_range"),
        ({"kv_quant_mode": 2}, "kv_quant_mode"),
        ({"use_alibi_sqrt": True}, "use_alibi_sqrt"),
    ],
)
def test_unified_attention_refusals(kwargs: dict[str, object], names: str) -> None:
    t = _paged_batch(16, [1], [5], seed=1)
    out = torch.full_like(t["q"], 3.0)
    args = {
        "q": t["q"],
        "k": t["kc"],
        "v": t["vc"],
        "out": out,
        "cu_seqlens_q": t["cu"],
        "max_seqlen_q": 1,
        "seqused_k": t["lens"],
        "max_seqlen_k": 5,
        "softmax_scale": 0.25,
        "causal": True,
        "window_size": (-1, -1),
        "block_table": t["table"],
        "softcap": 0.0,
        "q_descale": None,
        "k_descale": None,
        "v_descale": None,
        **kwargs,
    }
    with pytest.raises(NotImplementedError, match=names):
        vllm.unified_attention(**args)  # type: ignore[arg-type]
    assert bool((out == 3.0).all())  # nothing written


def test_unified_attention_fp8_cache_needs_descales() -> None:
    t = _paged_batch(16, [1], [5], seed=2)
    with pytest.raises(ValueError, match="k_descale"):
        vllm.unified_attention(
            t["q"], t["kc"].to(FP8), t["vc"].to(FP8), torch.empty_like(t["q"]), t["cu"], 1, t["lens"], 5,
            0.25, True, (-1, -1), t["table"], 0.0, None, None, None,
        )  # fmt: skip


# -- SGLang decode / extend (token pools, page size 1) ---------------------------------------------
def _pool(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Generator]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, HKV, D, generator=g), torch.randn(n, HKV, D, generator=g), g


def _csr(lens: list[int], n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """kv_indptr / kv_indices over distinct random pool rows (int64 indices, as SGLang's arange)."""
    indptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    return indptr, torch.randperm(n, generator=g)[: sum(lens)]


@pytest.mark.parametrize(
    ("softcap", "use_sinks", "kv_scales", "fp8"),
    [(0.0, False, (1.0, 1.0), False), (4.0, True, (0.5, 2.0), False), (0.0, True, (0.5, 0.25), True)],
)
def test_sgl_decode_attention(
    attn_backend: str, softcap: float, use_sinks: bool, kv_scales: tuple[float, float], fp8: bool
) -> None:
    kb, vb, g = _pool(48, seed=3)
    lens = [5, 1, 17]
    indptr, indices = _csr(lens, 48, g)
    bsz = len(lens)
    q = torch.randn(bsz, HQ, D, generator=g)
    o = torch.empty_like(q)
    sinks = torch.randn(HQ, generator=g) if use_sinks else None
    ks, vs = kv_scales
    if fp8:
        kb, vb = (kb / ks).to(FP8), (vb / vs).to(FP8)
    splits = 4
    sgl.decode_attention_fwd(
        q,
        kb,
        vb,
        o,
        indptr,
        indices,
        torch.empty(bsz, HQ, splits, D),
        torch.empty(bsz, HQ, splits),
        torch.full((bsz,), splits, dtype=torch.int32),
        splits,
        0.3,
        ks,
        vs,
        logit_cap=softcap,
        sinks=sinks,
    )
    for b in range(bsz):
        rows = indices[int(indptr[b]) : int(indptr[b + 1])]
        k, v = kb[rows].float(), vb[rows].float()
        if fp8:  # the pool holds x / scale: K = fp8 * scale
            want = ref_seq(q[b : b + 1], k * ks, v * vs, 0.3, softcap, -1, sinks)
        else:  # SGLang: logits scaled by sm_scale * k_scale, the output by v_scale
            want = ref_seq(q[b : b + 1], k, v, 0.3 * ks, softcap, -1, sinks) * vs
        torch.testing.assert_close(o[b : b + 1], want, atol=1e-4 if fp8 else 2e-5, rtol=1e-4 if fp8 else 2e-5)


def test_sgl_decode_halves_take_the_scale_with_k(attn_backend: str) -> None:
    """decode_attention_fwd_normal / _grouped: ``sm_scale_withk`` is the whole logit scale."""
    kb, vb, g = _pool(20, seed=4)
    indptr, indices = _csr([6, 9], 20, g)
    q = torch.randn(2, HQ, D, generator=g)
    ws = (torch.empty(2, HQ, 2, D), torch.empty(2, HQ, 2), torch.full((2,), 2, dtype=torch.int32), 2)
    a, b = torch.empty_like(q), torch.empty_like(q)
    sgl.decode_attention_fwd_normal(q, kb, vb, a, indptr, indices, *ws, 0.2)
    sgl.decode_attention_fwd(q, kb, vb, b, indptr, indices, *ws, 0.4, 0.5)
    torch.testing.assert_close(a, b)
    rows = indices[:6]
    torch.testing.assert_close(a[:1], ref_seq(q[:1], kb[rows], vb[rows], 0.2), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize(
    ("softcap", "window", "use_sinks", "kv_scales"),
    [(0.0, -1, False, (1.0, 1.0)), (3.0, 3, True, (1.0, 1.0)), (0.0, -1, True, (0.5, 2.0))],
)
def test_sgl_extend_attention(
    attn_backend: str, softcap: float, window: int, use_sinks: bool, kv_scales: tuple[float, float]
) -> None:
    """Prefixes through kv_indices (one empty), the new tokens apart, causal among themselves."""
    kb, vb, g = _pool(40, seed=6)
    pre, ext = [4, 0, 7], [3, 2, 1]
    kv_indptr, kv_indices = _csr(pre, 40, g)
    qo = torch.tensor([0, *torch.tensor(ext).cumsum(0).tolist()], dtype=torch.int32)
    rows = sum(ext)
    q, ke, ve = (torch.randn(rows, h, D, generator=g) for h in (HQ, HKV, HKV))
    o = torch.full_like(q, 9.0)
    sinks = torch.randn(HQ, generator=g) if use_sinks else None
    ks, vs = kv_scales
    sgl.extend_attention_fwd(
        q, ke, ve, o, kb, vb, qo, kv_indptr, kv_indices, None, True, None, max(ext), ks, vs,
        sm_scale=0.35, logit_cap=softcap, sliding_window_size=window, sinks=sinks,
    )  # fmt: skip
    for b in range(len(pre)):
        idx = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])]
        r0, r1 = int(qo[b]), int(qo[b + 1])
        k = torch.cat([kb[idx] * ks, ke[r0:r1]])
        v = torch.cat([vb[idx] * vs, ve[r0:r1]])
        want = ref_seq(q[r0:r1], k, v, 0.35, softcap, window, sinks)
        torch.testing.assert_close(o[r0:r1], want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        (
            {
                "custom_mask": torch.ones(12, dtype=torch.bool),
                "mask_indptr": torch.tensor([0, 12]),
                "sliding_window_size": 2,
                "window_kv_offsets": torch.zeros(1, dtype=torch.int32),
            },
            "window_kv_offsets",
        ),
        ({"is_causal": False, "sliding_window_size": 2}, "is_causal=False with a sliding window"),
        ({"xai_temperature_len": 8}, "xai_temperature_len"),
    ],
)
def test_sgl_extend_refusals(kwargs: dict[str, object], names: str) -> None:
    kb, vb, g = _pool(8, seed=7)
    kv_indptr, kv_indices = _csr([2], 8, g)
    q, ke, ve = torch.randn(2, HQ, D), torch.randn(2, HKV, D), torch.randn(2, HKV, D)
    args = {
        "q_extend": q, "k_extend": ke, "v_extend": ve, "o_extend": torch.empty_like(q), "k_buffer": kb,
        "v_buffer": vb, "qo_indptr": torch.tensor([0, 2], dtype=torch.int32), "kv_indptr": kv_indptr,
        "kv_indices": kv_indices, "custom_mask": None, "is_causal": True, "mask_indptr": None,
        "max_len_extend": 2, **kwargs,
    }  # fmt: skip
    with pytest.raises(NotImplementedError, match=names):
        sgl.extend_attention_fwd(**args)  # type: ignore[arg-type]


def test_sgl_extend_attention_later_keywords(attn_backend: str) -> None:
    """SGLang's later extend keywords: ``lse_extend`` (natural log, written in its dtype),
    ``page_size`` with paged pools [pages, page_size, H, D] (token locations), the launch hints;
    ``score_mod`` and ``skip_prefix`` refused."""
    kb, vb, g = _pool(40, seed=17)
    pre, ext = [6, 0, 9], [2, 3, 1]
    kv_indptr, kv_indices = _csr(pre, 40, g)
    qo = torch.tensor([0, *torch.tensor(ext).cumsum(0).tolist()], dtype=torch.int32)
    q, ke, ve = (torch.randn(sum(ext), h, D, generator=g) for h in (HQ, HKV, HKV))
    o, lse = torch.empty_like(q), torch.empty(sum(ext), HQ, dtype=torch.bfloat16)
    args = (
        q,
        ke,
        ve,
        o,
        kb.view(10, 4, HKV, D),
        vb.view(10, 4, HKV, D),
        qo,
        kv_indptr,
        kv_indices,
        None,
        True,
    )
    sgl.extend_attention_fwd(
        *args, None, max(ext), sm_scale=0.3, lse_extend=lse, page_size=4, extend_seq_lens_cpu=ext,
        identity_kv_indices=False,
    )  # fmt: skip
    for b in range(len(pre)):
        idx = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])]
        r0, r1 = int(qo[b]), int(qo[b + 1])
        k, v = torch.cat([kb[idx], ke[r0:r1]]), torch.cat([vb[idx], ve[r0:r1]])
        torch.testing.assert_close(o[r0:r1], ref_seq(q[r0:r1], k, v, 0.3), atol=2e-5, rtol=2e-5)
        s = torch.einsum("qhd,nhd->hqn", q[r0:r1], k.repeat_interleave(HQ // HKV, 1)) * 0.3
        s = s.masked_fill(
            torch.arange(len(k))[None, None, :] > (len(idx) + torch.arange(r1 - r0))[None, :, None], -1e30
        )
        torch.testing.assert_close(lse[r0:r1].float(), torch.logsumexp(s, -1).t(), atol=2e-2, rtol=1e-2)
    with pytest.raises(NotImplementedError, match="score_mod"):
        sgl.extend_attention_fwd(*args, None, max(ext), page_size=4, score_mod=lambda *a: a[0])
    with pytest.raises(NotImplementedError, match="skip_prefix"):
        sgl.extend_attention_fwd(*args, None, max(ext), page_size=4, skip_prefix=True)
    with pytest.raises(ValueError, match=r"k_buffer has shape \(10, 4, 2, 16\) .* page_size=8"):
        sgl.extend_attention_fwd(*args, None, max(ext), page_size=8)


@pytest.mark.parametrize("mode", ["tree-skip-prefix", "tree-mask-prefix", "non-causal"])
def test_sgl_extend_attention_custom_mask(attn_backend: str, mode: str) -> None:
    """SGLang's speculative-decoding verify: each request's ``[extend_len, prefix + extend_len]``
    mask row-major from ``mask_indptr`` replaces the causal rule; ``skip_prefix_custom_mask``
    ignores the prefix's columns (random here, so reading them would show); ``is_causal=False``
    with no mask sees every key of the request."""
    kb, vb, g = _pool(40, seed=16)
    pre, ext = [5, 0, 9], [4, 3, 1]
    kv_indptr, kv_indices = _csr(pre, 40, g)
    qo = torch.tensor([0, *torch.tensor(ext).cumsum(0).tolist()], dtype=torch.int32)
    q, ke, ve = (torch.randn(sum(ext), h, D, generator=g) for h in (HQ, HKV, HKV))
    trees, flat = [], []
    for p, e in zip(pre, ext, strict=True):
        m = torch.rand(e, p + e, generator=g) < 0.5
        m[:, p:] &= torch.ones(e, e, dtype=torch.bool).tril()  # ancestors only: a tree is causal
        m[torch.arange(e), p + torch.arange(e)] = True
        trees.append(m)
        flat.append(m.flatten())
    mask_indptr = torch.tensor(
        [0, *torch.tensor([p * e + e * e for p, e in zip(pre, ext, strict=True)]).cumsum(0).tolist()]
    )
    skip = mode == "tree-skip-prefix"
    kw: dict[str, object] = (
        {"custom_mask": torch.cat(flat), "mask_indptr": mask_indptr, "skip_prefix_custom_mask": skip}
        if mode != "non-causal"
        else {}
    )
    o = torch.full_like(q, 9.0)
    sgl.extend_attention_fwd(
        q, ke, ve, o, kb, vb, qo, kv_indptr, kv_indices, kw.pop("custom_mask", None), mode != "non-causal",
        kw.pop("mask_indptr", None), max(ext), sm_scale=0.3, **kw,
    )  # fmt: skip
    for b, (p, e) in enumerate(zip(pre, ext, strict=True)):
        idx = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])]
        r0, r1 = int(qo[b]), int(qo[b + 1])
        k, v = torch.cat([kb[idx], ke[r0:r1]]), torch.cat([vb[idx], ve[r0:r1]])
        keep = torch.ones(e, p + e, dtype=torch.bool) if mode == "non-causal" else trees[b].clone()
        if skip:
            keep[:, :p] = True
        want = ref_seq(q[r0:r1], k, v, 0.3, mask=keep)
        torch.testing.assert_close(o[r0:r1], want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("is_causal", [True, False], ids=["causal", "non-causal"])
@pytest.mark.parametrize("head_dim", [128, 80, 13])
def test_sgl_context_attention(attn_backend: str, head_dim: int, is_causal: bool) -> None:
    """SGLang's prefill without a cache (its vision attention: non-causal) on requests packed back
    to back, against SDPA per request (SGLang's test_context_attention's check), one of them
    empty."""
    g = torch.Generator().manual_seed(head_dim)
    seq_lens = [8, 0, 12]
    q, k, v = (torch.randn(sum(seq_lens), 4, head_dim, generator=g) for _ in range(3))
    o = torch.full_like(q, 9.0)
    starts = torch.tensor([0, 8, 8])
    sgl.context_attention_fwd(q, k, v, o, starts, torch.tensor(seq_lens), max(seq_lens), is_causal=is_causal)
    for s0, n in zip(starts.tolist(), seq_lens, strict=True):
        if n:
            want = torch.nn.functional.scaled_dot_product_attention(
                *(t[s0 : s0 + n].permute(1, 0, 2) for t in (q, k, v)), is_causal=is_causal
            ).permute(1, 0, 2)
            torch.testing.assert_close(o[s0 : s0 + n], want, atol=2e-5, rtol=2e-5)


def _legacy_cache(
    ctx: list[int], block: int, nb: int, g: torch.Generator, x: int = 8
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """vLLM's legacy paged caches (keys [nb, Hkv, D/x, block, x], values [nb, Hkv, D, block])
    holding each request's context through a shuffled block table: (k_cache, v_cache, table, the
    contexts' keys, their values)."""
    width = max(-(-n // block) for n in ctx)
    table = torch.randperm(nb, generator=g)[: len(ctx) * width].view(len(ctx), width).to(torch.int32)
    flat_k, flat_v = torch.zeros(nb * block, HKV, D), torch.zeros(nb * block, HKV, D)
    keys, vals = [], []
    for b, n in enumerate(ctx):
        kb, vb = torch.randn(n, HKV, D, generator=g), torch.randn(n, HKV, D, generator=g)
        slots = table[b].long()[torch.arange(n) // block] * block + torch.arange(n) % block
        flat_k[slots], flat_v[slots] = kb, vb
        keys.append(kb)
        vals.append(vb)
    k_cache = flat_k.view(nb, block, HKV, D // x, x).permute(0, 2, 3, 1, 4).contiguous()
    v_cache = flat_v.view(nb, block, HKV, D).permute(0, 2, 3, 1).contiguous()
    return k_cache, v_cache, table, keys, vals


@pytest.mark.parametrize("entry", ["context_attention_fwd", "chunked_prefill_paged_decode"])
@pytest.mark.parametrize("window", [0, 5])
def test_vllm_prefix_prefill_over_the_legacy_layout(attn_backend: str, entry: str, window: int) -> None:
    """vLLM's prefix prefill / chunked prefill: contexts in the x-packed key and transposed value
    caches, the new tokens' K / V apart (one request a decode), sliding_window counting the
    query's own position."""
    g = torch.Generator().manual_seed(20 + window)
    ctx, new = [7, 0, 19, 12], [5, 3, 1, 4]
    k_cache, v_cache, table, keys, vals = _legacy_cache(ctx, 4, 24, g)
    starts = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32)
    q, k, v = (torch.randn(sum(new), h, D, generator=g) for h in (HQ, HKV, HKV))
    o = torch.full_like(q, 9.0)
    lens = torch.tensor([c + n for c, n in zip(ctx, new, strict=True)], dtype=torch.int32)
    one = torch.tensor(1.0)
    getattr(vllm, entry)(
        q, k, v, o, "auto", k_cache, v_cache, table, starts, lens, max(ctx), max(new), one, one,
        sliding_window=window, sm_scale=0.3,
    )  # fmt: skip
    for b in range(len(ctx)):
        r0, r1 = int(starts[b]), int(starts[b + 1])
        kk, vv = torch.cat([keys[b], k[r0:r1]]), torch.cat([vals[b], v[r0:r1]])
        want = ref_seq(q[r0:r1], kk, vv, 0.3, window=window - 1 if window > 0 else -1)
        torch.testing.assert_close(o[r0:r1], want, atol=2e-5, rtol=2e-5)
    if entry == "context_attention_fwd":  # skip_decode: the one-token request's rows kept
        o2 = torch.full_like(q, 9.0)
        vllm.context_attention_fwd(
            q, k, v, o2, "auto", k_cache, v_cache, table, starts, lens, max(ctx), max(new), one, one,
            sliding_window=window, sm_scale=0.3, skip_decode=True,
        )  # fmt: skip
        torch.testing.assert_close(o2[8:9], torch.full((1, HQ, D), 9.0))
        torch.testing.assert_close(o2[:8], o[:8])
    with pytest.raises(NotImplementedError, match="alibi_slopes"):
        getattr(vllm, entry)(
            q, k, v, o, "auto", k_cache, v_cache, table, starts, lens, max(ctx), max(new), one, one,
            alibi_slopes=torch.ones(HQ),
        )  # fmt: skip


def test_vllm_prefix_prefill_keywords(attn_backend: str) -> None:
    """The current vLLM keywords: ``causal=False`` sees every key of its request; a 16-bit cache
    is not scaled by ``k_scale`` / ``v_scale`` (vLLM scales fp8 loads only); ``skip_decode`` keeps
    padding rows past the last request; ``is_block_table_ptr`` and a missing key are refused."""
    g = torch.Generator().manual_seed(40)
    ctx = [6, 3]  # contexts; 4 and 2 new tokens
    k_cache, v_cache, table, keys, vals = _legacy_cache(ctx, 4, 8, g)
    starts = torch.tensor([0, 4, 6], dtype=torch.int32)
    lens = torch.tensor([10, 5], dtype=torch.int32)
    q, k, v = (torch.randn(7, h, D, generator=g) for h in (HQ, HKV, HKV))  # row 6: padding
    two = torch.tensor(2.0)
    o = torch.full_like(q, 9.0)
    args = (q, k[:6], v[:6], o, "auto", k_cache, v_cache, table, starts, lens, 6, 4, two, two)
    vllm.context_attention_fwd(*args, sm_scale=0.3, causal=False, skip_decode=True)
    for b, (r0, r1) in enumerate(((0, 4), (4, 6))):
        kk, vv = torch.cat([keys[b], k[r0:r1]]), torch.cat([vals[b], v[r0:r1]])
        full = torch.ones(r1 - r0, kk.shape[0], dtype=torch.bool)
        torch.testing.assert_close(o[r0:r1], ref_seq(q[r0:r1], kk, vv, 0.3, mask=full), atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(o[6:], torch.full((1, HQ, D), 9.0))  # past the last request: kept
    # vLLM's non-causal window is one-sided (q - k < sliding_window): the op's causal=False window
    o3 = torch.empty_like(q)
    vllm.context_attention_fwd(*args[:3], o3, *args[4:], sm_scale=0.3, causal=False, sliding_window=3)
    for b, (r0, r1) in enumerate(((0, 4), (4, 6))):
        kk, vv = torch.cat([keys[b], k[r0:r1]]), torch.cat([vals[b], v[r0:r1]])
        full = torch.ones(r1 - r0, kk.shape[0], dtype=torch.bool)
        want = ref_seq(q[r0:r1], kk, vv, 0.3, window=2, mask=full)
        torch.testing.assert_close(o3[r0:r1], want, atol=2e-5, rtol=2e-5)
    with pytest.raises(NotImplementedError, match="is_block_table_ptr"):
        vllm.chunked_prefill_paged_decode(*args, is_block_table_ptr=True)
    with pytest.raises(NotImplementedError, match="key / value None"):
        vllm.chunked_prefill_paged_decode(q, None, None, *args[3:])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"v_cache has shape \(8, 2, 2, 4, 8\); vLLM.s paged value"):
        vllm.context_attention_fwd(*args[:6], k_cache, *args[7:])
    with pytest.raises(ValueError, match=r"value_cache has shape \(8, 2, 2, 4, 8\); vLLM.s paged value"):
        vllm.chunked_prefill_paged_decode(*args[:6], k_cache, *args[7:])
    with pytest.raises(ValueError, match=r"the value cache's rows are \[Hkv, D\] = \[2, 8\]"):
        vllm.chunked_prefill_paged_decode(*args[:6], v_cache[:, :, :8], *args[7:])


def test_vllm_prefix_prefill_fp8_caches(attn_backend: str) -> None:
    """fp8 legacy caches as vLLM allocates them (uint8 bytes, e4m3 or e5m2 by kv_cache_dtype),
    dequantized by k_scale / v_scale; a name the entry does not know is a ValueError."""
    g = torch.Generator().manual_seed(30)
    ctx = [9, 6]  # contexts; 3 and 1 new tokens
    k_cache, v_cache, table, _, _ = _legacy_cache(ctx, 4, 8, g)
    starts = torch.tensor([0, 3, 4], dtype=torch.int32)
    lens = torch.tensor([12, 7], dtype=torch.int32)
    q, k, v = (torch.randn(4, h, D, generator=g) for h in (HQ, HKV, HKV))
    ks, vs = torch.tensor(0.5), torch.tensor(2.0)
    for name, fp8 in (("fp8", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)):
        kq, vq = (k_cache / ks).to(fp8).view(torch.uint8), (v_cache / vs).to(fp8).view(torch.uint8)
        o = torch.empty_like(q)
        vllm.chunked_prefill_paged_decode(q, k, v, o, name, kq, vq, table, starts, lens, 9, 3, ks, vs)
        for b, (r0, r1) in enumerate(((0, 3), (3, 4))):
            slots = table[b].long()[torch.arange(ctx[b]) // 4]
            offs = torch.arange(ctx[b]) % 4
            kd = kq.view(fp8)[slots, :, :, offs, :].reshape(ctx[b], HKV, D).float() * ks
            vd = vq.view(fp8)[slots, :, :, offs].float() * vs
            want = ref_seq(q[r0:r1], torch.cat([kd, k[r0:r1]]), torch.cat([vd, v[r0:r1]]), D**-0.5)
            torch.testing.assert_close(o[r0:r1], want, atol=2e-5, rtol=2e-5)
        # an fp8-typed cache under "auto": scaled all the same (vLLM decides by the loaded dtype)
        o_auto = torch.empty_like(q)
        vllm.chunked_prefill_paged_decode(
            q, k, v, o_auto, "auto", kq.view(fp8), vq.view(fp8), table, starts, lens, 9, 3, ks, vs
        )
        torch.testing.assert_close(o_auto, o)
    with pytest.raises(ValueError, match="kv_cache_dtype='int4'"):
        vllm.context_attention_fwd(q, k, v, o, "int4", k_cache, v_cache, table, starts, lens, 9, 3, ks, vs)


@pytest.mark.parametrize("page", [1, 4])
@pytest.mark.parametrize("mla", [False, True], ids=["gqa", "mla-view"])
def test_vllm_triton_decode_attention(attn_backend: str, page: int, mla: bool) -> None:
    """vLLM's Triton (MLA) decode entry: token ids (page size 1) or page ids ``[B, pages, 1]`` as
    its tests pass them, the value cache a view of the key cache's first dims (MLA), the lse in
    the caller's dtype (natural log), softcap."""
    g = torch.Generator().manual_seed(50 + page)
    hkv, d, dv = (1, 48, 32) if mla else (HKV, D, D)
    pool = torch.randn(64, hkv, d, generator=g)
    vpool = pool[..., :dv] if mla else torch.randn(64, hkv, dv, generator=g)
    lens = [9, 1, 14]
    pages = -(-max(lens) // page)
    req_to_page = torch.stack([torch.randperm(64 // page, generator=g)[:pages] for _ in lens])[:, :, None]
    q = torch.randn(len(lens), HQ, d, generator=g)
    o = torch.full((len(lens), HQ, dv), 9.0)
    lse = torch.zeros(len(lens), HQ, dtype=torch.bfloat16)
    if page == 1:
        kb, vb, table = pool, vpool, req_to_page[:, :, 0]
    else:
        kb, vb, table = pool.view(-1, page, hkv, d), vpool.view(-1, page, hkv, dv), req_to_page
    vllm.decode_attention_fwd(q, kb, vb, o, lse, table, torch.tensor(lens), None, 8, 0.2, page, logit_cap=5.0)
    if page > 1:  # the same pages as token rows [tokens, Hkv, D] (newer vLLM), a table with spare rows
        o2 = torch.full_like(o, 9.0)
        spare = torch.cat([req_to_page, torch.zeros_like(req_to_page[:2])])
        vllm.decode_attention_fwd(
            q, pool, vpool, o2, lse.clone(), spare, torch.tensor(lens), None, 8, 0.2, page, 5.0
        )
        torch.testing.assert_close(o2, o)
        with pytest.raises(ValueError, match="req_to_token has 2 rows for 3 queries"):
            vllm.decode_attention_fwd(q, kb, vb, o2, lse, table[:2], torch.tensor(lens), None, 8, 0.2, page)
    for b, n in enumerate(lens):
        rows = (req_to_page[b, :, 0, None] * page + torch.arange(page)).reshape(-1)[:n]
        want = ref_seq(q[b : b + 1], pool[rows], vpool[rows], 0.2, softcap=5.0)
        torch.testing.assert_close(o[b : b + 1], want, atol=2e-5, rtol=2e-5)
        s = torch.einsum("hd,nhd->hn", q[b], pool[rows].repeat_interleave(HQ // hkv, 1)) * 0.2
        torch.testing.assert_close(
            lse[b].float(), torch.logsumexp(5.0 * torch.tanh(s / 5.0), -1), atol=2e-2, rtol=1e-2
        )


def test_sgl_context_attention_packing() -> None:
    """Rows past the batch are left as they are; offsets that are not the running sum of the
    lengths (which the op's ragged query cannot express) are a ValueError on the CPU."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(14, 4, 16, generator=g) for _ in range(3))
    o = torch.full_like(q, 9.0)
    sgl.context_attention_fwd(q, k, v, o, torch.tensor([0, 5]), torch.tensor([5, 6]), 6)
    assert bool((o[11:] == 9.0).all()) and bool((o[:11] != 9.0).all())
    with pytest.raises(ValueError, match=r"b_start_loc = \[0, 6\] but b_seq_len = \[5, 6\]"):
        sgl.context_attention_fwd(q, k, v, o, torch.tensor([0, 6]), torch.tensor([5, 6]), 6)


def test_sgl_decode_refusals() -> None:
    kb, vb, g = _pool(8, seed=8)
    indptr, indices = _csr([3], 8, g)
    q = torch.randn(1, HQ, D)
    ws = (torch.empty(1, HQ, 1, D), torch.empty(1, HQ, 1), torch.ones(1, dtype=torch.int32), 1)
    with pytest.raises(NotImplementedError, match="xai_temperature_len"):
        sgl.decode_attention_fwd(
            q, kb, vb, torch.empty_like(q), indptr, indices, *ws, 0.25, xai_temperature_len=4
        )
    with pytest.raises(ValueError, match="value_cache has head dim 32 and key_cache 16"):  # V past K
        wide = torch.randn(8, HKV, 2 * D)
        sgl.decode_attention_fwd(q, kb, wide, torch.empty(1, HQ, 2 * D), indptr, indices, *ws, 0.25)


@pytest.mark.parametrize("view", [True, False], ids=["v-view-of-k", "v-own"])
def test_sgl_decode_attention_mla(attn_backend: str, view: bool) -> None:
    """SGLang's MLA decode (its test_grouped_decode_attention's last config, smaller): one KV
    head of a 576-dim latent pool, ``v_buffer = k_buffer[..., :512]``, ``o [B, 16, 512]``."""
    hq, d, dv, n = 16, 576, 512, 40
    g = torch.Generator().manual_seed(9)
    kb = torch.randn(n, 1, d, generator=g)
    vb = kb[..., :dv] if view else torch.randn(n, 1, dv, generator=g)
    lens = [7, 1, 19]
    indptr, indices = _csr(lens, n, g)
    bsz = len(lens)
    q = torch.randn(bsz, hq, d, generator=g)
    o = torch.full((bsz, hq, dv), 9.0)
    splits = 4
    ws = (torch.empty(bsz, hq, splits, dv), torch.empty(bsz, hq, splits), torch.full((bsz,), splits), splits)
    sm_scale = 192**-0.5
    sgl.decode_attention_fwd(q, kb, vb, o, indptr, indices, *ws, sm_scale, logit_cap=30.0)
    for b in range(bsz):
        rows = indices[int(indptr[b]) : int(indptr[b + 1])]
        want = ref_seq(q[b : b + 1], kb[rows], vb[rows], sm_scale, 30.0)
        torch.testing.assert_close(o[b : b + 1], want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("view", [True, False], ids=["v-view-of-k", "v-own"])
def test_sgl_extend_attention_mla(attn_backend: str, view: bool) -> None:
    """SGLang's MLA extend (absorbed: q / k 576, v 512, ``o_extend [T, 16, 512]``): the two-stage
    entry (prefix rows through kv_indices, the new tokens apart) and the one-stage entry over the
    pools as they are (``v_buffer = k_buffer[..., :512]``, or a pool of its own) agree with the
    reference; a value head dim past the key's is the op's ValueError."""
    hq, d, dv, n = 16, 576, 512, 48
    g = torch.Generator().manual_seed(12)
    kb = torch.randn(n, 1, d, generator=g)
    vb = kb[..., :dv] if view else torch.randn(n, 1, dv, generator=g)
    pre, ext = [5, 0, 9], [3, 4, 1]
    slots = torch.randperm(n, generator=g)
    pre_idx, ext_idx, at = [], [], 0
    for p_, e_ in zip(pre, ext, strict=True):
        pre_idx.append(slots[at : at + p_])
        ext_idx.append(slots[at + p_ : at + p_ + e_])
        at += p_ + e_
    kv_indices, extend_rows = torch.cat(pre_idx), torch.cat(ext_idx)
    kv_indptr = torch.tensor([0, *torch.tensor(pre).cumsum(0).tolist()], dtype=torch.int32)
    qo = torch.tensor([0, *torch.tensor(ext).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(ext), hq, d, generator=g)
    sm_scale = 192**-0.5
    o2 = torch.full((sum(ext), hq, dv), 9.0)
    sgl.extend_attention_fwd(
        q, kb[extend_rows], vb[extend_rows], o2, kb, vb, qo, kv_indptr, kv_indices, None, True, None,
        max(ext), sm_scale=sm_scale, logit_cap=20.0,
    )  # fmt: skip
    for b in range(len(pre)):
        rows = torch.cat([pre_idx[b], ext_idx[b]])
        r0, r1 = int(qo[b]), int(qo[b + 1])
        want = ref_seq(q[r0:r1], kb[rows], vb[rows], sm_scale, 20.0)
        torch.testing.assert_close(o2[r0:r1], want, atol=2e-5, rtol=2e-5)
    u_indptr = torch.tensor(
        [0, *torch.tensor(pre).add(torch.tensor(ext)).cumsum(0).tolist()], dtype=torch.int32
    )
    u_indices = torch.cat([torch.cat([pre_idx[b], ext_idx[b]]) for b in range(len(pre))])
    o1 = torch.full_like(o2, 9.0)
    sgl.extend_attention_fwd_unified(
        q, o1, kb, vb, qo, u_indptr, u_indices, torch.tensor(pre), max(ext), sm_scale=sm_scale, logit_cap=20.0
    )
    torch.testing.assert_close(o1, o2, atol=2e-5, rtol=2e-5)
    wide = torch.randn(n, 1, d + 64, generator=g)
    with pytest.raises(ValueError, match="value_cache has head dim 640 and key_cache 576"):
        sgl.extend_attention_fwd_unified(
            q,
            torch.empty(sum(ext), hq, d + 64),
            kb,
            wide,
            qo,
            u_indptr,
            u_indices,
            torch.tensor(pre),
            max(ext),
        )
