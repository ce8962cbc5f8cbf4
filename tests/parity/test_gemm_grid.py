"""gemm.w8a8_block_fp8_matmul on vLLM's grid (tests/kernels/quantization/test_block_fp8.py): every
backend that runs on the device against the fp32 per-tile reference, at vLLM's criterion (mean
|out - ref| / mean |ref| < 1e-3). M 1, 7, 8, 83, 84, 4096; N up to 13,824; K up to 16,384, with
ceil-division tails (N = 7748, K = 3884). On a GPU only: the CPU runs the small parity samples
(the Triton interpreter would take hours here)."""

from __future__ import annotations

import itertools

import pytest
import torch

from opmux.kernels import registry
from opmux.kernels.errors import BackendUnavailable
from opmux.kernels.explain import op_instance
from opmux.kernels.ops.gemm.op import reference

OP = "gemm.w8a8_block_fp8_matmul"
MS = (1, 7, 8, 83, 84, 4096)
NK = (
    (2112, 128),  # one k-tile: the CUTLASS consumer loop's first exit
    (128, 256),
    (512, 256),
    (576, 640),
    (512, 3884),
    (7748, 4096),
    (7168, 13824),
    (13824, 16384),
    (4096, 7168),
)
DTYPES = (torch.bfloat16, torch.float16)


