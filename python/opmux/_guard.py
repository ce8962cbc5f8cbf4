"""Install-time mistakes caught at import: two opmux wheels at once, or the wrong one.

Cheap on purpose (one ``os.scandir`` per ``sys.path`` entry for ``opmux*.dist-info`` folders,
device-node checks; no importlib.metadata, no torch): it runs on every ``import opmux``. Each warning is an ``InstallWarning`` and is given once per process.

The advice must work when followed. The opmux distributions install the same files (they are
one package built per platform), so uninstalling one of two removes files the other needs;
the only safe repair is to uninstall all of them and reinstall the one this machine wants.

Which wheel a machine wants, from its device nodes (strongest first): ``/dev/nvidiactl`` or
``/dev/nvidia0`` (cuda), ``/dev/kfd`` (rocm), ``/dev/davinci_manager`` or ``/dev/davinci0``
(npu), a DRM render node of PCI vendor 0x8086 (xpu: an Intel GPU). Not evidence: a render node
of another vendor, or the absence of every node (a CPU host, or a container without devices).
An Intel GPU is often integrated and beside a discrete one, so it only vouches for opmux-xpu
(which then never warns) and never makes another wheel wrong.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Sequence

__all__ = ["DISTRIBUTIONS", "InstallWarning", "check", "machine_target", "machine_targets", "problems"]

#: target -> distribution; tests/packaging checks this against targets.toml
DISTRIBUTIONS: dict[str, str] = {
    "cuda": "opmux",
    "cuda12": "opmux-cu12",
    "cpu": "opmux-cpu",
    "rocm": "opmux-rocm",
    "xpu": "opmux-xpu",
    "npu": "opmux-npu",
}
#: device nodes that say which accelerator a Linux machine has, strongest first
_NODES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cuda", ("/dev/nvidiactl", "/dev/nvidia0")),
    ("rocm", ("/dev/kfd",)),
    ("npu", ("/dev/davinci_manager", "/dev/davinci0")),
)
_DRM = "/sys/class/drm"
_INTEL = "0x8086"
#: accelerators whose presence makes a non-matching wheel the wrong one
_STRONG = ("cuda", "rocm", "npu")
#: targets that are builds of another one for an older toolkit: same machines
_KIND = {"cuda12": "cuda"}


class InstallWarning(UserWarning):
    """The installed opmux does not fit this machine, or two opmux wheels are installed."""


def _normalize(name: str) -> str:
    """A distribution name as PEP 503 compares it (``opmux_cu12`` -> ``opmux-cu12``)."""
    return name.lower().replace("_", "-").replace(".", "-")


def installed(paths: Sequence[str] | None = None) -> list[str]:
    """The opmux distributions installed on ``paths`` (default ``sys.path``), in
    ``DISTRIBUTIONS`` order: the ``<name>-<version>.dist-info`` (or ``.egg-info``) folders
    importlib.metadata would find there, read with one ``os.scandir`` per entry (importing
    importlib.metadata alone costs ~20 ms)."""
    wanted = {_normalize(name) for name in DISTRIBUTIONS.values()}
    seen: set[str] = set()
    for entry in sys.path if paths is None else paths:
        try:
            with os.scandir(entry or ".") as it:
                names = [e.name for e in it if e.name[:5].lower() == "opmux" and e.is_dir()]
        except (OSError, TypeError, ValueError):
            continue  # not a folder (a zip, a missing path, a non-string entry)
        for folder in names:
            stem, dot, suffix = folder.rpartition(".")
            if not dot or suffix.lower() not in ("dist-info", "egg-info"):
                continue
            name = _normalize(stem.partition("-")[0])
            if name in wanted:
                seen.add(name)
    return [name for name in DISTRIBUTIONS.values() if _normalize(name) in seen]


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def machine_targets(
    exists: Callable[[str], bool] = os.path.exists,
    read: Callable[[str], str | None] = _read,
    listdir: Callable[[str], list[str]] = _listdir,
) -> list[str]:
    """Every accelerator target this machine shows evidence of, strongest first ([]: cpu)."""
    found = [target for target, nodes in _NODES if any(exists(node) for node in nodes)]
    for node in listdir(_DRM):
        if node.startswith("renderD") and read(f"{_DRM}/{node}/device/vendor") == _INTEL:
            found.append("xpu")
            break
    return found


def machine_target(exists: Callable[[str], bool] = os.path.exists) -> str:
    """The one target to recommend for this machine (``cpu`` without a strong accelerator)."""
    strong = [t for t in machine_targets(exists, listdir=lambda path: []) if t in _STRONG]
    return strong[0] if strong else "cpu"


def _wanted(machines: Sequence[str]) -> str:
    strong = [t for t in machines if t in _STRONG]
    if strong:
        return strong[0]
    return "xpu" if "xpu" in machines else "cpu"


def _fits(target: str, machines: Sequence[str]) -> bool:
    target = _KIND.get(target, target)
    strong = [t for t in machines if t in _STRONG]
    if target == "cpu":
        return not strong
    if target == "cuda":  # the CUDA wheel ships the CPU library too
        return "cuda" in strong or not strong
    return target in machines


def problems(target: str, dists: Sequence[str], machines: Sequence[str] | str) -> list[str]:
    """What is wrong with installing ``dists`` (``target`` is the one imported) on a machine
    with evidence of ``machines`` (from :func:`machine_targets`; a single target name is
    accepted, ``"cpu"`` meaning none). Each message ends with commands that fix it."""
    if isinstance(machines, str):
        machines = [] if machines == "cpu" else [machines]
    wanted = _wanted(machines)
    if _KIND.get(target) == wanted and len(dists) <= 1:
        wanted = target  # opmux-cu12 on a CUDA host stays opmux-cu12
    want = DISTRIBUTIONS[wanted]
    out = []
    if len(dists) > 1:
        out.append(
            f"several opmux distributions are installed ({', '.join(dists)}); they share files, so "
            f"uninstalling one breaks the other. Uninstall all, then install the one for this "
            f"machine: pip uninstall -y {' '.join(dists)} && pip install {want}"
        )
    elif target in DISTRIBUTIONS and not _fits(target, machines):
        have = DISTRIBUTIONS[target]
        seen = f"a {' and a '.join(machines)} device" if machines else "no accelerator"
        out.append(
            f"this is the {target} wheel ({have}) but this machine has {seen}; for its kernels: "
            f"pip uninstall -y {have} && pip install {want}"
        )
    return out


def check(target: str) -> None:
    if target == "source":
        return
    for problem in problems(target, installed(), machine_targets()):
        warnings.warn(f"opmux: {problem}", InstallWarning, stacklevel=3)
