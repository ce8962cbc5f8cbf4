"""The compat gaps the engines' own test files found (docs/compat.md, "SGLang's and vLLM's
sampler tests"): sgl_kernel's ``sampling`` submodule and ``top_k_top_p_sampling_from_logits``,
vLLM's ``apply_top_k_top_p_triton`` (and rows of -inf only), SGLang's
``build_unified_kv_indices`` / ``extend_attention_fwd_unified``. No upstream file needed."""

from __future__ import annotations

import pytest
import torch

from opmux.compat import flashinfer, sgl_kernel, vllm_sampler


@pytest.mark.parametrize("order", ["top_k_first", "joint"])
@pytest.mark.parametrize("mod", [sgl_kernel.sampling, flashinfer], ids=["sgl", "flashinfer"])
def test_sampling_from_logits_is_from_probs_of_the_softmax(mod: object, order: str) -> None:
    logits = torch.randn(37, 300, generator=torch.Generator().manual_seed(1)) * 5
    g = torch.Generator().manual_seed(7)
    g_ref = g.clone_state()
    got = mod.top_k_top_p_sampling_from_logits(logits, 20, 0.5, filter_apply_order=order, generator=g)  # type: ignore[attr-defined]
    ref = mod.top_k_top_p_sampling_from_probs(  # type: ignore[attr-defined]
        torch.softmax(logits, dim=-1), 20, 0.5, filter_apply_order=order, generator=g_ref
    )
    assert torch.equal(got, ref)
    # the draws stay in the top-20 set
    top = logits.topk(20, dim=-1).indices
    assert bool((top == got.long()[:, None]).any(1).all())


def test_sgl_kernel_sampling_submodule_names() -> None:
    s = sgl_kernel.sampling
    assert s.top_k_renorm_prob is sgl_kernel.top_k_renorm_prob
    assert s.top_p_renorm_prob is sgl_kernel.top_p_renorm_prob
    assert s.top_k_top_p_sampling_from_probs is sgl_kernel.top_k_top_p_sampling_from_probs
    assert sgl_kernel.top_k_top_p_sampling_from_logits is s.top_k_top_p_sampling_from_logits
    with pytest.raises(ValueError, match="NaN"):
        s.top_k_top_p_sampling_from_logits(torch.full((1, 4), float("nan")), 2, 0.9, check_nan=True)


