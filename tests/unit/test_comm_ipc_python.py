"""ops/comm/ipc.py's host side, without GPUs: the kernels' timeout argument and the predicates."""

from __future__ import annotations

import pytest

from opmux.kernels.ops.comm import ipc


@pytest.mark.parametrize("seconds", ["0.0004", "0.001", "2.5", "300"])
def test_the_timeout_never_becomes_wait_forever(seconds: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernels read timeout_ms == 0 as 'wait forever'; OPMUX_COMM_TIMEOUT is > 0 (its parser
    refuses 0), so its milliseconds must be >= 1 and never shorter than asked."""
    monkeypatch.setenv("OPMUX_COMM_TIMEOUT", seconds)
    ms = ipc._timeout_ms()
    assert ms >= 1 and ms >= float(seconds) * 1000
