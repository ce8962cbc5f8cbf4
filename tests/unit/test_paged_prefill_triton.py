"""The Triton backend of attention.paged_prefill beyond the parity samples, in the interpreter:
ragged batches with empty and non-empty prefixes and empty sequences, at the serving tile and at
small tiles (many query blocks and key tiles per program, every row written); plain causal
prefill against torch's SDPA (an independent oracle); extend equal to the tail of a full
prefill; every feature and odd page sizes against the reference; the CUDA-style clamping of bad
offsets, lengths and block ids (the launcher called directly: on the CPU the values hook refuses
them first); the kernel compiled for sm_90 outside the interpreter."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from opmux.kernels import ops
from opmux.kernels.ops.attention import _prefill
from opmux.kernels.ops.attention import op as decls

pt = pytest.importorskip("opmux.kernels.ops.attention._prefill_triton")

_TOL = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3, torch.float32: 1e-4}
OP = "attention.paged_prefill"
I32 = torch.int32


def _problem(
    q_lens: list[int],
    prefix: list[int],
    hq: int = 4,
    hkv: int = 2,
    d: int = 64,
    page: int = 16,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> list[torch.Tensor]:
    """[query, key_cache, value_cache, block_tables, seq_lens, cu_seqlens_q], blocks shuffled."""
    g = torch.Generator().manual_seed(seed)
    lens = [a + b for a, b in zip(q_lens, prefix, strict=True)]
    bsz = len(lens)
    width = max(1, max(-(-n // page) for n in lens))
    nb = bsz * width + 2
    table = torch.randperm(nb, generator=g)[: bsz * width].reshape(bsz, width).to(I32)
    return [
        torch.randn(sum(q_lens), hq, d, generator=g).to(dtype),
        torch.randn(nb, page, hkv, d, generator=g).to(dtype),
        torch.randn(nb, page, hkv, d, generator=g).to(dtype),
        table,
        torch.tensor(lens, dtype=I32),
        torch.tensor([0, *torch.tensor(q_lens, dtype=torch.long).cumsum(0).tolist()], dtype=I32),
    ]


def _launch(args: list[torch.Tensor], **kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel on the contract's kernel arguments (no values hook), out and lse pre-filled
    with NaN (a row no program writes stays NaN); ``block_m`` / ``block_n`` pick the tile."""
    tile = {k: kw.pop(k) for k in ("block_m", "block_n", "split") if k in kw}
    rows, hq = args[0].shape[:2]
    lse = torch.full((rows, hq), float("nan"))
    out = torch.full(args[0].shape, float("nan"), dtype=args[0].dtype)
    kernel_args, _ = decls.paged_prefill.check(OP, *args, **kw, lse=lse, out=out)
    pt.launch(*kernel_args, **tile)
    return out, lse


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    tol = _TOL[dtype]
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tile", [{}, {"block_m": 16, "block_n": 16}])
def test_ragged_batch_prefix_zero_and_not(dtype: torch.dtype, tile: dict[str, int]) -> None:
    """Sequences with no prefix, a prefix, no new token, one new token; 16-row tiles give
    several query blocks per sequence (4 tokens of a 4-head group each) and key tiles."""
    args = _problem([19, 0, 9, 1, 6], [0, 5, 23, 40, 0], page=5, dtype=dtype, seed=1)
    lse_want = torch.empty(args[0].shape[:2])
    want = _prefill.reference(*args, lse=lse_want)
    got, lse = _launch(args, **tile)
    _close(got, want, dtype)
    torch.testing.assert_close(lse, lse_want, atol=1e-4, rtol=1e-5)


