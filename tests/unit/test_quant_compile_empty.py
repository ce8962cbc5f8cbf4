"""The quant ops' empty tensor ("no scale_ub" / "dynamic": ``_checks.PROTOS``, the contract's
view of an absent optional input) is never a cached fake one: when the
first call on a device is traced by torch.compile, the fake op runs the checks on fake tensors,
and a FakeTensor cached then reached the kernel of the compiled graph's real run and of every
later eager call ("Cannot access data pointer of Tensor (e.g. FakeTensor ...)")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from opmux.kernels.ops import _checks, quantization


def _per_token(x: torch.Tensor) -> Any:
    return quantization.per_token_quant_fp8(x)


def _per_tensor(x: torch.Tensor) -> Any:
    return quantization.per_tensor_quant_fp8(x)


@pytest.mark.parametrize("fn", [_per_token, _per_tensor], ids=["per_token", "per_tensor"])
def test_first_call_compiled_then_eager(
    fn: Callable[[torch.Tensor], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_checks, "PROTOS", {})  # the first call on this device is the traced one
    torch._dynamo.reset()
    x = torch.randn(4, 64)
    q_c, s_c = torch.compile(fn, backend="aot_eager", fullgraph=True)(x)
    assert all(type(e) is torch.Tensor for p in _checks.PROTOS.values() for e in p.values())
    q_e, s_e = fn(x)
    assert torch.equal(s_c, s_e)
    assert torch.equal(q_c.view(torch.uint8), q_e.view(torch.uint8))
