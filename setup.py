"""Only what setuptools cannot declare: the AOT libraries, the torch bridges, the build info and the wheel tag.

The target comes from ``[tool.opmux] target`` in pyproject.toml (each pyproject_<target>.toml
sets its own); what to build for it comes from targets.toml, which ships in the sdist.  The
libraries are built with opmux's own ``opmux.kernels.jit.compile.build.build_shared_library``
(torch-free), imported from this tree's python/ directory, into
``build_lib/opmux/kernels/aot/``.

The prebuilt torch bridges of the target's ``bridge_torch`` releases are compiled against torch
wheels fetched for the build interpreter (tools/torch_bridges.py) into
``build_lib/opmux/kernels/bridges/``.

A target whose AOT compiler is absent still builds a wheel (namespace + JIT sources) and says
so; ``OPMUX_REQUIRE_AOT=1`` makes that an error (release builds set it).  ``OPMUX_RELEASE=1``
refuses a dirty or untagged git tree and any development version (tools/release.py).
``OPMUX_REQUIRE_AOT=1`` also refuses a wheel without every torch bridge of its target.

Reproducible: the same sources and ``SOURCE_DATE_EPOCH`` give the same bytes, wherever the tree
and the isolated build environment sit.  The libraries are compiled through a small compiler
wrapper (:func:`_reproducible_toolchain`) that maps those directories out of ``__FILE__`` and
debug paths and drops the rpath to the build environment's tvm_ffi: the shipped libraries find
``libtvm_ffi.so`` through the tvm_ffi package, which ``tvm_ffi.load_module`` has already loaded.
"""

from __future__ import annotations

import datetime as _dt
import functools
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

SRC = Path(__file__).resolve().parent
sys.path[:0] = [str(SRC / "python"), str(SRC)]  # opmux's torch-free build API and tools/

from tools import release as _release  # noqa: E402
from tools import targets as _targets  # noqa: E402

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

AOT_SOURCES = {"cpu": "csrc/aot_cpu.cpp", "cuda": "csrc/aot_cuda.cu"}
#: written into the sdist by Sdist: the commit and timestamp its wheels record (reproducible builds)
SOURCE_FACTS = "BUILD_SOURCE.json"
JIT_DIR = SRC / "python" / "opmux" / "kernels" / "jit"
HOW_TO_GET = {
    "cxx": "install g++ or clang++ (e.g. apt-get install g++) or set CXX",
    "nvcc": "install the CUDA toolkit or set CUDA_HOME",
    "hipcc": "install ROCm or set ROCM_PATH",
}


def _log(msg: str) -> None:
    print(f"opmux: {msg}", file=sys.stderr, flush=True)


def _target() -> _targets.Target:
    pyproject = tomllib.loads((SRC / "pyproject.toml").read_text(encoding="utf-8"))
    name = pyproject.get("tool", {}).get("opmux", {}).get("target")
    table = _targets.load(SRC / "targets.toml")
    if name not in table:
        raise SystemExit(
            f"opmux: pyproject.toml [tool.opmux] target = {name!r}; targets.toml has {list(table)}"
        )
    return table[name]


def _require_aot() -> bool:
    return os.environ.get("OPMUX_REQUIRE_AOT", "").strip().lower() in ("1", "true", "yes", "on")


class _Heartbeat:
    """Prints a line every 15 s while a long compile runs, so CI logs show progress."""

    def __init__(self, what: str) -> None:
        self.what, self.start, self.done = what, time.monotonic(), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.done.wait(15):
            _log(f"  still compiling {self.what} ({time.monotonic() - self.start:.0f} s)")

    def __enter__(self) -> _Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()


def _pinned_nvcc(target: _targets.Target) -> Path | None:
    """nvcc of the CUDA toolkit packages that targets.toml pins as build requirements
    (``nvidia-cuda-nvcc`` installs ``nvidia/cu<major>/bin/nvcc`` into the build environment)."""
    if not target.build_requires or target.cuda_major is None:
        return None
    for entry in sys.path:
        nvcc = Path(entry or ".") / "nvidia" / f"cu{target.cuda_major}" / "bin" / "nvcc"
        if nvcc.is_file() and os.access(nvcc, os.X_OK):
            return nvcc
    return None