def _inputs(m: int, n: int, k: int, dev: str) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device=dev).manual_seed(m * 31 + n * 7 + k)
    fp8 = torch.float8_e4m3fn
    fmax = torch.finfo(fp8).max
    a = ((torch.rand(m, k, device=dev, generator=g) - 0.5) * 2 * fmax).clamp(-fmax, fmax).to(fp8)
    b = ((torch.rand(n, k, device=dev, generator=g) - 0.5) * 2 * fmax).clamp(-fmax, fmax).to(fp8)
    factor = 1e-2  # vLLM's scales: rand * 1e-2
    sa = torch.rand(m, -(-k // 128), device=dev, generator=g) * factor
    sb = torch.rand(-(-n // 128), -(-k // 128), device=dev, generator=g) * factor
    return a, b, sa, sb


# a tree without the AOT library falls back from aot with a warning: the run still proves the rest
@pytest.mark.filterwarnings("ignore:opmux.*falls back:RuntimeWarning")
@pytest.mark.parametrize("backend", ["default", *[b.name for b in registry.get(OP).backends]])
def test_vllm_grid(backend: str, device_type: str) -> None:
    if device_type == "cpu":
        pytest.skip("the vLLM grid runs on a GPU (the CPU runs the op's small parity samples)")
    dev = "cuda"
    op = op_instance(OP)
    fn = op if backend == "default" else op.impl(backend)
    spec = registry.get(OP)
    if backend != "default" and "cuda" not in spec.backend(backend).requires.devices:
        pytest.skip(f"{backend} does not run on cuda")
    failures = []
    for m, (n, k), dtype in itertools.product(MS, NK, DTYPES):
        if backend == "torch" and m * k * n > 2**40:
            continue  # the dequantizing torch backend at M=4096, N=K=16k: minutes, proves nothing more
        a, b, sa, sb = _inputs(m, n, k, dev)
        want = reference(a, b, sa, sb, dtype).float()
        try:
            got = fn(a, b, sa, sb, out_dtype=dtype).float()
        except ValueError as exc:
            if backend in ("aot", "jit") and "CUDA (CUTLASS/TMA) kernel needs" in str(exc):
                continue  # forced onto a layout TMA cannot read: refused (the default call takes Triton)
            raise
        except BackendUnavailable as exc:
            if backend == "scaled_mm" and "cuBLASLt" in str(exc):
                continue  # a shape or dtype cuBLASLt would compute wrong: refused, by design
            if backend == "skinny" and (
                "at most 16 rows" in str(exc) or "K must be a multiple of 16" in str(exc)
            ):
                continue  # past 16 rows or K not a multiple of 16: refused, by design
            pytest.skip(f"{backend}: {exc}")
        err = float((got - want).abs().mean() / want.abs().mean())
        if not err < 1e-3:
            failures.append(f"M={m} N={n} K={k} {dtype}: mean relative error {err:.2e}")
    assert not failures, "\n".join(failures)


def test_skinny_every_launch_and_layout(device_type: str) -> None:
    """The skinny-M kernel (ops/gemm/skinny_cuda.py) at every launch choice it is built for, on
    tails (N not a multiple of 8 or 128, K of 16 but not 128), both halves of the MMA's rows
    (M <= 8 and 9-16), strided rows, M-major activation scales and every output dtype: each
    element written, at vLLM's criterion. An unlisted launch is refused."""
    if device_type == "cpu":
        pytest.skip("the skinny kernel runs on a GPU (sm_89+)")
    from opmux.kernels.ops.gemm import _skinny_launch, skinny_cuda

    if why := skinny_cuda.refusal(
        device="cuda", capability=torch.cuda.get_device_capability(), m=1, k=16, aligned=True
    ):
        pytest.skip(why)
    launches = [(0, 0), *itertools.product(_skinny_launch.TILES, _skinny_launch.K_WARPS)]
    failures = []
    for m, (n, k) in itertools.product((1, 5, 8, 9, 16), ((7748, 4096), (576, 640), (24, 272), (130, 16))):
        a, b, sa, sb = _inputs(m, n, k, "cuda")
        want = reference(a, b, sa, sb, torch.float32)
        for config in launches:
            out = torch.full((m, n), float("nan"), dtype=torch.float32, device="cuda")
            skinny_cuda.launch(out, a, b, sa, sb, config=config)
            err = float((out - want).abs().mean() / want.abs().mean())
            worst = float((out - want).abs().max() / want.abs().max())  # one wrong tail column shows
            if not (err < 1e-3 and worst < 1e-2):  # a NaN (an element never written) fails too
                failures.append(
                    f"M={m} N={n} K={k} launch {config}: mean / max relative error {err:.2e} / {worst:.2e}"
                )
    # strided rows of a and out, M-major a_scale, the half-precision outputs
    m, n, k = 11, 1000, 2048
    a, b, sa, sb = _inputs(m, n, k, "cuda")
    a_wide = torch.zeros(m, k + 64, dtype=a.dtype, device="cuda")
    a_wide[:, :k] = a
    sa_mmajor = sa.t().contiguous().t()
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        want = reference(a, b, sa, sb, dtype).float()
        out_wide = torch.full((m, n + 8), float("nan"), dtype=dtype, device="cuda")
        skinny_cuda.launch(out_wide[:, :n], a_wide[:, :k], b, sa_mmajor, sb, config=(2, 4))
        got = out_wide[:, :n].float()
        err = float((got - want).abs().mean() / want.abs().mean())
        if not err < 1e-3:
            failures.append(f"strided {dtype}: mean relative error {err:.2e}")
        if not bool(out_wide[:, n:].float().isnan().all()):
            failures.append(f"strided {dtype}: wrote past the row's N columns")
    assert not failures, "\n".join(failures)
    with pytest.raises(ValueError, match="tiles in"):
        skinny_cuda.launch(torch.empty(1, 128, device="cuda"), *_inputs(1, 128, 256, "cuda"), config=(3, 1))
    with pytest.raises(ValueError, match="at most 16 rows"):
        skinny_cuda.launch(torch.empty(17, 128, device="cuda"), *_inputs(17, 128, 256, "cuda"), config=(0, 0))
    # the unit's own limits, for direct callers: K in whole 16-byte chunks, 16-byte aligned rows
    with pytest.raises(ValueError, match="multiple of 16"):
        skinny_cuda.launch(torch.empty(1, 128, device="cuda"), *_inputs(1, 128, 3884, "cuda"), config=(0, 0))
    a, b, sa, sb = _inputs(2, 128, 272, "cuda")
    with pytest.raises(ValueError, match="16-byte aligned"):
        skinny_cuda.launch(
            torch.empty(2, 128, device="cuda"), a[:, 8:264], b[:, :256], sa[:, :2], sb[:, :2], config=(0, 0)
        )
