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


class DriverTooOld(RuntimeError):
    """The NVIDIA driver is older than the CUDA release this wheel was built with; the message
    says which opmux wheel to install instead."""


def driver_cuda_version() -> int | None:
    """The CUDA version the driver supports (``cuDriverGetVersion``: 12040 for 12.4); None when
    there is no driver."""
    import ctypes

    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int(0)
        if libcuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return int(version.value)


def check_driver(cuda: dict[str, Any] | None, driver_version: int | None) -> None:
    """Raise :class:`DriverTooOld` when ``driver_version`` (from :func:`driver_cuda_version`)
    cannot run a wheel built with ``cuda`` (the build info's ``cuda`` entry)."""
    if not cuda or driver_version is None:
        return
    major, minor = (int(p) for p in str(cuda["toolkit"]).split(".")[:2])
    if driver_version >= major * 1000:  # minor-version compatibility within a major release
        return
    have = f"{driver_version // 1000}.{driver_version % 1000 // 10}"
    older = [
        o for o in cuda.get("older", []) if int(str(o["toolkit"]).split(".")[0]) * 1000 <= driver_version
    ]
    if older:
        best = older[-1]
        fix = (
            f"install {best['distribution']} (CUDA {best['toolkit']}, driver R{best['driver']}+) instead: "
            f"pip uninstall -y {_distribution()} && pip install {best['distribution']}"
        )
    else:
        fix = f"upgrade the NVIDIA driver to R{cuda['driver']} or newer"
    raise DriverTooOld(
        f"opmux: this wheel ({_distribution()}) was built with CUDA {major}.{minor} and needs an NVIDIA "
        f"driver for CUDA {major}.0 or newer (R{cuda['driver']}+); this driver supports CUDA {have}. {fix}"
    )


def _distribution() -> str:
    from ..._build_info import BUILD_INFO

    return str(BUILD_INFO.get("distribution") or "opmux")


def load_library(device: Device) -> tvm_ffi.Module | None:
    """The AOT library for ``device``, loaded once per process; None when the wheel has none.

    The CUDA library is refused with :class:`~opmux.kernels.errors.BackendUnavailable` (the
    dispatcher falls back) when the driver is too old for the CUDA release it was built with."""
    path = library_path(device)
    with _lock:
        if device in _loaded:
            return _loaded[device]
        if not path.is_file():
            return None
        if device == "cuda":
            from ..._build_info import BUILD_INFO
            from ..errors import BackendUnavailable

            try:
                check_driver(BUILD_INFO.get("cuda"), driver_cuda_version())
            except DriverTooOld as exc:
                raise BackendUnavailable("aot", str(exc)) from None
        import tvm_ffi  # lazy: see the module docstring

        module = tvm_ffi.load_module(str(path))
        _loaded[device] = module
        return module
