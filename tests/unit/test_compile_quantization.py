"""torch.compile(fullgraph=True) smoke tests for the quantization ops (aot_eager backend)."""

from __future__ import annotations

import torch

from opmux.kernels.ops.quantization import per_token_group_quant_fp8, per_token_quant_fp8


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend="aot_eager")


def test_per_token_quant_fp8_compiles() -> None:
    x = torch.randn(3, 64)
    ub = torch.tensor([0.5])
    f = _compiled(lambda x, ub: per_token_quant_fp8(x, ub))
    q, s = f(x, ub)
    q0, s0 = per_token_quant_fp8(x, ub)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (3, 1)
    torch.testing.assert_close(q.float(), q0.float())
    torch.testing.assert_close(s, s0)


def test_per_token_group_quant_fp8_compiles_column_major() -> None:
    x = torch.randn(5, 256)
    f = _compiled(lambda x: per_token_group_quant_fp8(x, 128, 1e-10, True))
    q, s = f(x)
    q0, s0 = per_token_group_quant_fp8(x, 128, 1e-10, True)
    assert s.shape == (5, 2) and s.stride() == (1, 5)  # [T, G] view of a contiguous [G, T]
    assert s0.stride() == (1, 5)
    torch.testing.assert_close(q.float(), q0.float())
    torch.testing.assert_close(s, s0)
