"""Where cuBLASLt's blockwise GEMM (the scaled_mm backend) is refused: the shapes it computes
wrong on the H200 (ceil(K/128) not a multiple of 4 with several weight blocks) and the ones it
refuses (K, N not multiples of 16; a non-bf16 output), each with the reason explain shows."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from opmux.kernels.ops.gemm.op import scaled_mm_supports


def _args(m: int, n: int, k: int) -> tuple[SimpleNamespace, SimpleNamespace]:
    cuda = SimpleNamespace(type="cuda")
    return SimpleNamespace(shape=(m, k), device=cuda), SimpleNamespace(shape=(n, k), device=cuda)


@pytest.fixture(autouse=True)
def cuda13(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", "13.0")


@pytest.mark.parametrize(
    ("n", "k"), [(512, 512), (7168, 1024), (576, 1536), (24576, 7168), (128, 256), (128, 640), (7168, 16384)]
)
def test_accepted_where_measured_right(n: int, k: int) -> None:
    a, b = _args(8, n, k)
    assert scaled_mm_supports(a, b, None, None) is None


@pytest.mark.parametrize(
    ("n", "k"), [(512, 256), (576, 640), (7168, 384), (1024, 768), (7168, 1280), (512, 4000)]
)
def test_refused_where_it_computes_wrong(n: int, k: int) -> None:
    a, b = _args(4096, n, k)
    why = scaled_mm_supports(a, b, None, None)
    assert why is not None and "wrong results" in why and f"K={k}" in why


def test_refused_layouts_and_dtypes() -> None:
    a, b = _args(8, 512, 3884)
    assert "multiples of 16" in (scaled_mm_supports(a, b, None, None) or "")
    a, b = _args(8, 512, 512)
    assert "bfloat16 only" in (scaled_mm_supports(a, b, None, None, out_dtype=torch.float16) or "")