def test_public_op_and_torch_backend() -> None:
    args = _problem([12, 3], [7, 0], hq=8, hkv=2, page=3, seed=2)
    want = _prefill.reference(*args)
    for backend in ("triton", "torch"):
        _close(ops.attention.paged_prefill(*args, backend=backend), want, torch.float32)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_causal_prefill_matches_sdpa(backend: str) -> None:
    """An empty prefix is plain causal attention: against torch SDPA on the contiguous K / V."""
    hq, hkv, d, page, lens = 4, 2, 64, 7, [20, 11]
    args = _problem(lens, [0, 0], hq=hq, hkv=hkv, d=d, page=page, seed=3)
    q, kc, vc, table, _, cu = args
    got = ops.attention.paged_prefill(*args, backend=backend)
    for b, n in enumerate(lens):
        pos = torch.arange(n)
        blocks = table[b].long()[pos // page]
        k, v = kc[blocks, pos % page], vc[blocks, pos % page]  # [n, Hkv, D]
        qb = q[int(cu[b]) : int(cu[b + 1])].transpose(0, 1)  # [Hq, n, D]
        rep = hq // hkv
        want = torch.nn.functional.scaled_dot_product_attention(
            qb,
            k.transpose(0, 1).repeat_interleave(rep, 0),
            v.transpose(0, 1).repeat_interleave(rep, 0),
            is_causal=True,
        )
        _close(got[int(cu[b]) : int(cu[b + 1])], want.transpose(0, 1), torch.float32)


def test_extend_is_the_tail_of_a_full_prefill() -> None:
    """The same sequence as one prefill of 30 tokens or an extend of its last 8 over a 22-token
    prefix: the last 8 rows agree (the causal mask aligned to the end of the KV)."""
    q, kc, vc, table, lens, _ = _problem([30], [0], page=4, seed=4)
    full, _ = _launch([q, kc, vc, table, lens, torch.tensor([0, 30], dtype=I32)], block_m=16, block_n=16)
    tail, _ = _launch([q[22:], kc, vc, table, lens, torch.tensor([0, 8], dtype=I32)], block_m=16, block_n=16)
    torch.testing.assert_close(tail, full[22:], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(tail, full[:8], atol=1e-2)  # the rows differ by their position


def _fp8(args: list[torch.Tensor]) -> tuple[list[torch.Tensor], dict[str, Any]]:
    ks, vs = torch.tensor([0.02]), torch.tensor([0.015])
    kq = (args[1].float() / ks).to(torch.float8_e4m3fn)
    vq = (args[2].float() / vs).to(torch.float8_e4m3fn)
    return [args[0], kq, vq, *args[3:]], {"k_scale": ks, "v_scale": vs}


_SINKS = torch.tensor([0.5, -1.0, 2.0, 0.0])
FEATURES: list[tuple[str, dict[str, Any]]] = [
    ("softcap", {"softcap": 2.0}),
    ("window-3", {"window_left": 3}),
    ("window-0", {"window_left": 0}),
    ("sinks", {"sinks": _SINKS}),
    ("scale", {"scale": 0.05}),
    ("all", {"softcap": 5.0, "window_left": 10, "sinks": _SINKS}),
]


@pytest.mark.parametrize(("name", "kw"), FEATURES, ids=[f[0] for f in FEATURES])
@pytest.mark.parametrize("fp8", [False, True], ids=["plain", "fp8"])
def test_features(name: str, kw: dict[str, Any], fp8: bool) -> None:
    args = _problem([13, 5, 0], [9, 0, 4], page=5, dtype=torch.bfloat16, seed=5)
    if fp8:
        args, scales = _fp8(args)
        kw = {**kw, **scales}
    lse_want = torch.empty(args[0].shape[:2])
    want = _prefill.reference(*args, lse=lse_want, **kw)
    got, lse = _launch(args, block_m=16, block_n=16, **kw)
    _close(got, want, torch.bfloat16)
    torch.testing.assert_close(lse, lse_want, atol=1e-3, rtol=1e-4)
    _close(ops.attention.paged_prefill(*args, backend="torch", **kw), want, torch.bfloat16)


@pytest.mark.parametrize(
    ("d", "hq", "hkv", "page"),
    [(80, 8, 1, 5), (96, 4, 1, 16), (128, 8, 2, 128), (256, 2, 2, 8), (64, 3, 1, 1), (64, 32, 4, 33)],
)
def test_head_dims_groups_and_pages(d: int, hq: int, hkv: int, page: int) -> None:
    args = _problem([9, 4], [6, 0], hq=hq, hkv=hkv, d=d, page=page, dtype=torch.float16, seed=d + hq + page)
    want = _prefill.reference(*args, window_left=7)
    _close(ops.attention.paged_prefill(*args, window_left=7, backend="triton"), want, torch.float16)


def test_bad_indices_are_clamped_and_masked_by_the_kernel() -> None:
    """What the CUDA path does without a host check, run through the launcher directly: a length
    past the table's capacity is clamped to it; a bad block id's tokens are skipped; offsets past
    query's rows are clamped to them (the rows beyond stay unwritten, nothing is read there)."""
    q, kc, vc, table, lens, cu = _problem([5, 6, 4], [35, 10, 20], page=16, seed=6)
    nb, cap = kc.shape[0], table.shape[1] * kc.shape[1]
    bad_table = table.clone()
    bad_table[1, 0] = nb + 5  # sequence 1: its positions 0..15 skipped
    bad_lens = torch.tensor([10_000, 16, 24], dtype=I32)  # sequence 0: clamped to the capacity
    with pytest.raises(ValueError, match="out of range"):  # the CPU contract refuses both
        ops.attention.paged_prefill(q, kc, vc, bad_table, lens, cu, backend="triton")
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = 10000"):
        ops.attention.paged_prefill(q, kc, vc, table, bad_lens, cu, backend="triton")
    got, _ = _launch([q, kc, vc, bad_table, bad_lens, cu], block_m=16, block_n=16)
    kernel_args, out_torch = decls.paged_prefill.check(OP, q, kc, vc, bad_table, bad_lens, cu)
    _prefill.torch_prefill(*kernel_args)  # the torch backend masks alike (no host check either)
    # the reference over the sequences as the kernel sees them (sequence 1 without block 0)
    want0 = _prefill.reference(q[:5], kc, vc, table[:1], torch.tensor([cap], dtype=I32), cu[:2])
    want2 = _prefill.reference(q[11:], kc, vc, table[2:], lens[2:], torch.tensor([0, 4], dtype=I32))
    for out in (got, out_torch):
        _close(out[:5], want0, torch.float32)
        _close(out[11:], want2, torch.float32)
        assert torch.isfinite(out[5:11]).all()
    bad_cu = torch.tensor([0, 5, 11, 40], dtype=I32)  # past query's 15 rows: clamped
    got, lse = _launch([q, kc, vc, table, torch.tensor([40, 16, 40], dtype=I32), bad_cu])
    assert torch.isfinite(got).all() and torch.isfinite(lse).all()


@pytest.mark.parametrize("mask_prefix", [True, False])
def test_a_custom_mask_is_read_only(mask_prefix: bool) -> None:
    """The definition and both CPU backends leave the caller's mask as it was (with a window,
    which narrows each row's keys after the mask is read)."""
    q, kc, vc, table, lens, cu = _problem([6, 3], [10, 4], page=16, seed=8)
    g = torch.Generator().manual_seed(8)
    mask = torch.rand(6 * 16 + 3 * 7, generator=g) < 0.7
    kw: dict[str, Any] = {
        "custom_mask": mask,
        "mask_indptr": torch.tensor([0, 96, 117]),
        "mask_prefix": mask_prefix,
    }
    before = mask.clone()
    want = _prefill.reference(q, kc, vc, table, lens, cu, window_left=3, **kw)
    assert torch.equal(mask, before)
    for backend in ("torch", "triton"):
        _close(
            ops.attention.paged_prefill(q, kc, vc, table, lens, cu, window_left=3, backend=backend, **kw),
            want,
            q.dtype,
        )
        assert torch.equal(mask, before)


def test_bad_mask_offsets_read_as_false() -> None:
    """What the CUDA path does with a custom mask's offsets unchecked (no host read), through the
    launcher and the torch backend: entries outside ``custom_mask`` read as False, so a sequence
    whose offset points before or past it sees nothing (0, lse -inf); the CPU contract refuses
    those offsets."""
    q, kc, vc, table, lens, cu = _problem([5, 6, 4], [35, 10, 20], page=16, seed=7)
    mask = torch.ones(5 * 40 + 6 * 16 + 4 * 24, dtype=torch.bool)
    bad = torch.tensor([0, -1000, 1 << 40, mask.numel()])
    with pytest.raises(ValueError, match="mask_indptr"):
        ops.attention.paged_prefill(q, kc, vc, table, lens, cu, custom_mask=mask, mask_indptr=bad)
    args = [q, kc, vc, table, lens, cu]
    got, lse = _launch(args, custom_mask=mask, mask_indptr=bad, block_m=16, block_n=16)
    kernel_args, out_torch = decls.paged_prefill.check(OP, *args, custom_mask=mask, mask_indptr=bad)
    _prefill.torch_prefill(*kernel_args)
    want0 = _prefill.reference(
        q[:5], kc, vc, table[:1], lens[:1], cu[:2], custom_mask=mask[:200], mask_indptr=torch.tensor([0, 200])
    )
    for out in (got, out_torch):
        _close(out[:5], want0, torch.float32)
        assert bool((out[5:] == 0).all())
    assert bool(torch.isfinite(lse[:5]).all()) and bool((lse[5:] == float("-inf")).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "kw",
    [{}, {"softcap": 2.0, "sinks": _SINKS}, {"window_left": 5}],
    ids=["plain", "softcap-sinks", "window"],
)
def test_split_runs_the_tiles_below_the_diagonal_unmasked(kw: dict[str, Any], dtype: torch.dtype) -> None:
    """``split=True`` (the kernel's SPLIT): long prefixes and prompts, so that both the unmasked
    loop and the diagonal's masked one run several 16-key tiles per query block; a window keeps
    the masked loop alone. Same output and LSE as the reference."""
    args = _problem([37, 1, 20, 3], [50, 70, 0, 16], page=5, dtype=dtype, seed=9)
    lse_want = torch.empty(args[0].shape[:2])
    want = _prefill.reference(*args, lse=lse_want, **kw)
    for tile in ({"block_m": 16, "block_n": 16}, {"block_m": 32, "block_n": 32}):
        got, lse = _launch(args, split=True, **tile, **kw)
        _close(got, want, dtype)
        torch.testing.assert_close(lse, lse_want, atol=1e-3, rtol=1e-4)


def test_split_skips_a_bad_block_in_the_unmasked_tiles() -> None:
    """A bad block id below the diagonal: the unmasked loop's column bias drops its tokens as the
    masked loop does (the two launches agree), and nothing non-finite comes out; so with lengths
    shorter than the new tokens."""
    q, kc, vc, table, lens, cu = _problem([5, 6], [40, 33], page=8, seed=10)
    bad = table.clone()
    bad[0, 1] = kc.shape[0] + 3  # positions 8..15 of sequence 0: inside the first unmasked tiles
    bad[1, 0] = -1
    got, lse = _launch([q, kc, vc, bad, lens, cu], block_m=16, block_n=16, split=True)
    ref, lse_ref = _launch([q, kc, vc, bad, lens, cu], block_m=16, block_n=16)
    assert torch.isfinite(got).all() and torch.isfinite(lse).all()
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, lse_ref, atol=1e-5, rtol=1e-5)
    full = _prefill.reference(q, kc, vc, table, lens, cu)
    assert not torch.allclose(got[:5], full[:5], atol=1e-3)  # the block's tokens really are gone
    # lengths below the new tokens' count (a negative prefix: what a bad length gives the CUDA
    # path, which has no host check): the two loops still agree, nothing non-finite
    short = torch.tensor([3, 40], dtype=I32)
    got, lse = _launch([q, kc, vc, table, short, cu], block_m=16, block_n=16, split=True)
    ref, lse_ref = _launch([q, kc, vc, table, short, cu], block_m=16, block_n=16)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5, equal_nan=True)
    torch.testing.assert_close(lse, lse_ref, atol=1e-5, rtol=1e-5, equal_nan=True)


