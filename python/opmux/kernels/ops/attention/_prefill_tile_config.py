"""The default launch of ``attention.paged_prefill``'s Triton kernel (``_prefill_triton``): tiles,
warps and stages for a padded value head dim and a GQA group. Plain Python (no torch, no Triton):
``tuned`` takes it as the default where no tuned table matches, without importing the kernel."""

from __future__ import annotations

__all__ = ["masked_block_n", "tile_config"]


def tile_config(block_d: int, group: int, fp32: bool = False) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for a padded value head dim (``BLOCK_DV``), a
    GQA group and the query dtype: the largest tiles ptxas compiles for sm_90 without spills (bf16
    / fp16 / fp8 caches, with 16-divisible strides as the JIT specialises them). Up to 256 dims:
    128 query rows against 64-key tiles (64 x 32 at 256), at least one whole group per tile (a
    256-dim value tile with a key tail, no model's shape, spills 32 bytes there).
    MLA's 512 value dims (+ the keys' 64 rope dims): the fp32 accumulator ``[BLOCK_M, 512]`` alone
    is 64 registers a thread per 32 rows at 8 warps, so 32 rows against 16-key tiles at 8 warps
    (204-255 registers, none spilled, for the value view and a value cache of its own, bf16 and
    fp8); 64 rows, or 32 rows at 4 warps, spilled. A larger group is then split over programs
    (chunks of 32 heads, one token each: ``launch``). fp32 queries take IEEE products on the CUDA
    cores: a small tile (a correctness form, not a serving one; 16 x 16 at 8 warps for MLA's
    dims). The default where no tuned table matches (``tuned.SCHEMAS``: a table per device,
    written from benchmarks/tune/prefill_tiles.py's sweep)."""
    if block_d > 256:
        return (16, 16, 8, 1) if fp32 else (32, 16, 8, 2)
    if fp32:
        bm, bn, warps, stages = 16, 32, 4, 1
    elif block_d <= 128:
        bm, bn, warps, stages = 128, 64, 8, 2
    else:
        bm, bn, warps, stages = 64, 32, 8, 2
    return max(bm, 1 << max(group - 1, 0).bit_length()), bn, warps, stages


def masked_block_n(block_n: int) -> int:
    """The key tile of a call with a custom mask: half the unmasked one's, at least 16. The mask
    tile (a byte and a 64-bit address per score) on top of the scores made every default tile
    spill on sm_90 (128 x 64 at 128 dims: 264 bytes; 64 x 32 at 256 dims: 60); with half the keys
    none spills (ptxas sm_90a: 128 x 32 at 180-255 registers, 64 x 16, MLA's 32 x 16 unchanged).
    Tree masks serve a few query tokens a sequence, so the tile's keys matter more than its rows."""
    return max(16, block_n // 2)
