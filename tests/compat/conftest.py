"""Compat tests (CPU, small shapes): each test runs with fresh dispatch state and knobs.

``backend`` runs a test once per backend that can run on this machine's CPU (Triton in the
interpreter), by forcing it for every op group with ``use_backends``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any triton kernel is defined

GROUPS = ("activation", "kvcache", "layernorm", "moe", "quantization", "rope")
BACKENDS = ("aot", "jit", "triton", "torch")


@pytest.fixture(scope="session")
def shared_jit_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("opmux-cache")


@pytest.fixture(autouse=True)
def _fresh_dispatch(monkeypatch: pytest.MonkeyPatch, shared_jit_cache: Path) -> Iterator[None]:
    monkeypatch.setenv("OPMUX_CACHE_DIR", str(shared_jit_cache))
    for var in ("OPMUX_KERNEL_BACKEND", "OPMUX_FALLBACK", "OPMUX_JIT", "OPMUX_TRACE"):
        monkeypatch.delenv(var, raising=False)
    from opmux.kernels import _dispatch_state, facts

    _dispatch_state._stale()
    yield
    _dispatch_state._stale()
    facts.reset()


def _runs_on_cpu(backend: str) -> bool:
    import opmux.kernels as K

    sel = K.explain("layernorm.rmsnorm", device="cpu", dtype="float32", backend=backend)
    return sel.chosen == backend


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name: str = request.param
    if not _runs_on_cpu(name):
        pytest.skip(f"{name} cannot run on this machine's CPU")
    monkeypatch.setenv("OPMUX_FALLBACK", "error")  # a forced backend that cannot run fails the test
    import opmux.kernels as K

    K.refresh()
    with K.use_backends(";".join(f"{g}.*={name}" for g in GROUPS)):
        yield name
