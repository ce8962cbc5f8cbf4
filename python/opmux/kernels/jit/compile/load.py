"""From a module description to a loaded tvm-ffi module: key, cache lookup, locked build, load.

:func:`ensure_built` does everything but ``dlopen`` and never imports tvm_ffi or torch (the
prewarm CLI uses it); :func:`load` adds the load and a per-process memo. ``OPMUX_JIT=0``
forbids compiling at run time: a published entry still loads, a miss raises
:class:`JitDisabled`, which the dispatch layer catches (as :class:`JitUnavailable`) to fall
back to another backend.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ... import _env
from ..._warn import warn_at_caller
from . import lock as _lock
from . import publish as _publish
from .build import CompileError, build_shared_library, compile_flags, stats
from .errors import JitCacheUnavailable, JitLockTimeout, JitUnavailable, cache_fault
from .key import SourceKey, file_digest, full_key, hash_headers, label_headers, parse_depfile
from .toolchain import (
    Toolchain,
    ToolchainNotFound,
    find_cxx,
    find_nvcc,
    local_cuda_archs,
    ptx_arch_for,
    tvm_ffi_paths,
    tvm_ffi_version,
)

if TYPE_CHECKING:
    import tvm_ffi

__all__ = [
    "JIT_ENV",
    "JitCacheUnavailable",
    "JitCacheWarning",
    "JitDisabled",
    "JitLockTimeout",
    "JitUnavailable",
    "KernelSourcesMissing",
    "ModuleLike",
    "Result",
    "ensure_built",
    "jit_enabled",
    "load",
    "reset",
]

#: ``0``/``false``/``off`` forbids compiling at run time; ``1``/``true``/``on`` (default) allows it.
JIT_ENV = _env.JIT


class JitDisabled(JitUnavailable):
    """``OPMUX_JIT=0`` and the module is not in the cache."""

    def __init__(self, name: str, reason: str = "") -> None:
        self.name = name
        self.reason = reason
        super().__init__(
            f"opmux: JIT module {name!r} is not compiled and ${JIT_ENV}=0 forbids compiling "
            f"at run time{': ' + reason if reason else ''}. Prewarm the cache with "
            f"'python -m opmux.kernels.jit prewarm --modules {name}' or unset ${JIT_ENV}."
        )

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return (type(self), (self.name, self.reason))


class KernelSourcesMissing(JitUnavailable, FileNotFoundError):
    """The kernel sources are not where the package says (a wheel without its package data)."""

    def __init__(self, path: str) -> None:
        self.path = path
        RuntimeError.__init__(
            self,
            f"opmux: JIT kernel sources missing: {path} does not exist. The installed opmux "
            f"lacks its package data; reinstall it (pip install --force-reinstall opmux).",
        )

    def __reduce__(self) -> tuple[type, tuple[str]]:
        return (type(self), (self.path,))


class JitCacheWarning(RuntimeWarning):
    """A cache entry was rejected (digest mismatch, missing file) and is being rebuilt."""


class ModuleLike(Protocol):
    """What the loader needs of a module: a name, sources relative to ``csrc/``, a device."""

    @property
    def name(self) -> str: ...
    @property
    def sources(self) -> Sequence[str]: ...
    @property
    def device(self) -> Literal["cpu", "cuda"]: ...


@dataclass(frozen=True)
class Result:
    """Where a module's library is, and whether this call compiled it."""

    name: str
    library: Path
    key: str
    compiled: bool
    seconds: float


def jit_enabled() -> bool:
    """Read ``$OPMUX_JIT`` now, through :mod:`opmux.kernels._env` (so ``config.scope`` applies;
    not cached: tests and users flip it at run time)."""
    return bool(_env.get(JIT_ENV))


def _check_kernel_path(kernel_path: Path) -> None:
    for sub in ("csrc", "include"):
        if not (kernel_path / sub).is_dir():
            raise KernelSourcesMissing(str(kernel_path / sub))


@dataclass(frozen=True)
class _Plan:
    module: ModuleLike
    kernel_path: Path
    sources: tuple[Path, ...]
    toolchain: Toolchain
    archs: tuple[str, ...]
    ptx_arch: str | None
    roots: dict[str, Path]
    source_key: SourceKey


