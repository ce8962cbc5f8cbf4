"""A real package index on 127.0.0.1 for the release rehearsal: pypiserver with upload auth.

:class:`LocalIndex` starts ``pypi-server`` on a free loopback port with an htpasswd file (uploads
need the password, reads do not), no fallback to PyPI (a name it lacks is a 404, never someone
else's package) and no overwrite (a second upload of the same file is refused, as on PyPI), and
stops it on exit.  :func:`upload` runs ``twine upload`` - the tool the publish step runs - and
raises :class:`UploadRefused` naming the file when the index refuses it.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

__all__ = ["LocalIndex", "UploadRefused", "upload"]


class UploadRefused(RuntimeError):
    """The index refused an upload (a duplicate version, bad credentials); the release stops."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scripts(python: str) -> Path:
    return Path(python).absolute().parent


class LocalIndex:
    """``with LocalIndex(workdir) as index:`` a running pypiserver; ``index.simple`` is its URL."""

    def __init__(self, workdir: Path, *, python: str = sys.executable, timeout: float = 60.0) -> None:
        self.workdir = Path(workdir)
        self.python = python
        self.timeout = timeout
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.simple = f"{self.url}simple/"
        self.user = "opmux-release"
        self.password = secrets.token_urlsafe(16)
        self.packages = self.workdir / "packages"
        self.log = self.workdir / "pypiserver.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def _htpasswd(self) -> Path:
        with warnings.catch_warnings():  # passlib imports the stdlib crypt module (deprecated)
            warnings.simplefilter("ignore", DeprecationWarning)
            from passlib.apache import HtpasswdFile  # pypiserver[passlib] checks it

        path = self.workdir / "htpasswd"
        ht = HtpasswdFile(str(path), new=True, default_scheme="sha256_crypt")
        ht.set_password(self.user, self.password)
        ht.save()
        return path

    def __enter__(self) -> LocalIndex:
        self.packages.mkdir(parents=True, exist_ok=True)
        server = _scripts(self.python) / "pypi-server"
        cmd = [
            str(server), "run", "--host", "127.0.0.1", "--port", str(self.port),
            "--passwords", str(self._htpasswd()), "--authenticate", "update",
            "--disable-fallback", "--log-file", str(self.log), str(self.packages),
        ]  # fmt: skip
        self._proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"pypi-server exited with {self._proc.returncode}; see {self.log}")
            try:
                with urllib.request.urlopen(self.simple, timeout=2):
                    return self
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        self.__exit__(None, None, None)
        raise RuntimeError(f"pypi-server did not answer on {self.simple} within {self.timeout:.0f} s")

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def names(self) -> list[str]:
        """The file names the index holds."""
        return sorted(p.name for p in self.packages.iterdir() if p.is_file())


def upload(index: LocalIndex, files: Sequence[Path], *, python: str = sys.executable) -> None:
    """``twine upload`` of ``files`` to ``index`` with its credentials (never --skip-existing)."""
    env = {**os.environ, "TWINE_USERNAME": index.user, "TWINE_PASSWORD": index.password, "NO_COLOR": "1"}
    cmd = [python, "-m", "twine", "upload", "--non-interactive", "--disable-progress-bar"]
    cmd += ["--repository-url", index.url, *map(str, files)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        detail = (proc.stdout + proc.stderr).strip().splitlines()
        shown = "\n    ".join(detail[-6:])
        raise UploadRefused(
            f"the index refused the upload of {', '.join(Path(f).name for f in files)} "
            f"(twine exit {proc.returncode}):\n    {shown}"
        )
