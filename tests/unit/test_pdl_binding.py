"""How dispatch binds a native CUDA kernel's trailing ``enable_pdl`` (no GPU: a stub kernel).

The default (``enable_pdl`` not given) is resolved once when the backend is bound (compute
capability >= 9 per device index), so the hot path appends a constant; an explicit flag wins;
CPU, Triton and torch kernels never see it.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from opmux.kernels import fused_op, registry
from opmux.kernels.explain import op_instance
from opmux.kernels.ops import _native, layernorm

OP = "layernorm.rmsnorm"


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """The native loaders hand out a recording stub; dispatch caches start empty."""
    seen: list[tuple[Any, ...]] = []
    monkeypatch.setattr(_native.NativeLoader, "kernel", lambda self, op, device: lambda *a: seen.append(a))
    op = op_instance(OP)
    op.forget_kernels()
    yield seen
    op.forget_kernels()


def _defaults(monkeypatch: pytest.MonkeyPatch, flags: tuple[bool, ...]) -> None:
    monkeypatch.setattr(fused_op, "_PDL_DEFAULTS", flags)


def test_every_public_op_reserves_enable_pdl() -> None:
    for name in registry.all_ops():
        params = inspect.signature(op_instance(name).public).parameters
        assert params["enable_pdl"].default is None, name
        assert "enable_pdl" not in str(getattr(torch.ops.opmux, name.partition(".")[2]).default._schema)


@pytest.mark.parametrize("cc9", [True, False])
def test_cuda_native_kernel_gets_the_default_flag_bound_once(
    monkeypatch: pytest.MonkeyPatch, stub: list[tuple[Any, ...]], cc9: bool
) -> None:
    _defaults(monkeypatch, (cc9,))
    op = op_instance(OP)
    x, w = torch.randn(2, 32), torch.rand(32) + 0.5
    bound = op.bind("jit", "cuda")  # the contract runs on CPU tensors, then the stub
    bound(x, w)
    bound(x, w, enable_pdl=not cc9)
    bound(x, w, enable_pdl=0)
    assert [a[-1] for a in stub] == [cc9, not cc9, False]
    assert all(a[1] is x and a[2] is w and a[3] == 1e-6 for a in stub)
    _, flag = op.entry("jit", "cuda")
    assert flag is cc9
    stub.clear()
    op.kernel("jit", "cuda")("o", "x")  # for callers holding kernel(*kernel_args)
    assert stub == [("o", "x", cc9)]


def test_cpu_native_kernel_takes_no_flag(stub: list[tuple[Any, ...]]) -> None:
    op = op_instance(OP)
    x, w = torch.randn(2, 32), torch.rand(32) + 0.5
    op.bind("jit", "cpu")(x, w, enable_pdl=True)
    assert op.entry("jit", "cpu")[1] is None
    assert len(stub) == 1 and len(stub[0]) == 4


def test_hot_path_appends_the_cached_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    """The public function's CUDA branch, driven with a CPU tensor dressed as a CUDA one."""
    op = op_instance(OP)
    seen: list[tuple[Any, ...]] = []

    class Cuda(torch.Tensor):
        is_cpu = False  # type: ignore[assignment]
        is_cuda = True  # type: ignore[assignment]

    x = torch.randn(2, 32).as_subclass(Cuda)
    w = torch.rand(32) + 0.5
    op._cuda[x.dtype] = (lambda *a: seen.append(a), True)
    op._forced[("jit", False, x.dtype)] = (lambda *a: seen.append(("forced", *a)), False)
    try:
        op.public(x, w)
        op.public(x, w, enable_pdl=False)
        op.public(x, w, backend="jit")
        op.public(x, w, backend="jit", enable_pdl=True)
    finally:
        op.invalidate()
    assert [a[-1] for a in seen] == [True, False, False, True]
    assert seen[2][0] == "forced"


def test_cpu_calls_accept_and_ignore_it() -> None:
    x, w = torch.randn(3, 32), torch.rand(32) + 0.5
    want = layernorm.rmsnorm(x, w, 1e-6)
    for flag in (True, False, None):
        for backend in (None, "torch", "reference"):
            got = layernorm.rmsnorm(x, w, 1e-6, backend=backend, enable_pdl=flag)
            torch.testing.assert_close(got, want)
        op_instance(OP).invalidate()  # the first (full dispatch) call as well
        torch.testing.assert_close(layernorm.rmsnorm(x, w, 1e-6, enable_pdl=flag), want)


def test_mixed_gpus_resolve_the_flag_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    _defaults(monkeypatch, (False, True))
    seen: list[tuple[Any, ...]] = []
    kernel, flag = fused_op.pdl_entry(lambda *a: seen.append(a))
    assert flag is fused_op.PER_DEVICE

    class OnDevice(torch.Tensor):
        def __init__(self, *a: Any) -> None:
            self._index = 0

        @property
        def device(self) -> Any:  # type: ignore[override]
            return SimpleNamespace(index=self._index)

    t = torch.zeros(1).as_subclass(OnDevice)
    for index in (0, 1):
        t._index = index
        kernel(t, 7, flag)
    kernel(t, 7, False)  # explicit: as given
    assert [a[-1] for a in seen] == [False, True, False]


def test_reserved_in_declarations() -> None:
    from opmux.kernels.ops._decl import parse_signature

    with pytest.raises(ValueError, match="reserved"):
        parse_signature("(Tensor x, bool enable_pdl=False) -> Tensor")
