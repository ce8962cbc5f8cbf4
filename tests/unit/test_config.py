"""The OPMUX_* registry: read at call time, validated at read, scoped overrides restore
everything, and docs/env.md is exactly what describe() generates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from opmux.kernels import config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts with no OPMUX_* variables and no overrides."""
    for name in list(os.environ):
        if name.startswith("OPMUX_"):
            monkeypatch.delenv(name)
    with config.scope():
        yield


def test_defaults() -> None:
    assert config.kernel_backend() == ""
    assert config.fallback() == "warn"
    assert config.jit() is True
    assert config.cache_dir() == Path.home() / ".cache" / "opmux" / "jit"
    assert config.trace() is False
    assert config.device() is None
    assert config.cuda_archs() is None
    assert config.jit_verbose() is False


def test_read_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    assert config.fallback() == "warn"
    monkeypatch.setenv("OPMUX_FALLBACK", "error")
    assert config.fallback() == "error"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("0", False), ("1", True), ("true", True), ("FALSE", False), (" on ", True), ("off", False), ("", True)],
)
def test_bool_spellings(monkeypatch: pytest.MonkeyPatch, raw: str, expected: bool) -> None:
    monkeypatch.setenv("OPMUX_JIT", raw)
    assert config.jit() is expected


@pytest.mark.parametrize(
    ("name", "raw", "valid"),
    [
        ("OPMUX_JIT", "maybe", "1, true, on, yes, 0, false, off, no"),
        ("OPMUX_TRACE", "2", "1, true"),
        ("OPMUX_JIT_VERBOSE", "verbose", "0, false"),
        ("OPMUX_FALLBACK", "loud", "silent, warn, error"),
        ("OPMUX_DEVICE", "gpu", "cpu, cuda, hip, xpu, npu, mps"),
        ("OPMUX_CUDA_ARCHS", "sm_9x", "sm_80"),
        ("OPMUX_CUDA_ARCHS", "90", "X.Y[a|f]"),
        ("OPMUX_CUDA_ARCHS", ",;", "sm_80"),
        ("OPMUX_KERNEL_BACKEND", "layernorm.rmsnorm", "group.op=backend"),
    ],
)
def test_bad_value_names_variable_value_and_choices(
    monkeypatch: pytest.MonkeyPatch, name: str, raw: str, valid: str
) -> None:
    monkeypatch.setenv(name, raw)
    with pytest.raises(ValueError, match=f"{name}={raw!r}") as info:
        config.get(name)
    assert valid in str(info.value)


def test_unknown_knob_lists_valid() -> None:
    with pytest.raises(ValueError, match=r"OPMUX_FALLBAK.*OPMUX_FALLBACK"):
        config.get("OPMUX_FALLBAK")
    with pytest.raises(ValueError, match="OPMUX_NOPE"), config.scope(OPMUX_NOPE=1):
        pass


