"""``enable_pdl`` (programmatic dependent launch, as FlashInfer's argument): every public op takes
it, and kernels without the flag (CPU, Triton, torch) ignore it (tests/unit/test_pdl_binding.py:
how CUDA native kernels receive it)."""

from __future__ import annotations

import inspect

import torch

from opmux.kernels import registry
from opmux.kernels.explain import op_instance
from opmux.kernels.ops import layernorm


def test_every_public_op_takes_enable_pdl() -> None:
    for name in registry.all_ops():
        public = op_instance(name).public
        params = inspect.signature(public).parameters
        assert "enable_pdl" in params and params["enable_pdl"].default is None, name


def test_cpu_calls_accept_and_ignore_it() -> None:
    x, w = torch.randn(3, 32), torch.rand(32) + 0.5
    want = layernorm.rmsnorm(x, w, 1e-6)
    for flag in (True, False, None):
        torch.testing.assert_close(layernorm.rmsnorm(x, w, 1e-6, enable_pdl=flag), want)
        torch.testing.assert_close(layernorm.rmsnorm(x, w, 1e-6, backend="torch", enable_pdl=flag), want)
