"""Find and load the AOT libraries that a wheel ships next to this package.

Depends on nothing else in opmux, so the package and a CLI can both use it. tvm_ffi is
imported only when a library is actually loaded (its import pulls in torch and dlopens
libtvm_ffi with RTLD_GLOBAL), never to answer :func:`available`.
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import tvm_ffi

__all__ = ["DEVICES", "available", "library_path", "load_library"]

Device = Literal["cpu", "cuda"]
DEVICES: tuple[Device, ...] = ("cpu", "cuda")
_PACKAGE = "opmux.kernels.aot"

_loaded: dict[str, Any] = {}
_lock = threading.Lock()


def library_path(device: Device) -> Path:
    """Where ``libopmux_aot_<device>.so`` would be: beside this package, via ``find_spec``."""
    if device not in DEVICES:
        raise ValueError(f"opmux: unknown AOT device {device!r}; valid: {', '.join(DEVICES)}")
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
