"""The on-disk JIT cache: where it lives, who may write it, and how an entry becomes visible.

Layout (every directory 0700)::

    $OPMUX_CACHE_DIR (default ~/.cache/opmux/jit)
      <module>/<source key>/            one group per source key
        .lock                           flock'd while building; records pid, time, host
        .staging-XXXX/                  a build in progress (private) ...
        .staging-XXXX.owner             ... flock'd by its builder while it is alive
        .failed                         the last failed build (waiters give up, not rebuild)
        <full key>/<module>.so          a published entry ...
        <full key>/manifest.json        ... and its commit marker, written last

A build writes the library and then the manifest into a private staging dir, and publishes
the whole dir with one ``rename``: readers see either nothing or a complete entry, so they
take no lock. A builder killed midway leaves only a staging dir, which the next builder
removes under the lock (the kernel drops a dead process's ``flock``, of ``.lock`` and of the
staging dir's ``.owner``); a staging dir whose owner is alive is never removed, even by a
builder that got ``.lock`` because someone deleted it. Before a load the manifest's library
must be a plain file inside its entry and its sha256 must match. The cache is code we will
``dlopen``, so a directory or file owned by another user, or writable by group or others, is
refused; so is a relative cache path. Every fault is a typed :class:`JitCacheUnavailable`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from ... import _env
from . import lock as _lock
from .errors import JitCacheUnavailable, cache_fault
from .key import CACHE_FORMAT, file_digest, full_key, hash_headers

__all__ = [
    "CACHE_DIR_ENV",
    "DEFAULT_CACHE_DIR",
    "MANIFEST",
    "CacheInsecure",
    "Entry",
    "Staging",
    "cache_root",
    "check_secure",
    "discard",
    "ensure_dir",
    "find_entry",
    "iter_entries",
    "library_name",
    "live_builds",
    "module_lock",
    "new_staging",
    "publish",
    "remove_stale",
]

CACHE_DIR_ENV = _env.CACHE_DIR
DEFAULT_CACHE_DIR = _env.DEFAULT_CACHE_DIR
MANIFEST = "manifest.json"
KEY_CHARS = 32  # 128 bits of sha256 per path component: short paths, no practical collisions
FAILED = ".failed"  # the last failed build of a group: lets its waiters give up, not rebuild


class CacheInsecure(JitCacheUnavailable, PermissionError):
    """A cache path we would load code from is not private to this user."""

    def __init__(self, path: str, reason: str) -> None:
        self.reason = reason
        JitCacheUnavailable.__init__(
            self,
            path,
            reason,
            "Code loaded from it could be replaced by someone else. Fix the ownership/permissions "
            f"(chmod go-w, or chmod 700 for a directory) or point ${CACHE_DIR_ENV} at a private "
            "directory.",
        )

    def __reduce__(self) -> tuple[type, tuple[str, ...]]:
        return (type(self), (self.path, self.reason))


def check_secure(path: Path, *, follow: bool = False) -> os.stat_result:
    """Raise :class:`CacheInsecure` unless ``path`` is ours and not group/other-writable.

    Inside the cache, symlinks are refused too (``follow=False``); the root itself may be a
    symlink, and then its target is checked.
    """
    st = os.stat(path) if follow else os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise CacheInsecure(str(path), "it is a symbolic link")
    if st.st_uid != os.getuid():
        raise CacheInsecure(str(path), f"owned by uid {st.st_uid}, not by uid {os.getuid()}")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CacheInsecure(str(path), f"writable by group or others (mode {st.st_mode & 0o777:o})")
    return st


def cache_root(*, create: bool = True) -> Path:
    """``$OPMUX_CACHE_DIR`` or :data:`DEFAULT_CACHE_DIR`, checked; created 0700 when asked.

    Always absolute: a path that is relative (``OPMUX_CACHE_DIR=cache``, or ``~`` with no
    home directory: ``HOME`` unset and no passwd entry for this uid) is refused with
    :class:`JitCacheUnavailable`, never resolved against the working directory. Any other
    fault (a file in the way, read-only, no permission, no space, too long) is one too.
    """
    root = Path(_env.get(CACHE_DIR_ENV))
    if not root.is_absolute():
        if str(root).startswith("~"):
            cause = (
                f"it needs a home directory, and this process has none (HOME is "
                f"{'unset' if 'HOME' not in os.environ else repr(os.environ['HOME'])} and uid "
                f"{os.getuid()} has no passwd entry with one)"
            )
            fix = f"Set HOME, or set ${CACHE_DIR_ENV} to an absolute path"
        else:
            cause = "the path is relative, so it would depend on the working directory"
            fix = f"Set ${CACHE_DIR_ENV} to an absolute path"
        raise JitCacheUnavailable(str(root), cause, fix)
    try:
        if create and not root.is_dir():
            # No exists() test before mkdir: another process may create the directory
            # in between (eight cold processes did), and that is success, not a fault.
            if root.is_symlink():  # dangling
                raise NotADirectoryError(errno.ENOTDIR, "Not a directory", str(root))
            root.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                root.mkdir(mode=0o700)
                os.chmod(root, 0o700)  # mkdir's mode is filtered by the umask
        if root.exists():
            if not root.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, "Not a directory", str(root))
            check_secure(root, follow=True)
    except JitCacheUnavailable:
        raise
    except OSError as exc:
        raise cache_fault(exc, root) from exc
    return root


def ensure_dir(path: Path) -> Path:
    """Create ``path`` 0700 if missing; check it either way."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    if not path.is_dir() or path.is_symlink():
        check_secure(path)  # a symlink is refused by name
        raise NotADirectoryError(errno.ENOTDIR, "Not a directory", str(path))
    check_secure(path)
    return path


