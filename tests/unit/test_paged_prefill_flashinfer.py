"""attention.paged_prefill's ``flashinfer`` backend: the block table as FlashInfer's CSR page table
and ``cu_seqlens_q`` as its ``qo_indptr``, one plan per batch (made again when any of the three
index tensors changes in place), the NHD / HND layouts, what planning refuses, and the predicate.
FlashInfer needs a GPU: a stand-in ``flashinfer.prefill`` (causal attention over the CSR table in
torch, the queries aligned to the end of their keys) runs the backend's calls on the CPU here."""

from __future__ import annotations

import math
import sys
import types
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
import torch

from opmux.kernels import registry
from opmux.kernels.errors import BackendUnavailable, CallRefused
from opmux.kernels.ops import attention
from opmux.kernels.ops.attention import _flashinfer
from opmux.kernels.ops.attention import paged_prefill_flashinfer as fip

I32 = torch.int32


class _Wrapper:
    """FlashInfer's batch prefill wrapper over a paged cache, in torch."""

    made: ClassVar[list[_Wrapper]] = []

    def __init__(self, workspace: torch.Tensor, kv_layout: str) -> None:
        self.layout = kv_layout
        self.plans: list[dict[str, Any]] = []
        _Wrapper.made.append(self)

    def plan(self, qo: Any, indptr: Any, indices: Any, last: Any, hq: int, hkv: int, d: int, page: int,
             **kw: Any) -> None:  # fmt: skip
        assert all(t.device.type == "cpu" and t.dtype == torch.int32 for t in (qo, indptr, indices, last))
        self.plans.append(
            {
                "qo": qo,
                "indptr": indptr,
                "indices": indices,
                "last": last,
                "page": page,
                "heads": (hq, hkv, d),
                **kw,
            }
        )

    def run(
        self, q: torch.Tensor, caches: tuple[torch.Tensor, torch.Tensor], out: torch.Tensor
    ) -> torch.Tensor:
        p = self.plans[-1]
        assert p["q_data_type"] == q.dtype and p["kv_data_type"] == caches[0].dtype
        k, v = caches
        if self.layout == "HND":
            k, v = k.transpose(1, 2), v.transpose(1, 2)
        hkv, d = k.shape[2], k.shape[3]
        g = q.shape[1] // hkv
        assert p["heads"] == (q.shape[1], hkv, d) and p["page"] == k.shape[1], (p["heads"], p["page"])
        for b in range(len(p["qo"]) - 1):
            q0, q1 = int(p["qo"][b]), int(p["qo"][b + 1])
            if q1 == q0:
                continue
            pages = p["indices"][p["indptr"][b] : p["indptr"][b + 1]].long()
            n = (len(pages) - 1) * p["page"] + int(p["last"][b])
            keys, vals = k[pages].reshape(-1, hkv, d)[:n].float(), v[pages].reshape(-1, hkv, d)[:n].float()
            qb = q[q0:q1].float().view(q1 - q0, hkv, g, d)
            s = torch.einsum("thgd,nhd->thgn", qb, keys) * p["sm_scale"]
            if p["logits_soft_cap"]:
                s = p["logits_soft_cap"] * torch.tanh(s / p["logits_soft_cap"])
            qpos = torch.arange(n - (q1 - q0), n)[:, None]  # the new tokens: the last positions
            kpos = torch.arange(n)[None, :]
            hide = kpos > qpos if p["causal"] else torch.zeros(1, n, dtype=torch.bool)
            if p["window_left"] >= 0:
                hide |= kpos < qpos - p["window_left"]
            s = s.masked_fill(hide[:, None, None, :], float("-inf"))
            out[q0:q1] = (
                torch.einsum("thgn,nhd->thgd", s.softmax(-1), vals).reshape(q1 - q0, -1, d).to(out.dtype)
            )
        return out


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[_Wrapper]]:
    mod = types.ModuleType("flashinfer.prefill")
    mod.BatchPrefillWithPagedKVCacheWrapper = _Wrapper  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flashinfer", types.ModuleType("flashinfer"))
    monkeypatch.setitem(sys.modules, "flashinfer.prefill", mod)
    monkeypatch.setattr(fip, "refusal", lambda **kw: None)  # CPU tensors: the device check aside
    _flashinfer.vendor.cache_clear()
    fip._PLANS.clear()
    _Wrapper.made.clear()
    yield _Wrapper
    _flashinfer.vendor.cache_clear()
    fip._PLANS.clear()