def test_cu_seqlens_refused_on_the_cpu() -> None:
    args = _problem([5, 3], [2, 0], seed=7)
    for cu, match in (([0, 2, 8], "sequence 1 has 6 new tokens"), ([0, 5, 9], "but query has 8 rows")):
        with pytest.raises(ValueError, match=match):
            ops.attention.paged_prefill(*args[:5], torch.tensor(cu, dtype=I32), backend="triton")


_COMPILE = """
import os, re, subprocess, tempfile, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from opmux.kernels.ops.attention import _prefill_triton as pt

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
PTXAS = next((p for p in (os.path.join(BIN, n) for n in ("ptxas-blackwell", "ptxas")) if os.path.exists(p)), None)
STRIDES = ("sq_t", "sq_h", "sk_b", "sk_p", "sk_h", "sv_b", "sv_p", "sv_h", "so_t", "so_h")
ALL = dict(SOFTCAP=True, WINDOW=True, HAS_SINKS=True, HAS_LSE=True)
MLA = dict(BLOCK_DR=64, HAS_TAIL=True)  # 512 value dims + 64 rope dims of the keys
FORMS = [  # (q dtype, cache dtype, (value) head dim, group, page, flags)
    ("bf16", "fp8e4nv", 128, 4, 16, dict(FP8=True, **ALL)),
    ("fp16", "fp16", 256, 2, 5, {}),
    ("bf16", "bf16", 64, 8, 1, dict(HAS_LSE=True)),
    ("fp32", "fp32", 128, 4, 16, dict(DOT_F32=True)),
    ("bf16", "bf16", 512, 16, 16, dict(V_FROM_K=True, **MLA, **ALL)),
    ("bf16", "bf16", 512, 128, 64, dict(**MLA, **ALL)),
    ("bf16", "fp8e4nv", 512, 128, 16, dict(FP8=True, V_FROM_K=True, **MLA, **ALL)),
    ("bf16", "fp8e4nv", 512, 16, 1, dict(FP8=True, **MLA)),
    ("fp16", "fp16", 128, 8, 16, dict(**MLA, **ALL)),  # non-absorbed: D 192, Dv 128
    ("fp32", "fp32", 512, 16, 16, dict(DOT_F32=True, V_FROM_K=True, **MLA)),
    ("bf16", "bf16", 128, 4, 16, dict(SPLIT=True, HAS_LSE=True)),  # the sweep's unmasked-interior form
    ("bf16", "bf16", 128, 4, 16, dict(HAS_MASK=True, MASK_PREFIX=False, WINDOW=True, HAS_LSE=True)),  # tree mask
    ("bf16", "fp8e4nv", 128, 4, 16, dict(FP8=True, HAS_MASK=True, **ALL)),
    ("fp16", "fp16", 256, 2, 5, dict(HAS_MASK=True)),
    ("bf16", "bf16", 512, 16, 16, dict(V_FROM_K=True, HAS_MASK=True, **MLA, **ALL)),
    ("bf16", "bf16", 128, 4, 16, dict(CAUSAL=False, HAS_LSE=True)),  # non-causal (encoder / vision)
]
for qdt, cache, block_d, g, page, flags in FORMS:
    bm, bn, warps, stages = pt.tile_config(block_d, g, qdt == "fp32")
    bn = pt.masked_block_n(bn) if flags.get("HAS_MASK") else bn  # the launcher's tile for a mask
    gc = min(g, bm)  # the launcher's head chunk
    const = dict(G=g, GC=gc, PAGE_SIZE=page, BLOCK_M=bm, BLOCK_Q=bm // gc, BLOCK_DV=block_d, BLOCK_DR=16,
                 BLOCK_N=bn, DOT_F32=False, FP8=False, SOFTCAP=False, WINDOW=False, HAS_SINKS=False,
                 HAS_LSE=False, HAS_TAIL=False, V_FROM_K=False, SPLIT=False, HAS_MASK=False, MASK_PREFIX=True, CAUSAL=True)
    const.update(flags)
    sig = {}
    for n in pt._prefill.arg_names:
        if n in const:
            sig[n] = "constexpr"
        elif n in ("Q", "OUT"):
            sig[n] = "*" + qdt
        elif n in ("KC", "VC"):
            sig[n] = "*" + cache
        elif n in ("BT", "LENS", "CU"):
            sig[n] = "*i32"
        elif n in ("CM", "MI"):  # the custom mask as bytes, its int64 offsets
            sig[n] = "*u8" if n == "CM" else "*i64"
        elif n[0].isupper() and n not in ("D", "DV", "CHUNKS"):
            sig[n] = "*fp32"
        else:
            sig[n] = "fp32" if n in ("sm_scale", "softcap") else "i32"
    names = pt._prefill.arg_names
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig[n][0] == "*" or n in STRIDES}
    k = triton.compile(ASTSource(pt._prefill, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": warps, "num_stages": stages})
    if PTXAS and qdt != "fp32":  # the tile choice: no spills on sm_90 (fp32: a correctness form)
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "k.ptx")
            open(src, "w").write(k.asm["ptx"])
            r = subprocess.run([PTXAS, "-arch=sm_90a", "-v", src, "-o", os.path.join(tmp, "k.o")],
                               capture_output=True, text=True)
        spill = re.search(r"(\\d+) bytes spill stores", r.stderr)
        assert r.returncode == 0 and spill and spill.group(1) == "0", (qdt, cache, block_d, g, r.stderr[-800:])
print("compiled")
"""


