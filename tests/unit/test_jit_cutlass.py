"""CUTLASS headers for CUDA builds: discovery through find_spec (never an import), the typed
error naming the pip requirement, the include flag, and the cache key over CUTLASS headers.
Pure: no compiler runs (the compiler is replaced by a recorder)."""

from __future__ import annotations

import importlib.machinery
import sys
from pathlib import Path

import pytest

from opmux.kernels.jit.compile import build, key
from opmux.kernels.jit.compile import toolchain as tc


def _fake_cutlass(root: Path) -> Path:
    pkg = root / "cutlass_library"
    include = pkg / "source" / "include"
    (include / "cutlass").mkdir(parents=True)
    (include / "cute").mkdir(parents=True)
    (include / "cutlass" / "cutlass.h").write_text("// fake\n")
    (include / "cute" / "tensor.hpp").write_text("// fake\n")
    (pkg / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    return include


def _point_find_spec(monkeypatch: pytest.MonkeyPatch, location: Path | None) -> None:
    real = importlib.util.find_spec

    def fake(name: str, *args: object, **kwargs: object):
        if name != "cutlass_library":
            return real(name, *args, **kwargs)
        if location is None:
            return None
        spec = importlib.machinery.ModuleSpec("cutlass_library", None, is_package=True)
        spec.submodule_search_locations = [str(location)]
        return spec

    monkeypatch.setattr(tc.importlib.util, "find_spec", fake)


def test_found_through_find_spec_without_importing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    include = _fake_cutlass(tmp_path)
    _point_find_spec(monkeypatch, tmp_path / "cutlass_library")
    assert tc.cutlass_include_dir() == include
    assert tc.find_cutlass() == include
    assert "cutlass_library" not in sys.modules or sys.modules["cutlass_library"].__file__ != str(
        tmp_path / "cutlass_library" / "__init__.py"
    )


def test_missing_is_a_typed_error_naming_the_requirement(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _point_find_spec(monkeypatch, None)
    assert tc.cutlass_include_dir() is None
    with pytest.raises(tc.ToolchainNotFound) as info:
        tc.find_cutlass()
    assert "pip install nvidia-cutlass==4.2.0" in str(info.value)
    # a package without the headers counts as missing too
    (tmp_path / "cutlass_library").mkdir()
    _point_find_spec(monkeypatch, tmp_path / "cutlass_library")
    assert tc.cutlass_include_dir() is None


def test_uses_cutlass_scans_includes(tmp_path: Path) -> None:
    a = tmp_path / "a.cu"
    a.write_text('#include <tvm/ffi/function.h>\n  #  include "cutlass/cutlass.h"\n')
    b = tmp_path / "b.cu"
    b.write_text("// #include <cute/tensor.hpp> is only a comment here\n#include <cstdint>\n")
    c = tmp_path / "c.cu"
    c.write_text("#include <cute/tensor.hpp>\n")
    assert tc.uses_cutlass([a])
    assert not tc.uses_cutlass([b])
    assert tc.uses_cutlass([b, c])
    assert not tc.uses_cutlass([tmp_path / "missing.cu"])


class _Recorder:
    def __init__(self) -> None:
        self.commands: list[list[str]] = []

    def __call__(self, command: list[str], log: list[str]) -> None:
        self.commands.append(command)
        out = Path(command[command.index("-o") + 1])
        out.write_bytes(b"")


def _build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, source_text: str) -> list[str]:
    recorder = _Recorder()
    monkeypatch.setattr(build, "_run", recorder)
    src = tmp_path / "unit.cu"
    src.write_text(source_text)
    nvcc = tc.Toolchain(
        kind="nvcc", path="/bin/true", version="Cuda compilation tools, release 13.0, V13.0.88"
    )
    build.build_shared_library(
        tmp_path / "out" / "unit.so", sources=[src], device="cuda", archs=["sm_90a"], toolchain=nvcc
    )
    return recorder.commands[0]


def test_cuda_build_adds_the_include_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    include = _fake_cutlass(tmp_path / "site")
    _point_find_spec(monkeypatch, tmp_path / "site" / "cutlass_library")
    cmd = _build(monkeypatch, tmp_path, '#include "cutlass/cutlass.h"\n')
    assert f"-I{include}" in cmd
    assert "--expt-relaxed-constexpr" in cmd
    # a unit without CUTLASS still gets it when installed (the AOT unit includes units indirectly)
    cmd = _build(monkeypatch, tmp_path, "#include <cstdint>\n")
    assert f"-I{include}" in cmd


def test_cuda_build_without_cutlass(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _point_find_spec(monkeypatch, None)
    with pytest.raises(tc.ToolchainNotFound, match=r"nvidia-cutlass==4\.2\.0"):
        _build(monkeypatch, tmp_path, "#include <cute/tensor.hpp>\n")
    cmd = _build(monkeypatch, tmp_path, "#include <cstdint>\n")  # not needed: builds as before
    assert not any("cutlass" in part for part in cmd)


def test_cutlass_headers_are_keyed_by_content(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    include = _fake_cutlass(tmp_path / "site")
    _point_find_spec(monkeypatch, tmp_path / "site" / "cutlass_library")
    kernel = tmp_path / "kernel"
    (kernel / "include").mkdir(parents=True)
    (kernel / "include" / "x.h").write_text("// x\n")
    roots = {"kernel": kernel}
    deps = [str(kernel / "include" / "x.h"), str(include / "cute" / "tensor.hpp"), "/usr/include/stdio.h"]
    labels = key.label_headers(deps, roots=roots, sources=[], cwd=tmp_path)
    assert labels == ["cutlass/cute/tensor.hpp", "kernel/include/x.h"]
    before = key.hash_headers(labels, roots)
    assert before is not None
    (include / "cute" / "tensor.hpp").write_text("// changed\n")
    after = key.hash_headers(labels, roots)
    assert after is not None and after != before
    # removed nvidia-cutlass: the entry is stale (rebuild, which then names the requirement)
    _point_find_spec(monkeypatch, None)
    assert key.hash_headers(labels, roots) is None