@contextlib.contextmanager
def module_lock(group: Path, *, timeout: float | None = None, out: TextIO | None = None) -> Iterator[float]:
    """Hold the group's exclusive lock, waiting at most ``timeout`` seconds (default
    ``OPMUX_JIT_LOCK_TIMEOUT``); yields when the wait began (``time.monotonic()``).
    A holder that dies releases it (the kernel does); see :mod:`.lock` for the rest."""
    limit = float(_env.get("OPMUX_JIT_LOCK_TIMEOUT")) if timeout is None else timeout
    what = f"the JIT build of {group.parent.name} ({group})"
    with _lock.hold(group / ".lock", timeout=limit, what=what, out=out) as started:
        check_secure(group / ".lock")
        yield started


@dataclass
class Staging:
    """A private build dir inside the group (same filesystem, so publishing is a rename),
    and the lock that says its builder is alive: ``<dir>.owner``, created and locked before
    the dir and removed after it, so a staging dir whose owner lock is free is dead."""

    path: Path
    owner: Path
    fd: int

    def close(self) -> None:
        """Remove whatever is left of the build (nothing after a publish) and its owner lock."""
        shutil.rmtree(self.path, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.owner.unlink()
        with contextlib.suppress(OSError):
            os.close(self.fd)


def new_staging(group: Path) -> Staging:
    """Create a staging dir and hold its owner lock (see :class:`Staging`)."""
    fd, owner_name = tempfile.mkstemp(prefix=".staging-", suffix=".owner", dir=group)
    owner = Path(owner_name)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fresh file: nobody else holds it
        os.write(fd, f"{os.getpid()} {time.time():.3f} {socket.gethostname()}\n".encode())
        path = owner.with_suffix("")
        path.mkdir(mode=0o700)
    except BaseException:
        with contextlib.suppress(OSError):
            owner.unlink()
        os.close(fd)
        raise
    return Staging(path, owner, fd)


def live_builds(group: Path) -> list[Path]:
    """Owner locks of staging dirs whose builder is alive (another process building now)."""
    return [p for p in sorted(group.glob(".staging-*.owner")) if not _lock.is_free(p)]


def discard(path: Path) -> None:
    """Remove an entry: rename it out of sight first, so no reader sees it half-deleted."""
    trash = Path(tempfile.mkdtemp(prefix=".trash-", dir=path.parent))
    try:
        os.rename(path, trash / "entry")
    except FileNotFoundError:
        pass
    shutil.rmtree(trash, ignore_errors=True)


def remove_stale(group: Path) -> int:
    """Remove staging/trash dirs left by dead builders. Call only under the group's lock.

    A staging dir whose owner lock is held belongs to a live builder and is left alone, even
    if that builder does not hold the group lock (someone deleted ``.lock`` under it).
    """
    removed = 0
    for child in group.iterdir():
        name = child.name
        if name.startswith(".staging-") and name.endswith(".owner"):
            if not child.with_suffix("").exists() and _lock.is_free(child):
                with contextlib.suppress(OSError):
                    child.unlink()
            continue
        if name.startswith(".staging-") and child.is_dir():
            owner = child.with_name(name + ".owner")
            if owner.exists() and not _lock.is_free(owner):
                continue  # a live build
            shutil.rmtree(child, ignore_errors=True)
            with contextlib.suppress(OSError):
                owner.unlink()
            removed += 1
        elif name.startswith(".trash-") and child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
            removed += 1
    return removed


def record_failure(group: Path, *, source_key: str, reason: str) -> None:
    """Note that a build of ``source_key`` failed now, for the processes waiting on it."""
    data = {"source_key": source_key, "pid": os.getpid(), "time": time.time(), "reason": reason[-4000:]}
    with contextlib.suppress(OSError):
        tmp = group / f".failed-{os.getpid()}"
        tmp.write_text(json.dumps(data))
        os.replace(tmp, group / FAILED)


def failure_since(group: Path, *, source_key: str, since: float) -> dict[str, Any] | None:
    """The failure record of ``source_key`` if it was written at or after ``since`` (wall
    clock): a build this process waited for failed, so it must not be repeated now."""
    try:
        data = json.loads((group / FAILED).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("source_key") != source_key:
        return None
    when = data.get("time")
    return data if isinstance(when, (int, float)) and when >= since else None


def clear_failure(group: Path) -> None:
    with contextlib.suppress(OSError):
        (group / FAILED).unlink()


def library_name(manifest: Mapping[str, Any]) -> str | None:
    """The manifest's ``library`` if it names a file directly inside its entry, else None.

    A plain name only: not absolute, no directory part, not ``.``/``..``, no NUL. Anything
    else would let a manifest point ``dlopen`` outside the cache.
    """
    name = manifest.get("library")
    if not isinstance(name, str) or not name or name in (".", "..", MANIFEST):
        return None
    if "/" in name or "\\" in name or "\x00" in name or name != os.path.basename(name):
        return None
    return name


@dataclass(frozen=True)
class Entry:
    """A published cache entry and its manifest."""

    path: Path
    manifest: Mapping[str, Any]

    @property
    def library(self) -> Path:
        """The library's path; only call after :meth:`verify` returned None."""
        name = library_name(self.manifest)
        if name is None:
            raise ValueError(f"opmux: manifest of {self.path} names no library inside its entry")
        return self.path / name

    def verify(self) -> str | None:
        """None when the library is a private plain file inside this entry whose digest
        matches the manifest; else why it must not be loaded (it is then rebuilt)."""
        name = library_name(self.manifest)
        if name is None:
            return f"manifest names library {self.manifest.get('library')!r}, not a file inside its entry"
        library = self.path / name
        try:
            if not stat.S_ISREG(os.lstat(library).st_mode):  # a symlink or a dir: refuse, rebuild
                return f"{name} is not a regular file inside the entry"
            for p in (self.path.parent.parent, self.path.parent, self.path, self.path / MANIFEST, library):
                check_secure(p)
            digest = file_digest(library)
        except FileNotFoundError as exc:
            return f"missing file {exc.filename}"
        if digest != self.manifest.get("sha256"):
            return (
                f"sha256 of {name} is {digest[:16]}..., manifest says "
                f"{str(self.manifest.get('sha256'))[:16]}..."
            )
        return None


def read_manifest(entry: Path) -> dict[str, Any] | None:
    """The committed manifest of an entry dir, or None (uncommitted, vanished or unreadable)."""
    try:
        data = json.loads((entry / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == CACHE_FORMAT else None


def find_entry(group: Path, *, source_key: str, roots: Mapping[str, Path]) -> Entry | None:
    """The entry whose recorded headers still hash to its name; lock-free.

    Each manifest lists the headers its build read. Their current contents give the full
    key; an entry whose name matches is current. Several entries may coexist (say, two
    checkouts with different headers sharing one cache); stale ones are pruned by the CLI.
    """
    try:
        children = sorted(os.scandir(group), key=lambda d: d.name)
    except FileNotFoundError:
        return None
    for child in children:
        if child.name.startswith("."):
            continue
        manifest = read_manifest(Path(child.path))
        if manifest is None or manifest.get("source_key") != source_key:
            continue
        headers = hash_headers([label for label, _ in manifest.get("headers", [])], roots)
        if headers is not None and full_key(source_key, headers)[:KEY_CHARS] == child.name:
            return Entry(Path(child.path), manifest)
    return None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(staging: Path, group: Path, *, key: str, manifest: dict[str, Any]) -> Entry:
    """Write the manifest (last: the commit marker) and rename the staging dir into place.

    Called under the group's lock; an existing dir of the same name (an entry rejected by
    :meth:`Entry.verify`) is discarded first.
    """
    manifest = {"format": CACHE_FORMAT, **manifest}
    if library_name(manifest) is None:
        raise ValueError(f"opmux: refusing to publish library {manifest.get('library')!r}")
    _fsync(staging / str(manifest["library"]))
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    _fsync(staging / MANIFEST)
    final = group / key[:KEY_CHARS]
    try:
        os.rename(staging, final)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        discard(final)
        os.rename(staging, final)
    return Entry(final, manifest)


def iter_entries(root: Path) -> Iterator[tuple[Path, dict[str, Any] | None]]:
    """Every entry dir under the root with its manifest (None: uncommitted or foreign)."""
    if not root.is_dir():
        return
    for module in sorted(root.iterdir()):
        if not module.is_dir() or module.name.startswith("."):
            continue
        for group in sorted(module.iterdir()):
            if not group.is_dir():
                continue
            for entry in sorted(group.iterdir()):
                if entry.is_dir() and not entry.name.startswith("."):
                    yield entry, read_manifest(entry)


def touch(entry: Path) -> None:
    """Record a use (the entry dir's mtime), for ``cache prune --older-than``."""
    with contextlib.suppress(OSError):
        now = time.time()
        os.utime(entry, (now, now))
