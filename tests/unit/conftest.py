"""Unit tests run on the source tree: each test gets its own JIT cache and fresh knobs."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any triton kernel is defined
# the library ops keep their Python kernels here: no background build of the C++ ones races a
# test (tests/parity/test_torch_kernels.py builds and checks those)
os.environ.setdefault("OPMUX_TORCH_KERNELS", "off")


@pytest.fixture(scope="session")
def shared_jit_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("opmux-cache")


@pytest.fixture(autouse=True)
def _fresh_dispatch(monkeypatch: pytest.MonkeyPatch, shared_jit_cache: Path) -> Iterator[None]:
    # one cache per session for op tests (compiles once); JIT cache tests set their own
    monkeypatch.setenv("OPMUX_CACHE_DIR", str(shared_jit_cache))
    for var in ("OPMUX_KERNEL_BACKEND", "OPMUX_FALLBACK", "OPMUX_JIT", "OPMUX_TRACE"):
        monkeypatch.delenv(var, raising=False)
    from opmux.kernels import _dispatch_state, facts, fused_op, tracing

    _dispatch_state._stale()
    fused_op._WARNED.clear()
    tracing.reset()
    yield
    tracing._State.enabled = None
    _dispatch_state._stale()
    facts.reset()


@pytest.fixture
def tuned_tables(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No user folder of tuned tables (a developer's OPMUX_TUNED_CONFIG_DIR unset); the tables
    reread before and after the test."""
    from opmux.kernels import tuned

    monkeypatch.delenv("OPMUX_TUNED_CONFIG_DIR", raising=False)
    tuned.refresh()
    yield
    tuned.refresh()


@pytest.fixture
def tuned_user_dir(tmp_path: Path, tuned_tables: None) -> Iterator[Path]:
    """``tmp_path`` as the user folder of tuned tables (``config.scope`` rereads them)."""
    from opmux.kernels import _env

    with _env.scope(OPMUX_TUNED_CONFIG_DIR=str(tmp_path)):
        yield tmp_path


@pytest.fixture
def nvcc_unit(tmp_path: Path) -> Callable[[str], Any]:
    """``nvcc_unit("comm_cuda")``: the CUDA unit ``jit/csrc/<name>.cu`` compiled for sm_90a and
    sm_80 (nvcc, no GPU needed) and loaded; skips without OPMUX_TEST_NVCC=1 or without nvcc."""
    if os.environ.get("OPMUX_TEST_NVCC") != "1":
        pytest.skip("set OPMUX_TEST_NVCC=1: nvcc builds the CUDA unit (a minute or more)")
    from opmux.kernels.jit import KERNEL_PATH
    from opmux.kernels.jit.compile import build, toolchain

    try:
        toolchain.find_nvcc()
    except toolchain.ToolchainNotFound as exc:
        pytest.skip(str(exc))

    def compile_unit(name: str) -> Any:
        src = Path(KERNEL_PATH) / "csrc" / f"{name}.cu"
        out = tmp_path / f"{name}.so"
        build.build_shared_library(
            out,
            sources=[src],
            device="cuda",
            archs=["sm_90a", "sm_80"],
            include_dirs=[Path(KERNEL_PATH) / "include", src.parent],
        )
        import tvm_ffi

        return tvm_ffi.load_module(str(out))

    return compile_unit