def test_normalised_values(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OPMUX_FALLBACK", " Error ")
    monkeypatch.setenv("OPMUX_DEVICE", "CUDA")
    monkeypatch.setenv("OPMUX_CUDA_ARCHS", "8.0; sm_90a 9.0a,10.0f")
    monkeypatch.setenv("OPMUX_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("OPMUX_KERNEL_BACKEND", " layernorm.*=jit ")
    assert config.fallback() == "error"
    assert config.device() == "cuda"
    assert config.cuda_archs() == "sm_80,sm_90a,sm_100f"
    assert config.cache_dir() == tmp_path
    assert config.kernel_backend() == "layernorm.*=jit"


def test_explicit_env_mapping_ignores_overrides() -> None:
    with config.scope(OPMUX_DEVICE="cuda"):
        assert config.get("OPMUX_DEVICE") == "cuda"
        assert config.get("OPMUX_DEVICE", env={}) is None
        assert config.get("OPMUX_DEVICE", env={"OPMUX_DEVICE": "hip"}) == "hip"


def test_scope_overrides_and_restores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPMUX_FALLBACK", "silent")
    with config.scope(OPMUX_FALLBACK="error", OPMUX_JIT=False, OPMUX_TRACE="on"):
        assert (config.fallback(), config.jit(), config.trace()) == ("error", False, True)
        with config.scope(OPMUX_FALLBACK=None):  # None: the default, ignoring the environment
            assert config.fallback() == "warn"
        assert config.fallback() == "error"
    assert (config.fallback(), config.jit(), config.trace()) == ("silent", True, False)


def test_scope_restores_environ() -> None:
    os.environ["OPMUX_TRACE"] = "1"
    with config.scope():
        os.environ["OPMUX_TRACE"] = "0"
        os.environ["OPMUX_DEVICE"] = "cpu"
        assert config.device() == "cpu"
    assert os.environ["OPMUX_TRACE"] == "1"
    assert "OPMUX_DEVICE" not in os.environ
    del os.environ["OPMUX_TRACE"]


def test_scope_restores_on_error() -> None:
    with pytest.raises(RuntimeError), config.scope(OPMUX_FALLBACK="error"):
        os.environ["OPMUX_JIT"] = "0"
        raise RuntimeError
    assert config.fallback() == "warn"
    assert "OPMUX_JIT" not in os.environ


def test_scope_validates_on_entry() -> None:
    with pytest.raises(ValueError, match="OPMUX_FALLBACK='loud'"), config.scope(OPMUX_FALLBACK="loud"):
        pass
    with pytest.raises(ValueError, match="OPMUX_JIT: bad override 3"), config.scope(OPMUX_JIT=3):
        pass
    assert config.fallback() == "warn"


def test_scope_accepts_path(tmp_path: Path) -> None:
    with config.scope(OPMUX_CACHE_DIR=tmp_path):
        assert config.cache_dir() == tmp_path


def test_defaults_are_valid_and_written_once() -> None:
    for knob in config.KNOBS.values():
        knob.default_value()  # parses through the same validator as the environment
    package = ROOT / "python/opmux"
    written = sum(p.read_text().count('"~/.cache/opmux') for p in package.rglob("*.py"))
    assert written == 1  # _env owns it; config and the JIT publisher read it from there


def test_describe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPMUX_DEVICE", "gpu")
    monkeypatch.delenv("OPMUX_CACHE_DIR", raising=False)
    with config.scope(OPMUX_FALLBACK="error"):
        rows = {row["name"]: row for row in config.describe()}
    assert set(rows) == set(config.KNOBS)
    assert all(name.startswith("OPMUX_") for name in rows)
    assert {"name", "type", "default", "current", "doc"} <= set(rows["OPMUX_JIT"])
    assert rows["OPMUX_FALLBACK"]["current"] == "error"
    assert rows["OPMUX_FALLBACK"]["source"] == "override"
    assert rows["OPMUX_DEVICE"]["current"] is None
    assert "OPMUX_DEVICE='gpu'" in rows["OPMUX_DEVICE"]["error"]
    assert rows["OPMUX_CACHE_DIR"]["current"] == str(Path.home() / ".cache/opmux/jit")
    json.dumps(rows)  # JSON-ready for the CLI


def test_docs_env_md_is_generated() -> None:
    committed = (ROOT / "docs/env.md").read_text(encoding="utf-8")
    assert committed == config.render_env_md(), (
        "docs/env.md is stale; regenerate: "
        "PYTHONPATH=python python -c 'from opmux.kernels import config; config.write_env_md()'"
    )
    for name in config.KNOBS:
        assert f"`{name}`" in committed


def test_docs_independent_of_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    before = config.render_env_md()
    monkeypatch.setenv("OPMUX_FALLBACK", "error")
    assert config.render_env_md() == before


def test_every_opmux_variable_in_source_is_registered() -> None:
    """No OPMUX_* name used anywhere in the package escapes the registry (and its docs)."""
    import re

    used: set[str] = set()
    for path in (ROOT / "python/opmux").rglob("*.py"):
        used |= set(re.findall(r"\bOPMUX_[A-Z0-9_]+\b", path.read_text()))
    assert used <= set(config.KNOBS), sorted(used - set(config.KNOBS))


def test_write_env_md(tmp_path: Path) -> None:
    target = config.write_env_md(tmp_path / "env.md")
    assert target.read_text(encoding="utf-8") == config.render_env_md()


def test_regenerate_command_in_a_subprocess(tmp_path: Path) -> None:
    """The command the docs header gives works as written, with a clean interpreter."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    code = "from opmux.kernels import config; config.write_env_md()"
    (tmp_path / "docs").mkdir()
    subprocess.run([sys.executable, "-W", "error", "-c", code], cwd=tmp_path, env=env, check=True)
    assert (tmp_path / "docs/env.md").read_text(encoding="utf-8") == config.render_env_md()


def test_scope_does_not_write_environ_and_the_jit_layer_sees_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """One owner (opmux.kernels._env): config and jit.compile read the same table, so a scope
    reaches the JIT loader without exporting anything to os.environ."""
    from opmux.kernels import _env
    from opmux.kernels.jit.compile import load, publish, toolchain

    monkeypatch.delenv("OPMUX_JIT", raising=False)
    monkeypatch.delenv("OPMUX_CUDA_ARCHS", raising=False)
    before = dict(os.environ)
    with config.scope(OPMUX_JIT=False, OPMUX_CACHE_DIR="/tmp/opmux-scoped", OPMUX_CUDA_ARCHS="9.0a"):
        assert dict(os.environ) == before
        assert load.jit_enabled() is False
        assert publish.cache_root(create=False) == Path("/tmp/opmux-scoped")
        assert toolchain.local_cuda_archs() == ["sm_90a"]
        assert _env.child_environ()["OPMUX_JIT"] == "0"
    assert dict(os.environ) == before
    assert config.KNOBS is _env.KNOBS