def _find_toolchain(compiler: str, target: _targets.Target):  # -> Toolchain
    from opmux.kernels.jit.compile import toolchain  # torch-free; lives in this tree

    if compiler == "nvcc":
        pinned = _pinned_nvcc(target)
        if target.build_requires and pinned is None:
            raise toolchain.ToolchainNotFound(
                f"CUDA {target.aot.toolkit} compiler (nvcc)",
                [f"build environment: nvidia/cu{target.cuda_major}/bin/nvcc"],
                f"the build requirements {list(target.build_requires)} were not installed "
                "(build with build isolation, e.g. `python -m build`)",
            )
        if pinned is not None:
            tc = toolchain._search("nvcc", [(str(pinned), "pinned build requirement")], "", "nvcc")
        else:
            tc = toolchain.find_nvcc()
        release = ".".join(map(str, toolchain.nvcc_release(tc)))
        if release != target.aot.toolkit:
            raise toolchain.ToolchainNotFound(
                f"CUDA {target.aot.toolkit} compiler (nvcc)",
                [f"{tc.path}: CUDA {release}"],
                f"target {target.name!r} builds with CUDA {target.aot.toolkit} (targets.toml aot.toolkit) "
                f"and refuses nvcc {release}: point $CUDA_HOME at a CUDA {target.aot.toolkit} toolkit",
            )
        return tc
    return {"cxx": toolchain.find_cxx, "hipcc": toolchain.find_hipcc}[compiler]()


_WRAPPER = """#!{python}
# Written by opmux's setup.py for one build: runs {real!r} with the build directories mapped
# out of the output and without an rpath (see setup.py _reproducible_toolchain).
import os, sys
REAL = {real!r}
EXTRA = {extra!r}
DROP = ("-Wl,-rpath,", "-Xlinker=-rpath,")
args = [a for a in sys.argv[1:] if not a.startswith(DROP)]
os.execv(REAL, [REAL, *EXTRA, *args])
"""


def _reproducible_toolchain(tc, workdir: Path):  # -> Toolchain
    """A Toolchain whose "compiler" is a wrapper around ``tc`` adding ``-ffile-prefix-map`` for
    this tree and the build environment's tvm_ffi, and dropping ``-rpath``.

    Interim: build.py's ``build_shared_library`` takes no extra flags, so the prefix maps go in
    through the wrapper.  (It no longer links an rpath since da216c3; dropping ``-rpath`` here is
    a guard that stays a no-op.)  Once it takes ``extra_flags=``, pass the maps there and delete
    this wrapper.
    """
    from dataclasses import replace

    from opmux.kernels.jit.compile.toolchain import tvm_ffi_paths

    _, libtvm = tvm_ffi_paths()
    maps = [f"{SRC}=.", f"{libtvm.parent.parent}=tvm_ffi"]
    flag = "-Xcompiler=-ffile-prefix-map=" if tc.kind in ("nvcc",) else "-ffile-prefix-map="
    extra = [flag + m for m in maps]
    root = Path(tc.path).resolve().parent.parent
    if tc.kind == "nvcc" and (root / "lib" / "libcudart_static.a").is_file():
        # the pip layout (nvidia/cu13/lib) is not where nvcc.profile looks (lib64/): static cudart
        extra.append(f"-L{root / 'lib'}")
    workdir.mkdir(parents=True, exist_ok=True)
    wrapper = workdir / f"opmux-{tc.kind}-wrapper"
    text = _WRAPPER.format(python=sys.executable, real=tc.path, extra=extra)
    wrapper.write_text(text, encoding="utf-8")
    wrapper.chmod(0o755)
    return replace(tc, path=str(wrapper))


