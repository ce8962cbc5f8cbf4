"""The JIT cache end to end, on tiny C++ sources of the tests' own (never the shipped kernels).

Every test gets a private cache dir and kernel root. The C++ compiler is a wrapper script
that appends a line to a marker file for each real build (``-MF`` in its arguments) and can
be told to sleep, so tests count compiles across processes and kill builds midway.
"""

from __future__ import annotations

import fcntl
import json
import os
import pickle
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

import opmux
from opmux.kernels import jit
from opmux.kernels.jit.compile import (
    CacheInsecure,
    CompileError,
    JitCacheWarning,
    JitDisabled,
    ensure_built,
    reset,
    stats,
)
from opmux.kernels.jit.modules import JitModule

if shutil.which("g++") is None and shutil.which("c++") is None:
    pytest.skip("needs a C++ compiler", allow_module_level=True)

PYTHONPATH = str(Path(opmux.__file__).resolve().parents[1])
TINY = JitModule("tiny_cpu", ("tiny.cpp",), "cpu")
TABLE = {TINY.name: TINY}

SOURCE = """\
#include <tvm/ffi/function.h>
#include "tiny/value.h"
int tiny_value(int x) { return x + TINY_OFFSET; }
TVM_FFI_DLL_EXPORT_TYPED_FUNC(tiny_value, tiny_value);
"""

WRAPPER = """\
#!/bin/sh
case "$*" in
  *-MF*)
    echo "$$" >> "$OPMUX_TEST_MARKER"
    if [ -n "$OPMUX_TEST_SLEEP" ]; then sleep "$OPMUX_TEST_SLEEP"; fi ;;
esac
exec {cxx} "$@"
"""


def write_kernel_root(root: Path, offset: int = 1) -> Path:
    (root / "csrc").mkdir(parents=True)
    (root / "include" / "tiny").mkdir(parents=True)
    (root / "csrc" / "tiny.cpp").write_text(SOURCE)
    (root / "include" / "tiny" / "value.h").write_text(f"#define TINY_OFFSET {offset}\n")
    return root


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    cache = tmp_path / "cache"
    marker = tmp_path / "compiles.log"
    wrapper = tmp_path / "cxx-wrapper"
    real = shutil.which("g++") or shutil.which("c++")
    wrapper.write_text(WRAPPER.format(cxx=real))
    wrapper.chmod(0o755)
    monkeypatch.setenv("OPMUX_CACHE_DIR", str(cache))
    monkeypatch.setenv("CXX", str(wrapper))
    monkeypatch.setenv("OPMUX_TEST_MARKER", str(marker))
    monkeypatch.delenv("OPMUX_TEST_SLEEP", raising=False)
    monkeypatch.delenv("OPMUX_JIT", raising=False)
    reset()
    stats.reset()
    yield {"cache": cache, "marker": marker, "kernel": write_kernel_root(tmp_path / "kernel")}
    reset()


def compiles(env: dict[str, Path]) -> int:
    marker = env["marker"]
    return len(marker.read_text().splitlines()) if marker.exists() else 0


def load(env: dict[str, Path], kernel: Path | None = None):
    return jit.load_module(TINY.name, modules=TABLE, kernel_root=kernel or env["kernel"])


def entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.glob("tiny_cpu/*/*") if not p.name.startswith("."))


CHILD = """\
import json, sys
from pathlib import Path
from opmux.kernels import jit
from opmux.kernels.jit.compile import stats
from opmux.kernels.jit.modules import JitModule
m = JitModule("tiny_cpu", ("tiny.cpp",), "cpu")
mod = jit.load_module("tiny_cpu", modules={"tiny_cpu": m}, kernel_root=Path(sys.argv[1]))
print(json.dumps({"value": mod.tiny_value(41), "compiles": stats.compiles}))
"""


def spawn(env: dict[str, Path], *, capture: bool = True, **extra: str) -> subprocess.Popen[str]:
    child_env = {**os.environ, "PYTHONPATH": PYTHONPATH, **extra}
    out = subprocess.PIPE if capture else subprocess.DEVNULL
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(env["kernel"])],
        stdout=out,
        stderr=out,
        text=True,
        env=child_env,
        start_new_session=True,
    )


