"""What a compiled torch bridge is bound to, its compiler flags, and the bridges the wheel ships.

A compiled bridge (``jit/csrc/torch_bridge.cpp``) may run only in a process whose torch is the
very build it was compiled against (torch's C++ API has no stable ABI: the version string with its
local part, ``+cpu`` or ``+cu130``, and the build's commit), with the same C++ standard-library
ABI, the same CPython ABI (it holds Python entries, ``BRIDGE_PY_ENTRY``) and the same tvm-ffi ABI
series (it links ``libtvm_ffi``: its major.minor, "0.1", the range the wheel requires, which the
wheel's AOT libraries rely on too: a patch release of tvm-ffi keeps the shipped bridge). :class:`Key` is those facts. A wheel ships bridges under ``bridges/``, each
named by its key (:meth:`Key.filename`): a process uses one only when the name it computes for
itself is there. Any difference is another name, and the process builds its own bridge into the
JIT cache instead (``_bridge_build``); nothing else is ever tried, because loading a mismatched
bridge would crash the process.

Torch-free at import: setup.py (``tools/torch_bridges.py``) names and compiles the bridges of the
torch wheels it fetched with the same :class:`Key` and :func:`compile_flags`.
"""

from __future__ import annotations

import hashlib
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "SHIPPED_DIR",
    "Key",
    "compile_flags",
    "current",
    "link_flags",
    "shipped",
    "shipped_names",
    "tvm_ffi_abi",
]

#: the wheel's prebuilt bridges (absent in a source tree: setup.py writes them into the wheel)
SHIPPED_DIR = Path(__file__).resolve().parent / "bridges"
_UNSAFE = re.compile(r"[^A-Za-z0-9]")


@dataclass(frozen=True)
class Key:
    """Everything a compiled bridge must share with the process that loads it."""

    torch: str  # torch.__version__, local part included ("2.13.0+cpu")
    git: str  # torch.version.git_version ("" when the build has none)
    cxx11_abi: int  # torch._C._GLIBCXX_USE_CXX11_ABI
    python: str  # sysconfig SOABI ("cpython-311-x86_64-linux-gnu")
    tvm_ffi: str  # the apache-tvm-ffi ABI series ("0.1": tvm_ffi_abi)

    def filename(self) -> str:
        """The shipped bridge's file name: the fields spelled out for a reader, and a digest of
        their exact values, so that equal names mean equal keys. (A Python identifier before
        ``.so``, as a wheel's checks want of a library in a package.)"""
        parts = (
            f"torch{self.torch}",
            f"g{self.git[:12] or 'none'}",
            f"abi{self.cxx11_abi}",
            self.python,
            f"tvmffi{self.tvm_ffi}",
        )
        exact = "\0".join((self.torch, self.git, str(self.cxx11_abi), self.python, self.tvm_ffi))
        digest = hashlib.sha256(exact.encode()).hexdigest()[:10]
        return "torch_bridge_" + "_".join(_UNSAFE.sub("_", p) for p in parts) + f"_{digest}.so"

    def describe(self) -> str:
        return (
            f"torch {self.torch} ({self.git[:12] or 'no commit'}), C++ ABI {self.cxx11_abi}, "
            f"{self.python}, tvm-ffi {self.tvm_ffi}"
        )


def python_abi() -> str:
    """This interpreter's extension ABI (free-threaded builds have their own)."""
    return str(sysconfig.get_config_var("SOABI") or "unknown")


def tvm_ffi_abi(version: str) -> str:
    """The ABI series of an apache-tvm-ffi version: its major.minor ("0.1.15.post2" -> "0.1")."""
    return ".".join(version.split(".")[:2])


def current() -> Key:
    """The key of this process (imports torch)."""
    import torch

    from .jit.compile.toolchain import tvm_ffi_version

    return Key(
        torch=str(torch.__version__),
        git=str(getattr(torch.version, "git_version", "") or ""),
        cxx11_abi=int(torch._C._GLIBCXX_USE_CXX11_ABI),
        python=python_abi(),
        tvm_ffi=tvm_ffi_abi(tvm_ffi_version()),
    )


def shipped() -> Path | None:
    """The wheel's bridge for this process's key, or None (none shipped for it: build one)."""
    path = SHIPPED_DIR / current().filename()
    return path if path.is_file() else None


def shipped_names() -> list[str]:
    """Every bridge the wheel ships (for ``env``: what a process that matched none could have had)."""
    return sorted(p.name for p in SHIPPED_DIR.glob("torch_bridge_*.so")) if SHIPPED_DIR.is_dir() else []


def compile_flags(torch_dir: Path, cxx11_abi: int, python_include: Path | None) -> list[str]:
    """The compile flags of the bridge against the torch package at ``torch_dir`` (an installed one
    or one unpacked from its wheel); ``python_include``: the interpreter's headers (the entries)."""
    from .jit.compile.toolchain import tvm_ffi_paths

    includes, _ = tvm_ffi_paths()
    dlpack = [p / "dlpack" for p in includes if (p / "dlpack").is_dir()]
    return [
        "-O2",
        "-std=c++20",  # (torch's headers from 2.13 on use C++20 features)
        "-fPIC",
        "-w",
        f"-D_GLIBCXX_USE_CXX11_ABI={cxx11_abi}",
        *(f"-I{p}" for p in includes),
        *(f"-I{p.parent}" for p in dlpack),
        f"-I{torch_dir / 'include'}",
        f"-I{torch_dir / 'include' / 'torch' / 'csrc' / 'api' / 'include'}",
        *(["-DBRIDGE_PY_ENTRY", f"-I{python_include}"] if python_include is not None else []),
    ]


def link_flags(torch_dir: Path, *, entries: bool, rpath: bool) -> list[str]:
    """The link flags; ``rpath``: find torch's and tvm-ffi's libraries where they are now (a cache
    build). A shipped bridge has none: torch and tvm-ffi have loaded those libraries (by their
    sonames) before it loads."""
    from .jit.compile.toolchain import tvm_ffi_paths

    _, libtvm = tvm_ffi_paths()
    lib = torch_dir / "lib"
    return [
        "-shared",
        f"-L{lib}",
        *(["-ltorch_python"] if entries else []),
        "-ltorch_cpu",
        "-lc10",
        *([f"-Wl,-rpath,{lib}"] if rpath else []),
        str(libtvm),
        *([f"-Wl,-rpath,{libtvm.parent}"] if rpath else []),
    ]
