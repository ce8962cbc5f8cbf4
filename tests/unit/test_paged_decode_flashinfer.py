"""attention.paged_decode's ``flashinfer`` backend: the block table as FlashInfer's CSR page table,
one plan per batch (made again when the table or the lengths change in place), the NHD / HND
layouts, and its refusals. FlashInfer needs a GPU: a stand-in ``flashinfer.decode`` (attention
over the CSR table in torch) runs the backend's calls on the CPU here; the decode GPU grid runs
the real one (tests/parity/test_attention_decode_grid.py)."""

from __future__ import annotations

import math
import sys
import types
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
import torch

from opmux.kernels import registry
from opmux.kernels.errors import BackendUnavailable
from opmux.kernels.ops import attention
from opmux.kernels.ops.attention import _flashinfer
from opmux.kernels.ops.attention import paged_decode_flashinfer as fid

I32 = torch.int32


class _Wrapper:
    """FlashInfer's batch decode wrapper, in torch: attention over the planned CSR pages."""

    made: ClassVar[list[_Wrapper]] = []

    def __init__(self, workspace: torch.Tensor, kv_layout: str) -> None:
        self.layout = kv_layout
        self.plans: list[dict[str, Any]] = []
        _Wrapper.made.append(self)

    def plan(
        self, indptr: Any, indices: Any, last: Any, hq: int, hkv: int, d: int, page: int, **kw: Any
    ) -> None:
        self.plans.append({"indptr": indptr, "indices": indices, "last": last, "page": page, **kw})

    def run(
        self, q: torch.Tensor, caches: tuple[torch.Tensor, torch.Tensor], out: torch.Tensor
    ) -> torch.Tensor:
        p = self.plans[-1]
        k, v = caches
        if self.layout == "HND":
            k, v = k.transpose(1, 2), v.transpose(1, 2)
        hkv, d = k.shape[2], k.shape[3]
        g = q.shape[1] // hkv
        for b in range(q.shape[0]):
            pages = p["indices"][p["indptr"][b] : p["indptr"][b + 1]].long()
            n = (len(pages) - 1) * p["page"] + int(p["last"][b])
            keys, vals = k[pages].reshape(-1, hkv, d)[:n].float(), v[pages].reshape(-1, hkv, d)[:n].float()
            s = torch.einsum("hgd,nhd->hgn", q[b].float().view(hkv, g, d), keys) * p["sm_scale"]
            if p["logits_soft_cap"]:
                s = p["logits_soft_cap"] * torch.tanh(s / p["logits_soft_cap"])
            if p["window_left"] >= 0:
                s[..., : max(0, n - 1 - p["window_left"])] = float("-inf")
            out[b] = torch.einsum("hgn,nhd->hgd", s.softmax(-1), vals).reshape(-1, d).to(out.dtype)
        return out


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[_Wrapper]]:
    mod = types.ModuleType("flashinfer.decode")
    mod.BatchDecodeWithPagedKVCacheWrapper = _Wrapper  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flashinfer", types.ModuleType("flashinfer"))
    monkeypatch.setitem(sys.modules, "flashinfer.decode", mod)
    monkeypatch.setattr(fid, "refusal", lambda **kw: None)  # CPU tensors: the device check aside
    _flashinfer.vendor.cache_clear()
    fid._PLANS.clear()
    _Wrapper.made.clear()
    yield _Wrapper
    _flashinfer.vendor.cache_clear()
    fid._PLANS.clear()


