"""Lazy loader of the ahead-of-time compiled libraries shipped in the wheel.

``libopmux_aot_cpu.so`` / ``libopmux_aot_cuda.so`` sit beside this file in a wheel that has
them; a source checkout or a target without an AOT library has none, and
:func:`load_library` returns None so the dispatch layer moves on to JIT or torch.
"""

from __future__ import annotations

from . import _loader
from ._loader import *  # noqa: F403 - the loader's public names, listed once in its __all__

__all__ = _loader.__all__
