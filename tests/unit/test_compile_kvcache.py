"""torch.compile(fullgraph=True) smoke test for reshape_and_cache (aot_eager backend)."""

from __future__ import annotations

import torch

from opmux.kernels.ops.kvcache import reshape_and_cache


def test_reshape_and_cache_compiles() -> None:
    key, value = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    kc, vc = torch.zeros(4, 4, 2, 8), torch.zeros(4, 4, 2, 8)
    slots = torch.tensor([5, -1, 12])

    def f(k, v, kc, vc, s):
        reshape_and_cache(k, v, kc, vc, s)
        return kc.sum() + vc.sum()

    torch._dynamo.reset()
    torch.compile(f, fullgraph=True, backend="aot_eager")(key, value, kc, vc, slots)
    torch.testing.assert_close(kc[1, 1], key[0])
    torch.testing.assert_close(vc[3, 0], value[2])
    torch.testing.assert_close(kc.abs().sum(), key[0].abs().sum() + key[2].abs().sum())  # -1 skipped
