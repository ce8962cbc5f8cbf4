"""Advisory file locks that never strand a process: timeouts, holder reports, stopped holders.

A lock file records its holder (``pid``, start time, host) once the ``flock`` is taken. A
waiter polls with a non-blocking ``flock`` until a deadline, and says whom it waits for and
since when, on stderr, when it starts waiting and every :data:`REPORT_EVERY` seconds. What it
checks about the holder:

* a holder that died released its ``flock`` (the kernel drops it), so the next poll wins; its
  record is overwritten and its leftovers are removed by the caller;
* a holder that is stopped (``SIGSTOP``, a debugger: state ``T``/``t`` in ``/proc``) will not
  finish; after it is seen stopped on two polls :class:`JitLockTimeout` says so at once;
* a recorded pid that is not running here while the lock is held: the holder lives in another
  pid namespace (a container sharing the cache), or has not written its record yet; the waiter
  keeps waiting until the deadline.

Deleting a lock file while it is held must not let two processes believe they hold it:
after taking the ``flock`` the holder checks that the path still names the file it locked, and
starts over otherwise.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from .errors import JitLockTimeout

__all__ = ["Holder", "adopt", "hold", "holder_of", "is_free", "try_hold", "wait_free"]

#: Seconds between progress lines while waiting.
REPORT_EVERY = 10.0
_POLL_MIN, _POLL_MAX = 0.02, 0.25


@dataclass(frozen=True)
class Holder:
    """Who holds (or last held) a lock, from its record."""

    pid: int | None
    since: float | None
    host: str

    def state(self) -> str:
        """``running``, ``stopped``, ``zombie``, ``gone`` (no such pid here) or ``unknown``."""
        if self.pid is None:
            return "unknown"
        if self.host and self.host != socket.gethostname():
            return "unknown"
        try:
            raw = Path(f"/proc/{self.pid}/stat").read_text()
        except FileNotFoundError:
            return "gone"
        except OSError:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return "gone"
            except OSError:
                pass
            return "running"
        fields = raw.rpartition(")")[2].split()
        code = fields[0] if fields else "?"
        return {"T": "stopped", "t": "stopped", "Z": "zombie", "X": "gone"}.get(code, "running")

    def describe(self, now: float | None = None) -> str:
        if self.pid is None:
            return "an unknown process (no holder record)"
        text = f"pid {self.pid}"
        if self.host and self.host != socket.gethostname():
            text += f" on {self.host}"
        if self.since is not None:
            now = time.time() if now is None else now
            stamp = time.strftime("%H:%M:%S", time.localtime(self.since))
            text += f" since {stamp} ({max(0.0, now - self.since):.0f} s)"
        return text


def holder_of(path: Path) -> Holder:
    """The holder record in lock file ``path`` (fields None when absent or unreadable)."""
    try:
        text = path.read_text()
    except OSError:
        return Holder(None, None, "")
    parts = text.split()
    pid: int | None = None
    since: float | None = None
    with contextlib.suppress(IndexError, ValueError):
        pid = int(parts[0])
        since = float(parts[1])
    return Holder(pid, since, parts[2] if len(parts) > 2 else "")


def _record(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, f"{os.getpid()} {time.time():.3f} {socket.gethostname()}\n".encode())


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


class _Waiter:
    """Deadline, progress lines and the stopped-holder rule shared by every wait."""

    def __init__(self, path: Path, what: str, deadline: float, out: TextIO | None) -> None:
        self.path = path
        self.what = what
        self.deadline = deadline
        self.out = out
        self.start = time.monotonic()
        self.next_report = self.start
        self.stopped_seen = 0
        self.delay = _POLL_MIN

    def pause(self) -> None:
        """Sleep before the next poll, after checking the holder; raise when waiting is futile."""
        now = time.monotonic()
        holder = holder_of(self.path)
        state = holder.state()
        self.stopped_seen = self.stopped_seen + 1 if state == "stopped" else 0
        if self.stopped_seen >= 2:
            raise JitLockTimeout(
                str(self.path),
                now - self.start,
                holder.describe(),
                f"the holder is stopped (SIGSTOP or a debugger) and will not finish; resume it "
                f"(kill -CONT {holder.pid}) or end it",
            )
        if now >= self.deadline:
            raise JitLockTimeout(str(self.path), now - self.start, f"{holder.describe()}, {state}")
        if now >= self.next_report:
            waited = now - self.start
            note = "" if state in ("running", "unknown") else f", {state}"
            self._say(
                f"opmux: waiting for {self.what}: held by {holder.describe()}{note}; "
                f"waited {waited:.0f} s of {self.deadline - self.start:.0f} s"
            )
            self.next_report = now + REPORT_EVERY
        time.sleep(min(self.delay, max(0.0, self.deadline - now)))
        self.delay = min(self.delay * 2, _POLL_MAX)

    def _say(self, line: str) -> None:
        out = sys.stderr if self.out is None else self.out
        with contextlib.suppress(OSError, ValueError):
            out.write(line + "\n")
            out.flush()


@contextlib.contextmanager
def hold(path: Path, *, timeout: float, what: str, out: TextIO | None = None) -> Iterator[float]:
    """Hold the exclusive lock ``path`` (created 0600, no symlink followed) for the block.

    Waits at most ``timeout`` seconds (:class:`JitLockTimeout` after that, or at once for a
    stopped holder); yields the monotonic time at which the wait began. OSError from creating
    the file propagates (the caller knows which cache fault that is).
    """
    waiter = _Waiter(path, what, time.monotonic() + timeout, out)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            if _try_flock(fd):
                if _same_file(fd, path):
                    _record(fd)
                    break
                # deleted or replaced after we opened it: a newcomer may lock the new file
                os.close(fd)
                continue
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        waiter.pause()
    try:
        yield waiter.start
    finally:
        os.close(fd)  # closing drops the flock


def try_hold(path: Path) -> int | None:
    """Take the lock ``path`` now if nobody holds it: -> the open descriptor that holds it (the
    caller closes it, or hands it to a child process with ``pass_fds``: the lock belongs to the
    open file, so whoever keeps a copy keeps the lock), or None when it is held."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            if not _try_flock(fd):
                os.close(fd)
                return None
            if _same_file(fd, path):
                _record(fd)
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # deleted or replaced after we opened it: try the new file


def adopt(fd: int, path: Path) -> bool:
    """For a process handed ``fd`` by :func:`try_hold`'s caller: whether it holds the lock
    ``path`` (then its record names this process)."""
    try:
        if not (_same_file(fd, path) and _try_flock(fd)):  # our own lock: flock succeeds again
            return False
    except OSError:
        return False
    _record(fd)
    return True


def is_free(path: Path) -> bool:
    """True when nobody holds ``path``'s lock right now (or it does not exist)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        if _try_flock(fd):
            return True
        return False
    finally:
        os.close(fd)


def wait_free(path: Path, *, deadline: float, what: str, out: TextIO | None = None) -> None:
    """Wait until nobody holds ``path`` (its holder finished or died), until ``deadline``
    (``time.monotonic()``), reporting progress like :func:`hold`."""
    waiter = _Waiter(path, what, deadline, out)
    while not is_free(path):
        waiter.pause()
