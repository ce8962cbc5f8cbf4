"""torch.compile(fullgraph=True) smoke check of the gelu gated activations (aot_eager: fast on CPU)."""

from __future__ import annotations

import pytest
import torch

from opmux.kernels.ops.activation import gelu_and_mul, gelu_tanh_and_mul


@pytest.mark.parametrize("fn", [gelu_and_mul, gelu_tanh_and_mul])
def test_fullgraph(fn) -> None:
    x = torch.randn(3, 2 * 24)
    torch._dynamo.reset()
    compiled = torch.compile(lambda a: fn(a) * 2, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), fn(x) * 2)
    out = torch.empty(3, 24)
    torch.compile(lambda a, o: fn(a, out=o), fullgraph=True, backend="aot_eager")(x, out)
    torch.testing.assert_close(out, fn(x))
