"""The engines' block-scaled fp8 GEMM names (opmux.compat.vllm / sgl_kernel) against the reference."""

from __future__ import annotations

import pytest
import torch

from opmux.compat import sgl_kernel, vllm
from opmux.kernels.ops.gemm.op import reference

FP8 = torch.float8_e4m3fn


def _case(m: int = 5, n: int = 200, k: int = 300) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=g).to(FP8)
    b = (torch.randn(n, k, generator=g) * 0.25).to(FP8)
    return a, b, torch.rand(m, 3, generator=g) + 0.5, torch.rand(2, 3, generator=g) * 0.1 + 0.05


@pytest.mark.parametrize(
    "fn", [vllm.w8a8_block_fp8_matmul, vllm.w8a8_triton_block_scaled_mm, sgl_kernel.w8a8_block_fp8_matmul]
)
def test_triton_entries(fn: object) -> None:
    a, b, sa, sb = _case()
    y = fn(a, b, sa, sb, [128, 128], torch.bfloat16)  # type: ignore[operator]
    torch.testing.assert_close(y, reference(a, b, sa, sb, torch.bfloat16), atol=1.6e-2, rtol=1.6e-2)
    assert fn(a, b, sa, sb, [128, 128]).dtype == torch.float16  # type: ignore[operator]  # the engines' default
    with pytest.raises(ValueError, match=r"block_size \[64, 64\] is not supported; valid: \[128, 128\]"):
        fn(a, b, sa, sb, [64, 64])  # type: ignore[operator]


def test_cutlass_entries_take_b_column_major() -> None:
    a, b, sa, sb = _case()
    want = reference(a, b, sa, sb, torch.bfloat16)
    bias = torch.randn(200, dtype=torch.bfloat16)
    y = vllm.cutlass_scaled_mm(a, b.t(), sa, sb.t(), torch.bfloat16, bias=bias)
    torch.testing.assert_close(y, want + bias, atol=3e-2, rtol=1.6e-2)
    y = sgl_kernel.fp8_blockwise_scaled_mm(a, b.t(), sa, sb.t(), torch.bfloat16)
    torch.testing.assert_close(y, want, atol=1.6e-2, rtol=1.6e-2)
