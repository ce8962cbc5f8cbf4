"""attention.paged_prefill with a value head dim below the key's (MLA), as paged_decode takes it
(``test_paged_decode_mla.py``): DeepSeek's absorbed 576-dim latent cache with V its first 512
dims, passed as ``value_cache = key_cache[..., :512]`` (the kernel takes the value tile from the
key tile) or as a tensor of its own, and a non-absorbed D 192 / Dv 128; out [T, Hq, Dv]. The
Triton backend in the interpreter and the torch backend against the reference: ragged batches
with cached prefixes, groups of 16 and of 128 heads (the group split over programs), fp8 caches,
softcap / window / sinks / lse, a bad block id masked by the launcher; the contract's rules."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from opmux.kernels import ops
from opmux.kernels.ops.attention import _prefill
from opmux.kernels.ops.attention import op as decls

pt = pytest.importorskip("opmux.kernels.ops.attention._prefill_triton")

OP = "attention.paged_prefill"
I32 = torch.int32
_TOL = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3, torch.float32: 1e-4}
#: DeepSeek's absorbed MLA: kv_lora_rank 512 + rope 64; softmax scale 1 / sqrt(192)
D, DV, SCALE = 576, 512, 192**-0.5


def _mla(
    q_lens: list[int],
    prefix: list[int],
    hq: int = 16,
    page: int = 16,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    view: bool = True,
    d: int = D,
    dv: int = DV,
    hkv: int = 1,
) -> list[torch.Tensor]:
    """[query, key_cache, value_cache, block_tables, seq_lens, cu_seqlens_q], blocks shuffled;
    ``view``: the value cache is ``key_cache[..., :dv]``."""
    g = torch.Generator().manual_seed(seed)
    lens = [a + b for a, b in zip(q_lens, prefix, strict=True)]
    bsz = len(lens)
    width = max(1, max(-(-n // page) for n in lens))
    nb = bsz * width + 2
    table = torch.randperm(nb, generator=g)[: bsz * width].reshape(bsz, width).to(I32)
    kc = torch.randn(nb, page, hkv, d, generator=g).to(dtype)
    vc = kc[..., :dv] if view else torch.randn(nb, page, hkv, dv, generator=g).to(dtype)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=I32)
    q = torch.randn(sum(q_lens), hq, d, generator=g).to(dtype)
    return [q, kc, vc, table, torch.tensor(lens, dtype=I32), cu]


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    tol = _TOL[dtype]
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def _launch(args: list[torch.Tensor], **kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel on the contract's kernel arguments (no values hook), out and lse pre-filled
    with NaN (a row no program writes stays NaN); ``block_m`` / ``block_n`` pick the tile."""
    tile = {k: kw.pop(k) for k in ("block_m", "block_n") if k in kw}
    rows, hq = args[0].shape[:2]
    lse = torch.full((rows, hq), float("nan"))
    out = torch.full((rows, hq, args[2].shape[3]), float("nan"), dtype=args[0].dtype)
    kernel_args, _ = decls.paged_prefill.check(OP, *args, **kw, lse=lse, out=out)
    pt.launch(*kernel_args, **tile)
    return out, lse


def _check(args: list[torch.Tensor], dtype: torch.dtype, lse_tol: float = 1e-4, **kw: Any) -> None:
    """The kernel (and its out / lse) and the torch backend against the reference."""
    tile = {k: kw.pop(k) for k in ("block_m", "block_n") if k in kw}
    lse_want = torch.empty(args[0].shape[:2])
    want = _prefill.reference(*args, lse=lse_want, **kw)
    assert want.shape == (*args[0].shape[:2], args[2].shape[3])
    got, lse = _launch(args, **kw, **tile)
    _close(got, want, dtype)
    torch.testing.assert_close(lse, lse_want, atol=lse_tol, rtol=lse_tol)
    _close(ops.attention.paged_prefill(*args, **kw, backend="torch"), want, dtype)


@pytest.mark.parametrize("view", [True, False], ids=["value-view", "value-own"])
@pytest.mark.parametrize(
    ("hq", "page", "q_lens", "prefix"),
    [(16, 1, [7, 3], [11, 0]), (16, 16, [19, 0, 1], [5, 9, 30]), (128, 64, [3, 2], [66, 0])],
    ids=["h16-page1", "h16-page16", "h128-page64"],
)
def test_triton_matches_the_reference(
    view: bool, hq: int, page: int, q_lens: list[int], prefix: list[int]
) -> None:
    """The serving tile (32 x 16: two tokens of a 16-head group, or a 128-head group in four
    chunks of 32 heads a token), ragged with and without a cached prefix, an empty sequence."""
    args = _mla(q_lens, prefix, hq=hq, page=page, seed=hq + page, view=view)
    _check(args, torch.bfloat16, scale=SCALE)


def test_small_tiles_many_blocks() -> None:
    """16-row tiles over a 16-head group (one token a program) and 16-key tiles: many query
    blocks and key tiles per sequence, softcap, window, sinks and lse together."""
    args = _mla([21, 6], [13, 40], page=5, dtype=torch.float32, seed=3)
    sinks = torch.randn(16, generator=torch.Generator().manual_seed(4))
    kw = {"scale": SCALE, "softcap": 4.0, "window_left": 17, "sinks": sinks}
    _check(args, torch.float32, block_m=16, block_n=16, **kw)


