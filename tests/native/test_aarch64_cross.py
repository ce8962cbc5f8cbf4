"""The CPU kernels on aarch64: tests/native/aarch64/kernel_check.cpp (every CPU op group against a
scalar reference, no Python, torch or tvm-ffi) cross-compiled with Debian's aarch64-linux-gnu-g++
(static, so qemu needs no aarch64 sysroot) and run under qemu-user; the same driver built natively
with the x86 multiversioned clones disabled (-DOPMUX_CPU_NO_CLONES), so the portable code path is
checked on x86 too; the same with the clones in but no AVX-512 (-DOPMUX_CPU_VEC_MAX=0: what an
AVX2 CPU runs, the x86-64-v3 / AVX2 copies and the F16C float16 chunks where this CPU has them);
the driver shown to fail on a deliberately broken kernel; and the AOT library's
translation unit (csrc/aot_cpu.cpp, kernels plus tvm-ffi entry points) compiled for aarch64.

Needs the Debian packages g++-aarch64-linux-gnu and qemu-user-static for the aarch64 test; skips
with that hint when they are absent."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JIT = ROOT / "python" / "opmux" / "kernels" / "jit"
DRIVER = Path(__file__).resolve().parent / "aarch64" / "kernel_check.cpp"
CROSS_CXX = "aarch64-linux-gnu-g++"
QEMU = ("qemu-aarch64-static", "qemu-aarch64")
APT_HINT = "install the Debian packages: apt-get install -y g++-aarch64-linux-gnu qemu-user-static"
# The flags of the JIT / AOT CPU build (jit/compile/build.py: compile_flags), as a standalone
# program (no -fPIC / -shared).
FLAGS = ["-std=c++17", "-O3", "-fno-trapping-math", "-fopenmp", "-Wall"]
# Every op group the driver must report on (a case line "ok   <name> ...").
OPS = [
    "conversions",
    "rmsnorm",
    "gemma_rmsnorm",
    "fused_add_rmsnorm",
    "gemma_fused_add_rmsnorm",
    "qk_norm",
    "silu_and_mul",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "rotary_embedding",
    "per_token_quant_fp8",
    "per_token_group_quant_fp8",
    "topk_softmax",
    "topk_sigmoid",
    "moe_align_block_size",
    "batched_moe_align_block_size",
    "reshape_and_cache",
]
MIN_CASES = 250


def _host_cxx() -> str | None:
    return shutil.which("g++") or shutil.which("c++")


def _qemu() -> str | None:
    return next((q for q in map(shutil.which, QEMU) if q), None)


def _build_cmd(cxx: str, out: Path, *extra: str, jit: Path = JIT) -> list[str]:
    return [cxx, *FLAGS, *extra, f"-I{jit / 'include'}", f"-I{jit / 'csrc'}", str(DRIVER), "-o", str(out)]


def _start(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """Starts both builds at once (they are the slow part); each test waits for its own."""
    d = tmp_path_factory.mktemp("kernel_check")
    jobs: dict[str, tuple[Path, subprocess.Popen]] = {}
    cross = shutil.which(CROSS_CXX)
    if cross is not None and _qemu() is not None:
        out = d / "kernel_check_aarch64"
        jobs["aarch64"] = (out, _start(_build_cmd(cross, out, "-static")))
    host = _host_cxx()
    if host is not None:
        out = d / "kernel_check_native"
        jobs["native"] = (out, _start(_build_cmd(host, out, "-DOPMUX_CPU_NO_CLONES")))
        if platform.machine().lower() in ("x86_64", "amd64"):
            out = d / "kernel_check_vec0"
            jobs["vec0"] = (out, _start(_build_cmd(host, out, "-DOPMUX_CPU_VEC_MAX=0")))
        if _avx512_level() > 0:  # the AVX-512 row kernels (opmux/cpu_vec.h), each level built
            for level in range(1, _avx512_level() + 1):
                out = d / f"kernel_check_vec{level}"
                jobs[f"vec{level}"] = (out, _start(_build_cmd(host, out, f"-DOPMUX_CPU_VEC_MAX={level}")))
    yield jobs
    for _, p in jobs.values():
        if p.poll() is None:
            p.kill()
        p.communicate()  # reaps it and closes its pipe


def _cpu_flags() -> list[str]:
    """This x86-64 Linux CPU's feature flags (/proc/cpuinfo), or none elsewhere."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not Path("/proc/cpuinfo").exists():
        return []
    return next(
        (
            ln.split(":", 1)[1].split()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("flags")
        ),
        [],
    )


