"""The op groups: every folder of this package with an ``op.py`` (its declarations).

Found by listing the folder, so adding a group is adding its folder (docs/adding-an-op.md).
"""

from __future__ import annotations

import os

_HERE = os.path.dirname(os.path.abspath(__file__))

GROUPS: tuple[str, ...] = tuple(
    sorted(
        e.name
        for e in os.scandir(_HERE)
        if e.is_dir() and not e.name.startswith(("_", ".")) and os.path.isfile(os.path.join(e.path, "op.py"))
    )
)
