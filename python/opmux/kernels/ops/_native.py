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

from .. import tuned
from ..errors import BackendUnavailable

__all__ = ["AOT", "JIT", "NativeLoader", "unit_functions"]


@dataclass(frozen=True)
class NativeLoader:
    """Where native kernels come from: the AOT library (``aot``) or a JIT build (``jit``)."""

    kind: Literal["aot", "jit"]

    def kernel(self, op: str, device: str) -> Callable[..., Any]:
        """The kernel of ``op`` (``group.name``) for ``device`` (``cpu`` or ``cuda``). Not memoized
        here: the loaders memoize their modules, and dispatch keeps what it binds until its
        choices are invalidated (so a JIT ``reset`` or a new cache dir is seen)."""
        group, _, name = op.partition(".")
        schema = tuned.SCHEMAS.get(op)
        # a native kernel with a tuned table of the device's name (gemm's ``cuda``: a config_id)
        # takes its entry as a leading argument; an op whose ``cuda`` tables serve a vendor-style
        # backend instead (moe.fused_experts' decode unit) must stay non-native (``native=False``)
        if schema is not None and device in schema.entries and schema.kernel_problem is not None:
            cfg = self._load(group, device, f"{name}_{device}_cfg")
            return _with_tuned_config(op, device, cfg, schema.kernel_problem)
        # a CUDA kernel takes a trailing ``enable_pdl``: dispatch binds it with its flag
        # (``fused_op.pdl_entry``), so no wrapper frame runs per call
        return self._load(group, device, f"{name}_{device}")

    def lane(self, op: str, device: str) -> Callable[..., Any] | None:
        """The serving lane of ``op`` for ``device`` (``<name>_<device>_lane``), or None where the
        source has none. A lane takes the op's public arguments (then the PDL flag on CUDA),
        checks in C++ that the call is in the contract's serving form (every rule the Python
        contract states, for that form) and runs the kernel, or returns None having done nothing:
        the caller then runs the Python contract, which accepts the call or raises the op's error."""
        group, _, name = op.partition(".")
        try:
            return self._load(group, device, f"{name}_{device}_lane")
        except Exception:  # a source without one (AttributeError), ...: a lane is only ever a shortcut
            return None

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
        except (build.CompileError, toolchain.ToolchainNotFound, JitUnavailable, KeyError) as exc:
            raise BackendUnavailable("jit", f"{type(exc).__name__}: {exc}") from exc
        return mod[name]


def _with_tuned_config(
    op: str, device: str, cfg_kernel: Callable[..., Any], problem: Callable[..., tuple[tuple[int, ...], int]]
) -> Callable[..., Any]:
    """The kernel of an op with tuned native configs (``tuned.SCHEMAS[op].entries[device]``):
    its ``<name>_<device>_cfg`` entry called with the config id of the tuned table for the
    call's shape and M on this device (``configs/<op>/...,backend=<device>.json``), or -1, the
    kernel's own heuristic, where none matches. One frame and a memoized lookup per call."""
    lookup, name_of = tuned.lookup, tuned.device_name

    def run(*args: Any) -> Any:
        *kargs, flag = args  # native CUDA kernels take a trailing PDL flag
        shape, m = problem(*kargs)
        config_id = lookup(op, device, name_of(kargs[0].device), shape, m)["config_id"]
        return cfg_kernel(*kargs, config_id, flag)

    run.__qualname__ = f"{op}[{device}, tuned]"
    return run


AOT = NativeLoader("aot")
JIT = NativeLoader("jit")


def unit_functions(unit: str, names: tuple[str, ...], backend: str) -> dict[str, Callable[..., Any]]:
    """Functions ``names`` of CUDA unit ``unit``, the own unit of a vendor-style backend
    (``moe_grouped_cuda``, ``attention_decode_cuda``, ``comm_cuda``): from the wheel's AOT library
    when it has them all, else the JIT module (compiled once); ``BackendUnavailable(backend, ...)``
    when neither can be had (dispatch falls back under the policy). Callers memoize it."""
    from .. import aot, jit
    from ..jit.compile import build, toolchain
    from ..jit.compile.load import JitUnavailable

    lib = aot.load_library(aot.as_device("cuda"))
    if lib is not None:
        try:
            return {n: lib[n] for n in names}
        except Exception:  # a wheel built before the unit existed: compile it
            pass
    try:
        mod = jit.load_module(unit)
        return {n: mod[n] for n in names}
    except (build.CompileError, toolchain.ToolchainNotFound, JitUnavailable, KeyError) as exc:
        raise BackendUnavailable(backend, f"{type(exc).__name__}: {exc}") from exc
