"""The Triton backend of attention.paged_decode beyond the parity samples, in the interpreter: one
split or many give the same result; a 2k-token context at D=128; the head dims 96 and 256 and a
GQA group of 16 (the dot path's tile exactly); seq_len 0 (zeros and lse -inf, or the sink); the
CUDA-style clamping of a length past the table and the masking of bad block ids (the launcher
called directly: on the CPU the values hook refuses them before a kernel runs); the split
heuristic."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from opmux.kernels import ops
from opmux.kernels.ops import _triton_pdl
from opmux.kernels.ops.attention import _decode
from opmux.kernels.ops.attention import op as decls

triton_kernels = pytest.importorskip("opmux.kernels.ops.attention.triton_kernels")

_TOL = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3, torch.float32: 1e-4}
OP = "attention.paged_decode"


def _problem(
    lens: list[int],
    hq: int = 4,
    hkv: int = 2,
    d: int = 64,
    page: int = 16,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    width: int = 0,
) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    bsz = len(lens)
    width = width or max(1, max(-(-n // page) for n in lens))
    nb = bsz * width + 2
    order = torch.randperm(nb, generator=g)[: bsz * width].reshape(bsz, width).to(torch.int32)
    return [
        torch.randn(bsz, hq, d, generator=g).to(dtype),
        torch.randn(nb, page, hkv, d, generator=g).to(dtype),
        torch.randn(nb, page, hkv, d, generator=g).to(dtype),
        order,
        torch.tensor(lens, dtype=torch.int32),
    ]


def _launch(
    args: list[torch.Tensor], splits: int | None = None, tile: Any = None, **kw: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """The launcher on the contract's kernel arguments (no values hook), with an lse."""
    lse = torch.empty(args[0].shape[:2])
    kernel_args, out = decls.paged_decode.check(OP, *args, **kw, lse=lse)
    triton_kernels.launch(*kernel_args, splits=splits, tile=tile)
    return out, lse


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    tol = _TOL[dtype]
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_split_or_many_agree(dtype: torch.dtype) -> None:
    args = _problem([300, 130, 1], hq=8, hkv=2, page=16, dtype=dtype, seed=1)
    kw = {"softcap": 10.0, "sinks": torch.randn(8, generator=torch.Generator().manual_seed(2))}
    one, lse1 = _launch(args, 1, **kw)
    for splits in (3, 7):
        many, lse_many = _launch(args, splits, **kw)
        _close(many, one, dtype)
        torch.testing.assert_close(lse_many, lse1, atol=1e-5, rtol=1e-5)
    want = _decode.reference(*args, **kw)
    _close(one, want, dtype)


