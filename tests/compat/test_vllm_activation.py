"""opmux.compat.vllm's other activations (mul_and_silu, fatrelu_and_mul, swigluoai_and_mul,
swiglustep_and_mul_triton, gelu_new / gelu_fast / gelu_quick) on every CPU backend, against
vLLM's ``forward_native`` formulas written here (what its test_activation.py compares with)."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

import opmux.compat.vllm as vllm

F = torch.nn.functional
HALF = (torch.float16, torch.bfloat16)

SIGNATURES = {
    "mul_and_silu": ["out", "input"],
    "fatrelu_and_mul": ["out", "input", "threshold"],
    "swigluoai_and_mul": ["out", "input", "alpha", "limit"],
    "swiglustep_and_mul_triton": ["output", "input", "limit"],
    "gelu_new": ["out", "input"],
    "gelu_fast": ["out", "input"],
    "gelu_quick": ["out", "input"],
}


def _x(*shape: int, dtype: torch.dtype, scale: float = 1.0, seed: int = 0) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


# vLLM's forward_native (vllm/model_executor/layers/activation.py), in the input dtype
def _mul_and_silu(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return x[..., :d] * F.silu(x[..., d:])


def _fatrelu(x: torch.Tensor, t: float) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.threshold(x[..., :d], t, 0.0) * x[..., d:]


def _swigluoai(x: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    gate, up = x[..., ::2].clamp(max=limit), x[..., 1::2].clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def _swiglustep(x: torch.Tensor, limit: float) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]).clamp(max=limit) * x[..., d:].clamp(min=-limit, max=limit)


def _gelu_new(x: torch.Tensor) -> torch.Tensor:
    c = math.sqrt(2.0 / math.pi)
    return 0.5 * x * (1.0 + torch.tanh(c * (x + 0.044715 * torch.pow(x, 3.0))))


def _gelu_fast(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def _gelu_quick(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


# vLLM's tests/kernels/allclose_default.py
ATOL = {torch.float16: 1e-3, torch.bfloat16: 1e-3, torch.float32: 1e-5}
RTOL = {torch.float16: 1e-3, torch.bfloat16: 1.6e-2, torch.float32: 1.3e-6}


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signature_is_vllms(name: str) -> None:
    assert list(inspect.signature(getattr(vllm, name)).parameters) == SIGNATURES[name]
    assert name in vllm.__all__


@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
def test_fatrelu_is_bit_equal(backend: str, dtype: torch.dtype) -> None:
    x = _x(83, 2 * 96, dtype=dtype)
    out = torch.full((83, 96), float("nan"), dtype=dtype)
    vllm.fatrelu_and_mul(out, x, 0.37)
    # exact, but Triton's CPU interpreter truncates bf16 conversions (one ulp)
    rtol = 2.0**-7 if backend == "triton" and dtype == torch.bfloat16 else 0.0
    torch.testing.assert_close(out, _fatrelu(x, 0.37), atol=0.0, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
def test_mul_and_silu_on_the_cpu_is_vllms_forward_native(dtype: torch.dtype) -> None:
    """vLLM's CPU platform runs MulAndSilu.forward_native: the compat entry on CPU tensors is that
    expression, bit for bit, in the caller's buffer."""
    x = _x(83, 2 * 512, dtype=dtype, scale=2.0)
    out = torch.full((83, 512), float("nan"), dtype=dtype)
    vllm.mul_and_silu(out, x)
    assert torch.equal(out, _mul_and_silu(x))


@pytest.mark.parametrize("dtype", HALF)
def test_mul_and_silu_mode_rounds_as_vllm(backend: str, dtype: torch.dtype) -> None:
    """The op's vllm_rounding mode (the compat entry on CUDA): silu rounded to the dtype, then the
    product in the dtype, vLLM's kernel, bit for bit where the float32 silu rounds to the same
    half value (every element here; Triton's exp and division are not IEEE, so it is held to
    one ulp). opmux's own mode (one rounding) is not."""
    from opmux.kernels.ops import activation

    x = _x(83, 2 * 512, dtype=dtype, scale=2.0)
    out = activation.mul_and_silu(x, True)
    ref = _mul_and_silu(x)
    if backend == "triton":
        torch.testing.assert_close(out, ref, atol=ATOL[dtype], rtol=RTOL[dtype])
    else:
        torch.testing.assert_close(out, ref, atol=0.0, rtol=0.0)
    assert not torch.equal(activation.mul_and_silu(x), ref)  # one rounding differs somewhere


