"""The prebuilt torch bridges a wheel ships: one compile per torch release of targets.toml ``bridge_torch``.

For each release, setup.py's build fetches torch's wheel for the build interpreter's CPython and
machine (``pip download torch===<v> --no-deps``, exactly that build: no install, nothing imported), unpacks only its
headers and the three libraries the bridge links (libtorch_python, libtorch_cpu, libc10) into the
build directory, reads the build's facts from the wheel (``torch/version.py``; the C++ ABI from
libc10's mangled names) and compiles ``jit/csrc/torch_bridge.cpp`` against them with the build's
tvm-ffi and Python headers. The library is named by its :class:`opmux.kernels._bridge_key.Key`,
so a process loads it only on that exact torch build, Python and tvm-ffi.

The compiles run in parallel (one per core); a release that cannot be fetched or compiled is
recorded as left out, with why (setup.py refuses that under ``OPMUX_REQUIRE_AOT=1``).
Standard library and opmux's torch-free build API only (setup.py runs it in the isolated build
environment).
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `tools` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools import targets as _targets

__all__ = ["FetchError", "build", "fetch_torch", "torch_facts"]

#: what the bridge links (libtorch_python only for its Python entries, which a shipped one has)
_LIBS = ("libtorch_python.so", "libtorch_cpu.so", "libc10.so")
_VERSION = re.compile(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", re.M)
_GIT = re.compile(r"^git_version\s*=\s*['\"]([^'\"]*)['\"]", re.M)
#: a hung download or compiler is stopped after this long, with a typed error
_FETCH_TIMEOUT_S = 1800
_COMPILE_TIMEOUT_S = 3600


class FetchError(RuntimeError):
    """torch's wheel for this interpreter and machine could not be fetched or read."""


def _pip() -> list[str]:
    """A pip to fetch with: this interpreter's, else the one on PATH (build's isolated environment
    may have none of its own); the target interpreter is named explicitly either way. (Asked in a
    subprocess: looking pip up here would make setuptools' distutils shim step aside.)"""
    own = [sys.executable, "-m", "pip"]
    if subprocess.run([*own, "--version"], capture_output=True, check=False).returncode == 0:
        return own
    found = shutil.which("pip3") or shutil.which("pip")
    if found is None:
        raise FetchError("no pip to fetch torch with (neither this interpreter's nor one on PATH)")
    return [found]


