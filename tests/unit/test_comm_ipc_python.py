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


class _Cuda:
    """A stand-in for a CUDA tensor (the predicates read device, layout and size only)."""

    def __init__(self, shape: tuple[int, ...], contiguous: bool = True) -> None:
        import torch

        self.device = torch.device("cuda", 0)
        self.shape = shape
        self._contiguous = contiguous

    def is_contiguous(self) -> bool:
        return self._contiguous

    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def element_size(self) -> int:
        return 2

    def dim(self) -> int:
        return len(self.shape)


@pytest.fixture
def workspace(monkeypatch: pytest.MonkeyPatch) -> str:
    import torch

    ws = ipc.Workspace("g", 0, 2, 1 << 20, torch.device("cuda", 0), None, None, None, None)
    monkeypatch.setitem(ipc._WORKSPACES, "g", ws)
    return "g"


def test_strided_outputs_go_to_nccl(workspace: str) -> None:
    """The kernels refuse a strided out / out_q with a ValueError (comm_cuda.cu check_contiguous),
    which dispatch does not fall back from: the predicate must send such calls to NCCL."""
    x = _Cuda((4, 64))
    assert ipc.oneshot_supports(x, workspace) is None
    assert ipc.oneshot_supports(x, workspace, _Cuda((4, 64))) is None
    for why in (
        ipc.oneshot_supports(x, workspace, _Cuda((4, 64), contiguous=False)),
        ipc.twoshot_supports(x, workspace, out=_Cuda((4, 64), contiguous=False)),
        ipc.oneshot_supports(x, x, _Cuda((64,)), workspace, 1e-6, _Cuda((4, 64), contiguous=False)),
        ipc.twoshot_supports(x, x, _Cuda((64,)), workspace, out_q=_Cuda((4, 64), contiguous=False)),
    ):
        assert why is not None and "contiguous outputs" in why
    # the fused op without outputs, and a contiguous out_q: the peer-buffer kernels run it
    assert ipc.oneshot_supports(x, x, _Cuda((64,)), workspace, 1e-6) is None
    assert ipc.oneshot_supports(x, x, _Cuda((64,)), workspace, 1e-6, _Cuda((4, 64)), None) is None
