"""torch.compile(fullgraph=True) smoke check of rotary_embedding (aot_eager: fast on CPU)."""

from __future__ import annotations

import pytest
import torch

from opmux.kernels.ops.rope import rotary_embedding


@pytest.mark.parametrize("is_neox", [True, False])
def test_fullgraph(is_neox: bool) -> None:
    pos = torch.tensor([3, 0, 7])
    q, k = torch.randn(3, 4 * 16), torch.randn(3, 2 * 16)
    cache = torch.randn(8, 8)  # partial rotary: rotary_dim 8 < head_size 16
    q2, k2 = q.clone(), k.clone()
    rotary_embedding(pos, q2, k2, 16, cache, is_neox)

    def f(p: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        rotary_embedding(p, a, b, 16, cache, is_neox)
        return a + 0

    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(pos, q, k)
    torch.testing.assert_close((got, k), (q2, k2))
    torch.testing.assert_close(q[:, 8:16], q2[:, 8:16])
