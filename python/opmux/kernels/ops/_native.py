"""The native backend: one C++/CUDA source per group, delivered two ways, so two loaders.

``AOT`` takes kernels from the library shipped in the wheel, ``JIT`` compiles the same source
on demand. A kernel is found by convention: the function ``<name>_<device>`` of module
``<group>_<device>`` for op ``group.name``. ``kernel()`` runs when dispatch binds the backend
(once per op and device until its choices are invalidated), never per call. Load problems become ``BackendUnavailable`` (the
dispatcher falls back under the policy); argument errors from C++ stay ValueError.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import BackendUnavailable

__all__ = ["AOT", "JIT", "NativeLoader", "with_pdl"]


@dataclass(frozen=True)
class NativeLoader:
    """Where native kernels come from: the AOT library (``aot``) or a JIT build (``jit``)."""

    kind: Literal["aot", "jit"]

    def kernel(self, op: str, device: str) -> Callable[..., Any]:
        """The kernel of ``op`` (``group.name``) for ``device`` (``cpu`` or ``cuda``). Not memoized
        here: the loaders memoize their modules, and dispatch keeps what it binds until its
        choices are invalidated (so a JIT ``reset`` or a new cache dir is seen)."""
        group, _, name = op.partition(".")
        fn = self._load(group, device, f"{name}_{device}")
        return with_pdl(fn) if device == "cuda" else fn

    def _load(self, group: str, device: str, name: str) -> Callable[..., Any]:
        if self.kind == "aot":
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


def with_pdl(fn: Callable[..., Any], enable_pdl: bool = True) -> Callable[..., Any]:
    """A CUDA kernel as every caller calls it, ``kernel(*kernel_args)``: the C++ entry points
    take a trailing ``enable_pdl`` (as FlashInfer's); True means "where the GPU and the binary
    support it" (the C++ launcher checks sm_90+ and the binary's PTX), so it is the default.
    The raw entry point stays reachable as ``__wrapped__`` for callers that pass the flag."""

    def call(*args: Any) -> Any:
        return fn(*args, enable_pdl)

    call.__wrapped__ = fn  # type: ignore[attr-defined]
    return call


AOT = NativeLoader("aot")
JIT = NativeLoader("jit")
