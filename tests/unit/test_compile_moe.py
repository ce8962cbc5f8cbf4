"""torch.compile(fullgraph=True) smoke tests for the moe ops (aot_eager backend)."""

from __future__ import annotations

import torch

from opmux.kernels.ops.moe import moe_align_block_size, topk_softmax


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend="aot_eager")


def test_topk_softmax_compiles() -> None:
    g = torch.randn(6, 16)
    w, ids = _compiled(lambda g: topk_softmax(g, 4, True))(g)
    w0, ids0 = topk_softmax(g, 4, True)
    assert w.dtype == torch.float32 and ids.dtype == torch.int32 and ids.shape == (6, 4)
    torch.testing.assert_close(w, w0)
    assert torch.equal(ids, ids0)


def test_moe_align_block_size_compiles() -> None:
    ids = torch.randint(0, 8, (10, 2), dtype=torch.int32)
    out = _compiled(lambda t: moe_align_block_size(t, 4, 8))(ids)
    ref = moe_align_block_size(ids, 4, 8)
    assert out[0].shape == (10 * 2 + 8 * 3,) and out[2].shape == (1,)
    for a, b in zip(out, ref, strict=True):
        assert torch.equal(a, b)
