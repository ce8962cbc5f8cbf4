"""The on-disk JIT cache: where it lives, who may write it, and how an entry becomes visible.

Layout (every directory 0700)::

    $OPMUX_CACHE_DIR (default ~/.cache/opmux/jit)
      <module>/<source key>/            one group per source key
        .lock                           flock'd while building; never deleted
        .staging-XXXX/                  a build in progress (private, mkdtemp)
        <full key>/<module>.so          a published entry ...
        <full key>/manifest.json        ... and its commit marker, written last

A build writes the library and then the manifest into a private staging dir, and publishes
the whole dir with one ``rename``: readers see either nothing or a complete entry, so they
take no lock. A builder killed midway leaves only a staging dir, which the next builder
removes under the lock (the kernel drops a dead process's ``flock``). Before a load the
library's sha256 is checked against the manifest. The cache is code we will ``dlopen``, so
a directory or file owned by another user, or writable by group or others, is refused.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .key import CACHE_FORMAT, file_digest, full_key, hash_headers

__all__ = [
    "CACHE_DIR_ENV",
    "DEFAULT_CACHE_DIR",
    "MANIFEST",
    "CacheInsecure",
    "Entry",
    "cache_root",
    "check_secure",
    "discard",
    "ensure_dir",
    "find_entry",
    "iter_entries",
    "module_lock",
    "new_staging",
    "publish",
    "remove_stale",
]

CACHE_DIR_ENV = "OPMUX_CACHE_DIR"
#: The default cache root, written only here.
DEFAULT_CACHE_DIR = "~/.cache/opmux/jit"
MANIFEST = "manifest.json"
KEY_CHARS = 32  # 128 bits of sha256 per path component: short paths, no practical collisions


class CacheInsecure(PermissionError):
    """A cache path we would load code from is not private to this user."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(
            f"opmux: refusing JIT cache path {path}: {reason}. Code loaded from it could be "
            f"replaced by someone else. Fix the ownership/permissions (chmod go-w, or "
            f"chmod 700 for a directory) or point ${CACHE_DIR_ENV} at a private directory."
        )

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
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
    """``$OPMUX_CACHE_DIR`` or :data:`DEFAULT_CACHE_DIR`, checked; created 0700 when asked."""
    root = Path(os.path.expanduser(os.environ.get(CACHE_DIR_ENV) or DEFAULT_CACHE_DIR))
    if create and not root.exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            root.mkdir(mode=0o700)
            os.chmod(root, 0o700)  # mkdir's mode is filtered by the umask
    if root.exists():
        check_secure(root, follow=True)
    return root


def ensure_dir(path: Path) -> Path:
    """Create ``path`` 0700 if missing; check it either way."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    check_secure(path)
    return path


@contextlib.contextmanager
def module_lock(group: Path) -> Iterator[None]:
    """Hold the group's exclusive ``flock``. A holder that dies releases it (the kernel does)."""
    fd = os.open(group / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        check_secure(group / ".lock")
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)  # closing drops the flock


def new_staging(group: Path) -> Path:
    """A private build dir inside the group (same filesystem, so publishing is a rename)."""
    return Path(tempfile.mkdtemp(prefix=".staging-", dir=group))


def discard(path: Path) -> None:
    """Remove an entry: rename it out of sight first, so no reader sees it half-deleted."""
    trash = Path(tempfile.mkdtemp(prefix=".trash-", dir=path.parent))
    try:
        os.rename(path, trash / "entry")
    except FileNotFoundError:
        pass
    shutil.rmtree(trash, ignore_errors=True)


def remove_stale(group: Path) -> int:
    """Remove staging/trash dirs left by dead builders. Call only under the group's lock."""
    removed = 0
    for child in group.iterdir():
        if child.name.startswith((".staging-", ".trash-")) and child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
            removed += 1
    return removed


@dataclass(frozen=True)
class Entry:
    """A published cache entry and its manifest."""

    path: Path
    manifest: Mapping[str, Any]

    @property
    def library(self) -> Path:
        return self.path / str(self.manifest["library"])

    def verify(self) -> str | None:
        """None when the library is intact and private; else why it must not be loaded."""
        try:
            for p in (
                self.path.parent.parent,
                self.path.parent,
                self.path,
                self.path / MANIFEST,
                self.library,
            ):
                check_secure(p)
            digest = file_digest(self.library)
        except FileNotFoundError as exc:
            return f"missing file {exc.filename}"
        if digest != self.manifest.get("sha256"):
            return (
                f"sha256 of {self.library.name} is {digest[:16]}..., manifest says "
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
