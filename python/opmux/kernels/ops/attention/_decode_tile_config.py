"""The default launch of ``attention.paged_decode``'s Triton split kernel (``triton_kernels``): the
key tile, the heads of a program and the split rule. Plain Python (no torch, no Triton): ``tuned``
takes it as the default where no tuned table matches, without importing the kernel."""

from __future__ import annotations

from typing import NamedTuple

__all__ = [
    "MAX_ACC",
    "MAX_SPLITS",
    "MIN_SPLIT_TOKENS",
    "WIDE_MAX_SPLITS",
    "WIDE_MIN_SPLIT_TOKENS",
    "TileConfig",
    "group_tile",
    "num_splits",
    "programs",
    "tile_config",
    "wave_target",
]

#: a split handles at least this many positions (more splits only for longer tables), at most
#: this many splits; the measured rule's bounds (16-bit caches, head dims <= 128), and the
#: untimed forms' (fp8 caches, wider heads: MLA's 512-dim partial outputs)
MIN_SPLIT_TOKENS, MAX_SPLITS = 32, 128
WIDE_MIN_SPLIT_TOKENS, WIDE_MAX_SPLITS = 64, 64
#: the most elements of a program's fp32 accumulator ``[BLOCK_G, BLOCK_DV]`` (16 heads of MLA's
#: 512 value dims: 64 registers a thread at 4 warps); a larger GQA group is split over programs
MAX_ACC = 16 * 512


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


class TileConfig(NamedTuple):
    """The split kernel's launch: key tile rows, warps, software-pipeline stages, and whether each
    step issues the next tile's loads before its own math (a register double buffer: the cache
    rows come through a block table, so Triton's pipeliner stages only the table's entries)."""

    block_n: int
    num_warps: int
    num_stages: int = 3
    prefetch: bool = False


def tile_config(block_d: int, plain: bool = True) -> TileConfig:
    """The split kernel's launch for a padded (value) head dim. Up to 128 dims, 16-bit queries
    and no key tail (``plain``): 32 key rows at 4 warps with the register double buffer, the H200
    sweep's best (``benchmarks/tune/decode_tiles.py``: 0.744x the previous 32 rows at 8 warps
    over 23 bf16 cases, never slower than it; docs/benchmarks/attention_decode_h200.md). fp32
    queries and a key tail (192 / 128) keep that previous tile: double buffers of fp32 or three
    tiles were not checked for spills nor timed. Larger dims keep the largest key tile whose
    gather and dot stay in registers on sm_90 without spills (every form, bf16 / fp16 / fp32 /
    fp8, dot and elementwise), not timed yet; MLA's 512-dim value tile (with the 64-dim rope tile
    of the keys) takes 8 warps: at 4 the fp32 / fp8 / separate-value forms spilled. The default
    where no tuned table matches (``tuned.SCHEMAS``: plain 16-bit forms up to 128 dims)."""
    if block_d <= 128:
        return TileConfig(32, 4, 3, True) if plain else TileConfig(32, 8)
    return TileConfig(16, 8) if block_d >= 512 else TileConfig(16, 4)


def group_tile(group: int, block_dv: int) -> int:
    """The heads of a GQA group one program takes (BLOCK_G): the group padded to 16 rows for
    ``tl.dot`` (1 without: MHA), at most ``MAX_ACC / BLOCK_DV`` of them (MLA's 128 heads of 512
    dims: 8 programs of 16 heads, each reading the KV head's rows; a whole group of 128 spilled)."""
    if group <= 1:
        return 1
    return max(16, min(_next_pow2(group), MAX_ACC // block_dv))


def programs(batch: int, kv_heads: int, group: int, block_dv: int) -> int:
    """The (sequence, KV head chunk) programs of one split: the tuned tables' M."""
    return batch * kv_heads * _cdiv(group, group_tile(group, block_dv))


def wave_target(measured: bool = True) -> int:
    """The split rule's programs per SM: one round of the programs an SM holds at once.
    ``measured`` (16-bit caches and queries, value head dims <= 128, no key tail: the plain 32-row
    4-warp tile): four (125 registers a thread under Triton 3.6 for sm_90, the compiler the H100
    and H200 runs used: four 128-thread programs fill the register file; another Triton version
    may allocate otherwise). On an H100 (``benchmarks/tune/decode_splits.py``,
    docs/benchmarks/attention_decode_h200.md) a split count whose programs pass a whole round by a
    little took up to 1.33x the time of one that fills the round (Qwen3-30B-A3B B 16 x 32k: 9
    splits of 64 programs, 576 over the 528 an H100 holds, 491 us; 8 splits 370 us), and
    the count that fills one round was within 2.2% of the best count or tile in all 9 cases. A tuned
    table's ``WAVES`` replaces it (a tile of other registers fills another number). Otherwise two
    (fp8 caches, fp32 queries, key tails, MLA: 8-warp or wider tiles, fewer programs an SM;
    untimed as a round)."""
    return 4 if measured else 2


def num_splits(
    batch: int,
    kv_heads: int,
    max_context: int,
    sm_count: int,
    measured: bool = True,
    waves: int | None = None,
) -> int:
    """How many splits per (sequence, KV head): as many programs as ``waves`` per SM hold (None:
    :func:`wave_target`'s), rounded down (programs past a round wait for a whole program's time
    while the rest of the GPU idles), at least one, none shorter than ``MIN_SPLIT_TOKENS``
    positions of the table, at most ``MAX_SPLITS``. From the shapes only (no sync: CUDA-graph
    safe). ``measured``: 16-bit caches, value head dims <= 128, what the H200 sweep timed
    (``benchmarks/tune/decode_tiles.py``, docs/benchmarks/attention_decode_h200.md); the other forms (fp8 caches, MLA's wide partial
    outputs) take the ``WIDE_*`` bounds."""
    count = max(1, batch * kv_heads)
    least, most = (MIN_SPLIT_TOKENS, MAX_SPLITS) if measured else (WIDE_MIN_SPLIT_TOKENS, WIDE_MAX_SPLITS)
    want = (waves or wave_target(measured)) * sm_count // count
    by_len = _cdiv(max(1, max_context), least)
    return max(1, min(want, by_len, most))
