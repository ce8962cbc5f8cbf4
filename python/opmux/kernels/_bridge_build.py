"""Building the torch bridge (``jit/csrc/torch_bridge.cpp``): one build per torch build, across processes.

Only for a torch build the wheel ships no bridge for (``_bridge_key``: a shipped one is loaded by
``torch_kernels`` and nothing here runs). The bridge is compiled against this interpreter's torch into the JIT cache
(``<cache>/torch_bridge/<key>/torch_bridge.so``, the key in :func:`library_path`). Two ways in:

* :func:`build`, in the calling process: ``enable()``, ``prewarm --torch-kernels``, and the
  builder below. It takes the bridge's build lock (waiting for a build in progress elsewhere,
  then finding its library), removes what dead builds left (``.torch_bridge.*.so`` staging files:
  builds run only under the lock, so any found there belongs to a dead one), compiles into a
  private staging file and ``os.replace``\\ s it into place: readers see the whole library or
  none. The compiler dies with the process that runs it (``PR_SET_PDEATHSIG`` where that process
  has one thread; otherwise a compile interrupted by an exception is killed as the JIT's are).
* :func:`obtain`, from the background thread of a process whose first library-op or default call
  wants the bridge. If no build is running it starts ONE builder: a detached process (its own
  session, ``python -m opmux.kernels._bridge_build``) handed the build lock already taken (the
  lock's open file is inherited), so a second process finds the lock held and starts nothing;
  then it polls for the library while the Python kernels serve. The process may exit at any
  time: the builder does not belong to it, completes and publishes, and the next process loads
  the library at once.

Why a detached builder rather than a build killed at exit: the users this is for are short
processes (a test run, a script, a worker restarted often). Killed at exit, a 3 s process never
finishes a compile that takes longer, so every one would start it again and none would get the
bridge; detached, the first one pays a compile in the background once and every later process
on this cache gets the fast path. A serving process that wants it before its threads start calls
``torch_kernels.enable()`` (which waits for a running builder instead of compiling twice).

Every compile appends one line to ``builds.log`` beside the library (pid, time, what started it),
and the builder writes its output (the compiler's errors) to ``build.log``:
``python -m opmux.kernels env`` reports the bridge's state from them (:func:`state`).

(About 450 lines, one job: the key, the locked build, the builder and the state all read the
same cache directory and its files, so they sit together; ``torch_kernels`` keeps loading and
registering.)
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from . import _bridge_key, _env

__all__ = ["BUILDS_LOG", "BUILD_LOG", "FAILED", "build", "library_path", "main", "obtain", "state"]

SOURCE = Path(__file__).resolve().parent / "jit" / "csrc" / "torch_bridge.cpp"
FAILED = "FAILED.txt"  # beside the library: the compile for this key failed (its error)
BUILDS_LOG = "builds.log"  # one line per compile started: pid, time, how
BUILD_LOG = "build.log"  # the last detached builder's output
_STAGING = ".torch_bridge."  # + random + ".so": a compile in progress (or a dead one's leftover)
_POLL = 0.2  # seconds between a waiting process's looks at the cache


def _python_include() -> Path | None:
    """The interpreter's C headers, where installed: the bridge then also holds the default
    call's entry into its lane (``lane_entry``)."""
    import sysconfig

    include = sysconfig.get_paths().get("include")
    path = Path(include) if include else None
    return path if path is not None and (path / "Python.h").is_file() else None


def _flags() -> tuple[list[str], list[str]]:
    import torch  # lazy: the CLI's ``env`` reads the state without a build

    torch_dir = Path(torch.__file__).resolve().parent
    python = _python_include()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return (
        _bridge_key.compile_flags(torch_dir, abi, python),
        _bridge_key.link_flags(torch_dir, entries=python is not None, rpath=True),
    )


def library_path(*, create: bool = True) -> Path:
    """Where the bridge for this torch build lives in the JIT cache (keyed by the source, torch's
    version and build, tvm-ffi's version and the compiler); ``create``: the cache root too."""
    import torch

    from .jit.compile import publish
    from .jit.compile.toolchain import find_cxx, tvm_ffi_version

    cxx = find_cxx()
    cflags, lflags = _flags()
    h = hashlib.sha256()
    for part in (
        SOURCE.read_bytes(),
        torch.__version__.encode(),
        str(getattr(torch.version, "git_version", "")).encode(),
        tvm_ffi_version().encode(),
        cxx.identity.encode(),
        " ".join(cflags + lflags).encode(),
    ):
        h.update(part)
        h.update(b"\0")
    return publish.cache_root(create=create) / "torch_bridge" / h.hexdigest()[:20] / "torch_bridge.so"


