"""opmux.compat.sgl_kernel: sgl_kernel's signatures and conventions, on every CPU backend,
against engine-style references written here (what sgl-kernel's own tests compare with)."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

import opmux.compat.sgl_kernel as sgl

FP8 = torch.float8_e4m3fn


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _r(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=_g(seed)) * scale).to(dtype)


# the upstream signatures (sgl-kernel/python/sgl_kernel/{elementwise,gemm,moe}.py)
SIGNATURES = {
    "rmsnorm": ["input", "weight", "eps", "out", "enable_pdl"],
    "fused_add_rmsnorm": ["input", "residual", "weight", "eps", "enable_pdl"],
    "gemma_rmsnorm": ["input", "weight", "eps", "out", "enable_pdl"],
    "gemma_fused_add_rmsnorm": ["input", "residual", "weight", "eps", "enable_pdl"],
    "silu_and_mul": ["input", "out"],
    "gelu_and_mul": ["input", "out"],
    "gelu_tanh_and_mul": ["input", "out"],
    "rotary_embedding": ["positions", "query", "key", "head_size", "cos_sin_cache", "is_neox"],
    "apply_rope_with_cos_sin_cache_inplace": [
        "positions", "query", "key", "head_size", "cos_sin_cache", "is_neox", "fused_set_kv_buffer_arg", "enable_pdl",
    ],
    "sgl_per_token_quant_fp8": ["input", "output_q", "output_s"],
    "sgl_per_token_group_quant_fp8": ["input", "output_q", "output_s", "group_size", "eps", "fp8_min", "fp8_max"],
    "sgl_per_token_group_quant_int8": ["input", "output_q", "output_s", "group_size", "eps", "int8_min", "int8_max"],
    "sgl_per_tensor_quant_fp8": ["input", "output_q", "output_s", "is_static"],
    "sgl_per_token_group_quant_8bit": [
        "input", "output_q", "output_s", "group_size", "eps", "fp8_min", "fp8_max", "scale_ue8m0",
        "fuse_silu_and_mul", "masked_m", "enable_v2",
    ],
    "topk_softmax": ["topk_weights", "topk_ids", "gating_output", "renormalize"],
    "topk_sigmoid": [
        "topk_weights", "topk_ids", "gating_output", "renormalize", "correction_bias", "routed_scaling_factor",
        "num_fused_shared_experts",
    ],
    "moe_align_block_size": [
        "topk_ids", "num_experts", "block_size", "sorted_token_ids", "experts_ids", "num_tokens_post_pad",
        "cumsum_buffer", "pad_sorted_token_ids",
    ],
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signature_starts_with_the_upstream_parameters(name: str) -> None:
    params = list(inspect.signature(getattr(sgl, name)).parameters)
    assert params[: len(SIGNATURES[name])] == SIGNATURES[name]


def _ref_rms(x: torch.Tensor, w: torch.Tensor, eps: float, gemma: bool = False) -> torch.Tensor:
    xf = x.float()
    wf = w.float() + 1.0 if gemma else w.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * wf).to(x.dtype)


@pytest.mark.parametrize("gemma", [False, True])
def test_norms_write_the_callers_buffers(backend: str, gemma: bool) -> None:
    x, w = _r(3, 64, dtype=torch.bfloat16), _r(64, seed=1, dtype=torch.bfloat16)
    out = torch.empty_like(x)
    fn = sgl.gemma_rmsnorm if gemma else sgl.rmsnorm
    assert fn(x, w, 1e-6, out=out, enable_pdl=True) is out
    torch.testing.assert_close(out, _ref_rms(x, w, 1e-6, gemma), atol=2e-2, rtol=2e-2)
    r = _r(3, 64, seed=2, dtype=torch.bfloat16)
    x2, r2 = x.clone(), r.clone()
    (sgl.gemma_fused_add_rmsnorm if gemma else sgl.fused_add_rmsnorm)(x2, r2, w, 1e-6, enable_pdl=False)
    residual = (x.float() + r.float()).to(torch.bfloat16)
    # exact, but Triton's CPU interpreter truncates bf16 conversions (one ulp)
    torch.testing.assert_close(r2, residual, atol=0, rtol=2.0**-7 if backend == "triton" else 0)
    torch.testing.assert_close(x2, _ref_rms(residual, w, 1e-6, gemma), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(
    ("name", "act"),
    [
        ("silu_and_mul", torch.nn.functional.silu),
        ("gelu_and_mul", lambda t: torch.nn.functional.gelu(t, approximate="none")),
        ("gelu_tanh_and_mul", lambda t: torch.nn.functional.gelu(t, approximate="tanh")),
    ],
)
def test_activations(backend: str, name: str, act: object) -> None:
    fn = getattr(sgl, name)
    x = _r(2, 3, 64, dtype=torch.float16)
    out = torch.empty(2, 3, 32, dtype=torch.float16)
    assert fn(x, out) is out
    ref = (act(x[..., :32].float()) * x[..., 32:].float()).to(x.dtype)  # type: ignore[operator]
    torch.testing.assert_close(out, ref, atol=2e-3, rtol=2e-3)
    assert fn(x).shape == (2, 3, 32)
    with pytest.raises(ValueError, match="multiple of 16 bytes"):  # sgl_kernel's precondition
        fn(_r(2, 6, dtype=torch.float16))
    with pytest.raises(AssertionError):
        fn(x, torch.empty(2, 3, 31, dtype=torch.float16))


def _ref_rope(pos: torch.Tensor, x: torch.Tensor, cache: torch.Tensor, head: int, neox: bool) -> torch.Tensor:
    t = x.shape[0]
    xv = x.view(t, -1, head).float()
    cos, sin = cache[pos].float().chunk(2, -1)
    cos, sin = cos[:, None], sin[:, None]
    rot = cache.shape[1]
    r = xv[..., :rot]
    if neox:
        a, b = r.chunk(2, -1)
        y = torch.cat((a * cos - b * sin, b * cos + a * sin), -1)
    else:
        a, b = r[..., 0::2], r[..., 1::2]
        y = torch.stack((a * cos - b * sin, b * cos + a * sin), -1).flatten(-2)
    return torch.cat((y, xv[..., rot:]), -1).to(x.dtype).view_as(x)


@pytest.mark.parametrize("neox", [True, False])
def test_rotary_embedding_with_and_without_key(backend: str, neox: bool) -> None:
    head, rot = 16, 8
    pos = torch.tensor([3, 0, 7, 1])
    cache = _r(8, rot, seed=3)
    q, k = _r(4, 2 * head, seed=4), _r(4, head, seed=5)
    q0, k0 = q.clone(), k.clone()
    sgl.rotary_embedding(pos, q, k, head, cache, neox)
    torch.testing.assert_close(q, _ref_rope(pos, q0, cache, head, neox), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k, _ref_rope(pos, k0, cache, head, neox), atol=1e-5, rtol=1e-5)
    q1 = q0.clone()
    sgl.rotary_embedding(pos, q1, None, head, cache, neox)  # key=None: only the query rotates
    torch.testing.assert_close(q1, q)


def test_apply_rope_with_fused_kv_write(backend: str) -> None:
    head = 16
    pos = torch.tensor([1, 2, 0])
    cache = _r(4, head, seed=6)
    q, k, v = _r(3, 2 * head, seed=7), _r(3, head, seed=8), _r(3, head, seed=9)
    q0, k0 = q.clone(), k.clone()
    kbuf, vbuf = torch.zeros(6, head), torch.zeros(6, head)
    loc = torch.tensor([5, 0, 3])
    arg = sgl.FusedSetKVBufferArg(v, kbuf, vbuf, None, None, loc)
    sgl.apply_rope_with_cos_sin_cache_inplace(pos, q, k, head, cache, True, fused_set_kv_buffer_arg=arg)
    torch.testing.assert_close(q, _ref_rope(pos, q0, cache, head, True), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k, _ref_rope(pos, k0, cache, head, True), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kbuf[loc], k)
    torch.testing.assert_close(vbuf[loc], v)
    assert kbuf[[1, 2, 4]].abs().sum() == 0
    with pytest.raises(ValueError, match="float32"):
        sgl.apply_rope_with_cos_sin_cache_inplace(pos, q, k, head, cache.half())


def _dequant_close(q: torch.Tensor, ref: torch.Tensor) -> None:
    """fp8 values equal, or one e4m3 step apart (reciprocal vs division rounding)."""
    a, b = q.float(), ref.float()
    step = torch.exp2(torch.floor(torch.log2(b.abs().clamp(min=2.0**-9))) - 3)
    assert bool(((a - b).abs() <= step).all()), (a - b).abs().max()


def test_per_token_quant_fp8_writes_in_place(backend: str) -> None:
    x = _r(5, 64, dtype=torch.bfloat16, scale=3.0)
    x[2] = 0
    q = torch.empty(5, 64, dtype=FP8)
    s = torch.empty(5, 1)
    ptr = (q.data_ptr(), s.data_ptr())
    sgl.sgl_per_token_quant_fp8(x, q, s)
    assert (q.data_ptr(), s.data_ptr()) == ptr
    amax = x.float().abs().amax(-1, keepdim=True)
    ref_s = torch.clamp(amax / 448.0, min=1.0 / (448.0 * 512.0))
    torch.testing.assert_close(s, ref_s, atol=0, rtol=0)
    # bit-equal to vLLM's per-token quant (division), as sgl-kernel's own test demands
    assert torch.equal(q.float(), (x.float() / ref_s).clamp(-448, 448).to(FP8).float())
    s1 = torch.empty(5)  # [T] scales are accepted too
    sgl.sgl_per_token_quant_fp8(x, q, s1)
    torch.testing.assert_close(s1, ref_s.view(5))


def _group_ref(x: torch.Tensor, gs: int, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    t, h = x.shape
    xg = x.float().view(t, h // gs, gs)
    s = xg.abs().amax(-1).clamp(min=eps) / 448.0
    return (xg / s[..., None]).clamp(-448, 448).to(FP8).view(t, h), s


@pytest.mark.parametrize("layout", ["row-major", "column-major", "tma-aligned"])
def test_per_token_group_quant_fp8_scale_layouts(backend: str, layout: str) -> None:
    t, h, gs = 5, 64, 16
    x = _r(t, h, dtype=torch.float16, scale=2.0)
    q = torch.empty(t, h, dtype=FP8)
    if layout == "row-major":
        s = torch.empty(t, h // gs)
    elif layout == "column-major":
        s = torch.empty(h // gs, t).t()
    else:  # DeepGEMM's TMA-aligned column-major scales: the token stride rounds up to 4
        s = torch.empty_strided((t, h // gs), (1, 8))
    sgl.sgl_per_token_group_quant_fp8(x, q, s, gs, 1e-10, -448.0, 448.0)
    ref_q, ref_s = _group_ref(x, gs, 1e-10)
    torch.testing.assert_close(s, ref_s, atol=0, rtol=0)
    _dequant_close(q, ref_q)
    with pytest.raises(ValueError, match="fp8_min/fp8_max"):
        sgl.sgl_per_token_group_quant_fp8(x, q, s, gs, 1e-10, -240.0, 240.0)


def test_per_token_group_quant_ue8m0_and_8bit(backend: str) -> None:
    x = _r(4, 32, dtype=torch.bfloat16, seed=3)
    q, s = torch.empty(4, 32, dtype=FP8), torch.empty(4, 2)
    sgl.sgl_per_token_group_quant_8bit(x, q, s, 16, 1e-10, -448.0, 448.0, scale_ue8m0=True)
    assert bool((torch.log2(s) == torch.round(torch.log2(s))).all())  # powers of two
    _, plain = _group_ref(x, 16, 1e-10)
    assert bool((s >= plain).all()) and bool((s < 2 * plain).all())
    assert torch.equal(
        q.float(), (x.float().view(4, 2, 16) / s[..., None]).clamp(-448, 448).to(FP8).view(4, 32).float()
    )


def _int8_ref(x: torch.Tensor, gs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """sgl-kernel's int8 group quant: scale = amax / 127, int8_t(x * (1 / scale)) truncates."""
    t, h = x.shape
    xg = x.float().view(t, h // gs, gs)
    s = xg.abs().amax(-1).clamp(min=1e-10) / 127.0
    return torch.trunc((xg * s.reciprocal()[..., None]).clamp(-128, 127)).to(torch.int8).view(t, h), s


def test_per_token_group_quant_int8_truncates_in_the_kernel(backend: str) -> None:
    x = _r(6, 64, dtype=torch.float16, seed=4, scale=3.0)
    q, s = torch.empty(6, 64, dtype=torch.int8), torch.empty(6, 4)
    ptrs = (q.data_ptr(), s.data_ptr())
    sgl.sgl_per_token_group_quant_8bit(x, q, s, 16, 1e-10, -128.0, 127.0)
    assert (q.data_ptr(), s.data_ptr()) == ptrs
    ref_q, ref_s = _int8_ref(x, 16)
    assert torch.equal(s, ref_s) and torch.equal(q, ref_q)
    q2, s2 = torch.empty_like(q), torch.empty(4, 6).t()  # column-major scales
    sgl.sgl_per_token_group_quant_int8(x, q2, s2, 16, 1e-10, -128.0, 127.0)
    assert torch.equal(q2, ref_q) and torch.equal(s2, ref_s)
    with pytest.raises(ValueError, match="int8_min/int8_max"):
        sgl.sgl_per_token_group_quant_int8(x, q2, s2, 16, 1e-10, -127.0, 127.0)


def _packed_ue8m0_ref(scales: torch.Tensor) -> torch.Tensor:
    """DeepGEMM's packed UE8M0 scales (sgl's ``scale_ue8m0`` output): int32 [T, ceil(G / 4)] of
    exponent bytes, little endian, TMA-aligned column-major; padding bytes 0."""
    t, g = scales.shape
    exps = (scales.view(torch.int32) >> 23).to(torch.uint8)
    padded = torch.zeros(t, (g + 3) // 4 * 4, dtype=torch.uint8)
    padded[:, :g] = exps
    return padded.view(torch.int32)


@pytest.mark.parametrize("groups", [8, 6])
def test_per_token_group_quant_packed_ue8m0_tma_layout(backend: str, groups: int) -> None:
    t, gs = 5, 32
    x = _r(t, groups * gs, dtype=torch.bfloat16, seed=5, scale=4.0)
    x[1, :gs] = 0  # a group at eps
    aligned_t = (t + 3) // 4 * 4
    # sglang's create_per_token_group_quant_fp8_output_scale(scale_ue8m0=True): [K/4, T_aligned].T[:T]
    s = torch.zeros((groups + 3) // 4, aligned_t, dtype=torch.int32).t()[:t]
    q = torch.empty(t, groups * gs, dtype=FP8)
    sgl.sgl_per_token_group_quant_fp8(x, q, s, gs, 1e-10, -448.0, 448.0, scale_ue8m0=True)
    float_s = torch.empty(t, groups)
    q_f = torch.empty_like(q)
    sgl.sgl_per_token_group_quant_fp8(x, q_f, float_s, gs, 1e-10, -448.0, 448.0, scale_ue8m0=True)
    _, plain = _group_ref(x, gs, 1e-10)
    assert torch.equal(float_s, torch.exp2(torch.ceil(torch.log2(plain))))
    assert torch.equal(s, _packed_ue8m0_ref(float_s))
    assert torch.equal(q.float(), q_f.float())
    with pytest.raises(TypeError, match="needs scale_ue8m0"):
        sgl.sgl_per_token_group_quant_fp8(x, q, s, gs, 1e-10, -448.0, 448.0)


def test_per_token_group_quant_8bit_fused_silu_and_masked_m(backend: str) -> None:
    e, m, h, gs = 3, 6, 64, 32
    x = _r(e, m, 2 * h, dtype=torch.bfloat16, seed=6, scale=2.0)
    masked = torch.tensor([6, 0, 2], dtype=torch.int32)
    q = torch.full((e, m, h), 2.0).to(FP8)
    s = torch.full((e, m, h // gs), -1.0)
    sgl.sgl_per_token_group_quant_8bit(
        x, q, s, gs, 1e-10, -448.0, 448.0, fuse_silu_and_mul=True, masked_m=masked
    )
    act = (torch.nn.functional.silu(x[..., :h].float()).to(x.dtype) * x[..., h:]).float()  # sgl's roundings
    for i, n in enumerate(masked.tolist()):
        ref_q, ref_s = _group_ref(act[i, :n], gs, 1e-10)
        torch.testing.assert_close(s[i, :n], ref_s, atol=0, rtol=1e-6)
        _dequant_close(q[i, :n], ref_q)
        # q of the masked-out rows untouched; their scales 0, as in sgl's reference layout
        assert bool((q[i, n:].float() == 2).all()) and bool((s[i, n:] == 0).all())
    with pytest.raises(ValueError, match="masked_m must hold 3 counts of at most 6"):
        sgl.sgl_per_token_group_quant_8bit(
            x, q, s, gs, 1e-10, -448.0, 448.0, fuse_silu_and_mul=True, masked_m=torch.tensor([7, 0, 0])
        )
    with pytest.raises(ValueError, match="masked_m must be a 1-D tensor"):
        sgl.sgl_per_token_group_quant_8bit(
            x, q, s, gs, 1e-10, -448.0, 448.0, fuse_silu_and_mul=True, masked_m=torch.tensor([[6, 0, 2]])
        )
    with pytest.raises(ValueError, match="output_s has shape"):
        sgl.sgl_per_token_group_quant_8bit(
            x, q, s[0], gs, 1e-10, -448.0, 448.0, fuse_silu_and_mul=True, masked_m=masked
        )
    # as sgl-kernel: a negative count runs no row, entries past the experts are not read
    s.fill_(-1.0)
    sgl.sgl_per_token_group_quant_8bit(
        x, q, s, gs, 1e-10, -448.0, 448.0, fuse_silu_and_mul=True, masked_m=torch.tensor([-1, 0, 2, 99])
    )
    assert bool((s[0] == 0).all()) and bool((s[2, 2:] == 0).all()) and bool((s[2, :2] > 0).all())


def test_per_tensor_quant_fp8_static_and_dynamic(backend: str) -> None:
    x = _r(3, 32, scale=5.0)
    q, s = torch.empty(3, 32, dtype=FP8), torch.empty(1)
    ptrs = (q.data_ptr(), s.data_ptr())
    sgl.sgl_per_tensor_quant_fp8(x, q, s, is_static=False)
    assert (q.data_ptr(), s.data_ptr()) == ptrs
    ref_s = x.abs().amax() / 448.0
    torch.testing.assert_close(s, ref_s.view(1), atol=0, rtol=0)
    assert torch.equal(q.float(), (x * (1.0 / ref_s)).clamp(-448, 448).to(FP8).float())
    s_static = torch.tensor([0.05])
    sgl.sgl_per_tensor_quant_fp8(x, q, s_static, is_static=True)
    assert s_static.item() == pytest.approx(0.05)
    assert torch.equal(q.float(), (x * (1.0 / s_static)).clamp(-448, 448).to(FP8).float())
    x[1, 3] = float("nan")  # a NaN anywhere: NaN scale, as the reference
    sgl.sgl_per_tensor_quant_fp8(x, q, s, is_static=False)
    assert bool(torch.isnan(s).all())


def _ref_topk(g: torch.Tensor, k: int, renorm: bool) -> tuple[torch.Tensor, torch.Tensor]:
    p = torch.softmax(g.float(), -1)
    w, ids = torch.topk(p, k, -1)
    if renorm:
        w = w / w.sum(-1, keepdim=True)
    return w, ids


@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("renorm", [False, True])
def test_topk_softmax(backend: str, ids_dtype: torch.dtype, renorm: bool) -> None:
    g = _r(6, 8, dtype=torch.bfloat16, seed=11)
    w, ids = torch.empty(6, 2), torch.empty(6, 2, dtype=ids_dtype)
    ptr = ids.data_ptr()
    sgl.topk_softmax(w, ids, g, renorm)
    ref_w, ref_ids = _ref_topk(g, 2, renorm)
    assert ids.data_ptr() == ptr and ids.dtype == ids_dtype
    assert torch.equal(ids.long(), ref_ids)
    torch.testing.assert_close(w, ref_w, atol=1e-6, rtol=1e-5)


def test_topk_softmax_correction_bias_and_softcapping(backend: str) -> None:
    g = _r(4, 8, seed=12, scale=4.0)
    bias = torch.linspace(-0.5, 0.5, 8)
    w, ids = torch.empty(4, 3), torch.empty(4, 3, dtype=torch.int32)
    sgl.topk_softmax(w, ids, g, True, moe_softcapping=2.0, correction_bias=bias)
    # sgl-kernel's reference (its topk_softmax test): softcap, add the bias, softmax, top-k
    p = torch.softmax(2.0 * torch.tanh(g / 2.0) + bias, -1)
    ref_w, ref_ids = torch.topk(p, 3, -1)
    assert torch.equal(ids.long(), ref_ids)
    torch.testing.assert_close(w, ref_w / ref_w.sum(-1, keepdim=True))


@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("renorm", [False, True])
def test_topk_sigmoid_with_correction_bias(backend: str, ids_dtype: torch.dtype, renorm: bool) -> None:
    g = _r(5, 16, dtype=torch.bfloat16, seed=13, scale=2.0)
    bias = torch.linspace(0.4, -0.4, 16)  # large enough to change the choice
    w, ids = torch.empty(5, 4), torch.empty(5, 4, dtype=ids_dtype)
    ptr = ids.data_ptr()
    sgl.topk_sigmoid(w, ids, g, renorm, bias)
    # sgl-kernel's meaning (DeepSeek-V3 noaux_tc): chosen by sigmoid + bias, weighted by sigmoid
    s = torch.sigmoid(g.float())
    ref_ids = torch.topk(s + bias, 4, -1).indices
    ref_w = s.gather(1, ref_ids)
    if renorm:
        ref_w = ref_w / ref_w.sum(-1, keepdim=True)
    assert ids.data_ptr() == ptr and ids.dtype == ids_dtype
    assert not torch.equal(ref_ids, torch.topk(s, 4, -1).indices)  # the bias mattered
    assert torch.equal(ids.long(), ref_ids)
    torch.testing.assert_close(w, ref_w, atol=1e-6, rtol=1e-5)


def test_topk_sigmoid_refuses_what_opmux_does_not_do(backend: str) -> None:
    g = _r(2, 8, seed=14)
    w, ids = torch.empty(2, 2), torch.empty(2, 2, dtype=torch.int32)
    with pytest.raises(NotImplementedError, match=r"routed_scaling_factor=2\.5"):
        sgl.topk_sigmoid(w, ids, g, False, None, routed_scaling_factor=2.5)
    with pytest.raises(NotImplementedError, match="num_fused_shared_experts=1"):
        sgl.topk_sigmoid(w, ids, g, False, None, num_fused_shared_experts=1)


def _ref_align(ids: torch.Tensor, e: int, bs: int, n_sorted: int, n_blocks: int) -> tuple[list[int], ...]:
    """sgl-kernel / vLLM layout: experts in order, token order inside, padded with numel;
    unused blocks hold expert 0."""
    flat = ids.flatten().tolist()
    sorted_ids, experts, cumsum = [], [], [0]
    for x in range(e):
        mine = [i for i, v in enumerate(flat) if v == x]
        padded = math.ceil(len(mine) / bs) * bs
        sorted_ids += mine + [len(flat)] * (padded - len(mine))
        experts += [x] * (padded // bs)
        cumsum.append(cumsum[-1] + padded)
    total = len(sorted_ids)
    sorted_ids += [len(flat)] * (n_sorted - total)
    experts += [0] * (n_blocks - len(experts))
    return sorted_ids, experts, [total], cumsum


@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
def test_moe_align_block_size_fills_like_the_engines(backend: str, ids_dtype: torch.dtype) -> None:
    e, bs = 6, 4
    ids = torch.randint(0, e, (7, 2), generator=_g(5)).to(ids_dtype)
    ids[0] = 5  # some experts get several blocks, expert ids repeat
    n_sorted = ids.numel() + (e + 1) * (bs - 1)  # sglang allocates for num_experts + 1
    n_blocks = math.ceil(n_sorted / bs)
    sorted_ids = torch.full((n_sorted,), -7, dtype=torch.int32)
    experts = torch.full((n_blocks,), -7, dtype=torch.int32)
    post, cumsum = torch.empty(1, dtype=torch.int32), torch.empty(e + 1, dtype=torch.int32)
    sgl.moe_align_block_size(ids, e, bs, sorted_ids, experts, post, cumsum, True)
    ref = _ref_align(ids, e, bs, n_sorted, n_blocks)
    assert sorted_ids.tolist() == ref[0]
    assert experts.tolist() == ref[1]
    assert post.tolist() == ref[2]
    assert cumsum.tolist() == ref[3]
    # pad_sorted_token_ids=False: only the entries are written (sgl-kernel; the caller pre-fills)
    sorted_ids.fill_(-7)
    sgl.moe_align_block_size(ids, e, bs, sorted_ids, experts, post, cumsum, False)
    entries = [i for i, v in enumerate(ref[0]) if v != ids.numel()]
    assert [sorted_ids[i].item() for i in entries] == [ref[0][i] for i in entries]
    assert sorted(set(sorted_ids.tolist()) - {ref[0][i] for i in entries}) == [-7]


def test_older_topk_softmax_form_and_moe_sum(backend: str) -> None:
    g = _r(4, 8, seed=13)
    w, ids, tei = (
        torch.empty(4, 2),
        torch.empty(4, 2, dtype=torch.int32),
        torch.empty(4, 2, dtype=torch.int32),
    )
    sgl.topk_softmax(w, ids, tei, g)  # (weights, ids, token_expert_indices, gating_output)
    ref_w, ref_ids = _ref_topk(g, 2, False)
    assert torch.equal(ids.long(), ref_ids)
    torch.testing.assert_close(w, ref_w)
    assert tei.tolist() == [[j * 4 + i for j in range(2)] for i in range(4)]
    x = _r(3, 2, 16, seed=14, dtype=torch.bfloat16)
    out = torch.empty(3, 16, dtype=torch.bfloat16)
    sgl.moe_sum(x, out)
    assert torch.equal(out, x.sum(1))


def test_moe_align_reads_strided_ids_as_flat_memory(backend: str) -> None:
    """sgl-kernel (and its test's Triton reference) read ``numel`` ids from the data pointer:
    ``argsort(...)[:, :k]`` is aligned as the first T*k ids of the argsort's memory."""
    e, bs, t, k = 8, 4, 5, 2
    full = torch.argsort(torch.rand(t, e, generator=_g(3)), dim=1)  # int64, [t, e]
    view = full[:, :k]
    n = t * k
    sorted_ids = torch.empty(n + e * (bs - 1), dtype=torch.int32)
    experts = torch.empty((n + e * (bs - 1)) // bs, dtype=torch.int32)
    post, cumsum = torch.empty(1, dtype=torch.int32), torch.empty(e + 1, dtype=torch.int32)
    sgl.moe_align_block_size(view, e, bs, sorted_ids, experts, post, cumsum, True)
    flat = full.flatten()[:n].view(t, k)
    ref = _ref_align(flat, e, bs, sorted_ids.numel(), experts.numel())
    assert (sorted_ids.tolist(), experts.tolist(), post.tolist(), cumsum.tolist()) == ref


def test_moe_align_expert_buffer_of_floor_size(backend: str) -> None:
    """sglang sizes expert_ids max_padded // block_size; the block it lacks is never used."""
    e, bs = 3, 4
    ids = torch.tensor([[0, 2], [2, 2], [1, 0]], dtype=torch.int32)
    n_sorted = ids.numel() + e * (bs - 1)  # 15: the ceiling is 4 blocks, the floor 3
    sorted_ids = torch.empty(n_sorted, dtype=torch.int32)
    experts = torch.full((n_sorted // bs,), -7, dtype=torch.int32)
    post, cumsum = torch.empty(1, dtype=torch.int32), torch.empty(e + 1, dtype=torch.int32)
    sgl.moe_align_block_size(ids, e, bs, sorted_ids, experts, post, cumsum, True)
    ref = _ref_align(ids, e, bs, n_sorted, n_sorted // bs)
    assert (sorted_ids.tolist(), experts.tolist(), post.tolist(), cumsum.tolist()) == ref
