"""Fault injection for the JIT cache: every fault is a typed error or a wait that ends.

Each case checks the four things a serving process needs: no raw traceback (a typed
``JitUnavailable`` with the path, the cause and the fix, which the op layer falls back on), no
hang (every wait ends within its timeout), no second compile, and no load from outside the
cache. Real faults where the machine allows them: a read-only and a full filesystem come from
a private mount namespace (``unshare -m``), permission cases run as a non-root user (created
with ``useradd`` when the tests run as root), the hung compiler is a script that sleeps, the
stopped holder a child process that gets ``SIGSTOP``.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import opmux
from opmux.kernels import config
from opmux.kernels.jit.compile import (
    CompileTimeout,
    JitCacheUnavailable,
    JitCacheWarning,
    JitLockTimeout,
    JitUnavailable,
    ensure_built,
    publish,
    reset,
    stats,
)
from opmux.kernels.jit.compile import load as jit_load
from opmux.kernels.jit.compile import lock as jit_lock
from opmux.kernels.jit.modules import JitModule

REAL_CXX = shutil.which("g++") or shutil.which("c++")
if REAL_CXX is None:
    pytest.skip("needs a C++ compiler", allow_module_level=True)

PYTHONPATH = str(Path(opmux.__file__).resolve().parents[1])
TINY = JitModule("tiny_cpu", ("tiny.cpp",), "cpu")
TEST_USER = "opmux-test"

SOURCE = """\
#include <tvm/ffi/function.h>
int tiny_value(int x) { return x + 1; }
TVM_FFI_DLL_EXPORT_TYPED_FUNC(tiny_value, tiny_value);
"""

# Logs each real build (an -MF in the arguments) and can sleep first: a hung compiler.
WRAPPER = """\
#!/bin/sh
case "$*" in
  *-MF*)
    echo "$$" >> "$FAULT_MARKER"
    if [ -n "$FAULT_SLEEP" ]; then sleep "$FAULT_SLEEP"; fi ;;
esac
exec {cxx} "$@"
"""

# argv: kernel root [, uid, gid]. With a uid it drops root's powers itself, after importing
# what it needs: the interpreter may live where that user cannot read (/root/.pyenv).
CHILD = """\
import fcntl, hashlib, json, os, pwd, shutil, socket, subprocess, sys, tempfile, time, warnings
from pathlib import Path
from opmux.kernels.jit.compile import ensure_built, lock, publish, toolchain
from opmux.kernels.jit.modules import JitModule
m = JitModule("tiny_cpu", ("tiny.cpp",), "cpu")
if len(sys.argv) > 2:
    # Plan as root (compiler, tvm-ffi, source key: the venv may be unreadable to the user),
    # then drop to the user: what is under test is the cache, as that user.
    from opmux.kernels.jit.compile import load
    plan = load._plan(m, kernel_path=Path(sys.argv[1]), archs=None)
    load._plan = lambda *a, **k: plan
    os.setgroups([])
    os.setgid(int(sys.argv[3]))
    os.setuid(int(sys.argv[2]))
start = time.monotonic()
try:
    r = ensure_built(m, kernel_path=Path(sys.argv[1]))
    out = {"ok": True, "library": str(r.library), "compiled": r.compiled}
except Exception as e:
    out = {"ok": False, "type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__],
           "message": str(e), "path": getattr(e, "path", None), "cause": getattr(e, "cause", None),
           "fix": getattr(e, "fix", None)}
