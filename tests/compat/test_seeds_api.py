"""The seeds' selection API (select_kernel, get_kernel, clear_cache) answers from the one
selector: the same choice a call makes, overrides included."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import opmux.kernels as K
from opmux.kernels.errors import BackendUnavailable


def test_select_kernel_is_what_a_call_runs() -> None:
    x, w = torch.randn(2, 16), torch.ones(16)
    sel = K.explain("layernorm.rmsnorm", x, w)
    assert K.select_kernel("layernorm.rmsnorm", "cpu") == sel.chosen
    assert K.select_kernel("rmsnorm", "cpu") == sel.chosen  # a bare name unique across groups
    assert K.select_kernel("moe.moe_align_block_size", "cpu", dtype="int32") in (
        "aot",
        "jit",
        "triton",
        "torch",
    )


def test_select_kernel_for_another_platform() -> None:
    from opmux.kernels.platform import Platform

    # an sm_70 GPU: the backends that need sm_80+ are rejected by the selector's own rules
    plat = Platform(device_type="cuda", arch="sm_70")
    sel = K.explain("layernorm.rmsnorm", device="cuda", dtype="bfloat16")
    assert K.select_kernel("layernorm.rmsnorm", plat, dtype="bfloat16") in {d.backend for d in sel.decisions}
    assert (
        K.select_kernel("layernorm.rmsnorm", "cuda:sm_90", dtype="float16")
        == K._seeds.explain_kernel("layernorm.rmsnorm", "cuda:sm_90", dtype="float16").chosen
    )


def test_overrides_and_clear_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    with K.use_backends("layernorm.rmsnorm=torch"):
        assert K.select_kernel("layernorm.rmsnorm", "cpu") == "torch"
    assert (
        K.select_kernel("layernorm.rmsnorm", "cpu") != "torch"
        or K.explain("layernorm.rmsnorm", device="cpu").chosen == "torch"
    )
    before = K.select_kernel("layernorm.rmsnorm", "cpu")
    monkeypatch.setenv("OPMUX_KERNEL_BACKEND", "layernorm.rmsnorm=reference")
    assert K.select_kernel("layernorm.rmsnorm", "cpu") == before  # cached: the env is read once
    K.clear_cache()
    assert K.select_kernel("layernorm.rmsnorm", "cpu") == "reference"
    monkeypatch.delenv("OPMUX_KERNEL_BACKEND")
    K.clear_cache()
    assert K.select_kernel("layernorm.rmsnorm", "cpu") == before


def test_get_kernel() -> None:
    from opmux.kernels.ops import layernorm

    assert K.get_kernel("layernorm.rmsnorm") is layernorm.rmsnorm
    x, w = torch.randn(3, 32), torch.randn(32)
    ref = layernorm.rmsnorm(x, w, backend="reference")
    torch_impl = K.get_kernel("rmsnorm", "torch")
    torch.testing.assert_close(torch_impl(x, w), ref)
    with pytest.raises(TypeError, match="dtype"):  # the op's contract runs first
        torch_impl(x.int(), w)
    with pytest.raises(BackendUnavailable):  # asked by name: no silent fallback
        K.get_kernel("rmsnorm", "torch_npu")(x, w)
    with pytest.raises(ValueError, match="tritn"):
        K.get_kernel("rmsnorm", "tritn")
    with pytest.raises(ValueError, match="one backend"):
        K.get_kernel("rmsnorm", "triton,torch")
    with pytest.raises(ValueError, match="unknown op"):
        K.select_kernel("rmsnrm")
    with pytest.raises(ValueError, match="unsupported dtype"):
        K.select_kernel("rmsnorm", "cpu", dtype="int8")


def test_imports_stay_cheap() -> None:
    code = (
        "import sys\n"
        "import opmux.kernels, opmux.compat, opmux.compat.sgl_kernel, opmux.compat.vllm\n"
        "from opmux.kernels import select_kernel, get_kernel, clear_cache\n"
        "heavy = [m for m in ('torch', 'triton', 'tvm_ffi') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
