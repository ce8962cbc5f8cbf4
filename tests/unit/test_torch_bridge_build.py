"""The torch bridge's build across processes: one builder, nothing left behind, stale leftovers cleaned.

Short processes on a fresh cache, as a new user runs them: each calls an op's library op (which
wants the bridge) and exits in seconds, long before the bridge's compile ends. The compiler is a
wrapper around the real one that writes a line per compile (the count); the builds opmux starts
are also counted from its ``builds.log``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REAL_CXX = shutil.which("c++") or shutil.which("g++")
if REAL_CXX is None:
    pytest.skip("needs a C++ compiler", allow_module_level=True)

_SHORT = textwrap.dedent(
    """
    import torch
    from opmux.kernels import ops, torch_kernels
    x = torch.randn(4, 64)
    ops.activation.silu_and_mul(x)  # defines the library ops (the torch backend: no JIT module)
    torch.ops.opmux.silu_and_mul(x)  # its Python kernel asks for the bridge
    print("STATE", torch_kernels.status()[0])
    """
)


def _wrapper(tmp_path: Path, body: str) -> Path:
    cxx = tmp_path / "cxx"
    cxx.write_text(
        f'#!/bin/sh\ncase "$*" in *--version*) exec {REAL_CXX} "$@";; esac\n'
        f'echo "$$" >> {tmp_path / "compiles"}\n{body}\n'
    )
    cxx.chmod(0o755)
    return cxx


def _env(tmp_path: Path, cxx: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT / "python"),
        "OPMUX_CACHE_DIR": str(tmp_path / "cache"),
        "OPMUX_TORCH_KERNELS": "cpu",
        "OPMUX_KERNEL_BACKEND": "activation.*=torch",  # no JIT module: only the bridge compiles
        "CXX": str(cxx),
        "TRITON_INTERPRET": "1",
    }


def _ours(tmp_path: Path) -> list[str]:
    """Command lines of live processes that name this test's files (builder, compiler)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if str(tmp_path) in cmd and state != "Z":
            found.append(f"{pid}: {cmd[:200]}")
    return found


def _group(tmp_path: Path) -> Path:
    groups = list((tmp_path / "cache" / "torch_bridge").iterdir())
    assert len(groups) == 1, groups
    return groups[0]


def _wait_quiet(tmp_path: Path, limit: float) -> float:
    start = time.monotonic()
    while _ours(tmp_path):
        assert time.monotonic() - start < limit, _ours(tmp_path)
        time.sleep(0.5)
    return time.monotonic() - start


def _short(tmp_path: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _SHORT], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def test_ten_short_processes_start_one_build_and_leave_nothing(tmp_path: Path) -> None:
    env = _env(tmp_path, _wrapper(tmp_path, f'exec {REAL_CXX} "$@"'))
    t0 = time.monotonic()
    for _wave in range(2):  # ten processes, five at once, each exiting long before the compile ends
        procs = [_short(tmp_path, env) for _ in range(5)]
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, out + err
            assert "STATE building" in out, out + err
        live = _ours(tmp_path)
        builders = [c for c in live if "opmux.kernels._bridge_build" in c]
        assert len(builders) <= 1, live
        # whatever still runs (the compiler) is the one builder's, not an exited process's orphan
        builder = int(builders[0].partition(":")[0]) if builders else -1
        for line in live:
            pid = int(line.partition(":")[0])
            while pid not in (builder, 0, 1):
                pid = _parent(pid)
            assert pid == builder, (line, live)
    exited = time.monotonic() - t0
    waited = _wait_quiet(tmp_path, 900)  # the one builder finishes and publishes
    group = _group(tmp_path)
    compiles = (tmp_path / "compiles").read_text().split()
    builds = (group / "builds.log").read_text().splitlines()
    assert len(compiles) == 1 and len(builds) == 1 and builds[0].endswith(" builder"), (compiles, builds)
    assert (group / "torch_bridge.so").is_file()
    assert not list(group.glob(".torch_bridge.*")), list(group.iterdir())
    assert sorted(p.name for p in group.iterdir()) == [".lock", "build.log", "builds.log", "torch_bridge.so"]
    # the next process loads it, compiles nothing, and its env says so
    check = subprocess.run(
        [
            sys.executable,
            "-c",
            _SHORT + "torch_kernels.kick(wait=True); print('AFTER', torch_kernels.status())",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert "AFTER ('ready', '')" in check.stdout, check.stdout + check.stderr
    info = subprocess.run(
        [sys.executable, "-m", "opmux.kernels", "env", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert json.loads(info.stdout)["torch_bridge"]["state"] == "cache-built", info.stdout + info.stderr
    assert len((tmp_path / "compiles").read_text().split()) == 1
    print(f"\nten short processes: {exited:.1f} s; builder done {waited:.1f} s after; 1 compile")


def test_a_killed_builder_leaves_no_compiler_and_its_staging_is_cleaned(tmp_path: Path) -> None:
    """kill -9 of the builder mid-compile: its compiler dies with it; the staging file it leaves
    is removed by the next build, which the next process starts (the lock died with the builder);
    env says what happened in between."""
    mode = tmp_path / "mode"
    mode.write_text("hang")
    env = _env(
        tmp_path, _wrapper(tmp_path, f'if [ "$(cat {mode})" = hang ]; then exec sleep 300; fi\nexit 1')
    )
    first = _short(tmp_path, env)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0 and "STATE building" in out, out + err
    group = _group(tmp_path)  # the process exited at once, its builder started all the same
    deadline = time.monotonic() + 240
    while not (tmp_path / "compiles").is_file():  # the builder reached its compiler
        log = group / "build.log"
        assert time.monotonic() < deadline, (_ours(tmp_path), log.read_text() if log.is_file() else "")
        time.sleep(0.2)
    info = subprocess.run(
        [sys.executable, "-m", "opmux.kernels", "env", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert json.loads(info.stdout)["torch_bridge"]["state"] == "building", info.stdout + info.stderr
    builder = int((group / "builds.log").read_text().split()[0])
    os.kill(builder, signal.SIGKILL)
    _wait_quiet(tmp_path, 30)  # the compiler (sleep, exec'd by the wrapper) died with the builder
    assert len(list(group.glob(".torch_bridge.*.so"))) == 1  # what the killed build left
    info = subprocess.run(
        [sys.executable, "-m", "opmux.kernels", "env", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    bridge = json.loads(info.stdout)["torch_bridge"]
    assert bridge["state"] == "failed" and "without publishing" in bridge["reason"], bridge

    mode.write_text("refuse")  # the next build runs the compiler, which refuses
    second = subprocess.run(
        [
            sys.executable,
            "-c",
            _SHORT + "torch_kernels.kick(wait=True); print('AFTER', torch_kernels.status())",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert "AFTER ('failed', " in second.stdout and "CompileError" in second.stdout, (
        second.stdout + second.stderr
    )
    assert not list(group.glob(".torch_bridge.*")), list(group.iterdir())  # cleaned by the next build
    assert len((group / "builds.log").read_text().splitlines()) == 2
    assert (group / "FAILED.txt").is_file()
    _wait_quiet(tmp_path, 30)