def test_kernel_compiles_for_sm90() -> None:
    """The interpreter runs what the compiler may refuse: the kernel compiled for an H100 / H200
    (sm_90, no GPU needed) outside the interpreter, at tile_config's tiles, in sixteen forms (fp8 with
    every feature, D 256 with an odd page, MQA-like groups of 8 with one-token pages, fp32; MLA's
    512 + 64 with the value view and a value cache of its own, groups of 16 and of 128 (chunks of
    32 heads), bf16 and fp8 caches, D 192 / Dv 128; the split loop at the bf16 128-dim tile; custom masks
    at 128 / 256 / MLA's dims, with every feature, on the launcher's masked tile; non-causal), and
    where Triton ships ptxas, none of the bf16 / fp16 ones spills (fp32 queries, a correctness
    form, may)."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "compiled" in r.stdout, r.stderr[-3000:]


def test_a_minus_inf_sink_with_a_window() -> None:
    """A -inf sink (no sink for that head) where a row's first key tile is all outside its window
    (query blocks taller than key tiles): the running max must not start at -inf (exp2(-inf -
    -inf) = NaN for every later tile of the row)."""
    args = _problem([40, 5], [40, 0], page=4, seed=5)
    kw: dict[str, Any] = {"sinks": torch.tensor([float("-inf"), 0.5, -1.0, 2.0]), "window_left": 3}
    lse_want = torch.empty(args[0].shape[:2])
    want = _prefill.reference(*args, lse=lse_want, **kw)
    got, lse = _launch(args, block_m=64, block_n=16, **kw)
    _close(got, want, torch.float32)
    torch.testing.assert_close(lse, lse_want, atol=1e-4, rtol=1e-4)


class _Spy:
    """The kernel launched as before, each launch's keyword arguments (constexprs, warps) kept."""

    def __init__(self, kernel: Any) -> None:
        self.kernel, self.seen = kernel, []

    def __getitem__(self, grid: Any) -> Any:
        launch = self.kernel[grid]

        def run(*args: Any, **kw: Any) -> Any:
            self.seen.append(kw)
            return launch(*args, **kw)

        return run