def _plan(module: ModuleLike, *, kernel_path: Path, archs: Sequence[str] | None) -> _Plan:
    _check_kernel_path(kernel_path)
    rels = [f"csrc/{s}" for s in module.sources]
    for rel in rels:
        if not (kernel_path / rel).is_file():
            raise KernelSourcesMissing(str(kernel_path / rel))
    host = ""
    if module.device == "cpu":
        toolchain = find_cxx()
        use_archs: tuple[str, ...] = ()
        ptx = None
    elif module.device == "cuda":
        toolchain = find_nvcc()
        use_archs = tuple(archs) if archs else tuple(local_cuda_archs(nvcc=toolchain))
        ptx = ptx_arch_for(use_archs)
        try:
            host = find_cxx().identity
        except ToolchainNotFound:
            host = ""
    else:
        raise ValueError(f"opmux: module {module.name!r} has unknown device {module.device!r}")
    includes, _ = tvm_ffi_paths()
    roots = {"kernel": kernel_path, "tvm_ffi": includes[0]}
    skey = SourceKey.compute(
        name=module.name,
        device=module.device,
        kernel_path=kernel_path,
        sources=rels,
        flags=compile_flags(module.device, archs=use_archs, ptx_arch=ptx),
        toolchain=toolchain.identity,
        host_toolchain=host,
        tvm_ffi=tvm_ffi_version(),
        archs=use_archs,
        ptx_arch=ptx,
    )
    return _Plan(
        module, kernel_path, tuple(kernel_path / r for r in rels), toolchain, use_archs, ptx, roots, skey
    )


def _build(plan: _Plan, group: Path, staging: _publish.Staging) -> _publish.Entry:
    name = plan.module.name
    library = staging.path / f"{name}.so"
    depfile = staging.path / f"{name}.d"
    start = time.monotonic()
    commands = build_shared_library(
        library,
        sources=plan.sources,
        device=plan.module.device,
        archs=plan.archs,
        ptx_arch=plan.ptx_arch,
        toolchain=plan.toolchain,
        include_dirs=[plan.kernel_path / "include", plan.kernel_path / "csrc"],
        depfile=depfile,
    )
    seconds = time.monotonic() - start
    roots = dict(plan.roots)
    labels = label_headers(
        parse_depfile(depfile.read_text()), roots=roots, sources=plan.sources, cwd=Path.cwd()
    )
    depfile.unlink()
    headers = hash_headers(labels, roots)
    if headers is None:  # a header vanished mid-build: do not publish a key we cannot recheck
        raise RuntimeError(f"opmux: a header of {name} changed during the build; retry")
    skey = plan.source_key.digest
    key = full_key(skey, headers)
    manifest = {
        "name": name,
        "device": plan.module.device,
        "library": library.name,
        "sha256": file_digest(library),
        "size": library.stat().st_size,
        "source_key": skey,
        "key": key,
        "inputs": plan.source_key.as_json(),
        "headers": [list(h) for h in headers],
        "commands": commands,
        "compile_seconds": round(seconds, 3),
        "created": time.time(),
    }
    return _publish.publish(staging.path, group, key=key, manifest=manifest)


def _hit(module: ModuleLike, entry: _publish.Entry, start: float) -> Result:
    stats.hits += 1
    _publish.touch(entry.path)
    return Result(module.name, entry.library, str(entry.manifest["key"]), False, time.monotonic() - start)


def ensure_built(
    module: ModuleLike,
    *,
    kernel_path: Path,
    archs: Sequence[str] | None = None,
    allow_compile: bool | None = None,
) -> Result:
    """Return the module's published library, compiling it (once, under a lock) on a miss.

    ``allow_compile`` defaults to :func:`jit_enabled`. Lookup is lock-free; on a miss the
    group lock is taken (waiting at most ``OPMUX_JIT_LOCK_TIMEOUT``) and the cache re-checked,
    so N processes racing on a cold module compile it once. An entry failing its checks is
    rebuilt with a warning. A build that another process started (even one whose ``.lock``
    was deleted under it) is waited for, never repeated; one that failed while we waited is
    not repeated either (:class:`JitUnavailable` with its reason).

    Raises :class:`JitCacheUnavailable` for every cache fault (never a bare ``OSError``),
    :class:`JitLockTimeout`, :class:`JitDisabled`, ``ToolchainNotFound`` or ``CompileError``
    (``CompileTimeout`` for a hung compiler): all of them make the op layer fall back.
    """
    start = time.monotonic()
    if allow_compile is None:
        allow_compile = jit_enabled()
    try:
        plan = _plan(module, kernel_path=kernel_path, archs=archs)
    except ToolchainNotFound as exc:
        if not allow_compile:
            raise JitDisabled(module.name, f"and no compiler to key the cache with ({exc})") from exc
        raise
    skey = plan.source_key.digest
    root = _publish.cache_root()
    group = root / module.name / skey[: _publish.KEY_CHARS]
    try:
        return _ensure_in(plan, group, root, allow_compile=allow_compile, start=start)
    except (JitUnavailable, CompileError):
        raise
    except OSError as exc:
        raise cache_fault(exc, group) from exc


