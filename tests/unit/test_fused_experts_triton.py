"""The Triton backend of moe.fused_experts against the op's definition (``_experts.reference``),
in the interpreter at tiny shapes: every dtype and activation, fp8 block scales with K and N
tails, expert_map with remote experts, repeated experts in a row, the router weight on the
input, M = 0 / 1, out = hidden, strided views, int64 ids, explicit launch configurations."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from opmux.kernels import ops, tuned
from opmux.kernels.ops.moe import _experts
from opmux.kernels.ops.moe import fused_experts_triton as fe

_TOL = {torch.bfloat16: 2e-2, torch.float16: 2e-2, torch.float32: 1e-4}


@pytest.fixture(autouse=True)
def inf_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fresh float buffers full of inf: the rows no expert writes are never read (inf * 0 of a
    padding row's weight warns in the interpreter: warnings are errors)."""
    empty = torch.empty

    def poisoned(*args: Any, **kwargs: Any) -> torch.Tensor:
        t = empty(*args, **kwargs)
        return t.fill_(float("inf")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", poisoned)


def _weights(e: int, n: int, k: int, dtype: torch.dtype, fp8: bool, gen: torch.Generator) -> dict[str, Any]:
    w1 = torch.randn(e, 2 * n, k, generator=gen) / math.sqrt(k)
    w2 = torch.randn(e, k, n, generator=gen) / math.sqrt(n)
    if not fp8:
        return {"w1": w1.to(dtype), "w2": w2.to(dtype)}
    s1 = torch.rand(e, math.ceil(2 * n / 128), math.ceil(k / 128), generator=gen) * 0.1 + 0.05
    s2 = torch.rand(e, math.ceil(k / 128), math.ceil(n / 128), generator=gen) * 0.1 + 0.05
    w1q = (w1 / _experts.dequantize(torch.ones_like(w1), s1)).to(torch.float8_e4m3fn)
    w2q = (w2 / _experts.dequantize(torch.ones_like(w2), s2)).to(torch.float8_e4m3fn)
    return {"w1": w1q, "w2": w2q, "w1_scale": s1, "w2_scale": s2}


def _problem(
    m: int = 5,
    k: int = 64,
    n: int = 32,
    e: int = 4,
    topk: int = 2,
    dtype: torch.dtype = torch.bfloat16,
    fp8: bool = False,
    ids_dtype: torch.dtype = torch.int32,
    num_ids: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(m, k, generator=gen).to(dtype)
    ids = torch.randint(0, num_ids or e, (m, topk), generator=gen).to(ids_dtype)
    return {
        "hidden": hidden,
        **_weights(e, n, k, dtype, fp8, gen),
        "topk_weights": torch.rand(m, topk, generator=gen),
        "topk_ids": ids,
    }


def _check(p: dict[str, Any], out: torch.Tensor | None = None, **kw: Any) -> torch.Tensor:
    ref = _experts.reference(**{**p, **kw})
    got = ops.moe.fused_experts(**p, **kw, out=out, backend="triton")
    tol = _TOL[p["hidden"].dtype]
    torch.testing.assert_close(got, ref, atol=tol, rtol=tol)
    return got


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("activation", _experts.ACTIVATIONS)
def test_dtypes_and_activations(dtype: torch.dtype, activation: str) -> None:
    _check(_problem(m=7, k=48, n=40, e=3, dtype=dtype), activation=activation)


@pytest.mark.parametrize(
    ("k", "n", "dtype"),
    [
        (200, 72, torch.bfloat16),
        (256, 128, torch.bfloat16),
        (136, 16, torch.float16),
        (128, 100, torch.float32),
    ],
)
def test_fp8_block_scales(k: int, n: int, dtype: torch.dtype) -> None:
    _check(_problem(m=6, k=k, n=n, e=3, dtype=dtype, fp8=True, seed=1))


def test_fp8_with_expert_map_and_gelu() -> None:
    p = _problem(m=5, k=200, n=72, e=2, fp8=True, num_ids=4, seed=2)
    _check(p, activation="gelu", expert_map=torch.tensor([1, -1, 0, -1], dtype=torch.int32))


def test_expert_map_remote_experts_give_zero() -> None:
    p = _problem(m=6, e=3, topk=2, num_ids=6, seed=3)
    emap = torch.tensor([2, -1, 0, -1, 1, -1], dtype=torch.int32)
    p["topk_ids"][0] = torch.tensor([1, 3], dtype=torch.int32)  # every expert of token 0 remote
    p["topk_ids"][1] = torch.tensor([5, 0], dtype=torch.int32)  # one of two
    got = _check(p, expert_map=emap)
    assert torch.equal(got[0], torch.zeros_like(got[0]))


def test_expert_map_shorter_than_the_local_experts() -> None:
    # 3 global ids onto 5 local experts (the align op's id range is padded with -1 to 5)
    p = _problem(m=4, e=5, topk=2, num_ids=3, seed=4)
    _check(p, expert_map=torch.tensor([4, -1, 2], dtype=torch.int32))


@pytest.mark.parametrize("topk", [1, 2, 3])
def test_topk_with_repeated_experts(topk: int) -> None:
    p = _problem(m=5, e=4, topk=topk, seed=5)
    p["topk_ids"][0] = 2  # the same expert in every slot of a row
    p["topk_ids"][3, :] = torch.tensor([1, 3, 1][:topk], dtype=torch.int32)
    _check(p)


def test_router_weight_on_input() -> None:
    _check(_problem(m=6, topk=1, seed=6), apply_router_weight_on_input=True)
    _check(_problem(m=3, k=200, n=72, topk=1, fp8=True, seed=6), apply_router_weight_on_input=True)


@pytest.mark.parametrize("m", [0, 1])
def test_tiny_m(m: int) -> None:
    p = _problem(m=m, seed=7)
    out = torch.full((m, 64), float("nan"), dtype=torch.bfloat16)
    assert _check(p, out=out) is out


def test_in_place_out_is_hidden() -> None:
    p = _problem(m=9, e=6, topk=3, seed=8)
    ref = _experts.reference(**p)
    hidden = p["hidden"]
    got = ops.moe.fused_experts(**p, out=hidden, backend="triton")
    assert got is hidden
    torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)


def test_strided_views_and_int64_ids() -> None:
    p = _problem(m=5, k=64, n=32, e=3, ids_dtype=torch.int64, seed=9)
    wide = torch.zeros(5, 80, dtype=torch.bfloat16)
    wide[:, :64] = p["hidden"]
    p["hidden"] = wide[:, :64]  # row stride 80
    big1 = torch.zeros(3, 70, 96, dtype=torch.bfloat16)
    big1[:, :64, :64] = p["w1"]
    p["w1"] = big1[:, :64, :64]  # unit last stride, other strides not dense
    ids = torch.zeros(5, 4, dtype=torch.int64)
    ids[:, :2] = p["topk_ids"]
    p["topk_ids"] = ids[:, :2]  # row stride 4 (the routing gets a dense copy)
    weights = torch.zeros(5, 3)
    weights[:, :2] = p["topk_weights"]
    p["topk_weights"] = weights[:, :2]
    _check(p)


@pytest.mark.parametrize(
    ("block_m", "block_k", "fp8"), [(16, 32, False), (32, 16, False), (16, 128, True), (32, 128, True)]
)
def test_explicit_configs(block_m: int, block_k: int, fp8: bool) -> None:
    # K = 200: a K tail in every config; N = 72: an N tail in the 64-wide N blocks
    p = _problem(m=9, k=200, n=72, e=4, topk=2, fp8=fp8, seed=10)
    tags = tuned.FP8_BLOCK_TAGS if fp8 else ()
    config = {**tuned.default_config(fe.OP, "triton", 9, (4, 72), tags), "BLOCK_SIZE_M": block_m}
    config["BLOCK_SIZE_K"] = block_k
    assert not tuned.validate_entry(fe.OP, "triton", config, tags)
    empty = torch.empty(0)
    out = torch.full((9, 200), float("nan"), dtype=torch.bfloat16)
    fe.launch_fused_experts(
        out, p["hidden"], p["w1"], p["w2"], p["topk_weights"], p["topk_ids"],
        p.get("w1_scale", empty), p.get("w2_scale", empty), torch.empty(0, dtype=torch.int32),
        "silu", False, config,
    )  # fmt: skip
    torch.testing.assert_close(out, _experts.reference(**p), atol=2e-2, rtol=2e-2)


_DECODE = {
    "DECODE": 1,
    "BLOCK_SIZE_M": 4,
    "BLOCK_SIZE_N": 8,
    "GROUP_SIZE_M": 1,
    "num_warps": 4,
    "num_stages": 2,
}


def _launch(p: dict[str, Any], config: dict[str, Any], out: torch.Tensor, **kw: Any) -> None:
    empty = torch.empty(0)
    fe.launch_fused_experts(
        out, p["hidden"], p["w1"], p["w2"], p["topk_weights"], p["topk_ids"],
        p.get("w1_scale", empty), p.get("w2_scale", empty),
        kw.get("expert_map", torch.empty(0, dtype=torch.int32)),
        kw.get("activation", "silu"), kw.get("apply_router_weight_on_input", False), config,
    )  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("activation", _experts.ACTIVATIONS)
def test_decode_path(dtype: torch.dtype, activation: str) -> None:
    # K = 200 and N = 72: tails in the K steps and in both kernels' row blocks
    p = _problem(m=3, k=200, n=72, e=4, topk=2, dtype=dtype, seed=11)
    config = {**_DECODE, "BLOCK_SIZE_K": 32}
    assert not tuned.validate_entry(fe.OP, "triton", config)
    out = torch.full((3, 200), float("nan"), dtype=dtype)
    _launch(p, config, out, activation=activation)
    tol = _TOL[dtype]
    torch.testing.assert_close(out, _experts.reference(**p, activation=activation), atol=tol, rtol=tol)


def test_decode_path_fp8_map_and_weight_on_input() -> None:
    config = {**_DECODE, "BLOCK_SIZE_K": 128, "BLOCK_SIZE_N": 16}
    assert not tuned.validate_entry(fe.OP, "triton", config, tuned.FP8_BLOCK_TAGS)
    p = _problem(m=2, k=200, n=72, e=4, topk=2, fp8=True, num_ids=6, seed=12)
    emap = torch.tensor([0, -1, 1, 2, -1, 3], dtype=torch.int32)  # ids 1 and 4: another rank's
    out = torch.full((2, 200), float("nan"), dtype=torch.bfloat16)
    _launch(p, config, out, expert_map=emap)
    torch.testing.assert_close(out, _experts.reference(**p, expert_map=emap), atol=2e-2, rtol=2e-2)
    p = _problem(m=3, k=64, n=32, e=4, topk=1, seed=13)
    out = torch.full((3, 64), float("nan"), dtype=torch.bfloat16)
    _launch(p, _DECODE | {"BLOCK_SIZE_K": 64}, out, apply_router_weight_on_input=True)
    ref = _experts.reference(**p, apply_router_weight_on_input=True)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("m", [1, 2])
def test_no_experts_per_token_gives_zeros(m: int) -> None:
    # topk = 0: the definition's sum of no terms; M = 1 takes the decode path by default
    p = _problem(m=m, topk=0, seed=15)
    out = torch.full((m, 64), float("nan"), dtype=torch.bfloat16)
    got = ops.moe.fused_experts(**p, out=out, backend="triton")
    assert got is out and bool((out == 0).all())
    out.fill_(float("nan"))
    _launch(p, {**_DECODE, "BLOCK_SIZE_K": 64}, out)
    assert bool((out == 0).all())


def test_default_is_the_decode_path_for_one_token() -> None:
    for tags in ((), tuned.FP8_BLOCK_TAGS, (("dtype", "float32"),)):
        one = tuned.default_config(fe.OP, "triton", 1, (8, 64), tags)
        assert one.get("DECODE") == 1 and not tuned.validate_entry(fe.OP, "triton", one, tags)
        assert "DECODE" not in tuned.default_config(fe.OP, "triton", 2, (8, 64), tags)


def test_decode_entries_are_validated() -> None:
    bad = {**_DECODE, "BLOCK_SIZE_K": 32, "DECODE": 2}
    assert any("DECODE=2" in p for p in tuned.validate_entry(fe.OP, "triton", bad))
    thin = {**_DECODE, "BLOCK_SIZE_K": 32, "DECODE": 0}  # 4-row tiles are the decode path's only
    assert any("BLOCK_SIZE_M=4" in p for p in tuned.validate_entry(fe.OP, "triton", thin))
    fp8 = {**_DECODE, "BLOCK_SIZE_K": 128}  # fp8's products are tensor-core tiles: 16 rows or more
    assert any(
        "BLOCK_SIZE_N=8" in p for p in tuned.validate_entry(fe.OP, "triton", fp8, tuned.FP8_BLOCK_TAGS)
    )
    assert not tuned.validate_entry(fe.OP, "triton", fp8 | {"BLOCK_SIZE_N": 16}, tuned.FP8_BLOCK_TAGS)


@pytest.mark.parametrize("fp8", [False, True])
def test_second_product_in_chunks_when_k_exceeds_2n(fp8: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # K = 300 > 2N = 80 (fp8: 128-column chunks of their own buffer, 2N being below one block)
    assert fe._down_chunks(300, 80, False) == [(0, 80), (80, 80), (160, 80), (240, 60)]
    assert fe._down_chunks(300, 80, True) == [(0, 128), (128, 128), (256, 44)]
    assert fe._down_chunks(7168, 4096, True) == [(0, 4096), (4096, 3072)]
    assert fe._down_chunks(2048, 3072, False) == [(0, 2048)]
    sizes: list[int] = []
    empty = torch.empty

    def recorded(*args: Any, **kwargs: Any) -> torch.Tensor:
        t = empty(*args, **kwargs)
        if t.is_floating_point():
            sizes.append(t.numel())
        return t

    monkeypatch.setattr(torch, "empty", recorded)
    p = _problem(m=5, k=300, n=40, e=4, topk=2, fp8=fp8, seed=14)
    tags = tuned.FP8_BLOCK_TAGS if fp8 else ()
    out = torch.full((5, 300), float("nan"), dtype=torch.bfloat16)
    _launch(p, dict(tuned.default_config(fe.OP, "triton", 5, (4, 40), tags)), out)
    torch.testing.assert_close(out, _experts.reference(**p), atol=2e-2, rtol=2e-2)
    if not fp8:  # no float buffer above the definition's [M * topk, 2N]
        assert sizes and max(sizes) <= 5 * 2 * 80


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("decode", [False, True])
def test_vllm_rounding_is_the_definitions(fp8: bool, decode: bool) -> None:
    # vLLM's rounding points: the grouped and decode paths both equal the definition's vLLM form,
    # which differs from the default form (the test would pass vacuously otherwise)
    p = _problem(m=1 if decode else 5, k=256, n=128, e=4, topk=2, fp8=fp8, seed=21)
    want = _experts.reference(**p, vllm_rounding=True)
    assert not torch.equal(want, _experts.reference(**p))
    tags = tuned.FP8_BLOCK_TAGS if fp8 else ()
    config = dict(tuned.default_config(fe.OP, "triton", 1 if decode else 5, (4, 128), tags))
    if decode:
        config |= {"BLOCK_SIZE_K": 128}
    assert bool(config.get("DECODE")) == decode
    out = torch.empty_like(p["hidden"])
    empty = torch.empty(0)
    fe.launch_fused_experts(
        out, p["hidden"], p["w1"], p["w2"], p["topk_weights"], p["topk_ids"],
        p.get("w1_scale", empty), p.get("w2_scale", empty), torch.empty(0, dtype=torch.int32),
        "silu", False, config, vllm_rounding=True,
    )  # fmt: skip
    torch.testing.assert_close(out, want, atol=0, rtol=0)


@pytest.mark.parametrize(("block_k", "activation"), [(256, "swigluoai"), (512, "gelu")])
def test_decode_path_fp8_steps_of_several_groups(block_k: int, activation: str) -> None:
    # fp8 K steps of 2 and 4 activation groups (unrolled), with K and N tails (K 328, N 200: a
    # step past K, a scale block past N) and the interleaved swigluoai rows
    config = {**_DECODE, "BLOCK_SIZE_K": block_k, "BLOCK_SIZE_N": 16}
    assert not tuned.validate_entry(fe.OP, "triton", config, tuned.FP8_BLOCK_TAGS)
    p = _problem(m=2, k=328, n=200, e=4, topk=2, fp8=True, seed=31)
    out = torch.full((2, 328), float("nan"), dtype=torch.bfloat16)
    _launch(p, config, out, activation=activation)
    want = _experts.reference(**p, activation=activation)
    torch.testing.assert_close(out, want, atol=2e-2, rtol=2e-2)
