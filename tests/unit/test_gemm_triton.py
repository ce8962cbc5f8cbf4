"""The Triton kernel of gemm.w8a8_block_fp8_matmul against a float32 per-block reference, in the
interpreter at tiny shapes with tails in M, N and K, both a_scale layouts, every out dtype and
split-K."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pytest
import torch

from opmux.kernels import tuned
from opmux.kernels.ops.gemm import triton_kernels as tk


def _reference(
    a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor
) -> torch.Tensor:
    """sum_kb a_scale[m,kb] * b_scale[n//128,kb] * (a[m, block kb] . b[n, block kb]) in float32."""
    m, k = a.shape
    n = b.shape[0]
    out = torch.zeros(m, n, dtype=torch.float32)
    rows = torch.arange(n) // 128
    for kb in range(math.ceil(k / 128)):
        block = slice(kb * 128, min(k, kb * 128 + 128))
        partial = a[:, block].float() @ b[:, block].float().T
        out += partial * a_scale[:, kb : kb + 1] * b_scale[rows, kb][None, :]
    return out


def _inputs(m: int, n: int, k: int, *, column_major: bool, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    kb = math.ceil(k / 128)
    a = (torch.randn(m, k, generator=gen) * 3).to(torch.float8_e4m3fn)
    b = (torch.randn(n, k, generator=gen) * 3).to(torch.float8_e4m3fn)
    a_scale = torch.rand(m, kb, generator=gen) + 0.25
    if column_major:  # the layout DeepGEMM-style quantizers write: [kb, M] storage, viewed [M, kb]
        a_scale = torch.empty_strided((m, kb), (1, m)).copy_(a_scale)
        assert a_scale.stride() == (1, m)
    b_scale = torch.rand(math.ceil(n / 128), kb, generator=gen) + 0.25
    return a, b, a_scale, b_scale


_TOL = {torch.float32: 1e-5, torch.bfloat16: 2**-8, torch.float16: 2**-11}


def _check(out: torch.Tensor, ref: torch.Tensor) -> None:
    # one rounding of the fp32 result to out's dtype, plus fp32 reassociation (relative to the
    # largest product magnitude)
    rtol = _TOL[out.dtype]
    torch.testing.assert_close(out.float(), ref, rtol=rtol, atol=1e-4 * ref.abs().max().item())


@pytest.mark.parametrize("m", [1, 7, 33])
@pytest.mark.parametrize("n", [128, 200])
@pytest.mark.parametrize("k", [128, 300])
@pytest.mark.parametrize("column_major", [False, True], ids=["a_scale_row_major", "a_scale_col_major"])
def test_matches_reference(m: int, n: int, k: int, column_major: bool) -> None:
    a, b, a_scale, b_scale = _inputs(m, n, k, column_major=column_major)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    tk.w8a8_block_fp8_matmul(out, a, b, a_scale, b_scale)
    _check(out, _reference(a, b, a_scale, b_scale))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_every_out_dtype(dtype: torch.dtype) -> None:
    a, b, a_scale, b_scale = _inputs(5, 200, 300, column_major=False, seed=1)
    out = torch.empty(5, 200, dtype=dtype)
    tk.w8a8_block_fp8_matmul(out, a, b, a_scale, b_scale)
    _check(out, _reference(a, b, a_scale, b_scale))


def _config(**changes: int) -> Mapping[str, int]:
    config = {**tuned.default_config(tk.OP, "triton", 1, (1, 1)), **changes}
    assert not tuned.validate_entry(tk.OP, "triton", config)
    return config


@pytest.mark.parametrize(
    "config",
    [
        _config(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, GROUP_SIZE_M=2),  # N tiles narrower than a scale block
        _config(BLOCK_SIZE_M=32, BLOCK_SIZE_N=256, GROUP_SIZE_M=4),  # wider than N
        _config(SPLIT_K=2),
        _config(SPLIT_K=8),  # more splits than K blocks: clamped
        _config(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, SPLIT_K=3),  # uneven split of 4 K blocks
    ],
    ids=["narrow_n", "wide_n", "split_k2", "split_k_clamped", "split_k_uneven"],
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_launch_configs(config: Mapping[str, int], dtype: torch.dtype) -> None:
    a, b, a_scale, b_scale = _inputs(33, 200, 3 * 128 + 7, column_major=True, seed=2)
    out = torch.empty(33, 200, dtype=dtype)
    tk.launch(out, a, b, a_scale, b_scale, config)
    _check(out, _reference(a, b, a_scale, b_scale))


def test_out_row_stride() -> None:
    """out needs only a unit last stride: a column slice of a wider buffer."""
    a, b, a_scale, b_scale = _inputs(7, 128, 128, column_major=False, seed=3)
    buffer = torch.zeros(7, 160, dtype=torch.bfloat16)
    tk.w8a8_block_fp8_matmul(buffer[:, 16:144], a, b, a_scale, b_scale)
    _check(buffer[:, 16:144], _reference(a, b, a_scale, b_scale))
    assert not buffer[:, :16].any() and not buffer[:, 144:].any()


@pytest.mark.parametrize(("m", "n"), [(0, 128), (4, 0)])
def test_empty_launches_nothing(m: int, n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_launch(*args: object, **kwargs: object) -> None:
        raise AssertionError("launched for an empty output")

    monkeypatch.setattr(tk, "_w8a8_block_fp8_matmul_kernel", no_launch)
    a, b, a_scale, b_scale = _inputs(max(m, 1), max(n, 1), 128, column_major=False)
    out = torch.empty(m, n, dtype=torch.bfloat16)
    tk.w8a8_block_fp8_matmul(out, a[:m], b[:n], a_scale[:m], b_scale[: math.ceil(n / 128)])


def test_launcher_takes_the_tuned_config(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str, str, tuple[int, ...], int]] = []
    real = tuned.lookup

    def spy(op: str, backend: str, device: str, shape: tuple[int, ...], m: int) -> Mapping[str, int]:
        seen.append((op, backend, device, shape, m))
        return real(op, backend, device, shape, m)

    monkeypatch.setattr(tuned, "lookup", spy)
    a, b, a_scale, b_scale = _inputs(3, 200, 300, column_major=False)
    tk.w8a8_block_fp8_matmul(torch.empty(3, 200, dtype=torch.bfloat16), a, b, a_scale, b_scale)
    assert seen == [(tk.OP, "triton", "cpu", (200, 300), 3)]