def _group(target: Path) -> Path:
    from .jit.compile import publish

    return publish.ensure_dir(publish.ensure_dir(target.parent.parent) / target.parent.name)


def _cached_failure(target: Path) -> Exception | None:
    from .jit.compile.build import CompileError

    failed = target.with_name(FAILED)
    if failed.is_file():  # this source, torch and compiler failed before: no rebuild
        return CompileError(["(cached)"], -1, failed.read_text(errors="replace"))
    return None


def build(*, out: TextIO | None = None, retry: bool = False, how: str = "in-process") -> Path:
    """Build the bridge into the cache unless it is there; -> its path. Raises what the JIT
    build raises (CompileError, CompileTimeout, JitCacheUnavailable, JitLockTimeout,
    ToolchainNotFound). A compile that failed for this key is not tried again unless ``retry``
    (prewarm). A build in progress elsewhere is waited for (``OPMUX_JIT_LOCK_TIMEOUT``)."""
    from .jit.compile import publish
    from .jit.compile.load import JitDisabled, jit_enabled

    target = library_path()
    if target.is_file():
        return target
    if not retry and (cached := _cached_failure(target)) is not None:
        raise cached
    if not jit_enabled():
        raise JitDisabled("torch_bridge", "the torch library ops' C++ kernels")
    with publish.module_lock(_group(target), out=out):
        return _build_locked(target, out=out, how=how)