out["seconds"] = time.monotonic() - start
print(json.dumps(out))
"""


@pytest.fixture
def work() -> Iterator[Path]:
    """A scratch dir the non-root test user can traverse (pytest's tmp_path of root is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="opmux-faults-"))
    path.chmod(0o755)
    yield path
    subprocess.run(["chmod", "-R", "u+rwx", str(path)], check=False, capture_output=True)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kernel(work: Path) -> Path:
    root = work / "kernel"
    (root / "csrc").mkdir(parents=True)
    (root / "include").mkdir()
    (root / "csrc" / "tiny.cpp").write_text(SOURCE)
    for p in (root, root / "csrc", root / "include"):
        p.chmod(0o755)  # readable by the non-root test user
    (root / "csrc" / "tiny.cpp").chmod(0o644)
    return root


@pytest.fixture
def fault_env(work: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Path]]:
    tmp_path = work
    marker = tmp_path / "compiles.log"
    marker.touch()
    marker.chmod(0o666)
    wrapper = tmp_path / "cxx"
    wrapper.write_text(WRAPPER.format(cxx=REAL_CXX))
    wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(wrapper))
    monkeypatch.setenv("FAULT_MARKER", str(marker))
    monkeypatch.delenv("FAULT_SLEEP", raising=False)
    monkeypatch.setenv("OPMUX_CACHE_DIR", str(tmp_path / "cache"))
    for var in ("OPMUX_JIT_LOCK_TIMEOUT", "OPMUX_JIT_COMPILE_TIMEOUT", "OPMUX_JIT"):
        monkeypatch.delenv(var, raising=False)
    reset()
    stats.reset()
    yield {"marker": marker, "cache": tmp_path / "cache", "tmp": tmp_path}
    reset()


def compiles(env: dict[str, Path]) -> int:
    return len(env["marker"].read_text().split())


def assert_typed(exc: JitCacheUnavailable, path: str, cause: str) -> None:
    """A cache fault names where, what and how to fix it, and survives pickling."""
    import pickle

    assert isinstance(exc, JitUnavailable)
    assert path in exc.path, (exc.path, path)
    assert cause in exc.cause, (exc.cause, cause)
    assert "OPMUX_CACHE_DIR" in exc.fix or "HOME" in exc.fix
    assert str(exc).startswith("opmux: the JIT cache at ")
    again = pickle.loads(pickle.dumps(exc))
    assert (type(again), again.path, again.cause, again.fix) == (type(exc), exc.path, exc.cause, exc.fix)


def child(
    kernel: Path,
    env: dict[str, str],
    *,
    user: pwd.struct_passwd | None = None,
    wrap: list[str] | None = None,
    timeout: float = 60,
) -> dict[str, Any]:
    """Run :data:`CHILD` (``ensure_built`` on the tiny module) in a fresh process; no
    traceback may reach its stderr."""
    full = {**os.environ, "PYTHONPATH": PYTHONPATH, **env}
    cmd = [sys.executable, "-c", CHILD, str(kernel)]
    if user is not None:
        cmd += [str(user.pw_uid), str(user.pw_gid)]
        full["HOME"] = env.get("HOME", user.pw_dir)
    proc = subprocess.run([*(wrap or []), *cmd], capture_output=True, text=True, env=full, timeout=timeout)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["stderr"] = proc.stderr
    return result


# -- a path that cannot be a cache ------------------------------------------------------------