def fetch_torch(version: str, dest: Path) -> Path:
    """torch ``version``'s wheel for this interpreter and machine, downloaded into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    py = f"{sys.version_info.major}{sys.version_info.minor}"
    machine = platform.machine()
    platforms = [f"manylinux_2_{n}_{machine}" for n in (28, 27, 17)] + [f"manylinux2014_{machine}"]
    command = [
        *_pip(), "download", _targets.torch_pin(version), "--no-deps", "--only-binary=:all:", "--quiet",
        "--disable-pip-version-check", "--dest", str(dest), "--python-version", py,
        "--implementation", "cp", "--abi", f"cp{py}{sys.abiflags}",
        *(a for p in platforms for a in ("--platform", p)),
    ]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_FETCH_TIMEOUT_S)
    except subprocess.TimeoutExpired as err:
        raise FetchError(
            f"pip download torch==={version} ran past {_FETCH_TIMEOUT_S} s and was stopped"
        ) from err
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise FetchError(f"pip download torch==={version} failed: {' / '.join(tail)}")
    wheels = sorted(dest.glob("torch-*.whl"))
    if len(wheels) != 1:
        raise FetchError(f"pip download torch==={version} left {[w.name for w in wheels]} in {dest}")
    return wheels[0]


def torch_facts(wheel: Path, unpack_to: Path) -> tuple[Path, str, str, int]:
    """Unpack what the bridge compiles and links against; -> (the torch package directory, its
    ``__version__``, ``git_version``, C++ ABI)."""
    with zipfile.ZipFile(wheel) as zf:
        members = [
            n
            for n in zf.namelist()
            if n.startswith("torch/include/") or n in {"torch/version.py", *(f"torch/lib/{x}" for x in _LIBS)}
        ]
        zf.extractall(unpack_to, members=members)
    torch_dir = unpack_to / "torch"
    text = (torch_dir / "version.py").read_text(encoding="utf-8")
    version, git = _VERSION.search(text), _GIT.search(text)
    if version is None:
        raise FetchError(f"{wheel.name}: torch/version.py has no __version__")
    # the new (C++11) std::string ABI mangles as std::__cxx11::basic_string
    abi = int(b"St7__cxx11" in (torch_dir / "lib" / "libc10.so").read_bytes())
    return torch_dir, version.group(1), git.group(1) if git else "", abi


def _one(version: str, out_dir: Path, workdir: Path, cxx: str) -> tuple[str, dict[str, Any]]:
    """Fetch, unpack and compile the bridge of one torch release; -> (its file name, its
    build-info entry)."""
    from opmux.kernels import _bridge_key
    from opmux.kernels.jit.compile.build import CompileError
    from opmux.kernels.jit.compile.toolchain import tvm_ffi_version

    work = workdir / f"torch-{re.sub(r'[^A-Za-z0-9._-]', '_', version)}"
    shutil.rmtree(work, ignore_errors=True)
    partial: Path | None = None
    try:
        wheel = fetch_torch(version, work / "wheel")
        torch_dir, torch_version, git, abi = torch_facts(wheel, work / "unpacked")
        wheel.unlink()  # (hundreds of MB)
        include = Path(sysconfig.get_paths()["include"])
        key = _bridge_key.Key(
            torch_version, git, abi, _bridge_key.python_abi(), _bridge_key.tvm_ffi_abi(tvm_ffi_version())
        )
        target = out_dir / key.filename()
        partial = out_dir / f".{target.name}.partial"  # renamed into place once whole
        maps = [f"-ffile-prefix-map={torch_dir}=torch", f"-ffile-prefix-map={include}=python"]
        command = [
            cxx,
            *maps,
            *_bridge_key.compile_flags(torch_dir, abi, include),
            str(Path(_bridge_key.__file__).parent / "jit" / "csrc" / "torch_bridge.cpp"),
            "-o",
            str(partial),
            *_bridge_key.link_flags(torch_dir, entries=True, rpath=False),
        ]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=_COMPILE_TIMEOUT_S)
        except subprocess.TimeoutExpired as err:
            raise CompileError(
                command, -1, f"the compiler ran past {_COMPILE_TIMEOUT_S} s and was stopped"
            ) from err
        if done.returncode != 0:
            raise CompileError(command, done.returncode, done.stderr + done.stdout)
        os.replace(partial, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if partial is not None:
            partial.unlink(missing_ok=True)
    return target.name, {
        "requested": version,
        "torch": key.torch,
        "git": key.git,
        "cxx11_abi": key.cxx11_abi,
        "python": key.python,
        "tvm_ffi": key.tvm_ffi,
    }


def build(
    versions: tuple[str, ...], out_dir: Path, workdir: Path, cxx: str, log: Callable[[str], None]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Build the bridges of ``versions`` into ``out_dir`` with the compiler ``cxx``; -> (the
    built ones by file name, the left-out ones by version with why)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    built: dict[str, Any] = {}
    missing: dict[str, Any] = {}
    with ThreadPoolExecutor(max_workers=max(1, min(len(versions), os.cpu_count() or 1))) as pool:
        jobs = {v: pool.submit(_one, v, out_dir, workdir, cxx) for v in versions}
        for version, job in jobs.items():
            try:
                name, entry = job.result()
            except Exception as exc:
                text = str(exc).strip().splitlines()
                why = "torch" if isinstance(exc, FetchError) else "compile"
                missing[version] = {"why": why, "message": text[-1] if text else type(exc).__name__}
                continue
            built[name] = entry
            log(f"  torch bridge for torch {entry['torch']} ({entry['python']}): {name}")
    return dict(sorted(built.items())), missing
