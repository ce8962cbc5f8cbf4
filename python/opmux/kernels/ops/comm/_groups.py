"""The collectives the ``comm`` ops' torch backends and references run, bounded in time.

torch.distributed over a group the caller created (NCCL on GPUs, gloo on the CPU): opmux adds
kernels, never a launcher or a rendezvous. A CPU collective is waited for at most
``OPMUX_COMM_TIMEOUT`` seconds (``Work.wait(timeout)``), so a rank that died mid-call makes the
others raise :class:`~opmux.kernels.errors.CommError` instead of hanging; a CUDA one is enqueued
on the stream without a host wait (CUDA-graph safe) and bounded by NCCL's own watchdog
(``TORCH_NCCL_ASYNC_ERROR_HANDLING``, the group's timeout).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ... import config
from ...errors import CommError

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

__all__ = ["all_gather", "all_reduce_", "check_device", "describe"]


def describe(pg: Any) -> tuple[str, int, int]:
    """(name, this rank, world size) of a group, for messages."""
    dist = torch.distributed
    return str(pg.group_name), dist.get_rank(pg), dist.get_world_size(pg)


def check_device(op: str, t: Tensor, pg: Any) -> None:
    """The group must have a backend for ``t``'s device (an NCCL-only group cannot reduce CPU
    tensors): a ValueError naming the group's backends otherwise."""
    try:
        pg._get_backend(t.device)
    except RuntimeError:
        name = describe(pg)[0]
        have = getattr(pg, "_device_types", None) or []
        types = ", ".join(sorted(str(d).rpartition(".")[2].lower() for d in have)) or "none"
        raise ValueError(
            f"{op}: group {name!r} has no backend for {t.device.type} tensors (it has: {types}); create "
            "it with one for that device, e.g. init_process_group(backend='cpu:gloo,cuda:nccl')"
        ) from None


def _run(op: str, pg: Any, start: Any) -> None:
    """Start a collective (``start()`` -> Work) and wait for it within the timeout on the CPU."""
    try:
        work = start()
        if work is not None:
            timeout = config.comm_timeout()
            if work.wait(timedelta(seconds=timeout)) is False:
                raise RuntimeError(f"no reply within {timeout:g} s")
    except RuntimeError as err:
        name, rank, world = describe(pg)
        first = (str(err).strip().splitlines() or ["(no message)"])[0]
        raise CommError(op, name, rank, world, first) from err


def _async(t: Tensor) -> bool:
    """CPU collectives are waited for on the host (bounded); CUDA ones only enqueued."""
    return t.device.type == "cpu"


def all_reduce_(op: str, t: Tensor, pg: Any) -> None:
    """Sum ``t`` over the group, in place (a dense copy for a strided ``t``)."""
    dist = torch.distributed
    buf = t if t.is_contiguous() else t.contiguous()
    _run(op, pg, lambda: dist.all_reduce(buf, group=pg, async_op=_async(buf)))
    if buf is not t:
        t.copy_(buf)


def all_gather(op: str, t: Tensor, pg: Any) -> list[Tensor]:
    """Every rank's ``t``, in rank order."""
    dist = torch.distributed
    src = t.contiguous()
    parts = [torch.empty_like(src) for _ in range(dist.get_world_size(pg))]
    _run(op, pg, lambda: dist.all_gather(parts, src, group=pg, async_op=_async(src)))
    return parts
