"""Run the compiler: one shared library from C++ or CUDA sources, linked against tvm-ffi.

This is the one place that knows compiler flags. The JIT loader (into a private staging dir)
and ``setup.py`` (the AOT libraries) both call :func:`build_shared_library`, so a kernel
builds the same way in both delivery modes. :func:`compile_flags` gives the path-free part
of the command line, which the cache key hashes.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ... import _env
from .toolchain import (
    Toolchain,
    cutlass_include_dir,
    find_cutlass,
    find_cxx,
    find_nvcc,
    tvm_ffi_paths,
    uses_cutlass,
)

__all__ = [
    "CompileError",
    "CompileStats",
    "CompileTimeout",
    "build_shared_library",
    "compile_flags",
    "stats",
]

Device = Literal["cpu", "cuda"]

_ARCH = re.compile(r"sm_\d+[af]?")
_PTX = re.compile(r"compute_\d+[af]?")


class CompileError(RuntimeError):
    """The compiler failed. Carries the command, its exit status and its stderr; picklable,
    so a failure in a prewarm worker process reaches the parent intact."""

    def __init__(self, command: Sequence[str], returncode: int, stderr: str) -> None:
        self.command = list(command)
        self.returncode = returncode
        self.stderr = stderr
        tail = stderr if len(stderr) <= 8000 else "...\n" + stderr[-8000:]
        super().__init__(f"opmux: compile failed (exit {returncode}): {shlex.join(self.command)}\n{tail}")

    def __reduce__(self) -> tuple[type, tuple[list[str], int, str]]:
        return (type(self), (self.command, self.returncode, self.stderr))


class CompileTimeout(CompileError):
    """The compiler ran longer than ``OPMUX_JIT_COMPILE_TIMEOUT`` and was killed, with every
    process it started. ``seconds`` is the limit; ``stderr`` what it printed before."""

    def __init__(self, command: Sequence[str], seconds: float, stderr: str) -> None:
        self.seconds = seconds
        super().__init__(command, -9, stderr)
        self.args = (
            f"opmux: compile killed after {seconds:g} s (OPMUX_JIT_COMPILE_TIMEOUT): "
            f"{shlex.join(self.command)}\n{stderr[-8000:]}\nA hung compiler or an overloaded "
            f"machine; raise OPMUX_JIT_COMPILE_TIMEOUT, or prewarm the cache before serving "
            f"(python -m opmux.kernels.jit prewarm).",
        )

    def __reduce__(self) -> tuple[type, tuple[list[str], float, str]]:  # type: ignore[override]
        return (type(self), (self.command, self.seconds, self.stderr))


@dataclass
class CompileStats:
    """Process-wide counters, so tests can assert "one compile for ten calls".

    ``compiles``: finished compiler runs (one per built library); ``hits``: loads served
    from the on-disk cache; ``memo_hits``: calls answered from the per-process memo;
    ``rebuilds``: entries rejected (digest mismatch) and rebuilt.
    """

    compiles: int = 0
    hits: int = 0
    memo_hits: int = 0
    rebuilds: int = 0

    def reset(self) -> None:
        self.compiles = self.hits = self.memo_hits = self.rebuilds = 0


#: The process-wide counters (re-exported as ``opmux.kernels.jit.compile.stats``).
stats = CompileStats()


def _check_archs(archs: Sequence[str], ptx_arch: str | None) -> None:
    bad = [a for a in archs if not _ARCH.fullmatch(a)]
    if bad:
        raise ValueError(f"opmux: invalid CUDA arch {bad}; expected like 'sm_80', 'sm_90a'")
    if ptx_arch is not None and not _PTX.fullmatch(ptx_arch):
        raise ValueError(f"opmux: invalid ptx_arch {ptx_arch!r}; expected like 'compute_90'")
    if not archs and ptx_arch is None:
        raise ValueError("opmux: a CUDA build needs archs (e.g. ['sm_90a']) or a ptx_arch")


def compile_flags(device: Device, *, archs: Sequence[str] = (), ptx_arch: str | None = None) -> list[str]:
    """The flags that shape the output, with no paths in them (the cache key hashes these).

    CPU: ``-std=c++17 -O3 -fno-trapping-math -fPIC -shared -fopenmp`` (``-fopenmp`` is dropped
    at build time when the compiler cannot link OpenMP). ``-fno-trapping-math`` (clang's default)
    lets GCC if-convert the clamps and selects of the portable kernels (exp_f, the activations),
    so their loops vectorize in the x86-64-v3 / AVX2 clones: without it they stay scalar (the
    silu row 8x slower on an AVX2 CPU without AVX-512, docs/benchmarks/cpu.md). It changes no value (no reassociation, no
    finite-math assumption); only floating-point exception flags, which nothing reads.
    CUDA: ``-std=c++17 -O3 --expt-relaxed-constexpr -Xcompiler -fPIC -shared -DNDEBUG
    --threads=0 --split-compile=0``, then one ``-gencode`` per arch plus PTX.

    Both hide every symbol but the exported FFI functions (``-fvisibility=hidden``,
    ``-fvisibility-inlines-hidden``; tvm-ffi's export macro marks those default; GCC still exports
    the CPU units' ``target_clones`` resolvers, functions without state). A unit's JIT
    module and the AOT library hold the same source: with default visibility the static locals
    of their templates and inline functions (a kernel's "shared memory opted in" flag, occupancy
    caches) are GNU-unique symbols, which the dynamic linker makes one object for the whole
    process. Then a kernel of one copy launched on the other copy's flag without its own opt-in:
    ``cudaErrorInvalidValue`` (sampling_cuda on an H100 once both copies had run, session 33).
    """
    hidden = ["-fvisibility=hidden", "-fvisibility-inlines-hidden"]
    if device == "cpu":
        return ["-std=c++17", "-O3", "-fno-trapping-math", "-fPIC", *hidden, "-shared", "-fopenmp"]
    if device == "cuda":
        _check_archs(archs, ptx_arch)
        # --expt-relaxed-constexpr: CUTLASS / CuTe call constexpr host functions from
        # host-device code (CUTLASS's own builds pass it); it changes nothing for other units.
        flags = ["-std=c++17", "-O3", "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC", "-shared"]
        flags += [f for h in hidden for f in ("-Xcompiler", h)]
        # -DNDEBUG: CUTLASS's device asserts are calls; a call in a wgmma mainloop makes ptxas
        # serialize the pipeline (C7510, seen on moe_grouped_cuda's grouped GEMMs without it).
        # CUTLASS's own release builds pass it; no opmux unit uses assert().
        flags.append("-DNDEBUG")
        # the device-code optimizer and ptxas on every core: one arch's kernels in parallel
        # (--split-compile; gemm_cuda's 18 CUTLASS instantiations compiled 166 s in one thread
        # on the H200 host) and the archs of an AOT build side by side (--threads)
        flags += ["--threads=0", "--split-compile=0"]
        for arch in archs:
            flags += ["-gencode", f"arch=compute_{arch[3:]},code={arch}"]
        if ptx_arch is not None:
            flags += ["-gencode", f"arch={ptx_arch},code={ptx_arch}"]
        return flags
    raise ValueError(f"opmux: unknown device {device!r}; valid: 'cpu', 'cuda'")


@functools.cache
def _supports_openmp(cxx: str) -> bool:
    # clang without libomp accepts -fopenmp when preprocessing but fails to link; try both.
    with tempfile.TemporaryDirectory(prefix="opmux-omp-") as tmp:
        src = Path(tmp) / "omp.cpp"
        src.write_text("#include <omp.h>\nint f() { return omp_get_max_threads(); }\n")
        try:
            _run([cxx, "-fopenmp", "-fPIC", "-shared", str(src), "-o", str(Path(tmp) / "omp.so")], [])
        except CompileTimeout:
            raise
        except CompileError:
            return False
        return True


def _run(command: list[str], log: list[str]) -> None:
    """Run one compiler command, killed (its whole process group) after the compile timeout."""
    log.append(shlex.join(command))
    timeout = float(_env.get("OPMUX_JIT_COMPILE_TIMEOUT"))
    try:
        proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            # same process group as ours: whoever kills our group (prewarm --budget) kills it too
        )
    except OSError as exc:  # not executable, vanished: the compiler's fault, not the cache's
        raise CompileError(command, -1, f"cannot run the compiler: {exc}") from exc
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = _drain(proc)
        raise CompileTimeout(command, timeout, err + out) from None
    except BaseException:  # KeyboardInterrupt, a budget kill of our caller: leave no compiler
        _kill_group(proc)
        _drain(proc)
        raise
    if proc.returncode != 0:
        raise CompileError(command, proc.returncode, err + out)


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from ``/proc``; empty where there is none)."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rpartition(")")[2].split()
            children.setdefault(int(fields[1]), []).append(int(name))
        except (OSError, IndexError, ValueError):
            continue
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _drain(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """What a killed compiler printed; never waits long: a process it started that escaped
    the kill (reparented) may hold its pipes open, and then the output is given up."""
    try:
        out, err = proc.communicate(timeout=2)
    except subprocess.TimeoutExpired:
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=2)
        return "", "(output lost: a process the compiler started kept its pipes open)"
    return out or "", err or ""


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """Kill the compiler and everything it started (nvcc runs cicc, ptxas, the host cc...)."""
    for pid in [*_descendants(proc.pid), proc.pid]:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _link_flags(device: Device, lib: Path) -> list[str]:
    # No rpath: modules are only ever opened through tvm_ffi.load_module, after tvm_ffi has
    # loaded libtvm_ffi.so, so the dependency resolves by soname. An rpath would bake the
    # build machine's (often temporary) path into shipped libraries and break reproducibility.
    del device
    return [f"-L{lib.parent}", "-ltvm_ffi"]


def _merge_depfiles(target: Path, parts: Sequence[Path], output: Path) -> None:
    deps: list[str] = []
    for part in parts:
        text = part.read_text().replace("\\\n", " ")
        _, _, rest = text.partition(": ")
        deps.append(rest.strip())
    target.write_text(f"{output}: " + " ".join(deps) + "\n")


def _cutlass_includes(device: Device, sources: Sequence[Path], include_dirs: Sequence[Path]) -> list[Path]:
    """CUTLASS's include dir for a CUDA build (unless the caller passed it), [] for CPU builds."""
    if device != "cuda":
        return []
    given = {Path(d).resolve() for d in include_dirs}
    include = find_cutlass() if uses_cutlass(sources) else cutlass_include_dir()
    if include is None or include.resolve() in given:
        return []
    return [include]


def build_shared_library(
    output: Path,
    *,
    sources: Sequence[Path],
    device: Device,
    archs: Sequence[str] = (),
    ptx_arch: str | None = None,
    include_dirs: Sequence[Path] = (),
    toolchain: Toolchain | None = None,
    depfile: Path | None = None,
) -> list[str]:
    """Compile ``sources`` into the shared library ``output``; return the commands run.

    ``include_dirs`` come first (the JIT loader passes ``KERNEL_PATH/include`` and
    ``KERNEL_PATH/csrc``), then tvm-ffi's headers, then (CUDA builds) CUTLASS's headers from the
    installed nvidia-cutlass package: a source that includes ``cutlass/`` or ``cute/`` headers
    needs them (:class:`~.toolchain.ToolchainNotFound` naming ``pip install nvidia-cutlass``
    otherwise), any other CUDA build gets them when they are installed (the AOT unit includes
    the CUTLASS-based units indirectly); the library links ``-ltvm_ffi`` with an
    rpath to tvm-ffi's lib dir. ``depfile`` receives the make-style list of headers the
    compiler read (``-MMD``), which the cache key needs. ``toolchain`` defaults to
    :func:`find_cxx` / :func:`find_nvcc`. Prints one progress line to stderr.
    Raises :class:`CompileError` with the compiler's output when it fails.
    """
    if not sources:
        raise ValueError("opmux: build_shared_library needs at least one source")
    flags = compile_flags(device, archs=archs, ptx_arch=ptx_arch)
    if toolchain is None:
        toolchain = find_cxx() if device == "cpu" else find_nvcc()
    if device == "cpu" and not _supports_openmp(toolchain.path):
        flags.remove("-fopenmp")
    tvm_includes, libtvm = tvm_ffi_paths()
    includes = [
        f"-I{d}" for d in [*include_dirs, *tvm_includes, *_cutlass_includes(device, sources, include_dirs)]
    ]
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    commands: list[str] = []
    start = time.monotonic()
    label = f"opmux: compiling {output.stem} ({device}) ..."
    try:
        if len(sources) == 1:
            dep = ["-MMD", "-MF", str(depfile)] if depfile is not None else []
            _run(
                [
                    toolchain.path,
                    *flags,
                    *includes,
                    *dep,
                    str(sources[0]),
                    "-o",
                    str(output),
                    *_link_flags(device, libtvm),
                ],
                commands,
            )
        else:
            # One depfile per translation unit, so compile separately and link at the end.
            objdir = Path(tempfile.mkdtemp(prefix=".objs-", dir=output.parent))
            try:
                objects: list[str] = []
                deps: list[Path] = []
                compile_only = [f for f in flags if f != "-shared"]
                for index, source in enumerate(sources):
                    obj = objdir / f"{index}.o"
                    part = objdir / f"{index}.d"
                    _run(
                        [
                            toolchain.path,
                            *compile_only,
                            *includes,
                            "-MMD",
                            "-MF",
                            str(part),
                            "-c",
                            str(source),
                            "-o",
                            str(obj),
                        ],
                        commands,
                    )
                    objects.append(str(obj))
                    deps.append(part)
                _run(
                    [toolchain.path, *flags, *objects, "-o", str(output), *_link_flags(device, libtvm)],
                    commands,
                )
                if depfile is not None:
                    _merge_depfiles(Path(depfile), deps, output)
            finally:
                shutil.rmtree(objdir, ignore_errors=True)
    except CompileError:
        sys.stderr.write(f"{label} failed after {time.monotonic() - start:.1f} s\n")
        raise
    stats.compiles += 1
    sys.stderr.write(f"{label} {time.monotonic() - start:.1f} s\n")
    sys.stderr.flush()
    return commands