def _vllm_sort_kept(logits: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    kth = logits.sort(-1).values.gather(1, (logits.shape[1] - k.long())[:, None])
    return (logits >= kth).sum(-1)


def test_apply_top_k_top_p_triton_in_place_and_counts() -> None:
    logits = torch.randn(16, 1000, generator=torch.Generator().manual_seed(3))
    k = torch.randint(1, 50, (16,), generator=torch.Generator().manual_seed(4), dtype=torch.int32)
    k[::4] = 1000  # top-k off
    ref = _vllm_sort_kept(logits, k)
    x = logits.clone()
    out = vllm_sampler.apply_top_k_top_p_triton(x, k, None)
    assert out is x
    assert torch.equal((out > -float("inf")).sum(-1), ref)
    # mask_value
    y = vllm_sampler.apply_top_k_top_p_triton(logits.clone(), k, None, mask_value=-1e9)
    assert not bool(torch.isinf(y).any()) and torch.equal((y > -1e9).sum(-1), ref)
    # no-op without k and p; vLLM's shape contract
    z = logits.clone()
    assert torch.equal(vllm_sampler.apply_top_k_top_p_triton(z, None, None), logits)
    with pytest.raises(ValueError, match="float32"):
        vllm_sampler.apply_top_k_top_p_triton(logits.half(), k, None)
    with pytest.raises(ValueError, match="k must have shape"):
        vllm_sampler.apply_top_k_top_p_triton(logits.clone(), k[:3], None)


@pytest.mark.parametrize("use_k", [False, True])
def test_rows_of_minus_inf_only_stay_as_they_are(use_k: bool) -> None:
    """A grammar mask can leave a row with no finite logit: vLLM leaves it (-inf, no NaN)."""
    logits = torch.randn(4, 64, generator=torch.Generator().manual_seed(5))
    logits[1] = -float("inf")
    logits[3, 5:] = -float("inf")
    k = torch.full((4,), 3, dtype=torch.int32) if use_k else None
    p = torch.full((4,), 0.9)
    out = vllm_sampler.apply_top_k_top_p_triton(logits.clone(), k, p)
    assert not bool(out.isnan().any())
    assert bool((out[1] == -float("inf")).all())
    assert 0 < int((out[3] > -float("inf")).sum()) <= 5
    assert int((out[0] > -float("inf")).sum()) > 0


def _unified_loop(indptr, indices, start, ext_lens, ext_indices, bs):  # type: ignore[no-untyped-def]
    rows = []
    for b in range(bs):
        rows.append(indices[int(indptr[b]) : int(indptr[b + 1])])
        rows.append(ext_indices[int(start[b]) : int(start[b]) + int(ext_lens[b])])
    return torch.cat(rows)


def test_build_unified_kv_indices() -> None:
    pre = torch.tensor([3, 0, 5], dtype=torch.int32)
    ext = torch.tensor([2, 4, 1], dtype=torch.int32)
    indptr = torch.zeros(4, dtype=torch.int32)
    indptr[1:] = pre.cumsum(0)
    indices = torch.randperm(20)[:8]
    start = torch.tensor([0, 2, 6], dtype=torch.int32)
    ext_indices = torch.arange(100, 107)
    u_indptr, u_indices, lens = sgl_kernel.build_unified_kv_indices(
        indptr, indices, start, ext, ext_indices, 3
    )
    assert u_indptr.dtype == torch.int32 and u_indptr.tolist() == [0, 5, 9, 15]
    assert torch.equal(lens, pre)
    assert torch.equal(u_indices[:15], _unified_loop(indptr, indices, start, ext, ext_indices, 3))


def test_extend_attention_fwd_unified_matches_the_two_stage_entry() -> None:
    """Each request's new tokens written to the pool after its prefix: the one-stage entry over
    the unified rows gives the two-stage entry's output (both opmux's paged_prefill)."""
    g = torch.Generator().manual_seed(11)
    hq, hkv, d = 4, 2, 32
    pre = [5, 0, 9]
    ext = [3, 4, 1]
    bs = len(pre)
    total = sum(pre) + sum(ext) + 7  # spare pool rows
    k_buf = torch.randn(total, hkv, d, generator=g)
    v_buf = torch.randn(total, hkv, d, generator=g)
    slots = torch.randperm(total, generator=g)
    pre_idx, ext_idx, at = [], [], 0
    for p_, e_ in zip(pre, ext, strict=True):
        pre_idx.append(slots[at : at + p_])
        ext_idx.append(slots[at + p_ : at + p_ + e_])
        at += p_ + e_
    kv_indices = torch.cat(pre_idx)
    extend_rows = torch.cat(ext_idx)
    kv_indptr = torch.tensor([0, *torch.tensor(pre).cumsum(0).tolist()], dtype=torch.int32)
    qo_indptr = torch.tensor([0, *torch.tensor(ext).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(ext), hq, d, generator=g)
    o2 = torch.empty_like(q)
    sgl_kernel.extend_attention_fwd(
        q, k_buf[extend_rows], v_buf[extend_rows], o2, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices,
        None, True, None, max(ext), sliding_window_size=4,
    )  # fmt: skip
    u_indptr, u_indices, prefix_lens = sgl_kernel.build_unified_kv_indices(
        kv_indptr, kv_indices, qo_indptr[:-1], torch.tensor(ext, dtype=torch.int32), extend_rows, bs
    )
    o1 = torch.empty_like(q)
    sgl_kernel.extend_attention_fwd_unified(
        q, o1, k_buf, v_buf, qo_indptr, u_indptr, u_indices, prefix_lens, max(ext), sliding_window_size=4
    )
    torch.testing.assert_close(o1, o2, rtol=1e-5, atol=1e-5)
    # a custom mask over every key (the unified kernel reads the prefix's columns too): the same
    # as the two-stage entry's with skip_prefix_custom_mask=False
    sizes = [(p_ + e_) * e_ for p_, e_ in zip(pre, ext, strict=True)]
    mask = torch.rand(sum(sizes), generator=g) < 0.6
    mask_indptr = torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()])
    sgl_kernel.extend_attention_fwd_unified(
        q, o1, k_buf, v_buf, qo_indptr, u_indptr, u_indices, prefix_lens, max(ext),
        custom_mask=mask, mask_indptr=mask_indptr,
    )  # fmt: skip
    sgl_kernel.extend_attention_fwd(
        q, k_buf[extend_rows], v_buf[extend_rows], o2, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices,
        mask, True, mask_indptr, max(ext), skip_prefix_custom_mask=False,
    )  # fmt: skip
    torch.testing.assert_close(o1, o2, rtol=1e-5, atol=1e-5)
    with pytest.raises(NotImplementedError, match="window_start_pos"):
        sgl_kernel.extend_attention_fwd_unified(
            q, o1, k_buf, v_buf, qo_indptr, u_indptr, u_indices, prefix_lens, max(ext),
            window_start_pos=torch.zeros(bs, dtype=torch.int32),
        )  # fmt: skip
