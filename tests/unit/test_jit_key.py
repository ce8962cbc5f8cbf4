"""The cache key changes for every input that matters, and for nothing else."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from opmux.kernels.jit.compile import key as k


def make(root: Path, **over: object) -> k.SourceKey:
    args: dict[str, object] = dict(
        name="m",
        device="cpu",
        kernel_path=root,
        sources=["csrc/a.cpp"],
        flags=["-O3"],
        toolchain="cxx:g++ 12",
        host_toolchain="",
        tvm_ffi="0.1.15",
        archs=(),
        ptx_arch=None,
        environ={},
    )
    args.update(over)
    return k.SourceKey.compute(**args)  # type: ignore[arg-type]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "k" / "csrc").mkdir(parents=True)
    (tmp_path / "k" / "csrc" / "a.cpp").write_text("int a;\n")
    return tmp_path / "k"


@pytest.mark.parametrize(
    "change",
    [
        {"name": "n"},
        {"device": "cuda"},
        {"flags": ["-O2"]},
        {"toolchain": "cxx:g++ 13"},
        {"host_toolchain": "cxx:g++ 12"},
        {"tvm_ffi": "0.1.16"},
        {"archs": ("sm_90a",)},
        {"ptx_arch": "compute_90"},
        {"environ": {"CPATH": "/x"}},
        {"environ": {"NVCC_APPEND_FLAGS": "-G"}},
    ],
)
def test_each_input_changes_the_key(root: Path, change: dict[str, object]) -> None:
    assert make(root).digest != make(root, **change).digest


def test_source_content_changes_the_key(root: Path) -> None:
    before = make(root).digest
    (root / "csrc" / "a.cpp").write_text("int b;\n")
    assert make(root).digest != before


def test_abi_and_every_declared_env_var_are_covered(root: Path) -> None:
    names = {f.name for f in fields(k.SourceKey)}
    assert {"abi", "cache_format", "env", "tvm_ffi", "archs", "flags"} <= names
    assert [v for v, _ in make(root).env] == list(k.ENV_VARS)


def test_location_and_unrelated_env_do_not_change_the_key(root: Path, tmp_path: Path) -> None:
    import shutil

    moved = tmp_path / "elsewhere" / "kernel"
    shutil.copytree(root, moved)
    assert make(root).digest == make(moved).digest
    assert make(root).digest == make(root, environ={"HOME": "/x", "OPMUX_FOO": "1"}).digest
    assert make(root).digest == make(root, environ={"CPATH": ""}).digest


def test_full_key_covers_header_label_and_content() -> None:
    base = k.full_key("s", [("kernel/include/a.h", "1")])
    assert base != k.full_key("s", [("kernel/include/a.h", "2")])
    assert base != k.full_key("s", [("kernel/include/b.h", "1")])
    assert base != k.full_key("t", [("kernel/include/a.h", "1")])
    assert base != k.full_key("s", [])
    two = [("kernel/include/a.h", "1"), ("tvm_ffi/x.h", "2")]
    assert k.full_key("s", two) == k.full_key("s", list(reversed(two)))


def test_parse_depfile_handles_continuations_and_escapes() -> None:
    text = "out.so: /k/csrc/a.cpp \\\n /k/include/a\\ b.h \\\n /k/include/c$$.h\n"
    assert k.parse_depfile(text) == ["/k/csrc/a.cpp", "/k/include/a b.h", "/k/include/c$.h"]


def test_label_headers_keeps_known_roots_only(tmp_path: Path) -> None:
    kernel, tvm = tmp_path / "kernel", tmp_path / "tvm" / "include"
    for p in (kernel / "csrc" / "a.cpp", kernel / "include" / "x.h", tvm / "tvm" / "y.h"):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("")
    deps = [
        str(kernel / "csrc" / "a.cpp"),
        "../kernel/include/x.h",
        str(tvm / "tvm" / "y.h"),
        "/usr/include/stdio.h",
    ]
    labels = k.label_headers(
        deps,
        roots={"kernel": kernel, "tvm_ffi": tvm},
        sources=[kernel / "csrc" / "a.cpp"],
        cwd=tmp_path / "kernel",
    )
    assert labels == ["kernel/include/x.h", "tvm_ffi/tvm/y.h"]
    assert k.hash_headers(labels, {"kernel": kernel, "tvm_ffi": tvm}) is not None
    assert k.hash_headers(["kernel/include/gone.h"], {"kernel": kernel}) is None
    assert k.hash_headers(["other/x.h"], {"kernel": kernel}) is None
