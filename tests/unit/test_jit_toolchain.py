"""Toolchain discovery, arch selection and tvm-ffi paths: pure, no compiles."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest

from opmux.kernels.jit.compile import toolchain as tc
from opmux.kernels.jit.compile.build import CompileError, compile_flags


def test_cxx_not_found_lists_every_place_and_a_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(tc.ToolchainNotFound) as info:
        tc.find_cxx()
    msg = str(info.value)
    for expected in (
        "no C++ compiler found",
        "PATH: c++",
        "PATH: g++",
        "PATH: clang++",
        "apt-get install g++",
        "$CXX",
    ):
        assert expected in msg
    again = pickle.loads(pickle.dumps(info.value))
    assert (again.compiler, again.searched, str(again)) == (info.value.compiler, info.value.searched, msg)


def test_bad_cxx_env_is_not_silently_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    with pytest.raises(tc.ToolchainNotFound, match=r"\$CXX: /nonexistent/g\+\+"):
        tc.find_cxx()


def test_nvcc_search_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    if os.path.exists("/usr/local/cuda/bin/nvcc"):
        found = tc.find_nvcc()
        assert found.kind == "nvcc" and "release" in found.version
        assert tc.nvcc_release(found) >= (11, 0)
    else:
        with pytest.raises(tc.ToolchainNotFound) as info:
            tc.find_nvcc()
        assert [s.split(":")[0] for s in info.value.searched] == [
            "$CUDA_HOME/bin",
            "PATH",
            "default CUDA install",
        ]


def test_hipcc_not_found_names_rocm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("ROCM_PATH", raising=False)
    monkeypatch.delenv("HIP_PATH", raising=False)
    if os.path.exists("/opt/rocm/bin/hipcc"):
        pytest.skip("ROCm installed")
    with pytest.raises(tc.ToolchainNotFound, match="Install ROCm"):
        tc.find_hipcc()


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_found_cxx_identity_has_no_path() -> None:
    found = tc.find_cxx()
    assert found.kind == "cxx" and os.path.isabs(found.path)
    assert found.path not in found.identity


@pytest.mark.parametrize(
    ("text", "archs"),
    [
        ("9.0a", ["sm_90a"]),
        ("sm_80,sm_90a", ["sm_80", "sm_90a"]),
        ("8.0; 9.0  10.0f", ["sm_80", "sm_90", "sm_100f"]),
        ("sm_120a sm_120a", ["sm_120a"]),
    ],
)
def test_parse_cuda_archs(text: str, archs: list[str]) -> None:
    assert tc.parse_cuda_archs(text) == archs


@pytest.mark.parametrize("text", ["", "90", "sm90", "9.0x", "compute_90"])
def test_parse_cuda_archs_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid CUDA arch"):
        tc.parse_cuda_archs(text)


@pytest.mark.parametrize(
    ("cap", "kw", "arch"),
    [
        ((8, 0), {}, "sm_80"),
        ((8, 9), {}, "sm_89"),
        ((9, 0), {}, "sm_90a"),
        ((9, 0), {"nvcc": (11, 8)}, "sm_90"),
        ((10, 0), {}, "sm_100a"),
        ((10, 3), {"family": True}, "sm_103f"),
        ((12, 0), {"nvcc": (12, 8), "family": True}, "sm_120a"),
        ((12, 1), {"nvcc": (12, 4)}, "sm_121"),
    ],
)
def test_arch_for_capability(cap: tuple[int, int], kw: dict, arch: str) -> None:
    assert tc.cuda_arch_for_capability(*cap, **kw) == arch


def test_local_archs_env_override_needs_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(tc.CUDA_ARCHS_ENV, "9.0a,10.0a")
    assert tc.local_cuda_archs() == ["sm_90a", "sm_100a"]
    assert tc.ptx_arch_for(["sm_90a", "sm_100a"]) == "compute_100"


def test_cuda_flags_gencode_per_arch_plus_ptx() -> None:
    flags = compile_flags("cuda", archs=["sm_80", "sm_90a"], ptx_arch="compute_90")
    assert flags.count("-gencode") == 3
    assert "arch=compute_90a,code=sm_90a" in flags and "arch=compute_90,code=compute_90" in flags
    assert ["-Xcompiler", "-fPIC"] == flags[flags.index("-Xcompiler") :][:2]
    assert "-DNDEBUG" in flags  # CUTLASS's device asserts would serialize wgmma (ptxas C7510)
    with pytest.raises(ValueError, match="invalid CUDA arch"):
        compile_flags("cuda", archs=["9.0"])
    with pytest.raises(ValueError, match="unknown device 'rocm'"):
        compile_flags("rocm")  # type: ignore[arg-type]


def test_tvm_ffi_paths_without_importing_it() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from opmux.kernels.jit.compile.toolchain import tvm_ffi_paths; "
        "inc, lib = tvm_ffi_paths(); assert (inc[0] / 'tvm' / 'ffi').is_dir(); "
        "assert lib.name == 'libtvm_ffi.so'; "
        "assert 'tvm_ffi' not in sys.modules and 'torch' not in sys.modules"
    )
    subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(tc.__file__).resolve().parents[4])},
    )


def test_compile_error_pickles() -> None:
    err = CompileError(["c++", "x.cpp"], 1, "x.cpp:1: error: nope")
    again = pickle.loads(pickle.dumps(err))
    assert (again.command, again.returncode, again.stderr) == (["c++", "x.cpp"], 1, "x.cpp:1: error: nope")
    assert "c++ x.cpp" in str(again) and "error: nope" in str(again)
