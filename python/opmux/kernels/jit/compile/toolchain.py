"""Find the compilers and tvm-ffi's headers and library, without importing anything heavy.

Everything here is torch-free and tvm_ffi-free: the cache key is computed on every cold
process start, so discovery must stay cheap (one ``--version`` call per compiler, memoised
per process), and a missing compiler must say which one, where we looked and how to get it.
The only torch use is :func:`local_cuda_archs`, which imports torch lazily and only when a
CUDA module is about to be keyed or compiled without an explicit arch list.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ... import _env
from ..._env import parse_cuda_archs

__all__ = [
    "CUDA_ARCHS_ENV",
    "CUTLASS_REQUIREMENT",
    "Toolchain",
    "ToolchainNotFound",
    "cuda_arch_for_capability",
    "cutlass_include_dir",
    "find_cutlass",
    "find_cxx",
    "find_hipcc",
    "find_nvcc",
    "local_cuda_archs",
    "nvcc_release",
    "parse_cuda_archs",
    "ptx_arch_for",
    "tvm_ffi_paths",
    "tvm_ffi_version",
    "uses_cutlass",
]

#: Overrides the CUDA arch list for JIT builds, e.g. ``"9.0a"``, ``"sm_80,sm_90a"``, ``"8.0;9.0"``
#: (owned, parsed and validated by :mod:`opmux.kernels._env`).
CUDA_ARCHS_ENV = _env.CUDA_ARCHS

ToolchainKind = Literal["cxx", "nvcc", "hipcc"]


@dataclass(frozen=True)
class Toolchain:
    """A compiler we can run: its kind, absolute path and version line.

    ``version`` is the first line of ``--version``, except for nvcc, whose first line names
    only the driver; there it is the ``Cuda compilation tools, release X.Y, VX.Y.Z`` line,
    because the key needs the line that changes between releases.
    """

    kind: ToolchainKind
    path: str
    version: str

    @property
    def identity(self) -> str:
        """What goes into the cache key: kind and version, never the path (keys are content)."""
        return f"{self.kind}:{self.version}"


class ToolchainNotFound(RuntimeError):
    """No usable compiler of a kind; the message names it, every place searched, and a fix."""

    def __init__(self, compiler: str, searched: Sequence[str], hint: str) -> None:
        self.compiler = compiler
        self.searched = list(searched)
        self.hint = hint
        lines = "\n".join(f"  - {place}" for place in self.searched)
        super().__init__(f"opmux: no {compiler} found. Searched:\n{lines}\n{hint}")

    def __reduce__(self) -> tuple[type, tuple[str, list[str], str]]:
        return (type(self), (self.compiler, self.searched, self.hint))


def _version_line(path: str, kind: ToolchainKind) -> str | None:
    """Run ``path --version``; None when it cannot run (a broken or foreign binary)."""
    try:
        proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
    if not lines:
        return None
    if kind == "nvcc":
        for line in lines:
            if "release" in line:
                return line
    return lines[0]


@functools.cache
def _probe(path: str, kind: ToolchainKind, _stamp: tuple[int, int]) -> Toolchain | None:
    # Memoised on (path, mtime, size) so that a compiler upgrade in a long-lived process
    # is noticed, while repeated loads pay for ``--version`` once.
    version = _version_line(path, kind)
    return None if version is None else Toolchain(kind=kind, path=path, version=version)


def _try(candidate: str, kind: ToolchainKind) -> Toolchain | None:
    resolved = shutil.which(candidate) if os.sep not in candidate else candidate
    if resolved is None or not os.access(resolved, os.X_OK) or os.path.isdir(resolved):
        return None
    path = os.path.abspath(resolved)
    st = os.stat(path)
    return _probe(path, kind, (st.st_mtime_ns, st.st_size))


def _search(
    kind: ToolchainKind, candidates: Sequence[tuple[str, str]], hint: str, compiler: str
) -> Toolchain:
    searched: list[str] = []
    for candidate, where in candidates:
        found = _try(candidate, kind)
        if found is not None:
            return found
        searched.append(f"{where}: {candidate}")
    raise ToolchainNotFound(compiler, searched, hint)


def find_cxx() -> Toolchain:
    """The host C++ compiler: ``$CXX`` (name or path), then c++, g++, clang++ on PATH.

    A set but unusable ``$CXX`` is an error, not a reason to fall back: the user asked for it.
    """
    env = os.environ.get("CXX", "").strip()
    if env:
        return _search(
            "cxx",
            [(env, "$CXX")],
            "Fix or unset $CXX (it must be one executable, without arguments).",
            "C++ compiler",
        )
    return _search(
        "cxx",
        [(name, "PATH") for name in ("c++", "g++", "clang++")],
        "Install one (Debian/Ubuntu: apt-get install g++; conda: conda install gxx_linux-64), "
        "or set $CXX to its path.",
        "C++ compiler",
    )


def find_nvcc() -> Toolchain:
    """nvcc: ``$CUDA_HOME/bin/nvcc`` (then ``$CUDA_PATH``), nvcc on PATH, /usr/local/cuda/bin/nvcc."""
    candidates: list[tuple[str, str]] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home:
            candidates.append((os.path.join(home, "bin", "nvcc"), f"${var}/bin"))
    candidates.append(("nvcc", "PATH"))
    candidates.append(("/usr/local/cuda/bin/nvcc", "default CUDA install"))
    return _search(
        "nvcc",
        candidates,
        "Install the CUDA toolkit (https://developer.nvidia.com/cuda-downloads, or "
        "pip install nvidia-cuda-nvcc) and set $CUDA_HOME to it.",
        "CUDA compiler (nvcc)",
    )


def find_hipcc() -> Toolchain:
    """hipcc: ``$ROCM_PATH/bin/hipcc`` (then ``$HIP_PATH``), hipcc on PATH, /opt/rocm/bin/hipcc."""
    candidates: list[tuple[str, str]] = []
    for var in ("ROCM_PATH", "HIP_PATH"):
        home = os.environ.get(var)
        if home:
            candidates.append((os.path.join(home, "bin", "hipcc"), f"${var}/bin"))
    candidates.append(("hipcc", "PATH"))
    candidates.append(("/opt/rocm/bin/hipcc", "default ROCm install"))
    return _search(
        "hipcc",
        candidates,
        "Install ROCm (https://rocm.docs.amd.com) and set $ROCM_PATH to it.",
        "HIP compiler (hipcc)",
    )


def toolchain_root(toolchain: Toolchain) -> Path:
    """The install prefix (``.../bin/x`` -> ``...``): headers under it are covered by the version."""
    return Path(toolchain.path).resolve().parent.parent


def nvcc_release(toolchain: Toolchain) -> tuple[int, int]:
    """(major, minor) of an nvcc toolchain, parsed from its version line."""
    match = re.search(r"release (\d+)\.(\d+)", toolchain.version)
    if match is None:
        raise ValueError(f"opmux: cannot read the CUDA release from {toolchain.version!r}")
    return int(match.group(1)), int(match.group(2))


# --- CUDA archs -------------------------------------------------------------------------------


def cuda_arch_for_capability(
    major: int, minor: int, *, nvcc: tuple[int, int] = (13, 0), family: bool = False
) -> str:
    """The most specific arch nvcc can build for one device of this capability.

    Order: 9.0 -> ``sm_90a`` (wgmma/TMA need it; nvcc >= 12.0). 10.x, 11.x, 12.x -> ``a``
    (nvcc >= 12.8) or, with ``family=True``, ``f`` (family-portable, nvcc >= 12.9). Anything
    else, or an nvcc too old for the suffix, gets the plain ``sm_XY``. A local JIT build runs
    on exactly this device, so ``a`` is the default.

    >>> cuda_arch_for_capability(9, 0), cuda_arch_for_capability(8, 6)
    ('sm_90a', 'sm_86')
    >>> cuda_arch_for_capability(10, 0, family=True), cuda_arch_for_capability(12, 0, nvcc=(12, 4))
    ('sm_100f', 'sm_120')
    """
    base = f"sm_{major}{minor}"
    if (major, minor) == (9, 0) and nvcc >= (12, 0):
        return base + "a"
    if major in (10, 11, 12):
        if family and nvcc >= (12, 9):
            return base + "f"
        if nvcc >= (12, 8):
            return base + "a"
    return base


def ptx_arch_for(archs: Sequence[str]) -> str | None:
    """PTX for the newest plain arch (``sm_90a`` -> ``compute_90``), so newer GPUs can JIT it."""
    numbers = [int(re.sub(r"[af]$", "", a)[3:]) for a in archs]
    return f"compute_{max(numbers)}" if numbers else None


def local_cuda_archs(*, nvcc: Toolchain | None = None) -> list[str]:
    """Archs for this machine: ``$OPMUX_CUDA_ARCHS`` if set, else every visible device's capability.

    Precedence: the environment variable wins and needs no GPU or torch. Otherwise torch is
    imported here (lazily: only CUDA builds pay for it) and asked for each device's capability.
    A CPU-only torch or zero devices is not evidence of an arch: it is an error naming the
    variable to set.
    """
    text = _env.get(CUDA_ARCHS_ENV)
    if text:
        return parse_cuda_archs(text)
    release = nvcc_release(nvcc) if nvcc is not None else (13, 0)
    hint = f"set ${CUDA_ARCHS_ENV} (e.g. '9.0a') to build for a GPU that is not visible here"
    if importlib.util.find_spec("torch") is None:
        raise RuntimeError(f"opmux: cannot detect the CUDA arch without torch; {hint}")
    import torch  # lazy: only CUDA JIT builds need the device capability

    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as exc:  # a broken driver must not look like "no GPU"
        raise RuntimeError(f"opmux: torch.cuda failed ({exc}); {hint}") from exc
    if count == 0:
        raise RuntimeError(f"opmux: no CUDA device visible; {hint}")
    archs: list[str] = []
    for index in range(count):
        major, minor = torch.cuda.get_device_capability(index)
        arch = cuda_arch_for_capability(major, minor, nvcc=release)
        if arch not in archs:
            archs.append(arch)
    return archs


# --- tvm-ffi ------------------------------------------------------------------------------------


def _tvm_ffi_dir() -> Path:
    # find_spec on the top-level package does not execute tvm_ffi/__init__.py (which would
    # import torch and dlopen libtvm_ffi with RTLD_GLOBAL); it only locates it.
    spec = importlib.util.find_spec("tvm_ffi")
    if spec is None or not spec.submodule_search_locations:
        raise ToolchainNotFound(
            "apache-tvm-ffi",
            ["importlib.util.find_spec('tvm_ffi')"],
            "Install it: pip install apache-tvm-ffi",
        )
    return Path(next(iter(spec.submodule_search_locations)))


def tvm_ffi_paths() -> tuple[list[Path], Path]:
    """(include dirs, libtvm_ffi.so) of the installed apache-tvm-ffi, without importing it."""
    root = _tvm_ffi_dir()
    include = root / "include"
    lib = root / "lib" / "libtvm_ffi.so"
    missing = [str(p) for p in (include / "tvm" / "ffi", include / "dlpack", lib) if not p.exists()]
    if missing:
        raise ToolchainNotFound(
            "apache-tvm-ffi headers/library",
            missing,
            "Reinstall it: pip install --force-reinstall apache-tvm-ffi",
        )
    return [include], lib


def tvm_ffi_version() -> str:
    """The installed apache-tvm-ffi version (part of the cache key: it fixes the C ABI)."""
    try:
        return importlib.metadata.version("apache-tvm-ffi")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


# --- CUTLASS --------------------------------------------------------------------------------------

#: The pip requirement that provides the CUTLASS / CuTe headers of the CUTLASS-based CUDA units
#: (the ``nvidia-cutlass`` wheel ships them under ``cutlass_library/source/include``).
CUTLASS_REQUIREMENT = "nvidia-cutlass==4.2.0"

_CUTLASS_INCLUDE = re.compile(r'(?m)^[ \t]*#[ \t]*include[ \t]*[<"](?:cutlass|cute)/')


def cutlass_include_dir() -> Path | None:
    """``cutlass_library/source/include`` of the installed nvidia-cutlass, or None.

    Located with :func:`importlib.util.find_spec` (never imported: ``cutlass_library``'s
    ``__init__`` is slow and has side effects). A directory without ``cutlass/cutlass.h`` and
    ``cute/tensor.hpp`` (a broken or header-less install) counts as missing.
    """
    try:
        spec = importlib.util.find_spec("cutlass_library")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        include = Path(location) / "source" / "include"
        if (include / "cutlass" / "cutlass.h").is_file() and (include / "cute" / "tensor.hpp").is_file():
            return include
    return None


def find_cutlass() -> Path:
    """:func:`cutlass_include_dir`, or :class:`ToolchainNotFound` naming the pip requirement."""
    include = cutlass_include_dir()
    if include is None:
        raise ToolchainNotFound(
            "CUTLASS headers (the nvidia-cutlass package)",
            ["importlib.util.find_spec('cutlass_library') -> <package>/source/include/cutlass/cutlass.h"],
            f"A CUDA kernel of opmux is built on CUTLASS; install its headers: pip install {CUTLASS_REQUIREMENT}",
        )
    return include


def uses_cutlass(sources: Sequence[Path]) -> bool:
    """Whether any source includes a CUTLASS or CuTe header directly (``#include "cutlass/..."``
    or ``<cute/...>``): such a unit needs :func:`find_cutlass`'s include dir. The AOT
    translation unit includes the units through a generated header, so setup.py asks for the
    headers itself."""
    for source in sources:
        try:
            text = Path(source).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if _CUTLASS_INCLUDE.search(text):
            return True
    return False
