"""torch.compile(fullgraph=True) smoke check of gemma_rmsnorm, gemma_fused_add_rmsnorm and
qk_norm (aot_eager: fast on CPU)."""

from __future__ import annotations

import torch

from opmux.kernels.ops.layernorm import gemma_fused_add_rmsnorm, gemma_rmsnorm, qk_norm


def _compile(fn):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend="aot_eager")


def test_gemma_rmsnorm() -> None:
    x, w = torch.randn(4, 32), torch.randn(32)
    torch.testing.assert_close(_compile(lambda a, b: gemma_rmsnorm(a, b) + 1)(x, w), gemma_rmsnorm(x, w) + 1)


def test_gemma_fused_add_rmsnorm() -> None:
    x, r, w = torch.randn(4, 32), torch.randn(4, 32), torch.randn(32)
    x2, r2 = x.clone(), r.clone()
    _compile(lambda a, b, c: gemma_fused_add_rmsnorm(a, b, c))(x, r, w)
    gemma_fused_add_rmsnorm(x2, r2, w)
    torch.testing.assert_close((x, r), (x2, r2))


def test_qk_norm() -> None:
    qkv = torch.randn(3, (4 + 2 + 2) * 16)
    qw, kw = torch.randn(16), torch.randn(16)
    want = qkv.clone()
    qk_norm(want[:, :64].view(3, 4, 16), want[:, 64:96].view(3, 2, 16), qw, kw)

    def f(t: torch.Tensor) -> torch.Tensor:
        qk_norm(t[:, :64].view(3, 4, 16), t[:, 64:96].view(3, 2, 16), qw, kw)
        return t * 1

    torch.testing.assert_close(_compile(f)(qkv), want)
