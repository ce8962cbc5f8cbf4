"""What the launch sweeps (decode_tiles.py, prefill_tiles.py) share: the best candidate of a case
and each candidate's time over the baseline across the cases."""

from __future__ import annotations

import math
from typing import Any


def pick_best(rec: dict[str, Any], base: str) -> str | None:
    """Record the fastest timed candidate of ``rec["cands"]`` (``best``, ``best_us``) and its time
    over ``rec[f"{base}_us"]`` (``best_over_{base}``); its name, None when none was timed."""
    ok = {k: v["us"] for k, v in rec["cands"].items() if "us" in v}
    if not ok:
        return None
    best = min(ok, key=ok.__getitem__)
    rec["best"], rec["best_us"] = best, ok[best]
    rec[f"best_over_{base}"] = ok[best] / rec[f"{base}_us"]
    return best


def candidate_rows(cases: list[dict[str, Any]], base: str, geomean_header: str) -> list[str]:
    """A markdown table of every candidate's time over the case's ``{base}_us``: geometric mean and
    worst over the cases it ran, fastest first."""
    ratios: dict[str, list[float]] = {}
    for r in cases:
        for k, v in r["cands"].items():
            if "us" in v:
                ratios.setdefault(k, []).append(v["us"] / r[f"{base}_us"])
    lines = [f"| candidate | {geomean_header} | worst | cases |", "|---|---:|---:|---:|"]
    for k, v in sorted(ratios.items(), key=lambda kv: math.prod(kv[1]) ** (1 / len(kv[1]))):
        lines.append(f"| {k} | {math.prod(v) ** (1 / len(v)):.3f} | {max(v):.3f} | {len(v)} |")
    return lines
