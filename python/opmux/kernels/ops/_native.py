"""Glue from op backends to the compiled kernels: JIT modules and the AOT library.

Functions are looked up once per (kind, module, function) and memoized, so a call
costs one dict lookup. Load problems become ``BackendUnavailable`` (the dispatcher
falls back under the policy); argument errors from C++ stay ValueError.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import BackendUnavailable

_FNS: dict[tuple[str, str, str], Callable[..., Any]] = {}


def kernel(kind: str, op: str, like: Any) -> Callable[..., Any]:
    """The native kernel of ``op`` (``group.name``) for tensors like ``like``: the function
    ``<name>_<device>`` of module ``<group>_<device>`` (JIT) or of the AOT library."""
    device = "cuda" if like.is_cuda else "cpu"
    group, _, name = op.partition(".")
    return function(kind, group, device, f"{name}_{device}")


def function(kind: str, group: str, device: str, name: str) -> Callable[..., Any]:
    key = (kind, f"{group}_{device}", name)
    fn = _FNS.get(key)
    if fn is None:
        fn = _load(kind, group, device, name)
        _FNS[key] = fn
    return fn


def _load(kind: str, group: str, device: str, name: str) -> Callable[..., Any]:
    if kind == "aot":
        from .. import aot

        lib = aot.load_library(aot.as_device(device))
        if lib is None:
            raise BackendUnavailable("aot", f"this install has no AOT {device} library")
        try:
            return lib[name]
        except Exception as exc:  # tvm-ffi raises its own error type for a missing function
            raise BackendUnavailable("aot", f"AOT {device} library lacks {name}: {exc}") from None
    from .. import jit
    from ..jit.compile import build, toolchain
    from ..jit.compile.load import JitUnavailable

    try:
        mod = jit.load_module(f"{group}_{device}")
    except (build.CompileError, toolchain.ToolchainNotFound, JitUnavailable) as exc:
        raise BackendUnavailable("jit", f"{type(exc).__name__}: {exc}") from exc
    return mod[name]
