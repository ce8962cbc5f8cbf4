"""The library ops' C++ kernels when they cannot be had: the Python kernels keep serving.

Each case runs in a fresh interpreter (the bridge is process state): a build that cannot run
(no compiler) warns once with TorchKernelsWarning and changes no result; OPMUX_TORCH_KERNELS=off
starts no build at all; JIT off with nothing cached is the same fault as no compiler.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent(
    """
    import warnings
    import torch
    from opmux.kernels import ops, torch_kernels

    x, w = torch.randn(3, 32), torch.randn(32)
    want = ops.layernorm.rmsnorm(x, w)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = torch.ops.opmux.rmsnorm(x, w, 1e-6)  # starts the build (if enabled)
        torch_kernels.kick(wait=True)
        second = torch.ops.opmux.rmsnorm(x, w, 1e-6)
        third = torch.ops.opmux.rmsnorm(x, w, 1e-6)
    assert torch.equal(first, want) and torch.equal(second, want) and torch.equal(third, want)
    kinds = [type(c.message).__name__ for c in caught if "torch.ops.opmux" in str(c.message)]
    print("STATE", torch_kernels.status()[0], "WARNINGS", len(kinds), *kinds)
    detail = torch_kernels.status()[1]
    print("DETAIL", detail[:200], "...", detail[-300:])
    """
)


def _run(tmp_path: Path, **env: str) -> str:
    full = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "python"),
        "OPMUX_CACHE_DIR": str(tmp_path / "cache"),
        "TRITON_INTERPRET": "1",
        **env,
    }
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=full, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_no_compiler_warns_once_and_serves(tmp_path: Path) -> None:
    out = _run(tmp_path, OPMUX_TORCH_KERNELS="cpu", CXX=str(tmp_path / "no-such-compiler"))
    assert "STATE failed WARNINGS 1 TorchKernelsWarning" in out, out
    assert "no-such-compiler" in out or "CXX" in out, out


def test_a_failed_compile_is_remembered(tmp_path: Path) -> None:
    """A compiler that runs and fails (an old torch's headers, ...): the next process does not
    compile again only to warn again; prewarm's build(retry=True) would."""
    cxx = tmp_path / "failing-c++"
    cxx.write_text(
        "#!/bin/sh\ncase \"$*\" in *--version*) echo 'failing-c++ 1.0'; exit 0;; esac\n"
        "echo 'error: this compiler refuses' >&2\nexit 1\n"
    )
    cxx.chmod(0o755)
    first = _run(tmp_path, OPMUX_TORCH_KERNELS="cpu", CXX=str(cxx))
    assert "STATE failed WARNINGS 1 TorchKernelsWarning" in first and "this compiler refuses" in first, first
    assert list((tmp_path / "cache" / "torch_bridge").glob("*/FAILED.txt"))
    second = _run(tmp_path, OPMUX_TORCH_KERNELS="cpu", CXX=str(cxx))
    assert "STATE failed WARNINGS 1 TorchKernelsWarning" in second and "(cached)" in second, second


def test_disabled_builds_nothing(tmp_path: Path) -> None:
    out = _run(tmp_path, OPMUX_TORCH_KERNELS="off")
    assert "STATE off WARNINGS 0" in out, out
    assert not (tmp_path / "cache" / "torch_bridge").exists()


def test_jit_off_with_nothing_cached_is_a_fault_not_a_crash(tmp_path: Path) -> None:
    out = _run(tmp_path, OPMUX_TORCH_KERNELS="cpu", OPMUX_JIT="0")
    assert "STATE failed WARNINGS 1 TorchKernelsWarning" in out, out
    assert "OPMUX_JIT=0" in out, out


@pytest.mark.parametrize("value", ["maybe", "1"])
def test_a_bad_value_is_named(tmp_path: Path, value: str) -> None:
    full = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "OPMUX_TORCH_KERNELS": value}
    code = "from opmux.kernels import torch_kernels; torch_kernels.enabled()"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120)
    assert proc.returncode != 0
    assert "OPMUX_TORCH_KERNELS" in proc.stderr and value in proc.stderr, proc.stderr


_ENTRY_SCRIPT = textwrap.dedent(
    """
    import torch
    from opmux.kernels import ops, torch_kernels
    from opmux.kernels.explain import op_instance
    from opmux.kernels.fused_op import _ENTRY_TYPE

    g = torch.randn(3, 16)
    with torch.no_grad():
        want = ops.moe.topk_softmax(g, 4)  # binds the tvm-ffi lane, starts the bridge's build
        first = torch_kernels.status()[0]
        torch_kernels.kick(wait=True)
        ops.moe.topk_softmax(g, 4)  # its pending check swaps the bound lane for the entry, then runs it
        got = ops.moe.topk_softmax(g, 4)
    lane = op_instance("moe.topk_softmax")._lane_cpu[torch.float32][0]
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    headers = torch_kernels._python_include() is not None
    print("FIRST", first, "HEADERS", headers, "ENTRY", type(lane) is _ENTRY_TYPE, "CALLS", torch_kernels.entry_calls())
    """
)


def test_a_default_call_starts_the_bridge_and_takes_its_entry(tmp_path: Path) -> None:
    """The default call of an op whose lane allocates its outputs starts the bridge's build in the
    background (no torch.ops call, no enable()); once built, a later call swaps its bound lane for
    the entry (where the interpreter's headers let the bridge hold it), with the same results."""
    full = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "python"),
        "OPMUX_CACHE_DIR": str(tmp_path / "cache"),
        "TRITON_INTERPRET": "1",
        "OPMUX_TORCH_KERNELS": "all",
    }
    proc = subprocess.run(
        [sys.executable, "-c", _ENTRY_SCRIPT], capture_output=True, text=True, env=full, timeout=600
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # started by that call: still building, or already built when the call's own JIT compile of
    # the op's CPU unit took longer than the bridge (about 19 s on CI's 2 cores)
    assert "FIRST building" in proc.stdout or "FIRST ready" in proc.stdout, proc.stdout
    if "HEADERS True" in proc.stdout:
        assert "ENTRY True CALLS 2" in proc.stdout, proc.stdout
    else:  # built without the entry: the tvm-ffi lane stays
        assert "ENTRY False CALLS 0" in proc.stdout, proc.stdout
