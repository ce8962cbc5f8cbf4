"""The wheel's prebuilt torch bridges: used only on an exact key match, else today's cache build.

A shipped bridge compiled against another torch build, C++ ABI, Python or tvm-ffi would crash the
process that loads it, so these tests put files under every near-miss name into the shipped
directory (garbage bytes: loading one would fail loudly) and check that none is ever opened,
that the exact name is loaded with no build started, and what ``env`` says either way.
(The real thing, a wheel's bridge serving a fresh process on an empty cache with no compiler,
is tools/bridge_check.py, run on the installed wheel by the release rehearsal.)
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest

from opmux.kernels import _bridge_build, _bridge_key, torch_kernels

HERE = _bridge_key.current()


def _near_misses() -> list[_bridge_key.Key]:
    """The key of this process with one field changed, for every field."""
    other = {
        "torch": HERE.torch.split("+")[0] + "+cu999",
        "git": "0" * 40,
        "cxx11_abi": 1 - HERE.cxx11_abi,
        "python": "cpython-399-x86_64-linux-gnu",
        "tvm_ffi": "0.2" if HERE.tvm_ffi != "0.2" else "0.3",  # another ABI series
    }
    return [dataclasses.replace(HERE, **{field: value}) for field, value in other.items()]


@pytest.fixture
def shipped_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(_bridge_key, "SHIPPED_DIR", tmp_path / "bridges")
    (tmp_path / "bridges").mkdir()
    return tmp_path / "bridges"


def _ship(directory: Path, key: _bridge_key.Key) -> Path:
    path = directory / key.filename()
    path.write_bytes(b"not a library: loading this would fail")
    return path


def test_every_field_of_the_key_is_in_the_name():
    names = {k.filename() for k in _near_misses()}
    assert len(names) == 5 and HERE.filename() not in names
    assert HERE.filename() == _bridge_key.current().filename()  # stable
    for name in [*names, HERE.filename()]:
        assert name.startswith("torch_bridge_") and name.endswith(".so")
        assert name.removesuffix(".so").isidentifier()  # (check-wheel-contents W004)


def test_local_versions_are_different_torch_builds():
    cpu = dataclasses.replace(HERE, torch="2.14.1+cpu").filename()
    assert cpu != dataclasses.replace(HERE, torch="2.14.1+cu130").filename()
    assert cpu != dataclasses.replace(HERE, torch="2.14.1").filename()
    # spelled alike once made an identifier, told apart by the digest of the exact values
    assert cpu != dataclasses.replace(HERE, torch="2.14.1.cpu").filename()


def test_only_the_exact_name_is_shipped(shipped_dir):
    for key in _near_misses():
        _ship(shipped_dir, key)
    assert _bridge_key.shipped() is None
    exact = _ship(shipped_dir, HERE)
    assert _bridge_key.shipped() == exact
    assert len(_bridge_key.shipped_names()) == 6


@pytest.fixture
def fresh_bridge(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """torch_kernels as in a process that has not asked for the bridge yet; its loader and the
    cache build recorded instead of run."""
    calls: dict[str, list[Any]] = {"load": [], "obtain": []}
    for name, value in (
        ("_state", "off"),
        ("_detail", ""),
        ("_source", ""),
        ("_module", None),
        ("_entry", None),
        ("_thread", None),
        ("_devices", None),
        ("_pending", []),
        ("_lock", threading.Lock()),
        ("_decided", threading.Event()),
    ):
        monkeypatch.setattr(torch_kernels, name, value)
    monkeypatch.setenv(torch_kernels.ENV, "cpu")

    def load(path: Path, *, entries: bool | None = None) -> tuple[Any, Any]:
        calls["load"].append((path, entries))
        # a module whose functions do nothing (teardown's invalidation calls into it)
        return collections.defaultdict(lambda: lambda *args: None), None

    def obtain(decided: threading.Event | None = None) -> Path:
        calls["obtain"].append(decided)
        raise RuntimeError("the cache build was asked for")

    monkeypatch.setattr(torch_kernels, "_load", load)
    monkeypatch.setattr(_bridge_build, "obtain", obtain)
    return calls


def test_a_matching_shipped_bridge_loads_at_once_without_a_build(shipped_dir, fresh_bridge):
    for key in _near_misses():
        _ship(shipped_dir, key)
    exact = _ship(shipped_dir, HERE)
    assert torch_kernels.kick() is True  # on the calling thread: ready when kick returns
    assert torch_kernels.status() == ("ready", "") and torch_kernels.source() == "shipped"
    assert fresh_bridge == {"load": [(exact, True)], "obtain": []}
    assert torch_kernels._thread is None and torch_kernels._decided.is_set()


def test_no_match_falls_back_to_the_cache_build(shipped_dir, fresh_bridge):
    for key in _near_misses():
        _ship(shipped_dir, key)
    torch_kernels.kick(wait=True)
    assert fresh_bridge["load"] == []  # no near miss was ever opened
    assert len(fresh_bridge["obtain"]) == 1
    assert torch_kernels.status() == ("failed", "RuntimeError: the cache build was asked for")
    assert torch_kernels.source() == ""


def test_a_shipped_bridge_that_does_not_load_fails_without_a_build(shipped_dir, fresh_bridge, monkeypatch):
    exact = _ship(shipped_dir, HERE)

    def broken(path: Path, *, entries: bool | None = None) -> tuple[Any, Any]:
        raise OSError(f"{path}: invalid ELF header")

    monkeypatch.setattr(torch_kernels, "_load", broken)
    assert torch_kernels.kick() is False
    state, detail = torch_kernels.status()
    assert state == "failed" and f"the shipped {exact.name} did not load" in detail
    assert fresh_bridge["obtain"] == []


def test_enable_does_not_build_over_a_broken_shipped_bridge(shipped_dir, fresh_bridge, monkeypatch):
    """enable() treats a shipped bridge that does not load as kick() does: a broken install,
    named, with nothing built over it."""
    exact = _ship(shipped_dir, HERE)

    def broken(path: Path, *, entries: bool | None = None) -> tuple[Any, Any]:
        raise OSError(f"{path}: invalid ELF header")

    built: list[bool] = []
    monkeypatch.setattr(torch_kernels, "_load", broken)
    monkeypatch.setattr(torch_kernels, "build", lambda: built.append(True))
    with pytest.raises(RuntimeError, match=rf"the shipped {exact.name} did not load.*reinstall opmux"):
        torch_kernels.enable()
    assert built == [] and fresh_bridge["obtain"] == [] and torch_kernels.source() == ""
    assert torch_kernels.kick() is False  # and kick agrees afterwards
    with pytest.raises(RuntimeError, match="did not load"):
        torch_kernels.enable()  # however often it is asked


def test_a_tvm_ffi_patch_release_keeps_the_shipped_bridge():
    """The key holds tvm-ffi's ABI series (the range the wheel requires), not its exact version."""
    assert _bridge_key.tvm_ffi_abi("0.1.15.post2") == _bridge_key.tvm_ffi_abi("0.1.16") == "0.1"
    assert _bridge_key.tvm_ffi_abi("0.2.0") == "0.2"
    assert HERE.tvm_ffi.count(".") == 1


