"""opmux.compat.vllm: vllm._custom_ops' signatures and conventions, on every CPU backend,
against engine-style references written here (what vLLM's kernel tests compare with)."""

from __future__ import annotations

import inspect
import math
from typing import Any

import pytest
import torch

import opmux.compat.vllm as vllm
from opmux.kernels.ops import activation

FP8 = torch.float8_e4m3fn
MIN_SCALE = 1.0 / (448.0 * 512.0)


def _r(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


SIGNATURES = {
    "rms_norm": ["out", "input", "weight", "epsilon"],
    "fused_add_rms_norm": ["input", "residual", "weight", "epsilon"],
    "gemma_rms_norm": ["out", "input", "weight", "epsilon"],
    "gemma_fused_add_rms_norm": ["input", "residual", "weight", "epsilon"],
    "rms_norm_static_fp8_quant": ["out", "input", "weight", "scale", "epsilon"],
    "fused_add_rms_norm_static_fp8_quant": ["out", "input", "residual", "weight", "scale", "epsilon"],
    "silu_and_mul": ["out", "input"],
    "gelu_and_mul": ["out", "input"],
    "gelu_tanh_and_mul": ["out", "input"],
    "rotary_embedding": ["positions", "query", "key", "head_size", "cos_sin_cache", "is_neox"],
    "scaled_fp8_quant": [
        "input", "scale", "num_token_padding", "scale_ub", "use_per_token_if_dynamic", "output", "group_shape",
    ],
    "static_scaled_fp8_quant": ["out", "input", "scale"],
    "dynamic_scaled_fp8_quant": ["out", "input", "scale"],
    "dynamic_per_token_scaled_fp8_quant": ["out", "input", "scales", "scale_ub"],
    "per_token_group_quant_fp8": [
        "x", "group_size", "eps", "dtype", "column_major_scales", "tma_aligned_scales", "out_q", "use_ue8m0",
    ],
    "topk_softmax": ["topk_weights", "topk_ids", "token_expert_indices", "gating_output", "renormalize"],
    "moe_align_block_size": [
        "topk_ids", "num_experts", "block_size", "sorted_token_ids", "experts_ids", "num_tokens_post_pad",
        "expert_map",
    ],
    "reshape_and_cache": [
        "key", "value", "key_cache", "value_cache", "slot_mapping", "kv_cache_dtype", "k_scale", "v_scale",
    ],
    "reshape_and_cache_flash": [
        "key", "value", "key_cache", "value_cache", "slot_mapping", "kv_cache_dtype", "k_scale", "v_scale",
    ],
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signature_starts_with_the_upstream_parameters(name: str) -> None:
    params = list(inspect.signature(getattr(vllm, name)).parameters)
    assert params[: len(SIGNATURES[name])] == SIGNATURES[name]


def test_norms_weight_none_and_out(backend: str) -> None:
    x = _r(3, 32, dtype=torch.float16)
    out = torch.empty_like(x)
    vllm.rms_norm(out, x, None, 1e-5)
    xf = x.float()
    ref = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype)
    torch.testing.assert_close(out, ref, atol=2e-3, rtol=2e-3)
    w = _r(32, seed=1, dtype=torch.float16)
    x2, r2 = x.clone(), _r(3, 32, seed=2, dtype=torch.float16)
    vllm.fused_add_rms_norm(x2, r2, w, 1e-5)
    torch.testing.assert_close(r2, (x.float() + _r(3, 32, seed=2, dtype=torch.float16).float()).half())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gemma_norms_as_vllms_gemma_rmsnorm(backend: str, dtype: torch.dtype) -> None:
    # vLLM's GemmaRMSNorm.forward_native: x * rsqrt(mean(x^2) + eps) * (1 + w), all in fp32
    def ref(t: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        tf = t.float()
        return (tf * torch.rsqrt(tf.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + w.float())).to(dtype)

    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-2, "rtol": 1e-2}
    x = _r(5, 2 * 48, dtype=dtype)[:, :48]  # strided rows, as vLLM's test passes them
    w = _r(48, seed=1, dtype=dtype, scale=0.1)
    out = torch.empty_like(x)
    vllm.gemma_rms_norm(out, x, w, 1e-6)
    torch.testing.assert_close(out, ref(x, w), **tol)
    assert not torch.equal(out, ref(x, torch.zeros_like(w))), "the (1 + w) scale was applied"
    x2, r2 = x.clone(), _r(5, 48, seed=2, dtype=dtype)
    total = (x2.float() + r2.float()).to(dtype)
    vllm.gemma_fused_add_rms_norm(x2, r2, w, 1e-6)
    torch.testing.assert_close(r2, total)
    torch.testing.assert_close(x2, ref(total, w), **tol)
    with pytest.raises(ValueError, match="weight"):
        vllm.gemma_rms_norm(out, x, w[:47], 1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("quant_scale", [0.01, 1.0, 10.0])
def test_rms_norm_static_fp8_quant_is_the_unfused_pair_bit_for_bit(
    backend: str, dtype: torch.dtype, quant_scale: float
) -> None:
    # vLLM's test_fused_rms_norm_quant: strided input rows, a 0-d float32 scale, the fused
    # result against rms_norm + static_scaled_fp8_quant (fused add: x is only read)
    h = 129
    x = _r(7, 2 * h, dtype=dtype, scale=1 / (2 * h))[:, :h]
    w = (1.0 + _r(h, seed=1, scale=0.1)).to(dtype)
    s = torch.tensor(quant_scale, dtype=torch.float32)
    q, want = torch.empty(7, h, dtype=FP8), torch.empty(7, h, dtype=FP8)
    vllm.rms_norm_static_fp8_quant(q, x, w, s, 1e-6)
    y = torch.empty_like(x)
    vllm.rms_norm(y, x, w, 1e-6)
    vllm.static_scaled_fp8_quant(want, y, s)
    assert torch.equal(q.view(torch.uint8), want.view(torch.uint8))
    assert q.float().abs().max() > 0, "not all zero"

    x0, r = x.clone(), _r(7, h, seed=2, dtype=dtype, scale=1 / (2 * h))
    r_fused, x_unfused = r.clone(), x.clone()
    vllm.fused_add_rms_norm_static_fp8_quant(q, x, r_fused, w, s, 1e-6)
    assert torch.equal(x, x0), "input is only read"
    vllm.fused_add_rms_norm(x_unfused, r, w, 1e-6)
    vllm.static_scaled_fp8_quant(want, x_unfused.contiguous(), s)
    assert torch.equal(r_fused, r), "residual = input + residual, in place"
    assert torch.equal(q.view(torch.uint8), want.view(torch.uint8))


def test_rms_norm_static_fp8_quant_contract(backend: str) -> None:
    x, w, s = _r(4, 16), torch.ones(16), torch.tensor(0.5)
    q = torch.empty(4, 16, dtype=FP8)
    with pytest.raises(ValueError, match="scale has shape"):
        vllm.rms_norm_static_fp8_quant(q, x, w, torch.ones(2), 1e-6)
    with pytest.raises(TypeError, match="scale has dtype"):
        vllm.rms_norm_static_fp8_quant(q, x, w, s.half(), 1e-6)
    with pytest.raises(TypeError, match="out has dtype"):
        vllm.rms_norm_static_fp8_quant(torch.empty(4, 16), x, w, s, 1e-6)
    x[1, 3] = float("nan")  # NaN propagates: the row's fp8 values are NaN
    vllm.fused_add_rms_norm_static_fp8_quant(q, x, torch.zeros(4, 16), w, s, 1e-6)
    assert q[1].float().isnan().all() and not q[[0, 2, 3]].float().isnan().any()


def _act(name: str, t: torch.Tensor) -> torch.Tensor:
    F = torch.nn.functional
    if name == "silu_and_mul":
        return F.silu(t)
    return F.gelu(t, approximate="tanh" if "tanh" in name else "none")


@pytest.mark.parametrize("name", ["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_activations_on_the_cpu_are_vllms_forward_native(name: str, dtype: torch.dtype) -> None:
    """vLLM's CPU platform runs these layers' forward_native (torch's CPU math on the strided
    half, the product in the input dtype) and its test compares with it at atol=0: the compat
    entry on CPU tensors is that expression, bit for bit, written into the caller's buffer."""
    x = _r(83, 2 * 512, dtype=dtype, scale=2.0)
    out = torch.full((83, 512), float("nan"), dtype=dtype)
    ptr = out.data_ptr()
    getattr(vllm, name)(out, x)
    assert out.data_ptr() == ptr
    assert torch.equal(out, _act(name, x[:, :512]) * x[:, 512:])
    with pytest.raises(ValueError, match="out has shape"):
        getattr(vllm, name)(torch.empty(83, 1024, dtype=dtype), x)
    with pytest.raises(ValueError, match="last dim must be even"):
        getattr(vllm, name)(out, x[:, :5])


@pytest.mark.parametrize("name", ["silu_and_mul", "mul_and_silu", "gelu_and_mul", "gelu_tanh_and_mul"])
def test_activations_on_the_cpu_keep_the_ops_contract(name: str) -> None:
    """The CPU form runs the op's whole contract first: the same errors as the op itself."""
    x = _r(4, 16)
    compat, op = getattr(vllm, name), getattr(activation, name)
    for call in (lambda o, t: compat(o, t), lambda o, t: op(t, True, o)):
        with pytest.raises(ValueError, match="out and x overlap in memory"):
            call(x[:, :8], x)
        with pytest.raises(ValueError, match="out and x overlap in memory"):
            call(x[:, 4:12], x)
        with pytest.raises(ValueError, match="x requires grad"):
            call(torch.empty(4, 8), x.clone().requires_grad_())
        with pytest.raises(TypeError, match=r"expected a torch\.Tensor"):
            call(torch.empty(4, 8), [1.0, 2.0])
    with torch.inference_mode():
        out = torch.empty(4, 8)  # an inference tensor, written outside inference mode
    compat(out, x)
    ref = torch.empty(4, 8)
    compat(ref, x)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("name", ["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_vllm_rounding_mode_rounds_like_vllms_kernel(backend: str, name: str, dtype: torch.dtype) -> None:
    """The ops' vllm_rounding kernel mode (what the compat entries run on CUDA, where vLLM's
    kernels and torch's CUDA math are the same libdevice expressions: bit-equal on the H200)."""
    x = _r(64, 2 * 64, dtype=dtype, scale=2.0)
    out = getattr(activation, name)(x, True)
    # vLLM: act in fp32, rounded to the input dtype, then a product in the input dtype (the
    # fp32 product of two half values is exact, so one rounding of it is that product)
    a = _act(name, x[:, :64].float()).to(dtype).float()
    ref = (a.double() * x[:, 64:].double()).to(dtype)
    if dtype == torch.float32:  # nothing to round twice
        torch.testing.assert_close(out, _act(name, x[:, :64]) * x[:, 64:], atol=1e-5, rtol=1e-5)
        return
    if backend == "torch" or (name == "silu_and_mul" and backend != "triton"):
        assert torch.equal(out, ref)
    else:  # on the CPU: libm erff / tanhf (vLLM's functions; the Triton interpreter's exp and
        # truncating bf16 conversions) vs torch's CPU vector code in the reference: an activation
        # may round to the neighbouring value, and vLLM's 1 + erf(x) cancels in the gelu tail
        ulp = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-10
        ulps = 2 if backend == "triton" else 1  # the interpreter truncates twice
        torch.testing.assert_close(out, ref, atol=2.0**-12, rtol=ulps * ulp)
    native = getattr(activation, name)(x, backend="reference")  # opmux's convention rounds once
    assert not torch.equal(native, out), "the two conventions should differ somewhere on 4096 values"


def test_rotary_embedding_key_none(backend: str) -> None:
    pos = torch.tensor([2, 0, 1])
    cache = _r(4, 16, seed=1)
    q = _r(3, 2, 16, seed=2)
    q_both, k = q.clone(), _r(3, 1, 16, seed=3)
    vllm.rotary_embedding(pos, q_both, k, 16, cache, True)
    vllm.rotary_embedding(pos, q, None, 16, cache, True)
    assert torch.equal(q, q_both)
    with pytest.raises(NotImplementedError, match="rope_dim_offset"):
        vllm.rotary_embedding(pos, q, None, 16, cache, True, rope_dim_offset=8)


def test_scaled_fp8_quant_per_token_divides_bit_for_bit(backend: str) -> None:
    x = _r(6, 64, dtype=torch.bfloat16, scale=4.0)
    x[3] = 0
    q, s = vllm.scaled_fp8_quant(x, use_per_token_if_dynamic=True)
    amax = x.float().abs().amax(-1, keepdim=True)
    ref_s = torch.clamp(amax / 448.0, min=MIN_SCALE)
    assert torch.equal(s, ref_s)
    assert torch.equal(q.float(), (x.float() / ref_s).clamp(-448, 448).to(FP8).float())
    ub = torch.tensor(0.5)  # 0-dim scale_ub, as vLLM passes it
    _, s2 = vllm.scaled_fp8_quant(x, scale_ub=ub, use_per_token_if_dynamic=True)
    assert torch.equal(s2, torch.clamp(torch.minimum(amax, ub) / 448.0, min=MIN_SCALE))
    out = torch.empty(6, 64, dtype=FP8)
    q3, _ = vllm.scaled_fp8_quant(x, use_per_token_if_dynamic=True, output=out)
    assert q3 is out and torch.equal(out.float(), q.float())


def test_dynamic_per_token_quant_divides_in_the_kernel_into_padded_buffers(backend: str) -> None:
    """vLLM's division (not x * (1 / s)) bit for bit on many values, written by the kernel into the
    first T rows of padded buffers (no copy: the other rows keep their bytes)."""
    x = _r(40, 512, dtype=torch.float32, scale=3.0, seed=7)
    # a row where x / s and x * (1 / s) land on different sides of an e4m3 midpoint (1.1875 * s)
    x[0, :3] = torch.tensor([3.4388844966888428, 0.009115345776081085, 0.01823069155216217])
    x[0, 3:] = 0
    out = torch.full((48, 512), 1.0, dtype=torch.float32).to(FP8)
    scales = torch.full((48, 1), -1.0)
    ptrs = (out.data_ptr(), scales.data_ptr())
    vllm.dynamic_per_token_scaled_fp8_quant(out, x, scales)
    assert (out.data_ptr(), scales.data_ptr()) == ptrs
    ref_s = torch.clamp(x.abs().amax(-1, keepdim=True) / 448.0, min=MIN_SCALE)
    assert torch.equal(scales[:40], ref_s) and bool((scales[40:] == -1).all())
    assert torch.equal(out[:40].float(), (x / ref_s).clamp(-448, 448).to(FP8).float())
    assert bool((out[40:].float() == 1).all())
    mul = (x * ref_s.reciprocal()).clamp(-448, 448).to(FP8).float()
    assert out[0, 1].float() == 1.125 and mul[0, 1] == 1.25  # the conventions differ here: vLLM's kept


def test_static_and_dynamic_per_tensor_quant_write_the_callers_buffers(backend: str) -> None:
    x = _r(6, 96, dtype=torch.bfloat16, scale=2.0, seed=8)
    out, scale = torch.empty(6, 96, dtype=FP8), torch.empty(1)
    vllm.dynamic_scaled_fp8_quant(out, x, scale)
    ref = x.float().abs().amax() / 448.0
    assert torch.equal(scale, ref.view(1))
    assert torch.equal(out.float(), (x.float() * (1.0 / ref)).clamp(-448, 448).to(FP8).float())
    static = torch.tensor([0.01])
    vllm.static_scaled_fp8_quant(out, x, static)
    assert static.item() == pytest.approx(0.01)
    assert torch.equal(out.float(), (x.float() * (1.0 / static)).clamp(-448, 448).to(FP8).float())


def test_scaled_fp8_quant_per_tensor_static_and_padding(backend: str) -> None:
    x = _r(5, 32, dtype=torch.float16, scale=3.0)
    q, s = vllm.scaled_fp8_quant(x)
    ref_s = x.float().abs().amax() / 448.0
    assert torch.equal(s, ref_s.view(1))
    assert torch.equal(q.float(), (x.float() * (1.0 / ref_s)).clamp(-448, 448).to(FP8).float())
    static = torch.tensor([0.02])
    q, s = vllm.scaled_fp8_quant(x, static)
    assert s is static
    assert torch.equal(q.float(), (x.float() * (1.0 / static)).clamp(-448, 448).to(FP8).float())
    q, s = vllm.scaled_fp8_quant(x, num_token_padding=8, use_per_token_if_dynamic=True)
    assert q.shape == (8, 32) and s.shape == (8, 1)
    ref = torch.clamp(x.float().abs().amax(-1, keepdim=True) / 448.0, min=MIN_SCALE)
    assert torch.equal(s[:5], ref)


@pytest.mark.parametrize("layout", ["row-major", "column-major", "tma-aligned"])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_per_token_group_quant_fp8(backend: str, layout: str, ue8m0: bool) -> None:
    t, h, gs = 5, 512, 32
    x = _r(t, h, dtype=torch.bfloat16, scale=2.0)
    out_q = torch.empty(t, h, dtype=FP8)
    column_major, tma = layout != "row-major", layout == "tma-aligned"
    q, s = vllm.per_token_group_quant_fp8(
        x, gs, column_major_scales=column_major, tma_aligned_scales=tma, out_q=out_q, use_ue8m0=ue8m0
    )
    assert q is out_q
    # vLLM's scale on the CPU: amax / 448 (IEEE); on CUDA amax * fp32(1 / 448) (group_scale_of)
    amax = x.float().view(t, h // gs, gs).abs().amax(-1).clamp(min=1e-10)
    ref_s = amax / torch.tensor(448.0)
    assert not torch.equal(ref_s, amax * torch.tensor(1.0 / 448.0))  # the two forms differ here
    if ue8m0:
        ref_s = torch.exp2(torch.ceil(torch.log2(ref_s)))
    assert torch.equal(s, ref_s)
    assert (s.stride(0) == 1) == column_major
    if column_major:  # vLLM / DeepGEMM: the token stride rounded up to 4 floats (16 bytes) when TMA-aligned
        assert s.stride(1) == (8 if tma else 5)
    ref_q = (x.float().view(t, h // gs, gs) / ref_s[..., None]).clamp(-448, 448).to(FP8).view(t, h)
    assert torch.equal(q.float(), ref_q.float())


@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
def test_topk_softmax_token_expert_indices(backend: str, ids_dtype: torch.dtype) -> None:
    t, e, k = 5, 8, 2
    g = _r(t, e, seed=4)
    w, ids = torch.empty(t, k), torch.empty(t, k, dtype=ids_dtype)
    tei = torch.empty(t, k, dtype=torch.int32)
    vllm.topk_softmax(w, ids, tei, g, False)
    ref_w, ref_ids = torch.topk(torch.softmax(g, -1), k, -1)
    assert torch.equal(ids.long(), ref_ids)
    torch.testing.assert_close(w, ref_w)
    assert tei.tolist() == [[j * t + i for j in range(k)] for i in range(t)]


def test_moe_align_block_size_zero_fill_and_expert_map(backend: str) -> None:
    e, bs = 4, 4
    ids = torch.tensor([[0, 3], [3, 1], [1, 3]], dtype=torch.int32)
    n_sorted = ids.numel() + e * (bs - 1)
    n_blocks = math.ceil(n_sorted / bs)
    sorted_ids = torch.empty(n_sorted, dtype=torch.int32)
    experts = torch.empty(n_blocks, dtype=torch.int32)
    post = torch.empty(1, dtype=torch.int32)
    vllm.moe_align_block_size(ids, e, bs, sorted_ids, experts, post)
    pad = ids.numel()
    assert post.tolist() == [12]
    assert sorted_ids.tolist() == [0, pad, pad, pad, 3, 4, pad, pad, 1, 2, 5, pad] + [pad] * (n_sorted - 12)
    assert experts.tolist() == [0, 1, 3] + [0] * (n_blocks - 3)  # unused blocks: 0, not -1
    expert_map = torch.tensor([-1, 0, -1, 1], dtype=torch.int32)  # this rank owns experts 1 and 3
    vllm.moe_align_block_size(ids, e, bs, sorted_ids, experts, post, expert_map)
    # mapped in the kernel: expert 0's entry is left out, 1 and 3 are local experts 0 and 1
    assert post.tolist() == [8]
    assert sorted_ids.tolist() == [3, 4, pad, pad, 1, 2, 5, pad] + [pad] * (n_sorted - 8)
    assert experts.tolist() == [0, 1] + [0] * (n_blocks - 2)


def test_topk_softmax_e_score_correction_bias(backend: str) -> None:
    """DeepSeek's routing: experts chosen by softmax + bias, weighted by the softmax."""
    t, e, k = 6, 16, 4
    g = _r(t, e, seed=8)
    bias = torch.linspace(0.2, -0.2, e)
    w, ids = torch.empty(t, k), torch.empty(t, k, dtype=torch.int64)
    tei = torch.empty(t, k, dtype=torch.int32)
    vllm.topk_softmax(w, ids, tei, g, True, bias)
    p = torch.softmax(g, -1)
    ref_ids = torch.topk(p + bias, k, -1).indices
    ref_w = p.gather(-1, ref_ids)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(w, ref_w / ref_w.sum(-1, keepdim=True))


def _nhd_ref(key: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    ref = cache.clone()
    bs = cache.shape[1]
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            ref[s // bs, s % bs] = key[t]
    return ref


def test_reshape_and_cache_flash_auto_hnd_and_fp8(backend: str) -> None:
    t, h, d, nb, bs = 3, 2, 8, 2, 4
    key, value = _r(t, h, d, seed=1, dtype=torch.float16), _r(t, h, d, seed=2, dtype=torch.float16)
    slots = torch.tensor([5, -1, 0])
    kc, vc = torch.zeros(nb, bs, h, d, dtype=torch.float16), torch.zeros(nb, bs, h, d, dtype=torch.float16)
    one = torch.tensor(1.0)
    vllm.reshape_and_cache_flash(key, value, kc, vc, slots, "auto", one, one)
    assert torch.equal(kc, _nhd_ref(key, torch.zeros_like(kc), slots))
    assert torch.equal(vc, _nhd_ref(value, torch.zeros_like(vc), slots))
    # HND: the cache is [nb, H, bs, D] in memory, passed as its [nb, bs, H, D] view
    hnd_k = torch.zeros(nb, h, bs, d, dtype=torch.float16).transpose(1, 2)
    hnd_v = torch.zeros(nb, h, bs, d, dtype=torch.float16).transpose(1, 2)
    vllm.reshape_and_cache_flash(key, value, hnd_k, hnd_v, slots, "auto", one, one)
    assert torch.equal(hnd_k, kc) and torch.equal(hnd_v, vc)
    # fp8 cache (uint8 storage, vLLM's convention) with scales: entries are fp8(x / scale)
    k8, v8 = torch.zeros(nb, bs, h, d, dtype=torch.uint8), torch.zeros(nb, bs, h, d, dtype=torch.uint8)
    ks, vs = torch.tensor(0.5), torch.tensor(2.0)
    vllm.reshape_and_cache_flash(key, value, k8, v8, slots, "fp8", ks, vs)
    got = k8.view(FP8).float()[5 // bs, 5 % bs]
    assert torch.equal(got, (key[0].float() / 0.5).to(FP8).float())
    assert torch.equal(v8.view(FP8).float()[0, 0], (value[2].float() / 2.0).to(FP8).float())


def test_reshape_and_cache_paged_layout(backend: str) -> None:
    t, h, d, nb, bs, x = 3, 2, 8, 2, 4, 4
    key, value = _r(t, h, d, seed=1), _r(t, h, d, seed=2)
    slots = torch.tensor([6, 1, -1])
    kc = torch.zeros(nb, h, d // x, bs, x)
    vc = torch.zeros(nb, h, d, bs)
    one = torch.tensor(1.0)
    vllm.reshape_and_cache(key, value, kc, vc, slots, "auto", one, one)
    for i, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        b, o = s // bs, s % bs
        for hh in range(h):
            for dd in range(d):
                assert kc[b, hh, dd // x, o, dd % x] == key[i, hh, dd]
                assert vc[b, hh, dd, o] == value[i, hh, dd]
    assert int((kc != 0).sum()) == 2 * h * d
    # an fp8 paged cache (x = 16 one-byte entries): fp8(x / scale)
    k8, v8 = (
        torch.zeros(nb, h, d // 16 or 1, bs, 16 if d >= 16 else d, dtype=torch.uint8),
        torch.zeros(nb, h, d, bs, dtype=torch.uint8),
    )
    ks = torch.tensor(0.25)
    vllm.reshape_and_cache(key, value, k8, v8, slots, "fp8", ks, ks)
    got = k8.view(FP8).float().permute(0, 3, 1, 2, 4).reshape(nb, bs, h, d)[6 // bs, 6 % bs]
    assert torch.equal(got, (key[0].float() / 0.25).to(FP8).float())
    assert torch.equal(v8.view(FP8).float()[0, :, :, 1], (value[1].float() / 0.25).to(FP8).float())


@pytest.mark.parametrize(
    ("group_shape", "scale_shape"),
    [(None, (1,)), ((1, -1), (16,)), ((-1, 1), (64,)), ((1, 32), (16, 2)), ((4, 16), (4, 4)), ((-1, -1), ())],
)
def test_static_scaled_fp8_quant_group_shapes(
    backend: str, group_shape: Any, scale_shape: tuple[int, ...]
) -> None:
    """vLLM's static quant with per-tensor, per-token, per-channel and 2-D block scales: the
    opmux kernel writes ``out``, ``x * (1 / scale)`` per block, as vLLM's kernel."""
    t, h = 16, 64
    x = _r(t, h, dtype=torch.bfloat16, scale=2.0, seed=9)
    scale = torch.rand(scale_shape, generator=torch.Generator().manual_seed(3)) * 0.02 + 0.002
    q, s = vllm.scaled_fp8_quant(x, scale=scale, group_shape=group_shape)
    assert s is scale
    if scale.dim() == 1 and scale.numel() > 1:
        s2 = scale.view(1, -1) if group_shape[0] == -1 else scale.view(-1, 1)
    else:
        s2 = scale.reshape(1, 1) if scale.numel() == 1 else scale
    full = s2.repeat_interleave(t // s2.shape[0], 0).repeat_interleave(h // s2.shape[1], 1)
    assert torch.equal(q.float(), (x.float() * full.reciprocal()).clamp(-448, 448).to(FP8).float())
    out = torch.empty(t, h, dtype=FP8)
    vllm.static_scaled_fp8_quant(out, x, scale, group_shape)
    assert torch.equal(out.float(), q.float())