@pytest.mark.parametrize("view", [True, False], ids=["value-view", "value-own"])
def test_fp8_latent_cache(view: bool) -> None:
    """An fp8 latent cache with its scales (one scale for the shared rows: k_scale = v_scale)."""
    q, kc, vc, table, lens, cu = _mla([9, 4], [20, 3], dtype=torch.float32, seed=10, view=view)
    ks = torch.tensor([0.02])
    vs = ks.clone() if view else torch.tensor([0.015])
    kq = (kc / ks).to(torch.float8_e4m3fn)
    vq = kq[..., :DV] if view else (vc / vs).to(torch.float8_e4m3fn)
    args = [q.bfloat16(), kq, vq, table, lens, cu]
    _check(args, torch.bfloat16, lse_tol=1e-3, scale=SCALE, k_scale=ks, v_scale=vs)


@pytest.mark.parametrize(
    ("d", "dv", "hq", "hkv", "dtype"),
    [
        (192, 128, 8, 2, torch.float16),  # non-absorbed MLA (DeepSeek's nope 128 + rope 64 / v 128)
        (192, 128, 16, 1, torch.bfloat16),  # GQA 16 heads over 1 KV head
        (80, 48, 2, 2, torch.float32),  # a 32-dim tail, one head per KV head
        (64, 64, 4, 1, torch.float16),  # Dv = D (no tail), the value cache the key cache itself
    ],
)
def test_other_value_dims(d: int, dv: int, hq: int, hkv: int, dtype: torch.dtype) -> None:
    args = _mla([10, 5], [7, 0], hq=hq, hkv=hkv, page=5, dtype=dtype, seed=d + dv, d=d, dv=dv, view=False)
    if dv == d:
        args[2] = args[1]
    kw: dict[str, Any] = {"window_left": 9, "sinks": torch.linspace(-1.0, 1.0, hq)}
    _check(args, dtype, lse_tol=1e-3, **kw)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_public_op_and_caller_out(backend: str) -> None:
    """The dispatched op: out [T, Hq, 512] allocated, or the caller's."""
    args = _mla([6, 5], [10, 0], dtype=torch.float32, seed=9)
    want = _prefill.reference(*args, scale=SCALE)
    got = ops.attention.paged_prefill(*args, scale=SCALE, backend=backend)
    assert got.shape == (11, 16, DV)
    _close(got, want, torch.float32)
    out = torch.full((11, 16, DV), float("nan"))
    ops.attention.paged_prefill(*args, scale=SCALE, out=out, backend=backend)
    _close(out, want, torch.float32)


def test_bad_block_id_is_masked_by_the_kernel() -> None:
    """What the CUDA path does without a host check, run through the launcher directly: a bad
    block id's tokens are skipped (the torch backend alike); the CPU contract refuses it first."""
    q, kc, vc, table, lens, cu = _mla([4, 3], [20, 5], seed=6)
    bad = table.clone()
    bad[0, 0] = kc.shape[0] + 3  # sequence 0: its positions 0..15 skipped
    with pytest.raises(ValueError, match=r"block_tables\[0, 0\] = .* out of range"):
        ops.attention.paged_prefill(q, kc, vc, bad, lens, cu, backend="triton")
    got, _ = _launch([q, kc, vc, bad, lens, cu], scale=SCALE)
    kernel_args, out_torch = decls.paged_prefill.check(OP, q, kc, vc, bad, lens, cu, scale=SCALE)
    _prefill.torch_prefill(*kernel_args)  # the torch backend masks alike (no host check either)
    want1 = _prefill.reference(
        q[4:], kc, vc, table[1:], lens[1:], torch.tensor([0, 3], dtype=I32), scale=SCALE
    )
    unmasked = _prefill.reference(q[:4], kc, vc, table[:1], lens[:1], cu[:2], scale=SCALE)
    for out in (got, out_torch):
        _close(out[4:], want1, torch.bfloat16)
        assert torch.isfinite(out[:4]).all()
        assert not torch.allclose(out[:4].float(), unmasked.float(), atol=0.1)  # the page is skipped
    _close(got[:4], out_torch[:4], torch.bfloat16)


def test_contract_rules() -> None:
    q, kc, vc, table, lens, cu = _mla([5, 3], [2, 0], seed=11)
    with pytest.raises(ValueError, match=r"value_cache has head dim 640 and key_cache 576: .*between 1 and"):
        ops.attention.paged_prefill(q, kc, torch.zeros(*kc.shape[:3], 640, dtype=kc.dtype), table, lens, cu)
    with pytest.raises(ValueError, match=r"out has shape \(8, 16, 576\), expected \[8, 16, 512\]"):
        ops.attention.paged_prefill(q, kc, vc, table, lens, cu, out=torch.empty(8, 16, D, dtype=q.dtype))
    with pytest.raises(
        ValueError, match=r"value_cache has shape \(2, 16, 1, 512\), expected \[4, 16, 1, Dv\]"
    ):
        ops.attention.paged_prefill(q, kc, vc[:2], table, lens, cu)


def test_tiles() -> None:
    """MLA's tile: 32 rows against 16 keys at 8 warps whatever the group (a larger group is split
    over programs by the launcher), 16 x 16 for fp32 queries; below 512 dims the tiles as before."""
    assert pt.tile_config(512, 16) == (32, 16, 8, 2)
    assert pt.tile_config(512, 128) == (32, 16, 8, 2)
    assert pt.tile_config(512, 16, fp32=True) == (16, 16, 8, 1)
    assert pt.tile_config(128, 8) == (128, 64, 8, 2) and pt.tile_config(128, 256)[0] == 256