@pytest.mark.parametrize("block_n", [16, 64])
def test_prefetched_tiles_agree(block_n: int) -> None:
    """The register double buffer (each step loads the next tile first) and other key tiles give
    the plain loop's result: a ragged batch whose sequences end mid-tile and mid-page, a window, a
    bad block id masked, one split and several."""
    args = _problem([300, 130, 1, 0], hq=8, hkv=2, page=16, dtype=torch.float32, seed=11)
    args[3][1, 2] = args[1].shape[0] + 5  # masked by the kernel (the launcher: no values hook)
    kw = {"window_left": 200}
    plain, lse_plain = _launch(args, 3, triton_kernels.TileConfig(32, 4, 1, False), **kw)
    for tile in (
        triton_kernels.TileConfig(block_n, 4, 2, True),
        triton_kernels.TileConfig(block_n, 4, 1, False),
    ):
        for splits in (1, 3):
            got, lse = _launch(args, splits, tile, **kw)
            _close(got, plain, torch.float32)
            torch.testing.assert_close(lse, lse_plain, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_2k_context_d128(dtype: torch.dtype) -> None:
    args = _problem([2048], hq=8, hkv=1, d=128, page=32, dtype=dtype, seed=3)
    lse_want = torch.empty(1, 8)
    want = _decode.reference(*args, lse=lse_want)
    got, lse = _launch(args)
    _close(got, want, dtype)
    torch.testing.assert_close(lse, lse_want, atol=1e-4, rtol=1e-5)
    # the public op takes the same path (the splits from the heuristic)
    _close(ops.attention.paged_decode(*args, backend="triton"), want, dtype)


@pytest.mark.parametrize(
    ("d", "hq", "hkv", "page"), [(96, 4, 1, 16), (256, 2, 2, 8), (256, 4, 2, 128), (64, 16, 1, 3)]
)
def test_head_dims_and_groups(d: int, hq: int, hkv: int, page: int) -> None:
    args = _problem([70, 5], hq=hq, hkv=hkv, d=d, page=page, dtype=torch.float16, seed=d + hq)
    want = _decode.reference(*args, window_left=50)
    _close(ops.attention.paged_decode(*args, window_left=50, backend="triton"), want, torch.float16)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_empty_sequence(backend: str) -> None:
    args = _problem([0, 9, 0], seed=4)
    out = torch.full((3, 4, 64), float("nan"))
    lse = torch.zeros(3, 4)
    ops.attention.paged_decode(*args, lse=lse, out=out, backend=backend)
    assert torch.equal(out[0], torch.zeros(4, 64)) and torch.equal(out[2], torch.zeros(4, 64))
    assert torch.isneginf(lse[0]).all() and torch.isneginf(lse[2]).all() and torch.isfinite(lse[1]).all()
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    ops.attention.paged_decode(*args, sinks=sinks, lse=lse, out=out, backend=backend)
    assert torch.equal(out[0], torch.zeros(4, 64))
    torch.testing.assert_close(lse[0], sinks)


def test_bad_indices_are_clamped_and_masked_by_the_kernel() -> None:
    """What the CUDA path does without a host check, run through the launcher directly: a length
    past the table's capacity is clamped to it; a bad block id's tokens are skipped (here the last
    block a sequence uses, so the result is the reference's over the positions before it)."""
    args = _problem([40, 20, 30], page=16, seed=5)
    q, kc, vc, table, lens = args
    nb = kc.shape[0]
    bad_table = table.clone()
    bad_table[1, 1] = nb + 5  # sequence 1 (20 tokens): positions 16..19 skipped
    bad_table[2, 1] = -7  # sequence 2 (30 tokens): positions 16..29 skipped
    bad_lens = torch.tensor([10_000, 20, 30], dtype=torch.int32)  # sequence 0: clamped to 48
    with pytest.raises(ValueError, match="out of range"):  # the CPU contract refuses both
        ops.attention.paged_decode(q, kc, vc, bad_table, lens, backend="triton")
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = 10000"):
        ops.attention.paged_decode(q, kc, vc, table, bad_lens, backend="triton")
    cap = table.shape[1] * kc.shape[1]
    want = _decode.reference(q, kc, vc, table, torch.tensor([cap, 16, 16], dtype=torch.int32))
    got, _ = _launch([q, kc, vc, bad_table, bad_lens])
    _close(got, want, torch.float32)
    kernel_args, out = decls.paged_decode.check(OP, q, kc, vc, bad_table, bad_lens)
    _decode.torch_decode(*kernel_args)  # the torch backend masks alike (no host check either)
    _close(out, want, torch.float32)


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the CUDA path (no host check of the indices) needs a GPU"
)
def test_cuda_skips_bad_blocks_without_a_sync() -> None:
    args = [t.cuda() for t in _problem([40, 20], page=16, seed=6)]
    q, kc, vc, table, lens = args
    table[1, 1] = kc.shape[0] + 3
    got = ops.attention.paged_decode(q, kc, vc, table, lens, backend="triton")
    want = _decode.reference(
        q.cpu(), kc.cpu(), vc.cpu(), table.cpu(), torch.tensor([40, 16], dtype=torch.int32)
    )
    _close(got.cpu(), want, torch.float32)


def test_pdl_only_on_cuda_sm90(monkeypatch: pytest.MonkeyPatch) -> None:
    """The merge goes behind PDL on CUDA sm_90+ alone: never on the CPU (the interpreter), never on
    ROCm (its torch device is ``cuda`` too, its compiler has no griddepcontrol), never below sm_90."""
    assert not triton_kernels._pdl(torch.device("cpu"))
    monkeypatch.setattr(_triton_pdl, "_INTERPRETED", False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    for hip, cap, want in ((None, (9, 0), True), ("6.2", (9, 0), False), (None, (8, 0), False)):
        monkeypatch.setattr(torch.version, "hip", hip)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, cap=cap: cap)
        triton_kernels._pdl.cache_clear()
        assert triton_kernels._pdl(torch.device("cuda", 0)) is want, (hip, cap)
    triton_kernels._pdl.cache_clear()


