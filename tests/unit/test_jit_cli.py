"""``python -m opmux.kernels.jit``: prewarm and cache, through main() and once as a process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import opmux
from opmux.kernels.jit.__main__ import main
from opmux.kernels.jit.modules import JitModule

if shutil.which("g++") is None and shutil.which("c++") is None:
    pytest.skip("needs a C++ compiler", allow_module_level=True)

PYTHONPATH = str(Path(opmux.__file__).resolve().parents[1])
SOURCE = """\
#include <tvm/ffi/function.h>
int {name}_f(int x) {{ return x * {factor}; }}
TVM_FFI_DLL_EXPORT_TYPED_FUNC({name}_f, {name}_f);
"""


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OPMUX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("OPMUX_JIT", "0")  # prewarm compiles regardless: it is build time
    root = tmp_path / "kernel"
    (root / "csrc").mkdir(parents=True)
    (root / "include").mkdir()
    for name, factor in (("one", 2), ("two", 3)):
        (root / "csrc" / f"{name}.cpp").write_text(SOURCE.format(name=name, factor=factor))
    (root / "csrc" / "bad.cpp").write_text("int broken( {\n")
    return root


TABLE = {
    "one": JitModule("one", ("one.cpp",), "cpu"),
    "two": JitModule("two", ("two.cpp",), "cpu"),
    "bad": JitModule("bad", ("bad.cpp",), "cpu"),
}


def test_prewarm_then_list_prune_clear(kernel: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["prewarm", "--modules", "one", "two", "-j", "2", "--json"], table=TABLE, kernel_path=kernel)
        == 0
    )
    out, err = capsys.readouterr()
    assert sorted(r["status"] for r in json.loads(out)) == ["compiled", "compiled"]
    assert "opmux: prewarm one (cpu) ... compiled in" in err
    assert main(["prewarm", "--modules", "one"], table=TABLE, kernel_path=kernel) == 0
    assert "opmux: prewarm one (cpu) ... cached" in capsys.readouterr().err

    assert main(["cache", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["entries"]
    assert sorted(r["module"] for r in rows) == ["one", "two"]
    assert {r["status"] for r in rows} == {"ok"}

    assert main(["cache", "prune"]) == 0  # nothing is old or broken
    assert "removed 0" in capsys.readouterr().out
    assert main(["cache", "prune", "--older-than", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["removed"] == 2
    assert main(["prewarm", "--modules", "two"], table=TABLE, kernel_path=kernel) == 0
    assert main(["cache", "clear"]) == 0
    assert "removed 1" in capsys.readouterr().out
    assert main(["cache"]) == 0
    assert "(empty)" in capsys.readouterr().out


def test_prewarm_failure_and_budget(kernel: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["prewarm", "--modules", "bad"], table=TABLE, kernel_path=kernel) == 1
    err = capsys.readouterr().err
    assert "opmux: prewarm bad (cpu) ... failed" in err and "error" in err
    assert (
        main(
            ["prewarm", "--modules", "one", "two", "-j", "1", "--budget", "0.2"],
            table=TABLE,
            kernel_path=kernel,
        )
        == 0
    )
    err = capsys.readouterr().err
    assert err.count("stopped in") == 2 and "budget of 0.2 s reached" in err
    assert list((kernel.parent / "cache").glob("*/*/[!.]*")) == []  # nothing half-published


@pytest.mark.parametrize(
    "argv", [["prewarm", "--modules", "nope"], ["cach"], ["prewarm", "--mod", "one"], ["prewarm", "-j", "0"]]
)
def test_usage_errors_go_to_stderr_with_status_1(
    kernel: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv, table=TABLE, kernel_path=kernel) == 1
    out, err = capsys.readouterr()
    assert out == "" and "error" in err


def test_cli_runs_as_a_module(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": PYTHONPATH, "OPMUX_CACHE_DIR": str(tmp_path / "c")}
    proc = subprocess.run(
        [sys.executable, "-m", "opmux.kernels.jit", "cache", "list", "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"root": str(tmp_path / "c"), "entries": []}
    assert not (tmp_path / "c").exists()  # listing creates nothing
    proc = subprocess.run(
        [sys.executable, "-m", "opmux.kernels.jit", "prewarm", "--device", "gpu"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 1 and "invalid choice" in proc.stderr


def test_prewarm_children_see_scoped_settings(kernel: Path, tmp_path: Path) -> None:
    """config.scope() no longer exports to os.environ; prewarm hands its settings to the
    child processes that build, so they use the scoped cache dir."""
    from opmux.kernels import config

    scoped = tmp_path / "scoped-cache"
    with config.scope(OPMUX_CACHE_DIR=scoped):
        assert os.environ["OPMUX_CACHE_DIR"] != str(scoped)
        assert main(["prewarm", "--modules", "one"], table=TABLE, kernel_path=kernel) == 0
    assert [p.name for p in scoped.iterdir()] == ["one"]


FAKE_NVCC = """\
#!/bin/sh
if [ "$1" = "--version" ]; then
  echo "nvcc: NVIDIA (R) Cuda compiler driver"
  echo "Cuda compilation tools, release 12.8, V12.8.93"
  exit 0
