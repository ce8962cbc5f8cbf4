"""Both CLIs: ``--json`` before or after the subcommand; a broken cache or a bad setting is an
``error:`` line with status 1 (or a reported field), never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import opmux
from opmux.kernels.__main__ import main as kernels_main
from opmux.kernels.jit.__main__ import main as jit_main

PYTHONPATH = str(Path(opmux.__file__).resolve().parents[1])


@pytest.mark.parametrize(
    "argv",
    [
        ["list", "--json"],
        ["--json", "list"],
        ["env", "--json"],
        ["--json", "env"],
        ["explain", "layernorm.rmsnorm", "--device", "cpu", "--json"],
        ["explain", "--json", "layernorm.rmsnorm", "--device", "cpu"],
    ],
)
def test_kernels_cli_json_anywhere(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert kernels_main(argv) == 0
    json.loads(capsys.readouterr().out)


def test_kernels_cli_without_json_is_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert kernels_main(["list"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("op ") and not out.startswith("{")


@pytest.mark.parametrize("argv", [["cache", "--json"], ["--json", "cache"], ["cache", "list", "--json"]])
def test_jit_cli_json_anywhere(
    argv: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPMUX_CACHE_DIR", str(tmp_path / "cache"))
    assert jit_main(argv) == 0
    assert json.loads(capsys.readouterr().out)["root"] == str(tmp_path / "cache")


def test_env_reports_an_unusable_cache(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    afile = tmp_path / "file"
    afile.write_text("")
    monkeypatch.setenv("OPMUX_CACHE_DIR", str(afile))
    assert kernels_main(["env", "--json"]) == 0
    cache = json.loads(capsys.readouterr().out)["jit_cache"]
    assert cache["usable"] is False and cache["path"] == str(afile)
    assert "not a directory" in cache["problem"]


@pytest.mark.parametrize(
    ("module", "argv"),
    [
        ("opmux.kernels.jit", ["cache", "list", "--json"]),
        ("opmux.kernels.jit", ["cache", "prune"]),
        ("opmux.kernels.jit", ["prewarm", "--modules", "activation_cpu", "--json"]),
    ],
)
def test_broken_cache_is_an_error_line_not_a_traceback(module: str, argv: list[str], tmp_path: Path) -> None:
    afile = tmp_path / "file"
    afile.write_text("")
    env = {**os.environ, "PYTHONPATH": PYTHONPATH, "OPMUX_CACHE_DIR": str(afile)}
    proc = subprocess.run(
        [sys.executable, "-m", module, *argv], capture_output=True, text=True, env=env, timeout=120
    )
    assert "Traceback" not in proc.stderr and 'File "' not in proc.stderr, proc.stderr
    assert proc.returncode == 1
    assert "cannot be used" in proc.stderr + proc.stdout and str(afile) in proc.stderr + proc.stdout


def test_bad_setting_is_an_error_line(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": PYTHONPATH, "OPMUX_JIT_LOCK_TIMEOUT": "soon"}
    proc = subprocess.run(
        [sys.executable, "-m", "opmux.kernels.jit", "prewarm", "--modules", "activation_cpu"],
        capture_output=True,
        text=True,
        env={**env, "OPMUX_CACHE_DIR": str(tmp_path / "cache")},
        timeout=120,
    )
    assert "Traceback" not in proc.stderr and 'File "' not in proc.stderr and proc.returncode == 1, (
        proc.stderr
    )
    assert proc.stderr.startswith("error: OPMUX_JIT_LOCK_TIMEOUT='soon'")
