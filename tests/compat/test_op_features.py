"""Features the engines need, in the native ops, with the one contract on every backend:
``rotary_embedding(..., key=None, ...)`` and int64 ``topk_ids`` for ``moe_align_block_size``."""

from __future__ import annotations

import pytest
import torch

from opmux.kernels.ops import moe, rope


@pytest.mark.parametrize("neox", [True, False])
def test_rope_key_none_rotates_the_query_only(backend: str, neox: bool) -> None:
    g = torch.Generator().manual_seed(0)
    pos = torch.tensor([3, 1, 0, 2])
    cache = torch.randn(4, 8, generator=g)
    q = torch.randn(4, 3 * 16, generator=g, dtype=torch.float32).to(torch.bfloat16)
    alone, with_key = q.clone(), q.clone()
    assert rope.rotary_embedding(pos, alone, None, 16, cache, neox) is None
    rope.rotary_embedding(pos, with_key, torch.zeros(4, 16, dtype=torch.bfloat16), 16, cache, neox)
    assert torch.equal(alone, with_key)
    ref = q.clone()
    rope.rotary_embedding(pos, ref, None, 16, cache, neox, backend="reference")
    torch.testing.assert_close(alone, ref, atol=2e-2, rtol=2e-2)
    assert not torch.equal(alone, q)
    with pytest.raises(ValueError, match="head_size must be a positive int"):
        rope.rotary_embedding(pos, q, None, 0, cache, neox)
    with pytest.raises(ValueError, match="out of range"):
        rope.rotary_embedding(torch.tensor([0, 1, 2, 9]), q, None, 16, cache, neox)


def test_rope_key_none_under_torch_compile() -> None:
    pos, cache = torch.arange(3), torch.randn(3, 16)
    q = torch.randn(3, 2, 16)
    eager, compiled = q.clone(), q.clone()
    rope.rotary_embedding(pos, eager, None, 16, cache, True)
    fn = torch.compile(
        lambda p, x, c: rope.rotary_embedding(p, x, None, 16, c, True), fullgraph=True, backend="aot_eager"
    )
    fn(pos, compiled, cache)
    torch.testing.assert_close(compiled, eager)


def test_moe_align_int64_ids_match_int32(backend: str) -> None:
    g = torch.Generator().manual_seed(1)
    ids = torch.stack([torch.randperm(8, generator=g)[:3] for _ in range(9)])  # int64, like torch.topk's
    got = moe.moe_align_block_size(ids, 4, 8)
    want = moe.moe_align_block_size(ids.to(torch.int32), 4, 8)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == torch.int32 and torch.equal(a, b)
    with pytest.raises(ValueError, match="out of range"):  # no wrap-around into a valid id
        moe.moe_align_block_size(ids + 2**32, 4, 8)
    with pytest.raises(TypeError, match="dtype"):
        moe.moe_align_block_size(ids.to(torch.int16), 4, 8)