def _batch(lens: list[int], hq: int, hkv: int, d: int, page: int, hnd: bool) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(sum(lens) + page)
    width = max(1, max(-(-n // page) for n in lens))
    nb = len(lens) * width + 2
    shape = (nb, hkv, page, d) if hnd else (nb, page, hkv, d)
    kc = torch.randn(shape, generator=g).to(torch.bfloat16)
    vc = torch.randn(shape, generator=g).to(torch.bfloat16)
    if hnd:
        kc, vc = kc.transpose(1, 2), vc.transpose(1, 2)
    table = torch.randperm(nb, generator=g)[: len(lens) * width].view(len(lens), width).to(I32)
    q = torch.randn(len(lens), hq, d, generator=g).to(torch.bfloat16)
    return q, kc, vc, table, torch.tensor(lens, dtype=I32)


def _run(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, table: torch.Tensor, lens: torch.Tensor,
         softcap: float = 0.0, window: int = -1) -> torch.Tensor:  # fmt: skip
    out = torch.empty_like(q)
    e = torch.empty(0)
    scale = 1 / math.sqrt(q.shape[-1])
    fid.paged_decode(
        out, e, False, q, kc, vc, table, lens, e, False, lens, lens, False, scale, softcap, window
    )
    return out


def test_csr_of_a_block_table() -> None:
    table = torch.tensor([[7, 3, 9], [4, 0, 0], [2, 5, 6]], dtype=I32)
    indptr, indices, last = fid.csr(table, torch.tensor([9, 4, 100], dtype=I32), page=4, num_blocks=10)
    assert indptr.tolist() == [0, 3, 4, 7]  # 100 clamped to the table's 12
    assert indices.tolist() == [7, 3, 9, 4, 2, 5, 6]
    assert last.tolist() == [1, 4, 4]
    with pytest.raises(BackendUnavailable, match=r"outside \[0, 9\)"):
        fid.csr(table, torch.tensor([9, 4, 1], dtype=I32), page=4, num_blocks=9)
    with pytest.raises(BackendUnavailable, match="length 0"):
        fid.csr(table, torch.tensor([9, 0, 1], dtype=I32), page=4, num_blocks=10)


@pytest.mark.parametrize("hnd", [False, True], ids=["nhd", "hnd"])
def test_runs_match_the_op_and_plan_once_per_batch(stand_in: type[_Wrapper], hnd: bool) -> None:
    q, kc, vc, table, lens = _batch([37, 5, 63, 1], 8, 2, 64, 16, hnd)
    for softcap, window in ((0.0, -1), (20.0, 9)):
        want = attention.paged_decode(
            q, kc, vc, table, lens, softcap=softcap, window_left=window, backend="torch"
        )
        got = _run(q, kc, vc, table, lens, softcap, window)
        torch.testing.assert_close(got.float(), want.float(), atol=1.6e-2, rtol=1.6e-2)
    assert [w.layout for w in stand_in.made] == ["HND" if hnd else "NHD"] * 2  # one plan per knob set
    _run(q, kc, vc, table, lens, 20.0, 9)  # the next layer of the same step: no new plan
    assert len(stand_in.made) == 2 and all(len(w.plans) == 1 for w in stand_in.made)
    lens.add_(1)  # the engine's next step, in place: planned again
    want = attention.paged_decode(q, kc, vc, table, lens, softcap=20.0, window_left=9, backend="torch")
    torch.testing.assert_close(
        _run(q, kc, vc, table, lens, 20.0, 9).float(), want.float(), atol=1.6e-2, rtol=1.6e-2
    )
    assert len(stand_in.made) == 3


def test_refusals_name_the_reason() -> None:
    base = {
        "device": "cuda", "dtype": "bfloat16", "cache_dtype": "bfloat16", "head_dim": 128,
        "layouts": ("NHD", "NHD"), "sinks": False, "lse": False, "capturing": False,
    }  # fmt: skip
    assert fid.refusal(**base) is None
    cases = {
        "device": ("cpu", "CUDA tensors"),
        "cache_dtype": ("float8_e4m3fn", "bf16 / fp16"),
        "head_dim": (96, "head dim 96"),
        "layouts": (("NHD", "HND"), "the same for K and V"),
        "sinks": (True, "sinks"),
        "lse": (True, "base 2"),
        "capturing": (True, "CUDA-graph capture"),
        "value_dim": (64, "(MLA)"),
    }
    for field, (value, words) in cases.items():
        why = fid.refusal(**{**base, field: value})
        assert why is not None and words in why, (field, why)
    strided = torch.zeros(4, 8, 2, 64)[:, ::2]
    assert fid.layout(strided) is None and fid.layout(torch.zeros(4, 2, 8, 64).transpose(1, 2)) == "HND"


def test_declared_after_opmux_backends_on_cuda() -> None:
    spec = registry.get("attention.paged_decode")
    b = spec.backend("flashinfer")
    assert b.requires.capabilities == ("flashinfer",) and b.requires.devices == ("cuda",)
    order = dict(spec.priority)["cuda"]
    assert order.index("flashinfer") > order.index("triton") and order[-1] == "torch", order
