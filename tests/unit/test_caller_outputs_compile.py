"""Caller-allocated outputs of ops that return a tuple are refused under torch.compile (the library
op would return aliases of its inputs, which torch.compile mis-handles) with an error that says
what to do (tests/unit/test_torch_compile.py: the ops without them under torch.compile)."""

from __future__ import annotations

import pytest
import torch

from opmux.kernels.ops import moe


def _topk_into(g: torch.Tensor, w: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    moe.topk_softmax(g, 4, True, topk_weights=w, topk_ids=i)
    return w


def _align_into(ids: torch.Tensor, sorted_ids: torch.Tensor) -> torch.Tensor:
    moe.moe_align_block_size(ids, 4, 8, sorted_token_ids=sorted_ids)
    return sorted_ids


def test_topk_softmax_buffers_refused_when_compiling() -> None:
    torch._dynamo.reset()
    g = torch.randn(6, 16)
    with pytest.raises(Exception, match=r"not supported under torch\.compile"):
        torch.compile(_topk_into, fullgraph=True)(g, torch.empty(6, 4), torch.empty(6, 4, dtype=torch.int32))


def test_moe_align_buffers_refused_when_compiling() -> None:
    torch._dynamo.reset()
    ids = torch.randint(0, 8, (5, 2), dtype=torch.int32)
    buf = torch.empty(5 * 2 + 8 * 3, dtype=torch.int32)
    with pytest.raises(Exception, match=r"not supported under torch\.compile"):
        torch.compile(_align_into, fullgraph=True)(ids, buf)
