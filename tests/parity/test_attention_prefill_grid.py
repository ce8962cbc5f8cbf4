"""attention.paged_prefill on a GPU at serving sizes: every backend that runs on the device against
the op's definition (the per-sequence float32 reference) over batches, contexts (prefix 0 to 4k,
new tokens 1 to 4k), head dims 64 / 80 / 96 / 128 / 256 and MLA's 576 / 512 (the value cache
the latent cache's prefix view or its own, 16 to 128 heads) and 192 / 128, page sizes 1 to 128 (odd ones too),
GQA / MQA / MHA, softcap, sliding windows, sinks, lse, HND views and fp8 e4m3 caches; tolerances
atol 1.5e-2 / rtol 1e-2 (fp8 caches 0.15). And bad page tables, lengths and offsets: on CUDA the
kernels clamp and skip them (no sync to check), so the call must give the definition's result
over what remains and touch no memory out of bounds: the caches sit between NaN blocks and the
output between canary rows, so a stray read shows as a NaN and a stray write as a changed canary
(run them under ``compute-sanitizer --tool memcheck`` too: ``-k bad_page_tables``). On the
CPU the small parity samples and tests/unit/test_paged_prefill_triton.py run instead."""

from __future__ import annotations

from typing import Any

import attention_grid as grid
import pytest
import torch

from opmux.kernels.errors import BackendUnavailable
from opmux.kernels.ops.attention._prefill import reference

OP = "attention.paged_prefill"
I32 = grid.I32
#: (new tokens per sequence, cached prefix per sequence, Hq, Hkv, D, page size, dtype, features)
GRID: tuple[tuple[list[int], list[int], int, int, int, int, str, dict[str, Any]], ...] = (
    ([1024], [0], 32, 8, 128, 16, "bf16", {}),
    ([4096], [0], 32, 8, 128, 16, "bf16", {}),
    ([512, 300, 1, 77], [1500, 0, 4000, 33], 32, 8, 128, 16, "bf16", {}),
    ([2048], [2048], 32, 4, 128, 32, "bf16", {"lse": True}),
    ([333, 129, 0], [0, 700, 64], 16, 2, 64, 1, "fp16", {}),
    ([200, 57], [100, 900], 8, 1, 80, 5, "bf16", {"softcap": 30.0}),
    ([256, 100], [300, 0], 16, 16, 96, 7, "bf16", {"window_left": 127}),
    ([128, 64], [500, 20], 8, 2, 256, 128, "bf16", {"sinks": True, "lse": True}),
    ([96, 1], [1000, 77], 4, 2, 256, 64, "fp16", {"window_left": 300}),
    ([700, 45], [1200, 0], 32, 8, 128, 16, "bf16", {"fp8": True}),
    (
        [300],
        [2000],
        64,
        8,
        128,
        64,
        "fp16",
        {"fp8": True, "softcap": 50.0, "window_left": 511, "sinks": True},
    ),
    ([100, 50], [200, 10], 12, 4, 64, 3, "fp32", {}),
    ([400, 33], [600, 9], 32, 8, 128, 16, "bf16", {"hnd": True, "lse": True}),
    ([64] * 16, [i * 97 for i in range(16)], 32, 8, 128, 16, "bf16", {}),
    # absorbed MLA (DeepSeek-V3): one 576-dim latent KV head, V its first 512 dims; 192 / 128
    ([512, 100], [1000, 0], 16, 1, 576, 64, "bf16", {"dv": 512, "v_view": True}),
    ([64, 3], [2000, 40], 128, 1, 576, 16, "bf16", {"dv": 512, "v_view": True, "lse": True}),
    ([300], [700], 16, 1, 576, 1, "fp16", {"dv": 512, "softcap": 30.0, "window_left": 255}),
    ([256, 17], [1500, 0], 32, 1, 576, 64, "bf16", {"dv": 512, "v_view": True, "fp8": True}),
    ([400, 100], [300, 50], 16, 2, 192, 16, "bf16", {"dv": 128, "sinks": True}),
)


def _case(
    q_lens: list[int],
    prefix: list[int],
    hq: int,
    hkv: int,
    d: int,
    page: int,
    dtype: str,
    feats: dict[str, Any],
    seed: int,
    device: str = "cuda",
) -> tuple[tuple[torch.Tensor, ...], dict[str, Any]]:
    """(query, caches, table, seq_lens, cu_seqlens_q) and the keyword arguments
    (``attention_grid.paged_batch``)."""
    lens = [p + n for p, n in zip(prefix, q_lens, strict=True)]
    args, kw = grid.paged_batch(lens, sum(q_lens), hq, hkv, d, page, dtype, feats, seed, device)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=I32, device=device)
    return (*args, cu), kw


