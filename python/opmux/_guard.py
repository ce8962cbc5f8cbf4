"""Install-time mistakes caught at import: two opmux wheels at once, or the wrong one.

Cheap on purpose (metadata lookups and device-node checks, no torch): it runs on every
``import opmux``. Each warning is an ``InstallWarning`` and is given once per process.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from importlib import metadata

__all__ = ["DISTRIBUTIONS", "InstallWarning", "check"]

#: target -> distribution; tests/packaging checks this against targets.toml
DISTRIBUTIONS: dict[str, str] = {
    "cuda": "opmux",
    "cpu": "opmux-cpu",
    "rocm": "opmux-rocm",
    "xpu": "opmux-xpu",
    "npu": "opmux-npu",
}
#: device nodes that say which accelerator a Linux machine has
_EVIDENCE = (("cuda", "/dev/nvidiactl"), ("rocm", "/dev/kfd"), ("npu", "/dev/davinci_manager"))


class InstallWarning(UserWarning):
    """The installed opmux does not fit this machine, or two opmux wheels are installed."""


def installed() -> list[str]:
    found = []
    for name in DISTRIBUTIONS.values():
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        found.append(name)
    return found


def machine_target(exists: Callable[[str], bool] = os.path.exists) -> str:
    for target, node in _EVIDENCE:
        if exists(node):
            return target
    return "cpu"


def problems(target: str, dists: list[str], machine: str) -> list[str]:
    out = []
    if len(dists) > 1:
        out.append(
            f"several opmux distributions are installed ({', '.join(dists)}); they overwrite each other's "
            f"files. Keep one: pip uninstall {' '.join(d for d in dists if d != DISTRIBUTIONS.get(machine))}"
        )
    if target in DISTRIBUTIONS and target != machine and not (target == "cuda" and machine == "cpu"):
        out.append(
            f"this is the {target} wheel ({DISTRIBUTIONS[target]}) but the machine looks like a {machine} "
            f"machine; install {DISTRIBUTIONS[machine]} instead for its kernels"
        )
    return out


def check(target: str) -> None:
    if target == "source":
        return
    for problem in problems(target, installed(), machine_target()):
        warnings.warn(f"opmux: {problem}", InstallWarning, stacklevel=3)
