"""What the launch sweeps (decode_tiles.py, prefill_tiles.py) share: the best candidate of a case,
each candidate's time over the baseline across the cases, and the tuned tables a record supports
(``--table-out``, ``--tables-from``)."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
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


#: a candidate goes into a tuned table only where it beats the default by more than this share
MARGIN = 0.02


def table_rows(
    cases: list[dict[str, Any]],
    row: str,
    base: str,
    candidates: Callable[[list[dict[str, Any]]], Iterable[tuple[str, dict[str, int]]]],
) -> dict[tuple[int, ...], dict[int, dict[str, int]]]:
    """The tuned tables a sweep supports, per table shape (``case["shape"]``) and ``case[row]``
    (the table's M): the entry of the candidate with the lowest geometric mean of its time over
    the default's (``{base}_us``) across that M's cases, if it beats the default by more than
    ``MARGIN``; else the default launch as it was timed (``default_cfg``: the table entry it read,
    or the heuristic's), so a table never carries a guess. Only candidates timed in every such
    case compete; ``candidates(cases)`` names them with their entries."""
    groups: dict[tuple[tuple[int, ...], int], list[dict[str, Any]]] = {}
    for r in cases:
        groups.setdefault((tuple(r["shape"]), r[row]), []).append(r)
    out: dict[tuple[int, ...], dict[int, dict[str, int]]] = {}
    for (shape, m), group in sorted(groups.items()):
        best, best_ratio = group[0]["default_cfg"], 1 - MARGIN
        for name, entry in candidates(group):
            ratios = [c["cands"].get(name, {}).get("us", math.nan) / c[f"{base}_us"] for c in group]
            if all(math.isfinite(x) for x in ratios):
                geo = math.prod(ratios) ** (1 / len(ratios))
                if geo < best_ratio:
                    best, best_ratio = entry, geo
        out.setdefault(shape, {})[m] = dict(best)
    return out


def write_tables(
    op: str, record: dict[str, Any], tables: Mapping[tuple[int, ...], Any], folder: Path
) -> list[Path]:
    """``tables`` as ``<shape>,device_name=<the record's GPU>.json`` files in ``folder`` (for
    ``OPMUX_TUNED_CONFIG_DIR``, or to ship under opmux/kernels/configs/<op>/)."""
    from opmux.kernels import tuned

    device = record["env"].get("device", "unknown").replace(" ", "_")  # as tuned.device_name
    written = []
    for shape, table in tables.items():
        path = folder / tuned.table_key(op, "triton", device, shape).file_name()
        tuned.write_table(path, table)
        written.append(path)
    return written


def add_table_options(p: argparse.ArgumentParser) -> None:
    """``--out`` (the sweep's folder), ``--table-out`` and ``--tables-from``."""
    p.add_argument("--out", type=Path, help="the sweep's record and report (required for a sweep)")
    p.add_argument("--table-out", type=Path, help="also write the tuned tables (write_tables) here")
    p.add_argument(
        "--tables-from",
        type=Path,
        metavar="JSON",
        help="write the tables of this sweep record to --table-out and stop (no sweep, no GPU)",
    )


def tables_only(
    p: argparse.ArgumentParser, args: argparse.Namespace, write: Callable[[dict[str, Any], Path], list[Path]]
) -> bool:
    """Serve ``--tables-from`` (True: done, nothing to sweep); check ``--out`` otherwise."""
    if args.tables_from is None:
        if args.out is None:
            p.error("--out is required (or --tables-from JSON --table-out DIR)")
        return False
    if args.table_out is None:
        p.error("--tables-from needs --table-out")
    record = json.loads(args.tables_from.read_text(encoding="utf-8"))
    try:
        written = write(record, args.table_out)
    except ValueError as err:  # a record whose candidates are no table entries
        p.error(f"{args.tables_from}: {err}")
    for path in written:
        print(f"table {path}", flush=True)
    return True
