"""Inspect and clean the JIT cache (the library behind ``python -m opmux.kernels.jit cache``).

Cleaning never races a build: each group is cleaned only while holding its lock, taken
without waiting, and with no live staging dir (a build whose ``.lock`` was deleted); a group
being built right now is skipped and reported. A cache that cannot be written is a
``JitCacheUnavailable``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import cache_fault
from .publish import check_secure, discard, iter_entries, live_builds, remove_stale

__all__ = ["clear", "list_entries", "prune"]


def list_entries(root: Path) -> list[dict[str, Any]]:
    """One dict per entry: module, device, key, size, created, last use, status."""
    rows: list[dict[str, Any]] = []
    for entry, manifest in iter_entries(root):
        st = entry.stat()
        size = sum(p.stat().st_size for p in entry.iterdir() if p.is_file())
        rows.append(
            {
                "module": manifest["name"] if manifest else entry.parent.parent.name,
                "device": manifest["device"] if manifest else "?",
                "key": manifest["key"] if manifest else entry.name,
                "size": size,
                "created": manifest["created"] if manifest else st.st_mtime,
                "last_used": st.st_mtime,
                "status": "ok" if manifest else "uncommitted",
                "path": str(entry),
            }
        )
    return rows


@contextlib.contextmanager
def _try_lock(group: Path) -> Iterator[bool]:
    try:
        fd = os.open(group / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:  # read-only, no permission: cleaning cannot work, say why
        raise cache_fault(exc, group) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            yield False
            return
        raise
    try:
        # a build whose .lock was deleted under it still owns its staging dir: busy too
        yield not live_builds(group)
    finally:
        os.close(fd)


def _groups(root: Path) -> Iterator[Path]:
    if not root.is_dir():
        return
    check_secure(root, follow=True)
    for module in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        check_secure(module)
        yield from sorted(p for p in module.iterdir() if p.is_dir())


def prune(root: Path, *, older_than_days: float | None = None) -> dict[str, Any]:
    """Remove leftovers of dead builds, uncommitted entries, and (if given) entries unused
    for ``older_than_days`` days. Returns counts and the groups skipped (being built)."""
    cutoff = None if older_than_days is None else time.time() - older_than_days * 86400
    removed, skipped = 0, []
    for group in _groups(root):
        with _try_lock(group) as locked:
            if not locked:
                skipped.append(str(group))
                continue
            removed += remove_stale(group)
            for entry in [p for p in group.iterdir() if p.is_dir() and not p.name.startswith(".")]:
                uncommitted = not (entry / "manifest.json").is_file()
                if uncommitted or (cutoff is not None and entry.stat().st_mtime < cutoff):
                    discard(entry)
                    removed += 1
    return {"removed": removed, "skipped_busy": skipped}


def clear(root: Path) -> dict[str, Any]:
    """Remove every entry (groups being built are skipped and reported)."""
    removed, skipped = 0, []
    for group in _groups(root):
        with _try_lock(group) as locked:
            if not locked:
                skipped.append(str(group))
                continue
            removed += sum(1 for p in group.iterdir() if p.is_dir() and not p.name.startswith("."))
            shutil.rmtree(group, ignore_errors=True)
    if root.is_dir():
        for module in root.iterdir():
            with contextlib.suppress(OSError):
                module.rmdir()  # only if now empty
    return {"removed": removed, "skipped_busy": skipped}