def test_pdl_trigger_by_split_count() -> None:
    """The merge goes behind PDL (from the split's start) at one or two splits only: from four
    splits on the H100 timed it up to 1.33x slower than a plain launch."""
    assert [triton_kernels.pdl_trigger(s) for s in (1, 2, 3, 4, 66)] == [
        "start",
        "start",
        "off",
        "off",
        "off",
    ]


class _Recorder:
    """A stand-in kernel: ``kernel[grid](*args, **kw)`` records the launch's keywords."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __getitem__(self, grid: Any) -> Any:
        return lambda *a, **kw: self.calls.append(kw)


@pytest.mark.parametrize("has_pdl", [True, False])
def test_pdl_trigger_reaches_both_kernels(monkeypatch: pytest.MonkeyPatch, has_pdl: bool) -> None:
    """The split kernel's trigger, the merge's wait and its programmatic launch come from one
    choice: the rule's by split count, or the caller's; none of the three without PDL on the
    device; a trigger that is not one of the three is refused by name."""
    split, merge = _Recorder(), _Recorder()
    monkeypatch.setattr(triton_kernels, "_decode_split", split)
    monkeypatch.setattr(triton_kernels, "_decode_merge", merge)
    monkeypatch.setattr(triton_kernels, "_pdl", lambda device: has_pdl)
    args = _problem([300, 40], width=32)
    lse = torch.empty(args[0].shape[:2])
    kernel_args, _ = decls.paged_decode.check(OP, *args, lse=lse)
    codes = {"off": 0, "start": 1, "end": 2}
    for splits, pdl, want in ((1, None, "start"), (2, None, "start"), (3, None, "off"), (8, None, "off"),
                              (8, "start", "start"), (1, "off", "off"), (4, "end", "end")):  # fmt: skip
        triton_kernels.launch(*kernel_args, splits=splits, pdl=pdl)
        got = want if has_pdl else "off"
        assert split.calls[-1]["PDL_TRIGGER"] == codes[got], (splits, pdl)
        assert merge.calls[-1]["USE_PDL"] is (got != "off"), (splits, pdl)
        assert merge.calls[-1].get("launch_pdl", False) is (got != "off"), (splits, pdl)
    with pytest.raises(ValueError, match="one of off, start, end"):
        triton_kernels.launch(*kernel_args, pdl=True)


def test_split_heuristic() -> None:
    ns = triton_kernels.num_splits
    assert ns(1, 1, 10, 132) == 1  # a short table: one split
    assert ns(1, 8, 32768, 132) == 66  # 8 pairs: one round of four programs an SM (528)
    assert ns(1, 8, 512, 132) == 16  # ... but no split under 32 positions
    assert ns(16, 4, 32768, 132) == 8  # 64 pairs: 512 programs, not 9 splits' 576 (past the round)
    assert ns(16, 8, 32768, 132) == 4  # 128 pairs: 512 programs
    assert ns(64, 4, 32768, 132) == 2  # 256 pairs: 512
    assert ns(64, 8, 32768, 132) == 1  # 512 pairs: one program a pair
    assert ns(256, 8, 32768, 132) == 1  # a full batch: no split
    assert ns(1, 1, 1 << 20, 132) == triton_kernels.MAX_SPLITS
    assert ns(0, 8, 0, 132) == 1
    # fp8 caches and wide (MLA) value tiles: two programs an SM, the wider bounds (untimed forms)
    assert ns(1, 8, 32768, 132, measured=False) == 33
    assert ns(1, 8, 512, 132, measured=False) == 8
    assert ns(1, 1, 1 << 20, 132, measured=False) == triton_kernels.WIDE_MAX_SPLITS


_COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from opmux.kernels.ops.attention import triton_kernels as tk

PTRS = {"Q": "bf16", "KC": "fp8e4nv", "VC": "fp8e4nv", "BT": "i32", "LENS": "i32", "OUT": "bf16"}
FLOATS = ("sm_scale", "softcap")
PLAIN = dict(BLOCK_DR=16, HAS_TAIL=False, V_FROM_K=False)
MLA = dict(BLOCK_DV=512, BLOCK_DR=64, HAS_TAIL=True, USE_DOT=True, DOT_F32=False)  # 576 / 512
FORMS = [
    dict(PLAIN, BLOCK_G=16, BLOCK_DV=128, USE_DOT=True, DOT_F32=False, FP8=True, SOFTCAP=True, WINDOW=True),
    dict(PLAIN, BLOCK_G=1, BLOCK_DV=256, USE_DOT=False, DOT_F32=False, FP8=False, SOFTCAP=False, WINDOW=False),
    dict(MLA, BLOCK_G=16, V_FROM_K=True, FP8=False, SOFTCAP=False, WINDOW=False),
    dict(MLA, BLOCK_G=128, V_FROM_K=False, FP8=True, SOFTCAP=True, WINDOW=True),
]
for i, form in enumerate(FORMS):  # the merge's trigger from the start and after the stores
    block_n, warps, stages, _ = tk.tile_config(form["BLOCK_DV"])
    const = dict(form, PAGE_SIZE=16, BLOCK_N=block_n, PREFETCH=form["BLOCK_DV"] <= 128, PDL_TRIGGER=1 + i % 2)
    cache = "fp8e4nv" if form["FP8"] else "bf16"
    sig = {}
    for n in tk._decode_split.arg_names:
        if n in const:
            sig[n] = "constexpr"
        elif n[0].isupper() and n not in ("G", "CHUNKS", "Hq", "D", "DV", "S"):
            sig[n] = "*" + {"KC": cache, "VC": cache}.get(n, PTRS.get(n, "fp32"))
        else:
            sig[n] = "fp32" if n in FLOATS else "i32"
    triton.compile(ASTSource(tk._decode_split, sig, const), target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
const = dict(HAS_SINKS=True, HAS_LSE=True, WINDOW=True, BLOCK_N=32, BLOCK_S=32, BLOCK_D=128, USE_PDL=True)
sig = {n: "constexpr" if n in const else ("*" + PTRS.get(n, "fp32") if n[0].isupper() and n not in ("D", "S") and n != "Hq" else "i32") for n in tk._decode_merge.arg_names}
triton.compile(ASTSource(tk._decode_merge, sig, const), target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
print("compiled")
"""


