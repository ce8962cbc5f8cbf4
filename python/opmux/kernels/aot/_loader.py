"""Find and load the AOT libraries that a wheel ships next to this package.

Depends on nothing else in opmux, so the package and a CLI can both use it. tvm_ffi is
imported only when a library is actually loaded (its import pulls in torch and dlopens
libtvm_ffi with RTLD_GLOBAL), never to answer :func:`available`.
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import tvm_ffi

__all__ = ["DEVICES", "Device", "as_device", "available", "library_path", "load_library"]

Device = Literal["cpu", "cuda"]
DEVICES: tuple[Device, ...] = ("cpu", "cuda")
_PACKAGE = "opmux.kernels.aot"

_loaded: dict[str, tvm_ffi.Module] = {}
_lock = threading.Lock()


def as_device(device: str) -> Device:
    """``device`` as an AOT :data:`Device`; ValueError for a device type with no AOT library."""
    for known in DEVICES:
        if device == known:
            return known
    raise ValueError(f"opmux: unknown AOT device {device!r}; valid: {', '.join(DEVICES)}")


def library_path(device: Device) -> Path:
    """Where ``libopmux_aot_<device>.so`` would be: beside this package, via ``find_spec``."""
    device = as_device(device)  # callers without a type checker may pass any string
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"opmux: cannot locate {_PACKAGE}")
    return Path(next(iter(spec.submodule_search_locations))) / f"libopmux_aot_{device}.so"


def available(device: Device) -> bool:
    """Whether this install ships the AOT library for ``device`` (a file check; nothing loads)."""
    return library_path(device).is_file()


def load_library(device: Device) -> tvm_ffi.Module | None:
    """The AOT library for ``device``, loaded once per process; None when the wheel has none."""
    path = library_path(device)
    with _lock:
        if device in _loaded:
            return _loaded[device]
        if not path.is_file():
            return None
        import tvm_ffi  # lazy: see the module docstring

        module = tvm_ffi.load_module(str(path))
        _loaded[device] = module
        return module