def _batch(
    q_lens: list[int], prefix: list[int], hq: int, hkv: int, d: int, page: int, hnd: bool
) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(sum(q_lens) + page)
    lens = [a + b for a, b in zip(q_lens, prefix, strict=True)]
    width = max(1, max(-(-n // page) for n in lens))
    nb = len(lens) * width + 2
    shape = (nb, hkv, page, d) if hnd else (nb, page, hkv, d)
    kc, vc = (torch.randn(shape, generator=g).to(torch.bfloat16) for _ in range(2))
    if hnd:
        kc, vc = kc.transpose(1, 2), vc.transpose(1, 2)
    table = torch.randperm(nb, generator=g)[: len(lens) * width].view(len(lens), width).to(I32)
    q = torch.randn(sum(q_lens), hq, d, generator=g).to(torch.bfloat16)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=I32)
    return [q, kc, vc, table, torch.tensor(lens, dtype=I32), cu]


def _run(
    args: list[torch.Tensor], softcap: float = 0.0, window: int = -1, causal: bool = True
) -> torch.Tensor:
    q, kc, vc, table, lens, cu = args
    out, e = torch.empty_like(q), torch.empty(0)
    scale = 1 / math.sqrt(q.shape[-1])
    fip.paged_prefill(
        out, e, False, q, kc, vc, table, lens, cu, e, False, lens, lens, False, scale, softcap, window,
        cu, cu, False, True, causal,
    )  # fmt: skip
    return out


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got.float(), want.float(), atol=1.6e-2, rtol=1.6e-2)


@pytest.mark.parametrize("hnd", [False, True], ids=["nhd", "hnd"])
def test_runs_match_the_op_and_plan_once_per_batch(stand_in: type[_Wrapper], hnd: bool) -> None:
    """A ragged batch: a plain prefill, an extend over a prefix, a sequence with no new token, one
    new token over a long prefix."""
    args = _batch([13, 6, 0, 1], [0, 21, 9, 40], 8, 2, 64, 16, hnd)
    for softcap, window in ((0.0, -1), (20.0, 9)):
        want = attention.paged_prefill(*args, softcap=softcap, window_left=window, backend="torch")
        _close(_run(args, softcap, window), want)
    assert [w.layout for w in stand_in.made] == ["HND" if hnd else "NHD"] * 2  # one plan per knob set
    _run(args, 20.0, 9)  # the next layer of the same step: no new plan
    assert len(stand_in.made) == 2 and all(len(w.plans) == 1 for w in stand_in.made)
    args[4].add_(1)  # the engine's next step, in place (each prefix one longer): planned again
    want = attention.paged_prefill(*args, softcap=20.0, window_left=9, backend="torch")
    _close(_run(args, 20.0, 9), want)
    assert len(stand_in.made) == 3
    # non-causal (encoder / vision prefill): its own plan, FlashInfer's causal flag off
    _close(_run(args, causal=False), attention.paged_prefill(*args, causal=False, backend="torch"))
    assert len(stand_in.made) == 4 and stand_in.made[-1].plans[-1]["causal"] is False


def test_planning_refuses_what_flashinfer_would_read_out_of_bounds(stand_in: type[_Wrapper]) -> None:
    """Each refusal declines that call only (CallRefused: dispatch keeps the backend)."""
    q, kc, vc, table, lens, cu = _batch([5, 3], [4, 0], 4, 2, 64, 4, False)
    bad_table = table.clone()
    bad_table[1, 0] = kc.shape[0]
    cases = [
        ([q, kc, vc, bad_table, lens, cu], r"outside \[0, "),
        ([q, kc, vc, table, torch.tensor([9, 2], dtype=I32), cu], "more new tokens than its length"),
        ([q, kc, vc, table, lens, torch.tensor([0, 5, 7], dtype=I32)], "query's 8 rows"),
        ([q, kc, vc, table, lens, torch.tensor([0, 9, 8], dtype=I32)], "does not rise"),
    ]
    for args, words in cases:
        with pytest.raises(CallRefused, match=words):
            _run(args)
    assert not stand_in.made  # refused before any wrapper was made


def test_an_empty_sequence_is_planned_as_no_pages(stand_in: type[_Wrapper]) -> None:
    args = _batch([4, 0, 3], [2, 0, 5], 4, 2, 64, 4, False)
    _close(_run(args), attention.paged_prefill(*args, backend="torch"))
    p = stand_in.made[0].plans[0]
    assert p["indptr"].tolist() == [0, 2, 2, 4] and p["last"].tolist() == [2, 0, 4]


def test_the_plan_pins_its_index_tensors_and_inference_tensors_plan_every_call(
    stand_in: type[_Wrapper],
) -> None:
    """A cached plan holds the index tensors its key names (so no fresh tensor can take their
    address and find a stale plan); inference tensors, which have no version counter, are
    planned on every call instead of cached."""
    args = _batch([4, 3], [2, 5], 4, 2, 64, 4, False)
    _run(args)
    ((_, pinned, _),) = fip._PLANS.values()
    assert [t is a for t, a in zip(pinned, (args[3], args[4], args[5]), strict=True)] == [True] * 3
    _run(_batch([2, 2], [3, 1], 4, 2, 64, 4, False))  # a second cached batch
    cached = dict(fip._PLANS)
    with torch.inference_mode():
        inf = [t.clone() for t in args]
        want = attention.paged_prefill(*inf, backend="torch")
        for _ in range(3):
            _close(_run(inf), want)
    # planned on every call, on one scratch wrapper: no new wrapper per call, no cached batch evicted
    assert fip._PLANS == cached and len(stand_in.made) == 3
    assert len(stand_in.made[2].plans) == 3


def test_refusals_name_the_op() -> None:
    base = {
        "device": "cuda", "dtype": "bfloat16", "cache_dtype": "bfloat16", "head_dim": 128,
        "layouts": ("NHD", "NHD"), "sinks": False, "lse": False, "capturing": False,
    }  # fmt: skip
    assert fip.refusal(**base) is None
    assert "FlashInfer's prefill runs on CUDA" in (fip.refusal(**{**base, "device": "cpu"}) or "")
    assert "(MLA)" in (fip.refusal(**{**base, "value_dim": 64}) or "")
    assert "CUDA-graph capture" in (fip.refusal(**{**base, "capturing": True}) or "")
    q, kc, vc, table, lens, cu = _batch([3], [2], 4, 2, 64, 4, False)
    assert "CUDA tensors" in (fip.supports(q, kc, vc, table, lens, cu) or "")
    assert fip.supports(None, kc, vc) is None  # not tensors: the contract speaks


def test_a_custom_mask_is_refused_before_any_plan(stand_in: type[_Wrapper]) -> None:
    """The predicate names the custom mask (the dispatcher then takes Triton), and a forced call
    with one is CallRefused before FlashInfer plans anything."""
    args = _batch([3, 2], [2, 0], 4, 2, 64, 4, False)
    q, kc, vc, table, lens, cu = args
    mask = torch.ones(3 * 5 + 2 * 2, dtype=torch.bool)
    indptr = torch.tensor([0, 15, 19], dtype=torch.int64)
    assert "custom mask" in (
        fip.supports(q, kc, vc, table, lens, cu, custom_mask=mask, mask_indptr=indptr) or ""
    )
    assert "causal" not in (fip.supports(q, kc, vc, table, lens, cu, causal=False) or "")
    assert "causal=False with a window" in (
        fip.supports(q, kc, vc, table, lens, cu, window_left=3, causal=False) or ""
    )
    out, e = torch.empty_like(q), torch.empty(0)
    with pytest.raises(CallRefused, match="custom mask"):
        fip.paged_prefill(
            out, e, False, q, kc, vc, table, lens, cu, e, False, lens, lens, False, 0.125, 0.0, -1,
            mask, indptr, True, True, True,
        )  # fmt: skip
    assert not stand_in.made  # no wrapper, no plan


def test_declared_after_triton_on_cuda() -> None:
    spec = registry.get("attention.paged_prefill")
    b = spec.backend("flashinfer")
    assert b.requires.capabilities == ("flashinfer",) and b.requires.devices == ("cuda",)
    order = dict(spec.priority)["cuda"]
    assert order.index("flashinfer") > order.index("triton") and order[-1] == "torch", order


def test_a_plan_flashinfer_cannot_make_is_a_refusal(
    stand_in: type[_Wrapper], monkeypatch: pytest.MonkeyPatch
) -> None:
    """FlashInfer raising while planning (a JIT module missing where JIT is off, say) reaches
    dispatch as CallRefused with FlashInfer's words (this call moves on), and no plan is kept."""

    def missing(self: _Wrapper, *args: Any, **kw: Any) -> None:
        raise RuntimeError("JIT compilation is disabled via FLASHINFER_DISABLE_JIT")

    monkeypatch.setattr(stand_in, "plan", missing)
    with pytest.raises(
        CallRefused, match="could not plan the batch: RuntimeError: JIT compilation is disabled"
    ):
        _run(_batch([4], [3], 4, 2, 64, 4, False))
    assert not fip._PLANS

    def broken(self: _Wrapper, *args: Any, **kw: Any) -> None:
        raise RuntimeError("Ninja build failed. Ninja output: ...")

    monkeypatch.setattr(stand_in, "plan", broken)  # a failed build: the backend is off, not retried each step
    with pytest.raises(BackendUnavailable, match="Ninja build failed") as info:
        _run(_batch([4], [3], 4, 2, 64, 4, False))
    assert not isinstance(info.value, CallRefused)


def test_a_new_batch_past_the_cache_replans_the_oldest_wrapper(stand_in: type[_Wrapper]) -> None:
    """Past MAX_PLANS batches, a new batch takes the oldest one's wrapper (planned again) rather
    than allocating another: an engine's steps reuse a fixed set of wrappers."""

    n = _flashinfer.MAX_PLANS
    steps = [_batch([3, 2], [1 + i, 4], 4, 2, 64, 4, False) for i in range(n + 2)]
    for args in steps:
        _close(_run(args), attention.paged_prefill(*args, backend="torch"))
    assert len(stand_in.made) == n and len(fip._PLANS) == n
    assert sum(len(w.plans) for w in stand_in.made) == n + 2  # two wrappers were planned twice