def test_env_says_shipped_and_why(shipped_dir, monkeypatch):
    monkeypatch.setenv(torch_kernels.ENV, "all")
    exact = _ship(shipped_dir, HERE)
    info = _bridge_build.state()
    assert info["state"] == "shipped" and info["path"] == str(exact) and info["entries"] is True
    assert f"torch {HERE.torch}" in info["reason"] and "nothing compiled" in info["reason"]


def test_env_says_why_a_shipped_bridge_is_not_used(shipped_dir, monkeypatch, tmp_path):
    monkeypatch.setenv(torch_kernels.ENV, "all")
    monkeypatch.setenv("OPMUX_CACHE_DIR", str(tmp_path / "cache"))
    miss = _ship(shipped_dir, _near_misses()[0])
    info = _bridge_build.state()
    assert info["state"] == "not built", info
    assert info["reason"].startswith(f"the wheel ships no bridge for torch {HERE.torch} ")
    assert miss.name in info["reason"] and "starts its one builder" in info["reason"]


def test_env_in_a_source_tree(monkeypatch, tmp_path):
    monkeypatch.setattr(_bridge_key, "SHIPPED_DIR", tmp_path / "absent")
    monkeypatch.setenv(torch_kernels.ENV, "all")
    monkeypatch.setenv("OPMUX_CACHE_DIR", str(tmp_path / "cache"))
    assert _bridge_build.state()["reason"].startswith("this install ships no bridge")


def test_disabled_wins(shipped_dir, monkeypatch):
    _ship(shipped_dir, HERE)
    monkeypatch.setenv(torch_kernels.ENV, "off")
    assert _bridge_build.state()["state"] == "disabled"
