"""Unit tests run on the source tree: each test gets its own JIT cache and fresh knobs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

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
