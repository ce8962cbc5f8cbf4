"""The CPU float -> fp8 e4m3fn conversion (include/opmux/fp8_cpu.h) against torch's cast.

torch's ``.to(torch.float8_e4m3fn)`` rounds to nearest even and maps |x| >= 480 to NaN; ours
saturates to +-448, so the comparison clamps first (as the ops do). Checked: every e4m3 value,
every midpoint between neighbours (ties to even) and one fp32 ulp either side, the subnormal
range, a dense strided sweep of all fp32 bit patterns below 480, saturation and NaN.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
tvm_ffi = pytest.importorskip("tvm_ffi")

from test_native_cpu import _compile  # noqa: E402  (same directory)

PROBE = r"""
#include <tvm/ffi/function.h>
#include "opmux/common.h"
#include "opmux/fp8_cpu.h"
using namespace opmux;
void to_e4m3(tvm::ffi::TensorView out, tvm::ffi::TensorView in) {
  for (int64_t i = 0; i < in.numel(); ++i)
    data_ptr<uint8_t>(out)[i] = cpu::float_to_e4m3fn(data_ptr<float>(in)[i]);
}
TVM_FFI_DLL_EXPORT_TYPED_FUNC(to_e4m3, to_e4m3);
"""


@pytest.fixture(scope="module")
def to_e4m3(tmp_path_factory):
    d = tmp_path_factory.mktemp("fp8_cpu")
    (d / "probe.cpp").write_text(PROBE)
    p = _compile(d / "probe.cpp", d / "libprobe.so", openmp=False)
    out, _ = p.communicate()
    assert p.returncode == 0, out
    fn = tvm_ffi.load_module(str(d / "libprobe.so"))["to_e4m3"]

    def run(x: torch.Tensor) -> torch.Tensor:
        out = torch.empty(x.shape, dtype=torch.uint8)
        fn(out, x.contiguous())
        return out

    return run


def _torch_bits(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)


def _check(run, x: torch.Tensor) -> None:
    x = torch.cat([x, -x])
    got, want = run(x), _torch_bits(x)
    bad = (got != want).nonzero().flatten()
    assert bad.numel() == 0, [(x[i].item(), hex(got[i].item()), hex(want[i].item())) for i in bad[:8]]


def test_all_values_midpoints_and_neighbours(to_e4m3):
    vals = torch.arange(0, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # 0 .. 448
    mids = (vals[:-1] + vals[1:]) / 2  # exact in fp32
    up = torch.nextafter(mids, torch.full_like(mids, 1e9))
    down = torch.nextafter(mids, torch.zeros_like(mids))
    _check(to_e4m3, torch.cat([vals, mids, up, down]))


def test_subnormals_and_tiny(to_e4m3):
    _check(to_e4m3, torch.linspace(0, 2.0**-5, 100_003))
    _check(to_e4m3, torch.tensor([2.0**-10, 2.0**-10 * 1.0001, 2.0**-11, 1e-30, 1e-45, 0.0]))


def test_strided_sweep_of_fp32_bit_patterns(to_e4m3):
    # every 97th fp32 bit pattern in [0, 480): ~11M values, all binades and mantissa positions
    bits = torch.arange(0, 0x43F00000, 97, dtype=torch.int32)
    _check(to_e4m3, bits.view(torch.float32))


def test_saturation_and_nan(to_e4m3):
    x = torch.tensor([448.0, 463.9, 464.0, 480.0, 1e6, float("inf")])
    assert to_e4m3(x).tolist() == [0x7E] * 6
    assert to_e4m3(-x).tolist() == [0xFE] * 6
    n = to_e4m3(torch.tensor([float("nan")])).view(torch.float8_e4m3fn).float()
    assert torch.isnan(n).all()


def test_quant_op_uses_exact_conversion():
    """Through the op: a group whose max is 448 has scale 1, so q is the plain conversion."""
    from opmux.kernels.ops.quantization import per_token_group_quant_fp8

    vals = torch.linspace(-448, 448, 127 * 1024)
    x = torch.cat([torch.full((127, 1), 448.0), vals.view(127, 1024)], 1)[:, :1024]
    q, s = per_token_group_quant_fp8(x, group_size=1024, backend="jit")
    assert torch.all(s == 1.0)
    assert torch.equal(q.view(torch.uint8), _torch_bits(x))
