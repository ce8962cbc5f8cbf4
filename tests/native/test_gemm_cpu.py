"""The CPU block-scaled fp8 GEMM (kernels/jit/csrc/gemm_cpu.cpp, w8a8_block_fp8_matmul_cpu) built
with the system C++ compiler (the JIT unit alone, without OpenMP, and with the portable kernels
only) and called directly, against a
float64 reference that sums each 128-wide K block and applies that block's scales, as the op's
definition (ops/gemm/op.py: reference)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
tvm_ffi = pytest.importorskip("tvm_ffi")
if not hasattr(torch, "float8_e4m3fn"):
    pytest.skip("torch without float8_e4m3fn", allow_module_level=True)

from test_native_cpu import JIT, _compile  # noqa: E402  (same directory)

FP8 = torch.float8_e4m3fn
OUT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# the kernel sums in fp32 (blocks of up to 128 products, then up to ceil(K / 128) scaled terms):
# relative to the magnitude of the terms; then one rounding to out's dtype
TOL = {torch.float32: 2e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}
ATOL = {torch.float16: 2.0**-24}  # half an ulp of float16's subnormals (bfloat16 has fp32's range)


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemm_cpu")
    src = JIT / "csrc" / "gemm_cpu.cpp"
    # the portable kernels alone (no multiversioned clones, no AVX2 kernels): what other CPUs run
    (d / "portable.cpp").write_text('#define OPMUX_CPU_NO_CLONES 1\n#include "gemm_cpu.cpp"\n')
    # named gemm_*: a library named libomp* would read as a second OpenMP runtime to
    # test_native_cpu.py::test_threads_follow_torch (it scans /proc/self/maps by file name)
    jobs = {
        "omp": _compile(src, d / "gemm_omp.so"),
        "noomp": _compile(src, d / "gemm_noomp.so", openmp=False),
        "portable": _compile(d / "portable.cpp", d / "gemm_portable.so"),
    }
    for name, p in jobs.items():
        out, _ = p.communicate()
        assert p.returncode == 0, f"{name} build failed:\n{out}"
    return {n: tvm_ffi.load_module(str(d / f"gemm_{n}.so")) for n in jobs}


@pytest.fixture(scope="module", params=["omp", "noomp", "portable"])
def fn(request, libs):
    return libs[request.param]["w8a8_block_fp8_matmul_cpu"]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _fp8(shape, g, scale=64.0):
    return (scale * torch.randn(*shape, generator=g)).clamp(-448, 448).to(FP8)


def _inputs(m, n, k, seed, a_col_major=False):
    g = torch.Generator().manual_seed(seed)
    a, b = _fp8((m, k), g), _fp8((n, k), g)
    kt = _cdiv(k, 128)
    if a_col_major:  # the transposed view of a [Kt, M] tensor: stride (1, M)
        sa = (torch.rand(kt, m, generator=g) * 0.01 + 1e-3).T
    else:
        sa = torch.rand(m, kt, generator=g) * 0.01 + 1e-3
    sb = torch.rand(_cdiv(n, 128), kt, generator=g) * 0.01 + 1e-3
    return a, b, sa, sb


def _reference(a, b, sa, sb):
    """float64: per 128-wide K block, (block dot * a_scale) * b_scale; also the magnitude of the terms."""
    m, k = a.shape
    n = b.shape[0]
    af, bf = a.double(), b.double()
    sbr = sb.double().repeat_interleave(128, dim=0)[:n]
    acc = torch.zeros(m, n, dtype=torch.float64)
    mag = torch.zeros(m, n, dtype=torch.float64)
    for kb in range(_cdiv(k, 128)):
        ks = slice(kb * 128, min(k, (kb + 1) * 128))
        s = sa[:, kb : kb + 1].double() * sbr[:, kb]
        acc += (af[:, ks] @ bf[:, ks].T) * s
        mag += (af[:, ks].abs() @ bf[:, ks].abs().T) * s.abs()
    return acc, mag


def _check(out, a, b, sa, sb):
    want, mag = _reference(a, b, sa, sb)
    tol = TOL[out.dtype]
    err = (out.double() - want).abs()
    bound = tol * (mag + want.abs()) + ATOL.get(out.dtype, 1e-30)
    bad = (err > bound).nonzero()
    assert bad.numel() == 0, [
        (tuple(i.tolist()), out[tuple(i)].item(), want[tuple(i)].item()) for i in bad[:5]
    ]


@pytest.mark.parametrize("dtype", OUT_DTYPES)
@pytest.mark.parametrize("m", [0, 1, 7, 130])
@pytest.mark.parametrize("n", [1, 128, 200])
@pytest.mark.parametrize("k", [1, 128, 300])
def test_matches_reference(fn, dtype, m, n, k):
    a, b, sa, sb = _inputs(m, n, k, seed=m * 1_000_003 + n * 1009 + k)
    out = torch.full((m, n), float("nan"), dtype=dtype)
    fn(out, a, b, sa, sb)
    _check(out, a, b, sa, sb)


@pytest.mark.parametrize("m", [1, 3, 4, 5, 7, 130])
def test_a_scale_column_major(fn, m):
    n, k = 200, 300
    a, b, sa, sb = _inputs(m, n, k, seed=17 + m, a_col_major=True)
    assert sa.stride() == (1, m)
    out = torch.empty(m, n, dtype=torch.float32)
    fn(out, a, b, sa, sb)
    _check(out, a, b, sa, sb)


@pytest.mark.parametrize(
    "m,n,k", [(2, 7748, 3884), (37, 7748, 389), (200, 333, 1000), (6, 16, 8), (13, 130, 129)]
)
def test_tails_and_tiles(fn, m, n, k):
    a, b, sa, sb = _inputs(m, n, k, seed=m + n + k)
    out = torch.empty(m, n, dtype=torch.bfloat16)
    fn(out, a, b, sa, sb)
    _check(out, a, b, sa, sb)


@pytest.mark.parametrize("dtype", OUT_DTYPES)
@pytest.mark.parametrize("m", [1, 130])
def test_row_strided_out_and_a(fn, dtype, m):
    n, k = 200, 300
    a, b, sa, sb = _inputs(m, n, k, seed=5 + m)
    a_wide = torch.zeros(m, k + 40, dtype=torch.uint8).view(FP8)
    a_wide[:, 13 : 13 + k] = a
    a_view = a_wide[:, 13 : 13 + k]  # row stride k + 40, a byte offset
    b_wide = torch.zeros(n, k + 8, dtype=torch.uint8).view(FP8)
    b_wide[:, :k] = b
    out_wide = torch.full((m, n + 24), -7.0, dtype=dtype)
    out = out_wide[:, 3 : 3 + n]
    fn(out, a_view, b_wide[:, :k], sa, sb)
    _check(out, a, b, sa, sb)
    assert (out_wide[:, :3] == -7).all() and (out_wide[:, 3 + n :] == -7).all()  # nothing outside


@pytest.mark.parametrize("dtype", OUT_DTYPES)
@pytest.mark.parametrize("m", [1, 9])
def test_nan_propagates(fn, dtype, m):
    n, k = 200, 300
    a, b, sa, sb = _inputs(m, n, k, seed=99)
    a.view(torch.uint8)[0, 5] = 0x7F  # e4m3fn NaN: row 0 of the result
    b.view(torch.uint8)[150, 290] = 0xFF  # -NaN: column 150
    sa[m - 1, 1] = float("nan")  # last row, through its scale
    out = torch.zeros(m, n, dtype=dtype)
    fn(out, a, b, sa, sb)
    nan = torch.zeros(m, n, dtype=torch.bool)
    nan[0, :] = True
    nan[:, 150] = True
    nan[m - 1, :] = True
    assert torch.equal(out.isnan(), nan)
    a2, b2, sa2 = a.clone(), b.clone(), sa.clone()
    a2.view(torch.uint8)[0, 5] = 0
    b2.view(torch.uint8)[150, 290] = 0
    sa2[m - 1, 1] = 1e-3
    want = torch.zeros(m, n, dtype=dtype)
    fn(want, a2, b2, sa2, sb)
    assert torch.equal(out[~nan], want[~nan])


def _codes():
    codes = torch.arange(256, dtype=torch.uint8)
    return codes[(codes & 0x7F) != 0x7F]  # every e4m3fn value but the NaNs (test_nan_propagates)


def _one_hot(rows, k, sel):
    x = torch.zeros(rows, k, dtype=torch.uint8)
    x[torch.arange(rows), sel] = 0x38  # 1.0
    return x.view(FP8)


def _unit_scales(m, n, k):
    return torch.ones(m, _cdiv(k, 128)), torch.ones(_cdiv(n, 128), _cdiv(k, 128))


@pytest.mark.parametrize("m", [1, 4, 10])
def test_every_fp8_value_of_b_decodes_exactly(fn, m):
    # a one-hot: out[r, n] = b[n, sel[r]], one exact product
    codes = _codes()
    n = k = codes.numel()
    b = codes[(torch.arange(n)[:, None] + torch.arange(k)[None, :]) % k].view(FP8)
    sel = (torch.arange(m) * 37) % k
    sa, sb = _unit_scales(m, n, k)
    out = torch.empty(m, n, dtype=torch.float32)
    fn(out, _one_hot(m, k, sel), b, sa, sb)
    assert torch.equal(out, b.float()[:, sel].T)


@pytest.mark.parametrize("m", [1, 4, 254])
def test_every_fp8_value_of_a_decodes_exactly(fn, m):
    # b one-hot: out[r, n] = a[r, sel[n]]
    codes = _codes()
    k = codes.numel()
    a = codes[(torch.arange(m)[:, None] + torch.arange(k)[None, :]) % k].view(FP8)
    n = 40
    sel = (torch.arange(n) * 7) % k
    sa, sb = _unit_scales(m, n, k)
    out = torch.empty(m, n, dtype=torch.float32)
    fn(out, a, _one_hot(n, k, sel), sa, sb)
    assert torch.equal(out, a.float()[:, sel])


def test_m_or_n_zero_writes_nothing(fn):
    a, b, sa, sb = _inputs(3, 0, 100, seed=1)
    fn(torch.empty(3, 0), a, b, sa, sb)
    a, b, sa, sb = _inputs(0, 5, 100, seed=1)
    fn(torch.empty(0, 5), a, b, sa, sb)


def test_native_errors(fn):
    m, n, k = 4, 200, 300
    a, b, sa, sb = _inputs(m, n, k, seed=3)
    out = torch.empty(m, n)
    with pytest.raises(ValueError, match=r"a_scale.shape\[1\] is 2, expected 3"):
        fn(out, a, b, sa[:, :2], sb)
    with pytest.raises(ValueError, match=r"b_scale.shape\[0\] is 1, expected 2"):
        fn(out, a, b, sa, sb[:1])
    with pytest.raises(ValueError, match=r"b.shape\[1\]"):
        fn(out, a, b[:, :299].contiguous(), sa, sb)
    with pytest.raises(ValueError, match=r"out.shape\[1\]"):
        fn(torch.empty(m, n + 1), a, b, sa, sb)
    with pytest.raises(ValueError, match="a has dtype"):
        fn(out, a.float(), b, sa, sb)
    with pytest.raises(ValueError, match="a_scale has dtype"):
        fn(out, a, b, sa.double(), sb)
    with pytest.raises(ValueError, match="out has dtype"):
        fn(torch.empty(m, n, dtype=torch.float64), a, b, sa, sb)
    with pytest.raises(ValueError, match="contiguous in its last dimension"):
        fn(out, a, torch.empty(k, n, dtype=torch.uint8).view(FP8).T, sa, sb)
    with pytest.raises(ValueError, match="must be 2-D"):
        fn(out, a.reshape(1, m, k), b, sa, sb)
    with pytest.raises(ValueError, match="rows overlap"):
        fn(torch.empty(m * n).as_strided((m, n), (n - 1, 1)), a, b, sa, sb)
    with pytest.raises(ValueError, match="K must be at least 1"):
        fn(out, a[:, :0], b[:, :0], sa[:, :0], sb[:, :0])
