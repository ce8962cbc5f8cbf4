"""The native backend: one C++/CUDA source per group, delivered two ways, so two loaders.

``AOT`` takes kernels from the library shipped in the wheel, ``JIT`` compiles the same source
on demand. A kernel is found by convention: the function ``<name>_<device>`` of module
``<group>_<device>`` for op ``group.name``; CUDA kernels take a trailing ``bool enable_pdl``
(``fused_op`` appends it: ``pdl_entry``). ``kernel()`` runs when dispatch binds the backend
(once per op and device until its choices are invalidated), never per call. Load problems become ``BackendUnavailable`` (the
dispatcher falls back under the policy); argument errors from C++ stay ValueError.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import BackendUnavailable

__all__ = ["AOT", "JIT", "PDL_DEFAULT", "NativeLoader", "pdl_dispatch", "run_with_pdl", "with_pdl"]


@dataclass(frozen=True)
class NativeLoader:
    """Where native kernels come from: the AOT library (``aot``) or a JIT build (``jit``)."""

    kind: Literal["aot", "jit"]

    def kernel(self, op: str, device: str) -> Callable[..., Any]:
        """The kernel of ``op`` (``group.name``) for ``device`` (``cpu`` or ``cuda``). Not memoized
        here: the loaders memoize their modules, and dispatch keeps what it binds until its
        choices are invalidated (so a JIT ``reset`` or a new cache dir is seen)."""
        group, _, name = op.partition(".")
        # a CUDA kernel takes a trailing ``enable_pdl``: dispatch binds it with its flag
        # (``fused_op.pdl_entry``), so no wrapper frame runs per call
        return self._load(group, device, f"{name}_{device}")

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


#: the flag a CUDA kernel bound by ``with_pdl`` passes: True ("where the GPU and the binary
#: support it": the C++ launcher checks sm_90+ and the binary's PTX). A call with an explicit
#: ``enable_pdl`` that has no cached kernel yet sets it around its dispatch (``pdl_dispatch``);
#: PDL changes when a kernel may start, never its result, so a race on it is harmless.
PDL_DEFAULT = [True]


def with_pdl(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A CUDA kernel as every caller calls it, ``kernel(*kernel_args)``: the C++ entry points
    take a trailing ``enable_pdl`` (as FlashInfer's). The raw entry point stays reachable as
    ``__wrapped__`` for callers that pass the flag themselves (``run_with_pdl``)."""
    flag = PDL_DEFAULT

    def call(*args: Any) -> Any:
        return fn(*args, flag[0])

    call.__wrapped__ = fn  # type: ignore[attr-defined]
    return call


def run_with_pdl(kernel: Callable[..., Any], kargs: tuple[Any, ...], enable_pdl: Any) -> None:
    """``kernel(*kargs)`` with an explicit ``enable_pdl`` (ignored by kernels without the flag:
    CPU, Triton, torch)."""
    raw = getattr(kernel, "__wrapped__", None)
    if raw is None:
        kernel(*kargs)
    else:
        raw(*kargs, bool(enable_pdl))


def pdl_dispatch(enable_pdl: Any, dispatch: Callable[..., Any], *args: Any) -> Any:
    """The full dispatch of a call with an explicit ``enable_pdl`` (its first call)."""
    old = PDL_DEFAULT[0]
    PDL_DEFAULT[0] = bool(enable_pdl)
    try:
        return dispatch(*args)
    finally:
        PDL_DEFAULT[0] = old


AOT = NativeLoader("aot")
JIT = NativeLoader("jit")