def _build_locked(target: Path, *, out: TextIO | None, how: str) -> Path:
    """The compile and the publish, under the bridge's build lock."""
    import torch

    from .jit.compile.build import CompileError
    from .jit.compile.toolchain import find_cxx

    if target.is_file():
        return target
    group = target.parent
    for leftover in group.glob(f"{_STAGING}*.so"):  # only a dead build leaves one (we hold the lock)
        leftover.unlink(missing_ok=True)
    cflags, lflags = _flags()
    fd, tmp = tempfile.mkstemp(prefix=_STAGING, suffix=".so", dir=group)
    os.close(fd)
    command = [find_cxx().path, *cflags, str(SOURCE), "-o", tmp, *lflags]
    log = os.open(group / BUILDS_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    try:  # one line per compile: what tests count and `env` reads
        os.write(log, f"{os.getpid()} {time.time():.3f} {how}\n".encode())
    finally:
        os.close(log)
    if out is not None:
        print(f"opmux: building the torch library-op kernels for torch {torch.__version__} ...", file=out)
    start = time.monotonic()
    failed = target.with_name(FAILED)
    try:
        _compile(command)
    except BaseException as error:
        Path(tmp).unlink(missing_ok=True)
        # the compiler ran and refused (an old torch, ...): remembered, so that every later
        # process does not compile in the background only to warn again (prewarm retries); a
        # timeout (-9) or a compiler that could not start (-1) is not
        if isinstance(error, CompileError) and error.returncode > 0:
            failed.write_text(str(error)[-4000:])
        raise
    os.replace(tmp, target)
    failed.unlink(missing_ok=True)
    if out is not None:
        print(f"opmux: built {target} in {time.monotonic() - start:.1f} s", file=out)
    return target


def _death_signal() -> Any:
    """A ``preexec_fn`` that makes the child die with this process (``PR_SET_PDEATHSIG``),
    resolved here, before the fork, so the child only makes the call; None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def die_with_parent() -> None:
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    return die_with_parent


def _compile(command: list[str]) -> None:
    """Run the compiler (the JIT's timeout, its process tree killed on any exception); it also
    dies with this process where it is safe to ask for that (no other thread: ``preexec_fn``)."""
    from .jit.compile.build import CompileError, CompileTimeout, _drain, _kill_group

    timeout = float(_env.get("OPMUX_JIT_COMPILE_TIMEOUT"))
    # preexec_fn is unsafe while other threads run (the fork copies their locks): one thread only
    preexec = _death_signal() if threading.active_count() == 1 else None
    try:
        proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            preexec_fn=preexec,
        )
    except OSError as exc:  # not executable, vanished: the compiler's fault, not the cache's
        raise CompileError(command, -1, f"cannot run the compiler: {exc}") from exc
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        stdout, stderr = _drain(proc)
        raise CompileTimeout(command, timeout, stderr + stdout) from None
    except BaseException:  # KeyboardInterrupt, SIGTERM (the builder's handler): leave no compiler
        _kill_group(proc)
        _drain(proc)
        raise
    if proc.returncode != 0:
        raise CompileError(command, proc.returncode, stderr + stdout)


# --- the detached builder --------------------------------------------------------------------


def _child_env() -> dict[str, str]:
    # The builder must import this same opmux (a checkout on PYTHONPATH or an install).
    package_parent = str(Path(__file__).resolve().parents[2])
    env = _env.child_environ()  # config.scope() overrides too: they are not in os.environ
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    return env


def _start_builder(target: Path) -> int | None:
    """Start the one builder if no build holds the lock: -> its pid, or None (a build is running)."""
    from .jit.compile import lock as _lock

    group = target.parent
    fd = _lock.try_hold(group / ".lock")
    if fd is None:
        return None
    try:
        log = os.open(group / BUILD_LOG, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:  # (truncated under the lock: the log of this build only)
            proc = subprocess.Popen(
                [sys.executable, "-m", "opmux.kernels._bridge_build", str(fd), str(target)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_child_env(),
                cwd=str(group),
                pass_fds=(fd,),  # the lock, already held: the builder holds it from its start
                start_new_session=True,  # not ours: it outlives this process, and our Ctrl-C
            )
        finally:
            os.close(log)
    finally:
        os.close(fd)  # the builder's copy keeps the lock
    return proc.pid


def obtain(decided: threading.Event | None = None) -> Path:
    """The bridge's library, built by the one builder if need be; waits (polling) for it.

    For a process's background thread: it starts a detached builder when no build is running
    and returns once a library is published. Raises the cached failure, JitDisabled, what
    ``library_path`` raises (no compiler, no cache), or the builder's failure. ``decided`` is
    set once a build is running (this one's builder or another) or there is nothing to wait
    for: a process that exits waits for that much (not for the compile), so that asking for
    the bridge always leaves a builder behind."""
    try:
        return _obtain(decided)
    finally:
        if decided is not None:
            decided.set()


def _obtain(decided: threading.Event | None) -> Path:
    from .jit.compile import lock as _lock
    from .jit.compile.build import CompileError
    from .jit.compile.errors import JitLockTimeout
    from .jit.compile.load import JitDisabled, jit_enabled

    target = library_path()
    if target.is_file():
        return target
    if (cached := _cached_failure(target)) is not None:
        raise cached
    if not jit_enabled():
        raise JitDisabled("torch_bridge", "the torch library ops' C++ kernels")
    group = _group(target)
    lock_path = group / ".lock"
    started: int | None = None
    waited_from = time.monotonic()
    limit = float(_env.get("OPMUX_JIT_LOCK_TIMEOUT"))  # a build's compile is bounded below it
    while True:
        if target.is_file():
            return target
        if not _lock.is_free(lock_path):
            if decided is not None:
                decided.set()
            if time.monotonic() - waited_from > limit:
                holder = _lock.holder_of(lock_path)
                raise JitLockTimeout(str(lock_path), time.monotonic() - waited_from, holder.describe())
        else:
            if target.is_file():  # published just before its builder let go
                return target
            failed = target.with_name(FAILED)
            if failed.is_file():  # the build we waited for was refused by the compiler
                raise CompileError(["(torch_bridge builder)"], 1, failed.read_text(errors="replace"))
            if started is not None:
                raise RuntimeError(
                    f"opmux: the torch bridge's builder (pid {started}) ended without publishing it: "
                    f"{_log_tail(group)}"
                )
            started = _start_builder(target)
        time.sleep(_POLL)


def _log_tail(group: Path, lines: int = 3) -> str:
    try:
        text = (group / BUILD_LOG).read_text(errors="replace").strip().splitlines()
    except OSError:
        text = []
    tail = " | ".join(line.strip() for line in text[-lines:] if line.strip())
    return f"{tail} (log: {group / BUILD_LOG})" if tail else f"no output (log: {group / BUILD_LOG})"


def main(argv: list[str] | None = None) -> int:
    """The detached builder: ``python -m opmux.kernels._bridge_build LOCK_FD TARGET``."""
    from .jit.compile import lock as _lock

    args = sys.argv[1:] if argv is None else argv
    fd, target = int(args[0]), Path(args[1])
    if not _lock.adopt(fd, target.parent / ".lock"):
        print(
            f"opmux: torch bridge builder: fd {fd} is not the build lock of {target.parent}", file=sys.stderr
        )
        return 2
    # SIGTERM unwinds (the compiler killed, its staging file removed); SIGKILL leaves the staging
    # file to the next build, and the compiler dies with us (PR_SET_PDEATHSIG)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        if library_path() != target:  # another torch, compiler or source than the process that asked
            print(f"opmux: torch bridge builder: this interpreter's bridge is not {target}", file=sys.stderr)
            return 2
        _build_locked(target, out=sys.stderr, how="builder")
    except Exception as exc:
        print(f"opmux: the torch bridge's build failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


# --- what `python -m opmux.kernels env` says -------------------------------------------------


def state() -> dict[str, Any]:
    """The bridge a process here would use, and why (nothing built or loaded): ``state`` is
    ``shipped`` (the wheel's, for this exact torch build), ``cache-built``, ``building``,
    ``failed``, ``not built``, ``disabled`` or ``unavailable``, with ``reason``."""
    setting = _env.get("OPMUX_TORCH_KERNELS")
    if setting == "off":
        return {
            "state": "disabled",
            "reason": "OPMUX_TORCH_KERNELS=off: the library ops keep their Python kernels",
        }
    if importlib.util.find_spec("torch") is None:
        return {"state": "unavailable", "reason": "torch is not installed"}
    key = _bridge_key.current()
    shipped = _bridge_key.SHIPPED_DIR / key.filename()
    if shipped.is_file():
        return {
            "state": "shipped",
            "reason": f"the wheel ships it for {key.describe()}: loaded at first use, nothing compiled",
            "path": str(shipped),
            "devices": setting,
            "entries": True,
        }
    wheel = _bridge_key.shipped_names()
    why_not = (
        f"the wheel ships no bridge for {key.describe()} (it has {len(wheel)}: {', '.join(wheel)}); "
        if wheel
        else "this install ships no bridge (a source tree, or a target without them); "
    )
    state = _cache_state(setting)
    return {**state, "reason": why_not + state["reason"]}


def _cache_state(setting: str) -> dict[str, Any]:
    """The bridge of this torch build in the JIT cache."""
    from .jit.compile import lock as _lock
    from .jit.compile.errors import JitCacheUnavailable
    from .jit.compile.load import jit_enabled
    from .jit.compile.toolchain import ToolchainNotFound

    try:
        target = library_path(create=False)
    except (ToolchainNotFound, JitCacheUnavailable) as exc:
        return {"state": "unavailable", "reason": str(exc).splitlines()[0]}
    info: dict[str, Any] = {"path": str(target), "devices": setting, "entries": _python_include() is not None}
    group = target.parent
    if target.is_file():
        return {
            "state": "cache-built",
            "reason": "built into the cache for this torch and compiler; loaded at first use",
            **info,
        }
    if not _lock.is_free(group / ".lock"):
        holder = _lock.holder_of(group / ".lock")
        return {"state": "building", "reason": f"by {holder.describe()}; log: {group / BUILD_LOG}", **info}
    failed = target.with_name(FAILED)
    if failed.is_file():
        text = failed.read_text(errors="replace").strip().splitlines()
        return {
            "state": "failed",
            "reason": f"the compiler refused it (not retried; prewarm --torch-kernels retries): "
            f"{text[-1] if text else ''} ({failed})",
            **info,
        }
    if (group / BUILDS_LOG).is_file():
        return {
            "state": "failed",
            "reason": f"the last build ended without publishing: {_log_tail(group)}",
            **info,
        }
    if not jit_enabled():
        return {
            "state": "disabled",
            "reason": "OPMUX_JIT=0 and not in the cache: never compiled at run time",
            **info,
        }
    return {
        "state": "not built",
        "reason": "the first library-op or default call starts its one builder "
        "(or: python -m opmux.kernels.jit prewarm --torch-kernels)",
        **info,
    }


if __name__ == "__main__":
    sys.exit(main())