def test_mul_and_silu_mode_float32(backend: str) -> None:
    from opmux.kernels.ops import activation

    x = _x(7, 2 * 512, dtype=torch.float32, scale=2.0)
    torch.testing.assert_close(activation.mul_and_silu(x, True), _mul_and_silu(x), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
def test_swiglu_forms(backend: str, dtype: torch.dtype) -> None:
    rtol = {torch.float16: 2e-3, torch.bfloat16: 2e-2, torch.float32: 1.3e-6}[dtype]  # vLLM's test
    x = _x(7, 2 * 512, dtype=dtype, scale=4.0)  # past both clamps (limit 7)
    out = torch.empty((7, 512), dtype=dtype)
    vllm.swigluoai_and_mul(out, x, 1.702, 7.0)
    torch.testing.assert_close(out, _swigluoai(x, 1.702, 7.0), atol=ATOL[dtype], rtol=rtol)
    vllm.swigluoai_and_mul(out, x)  # vLLM's defaults
    torch.testing.assert_close(out, _swigluoai(x, 1.702, 7.0), atol=ATOL[dtype], rtol=rtol)
    out2 = torch.empty((7, 512), dtype=dtype)
    vllm.swiglustep_and_mul_triton(out2, x, 2.5)
    torch.testing.assert_close(out2, _swiglustep(x, 2.5), atol=ATOL[dtype], rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
@pytest.mark.parametrize("name", ["gelu_new", "gelu_fast", "gelu_quick"])
def test_elementwise_gelus(backend: str, name: str, dtype: torch.dtype) -> None:
    if backend == "triton" and dtype == torch.bfloat16 and name != "gelu_quick":
        pytest.skip("vLLM's bf16 rounding steps: Triton's CPU interpreter truncates bf16 conversions")
    x = _x(83, 512, dtype=dtype, scale=2.0)
    out = torch.empty_like(x)
    getattr(vllm, name)(out, x)
    ref = {"gelu_new": _gelu_new, "gelu_fast": _gelu_fast, "gelu_quick": _gelu_quick}[name](x)
    torch.testing.assert_close(out, ref, atol=ATOL[dtype], rtol=RTOL[dtype])


@pytest.mark.parametrize("name", ["gelu_new", "gelu_fast"])
def test_bf16_tanh_gelus_need_vllms_rounding(name: str) -> None:
    """vLLM's reference rounds each step in bf16 (1 + tanh cancels for negative x): opmux's
    fp32 form, rounded once, is further from it than the test's tolerance; the vLLM mode is not."""
    from opmux.kernels.ops import activation

    x = _x(83, 512, dtype=torch.bfloat16, scale=2.0)
    ref = {"gelu_new": _gelu_new, "gelu_fast": _gelu_fast}[name](x)
    op = getattr(activation, name)
    torch.testing.assert_close(op(x, True), ref, atol=1e-3, rtol=1.6e-2)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(op(x), ref, atol=1e-3, rtol=1.6e-2)


def test_bad_arguments_name_themselves() -> None:
    x = torch.randn(4, 16)
    out = torch.empty(4, 8)
    with pytest.raises(ValueError, match="threshold"):
        vllm.fatrelu_and_mul(out, x, float("nan"))
    with pytest.raises(ValueError, match="limit"):
        vllm.swigluoai_and_mul(out, x, 1.702, -1.0)
    with pytest.raises(ValueError, match="out has shape"):
        vllm.mul_and_silu(torch.empty(4, 16), x)
    with pytest.raises(ValueError, match="out has shape"):
        vllm.gelu_new(out, x)


@pytest.mark.parametrize("is_neox", [True, False])
def test_rotary_embedding_bf16_rounds_as_vllm(backend: str, is_neox: bool) -> None:
    """vLLM's rotary_embedding computes in the input dtype (cos / sin, each product, each sum
    rounded): the compat entry selects the op's vllm_rounding mode, bit-equal to vLLM's
    reference in bf16."""
    if backend == "triton":
        pytest.skip("the mode is its bf16 roundings: Triton's CPU interpreter truncates bf16 conversions")
    t, heads, hs = 9, 4, 64
    pos = torch.randint(0, 32, (t,), generator=torch.Generator().manual_seed(3))
    cache = _x(32, hs, dtype=torch.float32, seed=4)  # [cos | sin] rows (any values do)
    q, k = _x(t, heads * hs, dtype=torch.bfloat16, seed=5), _x(t, heads * hs, dtype=torch.bfloat16, seed=6)

    def ref(x: torch.Tensor) -> torch.Tensor:  # vLLM's forward_native (apply_rotary_emb_torch)
        cos, sin = cache[pos].chunk(2, dim=-1)
        cos, sin = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)
        v = x.view(t, heads, hs)
        x1, x2 = v.chunk(2, dim=-1) if is_neox else (v[..., ::2], v[..., 1::2])
        o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
        return (torch.cat((o1, o2), -1) if is_neox else torch.stack((o1, o2), -1).flatten(-2)).view(t, -1)

    q2, k2 = q.clone(), k.clone()
    vllm.rotary_embedding(pos, q2, k2, hs, cache, is_neox)
    torch.testing.assert_close(q2, ref(q), atol=0.0, rtol=0.0)
    torch.testing.assert_close(k2, ref(k), atol=0.0, rtol=0.0)
    from opmux.kernels.ops import rope

    q3, k3 = q.clone(), k.clone()
    rope.rotary_embedding(pos, q3, k3, hs, cache, is_neox)  # opmux's own mode: fp32, one rounding
    assert not torch.equal(q3, ref(q))