def test_ten_calls_one_compile_and_correct_result(env: dict[str, Path]) -> None:
    for _ in range(10):
        mod = load(env)
    assert mod.tiny_value(41) == 42
    assert (stats.compiles, stats.memo_hits, compiles(env)) == (1, 9, 1)
    [entry] = entries(env["cache"])
    manifest = json.loads((entry / "manifest.json").read_text())
    assert "kernel/include/tiny/value.h" in [h for h, _ in manifest["headers"]]
    assert not any(str(env["kernel"]) in h for h, _ in manifest["headers"])
    assert stat.S_IMODE(env["cache"].stat().st_mode) == 0o700


def test_eight_processes_race_on_a_cold_module_compile_once(env: dict[str, Path]) -> None:
    procs = [spawn(env, OPMUX_TEST_SLEEP="1") for _ in range(8)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert [r["value"] for r in results] == [42] * 8
    assert sum(r["compiles"] for r in results) == 1
    assert compiles(env) == 1
    assert len(entries(env["cache"])) == 1


def test_build_killed_midway_leaves_a_recoverable_cache(env: dict[str, Path]) -> None:
    proc = spawn(env, capture=False, OPMUX_TEST_SLEEP="60")
    deadline = time.monotonic() + 30
    while compiles(env) == 0:  # the build has started (and holds the lock)
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # only the Python process: the lock must still go
    proc.wait()
    try:
        [lock] = list(env["cache"].glob("tiny_cpu/*/.lock"))
        with open(lock) as f:  # the kernel released the dead holder's flock
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert list(env["cache"].glob("tiny_cpu/*/.staging-*"))  # its debris is still there
        assert entries(env["cache"]) == []
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the orphaned compiler wrapper
    assert load(env).tiny_value(1) == 2
    assert stats.compiles == 1
    assert list(env["cache"].glob("tiny_cpu/*/.staging-*")) == []


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_tampered_library_is_detected_and_rebuilt(env: dict[str, Path], damage: str) -> None:
    # Build without loading: rewriting a library this process has mapped would crash it.
    ensure_built(TINY, kernel_path=env["kernel"])
    [entry] = entries(env["cache"])
    lib = entry / "tiny_cpu.so"
    data = bytearray(lib.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
        lib.write_bytes(bytes(data))
    else:
        lib.write_bytes(bytes(data[:100]))
    reset()
    stats.reset()
    with pytest.warns(JitCacheWarning, match="sha256 of tiny_cpu.so"):
        mod = load(env)
    assert mod.tiny_value(1) == 2
    assert (stats.compiles, stats.rebuilds) == (1, 1)
    assert compiles(env) == 2


def test_header_edit_rebuilds(env: dict[str, Path]) -> None:
    assert load(env).tiny_value(1) == 2
    (env["kernel"] / "include" / "tiny" / "value.h").write_text("#define TINY_OFFSET 5\n")
    reset()
    assert load(env).tiny_value(1) == 6
    assert compiles(env) == 2
    assert len(entries(env["cache"])) == 2  # same source key, two header states
    (env["kernel"] / "include" / "tiny" / "value.h").write_text("#define TINY_OFFSET 1\n")
    reset()
    assert load(env).tiny_value(1) == 2  # back to the first state: a hit again
    assert compiles(env) == 2


def test_header_list_change_rebuilds(env: dict[str, Path]) -> None:
    inc = env["kernel"] / "include" / "tiny"
    (inc / "extra.h").write_text("#define TINY_EXTRA 10\n")
    (inc / "value.h").write_text('#include "extra.h"\n#define TINY_OFFSET TINY_EXTRA\n')
    assert load(env).tiny_value(1) == 11
    (inc / "value.h").write_text("#define TINY_OFFSET 3\n")
    (inc / "extra.h").unlink()
    reset()
    assert load(env).tiny_value(1) == 4
    assert compiles(env) == 2
    manifests = [json.loads((e / "manifest.json").read_text()) for e in entries(env["cache"])]
    header_lists = sorted(tuple(h for h, _ in m["headers"] if h.startswith("kernel/")) for m in manifests)
    assert header_lists == [
        ("kernel/include/tiny/extra.h", "kernel/include/tiny/value.h"),
        ("kernel/include/tiny/value.h",),
    ]


def test_same_content_elsewhere_hits_the_cache(env: dict[str, Path], tmp_path: Path) -> None:
    load(env)
    moved = tmp_path / "elsewhere" / "kernel"
    shutil.copytree(env["kernel"], moved)
    shutil.rmtree(env["kernel"])
    reset()
    stats.reset()
    assert load(env, moved).tiny_value(2) == 3
    assert (stats.compiles, stats.hits) == (0, 1)
    assert compiles(env) == 1


@pytest.mark.parametrize("bits", [stat.S_IWOTH, stat.S_IWGRP])
def test_world_writable_cache_dir_is_refused(env: dict[str, Path], bits: int) -> None:
    env["cache"].mkdir(mode=0o700)
    env["cache"].chmod(0o700 | bits)
    with pytest.raises(CacheInsecure, match="writable by group or others"):
        load(env)
    assert compiles(env) == 0


def test_writable_artifact_is_refused(env: dict[str, Path]) -> None:
    load(env)
    [entry] = entries(env["cache"])
    (entry / "tiny_cpu.so").chmod(0o777)
    reset()
    with pytest.raises(CacheInsecure, match=r"tiny_cpu\.so cannot be used: writable by group or others"):
        load(env)


@pytest.mark.skipif(os.getuid() != 0, reason="chown to another uid needs root")
def test_cache_dir_of_another_user_is_refused(env: dict[str, Path]) -> None:
    env["cache"].mkdir(mode=0o700)
    os.chown(env["cache"], 12345, 12345)
    with pytest.raises(CacheInsecure, match="owned by uid 12345") as info:
        load(env)
    assert pickle.loads(pickle.dumps(info.value)).path == str(env["cache"])


def test_compile_error_carries_command_returncode_stderr(env: dict[str, Path]) -> None:
    (env["kernel"] / "csrc" / "tiny.cpp").write_text("int broken( {\n")
    with pytest.raises(CompileError) as info:
        load(env)
    err = info.value
    assert err.returncode != 0
    assert err.command[0] == os.environ["CXX"] and "-shared" in err.command
    assert "error" in err.stderr
    again = pickle.loads(pickle.dumps(err))
    assert (again.command, again.returncode, again.stderr) == (err.command, err.returncode, err.stderr)
    assert str(again) == str(err)
    assert list(env["cache"].glob("tiny_cpu/*/.staging-*")) == []
    assert entries(env["cache"]) == []


def test_jit_disabled_with_empty_cache(env: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPMUX_JIT", "0")
    with pytest.raises(JitDisabled, match="OPMUX_JIT=0") as info:
        load(env)
    assert isinstance(info.value, jit.JitUnavailable)
    assert pickle.loads(pickle.dumps(info.value)).name == "tiny_cpu"
    assert compiles(env) == 0
    monkeypatch.setenv("OPMUX_JIT", "1")
    load(env)
    reset()
    monkeypatch.setenv("OPMUX_JIT", "0")
    assert load(env).tiny_value(0) == 1  # a cache hit still loads
    assert compiles(env) == 1


def test_invalid_jit_env_is_an_error(env: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPMUX_JIT", "maybe")
    with pytest.raises(ValueError, match=r"OPMUX_JIT='maybe' .* is invalid: expected one of 1, true"):
        load(env)


def test_missing_kernel_sources_error_at_first_use(env: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(jit.KernelSourcesMissing, match="csrc does not exist"):
        load(env, tmp_path / "nowhere")


def test_unknown_module_lists_valid_names() -> None:
    with pytest.raises(KeyError, match="unknown JIT module 'nope'; valid: activation_cpu"):
        jit.load_module("nope")


def test_progress_line_on_stderr(env: dict[str, Path], capfd: pytest.CaptureFixture[str]) -> None:
    load(env)
    err = capfd.readouterr().err
    assert err.count("opmux: compiling tiny_cpu (cpu) ... ") == 1
    assert err.rstrip().endswith(" s")
