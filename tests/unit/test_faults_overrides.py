"""Override semantics under concurrency and bad settings: ``use_backends`` is scoped to its
thread or task and leaves nothing cached, ``OPMUX_FALLBACK`` is validated at the first call,
``error`` concerns forced backends only, and the fallback warning points at the caller."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from opmux.kernels import FallbackError, config, explain, refresh, use_backends  # noqa: E402
from opmux.kernels.explain import op_instance  # noqa: E402
from opmux.kernels.ops.activation import silu_and_mul  # noqa: E402
from opmux.kernels.ops.layernorm import rmsnorm  # noqa: E402

OP = "activation.silu_and_mul"
FORCE = "activation.*=reference"


def chosen(x: torch.Tensor) -> str:
    return explain(OP, x).chosen


@pytest.fixture
def quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    """No fallback warning (a machine without a compiler falls back from jit): these tests are
    about which choice is cached, not about the fallback."""
    monkeypatch.setenv("OPMUX_FALLBACK", "silent")
    refresh()


def test_use_backends_is_scoped_to_its_thread(quiet: None) -> None:
    x = torch.randn(2, 8)
    silu_and_mul(x)
    normal = chosen(x)
    assert normal != "reference"
    inside, other = threading.Event(), threading.Event()
    seen: dict[str, str] = {}

    def forced_thread() -> None:
        with use_backends(FORCE):
            seen["a"] = chosen(x)
            silu_and_mul(x)
            inside.set()
            other.wait(10)
            seen["a_after_b"] = chosen(x)

    t = threading.Thread(target=forced_thread)
    t.start()
    assert inside.wait(10)
    seen["b"] = chosen(x)
    for _ in range(3):
        silu_and_mul(x)  # the other thread's block must not leak into these calls
    assert op_instance(OP).lookup(x) is None  # nothing cached while a block is open anywhere
    other.set()
    t.join(10)
    assert seen == {"a": "reference", "b": normal, "a_after_b": "reference"}


def test_use_backends_is_scoped_to_its_task(quiet: None) -> None:
    x = torch.randn(2, 8)

    async def forced() -> str:
        with use_backends(FORCE):
            await asyncio.sleep(0.01)
            return chosen(x)

    async def plain() -> str:
        await asyncio.sleep(0.005)
        return chosen(x)

    async def both() -> list[str]:
        return list(await asyncio.gather(forced(), plain()))

    got = asyncio.run(both())
    assert got[0] == "reference" and got[1] != "reference"


def test_nothing_cached_after_the_block(quiet: None) -> None:
    x = torch.randn(2, 8)
    op = op_instance(OP)
    silu_and_mul(x)
    before = op.lookup(x)
    assert before is not None
    with use_backends(FORCE):
        for _ in range(3):
            silu_and_mul(x)
        assert op.lookup(x) is None
    assert op.lookup(x) is None
    silu_and_mul(x)
    assert op.lookup(x) is before


def test_racing_threads_never_keep_a_forced_choice(quiet: None) -> None:
    """Another thread's calls race with blocks opening and closing: afterwards the fast path
    holds the unforced choice, every time (this was 1 in 2,000 before)."""
    x = torch.randn(2, 8)
    op = op_instance(OP)
    silu_and_mul(x)
    before = op.lookup(x)
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            silu_and_mul(x)

    threads = [threading.Thread(target=hammer) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for _ in range(300):
            with use_backends(FORCE):
                silu_and_mul(x)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    silu_and_mul(x)
    assert op.lookup(x) is before


def test_bad_fallback_policy_fails_the_first_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """``OPMUX_FALLBACK=eror`` is an error at the first op call, not at the first fallback."""
    monkeypatch.setenv("OPMUX_FALLBACK", "eror")
    with pytest.raises(ValueError, match=r"OPMUX_FALLBACK='eror' .* expected one of silent, warn, error"):
        refresh()
    from opmux.kernels import _dispatch_state

    _dispatch_state._stale()
    with pytest.raises(ValueError, match="OPMUX_FALLBACK='eror'"):
        silu_and_mul(torch.randn(2, 8), backend="torch")  # no fallback involved at all
    monkeypatch.delenv("OPMUX_FALLBACK")
    refresh()
    silu_and_mul(torch.randn(2, 8), backend="torch")


def test_error_policy_concerns_forced_backends_only(tmp_path: Path) -> None:
    x, w = torch.randn(2, 8), torch.ones(8)
    with config.scope(OPMUX_JIT="0", OPMUX_CACHE_DIR=str(tmp_path), OPMUX_FALLBACK="error"):
        with pytest.warns(RuntimeWarning, match="falls back"):
            rmsnorm(x, w)  # unforced: the preferred backend is missing, it falls back
        with pytest.raises(FallbackError, match="backend 'jit' cannot run"):
            rmsnorm(x, w, backend="jit")
        with use_backends("layernorm.rmsnorm=jit"), pytest.raises(FallbackError):
            rmsnorm(x, w)
    doc = config.KNOBS["OPMUX_FALLBACK"].doc
    assert "you forced" in doc and "always falls back" in doc


def test_fallback_warning_points_at_the_callers_line(tmp_path: Path) -> None:
    x, w = torch.randn(2, 8), torch.ones(8)
    with config.scope(OPMUX_JIT="0", OPMUX_CACHE_DIR=str(tmp_path)):
        with pytest.warns(RuntimeWarning, match="falls back") as rec:
            rmsnorm(x, w)
        assert rec[0].filename == __file__
        from opmux.kernels import fused_op

        fused_op._WARNED.clear()
        with pytest.warns(RuntimeWarning, match="falls back") as rec:
            op_instance("layernorm.rmsnorm")(x, w)
        assert rec[0].filename == __file__
