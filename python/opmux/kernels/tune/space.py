"""The candidate launch configurations the tuner times, per (op, backend) and M."""

from __future__ import annotations

import itertools
import random

from opmux.kernels import tuned

__all__ = ["DEFAULT_MS", "candidates"]

#: vLLM's batch sizes for these tables (benchmark_w8a8_block_fp8.py), so files line up.
DEFAULT_MS: tuple[int, ...] = (
    1,
    2,
    4,
    8,
    16,
    24,
    32,
    48,
    64,
    96,
    128,
    256,
    512,
    1024,
    1536,
    2048,
    3072,
    4096,
)

_BLOCK_M = (16, 32, 64, 128)
_BLOCK_N = (32, 64, 128, 256)
_GROUP_M = (1, 8, 16, 32, 64)
_WARPS = (4, 8)
_STAGES = (2, 3, 4, 5)
_SPLIT_K = (2, 4, 8)
#: the SMs a tuned GPU has when the caller does not say (an H100 / H200: 132)
_SMS = 132


def _programs(m: int, n: int, c: dict[str, int]) -> int:
    return -(-m // c["BLOCK_SIZE_M"]) * -(-n // c["BLOCK_SIZE_N"]) * c.get("SPLIT_K", 1)


def candidates(
    op: str, backend: str, m: int, shape: tuple[int, ...], *, seed: int = 0, sms: int = _SMS
) -> list[dict[str, int]]:
    """Configs to time for ``m``: the default heuristic first, then the space in a seeded
    shuffle (a budget that stops early has still sampled the whole space), those whose
    programs fill the ``sms`` one to four times over first. Split-K is in the space wherever
    a tile grid leaves SMs idle (small N, not only decode M). Tiles taller than M needs
    (beyond 16) are left out; every config passes the table validator."""
    if (op, backend) != ("gemm.w8a8_block_fp8_matmul", "triton"):
        raise ValueError(
            f"no tuning space for {op} on {backend!r}; tunable: gemm.w8a8_block_fp8_matmul on triton"
        )
    first = tuned.default_config(op, backend, m, shape)
    max_bm = max(16, 1 << max(0, m - 1).bit_length())
    space: list[dict[str, int]] = []
    for bm, bn, group, warps, stages in itertools.product(_BLOCK_M, _BLOCK_N, _GROUP_M, _WARPS, _STAGES):
        if bm > max_bm or (bm * bn >= 128 * 128 and warps == 4) or (bm * bn <= 32 * 64 and warps == 8):
            continue
        base = {
            "BLOCK_SIZE_M": bm,
            "BLOCK_SIZE_N": bn,
            "BLOCK_SIZE_K": 128,
            "GROUP_SIZE_M": group,
            "num_warps": warps,
            "num_stages": stages,
        }
        space.append(base)
        if _programs(m, shape[0], base) < sms:
            space += [{**base, "SPLIT_K": s} for s in _SPLIT_K]
    random.Random(seed).shuffle(space)
    space.sort(key=lambda c: not sms <= _programs(m, shape[0], c) <= 4 * sms)  # stable: still shuffled
    ordered = [first] + [c for c in space if c != first]
    assert all(not tuned.validate_entry(op, backend, c) for c in ordered)  # internal invariant
    return ordered
