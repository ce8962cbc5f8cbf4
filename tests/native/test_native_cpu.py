"""Builds the CPU native units (through the AOT entry point csrc/aot_cpu.cpp, which includes
every CPU unit of kernels/jit/csrc) with the system C++ compiler and checks them against torch."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
tvm_ffi = pytest.importorskip("tvm_ffi")

ROOT = Path(__file__).resolve().parents[2]
JIT = ROOT / "python" / "opmux" / "kernels" / "jit"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}

# Exposes the header's scalar conversions so they can be checked exhaustively against torch.
PROBE = r"""
#include <tvm/ffi/function.h>
#include "opmux/common.h"
#include "opmux/cpu_types.h"
#include "opmux/cpu_vec.h"
using namespace opmux;
void to_half(tvm::ffi::TensorView out, tvm::ffi::TensorView in) {
  for (int64_t i = 0; i < in.numel(); ++i)
    data_ptr<uint16_t>(out)[i] = cpu::float_to_half(data_ptr<float>(in)[i]);
}
void to_bf16(tvm::ffi::TensorView out, tvm::ffi::TensorView in) {
  for (int64_t i = 0; i < in.numel(); ++i)
    data_ptr<uint16_t>(out)[i] = cpu::float_to_bf16(data_ptr<float>(in)[i]);
}
void from_half(tvm::ffi::TensorView out, tvm::ffi::TensorView in) {
  for (int64_t i = 0; i < in.numel(); ++i)
    data_ptr<float>(out)[i] = cpu::half_to_float(data_ptr<uint16_t>(in)[i]);
}
// The thread count a CPU kernel would take for a call (opmux/cpu_vec.h).
int64_t threads_for(int64_t bytes, int64_t min_bytes, int64_t items) {
  return cpu::threads_for(bytes, min_bytes, items);
}
TVM_FFI_DLL_EXPORT_TYPED_FUNC(threads_for, threads_for);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(to_half, to_half);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(to_bf16, to_bf16);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(from_half, from_half);
"""


def _compile(src: Path, out: Path, openmp: bool = True) -> subprocess.Popen:
    import tvm_ffi.libinfo as info

    from opmux.kernels.jit.modules import write_aot_header

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    lib = Path(info.find_libtvm_ffi())
    cmd = [
        cxx,
        "-std=c++17",
        "-O3",
        "-fno-trapping-math",  # as compile_flags("cpu")
        "-fPIC",
        "-shared",
        *(["-fopenmp"] if openmp else []),
        f"-I{JIT / 'include'}",
        f"-I{JIT / 'csrc'}",
        # the units csrc/aot_cpu.cpp includes, in a folder per library: the builds run in parallel,
        # and rewriting one shared header while another compiler reads it gave a library without
        # units ("Module has no function 'rmsnorm_cpu'", seen once in CI)
        f"-I{write_aot_header('cpu', out.parent / f'units-{out.stem}')}",
        *[f"-I{p}" for p in info.include_paths()],
        str(src),
        "-o",
        str(out),
        f"-L{lib.parent}",
        "-ltvm_ffi",
        f"-Wl,-rpath,{lib.parent}",
    ]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    d = tmp_path_factory.mktemp("native_cpu")
    (d / "probe.cpp").write_text(PROBE)
    jobs = {
        "aot": _compile(ROOT / "csrc" / "aot_cpu.cpp", d / "libaot.so"),
        "noomp": _compile(ROOT / "csrc" / "aot_cpu.cpp", d / "libnoomp.so", openmp=False),
        "probe": _compile(d / "probe.cpp", d / "libprobe.so"),
    }
    for name, p in jobs.items():
        out, _ = p.communicate()
        assert p.returncode == 0, f"{name} build failed:\n{out}"
    return {n: tvm_ffi.load_module(str(d / f"lib{n}.so")) for n in jobs}


@pytest.fixture(scope="module", params=["aot", "noomp"])
def mod(request, libs):
    return libs[request.param]


def rmsnorm_ref(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def silu_and_mul_ref(x):
    d = x.shape[-1] // 2
    return (torch.nn.functional.silu(x[:, :d].float()) * x[:, d:].float()).to(x.dtype)


def _close(a, b, dtype):
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(a.float(), b.float(), atol=atol, rtol=rtol)


def test_threads_follow_torch(libs):
    """A kernel's thread count is torch's intra-op pool size (the library shares torch's OpenMP
    runtime, so torch.set_num_threads reaches it), one thread below the byte cut-over, and never
    more threads than items."""
    threads_for = libs["probe"]["threads_for"]
    maps = Path("/proc/self/maps")
    if maps.exists():  # one OpenMP runtime in the process: torch's, which the kernels use too
        names = {ln.split()[-1] for ln in maps.read_text().splitlines() if len(ln.split()) >= 6}
        runtimes = {p for p in names if Path(p).name.startswith(("libgomp", "libiomp", "libomp"))}
        assert len(runtimes) == 1, runtimes
    before = torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            assert threads_for(1 << 20, 1 << 16, 1000) == n
            assert threads_for(1 << 15, 1 << 16, 1000) == 1  # below the cut-over
            assert threads_for(1 << 20, 1 << 16, 2) == min(n, 2)  # no more threads than items
    finally:
        torch.set_num_threads(before)


def test_exports(libs):
    for name in ("rmsnorm_cpu", "fused_add_rmsnorm_cpu", "silu_and_mul_cpu"):
        assert libs["aot"][name] is not None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden", [(1, 1), (3, 7), (1, 129), (5, 4099), (0, 64), (64, 1024)])
def test_rmsnorm(mod, dtype, rows, hidden):
    g = torch.Generator().manual_seed(rows * 7919 + hidden)
    x = torch.randn(rows, hidden, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype)
    out = torch.full_like(x, float("nan"))
    mod["rmsnorm_cpu"](out, x, w, 1e-6)
    _close(out, rmsnorm_ref(x, w, 1e-6), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden", [(1, 1), (3, 7), (2, 129), (4, 4099), (0, 8)])
def test_fused_add_rmsnorm(mod, dtype, rows, hidden):
    g = torch.Generator().manual_seed(rows * 31 + hidden)
    x = torch.randn(rows, hidden, generator=g).to(dtype)
    r = torch.randn(rows, hidden, generator=g).to(dtype)
    w = torch.randn(hidden, generator=g).to(dtype)
    res_ref = (x.float() + r.float()).to(dtype)
    x_ref = rmsnorm_ref(res_ref, w, 1e-5)
    mod["fused_add_rmsnorm_cpu"](x, r, w, 1e-5)
    assert torch.equal(r, res_ref)  # the stored residual is the correctly rounded sum
    _close(x, x_ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,d", [(1, 1), (3, 7), (2, 129), (3, 4099), (0, 16)])
def test_silu_and_mul(mod, dtype, rows, d):
    g = torch.Generator().manual_seed(rows * 131 + d)
    x = (3 * torch.randn(rows, 2 * d, generator=g)).to(dtype)
    out = torch.full((rows, d), float("nan"), dtype=dtype)
    mod["silu_and_mul_cpu"](out, x, False)
    _close(out, silu_and_mul_ref(x), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_rows(mod, dtype):
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 160, generator=g).to(dtype)
    x = base[::2, 3:132]  # row stride 320, offset start, hidden 129
    w = torch.randn(129, generator=g).to(dtype)
    out_base = torch.zeros(3, 200, dtype=dtype)
    out = out_base[:, 5:134]
    mod["rmsnorm_cpu"](out, x, w, 1e-6)
    _close(out, rmsnorm_ref(x, w, 1e-6), dtype)
    assert torch.all(out_base[:, :5] == 0) and torch.all(out_base[:, 134:] == 0)  # no spill-over

    xs, rs = base[::2, :129].clone(), torch.randn(3, 300, generator=g).to(dtype)[:, 10:139]
    res_ref = (xs.float() + rs.float()).to(dtype)
    xb = torch.zeros(3, 140, dtype=dtype)
    xv = xb[:, :129]
    xv.copy_(xs)
    mod["fused_add_rmsnorm_cpu"](xv, rs, w, 1e-6)
    assert torch.equal(rs, res_ref)
    _close(xv, rmsnorm_ref(res_ref, w, 1e-6), dtype)
    assert torch.all(xb[:, 129:] == 0)

    xa = torch.randn(4, 300, generator=g).to(dtype)[:, 1:259]  # d = 129, rows strided
    o = torch.zeros(4, 150, dtype=dtype)[:, 2:131]
    mod["silu_and_mul_cpu"](o, xa, False)
    _close(o, silu_and_mul_ref(xa), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_large_new_outputs(libs, dtype):
    """A new output of 8 MiB or more takes the huge-page hint (opmux/cpu_vec.h,
    advise_huge_pages): the rows of such a call are the rows a small call computes, bit for bit,
    in a fresh output and in one whose pages are already mapped; a strided view skips the hint."""
    m = libs["aot"]
    g = torch.Generator().manual_seed(5)
    rows = (16 << 20) // (4096 * dtype.itemsize)  # a 16 MiB output
    x = torch.randn(rows, 4096, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(4096, generator=g)).to(dtype)
    small = torch.empty(3, 4096, dtype=dtype)
    m["rmsnorm_cpu"](small, x[-3:], w, 1e-6)
    for out in (torch.empty_like(x), torch.zeros_like(x)):
        m["rmsnorm_cpu"](out, x, w, 1e-6)
        assert torch.equal(out[-3:], small)
        _close(out[:64], rmsnorm_ref(x[:64], w, 1e-6), dtype)
    d = 3000
    xa = (3 * torch.randn((20 << 20) // (d * dtype.itemsize), 2 * d, generator=g)).to(dtype)
    small = torch.empty(2, d, dtype=dtype)
    m["silu_and_mul_cpu"](small, xa[-2:], False)
    out = torch.empty(xa.shape[0], d, dtype=dtype)
    m["silu_and_mul_cpu"](out, xa, False)
    assert torch.equal(out[-2:], small)
    wide = torch.zeros(xa.shape[0], d + 5, dtype=dtype)
    m["silu_and_mul_cpu"](wide[:, :d], xa, False)
    assert torch.equal(wide[:, :d], out) and torch.all(wide[:, d:] == 0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["dense", "fused-qkv", "head-strided"])
def test_reshape_and_cache_layouts(dtype, layout):
    """Token rows copied whole where the heads are adjacent (dense, slices of a fused qkv), head
    by head where they are not (a gap between heads). Through the public op, forced to the JIT
    build of the unit (its entry point's arguments are the op's to change)."""
    from opmux.kernels.ops.kvcache import reshape_and_cache

    g = torch.Generator().manual_seed(3)
    t, h, d, blocks, bs = 37, 4, 32, 8, 16
    if layout == "dense":
        k, v = (torch.randn(t, h, d, generator=g).to(dtype) for _ in range(2))
    elif layout == "fused-qkv":
        qkv = torch.randn(t, 3 * h, d, generator=g).to(dtype)
        k, v = qkv[:, h : 2 * h], qkv[:, 2 * h :]
    else:
        k, v = (torch.randn(t, h, 2 * d, generator=g).to(dtype)[:, :, 5 : 5 + d] for _ in range(2))
    slots = torch.randperm(blocks * bs, generator=g)[:t]
    slots[::7] = -1
    kc = torch.full((blocks, bs, h, d), -7.0, dtype=dtype)
    vc = torch.full((blocks, bs, h, d), -7.0, dtype=dtype)
    rk, rv = kc.clone(), vc.clone()
    keep = slots >= 0
    rk.view(-1, h, d)[slots[keep]] = k[keep]
    rv.view(-1, h, d)[slots[keep]] = v[keep]
    reshape_and_cache(k, v, kc, vc, slots, backend="jit")
    assert torch.equal(kc, rk) and torch.equal(vc, rv)


def test_errors(libs):
    m = libs["aot"]
    x = torch.randn(4, 8)
    w = torch.randn(8)
    with pytest.raises(ValueError, match=r"opmux.rmsnorm: .*dtype.*float32, float16, bfloat16"):
        m["rmsnorm_cpu"](torch.empty(4, 8, dtype=torch.float64), x.double(), w.double(), 1e-6)
    with pytest.raises(ValueError, match=r"same dtype"):
        m["rmsnorm_cpu"](torch.empty(4, 8), x, w.half(), 1e-6)
    with pytest.raises(ValueError, match=r"weight.shape\[0\] is 7"):
        m["rmsnorm_cpu"](torch.empty(4, 8), x, torch.randn(7), 1e-6)
    with pytest.raises(ValueError, match=r"out.shape\[0\] is 3"):
        m["rmsnorm_cpu"](torch.empty(3, 8), x, w, 1e-6)
    with pytest.raises(ValueError, match=r"x must be 2-D"):
        m["rmsnorm_cpu"](torch.empty(4, 8), x.view(2, 2, 8), w, 1e-6)
    with pytest.raises(ValueError, match=r"contiguous in its last dimension"):
        m["rmsnorm_cpu"](torch.empty(8, 4).t(), x, w, 1e-6)
    # eps's range is the Python contract's (it cannot reach out of bounds): the ABI takes any value
    m["rmsnorm_cpu"](torch.empty(4, 8), x, w, -1.0)
    with pytest.raises(ValueError, match=r"opmux.fused_add_rmsnorm: residual.shape\[1\]|x.shape\[1\] is 8"):
        m["fused_add_rmsnorm_cpu"](x, torch.randn(4, 9), torch.randn(9), 1e-6)
    with pytest.raises(ValueError, match=r"different tensors"):
        m["fused_add_rmsnorm_cpu"](x, x, w, 1e-6)
    with pytest.raises(ValueError, match=r"opmux.silu_and_mul: x.shape\[1\] must be even"):
        m["silu_and_mul_cpu"](torch.empty(4, 4), torch.randn(4, 9), False)
    with pytest.raises(ValueError, match=r"out.shape\[1\] is 3"):
        m["silu_and_mul_cpu"](torch.empty(4, 3), x, False)
    with pytest.raises(ValueError, match=r"silu_and_mul: .*contiguous"):
        m["silu_and_mul_cpu"](torch.empty(4, 4), torch.randn(8, 4).t(), False)
    with pytest.raises(ValueError, match=r"supported dtypes"):
        m["silu_and_mul_cpu"](
            torch.empty(4, 4, dtype=torch.int32), torch.empty(4, 8, dtype=torch.int32), False
        )


def test_conversions_exhaustive(libs):
    p = libs["probe"]
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    h = bits.view(torch.float16)
    got = torch.empty(65536, dtype=torch.float32)
    p["from_half"](got, bits)
    ref = h.float()
    nan = torch.isnan(ref)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan].view(torch.int32), ref[~nan].view(torch.int32))

    g = torch.Generator().manual_seed(1)
    f = torch.cat(
        [
            torch.randn(200000, generator=g)
            * torch.exp2(torch.randint(-30, 20, (200000,), generator=g).float()),
            h.float(),  # exact values
            torch.tensor(
                [
                    0.0,
                    -0.0,
                    65504.0,
                    65520.0,
                    65519.0,
                    1e6,
                    -1e6,
                    6e-8,
                    2.98e-8,
                    1e-40,
                    float("inf"),
                    float("-inf"),
                    float("nan"),
                    3.4e38,
                ]
            ),
        ]
    )
    f = torch.cat([f, (f.view(torch.int32) ^ 1).view(torch.float32)])  # neighbours: tie edges
    for fn, dt in (("to_half", torch.float16), ("to_bf16", torch.bfloat16)):
        out = torch.empty(f.numel(), dtype=torch.int16)
        p[fn](out, f)
        ref = f.to(dt)
        got = out.view(dt)
        nan = torch.isnan(ref)
        assert torch.equal(torch.isnan(got), nan), fn
        assert torch.equal(got[~nan].view(torch.int16), ref[~nan].view(torch.int16)), fn