def _avx512_level() -> int:
    """The vector level opmux/cpu_vec.h takes on this machine: 0 (portable), 1 (AVX-512 F/BW/VL/DQ),
    2 (and AVX512_BF16), from /proc/cpuinfo; 0 off x86-64 Linux."""
    flags = _cpu_flags()
    if not {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= set(flags):
        return 0
    return 2 if "avx512_bf16" in flags else 1


def _wait_build(builds, name: str) -> Path:
    out, p = builds[name]
    log, _ = p.communicate(timeout=300)
    assert p.returncode == 0, f"building kernel_check ({name}) failed:\n{' '.join(p.args)}\n{log}"
    return out


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="2")  # the OpenMP cases run on more than one thread
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)


def _assert_passed(r: subprocess.CompletedProcess, arch: str, *, clones: bool = False) -> None:
    out = r.stdout + r.stderr
    failures = "\n".join(line for line in out.splitlines() if not line.startswith("ok   "))
    assert r.returncode == 0, f"kernel_check failed on {arch} (exit {r.returncode}):\n{failures}"
    first = out.splitlines()[0]
    assert f"arch={arch}" in first and ("clones=none" in first) != clones and "vec=0" in first, first
    m = re.search(r"all (\d+) cases passed", out)
    assert m and int(m.group(1)) >= MIN_CASES, out[-2000:]
    missing = [op for op in OPS if f"\nok   {op} " not in "\n" + out]
    assert not missing, f"kernel_check reported no case for {missing}"


def test_aarch64_under_qemu(builds):
    if shutil.which(CROSS_CXX) is None:
        pytest.skip(f"no aarch64 cross compiler ({CROSS_CXX}); {APT_HINT}")
    qemu = _qemu()
    if qemu is None:
        pytest.skip(f"no qemu-user for aarch64 ({' or '.join(QEMU)}); {APT_HINT}")
    exe = _wait_build(builds, "aarch64")
    _assert_passed(_run([qemu, str(exe)]), "aarch64")


def test_native_portable_path(builds):
    """The x86 build without the multiversioned clones: the baseline copy every CPU can run."""
    if "native" not in builds:
        pytest.skip("no C++ compiler (g++ or c++)")
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(), platform.machine())
    exe = _wait_build(builds, "native")
    _assert_passed(_run([str(exe)]), arch)


def test_native_clones_without_avx512(builds):
    """The x86 build with its clones but no AVX-512 row kernels (vec level 0): the code an AVX2 CPU
    runs, its x86-64-v3 copy (FMA-contracted reductions: the fused quantization's rstd must still
    be rmsnorm's) and the F16C float16 chunks, where this CPU has them."""
    if "vec0" not in builds:
        pytest.skip("not an x86-64 host, or no C++ compiler")
    exe = _wait_build(builds, "vec0")
    r = _run([str(exe)])
    _assert_passed(r, "x86_64", clones=True)
    # the AVX2 rows (cpu::v256: gelu, rope's 16-bit NeoX heads, the bfloat16 chunk store) ran where
    # the CPU has AVX2 + FMA + F16C (every x86-64-v3 CPU) and GCC 11 or newer built them, only there
    v3 = {"avx2", "fma", "f16c"} <= set(_cpu_flags()) and _gcc_major(_host_cxx()) >= 11
    assert f"v256={int(v3)}" in r.stdout.splitlines()[0], r.stdout.splitlines()[0]


def _gcc_major(cxx: str | None) -> int:
    """GCC's major version (0: not GCC, e.g. clang, or none)."""
    if cxx is None:
        return 0
    r = subprocess.run([cxx, "-dumpfullversion", "-dumpversion"], capture_output=True, text=True, timeout=30)
    v = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    if r.returncode != 0 or "clang" in v.lower():
        return 0
    return int(r.stdout.strip().split(".")[0] or 0)


@pytest.mark.parametrize("level", [1, 2])
def test_native_avx512_paths(builds, level):
    """The AVX-512 row kernels against the same scalar references: level 1 (bfloat16 rounded in
    integer registers) and level 2 (vcvtneps2bf16), each where this CPU has it."""
    if f"vec{level}" not in builds:
        pytest.skip(f"this CPU has no AVX-512 level {level} (opmux/cpu_vec.h), or no C++ compiler")
    exe = _wait_build(builds, f"vec{level}")
    r = _run([str(exe)])
    out = r.stdout + r.stderr
    failures = "\n".join(line for line in out.splitlines() if not line.startswith("ok   "))
    assert r.returncode == 0, f"kernel_check (AVX-512 level {level}) failed:\n{failures}"
    assert f"vec={level}" in out.splitlines()[0], out.splitlines()[0]
    m = re.search(r"all (\d+) cases passed", out)
    assert m and int(m.group(1)) >= MIN_CASES, out[-2000:]


