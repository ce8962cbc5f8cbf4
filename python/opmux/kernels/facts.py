"""The thin detector over ``selector``: what this machine offers for a device type.

Cheap probes only (find_spec, PATH lookups, file existence, build info); nothing is
compiled or loaded. Results are cached per device type; ``reset()`` clears them
(tests, or after installing a compiler mid-process).
"""

from __future__ import annotations

import functools
import importlib.util
import os

from . import config
from .selector import Facts, Reason, arch_number

__all__ = ["aot_covers", "detect_facts", "reset"]


def aot_covers(archs: tuple[str, ...] | list[str], arch: str | None) -> bool:
    """Whether an AOT library built for ``archs`` runs on ``arch`` (``sm_XY``).

    A cubin ``sm_XY`` runs on the same major with minor >= Y (``sm_90a`` only on 9.0);
    PTX ``compute_XY`` is compiled by the driver for any device of XY or newer.
    """
    sm = arch_number(arch)
    if sm is None:
        return False
    for entry in archs:
        n = arch_number(entry.replace("compute_", "sm_"))
        if n is None:
            continue
        if entry.startswith("compute_") and sm >= n:
            return True
        if entry.startswith("sm_") and entry.endswith("a"):
            if sm == n:
                return True
        elif entry.startswith("sm_") and sm // 10 == n // 10 and sm >= n:
            return True
    return False


def _triton(device_type: str) -> tuple[bool, str]:
    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed (pip install triton)"
    if device_type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        return False, "triton runs on CPU only in interpreter mode (TRITON_INTERPRET=1), for tests"
    return True, "triton found"


def _jit(device: str) -> tuple[Reason | None, str]:
    if not config.jit():
        return Reason.JIT_DISABLED, "run-time compilation is off (OPMUX_JIT=0)"
    from .jit.compile import toolchain

    finder = {"cpu": toolchain.find_cxx, "cuda": toolchain.find_nvcc}[device]
    try:
        tc = finder()
    except toolchain.ToolchainNotFound as exc:
        # one line for the trace: "what is missing; where we looked; what to do"
        return Reason.NO_COMPILER, " ".join(line.strip() for line in str(exc).splitlines())
    return None, f"{tc.kind} {tc.version}"


def _aot(device: str, arch: str | None) -> tuple[Reason | None, str]:
    from . import aot

    if not aot.available(aot.as_device(device)):
        return Reason.NOT_IN_WHEEL, f"this install has no AOT {device} library"
    if device == "cuda":
        from .. import _build_info

        info = _build_info.BUILD_INFO
        archs = tuple(info.get("archs") or ()) + ((info["ptx"],) if info.get("ptx") else ())
        if not aot_covers(archs, arch):
            return (
                Reason.NOT_IN_WHEEL,
                f"AOT library built for {', '.join(archs) or 'no arch'}, device is {arch}",
            )
    return None, f"AOT {device} library in the wheel"


@functools.cache
def detect_facts(device_type: str, arch: str | None) -> Facts:
    """Facts for calls on ``device_type`` (platform name: cpu, cuda, hip, ...)."""
    caps: set[str] = set()
    missing: dict[str, tuple[Reason, str]] = {}
    ok, detail = _triton(device_type)
    if ok:
        caps.add("triton")
    else:
        missing["triton"] = (Reason.NO_TRITON, detail)
    for device in ("cpu", "cuda"):
        if device != device_type:
            continue
        reason, detail = _jit(device)
        if reason is None:
            caps.add(f"jit:{device}")
        else:
            missing[f"jit:{device}"] = (reason, detail)
        reason, detail = _aot(device, arch)
        if reason is None:
            caps.add(f"aot:{device}")
        else:
            missing[f"aot:{device}"] = (reason, detail)
    if device_type == "cuda":  # vendor libraries some backends call (found, not imported)
        if importlib.util.find_spec("flashinfer") is not None:
            caps.add("flashinfer")
        else:
            missing["flashinfer"] = (
                Reason.MISSING_CAPABILITY,
                "flashinfer is not installed (pip install flashinfer-python)",
            )
        if importlib.util.find_spec("cudnn") is not None:
            caps.add("cudnn")
        else:
            missing["cudnn"] = (
                Reason.MISSING_CAPABILITY,
                "the cuDNN frontend is not installed (pip install nvidia-cudnn-frontend)",
            )
    if device_type == "npu":
        if importlib.util.find_spec("torch_npu") is not None:
            caps.add("torch_npu")
        else:
            missing["torch_npu"] = (Reason.MISSING_CAPABILITY, "torch_npu is not installed")
    return Facts(device_type, arch, frozenset(caps), missing)


def reset() -> None:
    detect_facts.cache_clear()