def test_kernels_compile_for_sm90() -> None:
    """The interpreter runs what the compiler may refuse (it took ``tl.cdiv`` of tensors): both
    kernels compiled for an H100 / H200 (sm_90, no GPU needed), outside the interpreter; MLA's
    576 / 512 forms (a 512 + 64 key tile, the value tile from the key's or its own; bf16 and fp8,
    a group of 16 and of 128 heads) among them."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "compiled" in r.stdout, r.stderr[-3000:]


@pytest.mark.parametrize("kw", [{}, {"window_left": 20, "sinks": torch.tensor([0.5, -1.0, 2.0, 0.0])}])
def test_table_wider_than_the_sequences(monkeypatch: pytest.MonkeyPatch, kw: dict[str, Any]) -> None:
    """An engine's table (sized to the model's maximum length) over short sequences: the split
    count follows the width, so most splits hold no position. They write nothing and the merge
    must not read their workspace rows: every float32 workspace is poisoned with NaN here."""
    args = _problem([0, 5, 40, 300], width=64)  # 1,024 positions a row: 32 splits
    real_empty = torch.empty

    def poisoned(*a: Any, **k: Any) -> torch.Tensor:
        t = real_empty(*a, **k)
        return t.fill_(float("nan")) if t.dtype == torch.float32 else t

    monkeypatch.setattr(torch, "empty", poisoned)
    got, lse = _launch(args, **kw)
    monkeypatch.undo()
    assert triton_kernels.num_splits(4, 2, 64 * 16, 132) == 32
    lse_want = torch.empty(args[0].shape[:2])
    want = _decode.reference(*args, lse=lse_want, **kw)
    _close(got, want, torch.float32)
    torch.testing.assert_close(lse, lse_want, atol=1e-4, rtol=1e-4)
