"""The device-code reader behind the CUDA wheel check, on a real nvcc build of two archs + PTX."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tools import fatbin  # noqa: E402

NVCC = shutil.which("nvcc") or (
    "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None
)


@pytest.mark.skipif(NVCC is None, reason="needs nvcc (CUDA toolkit) to build a fatbin")
@pytest.mark.skipif(fatbin.find_cuobjdump() is None, reason="needs cuobjdump (CUDA toolkit or triton)")
def test_lists_cubins_and_ptx(tmp_path: Path) -> None:
    src = tmp_path / "k.cu"
    src.write_text("__global__ void k(float* x) { x[threadIdx.x] *= 2.f; }\n")
    lib = tmp_path / "libk.so"
    subprocess.run(
        [
            NVCC,
            "-shared",
            "-Xcompiler",
            "-fPIC",
            "-gencode",
            "arch=compute_80,code=sm_80",
            "-gencode",
            "arch=compute_90a,code=sm_90a",
            "-gencode",
            "arch=compute_90,code=compute_90",
            str(src),
            "-o",
            str(lib),
        ],
        check=True,
    )
    code = fatbin.read_device_code(lib)
    assert code.cubins == {"sm_80", "sm_90a"}
    assert code.ptx == {"compute_90"}


@pytest.mark.skipif(fatbin.find_cuobjdump() is None, reason="needs cuobjdump (CUDA toolkit or triton)")
def test_host_only_library_has_no_device_code(tmp_path: Path) -> None:
    src = tmp_path / "h.c"
    src.write_text("int f(void) { return 1; }\n")
    lib = tmp_path / "libh.so"
    subprocess.run(["cc", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    code = fatbin.read_device_code(lib)
    assert not code.cubins and not code.ptx


@pytest.mark.skipif(NVCC is None, reason="needs nvcc (CUDA toolkit) to build a fatbin")
@pytest.mark.skipif(fatbin.find_cuobjdump() is None, reason="needs cuobjdump (CUDA toolkit or triton)")
def test_wheel_check_compares_device_code_with_the_table(tmp_path: Path) -> None:
    import dataclasses
    import zipfile

    from tools import targets, wheel_check

    src = tmp_path / "k.cu"
    src.write_text("__global__ void k(float* x) { x[threadIdx.x] *= 2.f; }\n")
    lib = tmp_path / "libopmux_aot_cuda.so"
    subprocess.run(
        [
            NVCC,
            "-shared",
            "-Xcompiler",
            "-fPIC",
            "-gencode",
            "arch=compute_80,code=sm_80",
            str(src),
            "-o",
            str(lib),
        ],
        check=True,
    )
    wheel = tmp_path / "opmux-1.0-py3-none-linux_x86_64.whl"
    member = "opmux/kernels/aot/libopmux_aot_cuda.so"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(lib, member)
    cuda = targets.load(ROOT / "targets.toml")["cuda"]
    problems = wheel_check._check_device_code(wheel, cuda, {member})
    assert any("holds cubins ['sm_80']" in p for p in problems)
    assert any("holds PTX []" in p for p in problems)
    only_sm80 = dataclasses.replace(cuda, aot=dataclasses.replace(cuda.aot, archs=("sm_80",), ptx=""))
    assert wheel_check._check_device_code(wheel, only_sm80, {member}) == []