def test_the_launch_comes_from_a_tuned_table(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A table for (padded value head dim, group) on this device picks the 16-bit launch (its
    nearest-M entry, SPLIT included); a malformed entry is warned about and skipped (tile_config
    then); fp32 queries never read a table; explicit overrides win."""
    import json
    import warnings

    from opmux.kernels import _env, tuned

    spy = _Spy(pt._prefill)
    monkeypatch.setattr(pt, "_prefill", spy)
    args = _problem([20, 12], [9, 0], hq=4, hkv=2, d=64, page=5, dtype=torch.bfloat16, seed=11)
    want = _prefill.reference(*args)
    name = tuned.table_key(OP, "triton", "cpu", (64, 2)).file_name()
    assert name == "DV=64,G=2,device_name=cpu.json"
    table = {
        "16": {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1, "SPLIT": 1},
        "512": {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2},
    }
    (tmp_path / name).write_text(json.dumps(table), encoding="utf-8")
    with _env.scope(OPMUX_TUNED_CONFIG_DIR=str(tmp_path)):
        tuned.refresh()
        try:
            got, _ = _launch(args)  # 32 rows: the M = 16 entry
            _close(got, want, torch.bfloat16)
            kw = spy.seen[-1]
            assert (kw["BLOCK_M"], kw["BLOCK_N"], kw["num_warps"], kw["num_stages"], kw["SPLIT"]) == (
                16,
                16,
                4,
                1,
                True,
            )
            _launch(args, block_n=32, split=False)  # explicit arguments override the table's
            assert (spy.seen[-1]["BLOCK_N"], spy.seen[-1]["SPLIT"]) == (32, False)
            f32 = [a.float() if a.is_floating_point() else a for a in args]
            _launch(f32)
            assert spy.seen[-1]["BLOCK_M"] == pt.tile_config(64, 2, True)[0] and not spy.seen[-1]["SPLIT"]
            (tmp_path / name).write_text(json.dumps({"16": {**table["16"], "BLOCK_M": 24}}), encoding="utf-8")
            tuned.refresh()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                _launch(args)
            assert any("BLOCK_M=24" in str(w.message) for w in caught), [str(w.message) for w in caught]
            assert spy.seen[-1]["BLOCK_M"] == pt.tile_config(64, 2)[0]
        finally:
            tuned.refresh()