def build_aot(target: _targets.Target, out_dir: Path, *, workdir: Path) -> dict:
    """Build the target's AOT libraries into ``out_dir``; return the build-info fields."""
    info: dict = {"toolchains": {}, "aot": [], "aot_missing": {}}
    libs = target.aot.libraries
    if not libs:
        _log(f"target {target.name!r} ships no AOT library (targets.toml: aot.compiler = 'none')")
        return info
    # the whole library is one translation unit per device, for every arch of the target: on a
    # small build machine that takes far longer than the JIT's serving-time compile limit (300 s)
    os.environ.setdefault("OPMUX_JIT_COMPILE_TIMEOUT", "3600")
    try:
        from opmux.kernels.jit.compile import build as _build
        from opmux.kernels.jit.compile import toolchain as _toolchain
        from opmux.kernels.jit.modules import write_aot_header
    except ImportError as exc:  # only while the tree is incomplete
        for lib in libs:
            info["aot_missing"][lib] = {"why": "build-api", "message": f"cannot import the build API: {exc}"}
        _report_missing(target, info["aot_missing"])
        return info
    out_dir.mkdir(parents=True, exist_ok=True)
    for i, lib in enumerate(libs, 1):
        compiler = target.aot.compiler_for(lib)
        filename = f"libopmux_aot_{lib}.so"
        source = SRC / AOT_SOURCES[lib]
        if not source.is_file():
            info["aot_missing"][lib] = {"why": "source", "message": f"{AOT_SOURCES[lib]} not found in {SRC}"}
            continue
        try:
            tc = _find_toolchain(compiler, target)
        except _toolchain.ToolchainNotFound as exc:
            detail = str(exc).removeprefix("opmux: ").strip()
            hint = "" if "install" in detail.lower() else f"; {HOW_TO_GET[compiler]}"
            msg = f"{compiler} not found: {detail}{hint}"
            info["aot_missing"][lib] = {"why": "toolchain", "message": msg}
            continue
        info["toolchains"][tc.kind] = {"path": tc.path, "version": tc.version}
        if lib == "cuda":
            # The CUDA library holds CUTLASS-based units (gemm_cuda.cu): their headers come from
            # the nvidia-cutlass build requirement (build_shared_library adds the include dir).
            try:
                _toolchain.find_cutlass()
            except _toolchain.ToolchainNotFound as exc:
                info["aot_missing"][lib] = {
                    "why": "toolchain",
                    "message": str(exc).removeprefix("opmux: ").strip(),
                }
                continue
        archs = list(target.aot.archs) if lib != "cpu" else []
        ptx = (target.aot.ptx or None) if lib != "cpu" else None
        _log(
            f"[{i}/{len(libs)}] compiling {filename} with {tc.path} ({tc.version})"
            + (f" for {archs}" if archs else "")
            + (f" + PTX {ptx}" if ptx else "")
        )
        start = time.monotonic()
        with _Heartbeat(filename):
            commands = _build.build_shared_library(
                out_dir / filename,
                sources=[source],
                device=lib,
                archs=archs,
                ptx_arch=ptx,
                include_dirs=[
                    JIT_DIR / "include",
                    JIT_DIR / "csrc",
                    write_aot_header(lib, workdir / "units"),
                ],
                toolchain=_reproducible_toolchain(tc, workdir),
            )
        for cmd in commands or []:
            _log(f"  $ {cmd if isinstance(cmd, str) else ' '.join(map(str, cmd))}")
        size = (out_dir / filename).stat().st_size / 2**20
        _log(f"[{i}/{len(libs)}] {filename}: {size:.1f} MiB in {time.monotonic() - start:.1f} s")
        info["aot"].append(filename)
    _report_missing(target, info["aot_missing"])
    return info


def build_bridges(target: _targets.Target, out_dir: Path, *, workdir: Path) -> dict:
    """The prebuilt torch bridges of ``target.bridge_torch`` (tools/torch_bridges.py) into
    ``out_dir``; return the build-info fields ``bridges`` and ``bridges_missing``."""
    info: dict = {"bridges": {}, "bridges_missing": {}}
    if not target.bridge_torch:
        return info
    from tools import torch_bridges

    from opmux.kernels.jit.compile import toolchain as _toolchain

    try:
        tc = _reproducible_toolchain(_toolchain.find_cxx(), workdir)
    except _toolchain.ToolchainNotFound as exc:
        message = f"cxx not found: {str(exc).removeprefix('opmux: ').strip()}; {HOW_TO_GET['cxx']}"
        info["bridges_missing"] = {v: {"why": "toolchain", "message": message} for v in target.bridge_torch}
    else:
        _log(f"building the torch bridges for torch {', '.join(target.bridge_torch)}")
        start = time.monotonic()
        with _Heartbeat("the torch bridges"):
            built, missing = torch_bridges.build(
                target.bridge_torch, out_dir, workdir / "torch-bridges", tc.path, _log
            )
        _log(f"{len(built)} torch bridge(s) in {time.monotonic() - start:.1f} s")
        info = {"bridges": built, "bridges_missing": missing}
    _report_missing(target, info["bridges_missing"], "torch bridge for torch", "the torch bridges of ")
    return info


