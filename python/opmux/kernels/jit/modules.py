"""The JIT module table: which sources make each module, and for which device.

Sources are relative to ``KERNEL_PATH/csrc``. Each translation unit is also ``#include``d by
the AOT entry points (``csrc/aot_<device>.cpp|cu`` at the repo root), so the exported
function names are unique across units (see docs/architecture.md, "The native ABI").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

__all__ = ["MODULES", "JitModule", "get", "names"]


@dataclass(frozen=True)
class JitModule:
    """One JIT-compiled shared library."""

    name: str
    sources: tuple[str, ...]
    device: Literal["cpu", "cuda"]

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ValueError(
                f"opmux: JitModule {self.name!r}: device must be 'cpu' or 'cuda', not {self.device!r}"
            )
        if not self.sources:
            raise ValueError(f"opmux: JitModule {self.name!r} has no sources")


def _table(*modules: JitModule) -> Mapping[str, JitModule]:
    return MappingProxyType({m.name: m for m in modules})


#: name -> module. Adding a module is one line here plus its source under ``csrc/``.
MODULES: Mapping[str, JitModule] = _table(
    JitModule("layernorm_cpu", ("layernorm_cpu.cpp",), "cpu"),
    JitModule("activation_cpu", ("activation_cpu.cpp",), "cpu"),
    JitModule("quantization_cpu", ("quantization_cpu.cpp",), "cpu"),
    JitModule("moe_cpu", ("moe_cpu.cpp",), "cpu"),
    JitModule("kvcache_cpu", ("kvcache_cpu.cpp",), "cpu"),
    JitModule("rope_cpu", ("rope_cpu.cpp",), "cpu"),
    JitModule("layernorm_cuda", ("layernorm_cuda.cu",), "cuda"),
    JitModule("activation_cuda", ("activation_cuda.cu",), "cuda"),
    JitModule("quantization_cuda", ("quantization_cuda.cu",), "cuda"),
    JitModule("moe_cuda", ("moe_cuda.cu",), "cuda"),
    JitModule("kvcache_cuda", ("kvcache_cuda.cu",), "cuda"),
    JitModule("rope_cuda", ("rope_cuda.cu",), "cuda"),
)


def names(device: str | None = None) -> list[str]:
    """Module names, optionally only those for one device."""
    return [m.name for m in MODULES.values() if device is None or m.device == device]


def get(name: str, *, table: Mapping[str, JitModule] | None = None) -> JitModule:
    """Look a module up; an unknown name is an error listing the valid ones."""
    table = MODULES if table is None else table
    try:
        return table[name]
    except KeyError:
        raise KeyError(f"opmux: unknown JIT module {name!r}; valid: {', '.join(sorted(table))}") from None
