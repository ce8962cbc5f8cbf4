"""attention.paged_decode with a value head dim below the key's (absorbed MLA: DeepSeek-V2 / V3 /
R1, Kimi): one latent cache [num_blocks, page, 1, 576], V its first 512 dims, passed as
``value_cache = key_cache[..., :512]`` (a view of the same memory) or as a tensor of its own;
out [B, Hq, 512]. The Triton backend in the interpreter and the torch backend against the
reference (a 512 + 64 key tile, the value tile from the key tile for the view, a group of 128
heads split over programs, one split or many, fp8 caches); the contract's rules and messages
(paged_prefill's MLA form: ``test_paged_prefill_mla.py``)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from opmux.kernels import ops
from opmux.kernels.ops.attention import _decode
from opmux.kernels.ops.attention import op as decls

triton_kernels = pytest.importorskip("opmux.kernels.ops.attention.triton_kernels")

OP = "attention.paged_decode"
_TOL = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3, torch.float32: 1e-4}
#: DeepSeek's absorbed MLA: kv_lora_rank 512 + rope 64; softmax scale 1 / sqrt(192)
D, DV, SCALE = 576, 512, 192**-0.5


def _mla(
    lens: list[int],
    hq: int = 16,
    page: int = 16,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    view: bool = True,
    d: int = D,
    dv: int = DV,
    hkv: int = 1,
) -> list[torch.Tensor]:
    """(query, key_cache, value_cache, block_tables, seq_lens), the blocks shuffled."""
    g = torch.Generator().manual_seed(seed)
    bsz = len(lens)
    width = max(1, max(-(-n // page) for n in lens))
    nb = bsz * width + 2
    order = torch.randperm(nb, generator=g)[: bsz * width].reshape(bsz, width).to(torch.int32)
    kc = torch.randn(nb, page, hkv, d, generator=g).to(dtype)
    vc = kc[..., :dv] if view else torch.randn(nb, page, hkv, dv, generator=g).to(dtype)
    q = torch.randn(bsz, hq, d, generator=g).to(dtype)
    return [q, kc, vc, order, torch.tensor(lens, dtype=torch.int32)]


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    tol = _TOL[dtype]
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def _launch(args: list[torch.Tensor], splits: int | None = None, **kw: Any) -> tuple[torch.Tensor, ...]:
    lse = torch.empty(args[0].shape[:2])
    kernel_args, out = decls.paged_decode.check(OP, *args, **kw, lse=lse)
    triton_kernels.launch(*kernel_args, splits=splits)
    return out, lse


@pytest.mark.parametrize("view", [True, False], ids=["value-view", "value-own"])
@pytest.mark.parametrize(
    ("hq", "page", "lens"), [(16, 1, [37, 5]), (16, 16, [100, 1, 0]), (128, 64, [130, 64])]
)
def test_triton_matches_the_reference(view: bool, hq: int, page: int, lens: list[int]) -> None:
    dtype = torch.bfloat16
    args = _mla(lens, hq=hq, page=page, dtype=dtype, seed=hq + page, view=view)
    lse_want = torch.empty(len(lens), hq)
    want = _decode.reference(*args, scale=SCALE, lse=lse_want)
    assert want.shape == (len(lens), hq, DV)
    got, lse = _launch(args, scale=SCALE)
    assert got.shape == (len(lens), hq, DV)
    _close(got, want, dtype)
    torch.testing.assert_close(lse, lse_want, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_split_or_many_softcap_sinks(dtype: torch.dtype) -> None:
    args = _mla([150, 40], hq=16, page=16, dtype=dtype, seed=7)
    kw = {
        "scale": SCALE,
        "softcap": 3.0,
        "sinks": torch.randn(16, generator=torch.Generator().manual_seed(8)),
    }
    one, lse1 = _launch(args, 1, **kw)
    many, lse_many = _launch(args, 3, **kw)
    _close(many, one, dtype)
    torch.testing.assert_close(lse_many, lse1, atol=1e-5, rtol=1e-5)
    _close(one, _decode.reference(*args, **kw), dtype)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_public_op_and_backends(backend: str) -> None:
    """The dispatched op: out [B, Hq, 512] allocated, or the caller's (the value view of the key
    cache is no overlap: both are read-only inputs); the window too."""
    args = _mla([80, 33], hq=16, page=16, dtype=torch.float32, seed=9)
    want = _decode.reference(*args, scale=SCALE, window_left=40)
    got = ops.attention.paged_decode(*args, scale=SCALE, window_left=40, backend=backend)
    assert got.shape == (2, 16, DV)
    _close(got, want, torch.float32)
    out = torch.full((2, 16, DV), float("nan"))
    lse = torch.empty(2, 16)
    ops.attention.paged_decode(*args, scale=SCALE, window_left=40, lse=lse, out=out, backend=backend)
    _close(out, want, torch.float32)


@pytest.mark.parametrize("view", [True, False], ids=["value-view", "value-own"])
def test_fp8_latent_cache(view: bool) -> None:
    """An fp8 latent cache with its scales (one scale for the shared rows: k_scale = v_scale)."""
    q, kc, vc, table, lens = _mla([60, 17], hq=16, page=16, dtype=torch.float32, seed=10, view=view)
    ks = torch.tensor([0.02])
    vs = ks.clone() if view else torch.tensor([0.015])
    kq = (kc / ks).to(torch.float8_e4m3fn)
    vq = kq[..., :DV] if view else (vc / vs).to(torch.float8_e4m3fn)
    args = [q.bfloat16(), kq, vq, table, lens]
    kw = {"scale": SCALE, "k_scale": ks, "v_scale": vs}
    want = _decode.reference(*args, **kw)
    for backend in ("triton", "torch"):
        _close(ops.attention.paged_decode(*args, **kw, backend=backend), want, torch.bfloat16)


@pytest.mark.parametrize(("d", "dv", "hq", "hkv"), [(192, 128, 8, 2), (80, 48, 2, 2), (64, 64, 4, 1)])
def test_other_value_dims(d: int, dv: int, hq: int, hkv: int) -> None:
    """Dv < D off MLA's shapes (a tail of 64 and of 32 key dims; one head per KV head: the
    elementwise path), and Dv = D with the value cache the key cache itself."""
    args = _mla([45, 20], hq=hq, hkv=hkv, page=5, dtype=torch.float16, seed=d + dv, d=d, dv=dv, view=False)
    if dv == d:
        args[2] = args[1]
    want = _decode.reference(*args)
    _close(ops.attention.paged_decode(*args, backend="triton"), want, torch.float16)


def test_tiles() -> None:
    assert triton_kernels.group_tile(1, 512) == 1
    assert triton_kernels.group_tile(128, 512) == 16  # MLA's 128 heads: 8 programs of 16
    assert triton_kernels.group_tile(4, 128) == 16 and triton_kernels.group_tile(64, 128) == 64
    assert triton_kernels.tile_config(512)[:2] == (16, 8)
    kc = torch.zeros(3, 4, 1, D)
    assert triton_kernels.value_is_key_prefix(kc, kc[..., :DV])
    assert not triton_kernels.value_is_key_prefix(kc, kc[..., 64:])
    assert not triton_kernels.value_is_key_prefix(kc, kc[..., :DV].contiguous())


def test_contract_rules() -> None:
    q, kc, vc, table, lens = _mla([20, 7], seed=11)
    with pytest.raises(ValueError, match=r"value_cache has head dim 640 and key_cache 576: .*between 1 and"):
        ops.attention.paged_decode(q, kc, torch.zeros(*kc.shape[:3], 640, dtype=kc.dtype), table, lens)
    with pytest.raises(ValueError, match=r"out has shape \(2, 16, 576\), expected \[2, 16, 512\]"):
        ops.attention.paged_decode(q, kc, vc, table, lens, out=torch.empty(2, 16, D, dtype=q.dtype))
    with pytest.raises(
        ValueError, match=r"value_cache has shape \(4, 16, 1, 512\), expected \[6, 16, 1, Dv\]"
    ):
        ops.attention.paged_decode(q, kc, vc[:4], table, lens)
    with pytest.raises(
        ValueError, match=r"key_cache has shape .*expected \[num_blocks, page_size, Hkv, 576\]"
    ):
        ops.attention.paged_decode(q, vc, vc, table, lens)  # the key cache still follows the query
