"""The ``select`` tables of a benchmark record: per shape class and M, the opmux backend timed
fastest (what ``tuned`` reads and ``measured.preferred`` puts first in dispatch).

Shared by the benchmarks that time an op's CUDA backends forced (``bench_attention_prefill.py``,
``bench_attention_decode.py``): each case of their record carries ``shape`` (the op's tuned
shape, e.g. [padded DV, G]), ``M`` (the select key: query rows) and ``impls["opmux <backend>"]``
(``status``, ``us``). One rule for all: the declared first backend unless another one's
geometric mean time over the cases of that (shape, M) is under ``margin`` of it; a case where a
backend did not run (refused, wrong, failed) counts against it. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["MARGIN", "select_tables", "write_select_tables"]

#: a backend other than the declared first is named only where it wins by more than this
MARGIN = 0.98

Tables = dict[tuple[int, ...], dict[int, dict[str, str]]]


def select_tables(
    cases: Iterable[Mapping[str, Any]], backends: Sequence[str], margin: float = MARGIN
) -> Tables:
    """Per shape and M: ``{"backend": fastest}`` over ``backends`` (declared order, first = the
    one kept unless another wins past ``margin``). Cases without a time of the first are left out
    (skipped or its failure: nothing to compare with)."""
    by_key: dict[tuple[tuple[int, ...], int], list[dict[str, float]]] = {}
    for c in cases:
        times = {be: c.get("impls", {}).get(f"opmux {be}", {}) for be in backends}
        us = {be: r["us"] for be, r in times.items() if r.get("status") == "ok"}
        if "shape" in c and backends[0] in us:
            by_key.setdefault((tuple(c["shape"]), int(c["M"])), []).append(us)
    tables: Tables = {}
    for (shape, m), timed in sorted(by_key.items()):
        best, best_mean = backends[0], 1.0
        for be in backends[1:]:
            if all(be in us for us in timed):
                mean = math.exp(sum(math.log(us[be] / us[backends[0]]) for us in timed) / len(timed))
                if mean < min(best_mean, margin):
                    best, best_mean = be, mean
        tables.setdefault(shape, {})[m] = {"backend": best}
    return tables


def write_select_tables(
    op: str,
    record: Mapping[str, Any],
    backends: Sequence[str],
    folder: Path,
    cases: Iterable[Mapping[str, Any]] | None = None,
) -> list[Path]:
    """:func:`select_tables` of ``cases`` (default: the record's) as the files ``tuned`` reads,
    named for the record's GPU."""
    from opmux.kernels import tuned

    folder.mkdir(parents=True, exist_ok=True)
    device = record["env"].get("device", "unknown").replace(" ", "_")
    written = []
    for shape, table in select_tables(record["cases"] if cases is None else cases, backends).items():
        path = folder / tuned.table_key(op, "select", device, shape).file_name()
        tuned.write_table(path, table)
        written.append(path)
    return written