# The tvm-ffi entry points of csrc/aot_cpu.cpp.
ENTRY_POINTS = [
    "rmsnorm_cpu",
    "fused_add_rmsnorm_cpu",
    "gemma_rmsnorm_cpu",
    "gemma_fused_add_rmsnorm_cpu",
    "qk_norm_cpu",
    "rmsnorm_static_quant_fp8_cpu",
    "fused_add_rmsnorm_static_quant_fp8_cpu",
    "silu_and_mul_cpu",
    "gelu_and_mul_cpu",
    "gelu_tanh_and_mul_cpu",
    "rotary_embedding_cpu",
    "per_token_quant_fp8_cpu",
    "per_token_group_quant_fp8_cpu",
    "topk_softmax_cpu",
    "topk_sigmoid_cpu",
    "moe_align_block_size_cpu",
    "batched_moe_align_block_size_cpu",
    "reshape_and_cache_cpu",
]


def test_aot_unit_compiles_for_aarch64(tmp_path):
    """The whole AOT translation unit, tvm-ffi bindings included, compiles for aarch64 (-O0: this
    checks the source, the driver above checks the kernels) and exports every entry point."""
    cross, nm = shutil.which(CROSS_CXX), shutil.which("aarch64-linux-gnu-nm")
    if cross is None or nm is None:
        pytest.skip(f"no aarch64 cross toolchain ({CROSS_CXX}, aarch64-linux-gnu-nm); {APT_HINT}")
    info = pytest.importorskip("tvm_ffi.libinfo")
    obj = tmp_path / "aot_cpu_aarch64.o"
    cmd = [cross, "-std=c++17", "-O0", "-fPIC", "-fopenmp", "-c", str(ROOT / "csrc" / "aot_cpu.cpp")]
    from opmux.kernels.jit.modules import write_aot_header

    units = write_aot_header("cpu", tmp_path / "units")  # the units csrc/aot_cpu.cpp includes
    cmd += [
        f"-I{JIT / 'include'}",
        f"-I{JIT / 'csrc'}",
        f"-I{units}",
        *[f"-I{p}" for p in info.include_paths()],
    ]
    b = subprocess.run([*cmd, "-o", str(obj)], capture_output=True, text=True, timeout=300)
    assert b.returncode == 0, f"{' '.join(cmd)}\n{b.stdout}{b.stderr}"
    syms = subprocess.run([nm, "--defined-only", str(obj)], capture_output=True, text=True, check=True)
    missing = [e for e in ENTRY_POINTS if f" T __tvm_ffi_{e}\n" not in syms.stdout]
    assert not missing, f"aarch64 object lacks the entry points {missing}"


# A wrong kernel must fail the driver: rope's rotation with the sign of the sine term flipped.
MUTATION = ("csrc/rope_cpu.cpp", "a * cos[i] - b * sin[i]", "a * cos[i] + b * sin[i]")


def test_driver_catches_a_broken_kernel(tmp_path):
    cxx = _host_cxx()
    if cxx is None:
        pytest.skip("no C++ compiler (g++ or c++)")
    jit = tmp_path / "jit"
    shutil.copytree(JIT / "include", jit / "include")
    shutil.copytree(JIT / "csrc", jit / "csrc")
    rel, old, new = MUTATION
    src = jit / rel
    text = src.read_text()
    assert old in text, f"{rel} no longer contains {old!r}: update MUTATION in this test"
    src.write_text(text.replace(old, new))
    exe = tmp_path / "kernel_check_broken"
    # -O1: this build only has to run, not be fast.
    cmd = [c for c in _build_cmd(cxx, exe, "-DOPMUX_CPU_NO_CLONES", jit=jit) if c != "-O3"] + ["-O1"]
    b = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert b.returncode == 0, b.stdout + b.stderr
    r = _run([str(exe), "rope"])
    assert r.returncode == 1, r.stdout[-2000:]
    assert "FAIL rotary_embedding" in r.stdout and "cases FAILED" in r.stdout, r.stdout[-2000:]