@pytest.mark.parametrize("feats", [{}, {"fp8": True}, {"hnd": True}], ids=["plain", "fp8", "hnd"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_cases_caches_sit_between_nan_guards(dtype: str, feats: dict[str, Any]) -> None:
    """The grid's out-of-bounds detector: the block just before and just after each cache view
    holds NaN in the cache's own dtype (a conversion after the view was taken would copy the view
    alone and drop the guards)."""
    (_, kc, vc, *_), _ = _case([5], [3], 4, 2, 16, 4, dtype, feats, 0, device="cpu")
    grid.assert_nan_guarded((kc, vc), str(feats))


@pytest.mark.parametrize("backend", grid.backends(OP))
def test_serving_grid(backend: str, device_type: str) -> None:
    if device_type == "cpu":
        pytest.skip("the serving grid runs on a GPU (the CPU runs the op's small parity samples)")
    ran = 0
    refused: list[str] = []
    for i, (q_lens, prefix, hq, hkv, d, page, dtype, feats) in enumerate(GRID):
        if backend == "torch" and sum(q_lens) > 1024:
            continue  # the token-chunked fallback at 4k tokens proves nothing more
        args, kw = _case(q_lens, prefix, hq, hkv, d, page, dtype, feats, i)
        what = f"{backend} q={q_lens} prefix={prefix} {hq}/{hkv} D={d} page={page} {dtype} {sorted(feats)}"
        lse_want = torch.empty(args[0].shape[:2], device="cuda") if "lse" in kw else None
        lse_what = f"{what} lse"
        want = reference(*args, **{**kw, "lse": lse_want})
        try:
            got = grid.fn(OP, backend)(*args, **kw)
        except BackendUnavailable as exc:  # a vendor backend's refusal (MLA, sinks, lse, fp8, ...)
            refused.append(f"{what}: {exc}")
            continue
        torch.cuda.synchronize()
        grid.check(got, want, bool(feats.get("fp8")), what)
        if lse_want is not None:
            torch.testing.assert_close(
                kw["lse"], lse_want, atol=1e-2, rtol=1e-3, msg=lambda m, w=lse_what: f"{w}: {m}"
            )
        ran += 1
    vendor = backend in ("flashinfer", "cudnn")  # the few cases their predicates take
    if vendor and not ran:
        pytest.skip(f"{backend} ran none of the grid's cases: {refused[:1]}")
    assert ran >= (3 if vendor else 8), f"{backend} took {ran} of the grid's cases: {refused}"


def test_cuda_graph_replay_takes_new_lengths(device_type: str) -> None:
    """No host sync inside: the op captured once replays with other lengths and offsets."""
    if device_type == "cpu":
        pytest.skip("a GPU case")
    args, _ = _case([300, 200], [100, 700], 32, 8, 128, 16, "bf16", {}, 50)
    q, kc, vc, table, lens, cu = args
    out = torch.empty_like(q)
    fn = grid.fn(OP, "default")
    fn(q, kc, vc, table, lens, cu, out=out)  # warm-up: compile and select outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(q, kc, vc, table, lens, cu, out=out)
    lens.copy_(torch.tensor([450, 260], dtype=I32))
    cu.copy_(torch.tensor([0, 240, 500], dtype=I32))
    graph.replay()
    torch.cuda.synchronize()
    grid.check(out, reference(q, kc, vc, table, lens, cu), False, "graph replay")


def _guarded_out(rows: int, hq: int, d: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``out`` as the middle of a buffer with 8 canary rows on each side: (buffer, out)."""
    buf = torch.full((rows + 16, hq, d), 12345.0, device="cuda", dtype=dtype)
    return buf, buf[8 : 8 + rows]


@pytest.mark.parametrize("backend", grid.backends(OP))
def test_bad_page_tables_custom_mask_offsets_touch_nothing(backend: str, device_type: str) -> None:
    """A custom mask whose offsets point before or past it (no host check on CUDA): those entries
    read as False (the sequence sees nothing: 0), nothing read outside the mask or the caches,
    nothing written outside ``out``; a good offset gives the definition's result."""
    if device_type == "cpu":
        pytest.skip("on the CPU such offsets raise ValueError (the parity harness's invalid cases)")
    fn = grid.fn(OP, backend)
    args, _ = _case([40, 30, 20], [200, 50, 100], 16, 4, 128, 16, "bf16", {}, 61)
    q, kc, vc, table, lens, cu = args
    sizes = [40 * 240, 30 * 80, 20 * 120]
    guard = torch.ones(sum(sizes) + 2048, dtype=torch.bool, device="cuda")
    mask = guard[1024 : 1024 + sum(sizes)]  # True on both sides: a read outside would add keys
    # sequence 2's matrix starts 10 entries before the mask's end: the rest of it reads False
    bad = torch.tensor([0, -(1 << 40), sum(sizes) - 10, sum(sizes)], device="cuda")
    buf, out = _guarded_out(q.shape[0], 16, 128, q.dtype)
    try:
        fn(q, kc, vc, table, lens, cu, custom_mask=mask, mask_indptr=bad, out=out)
    except BackendUnavailable as exc:  # FlashInfer takes no custom mask
        pytest.skip(f"{backend} refused the call: {exc}")
    torch.cuda.synchronize()
    assert bool((buf[:8] == 12345.0).all() and (buf[-8:] == 12345.0).all()), "a write outside out"
    assert bool(out.isfinite().all()), "a read outside the cache (NaN) or an unwritten row"
    good = torch.tensor([0, sizes[0]], device="cuda")
    want0 = reference(
        q[:40], kc, vc, table[:1], lens[:1], cu[:2], custom_mask=mask[: sizes[0]], mask_indptr=good
    )
    grid.check(out[:40], want0, False, f"{backend} a good mask offset")
    assert bool((out[40:70] == 0).all()), "an offset before the mask must see nothing"
    tail = torch.zeros(sizes[2], dtype=torch.bool, device="cuda")
    tail[:10] = True  # the entries inside the mask: query 0 sees positions 0..9, the others nothing
    want2 = reference(
        q[70:], kc, vc, table[2:], lens[2:], torch.tensor([0, 20], dtype=I32, device="cuda"),
        custom_mask=tail, mask_indptr=torch.tensor([0, sizes[2]], device="cuda"),
    )  # fmt: skip
    grid.check(out[70:], want2, False, f"{backend} a mask offset straddling its end")


@pytest.mark.parametrize("backend", grid.backends(OP))
def test_bad_page_tables_touch_nothing(backend: str, device_type: str) -> None:
    """CUDA clamps lengths to the table's capacity, offsets to query's rows, and skips block ids
    outside the cache: the result is the definition's over what remains, nothing read from the
    NaN blocks around the caches, nothing written outside ``out``."""
    if device_type == "cpu":
        pytest.skip("on the CPU such tables raise ValueError (the parity harness's invalid cases)")
    fn = grid.fn(OP, backend)
    args, _ = _case([40, 30, 20], [200, 50, 100], 16, 4, 128, 16, "bf16", {}, 60)
    q, kc, vc, table, lens, cu = args
    nb, cap = kc.shape[0], table.shape[1] * kc.shape[1]
    bad = table.clone()
    bad[1, 0] = nb  # sequence 1: positions 0..15 skipped
    bad[1, 2] = -1  # and 32..47
    bad[2, 3] = 1 << 30  # sequence 2: 48..63 skipped
    bad_lens = lens.clone()
    bad_lens[0] = 1 << 20  # clamped to the capacity
    buf, out = _guarded_out(q.shape[0], 16, 128, q.dtype)
    try:
        fn(q, kc, vc, bad, bad_lens, cu, out=out)
    except BackendUnavailable as exc:  # FlashInfer declines a table naming blocks outside the cache
        pytest.skip(f"{backend} refused the call: {exc}")
    torch.cuda.synchronize()
    assert bool((buf[:8] == 12345.0).all() and (buf[-8:] == 12345.0).all()), "a write outside out"
    assert bool(out.isfinite().all()), "a read outside the cache (NaN) or an unwritten row"
    # the definition over what the kernels see: bad blocks' positions dropped from the sequence
    want0 = reference(q[:40], kc, vc, table[:1], torch.tensor([cap], dtype=I32, device="cuda"), cu[:2])
    grid.check(out[:40], want0, False, f"{backend} length past the capacity")
    for b, (lo, hi) in ((1, (40, 70)), (2, (70, 90))):
        pos = torch.arange(int(lens[b]), device="cuda")
        blk = bad[b].long()[pos // 16]
        keep = (blk >= 0) & (blk < nb)
        k, v = kc[blk.clamp(0, nb - 1), pos % 16].float(), vc[blk.clamp(0, nb - 1), pos % 16].float()
        qb = q[lo:hi].float().reshape(hi - lo, 4, 4, 128)
        s = torch.einsum("ihgd,nhd->ihgn", qb, k) * 128**-0.5
        last = (int(lens[b]) - (hi - lo) + torch.arange(hi - lo, device="cuda"))[:, None, None, None]
        s = s.masked_fill(~keep | (pos > last), float("-inf"))
        p = torch.softmax(s, -1).nan_to_num(0.0)
        want = torch.einsum("ihgn,nhd->ihgd", p, v).reshape(hi - lo, 16, 128)
        grid.check(out[lo:hi], want, False, f"{backend} bad block ids of sequence {b}")
    # offsets past query's rows, decreasing offsets, more new tokens than the length: clamped,
    # nothing out of bounds (the values are unspecified)
    for bad_cu, bl in (([0, 40, 70, 500], lens), ([0, 80, 30, 90], lens), ([0, 40, 70, 90], lens // 8)):
        buf, out = _guarded_out(q.shape[0], 16, 128, q.dtype)
        fn(q, kc, vc, table, bl, torch.tensor(bad_cu, dtype=I32, device="cuda"), out=out)
        torch.cuda.synchronize()
        assert bool((buf[:8] == 12345.0).all() and (buf[-8:] == 12345.0).all()), (
            f"cu={bad_cu}: a write outside out"
        )
        assert not bool(out.isnan().any()), f"cu={bad_cu}: a read outside the cache"