def _ensure_in(plan: _Plan, group: Path, root: Path, *, allow_compile: bool, start: float) -> Result:
    module = plan.module
    skey = plan.source_key.digest
    entry = _publish.find_entry(group, source_key=skey, roots=plan.roots)
    problem = entry.verify() if entry is not None else None
    if entry is not None and problem is None:
        return _hit(module, entry, start)
    if problem is not None:
        warn_at_caller(
            f"opmux: JIT cache entry {entry.path if entry else ''} of "
            f"{module.name!r} rejected ({problem}); rebuilding",
            JitCacheWarning,
        )
    if not allow_compile:
        raise JitDisabled(module.name)

    _publish.ensure_dir(root / module.name)
    _publish.ensure_dir(group)
    since = time.time()  # a failure recorded after this is one of a build we waited for
    with _publish.module_lock(group) as waited_from:
        deadline = waited_from + float(_env.get("OPMUX_JIT_LOCK_TIMEOUT"))
        while True:
            _publish.remove_stale(group)
            entry = _publish.find_entry(group, source_key=skey, roots=plan.roots)
            if entry is not None:
                if entry.verify() is None:  # someone else built it while we waited
                    return _hit(module, entry, start)
                _publish.discard(entry.path)
                stats.rebuilds += 1
            failed = _publish.failure_since(group, source_key=skey, since=since)
            if failed is not None:
                raise JitUnavailable(
                    f"opmux: the build of JIT module {module.name!r} by pid {failed.get('pid')}, "
                    f"which this process waited for, failed; not repeating it now: "
                    f"{str(failed.get('reason', ''))[-2000:]}"
                )
            live = _publish.live_builds(group)
            if not live:
                break
            # Another builder is alive without holding .lock (it was deleted under it): wait
            # for its result instead of compiling a second time and racing it.
            _lock.wait_free(live[0], deadline=deadline, what=f"the JIT build of {module.name} ({group})")
        staging = _publish.new_staging(group)
        try:
            published = _build(plan, group, staging)
        except BaseException as exc:
            if isinstance(exc, (CompileError, RuntimeError, OSError)):
                _publish.record_failure(group, source_key=skey, reason=f"{type(exc).__name__}: {exc}")
            if isinstance(exc, CompileError) and _disk_full(exc, staging.path):
                # the compiler could not write its output: a cache fault, not a compile error
                raise cache_fault(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), group) from exc
            raise
        finally:
            staging.close()
        _publish.clear_failure(group)
    return Result(
        module.name, published.library, str(published.manifest["key"]), True, time.monotonic() - start
    )


def _disk_full(exc: CompileError, where: Path) -> bool:
    """Did ``exc`` fail because the cache's filesystem is full? (The compiler reports that
    as any other error; we ask the filesystem.)"""
    if "No space left on device" in exc.stderr or "Disk quota exceeded" in exc.stderr:
        return True
    try:
        st = os.statvfs(where)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 1 << 20


_memo: dict[tuple[Any, ...], tvm_ffi.Module] = {}
_failed: dict[tuple[Any, ...], BaseException] = {}
_memo_locks: dict[tuple[Any, ...], threading.Lock] = {}
_memo_guard = threading.Lock()
# Failures worth remembering for the process: repeating them costs a compile or a long wait
# (the op layer asks once per op, and a group's ops share one module). A cache fault is
# remembered too; a new OPMUX_CACHE_DIR is another memo key, and reset() forgets.
_STICKY = (CompileError, JitCacheUnavailable, JitLockTimeout)


def load(module: ModuleLike, *, kernel_path: Path, archs: Sequence[str] | None = None) -> tvm_ffi.Module:
    """:func:`ensure_built`, then ``tvm_ffi.load_module``; memoised per process.

    The memo key holds the module, kernel root, cache dir and archs: a test or a user that
    changes ``$OPMUX_CACHE_DIR`` gets a fresh lookup rather than a stale module. Threads
    asking for the same module wait on one per-key lock; different modules build in parallel.
    A failed compile, a cache fault or a lock timeout is remembered (raised again at once)
    until :func:`reset`, so the ops sharing a module never compile or wait twice.
    """
    memo_key = (
        module.name,
        tuple(module.sources),
        module.device,
        str(kernel_path),
        str(_env.get(_publish.CACHE_DIR_ENV)),
        tuple(archs or ()),
    )
    cached = _memo.get(memo_key)
    if cached is not None:
        stats.memo_hits += 1
        return cached
    with _memo_guard:
        key_lock = _memo_locks.setdefault(memo_key, threading.Lock())
    with key_lock:
        cached = _memo.get(memo_key)
        if cached is not None:
            stats.memo_hits += 1
            return cached
        earlier = _failed.get(memo_key)
        if earlier is not None:
            raise earlier
        try:
            result = ensure_built(module, kernel_path=kernel_path, archs=archs)
        except _STICKY as exc:
            _failed[memo_key] = exc
            raise
        import tvm_ffi  # lazy: its import pulls in torch and dlopens libtvm_ffi (RTLD_GLOBAL)

        loaded = tvm_ffi.load_module(str(result.library))
        _memo[memo_key] = loaded
        return loaded


def reset() -> None:
    """Forget the per-process memo (tests; a long-lived process after ``cache clear``)."""
    with _memo_guard:
        _memo.clear()
        _failed.clear()