fi
echo "fake nvcc: cannot compile" >&2
exit 1
"""


@pytest.fixture
def no_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """An nvcc (a stand-in that only answers --version) and no visible GPU; the environment
    for a child process that sees the same."""
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(home))
    monkeypatch.delenv("OPMUX_CUDA_ARCHS", raising=False)
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    return {"CUDA_HOME": str(home), "CUDA_VISIBLE_DEVICES": ""}


CUDA_TABLE = {
    **TABLE,
    "one_cuda": JitModule("one_cuda", ("one.cu",), "cuda"),
    "two_cuda": JitModule("two_cuda", ("two.cu",), "cuda"),
}


def test_prewarm_without_a_gpu_skips_cuda_in_one_line(
    kernel: Path, no_gpu: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["prewarm", "--modules", "one", "one_cuda", "two_cuda", "--json"]
    assert main(argv, table=CUDA_TABLE, kernel_path=kernel) == 0
    out, err = capsys.readouterr()
    assert {r["name"]: r["status"] for r in json.loads(out)} == {
        "one": "compiled",
        "one_cuda": "skipped",
        "two_cuda": "skipped",
    }
    skipped = [line for line in err.splitlines() if "skipped" in line]
    assert skipped == [
        "opmux: prewarm: 2 CUDA module(s) skipped (one_cuda, two_cuda): no CUDA device visible; "
        "set $OPMUX_CUDA_ARCHS (e.g. '9.0a') to build for a GPU that is not visible here, "
        "or pass --archs (e.g. --archs 9.0a)"
    ]
    assert "Traceback" not in err and "opmux: prewarm one (cpu) ... compiled" in err


def test_prewarm_builds_cuda_for_a_named_arch_without_a_gpu(
    kernel: Path, no_gpu: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (kernel / "csrc" / "one.cu").write_text("__global__ void k() {}\n")
    for named in (["--archs", "sm_90a"], []):
        if not named:
            monkeypatch.setenv("OPMUX_CUDA_ARCHS", "9.0a")
        argv = ["prewarm", "--modules", "one_cuda", "--json", *named]
        assert main(argv, table=CUDA_TABLE, kernel_path=kernel) == 1  # the stand-in nvcc cannot compile
        out, err = capsys.readouterr()
        assert [r["status"] for r in json.loads(out)] == ["failed"]
        assert "fake nvcc: cannot compile" in err and "skipped" not in err


def test_prewarm_without_a_gpu_as_a_process(tmp_path: Path, no_gpu: dict[str, str]) -> None:
    env = {**os.environ, **no_gpu, "PYTHONPATH": PYTHONPATH, "OPMUX_CACHE_DIR": str(tmp_path / "c")}
    proc = subprocess.run(
        [sys.executable, "-m", "opmux.kernels.jit", "prewarm", "--device", "cuda", "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)
    assert len(results) >= 6 and {r["status"] for r in results} == {"skipped"}
    assert {r["device"] for r in results} == {"cuda"}
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "CUDA module(s) skipped" in lines[0] and "--archs" in lines[0], proc.stderr
