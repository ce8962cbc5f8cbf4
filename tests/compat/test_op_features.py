"""Features the engines need, in the native ops, with the one contract on every backend:
``rotary_embedding(..., key=None, ...)`` and int64 ``topk_ids`` for ``moe_align_block_size``."""

from __future__ import annotations

import pytest
import torch

from opmux.kernels.ops import moe, rope


@pytest.mark.parametrize("neox", [True, False])
def test_rope_key_none_rotates_the_query_only(backend: str, neox: bool) -> None:
    g = torch.Generator().manual_seed(0)
    pos = torch.tensor([3, 1, 0, 2])
    cache = torch.randn(4, 8, generator=g)
    q = torch.randn(4, 3 * 16, generator=g, dtype=torch.float32).to(torch.bfloat16)
    alone, with_key = q.clone(), q.clone()
    assert rope.rotary_embedding(pos, alone, None, 16, cache, neox) is None
    rope.rotary_embedding(pos, with_key, torch.zeros(4, 16, dtype=torch.bfloat16), 16, cache, neox)
    assert torch.equal(alone, with_key)
    ref = q.clone()
    rope.rotary_embedding(pos, ref, None, 16, cache, neox, backend="reference")
    torch.testing.assert_close(alone, ref, atol=2e-2, rtol=2e-2)
    assert not torch.equal(alone, q)
    with pytest.raises(ValueError, match="head_size must be a positive int"):
        rope.rotary_embedding(pos, q, None, 0, cache, neox)
    with pytest.raises(ValueError, match="out of range"):
        rope.rotary_embedding(torch.tensor([0, 1, 2, 9]), q, None, 16, cache, neox)


def test_rope_key_none_under_torch_compile() -> None:
    pos, cache = torch.arange(3), torch.randn(3, 16)
    q = torch.randn(3, 2, 16)
    eager, compiled = q.clone(), q.clone()
    rope.rotary_embedding(pos, eager, None, 16, cache, True)
    fn = torch.compile(
        lambda p, x, c: rope.rotary_embedding(p, x, None, 16, c, True), fullgraph=True, backend="aot_eager"
    )
    fn(pos, compiled, cache)
    torch.testing.assert_close(compiled, eager)


def test_moe_align_int64_ids_match_int32(backend: str) -> None:
    g = torch.Generator().manual_seed(1)
    ids = torch.stack([torch.randperm(8, generator=g)[:3] for _ in range(9)])  # int64, like torch.topk's
    got = moe.moe_align_block_size(ids, 4, 8)
    want = moe.moe_align_block_size(ids.to(torch.int32), 4, 8)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == torch.int32 and torch.equal(a, b)
    with pytest.raises(ValueError, match="out of range"):  # no wrap-around into a valid id
        moe.moe_align_block_size(ids + 2**32, 4, 8)
    with pytest.raises(TypeError, match="dtype"):
        moe.moe_align_block_size(ids.to(torch.int16), 4, 8)


# -- quantization: caller's outputs, per-tensor, int8, UE8M0, scale layouts, division ---------------
FP8 = torch.float8_e4m3fn


def test_quant_ops_write_the_callers_outputs(backend: str) -> None:
    from opmux.kernels.ops import quantization as Q

    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    cases = [
        (Q.per_token_quant_fp8, (x,), {}, torch.empty(5, 64, dtype=FP8), torch.empty(5, 1)),
        (Q.per_tensor_quant_fp8, (x,), {}, torch.empty(5, 64, dtype=FP8), torch.empty(1)),
        (Q.per_token_group_quant_fp8, (x, 16), {}, torch.empty(5, 64, dtype=FP8), torch.empty(4, 8).t()[:5]),
        (Q.per_token_group_quant_int8, (x, 16), {}, torch.empty(5, 64, dtype=torch.int8), torch.empty(5, 4)),
    ]
    for op, args, kwargs, q_buf, s_buf in cases:
        want_q, want_s = op(*args, **kwargs)
        got_q, got_s = op(*args, **kwargs, out_q=q_buf, out_scale=s_buf)
        assert got_q is q_buf and got_s is s_buf  # written in place, returned as given
        assert torch.equal(got_q.view(torch.uint8), want_q.view(torch.uint8)), op
        assert torch.equal(got_s.reshape(want_s.shape), want_s), op


def test_quant_out_buffers_refused_under_torch_compile() -> None:
    from opmux.kernels.ops.quantization import per_token_quant_fp8

    x, q = torch.randn(3, 16), torch.empty(3, 16, dtype=FP8)
    torch._dynamo.reset()
    f = torch.compile(lambda x, q: per_token_quant_fp8(x, out_q=q), fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match=r"not supported under torch\.compile"):
        f(x, q)


def test_per_tensor_quant_static_and_dynamic(backend: str) -> None:
    from opmux.kernels.ops.quantization import per_tensor_quant_fp8

    x = torch.randn(300, 40, generator=torch.Generator().manual_seed(3)) * 3
    q, s = per_tensor_quant_fp8(x)
    ref = x.abs().amax() / 448.0
    assert torch.equal(s, ref.view(1))
    assert torch.equal(q.float(), (x * ref.reciprocal()).clamp(-448, 448).to(FP8).float())
    static = torch.tensor(0.004)  # 0-dim
    q, s = per_tensor_quant_fp8(x, static)
    assert s.shape == (1,) and s.item() == static.item()
    assert torch.equal(q.float(), (x * static.reciprocal()).clamp(-448, 448).to(FP8).float())


def test_group_quant_ue8m0_and_packed_scales(backend: str) -> None:
    from opmux.kernels.ops.quantization import per_token_group_quant_fp8

    x = torch.randn(3, 6 * 32, generator=torch.Generator().manual_seed(4)) * 7
    q, s = per_token_group_quant_fp8(x, 32, scale_ue8m0=True)
    plain = x.view(3, 6, 32).abs().amax(-1) / 448.0
    assert torch.equal(s, torch.exp2(torch.ceil(torch.log2(plain))))
    packed = torch.full((3, 2), -1, dtype=torch.int32)  # [T, ceil(6 / 4)]: two padding bytes per row
    q2, s2 = per_token_group_quant_fp8(x, 32, scale_ue8m0=True, out_scale=packed)
    assert s2 is packed and torch.equal(q2.float(), q.float())
    b = packed.view(torch.uint8).view(3, 8)
    assert torch.equal(b[:, :6], (s.view(torch.int32) >> 23).to(torch.uint8))
    assert bool((b[:, 6:] == 0xFF).all())  # padding bytes left as they were


def test_group_quant_scale_layouts_any_strides(backend: str) -> None:
    from opmux.kernels.ops.quantization import per_token_group_quant_fp8

    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(5))
    _, ref = per_token_group_quant_fp8(x, 32)
    _, tma = per_token_group_quant_fp8(x, 32, column_major_scales=True, scale_tma_aligned=True)
    assert tma.stride() == (1, 8) and torch.equal(tma, ref)
    odd = torch.empty(4, 11)[:, 1:6].t()  # [5, 4] with strides (1, 11): written where it lies
    _, s = per_token_group_quant_fp8(x, 32, out_scale=odd)
    assert s is odd and torch.equal(odd, ref)
    with pytest.raises(ValueError, match="needs column_major_scales"):
        per_token_group_quant_fp8(x, 32, scale_tma_aligned=True)
