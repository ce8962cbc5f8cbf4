"""opmux: one kernel namespace for LLM-serving operators.

Importing this loads version and build facts only; the metadata layer is
``opmux.kernels`` and the operators are ``opmux.kernels.ops``.
"""

from __future__ import annotations

from typing import Any

from . import _guard
from ._build_info import BUILD_INFO

try:
    from ._version import version as __version__
except ImportError:  # a tree that setuptools-scm never wrote: a clearly marked dev version
    __version__ = "0.0.0.dev0+unknown"

__all__ = ["__version__", "build_info"]


def build_info() -> dict[str, Any]:
    """What this copy was built as: target, toolchains, archs, AOT libraries, commit."""
    return dict(BUILD_INFO)


_guard.check(str(BUILD_INFO.get("target", "source")))