def test_cache_dir_is_a_file(
    fault_env: dict[str, Path], kernel: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    afile = fault_env["tmp"] / "passwd"
    afile.write_text("root:x:0:0::/root:/bin/sh\n")
    monkeypatch.setenv("OPMUX_CACHE_DIR", str(afile))
    with pytest.raises(JitCacheUnavailable) as info:
        ensure_built(TINY, kernel_path=kernel)
    assert_typed(info.value, str(afile), "not a directory")
    assert compiles(fault_env) == 0


def test_cache_dir_created_by_another_process_between_check_and_mkdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race eight cold processes hit in CI: our is_dir() says no, a peer's mkdir lands,
    # then ours finds the directory. That is a cache, not "a file in the way".
    root = tmp_path / "cache"
    monkeypatch.setenv("OPMUX_CACHE_DIR", str(root))
    real_is_dir = Path.is_dir
    raced = []

    def is_dir_then_peer_mkdir(self: Path) -> bool:
        if self == root and not raced:
            raced.append(True)
            answer = real_is_dir(self)
            root.mkdir(mode=0o700)  # the peer process, just after our check
            return answer
        return real_is_dir(self)

    monkeypatch.setattr(Path, "is_dir", is_dir_then_peer_mkdir)
    assert publish.cache_root() == root
    assert raced and real_is_dir(root)


def test_cache_dir_below_a_file(
    fault_env: dict[str, Path], kernel: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPMUX_CACHE_DIR", "/etc/passwd/opmux")
    with pytest.raises(JitCacheUnavailable) as info:
        ensure_built(TINY, kernel_path=kernel)
    assert_typed(info.value, "/etc/passwd", "not a directory")


def test_cache_dir_in_proc(fault_env: dict[str, Path], kernel: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPMUX_CACHE_DIR", "/proc/self")
    with pytest.raises(JitCacheUnavailable) as info:
        ensure_built(TINY, kernel_path=kernel)
    assert info.value.path.startswith("/proc/")
    assert compiles(fault_env) == 0


def test_path_too_long(fault_env: dict[str, Path], kernel: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    long = fault_env["tmp"] / ("x" * 300) / "cache"
    monkeypatch.setenv("OPMUX_CACHE_DIR", str(long))
    with pytest.raises(JitCacheUnavailable) as info:
        ensure_built(TINY, kernel_path=kernel)
    assert_typed(info.value, "x" * 255, "too long")
    assert "shorter" in info.value.fix


def test_relative_cache_dir_is_refused_and_cwd_untouched(
    fault_env: dict[str, Path], kernel: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(fault_env["tmp"])
    monkeypatch.setenv("OPMUX_CACHE_DIR", "relative/cache")
    with pytest.raises(JitCacheUnavailable) as info:
        ensure_built(TINY, kernel_path=kernel)
    assert_typed(info.value, "relative/cache", "relative")
    assert not (fault_env["tmp"] / "relative").exists()


@pytest.mark.parametrize("home", [None, ""], ids=["unset", "empty"])
def test_no_home_directory(
    fault_env: dict[str, Path], kernel: Path, monkeypatch: pytest.MonkeyPatch, home: str | None
) -> None:
    """HOME unset (or empty) and no passwd entry: never ``./~/.cache`` and never ``/.cache``."""
    monkeypatch.chdir(fault_env["tmp"])
    monkeypatch.delenv("OPMUX_CACHE_DIR")
    if home is None:
        monkeypatch.delenv("HOME", raising=False)
    else:
        monkeypatch.setenv("HOME", home)

    def no_entry(uid: int) -> Any:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    with pytest.raises(JitCacheUnavailable) as info:
        ensure_built(TINY, kernel_path=kernel)
    assert_typed(info.value, "~/.cache/opmux/jit", "home directory")
    assert not (fault_env["tmp"] / "~").exists()
    assert compiles(fault_env) == 0


def test_home_falls_back_to_the_passwd_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPMUX_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", "")
    expected = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".cache/opmux/jit"
    assert config.cache_dir() == expected
    assert publish.cache_root(create=False) == expected


# -- real filesystem faults in a private mount namespace ---------------------------------------


def _can_unshare_mount() -> str | None:
    if shutil.which("unshare") is None:
        return "no unshare(1)"
    flags = ["-m"] if os.getuid() == 0 else ["-rm"]
    probe = subprocess.run(
        [
            "unshare",
            *flags,
            "sh",
            "-c",
            "mount -t tmpfs -o size=64k tmpfs /mnt 2>&1 || mount -t tmpfs tmpfs /tmp",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    return None if probe.returncode == 0 else f"cannot mount in a private namespace: {probe.stdout.strip()}"


UNSHARE = _can_unshare_mount()


def in_mount_ns(mountpoint: Path, options: str, *, after: str = "") -> list[str]:
    """A command prefix: a private mount namespace with a tmpfs of ``options`` at ``mountpoint``."""
    flags = ["-m"] if os.getuid() == 0 else ["-rm"]
    script = (
        f'mount -t tmpfs -o {options} tmpfs "{mountpoint}" && chmod 700 "{mountpoint}" {after}&& exec "$@"'
    )
    return ["unshare", *flags, "sh", "-c", script, "sh"]


@pytest.mark.skipif(UNSHARE is not None, reason=str(UNSHARE))
def test_read_only_filesystem(fault_env: dict[str, Path], kernel: Path) -> None:
    mnt = fault_env["tmp"] / "ro"
    mnt.mkdir()
    wrap = in_mount_ns(mnt, "size=1m", after=f'&& mount -o remount,ro "{mnt}" ')
    out = child(kernel, {"OPMUX_CACHE_DIR": str(mnt / "cache")}, wrap=wrap)
    assert not out["ok"] and out["type"] == "JitCacheUnavailable", out
    assert "read-only" in out["cause"] and str(mnt) in out["path"]
    assert "OPMUX_JIT=0" in out["fix"]  # prewarm elsewhere is a way out
    assert compiles(fault_env) == 0


@pytest.mark.skipif(UNSHARE is not None, reason=str(UNSHARE))
def test_full_filesystem(fault_env: dict[str, Path], kernel: Path) -> None:
    mnt = fault_env["tmp"] / "full"
    mnt.mkdir()
    out = child(kernel, {"OPMUX_CACHE_DIR": str(mnt / "cache")}, wrap=in_mount_ns(mnt, "size=8k"))
    assert not out["ok"] and out["type"] == "JitCacheUnavailable", out
    assert "no space left" in out["cause"] and "prune" in out["fix"]
    assert compiles(fault_env) == 1  # it tried once, and says why it failed


# -- permissions, as a user that root's powers do not cover ------------------------------------


@pytest.fixture(scope="session")
def nonroot() -> pwd.struct_passwd:
    """A non-root user: the current one, or (as root, as in CI) a system user made for this."""
    if os.getuid() != 0:
        return pwd.getpwuid(os.getuid())
    try:
        return pwd.getpwnam(TEST_USER)
    except KeyError:
        pass
    if shutil.which("useradd") is None:
        pytest.skip("running as root and useradd is missing: cannot create a non-root test user")
    made = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", TEST_USER],
        capture_output=True,
        text=True,
        check=False,
    )
    if made.returncode != 0 and "already exists" not in made.stderr:
        pytest.skip(f"cannot create a non-root test user: {made.stderr.strip()}")
    return pwd.getpwnam(TEST_USER)


def as_user(user: pwd.struct_passwd, path: Path, mode: int) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    if os.getuid() == 0:
        os.chown(path, user.pw_uid, user.pw_gid)
    path.chmod(mode)
    return path


def test_no_permission(fault_env: dict[str, Path], kernel: Path, nonroot: pwd.struct_passwd) -> None:
    cache = as_user(nonroot, fault_env["tmp"] / "cache0500", 0o500)
    out = child(kernel, {"OPMUX_CACHE_DIR": str(cache)}, user=nonroot if os.getuid() == 0 else None)
    assert not out["ok"] and out["type"] == "JitCacheUnavailable", out
    assert "permission denied" in out["cause"] and str(cache) in out["path"]
    assert compiles(fault_env) == 0


def test_foreign_owner(fault_env: dict[str, Path], kernel: Path, nonroot: pwd.struct_passwd) -> None:
    """A cache dir owned by someone else (root) is refused before anything is loaded."""
    if os.getuid() == 0:
        cache = fault_env["tmp"] / "rootcache"
        cache.mkdir(mode=0o755)
        out = child(kernel, {"OPMUX_CACHE_DIR": str(cache)}, user=nonroot)
    else:  # already the non-root user: any root-owned directory will do
        out = child(kernel, {"OPMUX_CACHE_DIR": "/usr"})
    assert nonroot.pw_uid != 0
    assert not out["ok"] and out["type"] == "CacheInsecure", out
    assert "JitCacheUnavailable" in out["mro"]
    assert f"owned by uid 0, not by uid {nonroot.pw_uid}" in out["cause"]


def test_no_home_as_a_user_without_passwd_entry(fault_env: dict[str, Path], kernel: Path) -> None:
    """A container's arbitrary uid: no passwd entry and no HOME."""
    if os.getuid() != 0:
        pytest.skip("needs root to switch to a uid without a passwd entry")
    uid = 54321
    while True:
        try:
            pwd.getpwuid(uid)
            uid += 1
        except KeyError:
            break
    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "OPMUX_CACHE_DIR")}
    work = as_user(pwd.struct_passwd(("x", "x", uid, uid, "", "/", "")), fault_env["tmp"] / "cwd", 0o700)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(kernel), str(uid), str(uid)],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": PYTHONPATH},
        cwd=work,
        timeout=60,
    )
    assert "Traceback" not in proc.stderr and proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["type"] == "JitCacheUnavailable" and "home directory" in out["cause"], out
    assert list(work.iterdir()) == []  # nothing created relative to the working directory


# -- the manifest may only name a plain file inside its own entry ------------------------------


@pytest.fixture
def built(fault_env: dict[str, Path], kernel: Path) -> publish.Entry:
    ensure_built(TINY, kernel_path=kernel)
    [entry_dir] = [
        p for p in fault_env["cache"].glob("tiny_cpu/*/*") if p.is_dir() and not p.name.startswith(".")
    ]
    manifest = json.loads((entry_dir / "manifest.json").read_text())
    return publish.Entry(entry_dir, manifest)


def _tamper(entry: publish.Entry, library: str) -> None:
    manifest = dict(entry.manifest)
    manifest["library"] = library
    (entry.path / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("where", ["absolute", "dotdot", "symlink", "directory", "manifest"])
def test_manifest_library_outside_its_entry_is_refused_and_rebuilt(
    fault_env: dict[str, Path], kernel: Path, built: publish.Entry, where: str
) -> None:
    evil_dir = fault_env["tmp"] / "world"
    evil_dir.mkdir(mode=0o777)
    evil = evil_dir / "evil.so"
    shutil.copy(built.library, evil)  # same bytes: the digest alone would not catch it
    if where == "absolute":
        _tamper(built, str(evil))
    elif where == "dotdot":
        _tamper(built, "../../../world/evil.so")
    elif where == "symlink":
        (built.path / "link.so").symlink_to(evil)
        _tamper(built, "link.so")
    elif where == "directory":
        (built.path / "sub").mkdir(mode=0o700)
        _tamper(built, "sub")
    else:
        _tamper(built, "manifest.json")
    with pytest.warns(JitCacheWarning, match="rejected") as rec:
        result = ensure_built(TINY, kernel_path=kernel)
    assert rec[0].filename == __file__  # attributed to the caller, not to opmux
    assert result.compiled and compiles(fault_env) == 2
    assert result.library.parent.parent.parent.parent == fault_env["cache"]
    assert result.library.is_file() and not result.library.is_symlink()


def test_publish_refuses_a_library_outside_the_entry(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="refusing to publish"):
        publish.publish(tmp_path, tmp_path, key="k" * 64, manifest={"library": "/tmp/x.so"})


# -- hangs: the compiler, the lock holder ----------------------------------------------------


def test_hung_compiler_is_killed(
    fault_env: dict[str, Path], kernel: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAULT_SLEEP", "60")
    monkeypatch.setenv("OPMUX_JIT_COMPILE_TIMEOUT", "1")
    start = time.monotonic()
    with pytest.raises(CompileTimeout, match="killed after 1 s") as info:
        ensure_built(TINY, kernel_path=kernel)
    assert time.monotonic() - start < 15
    assert info.value.seconds == 1
    [pid] = fault_env["marker"].read_text().split()
    time.sleep(0.2)
    assert (
        not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[-1][:3]
    )
    assert not list(fault_env["cache"].glob("tiny_cpu/*/.staging-*"))  # nothing left behind


def test_hung_compiler_whose_child_escaped_does_not_hang(
    fault_env: dict[str, Path], kernel: Path, monkeypatch: pytest.MonkeyPatch, work: Path
) -> None:
    """A compiler that left a daemon behind holding its output pipes: the kill cannot reach
    it, and the build still ends (its output is given up)."""
    wrapper = work / "cxx-daemon"
    daemon = work / "daemon.pid"
    wrapper.write_text(
        "#!/bin/sh\n"
        'case "$*" in *-MF*) echo "$$" >> "$FAULT_MARKER"; '
        f"(setsid sh -c 'echo $$ > {daemon}; exec sleep 30' &); sleep 60 ;; esac\n"
        f'exec {REAL_CXX} "$@"\n'
    )
    wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(wrapper))
    monkeypatch.setenv("OPMUX_JIT_COMPILE_TIMEOUT", "1")
    start = time.monotonic()
    with pytest.raises(CompileTimeout, match="output lost"):
        ensure_built(TINY, kernel_path=kernel)
    assert time.monotonic() - start < 15
    os.kill(int(daemon.read_text()), signal.SIGKILL)  # the daemon this test made, by its pid


def test_hung_compiler_under_the_op_memo_is_not_retried(
    fault_env: dict[str, Path], kernel: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ops of a group share one module: after a timeout none of them waits again."""
    monkeypatch.setenv("FAULT_SLEEP", "60")
    monkeypatch.setenv("OPMUX_JIT_COMPILE_TIMEOUT", "1")
    for _ in range(3):
        with pytest.raises(CompileTimeout):
            jit_load.load(TINY, kernel_path=kernel)
    assert compiles(fault_env) == 1


def spawn_builder(kernel: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(kernel)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": PYTHONPATH, **env},
    )


def wait_for_compile(env: dict[str, Path], proc: subprocess.Popen[str], count: int = 1) -> None:
    deadline = time.monotonic() + 30
    while compiles(env) < count:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_waiter_gives_up_on_a_slow_holder_and_names_it(
    fault_env: dict[str, Path],
    kernel: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    holder = spawn_builder(kernel, {"FAULT_SLEEP": "30"})
    try:
        wait_for_compile(fault_env, holder)
        monkeypatch.setenv("OPMUX_JIT_LOCK_TIMEOUT", "1.5")
        monkeypatch.setattr(jit_lock, "REPORT_EVERY", 0.5)
        start = time.monotonic()
        with pytest.raises(JitLockTimeout, match=f"held by pid {holder.pid} since") as info:
            ensure_built(TINY, kernel_path=kernel)
        assert 1.4 < time.monotonic() - start < 10
        assert "OPMUX_JIT_LOCK_TIMEOUT" in str(info.value)
        err = capsys.readouterr().err
        assert "opmux: waiting for the JIT build of tiny_cpu" in err and f"pid {holder.pid}" in err
        assert err.count("waiting for") >= 2  # progress, not one line and silence
    finally:
        holder.kill()
        holder.communicate()
    assert compiles(fault_env) == 1


HOLDER = """\
import sys, time
from pathlib import Path
from opmux.kernels.jit.compile import lock
with lock.hold(Path(sys.argv[1]), timeout=5, what="test"):
    print("held", flush=True)
    time.sleep(60)
"""


def _group(kernel: Path) -> Path:
    plan = jit_load._plan(TINY, kernel_path=kernel, archs=None)
    root = publish.cache_root()
    group = root / TINY.name / plan.source_key.digest[: publish.KEY_CHARS]
    publish.ensure_dir(root / TINY.name)
    publish.ensure_dir(group)
    return group


def test_stopped_holder_is_detected(
    fault_env: dict[str, Path], kernel: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    group = _group(kernel)
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(group / ".lock")],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": PYTHONPATH},
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        os.kill(proc.pid, signal.SIGSTOP)
        monkeypatch.setenv("OPMUX_JIT_LOCK_TIMEOUT", "60")
        start = time.monotonic()
        with pytest.raises(JitLockTimeout, match=rf"pid {proc.pid} .*the holder is stopped") as info:
            ensure_built(TINY, kernel_path=kernel)
        assert time.monotonic() - start < 5  # not the 60 s timeout
        assert f"kill -CONT {proc.pid}" in str(info.value)
    finally:
        proc.kill()
        proc.communicate()  # reap it and close its pipe
    assert compiles(fault_env) == 0
    result = ensure_built(TINY, kernel_path=kernel)  # the dead holder's lock is free again
    assert result.compiled and compiles(fault_env) == 1


def test_dead_holder_record_does_not_block(fault_env: dict[str, Path], kernel: Path) -> None:
    group = _group(kernel)
    (group / ".lock").write_text("999999999 1.0 nowhere\n")  # a holder that no longer exists
    (group / ".lock").chmod(0o600)
    start = time.monotonic()
    assert ensure_built(TINY, kernel_path=kernel).compiled
    assert time.monotonic() - start < 20 and compiles(fault_env) == 1


def test_deleted_lock_mid_compile_keeps_the_first_build(fault_env: dict[str, Path], kernel: Path) -> None:
    """Someone deletes ``.lock`` while A compiles; B takes a fresh lock but must neither
    delete A's staging dir nor compile a second time: it waits for A and uses its entry."""
    first = spawn_builder(kernel, {"FAULT_SLEEP": "2"})
    try:
        wait_for_compile(fault_env, first)
        [lock] = list(fault_env["cache"].glob("tiny_cpu/*/.lock"))
        lock.unlink()
        second = ensure_built(TINY, kernel_path=kernel)
        out, err = first.communicate(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    a = json.loads(out.strip().splitlines()[-1])
    assert a["ok"] and a["compiled"], (a, err)
    assert not second.compiled and str(second.library) == a["library"]
    assert compiles(fault_env) == 1


def test_waiters_do_not_repeat_a_build_that_failed_while_they_waited(
    fault_env: dict[str, Path], kernel: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = spawn_builder(kernel, {"FAULT_SLEEP": "30", "OPMUX_JIT_COMPILE_TIMEOUT": "1.5"})
    try:
        wait_for_compile(fault_env, first)
        with pytest.raises(
            JitUnavailable, match=rf"by pid {first.pid}, which this process waited for, failed"
        ):
            ensure_built(TINY, kernel_path=kernel)
        out, _ = first.communicate(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert json.loads(out.strip().splitlines()[-1])["type"] == "CompileTimeout"
    assert compiles(fault_env) == 1
    ensure_built(TINY, kernel_path=kernel)  # a later call tries again
    assert compiles(fault_env) == 2


# -- the op layer falls back, counted and warned once ----------------------------------------


OP_SCRIPT = """\
import json, warnings
import torch
from opmux.kernels import explain, tracing
from opmux.kernels.ops.activation import silu_and_mul

x = torch.randn(2, 8)
expected = silu_and_mul(x, backend="torch")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(3):
        torch.testing.assert_close(silu_and_mul(x), expected)
jit = explain("activation.silu_and_mul", x).decision("jit")
print(json.dumps({
    "warnings": [[str(w.message), w.filename, w.lineno] for w in caught if "falls back" in str(w.message)],
    "fallbacks": sum(n for k, n in tracing.fallbacks().items() if k[0] == "activation.silu_and_mul"),
    "jit": [jit.reason.value if jit.reason else None, jit.detail],
}))
"""


def test_unforced_op_falls_back_once_with_one_warning(work: Path) -> None:
    """A cache fault on a default call, in a fresh process: the op runs (on the next backend),
    the fallback is counted once and warned once, at the caller's line, exactly like a missing
    compiler; the trace names the fault, its path and its fix."""
    pytest.importorskip("torch")
    afile = work / "not-a-dir"
    afile.write_text("")
    script = work / "serve.py"
    script.write_text(OP_SCRIPT)
    env = {**os.environ, "PYTHONPATH": PYTHONPATH, "OPMUX_CACHE_DIR": str(afile), "TRITON_INTERPRET": "1"}
    for var in ("OPMUX_FALLBACK", "OPMUX_JIT", "OPMUX_KERNEL_BACKEND"):
        env.pop(var, None)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(out["warnings"]) == 1, out
    _, filename, lineno = out["warnings"][0]
    assert filename == str(script) and lineno == 11  # the caller's line: silu_and_mul(x) in the loop
    assert out["fallbacks"] == 1
    reason, detail = out["jit"]
    assert reason == "failed" and "JitCacheUnavailable" in detail and str(afile) in detail
    assert "OPMUX_CACHE_DIR" in detail


def test_cache_clear_and_prune_skip_a_build_whose_lock_was_deleted(
    fault_env: dict[str, Path], kernel: Path
) -> None:
    from opmux.kernels.jit.compile import cache as jit_cache

    group = _group(kernel)
    staging = publish.new_staging(group)  # a live build (this process owns it) ...
    try:
        assert not (group / ".lock").exists()  # ... without a .lock
        for clean in (jit_cache.clear, jit_cache.prune):
            summary = clean(publish.cache_root())
            assert summary["skipped_busy"] == [str(group)]
            assert staging.path.is_dir()
    finally:
        staging.close()
    assert jit_cache.prune(publish.cache_root())["skipped_busy"] == []
