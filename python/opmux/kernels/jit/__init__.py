"""JIT-compiled native kernels: the module table, ``KERNEL_PATH`` and ``load_module``.

Importing this package imports neither torch nor tvm_ffi and touches no files:
``KERNEL_PATH`` is resolved on first access, and sources are checked on first load.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .compile import (
    CacheInsecure,
    CompileError,
    CompileTimeout,
    JitCacheUnavailable,
    JitDisabled,
    JitLockTimeout,
    JitUnavailable,
    KernelSourcesMissing,
    ToolchainNotFound,
)
from .compile.load import load as _load
from .modules import MODULES, JitModule
from .modules import get as _get

if TYPE_CHECKING:
    import tvm_ffi

__all__ = [
    "KERNEL_PATH",
    "MODULES",
    "CacheInsecure",
    "CompileError",
    "CompileTimeout",
    "JitCacheUnavailable",
    "JitDisabled",
    "JitLockTimeout",
    "JitModule",
    "JitUnavailable",
    "KernelSourcesMissing",
    "ToolchainNotFound",
    "kernel_path",
    "load_module",
]


def kernel_path() -> Path:
    """The directory holding ``csrc/`` and ``include/``: this package's own location.

    Found with ``importlib.util.find_spec`` so it is the installed copy (site-packages) in
    a wheel install and the tree in a checkout; its contents are checked at first load.
    """
    spec = importlib.util.find_spec(__name__)
    if spec is None or not spec.submodule_search_locations:
        raise KernelSourcesMissing(f"{__name__} (find_spec found no package location)")
    return Path(next(iter(spec.submodule_search_locations)))


def __getattr__(name: str) -> object:
    # Lazy so that importing the package does no filesystem work.
    if name == "KERNEL_PATH":
        return kernel_path()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_module(
    name: str,
    *,
    modules: Mapping[str, JitModule] | None = None,
    kernel_root: Path | None = None,
    archs: Sequence[str] | None = None,
) -> tvm_ffi.Module:
    """Load JIT module ``name``: cache hit, or a locked compile, then ``dlopen``; memoised.

    ``modules`` and ``kernel_root`` replace the module table and ``KERNEL_PATH`` (tests);
    ``archs`` fixes the CUDA arch list (default: ``$OPMUX_CUDA_ARCHS``, else the visible GPUs).
    Raises :class:`JitDisabled` when ``OPMUX_JIT=0`` and the module is not cached,
    :class:`JitCacheUnavailable` when the cache cannot be used, :class:`JitLockTimeout` when
    another build holds it too long, :class:`ToolchainNotFound` without a compiler,
    :class:`CompileError` (:class:`CompileTimeout`) when it fails. All of them are caught by
    the op layer, which falls back.
    """
    module = _get(name, table=modules)
    root = kernel_path() if kernel_root is None else Path(kernel_root)
    return _load(module, kernel_path=root, archs=archs)
