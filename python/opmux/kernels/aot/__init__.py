"""Lazy loader of the ahead-of-time compiled libraries shipped in the wheel.

``libopmux_aot_cpu.so`` / ``libopmux_aot_cuda.so`` sit beside this file in a wheel that has
them; a source checkout or a target without an AOT library has none, and
:func:`load_library` returns None so the dispatch layer moves on to JIT or torch.
"""

from __future__ import annotations

from ._loader import (
    DEVICES,
    Device,
    DriverTooOld,
    as_device,
    available,
    check_driver,
    driver_cuda_version,
    library_path,
    load_library,
)

__all__ = [
    "DEVICES",
    "Device",
    "DriverTooOld",
    "as_device",
    "available",
    "check_driver",
    "driver_cuda_version",
    "library_path",
    "load_library",
]
