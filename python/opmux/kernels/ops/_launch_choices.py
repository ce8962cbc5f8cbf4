"""The entry check of a native unit's tuned launch table whose keys each take one of the unit's
instantiated values or 0 (the unit's own choice): ``moe.fused_experts``' decode split
(``moe/_decode_split.py``), the skinny GEMM's tiles (``gemm/_skinny_launch.py``). Plain Python:
``kernels/tuned.py`` checks tables without importing torch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["AUTO", "problems"]

#: "the unit chooses"
AUTO = 0


def problems(entry: Mapping[str, Any], choices: Mapping[str, tuple[int, ...]]) -> list[str]:
    """What is wrong with a table entry (empty: usable): every key of ``choices``, nothing else,
    each an int among its choices or :data:`AUTO`."""
    found = [f"missing {key}" for key in choices if key not in entry]
    unknown = sorted(set(entry) - set(choices))
    if unknown:
        found.append(f"unknown key(s) {', '.join(unknown)} (known: {', '.join(choices)})")
    for key, valid in choices.items():
        value = entry.get(key, AUTO)
        if type(value) is not int or value not in (AUTO, *valid):  # 4.0 and True are not 4 and 1
            allowed = ", ".join(map(str, (AUTO, *valid)))
            found.append(f"{key}={value!r} (one of {allowed}; {AUTO}: the unit's own choice)")
    return found
