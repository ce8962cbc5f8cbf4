"""attention.paged_decode on a GPU at serving sizes: every backend that runs on the device (Triton,
the native ``cuda`` unit, torch) against the op's definition (the per-sequence float32 reference)
over batches, contexts (0 to 32k), head dims 64 / 80 / 96 / 128 / 256, page sizes 1 to 128 (odd
ones too), GQA / MQA / MHA and a group larger than one CTA's 8 heads, softcap, sliding windows,
sinks, lse, HND views and fp8 e4m3 caches; tolerances atol 1.5e-2 / rtol 1e-2 (fp8 caches 0.15).
The ``cuda`` backend also with a forced split count (1: the split kernel finalizes alone; many:
empty splits), and captured in a CUDA graph replayed with new lengths.

And bad page tables and lengths: on CUDA the kernels clamp and skip them (no sync to check), so
the call must give the definition's result over what remains and touch no memory out of bounds:
the caches sit between NaN blocks and the output between canary rows, so a stray read shows as a
NaN and a stray write as a changed canary (run them under ``compute-sanitizer --tool memcheck``
too: ``-k bad_page_tables``; benchmarks/h200_run.sh's ``decode`` stage does both). On the CPU the
small parity samples and tests/unit/test_paged_decode_triton.py run instead."""

from __future__ import annotations

from typing import Any

import attention_grid as grid
import pytest
import torch

from opmux.kernels.errors import BackendUnavailable
from opmux.kernels.ops.attention._decode import reference

OP = "attention.paged_decode"
I32 = grid.I32
#: (seq_lens, Hq, Hkv, D, page size, dtype, features)
GRID: tuple[tuple[list[int], int, int, int, int, str, dict[str, Any]], ...] = (
    ([4096], 32, 8, 128, 16, "bf16", {}),
    ([32768], 32, 8, 128, 16, "bf16", {}),
    ([1500, 0, 4000, 33, 1, 777, 2048, 64], 32, 8, 128, 16, "bf16", {"lse": True}),
    ([300] * 64, 32, 4, 128, 32, "bf16", {}),
    ([333, 129, 0], 16, 2, 64, 1, "fp16", {}),
    ([200, 957], 8, 1, 80, 5, "bf16", {"softcap": 30.0}),
    ([2560, 100], 16, 16, 96, 7, "bf16", {"window_left": 127}),
    ([1280, 64], 8, 2, 256, 128, "bf16", {"sinks": True, "lse": True}),
    ([96, 1], 4, 2, 256, 64, "fp16", {"window_left": 300}),
    ([7000, 45], 32, 8, 128, 16, "bf16", {"fp8": True}),
    ([3000], 64, 8, 128, 64, "fp16", {"fp8": True, "softcap": 50.0, "window_left": 511, "sinks": True}),
    ([1000, 50], 12, 4, 64, 3, "fp32", {}),
    ([900, 333], 24, 2, 256, 16, "fp32", {"lse": True}),
    ([4000, 33], 32, 8, 128, 16, "bf16", {"hnd": True, "lse": True}),
    ([5000, 17], 64, 1, 128, 16, "bf16", {"fp8": True, "hnd": True}),
    ([2000, 1], 48, 4, 80, 16, "bf16", {"fp8": True, "lse": True}),
    # absorbed MLA (DeepSeek-V3): one 576-dim latent KV head, V its first 512 dims
    ([4096, 1000, 37], 16, 1, 576, 64, "bf16", {"dv": 512, "v_view": True}),
    ([2000] * 4, 128, 1, 576, 16, "bf16", {"dv": 512, "v_view": True, "lse": True}),
    ([3000, 5], 16, 1, 576, 1, "fp16", {"dv": 512, "softcap": 30.0}),
    ([1500, 300], 32, 1, 576, 64, "bf16", {"dv": 512, "v_view": True, "fp8": True}),
)


def _case(
    lens: list[int],
    hq: int,
    hkv: int,
    d: int,
    page: int,
    dtype: str,
    feats: dict[str, Any],
    seed: int,
    device: str = "cuda",
) -> tuple[tuple[torch.Tensor, ...], dict[str, Any]]:
    """(query, caches, table, seq_lens) and the keyword arguments (``attention_grid.paged_batch``)."""
    return grid.paged_batch(lens, len(lens), hq, hkv, d, page, dtype, feats, seed, device)


