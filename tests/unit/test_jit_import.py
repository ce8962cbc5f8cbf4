"""Importing the JIT and AOT packages is free: no torch, no tvm_ffi, no files, no processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import opmux
from opmux.kernels import aot, jit
from opmux.kernels.aot import _loader
from opmux.kernels.jit import modules

PYTHONPATH = str(Path(opmux.__file__).resolve().parents[1])


def test_import_is_lazy(tmp_path: Path) -> None:
    code = (
        "import sys, os\n"
        "import opmux.kernels.jit, opmux.kernels.jit.compile, opmux.kernels.aot\n"
        "import opmux.kernels.jit.__main__\n"
        "bad = {'torch', 'tvm_ffi', 'triton', 'numpy'} & set(sys.modules)\n"
        "assert not bad, bad\n"
        "assert not os.path.exists(os.environ['OPMUX_CACHE_DIR'])\n"
        "assert opmux.kernels.aot.available('cpu') in (True, False)\n"
        "assert 'tvm_ffi' not in sys.modules\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": PYTHONPATH,
        "OPMUX_CACHE_DIR": str(tmp_path / "c"),
        "HOME": str(tmp_path / "home"),
    }
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    assert not (tmp_path / "home").exists()


def test_kernel_path_is_found_by_find_spec() -> None:
    assert jit.KERNEL_PATH == Path(jit.__file__).parent
    with pytest.raises(AttributeError):
        jit.NOT_A_NAME  # noqa: B018


def test_module_table() -> None:
    assert {"activation_cpu", "activation_cuda", "layernorm_cpu", "layernorm_cuda"} <= set(modules.MODULES)
    assert {"layernorm_cuda", "activation_cuda"} <= set(modules.names("cuda"))
    assert all(m.device == "cuda" for m in map(modules.get, modules.names("cuda")))
    assert all(m.sources[0].startswith(m.name) for m in modules.MODULES.values())
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda'"):
        modules.JitModule("x", ("x.cpp",), "rocm")  # type: ignore[arg-type]


def test_aot_absent_is_none(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown AOT device 'npu'; valid: cpu, cuda"):
        _loader.available("npu")  # type: ignore[arg-type]
    monkeypatch.setattr(_loader, "library_path", lambda device: tmp_path / f"lib_{device}.so")
    monkeypatch.setattr(_loader, "_loaded", {})
    assert aot.available("cpu") is False
    assert aot.load_library("cpu") is None


def test_aot_library_path_is_beside_the_package() -> None:
    assert aot.library_path("cuda") == Path(aot.__file__).parent / "libopmux_aot_cuda.so"


def test_aot_present_loads_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from opmux.kernels.jit.compile.build import build_shared_library

    src = tmp_path / "aot.cpp"
    src.write_text(
        "#include <tvm/ffi/function.h>\nint aot_f(int x) { return x + 7; }\n"
        "TVM_FFI_DLL_EXPORT_TYPED_FUNC(aot_f, aot_f);\n"
    )
    lib = tmp_path / "libopmux_aot_cpu.so"
    build_shared_library(lib, sources=[src], device="cpu")
    monkeypatch.setattr(_loader, "library_path", lambda device: lib)
    monkeypatch.setattr(_loader, "_loaded", {})
    assert aot.available("cpu")
    first = aot.load_library("cpu")
    assert first is not None and first.aot_f(1) == 8
    assert aot.load_library("cpu") is first


def test_ops_package_import_is_light() -> None:
    """``import opmux.kernels.ops`` (goal <= 20 ms, docs/benchmarks/host_overhead*.md) lists the
    groups only: no declarations, no contracts, none of dataclasses' inspect machinery."""
    code = (
        "import sys, opmux.kernels.ops as ops\n"
        "assert ops.__all__, ops.__all__\n"
        "bad = {'torch', 'inspect', 'dataclasses', 'opmux.kernels.ops._decl', 'opmux.kernels.ops._contract'}\n"
        "assert not bad & set(sys.modules), bad & set(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": PYTHONPATH})
