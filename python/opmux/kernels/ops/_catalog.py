"""The op groups: every folder of this package with an ``op.py`` (its declarations).

Found by listing the folder, so adding a group is adding its folder (docs/adding-an-op.md).
``decls`` reads a group's declarations; the registry, ``explain`` and the contract generator
use it without importing torch or the live ops (``fused_op``).
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (importing it costs dataclasses and inspect: `import opmux.kernels.ops` stays light)
    from ._decl import Decl

__all__ = ["GROUPS", "decls"]

_HERE = os.path.dirname(os.path.abspath(__file__))

GROUPS: tuple[str, ...] = tuple(
    sorted(
        e.name
        for e in os.scandir(_HERE)
        if e.is_dir() and not e.name.startswith(("_", ".")) and os.path.isfile(os.path.join(e.path, "op.py"))
    )
)


def decls(module: ModuleType) -> list[Decl]:
    """The ops a declaration module declares, by name."""
    from ._decl import Decl

    return sorted((v for v in vars(module).values() if isinstance(v, Decl)), key=lambda d: d.name)
