"""tools/torch_bridges.py (setup.py's bridge builder): a bridge appears whole or not at all, and a
hung download or compiler is stopped with a typed error that ``build`` reports per version."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tools import torch_bridges

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))


@pytest.fixture
def fake_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fetched and unpacked torch without the download (the compiler is what is under test)."""
    wheel = tmp_path / "torch.whl"

    def fetch(version: str, dest: Path) -> Path:
        wheel.write_bytes(b"")
        return wheel

    monkeypatch.setattr(torch_bridges, "fetch_torch", fetch)
    monkeypatch.setattr(
        torch_bridges, "torch_facts", lambda w, d: (tmp_path / "torch", "2.13.0+cpu", "a" * 40, 1)
    )
    return tmp_path


def _built(
    fake_torch: Path, run: Any, monkeypatch: pytest.MonkeyPatch
) -> tuple[dict[str, Any], dict[str, Any], Path]:
    monkeypatch.setattr(torch_bridges.subprocess, "run", run)
    out = fake_torch / "out"
    built, missing = torch_bridges.build(("2.13.0+cpu",), out, fake_torch / "work", "c++", lambda line: None)
    return built, missing, out


def test_a_bridge_is_written_whole_then_renamed(fake_torch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    def compiler(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        target = Path(cmd[cmd.index("-o") + 1])
        seen.append(target.name)
        target.write_bytes(b"\x7fELF")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    built, missing, out = _built(fake_torch, compiler, monkeypatch)
    (name,) = built
    assert missing == {} and seen == [f".{name}.partial"]  # the compiler never writes the final name
    assert sorted(p.name for p in out.iterdir()) == [name]


def test_a_hung_compiler_is_a_typed_error_and_leaves_nothing(
    fake_torch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def hung(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        Path(cmd[cmd.index("-o") + 1]).write_bytes(b"half")
        raise subprocess.TimeoutExpired(cmd, kw["timeout"])

    built, missing, out = _built(fake_torch, hung, monkeypatch)
    assert built == {} and missing["2.13.0+cpu"]["why"] == "compile"
    assert "was stopped" in missing["2.13.0+cpu"]["message"]
    assert list(out.iterdir()) == []  # no partial library left behind


def test_a_hung_download_is_a_fetch_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def hung(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        if "--version" in cmd:
            return subprocess.CompletedProcess(cmd, 0, "pip", "")
        raise subprocess.TimeoutExpired(cmd, kw["timeout"])

    monkeypatch.setattr(torch_bridges.subprocess, "run", hung)
    seen: list[list[str]] = []
    monkeypatch.setattr(
        torch_bridges.subprocess, "run", lambda cmd, **kw: (seen.append(cmd), hung(cmd, **kw))[1]
    )
    with pytest.raises(torch_bridges.FetchError, match=r"pip download torch===2.13.0 ran past \d+ s"):
        torch_bridges.fetch_torch("2.13.0", tmp_path)
    assert "torch===2.13.0" in seen[-1]  # exactly that build: ==2.13.0 would also take +cpu
