"""Why the JIT backend cannot serve a module here: typed, with the path, the cause and the fix.

Every error here is a :class:`JitUnavailable`, which the op layer (``ops/_native.py``) turns
into a fallback to the next backend under ``OPMUX_FALLBACK``. All of them survive pickling.
"""

from __future__ import annotations

import errno
import os

__all__ = [
    "JitCacheUnavailable",
    "JitLockTimeout",
    "JitUnavailable",
    "cache_fault",
]

_CACHE_VAR = "OPMUX_CACHE_DIR"  # named in messages only; _env owns the variable


class JitUnavailable(RuntimeError):
    """The JIT backend cannot serve this module here; the dispatch layer falls back."""


class JitCacheUnavailable(JitUnavailable):
    """The JIT cache cannot be used: ``path`` is where, ``cause`` is what went wrong, ``fix``
    is what to do. Every cache fault (not a directory, read-only, no permission, no space,
    path too long, no home directory, foreign owner) is one of these."""

    def __init__(self, path: str, cause: str, fix: str) -> None:
        self.path = path
        self.cause = cause
        self.fix = fix
        super().__init__(f"opmux: the JIT cache at {path} cannot be used: {cause}. {fix}")

    def __reduce__(self) -> tuple[type, tuple[str, ...]]:
        return (type(self), (self.path, self.cause, self.fix))


_ELSEWHERE = f"or point ${_CACHE_VAR} at a private, writable, absolute directory"
_PREWARM = "(or prewarm it where it is writable and set OPMUX_JIT=0)"

# errno -> (cause, fix); the fix always ends with the way out that needs no repair.
_FAULTS: dict[int, tuple[str, str]] = {
    errno.ENOTDIR: (
        "it, or a directory above it, is a file, not a directory",
        f"Remove the file in the way {_ELSEWHERE}",
    ),
    errno.EEXIST: (
        "it, or a directory above it, is a file, not a directory",
        f"Remove the file in the way {_ELSEWHERE}",
    ),
    errno.EROFS: ("the filesystem is read-only", f"Mount it writable {_ELSEWHERE} {_PREWARM}"),
    errno.EACCES: (
        "permission denied",
        f"Give this user write access (chown it, chmod 700) {_ELSEWHERE}",
    ),
    errno.EPERM: ("operation not permitted", f"Give this user write access {_ELSEWHERE}"),
    errno.ENOSPC: (
        "no space left on the device",
        f"Free space (python -m opmux.kernels.jit cache prune --older-than 30) {_ELSEWHERE}",
    ),
    errno.EDQUOT: ("disk quota exceeded", f"Free space or raise the quota {_ELSEWHERE}"),
    errno.ENAMETOOLONG: ("the path is too long", f"Point ${_CACHE_VAR} at a shorter path"),
    errno.ELOOP: ("too many symbolic links", f"Remove the link loop {_ELSEWHERE}"),
    errno.ENOENT: ("a directory vanished while it was in use", f"Retry, {_ELSEWHERE}"),
    errno.EINVAL: ("the filesystem does not support what the cache needs", f"Use a local disk {_ELSEWHERE}"),
}


def cache_fault(exc: OSError, path: object) -> JitCacheUnavailable:
    """The typed form of an ``OSError`` raised while using the cache at ``path``.

    ``exc.filename`` (when the system call set one) names the exact path; ``path`` is the
    cache directory being used, reported when the call did not say.
    """
    where = str(exc.filename) if exc.filename else str(path)
    code = exc.errno if exc.errno is not None else -1
    cause, fix = _FAULTS.get(code, (exc.strerror or type(exc).__name__, f"Repair it {_ELSEWHERE}"))
    if code == errno.EEXIST and os.path.isdir(where):
        cause = "a directory appeared where a file was expected"
    return JitCacheUnavailable(where, f"{cause} ({type(exc).__name__}: {exc.strerror or exc})", fix)


class JitLockTimeout(JitUnavailable):
    """Another process holds a module's build lock longer than ``OPMUX_JIT_LOCK_TIMEOUT``, or
    it is stopped. ``holder`` describes it (pid, since when, state) as far as it is known."""

    def __init__(self, lock: str, waited: float, holder: str, reason: str = "") -> None:
        self.lock = lock
        self.waited = waited
        self.holder = holder
        self.reason = reason
        why = reason or f"gave up after {waited:.0f} s (OPMUX_JIT_LOCK_TIMEOUT)"
        super().__init__(
            f"opmux: the JIT build lock {lock} is held by {holder}; {why}. If that build is hung, "
            f"stop it (kill the holder); to wait longer set OPMUX_JIT_LOCK_TIMEOUT; to never "
            f"compile at run time prewarm the cache (python -m opmux.kernels.jit prewarm) and "
            f"set OPMUX_JIT=0."
        )

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return (type(self), (self.lock, self.waited, self.holder, self.reason))
