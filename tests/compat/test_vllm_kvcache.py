"""vLLM's KV cache block entry points (opmux.compat.vllm): copy_blocks, copy_blocks_mla,
swap_blocks, concat_and_cache_mla, gather_cache, written in place into the caller's caches."""

from __future__ import annotations

import inspect
import random

import pytest
import torch

import opmux.compat.vllm as vllm

FP8 = torch.float8_e4m3fn

SIGNATURES = {
    "copy_blocks": ["key_caches", "value_caches", "block_mapping"],
    "copy_blocks_mla": ["kv_caches", "block_mapping"],
    "swap_blocks": ["src", "dst", "block_mapping"],
    "concat_and_cache_mla": ["kv_c", "k_pe", "kv_cache", "slot_mapping", "kv_cache_dtype", "scale"],
    "gather_cache": ["src_cache", "dst", "block_table", "cu_seq_lens", "batch_size", "seq_starts"],
}


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signature_is_vllms(name: str) -> None:
    assert list(inspect.signature(getattr(vllm, name)).parameters) == SIGNATURES[name]
    assert name in vllm.__all__


def _pairs(nb: int, n: int, seed: int) -> list[tuple[int, int]]:
    """vLLM's test mapping: each source block copied to two other blocks."""
    rnd = random.Random(seed)
    src = rnd.sample(range(nb), n)
    dst = rnd.sample(sorted(set(range(nb)) - set(src)), 2 * n)
    return [(s, dst[2 * i + j]) for i, s in enumerate(src) for j in range(2)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.uint8])
def test_copy_blocks_every_layer_in_place(backend: str, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    nb, layers = 12, 2
    keys = [torch.randint(0, 255, (nb, 2, 4, 3, 8), generator=g).to(dtype) for _ in range(layers)]
    values = [torch.randint(0, 255, (nb, 2, 8, 3), generator=g).to(dtype) for _ in range(layers)]
    want_k, want_v = [k.clone() for k in keys], [v.clone() for v in values]
    pairs = _pairs(nb, 3, 1)
    for s, d in pairs:
        for c in (*want_k, *want_v):
            c[d] = c[s]
    ptrs = [c.data_ptr() for c in (*keys, *values)]
    vllm.copy_blocks(keys, values, torch.tensor(pairs))
    assert [c.data_ptr() for c in (*keys, *values)] == ptrs
    for got, want in zip((*keys, *values), (*want_k, *want_v), strict=True):
        assert torch.equal(got, want)
    with pytest.raises(ValueError, match="2 key caches but 1 value caches"):
        vllm.copy_blocks(keys, values[:1], torch.tensor(pairs))


def test_copy_blocks_mla_fp8_bytes(backend: str) -> None:
    caches = [(torch.randn(8, 4, 40) * 8).to(FP8).view(torch.uint8) for _ in range(2)]
    want = [c.clone() for c in caches]
    pairs = _pairs(8, 2, 2)
    for s, d in pairs:
        for c in want:
            c[d] = c[s]
    vllm.copy_blocks_mla(caches, torch.tensor(pairs))
    assert all(torch.equal(c, w) for c, w in zip(caches, want, strict=True))


def test_copy_blocks_out_of_range_pair_raises_before_writing(backend: str) -> None:
    cache = torch.randn(4, 2, 8)
    before = cache.clone()
    with pytest.raises(ValueError, match=r"block_mapping\[1, 1\] = 4 is out of range"):
        vllm.copy_blocks_mla([cache], torch.tensor([[0, 1], [2, 4]]))
    assert torch.equal(cache, before)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.uint8])
def test_swap_blocks_runs_and_scattered_pairs(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(3)
    src = torch.randint(0, 100, (10, 3, 16), generator=g).to(dtype)
    dst = torch.zeros(6, 3, 16, dtype=dtype)
    pairs = [(2, 0), (3, 1), (4, 2), (9, 5), (0, 3)]  # a run of three, then scattered
    vllm.swap_blocks(src, dst, torch.tensor(pairs))
    for s, d in pairs:
        assert torch.equal(dst[d], src[s])
    assert torch.equal(dst[4], torch.zeros_like(dst[4]))
    with pytest.raises(ValueError, match=r"block_mapping\[0, 1\] = 6 is out of range: valid dst blocks"):
        vllm.swap_blocks(src, dst, torch.tensor([[0, 6]]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_concat_and_cache_mla_auto_fp8_and_padding_rows(backend: str, dtype: torch.dtype) -> None:
    t, r, p, nb, bs = 5, 32, 8, 3, 4
    kv_c = torch.randn(t + 2, r).to(dtype)  # two rows of CUDA-graph padding past the slots
    k_pe = torch.randn(t + 2, p).to(dtype)
    slots = torch.tensor([7, -1, 0, 11, 4])
    cache = torch.zeros(nb, bs, r + p, dtype=dtype)
    vllm.concat_and_cache_mla(kv_c, k_pe, cache, slots, "auto", torch.tensor(0.1))
    want = torch.zeros_like(cache)
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            want[s // bs, s % bs] = torch.cat([kv_c[i], k_pe[i]])
    assert torch.equal(cache, want)
    c8 = torch.zeros(nb, bs, r + p, dtype=torch.uint8)  # vLLM's fp8 cache: uint8 storage
    scale = torch.tensor(0.1)
    vllm.concat_and_cache_mla(kv_c, k_pe, c8, slots, "fp8", scale)
    want8 = (want.float() / scale).clamp(-448, 448).to(FP8)
    assert torch.equal(c8, want8.view(torch.uint8))


def test_gather_cache_batch_size_and_seq_starts(backend: str) -> None:
    nb, bs, entry = 16, 4, 24
    src = torch.randn(nb, bs, entry)
    lens = [5, 0, 9]
    cu = torch.tensor([0, 5, 5, 14, 99], dtype=torch.int32)  # one row past batch_size: unused
    table = torch.stack([torch.randperm(nb)[:6] for _ in range(4)]).int()
    starts = torch.tensor([4, 0, 1, 0], dtype=torch.int32)  # first block: seq_starts // bs
    dst = torch.full((16, entry), -7.0)
    vllm.gather_cache(src, dst, table, cu, 3, starts)
    row = 0
    for b, n in enumerate(lens):
        for i in range(n):
            blk = int(table[b, int(starts[b]) // bs + i // bs])
            assert torch.equal(dst[row], src[blk, i % bs])
            row += 1
    assert bool((dst[14:] == -7.0).all())  # past cu_seq_lens[batch_size]: untouched
    dst2 = torch.zeros(14, entry)
    vllm.gather_cache(src, dst2, table, cu, 3)  # no seq_starts: every sequence from column 0
    assert torch.equal(dst2[:5], src[table[0, :2].long()].reshape(-1, entry)[:5])


def test_cache_ops_registered_for_the_runner() -> None:
    """tools/engine_compat.py registers torch.ops._C_cache_ops.<name> for each of them."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "tools" / "engine_compat.py"
    spec = importlib.util.spec_from_file_location("engine_compat_for_test", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod._register_cache_ops(vllm)
    cache = torch.randn(4, 2, 8)
    want = cache.clone()
    want[3] = want[0]
    torch.ops._C_cache_ops.copy_blocks_mla([cache], torch.tensor([[0, 3]]))
    assert torch.equal(cache, want)
    dst = torch.zeros(2, 8)
    torch.ops._C_cache_ops.gather_cache(
        cache, dst, torch.tensor([[3]], dtype=torch.int32), torch.tensor([0, 2], dtype=torch.int32), 1, None
    )
    assert torch.equal(dst, cache[3])
