"""A built library exports its FFI functions and nothing of opmux's C++ (``compile_flags``' hidden
visibility). A unit's JIT module and the AOT library hold the same source; exported, the static
locals of their templates and inline functions become GNU-unique symbols that the dynamic linker
merges across both, so one copy's kernel launched on the other's "shared memory opted in" flag
(``cudaErrorInvalidValue`` from sampling_cuda on an H100, session 33). The CPU build here; the CUDA
flags carry the same two options to the host compiler."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from opmux.kernels.jit.compile import toolchain as tc
from opmux.kernels.jit.compile.build import build_shared_library, compile_flags

UNIT = """
#include <tvm/ffi/function.h>
#include <cstdint>

namespace opmux {
namespace demo {
// the shape of sampling_cuda's static_smem_for: a per-instantiation flag in a template
template <int N>
int opted_once() {
  static int opted = N;
  return ++opted;
}
inline int shared_cache() {
  static int cache = 7;
  return cache++;
}
int64_t bump(int64_t x) { return x + opted_once<3>() + shared_cache(); }
}  // namespace demo
}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(bump, opmux::demo::bump);
"""


def _defined_dynamic_symbols(lib: Path) -> list[tuple[str, str]]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], check=True, capture_output=True, text=True)
    rows = [line.split() for line in out.stdout.splitlines()]
    return [(r[-2], r[-1]) for r in rows if len(r) >= 2]


def test_flags_hide_everything_but_the_exports() -> None:
    for flags in (compile_flags("cpu"), compile_flags("cuda", archs=["sm_90a"])):
        assert "-fvisibility=hidden" in flags and "-fvisibility-inlines-hidden" in flags
    cuda = compile_flags("cuda", archs=["sm_90a"])
    at = cuda.index("-fvisibility=hidden")
    assert cuda[at - 1] == "-Xcompiler"  # nvcc hands it to the host compiler


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs binutils' nm")
def test_a_cpu_library_exports_only_its_ffi_functions(tmp_path: Path) -> None:
    try:
        cxx = tc.find_cxx()
    except tc.ToolchainNotFound as exc:
        pytest.skip(f"no C++ compiler: {exc}")
    src = tmp_path / "unit.cpp"
    src.write_text(UNIT)
    lib = tmp_path / "unit.so"
    build_shared_library(lib, sources=[src], device="cpu", toolchain=cxx)
    symbols = _defined_dynamic_symbols(lib)
    names = {name for _, name in symbols}
    assert any("__tvm_ffi_bump" in n for n in names), sorted(names)
    ours = sorted(n for n in names if "opmux" in n or "demo" in n)
    assert ours == [n for n in ours if n.startswith("__tvm_ffi_")], ours
    # no GNU-unique object at all: nothing a second copy of the unit could be merged with
    assert not [n for kind, n in symbols if kind == "u"], symbols
