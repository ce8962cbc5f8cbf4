"""Compat tests (CPU, small shapes): each test runs with fresh dispatch state and knobs.

``backend`` runs a test once per backend that can run on this machine's CPU (Triton in the
interpreter), by forcing it for every op group with ``use_backends``. ``run_engine_compat``
runs tools/engine_compat.py on a folder in a subprocess, as a user would.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any triton kernel is defined
# the library ops keep their Python kernels here: no background build of the C++ ones races a
# test (tests/parity/test_torch_kernels.py builds and checks those)
os.environ.setdefault("OPMUX_TORCH_KERNELS", "off")

ROOT = Path(__file__).resolve().parents[2]
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


@pytest.fixture
def run_engine_compat() -> Callable[[Path, Path], subprocess.CompletedProcess[str]]:
    """-> ``run(folder, cwd)``: tools/engine_compat.py ``--device cpu folder -- -q`` in a
    subprocess (opmux from this checkout), its output captured as text."""

    def run(folder: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
        cmd = [
            sys.executable,
            str(ROOT / "tools" / "engine_compat.py"),
            "--device",
            "cpu",
            str(folder),
            "--",
            "-q",
        ]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=300)

    return run