@pytest.mark.parametrize("feats", [{}, {"fp8": True}, {"hnd": True}], ids=["plain", "fp8", "hnd"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_cases_caches_sit_between_nan_guards(dtype: str, feats: dict[str, Any]) -> None:
    """The grid's out-of-bounds detector: the block just before and just after each cache view
    holds NaN in the cache's own dtype."""
    (_, kc, vc, *_), _ = _case([5, 3], 4, 2, 16, 4, dtype, feats, 0, device="cpu")
    grid.assert_nan_guarded((kc, vc), str(feats))


@pytest.mark.parametrize("backend", grid.backends(OP))
def test_serving_grid(backend: str, device_type: str) -> None:
    if device_type == "cpu":
        pytest.skip("the serving grid runs on a GPU (the CPU runs the op's small parity samples)")
    ran = 0
    refused: list[str] = []
    for i, (lens, hq, hkv, d, page, dtype, feats) in enumerate(GRID):
        if backend == "torch" and max(lens) * len(lens) > 20000:
            continue  # the whole-row fallback at 32k tokens proves nothing more
        args, kw = _case(lens, hq, hkv, d, page, dtype, feats, i)
        what = f"{backend} lens={lens[:4]} {hq}/{hkv} D={d} page={page} {dtype} {sorted(feats)}"
        lse_want = torch.empty(args[0].shape[:2], device="cuda") if "lse" in kw else None
        want = reference(*args, **{**kw, "lse": lse_want})
        try:
            got = grid.fn(OP, backend)(*args, **kw)
        except BackendUnavailable as exc:  # a vendor backend's refusal (MLA, sinks, lse, ...)
            refused.append(f"{what}: {exc}")
            continue
        torch.cuda.synchronize()
        grid.check(got, want, bool(feats.get("fp8")), what)
        if lse_want is not None:
            torch.testing.assert_close(
                kw["lse"], lse_want, atol=1e-2, rtol=1e-3, msg=lambda m, w=f"{what} lse": f"{w}: {m}"
            )
        ran += 1
    if backend == "flashinfer" and not ran:
        pytest.skip(f"flashinfer ran none of the grid's cases: {refused[:1]}")
    assert ran >= (3 if backend == "flashinfer" else 10), (
        f"{backend} took {ran} of the grid's cases: {refused}"
    )


def _kernel_args(args: tuple[torch.Tensor, ...], kw: dict[str, Any]) -> tuple[Any, ...]:
    from opmux.kernels.ops.attention import op as decls

    kernel_args, _ = decls.paged_decode.check(OP, *args, **kw)
    return kernel_args


@pytest.mark.parametrize("splits", [1, 2, 7, 64, 256])
def test_cuda_forced_split_counts(splits: int, device_type: str) -> None:
    """The native unit's split counts: 1 (finalized by the split kernel, no merge), a few, and
    more than the positions need (empty splits, the kernels' maximum 256)."""
    if device_type == "cpu":
        pytest.skip("a GPU case")
    from opmux.kernels.ops.attention import paged_decode_cuda as pc

    if pc.supports(torch.empty(1, 1, 64, device="cuda"), *(torch.empty(1, 1, 1, 64, device="cuda"),) * 2):
        pytest.skip("the native unit does not run on this GPU")
    for i, feats in enumerate(
        ({"lse": True, "sinks": True}, {"fp8": True, "window_left": 100}, {"hnd": True})
    ):
        args, kw = _case([1000, 0, 17, 3000], 32, 8, 128, 16, "bf16", feats, 100 + i)
        lse_want = torch.empty(args[0].shape[:2], device="cuda") if "lse" in kw else None
        want = reference(*args, **{**kw, "lse": lse_want})
        kargs = _kernel_args(args, kw)
        pc.launch(*kargs, splits=splits)
        torch.cuda.synchronize()
        grid.check(kargs[0], want, bool(feats.get("fp8")), f"splits={splits} {sorted(feats)}")
        if lse_want is not None:
            torch.testing.assert_close(kw["lse"], lse_want, atol=1e-2, rtol=1e-3)


@pytest.mark.parametrize("backend", ["default", "triton", "cuda"])
def test_cuda_graph_replay_takes_new_lengths(backend: str, device_type: str) -> None:
    """No host sync inside: the op captured once replays with other lengths and tables."""
    if device_type == "cpu":
        pytest.skip("a GPU case")
    args, _ = _case([3000, 200, 1], 32, 8, 128, 16, "bf16", {}, 50)
    q, kc, vc, table, lens = args
    out = torch.empty_like(q)
    fn = grid.fn(OP, backend)
    fn(q, kc, vc, table, lens, out=out)  # warm-up: compile and select outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(q, kc, vc, table, lens, out=out)
    lens.copy_(torch.tensor([45, 2900, 1000], dtype=I32))
    table.copy_(table.flip(0))
    graph.replay()
    torch.cuda.synchronize()
    grid.check(out, reference(q, kc, vc, table, lens), False, f"{backend} graph replay")


def _guarded_out(rows: int, hq: int, d: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``out`` as the middle of a buffer with 8 canary rows on each side: (buffer, out)."""
    buf = torch.full((rows + 16, hq, d), 12345.0, device="cuda", dtype=dtype)
    return buf, buf[8 : 8 + rows]


@pytest.mark.parametrize("backend", grid.backends(OP))
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_bad_page_tables_touch_nothing(backend: str, fp8: bool, device_type: str) -> None:
    """CUDA clamps lengths to the table's capacity and skips block ids outside the cache: the
    result is the definition's over what remains, nothing read from the NaN blocks around the
    caches, nothing written outside ``out`` (or ``lse``)."""
    if device_type == "cpu":
        pytest.skip("on the CPU such tables raise ValueError (the parity harness's invalid cases)")
    fn = grid.fn(OP, backend)
    feats = {"fp8": True} if fp8 else {}
    args, kw = _case([200, 300, 100, 0], 16, 4, 128, 16, "bf16", feats, 60)
    q, kc, vc, table, lens = args
    nb, cap = kc.shape[0], table.shape[1] * kc.shape[1]
    bad = table.clone()
    bad[1, 0] = nb  # sequence 1: positions 0..15 skipped
    bad[1, 2] = -1  # and 32..47
    bad[2, 3] = 1 << 30  # sequence 2: 48..63 skipped
    bad[3, :] = -7  # sequence 3 (length 0, then clamped from below): nothing read
    bad_lens = lens.clone()
    bad_lens[0] = 1 << 20  # clamped to the capacity
    bad_lens[3] = -5  # clamped to 0
    lse_buf = torch.full((4 + 2, 16), 777.0, device="cuda")
    buf, out = _guarded_out(4, 16, 128, q.dtype)
    try:
        fn(q, kc, vc, bad, bad_lens, out=out, lse=lse_buf[1:5], **kw)
    except BackendUnavailable as exc:  # a vendor backend that refuses (lse, fp8) or is absent
        pytest.skip(f"{backend} refused the call: {exc}")
    torch.cuda.synchronize()
    assert bool((buf[:8] == 12345.0).all() and (buf[-8:] == 12345.0).all()), "a write outside out"
    assert bool((lse_buf[0] == 777.0).all() and (lse_buf[-1] == 777.0).all()), "a write outside lse"
    assert bool(out.isfinite().all()), "a read outside the cache (NaN) or an unwritten row"
    tol_fp8 = bool(fp8)
    want0 = reference(q[:1], kc, vc, table[:1], torch.tensor([cap], dtype=I32, device="cuda"), **kw)
    grid.check(out[:1], want0, tol_fp8, f"{backend} length past the capacity")
    assert bool((out[3] == 0).all()) and bool((lse_buf[4] == float("-inf")).all()), "an empty sequence"
    for b in (1, 2):
        pos = torch.arange(int(lens[b]), device="cuda")
        blk = bad[b].long()[pos // 16]
        keep = (blk >= 0) & (blk < nb)
        k = kc[blk.clamp(0, nb - 1), pos % 16].float()
        v = vc[blk.clamp(0, nb - 1), pos % 16].float()
        if fp8:
            k, v = k * kw["k_scale"], v * kw["v_scale"]
        s = torch.einsum("hgd,nhd->hgn", q[b].float().reshape(4, 4, 128), k) * 128**-0.5
        s = s.masked_fill(~keep, float("-inf"))
        p = torch.softmax(s, -1)
        want = torch.einsum("hgn,nhd->hgd", p, v).reshape(16, 128)
        grid.check(out[b], want, tol_fp8, f"{backend} bad block ids of sequence {b}")
