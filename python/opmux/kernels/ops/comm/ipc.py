"""The ``oneshot`` and ``twoshot`` backends of the ``comm`` ops: opmux's all-reduce kernels over
peer-accessible buffers (``jit/csrc/comm_cuda.cu``), registered once per group.

:func:`register` (a collective: every rank of the group calls it once, before the first call
that should use these backends) allocates one buffer per rank with torch's symmetric memory
(``torch.distributed._symmetric_memory``: the peers' buffers mapped into every rank's address
space; NVLink multicast stays off: ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` is set), zeroes it and
keeps the peers' base addresses. A call then launches one kernel: no host synchronisation, no
allocation, the addresses passed by value, so it can be captured in a CUDA graph and replayed.

* one-shot: every rank copies its x into its buffer, waits for its peers (a flag per block), and
  reads and sums every peer's x: one barrier, ``world`` reads of the whole message per rank;
* two-shot: reduce-scatter (each rank sums its share from every peer) then all-gather: two
  barriers, each rank reads about twice the message: the larger messages.

Where each runs (the predicates, whose reason ``explain`` prints): CUDA tensors on the device the
group's workspace was registered on, contiguous rows, at most the workspace's bytes; one-shot up
to the per-world threshold below, two-shot beyond it; larger messages and unregistered groups go
to NCCL (``torch``). The thresholds are vLLM's custom all-reduce's (``custom_all_reduce.cuh``:
one stage for any size at 2 ranks, below 512 KiB at 4, below 256 KiB at 6 and 8; 8 MiB at most),
not yet measured here: the multi-GPU machine that would measure them was not lent (issue #31).

What every rank must do alike (the kernels pair block b of a call with block b of every peer):
the same calls in the same order, with the same shapes, dtypes and layouts (a strided x on one
rank sends that rank to NCCL while its peers wait in a peer-buffer kernel: they trap after
``OPMUX_COMM_TIMEOUT``); registration itself is all ranks or none (:func:`register`). A call's
blocks (at most 64) must become resident together on every rank: kernels on other streams that
hold every SM for longer than the timeout (compute / communication overlap on a small GPU or MIG
slice) would starve them.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ... import config
from ...errors import BackendUnavailable

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

__all__ = ["ALGORITHMS", "Workspace", "register", "registered", "unregister"]

#: the backends, in the order dispatch tries them on CUDA
ALGORITHMS = ("oneshot", "twoshot")
#: the world sizes the kernels take (1: one GPU, the barriers are no-ops: how a one-GPU machine
#: runs these kernels' arithmetic and bounds; ``comm_layout.h``'s kMaxWorld)
WORLDS = tuple(range(1, 9))


def oneshot_max_bytes(world: int) -> int:
    """One-shot up to this many bytes (vLLM's thresholds; see the module docstring)."""
    return 8 << 20 if world <= 2 else 512 << 10 if world <= 4 else 256 << 10


#: a workspace's default message capacity (vLLM's custom all-reduce maximum)
DEFAULT_MAX_BYTES = 8 << 20
#: the buffer's layout, as ``jit/include/opmux/comm_layout.h`` states it (kFlagsBytes, kCapAlign,
#: kCounters; tests/unit/test_comm_native.py compares them): the flags, then two halves of
#: [in | result] regions of ``cap`` bytes each (calls alternate halves), and the int32 counters
#: each rank's kernels keep for themselves (epochs, calls)
FLAG_BYTES = 4096
REGION_ALIGN = 4096
COUNTERS = 256
#: the fused kernels' longest row (elements): a block owns a row (its norm threads stride over
#: it; the bound is the one their tests cover, not a hard limit of the code)
MAX_HIDDEN = 16384
_REGISTER = "comm.ipc.register"


@dataclass(frozen=True)
class Workspace:
    """One rank's registration of a group: its buffer, the peers' addresses, its counters."""

    group: str
    rank: int
    world: int
    #: bytes of one data region: the largest message
    cap: int
    device: Any
    buffer: Any
    #: the peers' buffer base addresses, rank order (a CPU int64 tensor, read at launch)
    ptrs: Any
    counters: Any
    handle: Any
    #: the ``ProcessGroup`` registered (a new group reusing the name is not this one)
    pg: Any = None


_WORKSPACES: dict[str, Workspace] = {}
#: workspaces replaced or unregistered: kept alive for the life of the process, since a captured
#: CUDA graph holds their addresses (a replay would otherwise write freed memory)
_RETIRED: list[Workspace] = []


def register(group: str, max_bytes: int = DEFAULT_MAX_BYTES) -> Workspace:
    """Register process group ``group`` (its name) for the peer-buffer kernels, messages up to
    ``max_bytes``. A collective: every rank calls it, each with its GPU as the current device.
    Registering a group again replaces its workspace (all ranks, the same ``max_bytes``); the old
    one stays allocated (graphs captured with it may still be replayed).

    Every rank loads the kernels first (AOT library or JIT) and the ranks agree on it over the
    group: if any rank cannot, none registers and each raises ``BackendUnavailable`` naming the
    ranks (one rank on NCCL while its peers wait in a peer-buffer kernel would hang them all)."""
    from .._checks import process_group

    pg = process_group(_REGISTER, "group", group)
    dist = torch.distributed
    world, rank = dist.get_world_size(pg), dist.get_rank(pg)
    if world not in WORLDS:
        raise ValueError(
            f"{_REGISTER}: group {group!r} has {world} ranks; the kernels take 1 to {WORLDS[-1]}"
        )
    if type(max_bytes) is not int or max_bytes <= 0:
        raise ValueError(f"{_REGISTER}: max_bytes must be a positive int, got {max_bytes!r}")
    if not torch.cuda.is_available():
        raise ValueError(f"{_REGISTER}: the peer-buffer kernels need CUDA GPUs; this process sees none")
    cap = -(-max_bytes // REGION_ALIGN) * REGION_ALIGN
    device = torch.device("cuda", torch.cuda.current_device())
    _agree_on_kernels(pg, group, rank, world, device)
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    from torch.distributed import _symmetric_memory as symm

    buffer = symm.empty(FLAG_BYTES + 4 * cap, dtype=torch.uint8, device=device)
    buffer.zero_()
    torch.cuda.synchronize(device)  # zeroed before any peer can see the buffer (next line)
    handle = symm.rendezvous(buffer, pg)
    ptrs = torch.tensor([int(p) for p in handle.buffer_ptrs], dtype=torch.int64)
    counters = torch.zeros(COUNTERS, dtype=torch.int32, device=device)
    ws = Workspace(group, rank, world, cap, device, buffer, ptrs, counters, handle, pg)
    unregister(group)
    _WORKSPACES[group] = ws
    return ws


def _agree_on_kernels(pg: Any, group: str, rank: int, world: int, device: Any) -> None:
    """Load the kernels on this rank, then learn over the group which ranks could not."""
    try:
        library()
        why = ""
    except BackendUnavailable as exc:
        why = str(exc)
    failed = torch.tensor([0 if not why else 1 << rank], dtype=torch.int64, device=device)
    torch.distributed.all_reduce(failed, group=pg)  # a bit per rank that failed
    bits = int(failed.item())
    if bits:
        ranks = [r for r in range(world) if bits >> r & 1]
        detail = f" (here: {why})" if why else ""
        raise BackendUnavailable(
            ALGORITHMS[0],
            f"group {group!r}: ranks {ranks} cannot load the peer-buffer kernels{detail}; no rank "
            "registered (its calls go to NCCL on every rank)",
        )


def registered(group: str) -> Workspace | None:
    """The workspace of ``group`` (its name), or None."""
    return _WORKSPACES.get(group)


def unregister(group: str) -> None:
    """Forget ``group``'s workspace (its calls go to NCCL on every rank that unregisters: all of
    them should). The buffer stays allocated: a captured CUDA graph may still hold it."""
    ws = _WORKSPACES.pop(group, None)
    if ws is not None:
        _RETIRED.append(ws)


# -- the predicates: the op's public arguments -> the reason not to run, or None -------------------
def refusal(algo: str, x: Any, group: Any, outputs: tuple[Any, ...] = (), rows: bool = False) -> str | None:
    """Why backend ``algo`` cannot run a call on ``x`` over ``group``, writing the caller's
    ``outputs`` (``out`` / ``out_q``: the kernels refuse strided ones), (None: it can)."""
    if getattr(x, "device", None) is None or x.device.type != "cuda":
        return "the peer-buffer kernels run on CUDA tensors"
    ws = _WORKSPACES.get(group) if type(group) is str else None
    if ws is None:
        return (
            f"group {group!r} has no opmux workspace: call "
            f"opmux.kernels.ops.comm.ipc.register({group!r}) once on every rank (else NCCL runs it)"
        )
    from .._checks import is_live_group

    if ws.pg is not None and not is_live_group(ws.pg, ws.group):
        return f"group {group!r}'s workspace belongs to a group that no longer has that name: register again"
    if x.device != ws.device:
        return f"x is on {x.device}; the group's workspace on {ws.device}"
    if not x.is_contiguous():
        return "the peer-buffer kernels take a contiguous x (a strided one goes to NCCL)"
    if any(not t.is_contiguous() for t in outputs):
        return "the peer-buffer kernels write contiguous outputs (a strided out / out_q goes to NCCL)"
    nbytes = x.numel() * x.element_size()
    if nbytes > ws.cap:
        return f"a {nbytes}-byte message exceeds the workspace's {ws.cap} bytes (register a larger max_bytes)"
    if rows and x.dim() and x.shape[-1] > MAX_HIDDEN:
        return f"rows of {x.shape[-1]} elements; the fused kernels take at most {MAX_HIDDEN}"
    limit = oneshot_max_bytes(ws.world)
    if algo == "oneshot" and nbytes > limit:
        return f"{nbytes} bytes > {limit} at {ws.world} ranks: two-shot reads less from there"
    return None


def oneshot_supports(x: Any, *args: Any, **kwargs: Any) -> str | None:
    return refusal("oneshot", x, _group(args, kwargs), _outputs(args, kwargs), _rows(args, kwargs))


def twoshot_supports(x: Any, *args: Any, **kwargs: Any) -> str | None:
    return refusal("twoshot", x, _group(args, kwargs), _outputs(args, kwargs), _rows(args, kwargs))


def _rows(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """A fused op (x, residual, weight, group, ...): its kernel owns whole rows."""
    return "residual" in kwargs or (len(args) > 0 and type(args[0]) is not str)


def _outputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """The caller's output tensors among the public arguments after x: all_reduce's ``out``
    (x, group, out), the quantizing op's ``out_q`` (x, residual, weight, group, eps, out_q,
    out_scale; out_scale is read as a flat vector, any layout the contract takes)."""
    i = next((k for k, a in enumerate(args) if type(a) is str), None)
    if i == 0:  # all_reduce
        out = kwargs.get("out", args[1] if len(args) > 1 else None)
    else:  # the fused ops: out_q two places after the group (eps between)
        out = kwargs.get("out_q", args[i + 2] if i is not None and len(args) > i + 2 else None)
    return (out,) if hasattr(out, "is_contiguous") else ()


def _group(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The group name among the public arguments after x: all_reduce (x, group, out), the fused
    ops (x, residual, weight, group, ...)."""
    if "group" in kwargs:
        return kwargs["group"]
    return next((a for a in args if type(a) is str), None)


# -- the kernels ------------------------------------------------------------------------------------
_FUNCTIONS = ("all_reduce", "all_reduce_add_rmsnorm")


@functools.cache
def library() -> dict[str, Callable[..., Any]]:
    """``comm_cuda``'s functions by short name, loaded once per process (``BackendUnavailable``
    when neither the AOT library nor a JIT build has them: dispatch falls back to NCCL)."""
    from .._native import unit_functions

    found = unit_functions("comm_cuda", tuple(f"comm_{f}_cuda" for f in _FUNCTIONS), ALGORITHMS[0])
    return {f: found[f"comm_{f}_cuda"] for f in _FUNCTIONS}


_ALGO = {"oneshot": 1, "twoshot": 2}
_EMPTY: dict[Any, tuple[Any, Any]] = {}


def _ws(group: Any) -> Workspace:
    ws = _WORKSPACES.get(str(group.group_name))
    if ws is None:  # unregistered between the predicate and the call
        raise BackendUnavailable("oneshot", f"group {group.group_name!r} has no opmux workspace")
    return ws


def _timeout_ms() -> int:
    """OPMUX_COMM_TIMEOUT in whole milliseconds, rounded up: the kernels read 0 as "wait forever",
    which a positive timeout under a millisecond must not become."""
    return max(1, math.ceil(config.comm_timeout() * 1000))


def _empties(device: Any) -> tuple[Any, Any]:
    e = _EMPTY.get(device)
    if e is None:
        e = _EMPTY[device] = (
            torch.empty(0, dtype=torch.uint8, device=device),
            torch.empty(0, dtype=torch.float32, device=device),
        )
    return e


def _all_reduce(algo: str) -> Callable[..., None]:
    def run(out: Tensor, x: Tensor, group: Any) -> None:
        ws = _ws(group)
        library()["all_reduce"](
            out, x, ws.ptrs, ws.counters, ws.rank, ws.world, ws.cap, _ALGO[algo], _timeout_ms()
        )

    run.__name__ = run.__qualname__ = f"{algo}_all_reduce"
    return run


def _add_rmsnorm(algo: str, quant: bool) -> Callable[..., None]:
    def run(
        x: Tensor,
        residual: Tensor,
        weight: Tensor,
        eps: float,
        group: Any,
        out_q: Tensor | None = None,
        out_scale: Tensor | None = None,
    ) -> None:
        ws = _ws(group)
        q, s = (out_q, out_scale) if quant else _empties(x.device)
        library()["all_reduce_add_rmsnorm"](
            x, residual, weight, eps, q, s, ws.ptrs, ws.counters, ws.rank, ws.world, ws.cap,
            _ALGO[algo], _timeout_ms(),
        )  # fmt: skip

    run.__name__ = run.__qualname__ = f"{algo}_add_rmsnorm{'_quant' if quant else ''}"
    return run


oneshot_all_reduce = _all_reduce("oneshot")
twoshot_all_reduce = _all_reduce("twoshot")
oneshot_add_rmsnorm = _add_rmsnorm("oneshot", False)
twoshot_add_rmsnorm = _add_rmsnorm("twoshot", False)
oneshot_add_rmsnorm_quant = _add_rmsnorm("oneshot", True)
twoshot_add_rmsnorm_quant = _add_rmsnorm("twoshot", True)
