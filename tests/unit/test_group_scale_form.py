"""per_token_group_quant_fp8's scale forms (ops/quantization/op.py ``group_scale_of``): IEEE
``max(amax, eps) / 448`` by default and on the CPU; with ``divide_by_scale`` on CUDA the float32
reciprocal product, vLLM's arithmetic there. The CUDA form is pinned here on the CPU through the
Triton kernel (interpreter) forced to it; the CUDA kernel runs it on the H200 (docs/compat.md)."""

from __future__ import annotations

import pytest
import torch

from opmux.kernels import use_backends
from opmux.kernels.ops import quantization as Q
from opmux.kernels.ops.quantization import triton_kernels
from opmux.kernels.ops.quantization.op import group_scale_of, uses_recip

GS = 32


def _x() -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return torch.rand(16, 8 * GS, generator=g).to(torch.bfloat16)


def _amax(x: torch.Tensor) -> torch.Tensor:
    return x.float().view(x.shape[0], -1, GS).abs().amax(-1).clamp(min=1e-10)


def test_the_two_forms_differ_in_the_last_bit_for_many_groups() -> None:
    m = _amax(_x())
    ieee, recip = group_scale_of(m, 448.0, False), group_scale_of(m, 448.0, True)
    assert torch.equal(ieee, m / torch.tensor(448.0))
    assert torch.equal(recip, m * torch.tensor(1.0 / 448.0))
    differ = int((ieee != recip).sum())
    assert 0 < differ < m.numel()
    assert bool(((ieee - recip).abs() <= torch.finfo(torch.float32).eps * ieee).all())  # one ulp apart


def test_uses_recip_only_for_cuda_tensors_with_divide() -> None:
    x = _x()
    assert not uses_recip(x, True) and not uses_recip(x, False)
    assert not uses_recip(torch.empty(2, 2, device="meta"), True)


@pytest.mark.parametrize("backend", ["jit", "triton", "torch"])
def test_cpu_backends_divide(backend: str) -> None:
    x = _x()
    with use_backends(f"quantization.per_token_group_quant_fp8={backend}"):
        _, s = Q.per_token_group_quant_fp8(x, GS, 1e-10, False, False, False, True)
    assert torch.equal(s, _amax(x) / torch.tensor(448.0))


@pytest.mark.parametrize("ue8m0", [False, True])
def test_triton_kernel_reciprocal_form_is_the_torch_one(ue8m0: bool) -> None:
    x = _x()
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn)
    s = torch.empty(x.shape[0], x.shape[1] // GS)
    triton_kernels.per_token_group_quant(x, q, s, GS, 1e-10, ue8m0, True, recip=True)
    ref = group_scale_of(_amax(x), 448.0, True)
    if ue8m0:  # up to a power of two on the bits
        ref = torch.exp2(torch.ceil(torch.log2(ref)))
    assert torch.equal(s, ref)
    ref_q = (x.float().view(x.shape[0], -1, GS) / ref[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(q.float(), ref_q.view(x.shape).float())
