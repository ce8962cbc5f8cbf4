"""The sampling drop-ins (opmux.compat.sgl_kernel / flashinfer / vllm_sampler) against torch
references: FlashInfer's rules (ties at the k-th kept) and vLLM's sort-based masks, reimplemented
here; draws stay in the kept set and follow it; seeds, generators and ``indices`` behave as upstream."""

from __future__ import annotations

import pytest
import torch

from opmux.compat import flashinfer, sgl_kernel, vllm_sampler


def _probs(b: int, v: int, seed: int, scale: float = 2.0) -> torch.Tensor:
    return torch.softmax(torch.randn(b, v, generator=torch.Generator().manual_seed(seed)) * scale, -1)


def _ref_top_k(probs: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    kth = probs.sort(-1, descending=True).values.gather(1, (k.long() - 1)[:, None])
    q = torch.where(probs >= kth, probs, 0.0)
    return q / q.sum(1, keepdim=True)


def _ref_top_p(probs: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    s = probs.sort(-1, descending=True).values
    before = s.cumsum(-1) - s  # mass strictly above each sorted value
    t = s.gather(1, ((before < p[:, None]).sum(1, keepdim=True) - 1))
    q = torch.where(probs >= t, probs, 0.0)
    return q / q.sum(1, keepdim=True)


def _vllm_mask(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    """vLLM v1's apply_top_k_top_p (the sort path), on a copy."""
    logits = logits.clone()
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    if k is not None:
        top_k_mask = logits_sort.gather(1, (logits_sort.size(1) - k.long()).clamp(min=0)[:, None])
        logits_sort.masked_fill_(logits_sort < top_k_mask, -float("inf"))
    if p is not None:
        probs_sum = logits_sort.softmax(dim=-1).cumsum(dim=-1)
        top_p_mask = probs_sum <= 1 - p[:, None]
        top_p_mask[:, -1] = False
        logits_sort.masked_fill_(top_p_mask, -float("inf"))
    return logits.scatter_(dim=-1, index=logits_idx, src=logits_sort)


@pytest.mark.parametrize("mod", [sgl_kernel, flashinfer], ids=["sgl_kernel", "flashinfer"])
def test_renorm_and_mask(mod) -> None:
    probs = _probs(6, 50, 0)
    k = torch.tensor([1, 3, 7, 50, 12, 2], dtype=torch.int32)
    p = torch.tensor([0.1, 0.5, 0.9, 1.0, 0.3, 0.7])
    torch.testing.assert_close(mod.top_k_renorm_probs(probs, k), _ref_top_k(probs, k), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(mod.top_k_renorm_probs(probs, 4), _ref_top_k(probs, torch.full((6,), 4)))
    torch.testing.assert_close(mod.top_p_renorm_probs(probs, p), _ref_top_p(probs, p), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(mod.top_p_renorm_probs(probs, 0.6), _ref_top_p(probs, torch.full((6,), 0.6)))
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(1)).bfloat16()
    kth = logits.float().sort(-1, descending=True).values[:, 4:5]
    want = torch.where(logits.float() >= kth, logits, torch.tensor(-torch.inf, dtype=logits.dtype))
    assert torch.equal(mod.top_k_mask_logits(logits, 5), want)


def test_sgl_kernel_aliases() -> None:
    probs = _probs(2, 16, 2)
    assert torch.equal(sgl_kernel.top_k_renorm_prob(probs, 3), sgl_kernel.top_k_renorm_probs(probs, 3))
    assert torch.equal(sgl_kernel.top_p_renorm_prob(probs, 0.5), sgl_kernel.top_p_renorm_probs(probs, 0.5))


@pytest.mark.parametrize("order", ["top_k_first", "joint"])
def test_draws_follow_the_filtered_row(order: str) -> None:
    n, v = 4000, 24
    dist = _probs(1, v, 3, 1.0)[0]
    probs = dist.expand(n, v).contiguous()
    k, p = 8, 0.7
    ids = sgl_kernel.top_k_top_p_sampling_from_probs(probs, k, p, filter_apply_order=order, seed=5, offset=1)
    assert ids.dtype == torch.int32
    if order == "top_k_first":
        want = _ref_top_p(_ref_top_k(dist[None], torch.tensor([k])), torch.tensor([p]))[0]
    else:
        both = (_ref_top_k(dist[None], torch.tensor([k])) > 0) & (
            _ref_top_p(dist[None], torch.tensor([p])) > 0
        )
        want = torch.where(both[0], dist, 0.0) / torch.where(both[0], dist, 0.0).sum()
    freq = torch.bincount(ids.long(), minlength=v).double() / n
    assert freq[want == 0].sum() == 0, "a draw outside the kept set"
    assert float((freq - want.double()).abs().max()) < 0.03
    with pytest.raises(ValueError, match="Invalid filter_apply_order"):
        sgl_kernel.top_k_top_p_sampling_from_probs(probs, k, p, filter_apply_order="top_p_first")


def test_min_p_indices_generator_and_nan() -> None:
    rows = torch.zeros(3, 10)
    rows[0, 4] = rows[1, 9] = rows[2, 0] = 1.0
    idx = torch.tensor([2, 0, 0, 1, 2])
    assert flashinfer.min_p_sampling_from_probs(rows, 0.5, indices=idx).tolist() == [0, 4, 4, 9, 0]
    assert sgl_kernel.top_p_sampling_from_probs(rows, 0.9, indices=idx).tolist() == [0, 4, 4, 9, 0]
    probs = _probs(64, 32, 4)
    g = torch.Generator()
    a = flashinfer.top_k_top_p_sampling_from_probs(probs, 10, 0.9, generator=g.manual_seed(7))
    b = flashinfer.top_k_top_p_sampling_from_probs(probs, 10, 0.9, generator=g.manual_seed(7))
    c = flashinfer.top_k_top_p_sampling_from_probs(probs, 10, 0.9, generator=g)  # the generator moved on
    assert torch.equal(a, b) and not torch.equal(a, c)
    m = flashinfer.min_p_sampling_from_probs(probs, torch.full((64,), 0.3), seed=3, offset=4)
    assert torch.equal(
        m, flashinfer.min_p_sampling_from_probs(probs, torch.full((64,), 0.3), seed=3, offset=4)
    )
    keep = probs >= 0.3 * probs.amax(1, keepdim=True)
    assert keep.gather(1, m.long()[:, None]).all()
    bad = probs.clone()
    bad[3, 3] = torch.nan
    with pytest.raises(ValueError, match="Input probs contains NaN"):
        sgl_kernel.min_p_sampling_from_probs(bad, 0.1, check_nan=True)


def test_vllm_apply_top_k_top_p_matches_the_sort_path() -> None:
    logits = torch.randn(8, 64, generator=torch.Generator().manual_seed(5)) * 2
    k = torch.tensor([1, 5, 64, 10, 3, 64, 20, 7])
    p = torch.tensor([0.9, 0.5, 0.3, 1.0, 0.95, 0.8, 0.6, 0.99])
    for kk, pp in ((k, None), (None, p), (k, p)):
        want = _vllm_mask(logits, kk, pp)
        got = vllm_sampler.apply_top_k_top_p(logits.clone(), kk, pp)
        assert torch.equal(got.isinf(), want.isinf())
        torch.testing.assert_close(got[got.isfinite()], logits[got.isfinite()], atol=0, rtol=0)
    x = logits.clone()
    assert vllm_sampler.apply_top_k_top_p(x, k, None) is x  # in place, as vLLM


def test_vllm_sampler_forward_and_random_sample() -> None:
    n, v = 4000, 20
    logits = torch.randn(1, v, generator=torch.Generator().manual_seed(6)).expand(n, v).contiguous()
    k = torch.full((n,), 6)
    p = torch.full((n,), 0.8)
    sampler = vllm_sampler.TopKTopPSampler()
    torch.manual_seed(0)
    ids, extra = sampler(logits.clone(), {}, k, p)
    assert ids.dtype == torch.int64 and ids.shape == (n,) and extra is None
    want = _vllm_mask(logits[:1], k[:1], p[:1]).softmax(-1)[0]
    freq = torch.bincount(ids, minlength=v).double() / n
    assert freq[want == 0].sum() == 0 and float((freq - want.double()).abs().max()) < 0.03
    torch.manual_seed(0)
    assert torch.equal(sampler.forward(logits.clone(), {}, k, p)[0], ids)  # the default generator seeds it
    ids2, lp = vllm_sampler.TopKTopPSampler("processed_logprobs").forward(
        logits[:4].clone(), {}, k[:4], p[:4]
    )
    assert lp is not None and torch.equal(lp.isinf(), _vllm_mask(logits[:4], k[:4], p[:4]).isinf())
    assert (lp.gather(1, ids2[:, None]) > -torch.inf).all()
    probs = logits[:8].softmax(-1)
    gens = {3: torch.Generator().manual_seed(11)}
    r1 = vllm_sampler.random_sample(probs, gens)
    r2 = vllm_sampler.random_sample(probs, {3: torch.Generator().manual_seed(11)})
    assert r1[3] == r2[3] and r1.dtype == torch.int64
    with pytest.raises(ValueError, match="logprobs_mode"):
        vllm_sampler.TopKTopPSampler("bogus")


def test_flashinfer_conventions() -> None:
    """FlashInfer's own conventions (its tests/utils/test_sampling.py checks them): parameter shapes
    refused with its messages, renorm in the input's dtype, ids in ``indices``' dtype, NaN rows
    reported by ``return_valid``, ``softmax`` with a temperature, ``top_p = 0`` keeping the top."""
    probs = _probs(5, 40, 3)
    with pytest.raises(ValueError, match=r"Expected a 1D tensor or scalar.*got a 2D tensor"):
        flashinfer.top_k_renorm_probs(probs, torch.full((5, 40), 3, dtype=torch.int32))
    with pytest.raises(
        ValueError, match=r"Expected a 1D tensor of shape \(batch_size,\) or scalar.*0-dimensional"
    ):
        flashinfer.top_p_renorm_probs(probs, torch.tensor(0.5))
    with pytest.raises(ValueError, match="Sampling parameter tensor batch size mismatch"):
        flashinfer.min_p_sampling_from_probs(probs, torch.tensor([0.1]))
    for dt in (torch.float16, torch.bfloat16):
        got = flashinfer.top_k_renorm_probs(probs.to(dt), 4)
        assert got.dtype == dt
        torch.testing.assert_close(
            got.float(), _ref_top_k(probs.to(dt).float(), torch.full((5,), 4)), atol=1e-2, rtol=1e-2
        )
        assert flashinfer.top_p_renorm_probs(probs.to(dt), 0.5).dtype == dt
    top = flashinfer.top_p_renorm_probs(probs, torch.zeros(5, dtype=torch.int32))  # p = 0: the largest
    assert torch.equal(top > 0, probs == probs.max(-1, keepdim=True).values)
    idx = torch.tensor([4, 0, 0, 2], dtype=torch.int64)
    ids = flashinfer.top_k_sampling_from_probs(probs, 5, indices=idx, seed=1, offset=0)
    assert ids.dtype == torch.int64 and ids.shape == (4,)
    assert flashinfer.sampling_from_probs(probs, seed=1, offset=0).dtype == torch.int32
    bad = probs.clone()
    bad[1] = float("nan")
    ids, valid = flashinfer.top_p_sampling_from_probs(bad, 0.9, return_valid=True, seed=2, offset=0)
    assert valid.tolist() == [True, False, True, True, True] and int(ids[1]) == 0
    logits = torch.randn(5, 40, generator=torch.Generator().manual_seed(4))
    temp = torch.tensor([1.0, 0.5, 0.1, 2.0, 1.0])
    torch.testing.assert_close(
        flashinfer.softmax(logits, temperature=temp), torch.softmax(logits / temp[:, None], -1)
    )
    torch.testing.assert_close(flashinfer.softmax(logits, temperature=0.5), torch.softmax(logits / 0.5, -1))
    a = flashinfer.sampling_from_logits(logits, seed=7, offset=3)
    assert torch.equal(a, flashinfer.sampling_from_probs(torch.softmax(logits, -1), seed=7, offset=3))


def test_flashinfer_parameters_past_the_range_keep_every_entry() -> None:
    """``top_k > V`` and ``top_p > 1`` keep the whole row there (opmux's ops refuse them)."""
    probs = _probs(3, 30, 5)
    torch.testing.assert_close(flashinfer.top_k_renorm_probs(probs, 99), probs / probs.sum(1, keepdim=True))
    k = torch.tensor([99, 31, 30], dtype=torch.int32)
    torch.testing.assert_close(flashinfer.top_k_renorm_probs(probs, k), probs / probs.sum(1, keepdim=True))
    torch.testing.assert_close(flashinfer.top_p_renorm_probs(probs, 1.5), probs)
    logits = torch.randn(3, 30, generator=torch.Generator().manual_seed(6))
    assert torch.equal(flashinfer.top_k_mask_logits(logits, 64), logits)