def _report_missing(
    target: _targets.Target, missing: dict, what: str = "AOT library for", lacks: str = ""
) -> None:
    """Say what was left out and why; under OPMUX_REQUIRE_AOT=1 (release builds) refuse it."""
    for name, why in missing.items():
        _log(f"{what} {name} left out: {why['message']}")
    if missing and _require_aot():
        raise SystemExit(
            f"opmux: OPMUX_REQUIRE_AOT=1 and the {target.name} wheel would lack "
            f"{lacks}{sorted(missing)}; see the messages above"
        )


@functools.cache
def _source_facts() -> dict:
    """The commit and SOURCE_DATE_EPOCH recorded in the sdist this tree was unpacked from."""
    import json

    path = SRC / SOURCE_FACTS
    try:
        facts = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except ValueError as exc:
        raise SystemExit(f"opmux: {path} is not valid JSON ({exc}); rebuild the sdist") from None
    return facts if isinstance(facts, dict) else {}


def _git_commit() -> str | None:
    if os.environ.get("OPMUX_GIT_COMMIT"):
        return os.environ["OPMUX_GIT_COMMIT"]
    if commit := _source_facts().get("commit"):
        return str(commit)
    if not (SRC / ".git").exists():
        return None
    try:
        out = subprocess.run(
            ["git", "-C", str(SRC), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30
        )
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _source_date_epoch() -> str | None:
    """SOURCE_DATE_EPOCH, else the sdist's recorded one: a wheel built from an sdist is
    reproducible without anyone remembering to export it."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH") or _source_facts().get("source_date_epoch")
    if epoch:
        os.environ["SOURCE_DATE_EPOCH"] = str(epoch)  # bdist_wheel's zip timestamps read it too
    return str(epoch) if epoch else None


def _build_time() -> str:
    epoch = _source_date_epoch()
    when = (
        _dt.datetime.fromtimestamp(int(epoch), _dt.timezone.utc)
        if epoch
        else _dt.datetime.now(_dt.timezone.utc)
    )
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _cuda_facts(target: _targets.Target) -> dict:
    """The CUDA release this wheel needs, and the wheels to install on an older driver (read by
    the AOT loader's driver check)."""
    table = _targets.load(SRC / "targets.toml")
    older = [
        {"distribution": t.distribution, "toolkit": t.aot.toolkit, "driver": t.driver}
        for t in table.values()
        if t.cuda_major is not None and target.cuda_major is not None and t.cuda_major < target.cuda_major
    ]
    return {"toolkit": target.aot.toolkit, "driver": target.driver, "older": older}


def write_build_info(path: Path, fields: dict) -> None:
    body = "".join(f"    {k!r}: {v!r},\n" for k, v in fields.items())
    path.write_text(
        '"""Build facts of this wheel, written by setup.py at build time (see targets.toml)."""\n\n'
        "from typing import Any\n\n"
        f"BUILD_INFO: dict[str, Any] = {{\n{body}}}\n",
        encoding="utf-8",
    )


def _check_release(version: str) -> None:
    """OPMUX_RELEASE=1: refuse a dirty or untagged git tree and a development version."""
    if not _release.requested():
        return
    problems = _release.check(SRC, version)
    if problems:
        raise SystemExit(_release.refusal(problems))
    _log(f"release build of version {version}: tree and version checked")


def _tar_filter_mode(path: Path) -> int:
    return 0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644


def write_reproducible_tarball(archive: Path, base_dir: str) -> Path:
    """A .tar.gz of ``base_dir`` whose bytes depend on file names and contents only: sorted
    members, owner 0/0 with no names, modes 0644/0755, and every timestamp (member mtimes and
    the gzip header) set to ``SOURCE_DATE_EPOCH`` when it is set."""
    import gzip
    import tarfile

    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    paths = [Path(base_dir)]
    for dirpath, dirnames, filenames in os.walk(base_dir):
        dirnames.sort()
        paths += [Path(dirpath, d) for d in dirnames] + [Path(dirpath, f) for f in sorted(filenames)]
    paths = [paths[0], *sorted(paths[1:], key=lambda p: p.as_posix())]
    with open(archive, "wb") as raw:
        mtime = int(epoch) if epoch else None
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=mtime, compresslevel=9) as gz:
            with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for path in paths:
                    info = tar.gettarinfo(str(path), arcname=path.as_posix())
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    info.mode = _tar_filter_mode(path)
                    if epoch:
                        info.mtime = int(epoch)
                    if info.isfile():
                        with open(path, "rb") as fh:
                            tar.addfile(info, fh)
                    else:
                        tar.addfile(info)
    return archive


class Sdist(sdist):
    """sdist, refusing a non-releasable tree under OPMUX_RELEASE=1.

    The sdist carries no target: every pyproject_<target>.toml, targets.toml, csrc/ and the
    tools setup.py imports ship in it (MANIFEST.in), so any target's wheel builds from it after
    copying pyproject_<target>.toml over pyproject.toml.
    """

    def run(self) -> None:
        _check_release(self.distribution.get_version())
        super().run()

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        import json

        super().make_release_tree(base_dir, files)
        facts = {"commit": _git_commit(), "source_date_epoch": _source_date_epoch()}
        (Path(base_dir) / SOURCE_FACTS).write_text(json.dumps(facts, sort_keys=True) + "\n", encoding="utf-8")

    def make_archive(self, base_name, format, root_dir=None, base_dir=None, owner=None, group=None):
        if format != "gztar" or root_dir is not None or base_dir is None:
            return super().make_archive(base_name, format, root_dir, base_dir, owner=owner, group=group)
        return str(write_reproducible_tarball(Path(base_name + ".tar.gz"), base_dir))


class BuildPy(build_py):
    """build_py, then the AOT libraries and _build_info.py of the target."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return  # an editable install uses the tree: JIT only, tree _build_info
        target = _target()
        version = self.distribution.get_version()
        _check_release(version)
        pkg = Path(self.build_lib) / "opmux"
        _log(f"building target {target.name!r} (distribution {target.distribution!r}, version {version})")
        if not _release.is_release_version(version):
            _log(f"version {version} is a development version (not publishable)")
        workdir = Path(self.get_finalized_command("build").build_temp) / "opmux-aot"
        aot = build_aot(target, pkg / "kernels" / "aot", workdir=workdir)
        self.distribution._opmux_aot = aot["aot"]  # read by BdistWheel for the wheel tag
        bridges = build_bridges(target, pkg / "kernels" / "bridges", workdir=workdir)
        fields = {
            "target": target.name,
            "distribution": target.distribution,
            "version": version,
            "dev": not _release.is_release_version(version),
            "toolchains": aot["toolchains"],
            "archs": list(target.aot.archs) if aot["aot"] and target.aot.archs else [],
            "cuda": _cuda_facts(target) if "libopmux_aot_cuda.so" in aot["aot"] else None,
            "ptx": (target.aot.ptx or None) if aot["aot"] else None,
            "aot": aot["aot"],
            "aot_missing": aot["aot_missing"],
            **bridges,
            "commit": _git_commit(),
            "build_time": _build_time(),
        }
        write_build_info(pkg / "_build_info.py", fields)


class BdistWheel(bdist_wheel):
    """Tag py3-none-<platform> when AOT libraries ship (they bind through tvm-ffi, not CPython)."""

    def run(self) -> None:
        if not self.skip_build:
            self.run_command("build")
        self.root_is_pure = not getattr(self.distribution, "_opmux_aot", [])
        if not self.root_is_pure:
            # install_lib then puts the package in platlib, the wheel's root, not in .data/purelib
            self.distribution.has_ext_modules = lambda: True
        super().run()

    def get_tag(self) -> tuple[str, str, str]:
        impl, abi, plat = super().get_tag()
        return ("py3", "none", plat) if not self.root_is_pure else (impl, abi, plat)


setup(cmdclass={"build_py": BuildPy, "bdist_wheel": BdistWheel, "sdist": Sdist})
