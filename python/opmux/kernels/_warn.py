"""Warnings that point at the line of the caller's code, not into opmux or torch.

A fixed ``stacklevel`` is right for one call path only: an op called through its public
function, through ``op(...)``, through ``torch.ops.opmux.*`` or from inside ``torch.compile``
has a different number of frames between the user's line and the warning. Walking out of
opmux's (and torch's) frames finds the user's line on every path.
"""

from __future__ import annotations

import sys
import warnings

__all__ = ["warn_at_caller"]

_INTERNAL = ("opmux.", "torch.", "torch")


def _internal(module: object) -> bool:
    # Generated entry points (exec'd by the op layer) have no ``__name__`` in their globals.
    if not isinstance(module, str):
        return True
    return module == "opmux" or module.startswith(_INTERNAL)


def warn_at_caller(message: str, category: type[Warning]) -> None:
    """``warnings.warn(message, category)`` attributed to the first frame outside opmux/torch."""
    frame = sys._getframe(1)
    level = 2
    while frame.f_back is not None and _internal(frame.f_globals.get("__name__")):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)
