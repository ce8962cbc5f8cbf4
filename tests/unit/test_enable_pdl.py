"""``enable_pdl`` (programmatic dependent launch, as FlashInfer's argument): every public op takes
it; CUDA native kernels receive it as their trailing argument, other kernels ignore it."""

from __future__ import annotations

import inspect
from typing import Any

import torch

from opmux.kernels import registry
from opmux.kernels.explain import op_instance
from opmux.kernels.ops import _native, layernorm


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


def test_cuda_native_kernels_get_the_flag_last() -> None:
    seen: list[tuple[Any, ...]] = []
    kernel = _native.with_pdl(lambda *a: seen.append(a))
    kernel("out", "x")  # the default: PDL where supported
    _native.run_with_pdl(kernel, ("out", "x"), False)
    _native.run_with_pdl(kernel, ("out", "x"), 1)
    assert seen == [("out", "x", True), ("out", "x", False), ("out", "x", True)]
    # kernels without the flag (CPU, Triton, torch) are called as they are
    plain: list[tuple[Any, ...]] = []
    _native.run_with_pdl(lambda *a: plain.append(a), ("out", "x"), False)
    assert plain == [("out", "x")]


def test_first_call_dispatch_uses_the_explicit_flag_and_restores_the_default() -> None:
    seen: list[tuple[Any, ...]] = []
    kernel = _native.with_pdl(lambda *a: seen.append(a))
    _native.pdl_dispatch(False, kernel, "q", "k")
    kernel("q", "k")
    assert seen == [("q", "k", False), ("q", "k", True)]
    assert _native.PDL_DEFAULT == [True]
