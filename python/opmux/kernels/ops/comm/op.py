"""Tensor-parallel communication: all-reduce (sum), alone and fused with the residual add, RMSNorm
and per-token fp8 quantization that follow it in every decoder layer.

The group is the caller's: ``group`` is a live ``torch.distributed`` process group's name
(``ProcessGroup.group_name``, as torch's functional collectives take it), NCCL on GPUs, gloo on
the CPU. opmux adds kernels, never a launcher or a rendezvous. Every rank of the group must make
the same call (same op, shapes and dtypes) in the same order, as for any collective.

Semantics (every backend; the reference states them): ``all_reduce`` is the sum over the ranks,
rounded once to x's dtype from a float32 (float64 for float64) sum in rank order; the fused op
is exactly the chain ``x = all_reduce(x)`` -> ``layernorm.fused_add_rmsnorm(x, residual, weight,
eps)`` (``residual += x``; ``x = rmsnorm(residual)``), and the quantizing one then
``quantization.per_token_quant_fp8(x)``. NCCL and gloo add in the dtype in their own order, so
sums are not bit-exact across backends: the tolerances below state how far they may be (two
output ulps per doubling of the world, up to 8 ranks).

Backends: ``torch`` (torch.distributed's all-reduce, NCCL or gloo, then opmux's
``fused_add_rmsnorm`` / ``per_token_quant_fp8`` on the device's fastest backend) everywhere;
on CUDA, ``oneshot`` and ``twoshot`` (``ipc.py``: opmux's kernels over peer-accessible buffers
registered once per group with :func:`opmux.kernels.ops.comm.ipc.register`), each taking the
message sizes where it beats NCCL (its predicate says why not otherwise: ``explain`` shows it).

Kernel arguments: ``(out, x, group)`` for ``all_reduce`` (``[rows, H]`` views; out may be x),
``(x, residual, weight, eps, group)`` for the fused op, ``(x, residual, weight, eps, group,
out_q, out_scale)`` for the quantizing one (out_q: the fp8 output's uint8 view, out_scale: one
float32 per row); ``group`` is the resolved ``ProcessGroup``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ...spec import Requirement
from .._common import FP8_E4M3_TOLERANCE
from .._contract import FLOATS, FP8, Arg, Contract, Scalar
from .._decl import declare
from ..layernorm import _contract_items as _ln
from ..layernorm import _rms
from ..quantization.op import ref_per_token
from . import _groups, ipc

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

ALL_REDUCE_OP = "comm.all_reduce"
ADD_RMSNORM_OP = "comm.all_reduce_fused_add_rmsnorm"
ADD_RMSNORM_QUANT_OP = "comm.all_reduce_fused_add_rmsnorm_quant_fp8"

# -- the contracts (ops/_contract.py; their checks are generated into _contracts.py) ------------
GROUP = Scalar("group", "group")
#: out = sum over the ranks of x: kernel arguments (out, x, group)
ALL_REDUCE = Contract(
    "all_reduce",
    (Arg("x", "*T, H", dtypes=FLOATS), GROUP, Arg("out", "=x", like="x", out=True)),
    kernel=("out", "x", "group"),
    result="out",
)
#: in place: x = all_reduce(x); residual += x; x = rmsnorm(residual): kernel arguments
#: (x, residual, weight, eps, group)
ADD_RMSNORM = Contract(
    "add_rmsnorm",
    (_ln.X, _ln.WEIGHT, _ln.EPS, _ln.CUDA_HIDDEN, _ln.RESIDUAL, GROUP),
    kernel=("x", "residual", "weight", "eps", "group"),
)
#: the fused op, then (out, out_scale) = per_token_quant_fp8(x): kernel arguments
#: (x, residual, weight, eps, group, out, out_scale)
ADD_RMSNORM_QUANT = Contract(
    "add_rmsnorm_quant",
    (
        _ln.X,
        _ln.WEIGHT,
        _ln.EPS,
        _ln.CUDA_HIDDEN,
        _ln.RESIDUAL,
        GROUP,
        Arg("out_q", "=x", dtypes=FP8, device_of="x", out=True, kernel_dtype="uint8"),
        Arg(
            "out_scale",
            "*T, 1",
            dtypes=("float32",),
            device_of="x",
            out=True,
            layout="flat",
            note=" (one per row of x)",
        ),
    ),
    kernel=("x", "residual", "weight", "eps", "group", "out_q", "out_scale"),
    result=("out_q", "out_scale"),
)


# -- values: the group must have a backend for the tensors' device ------------------------------
def _group_device(op: str, x: Tensor, group: str) -> None:
    from .._checks import GROUPS

    _groups.check_device(op, x, GROUPS[group])


def values_all_reduce(x: Tensor, group: str, out: Tensor | None = None) -> None:
    _group_device(ALL_REDUCE_OP, x, group)


def values_add(x: Tensor, residual: Tensor, weight: Tensor, group: str, *_: Any) -> None:
    _group_device(ADD_RMSNORM_OP, x, group)


def values_add_quant(x: Tensor, residual: Tensor, weight: Tensor, group: str, *_: Any) -> None:
    _group_device(ADD_RMSNORM_QUANT_OP, x, group)


# -- the reference: gather every rank's x, sum in rank order (float32 / float64), round once ----
def _pg(op: str, group: str) -> Any:
    from .._checks import process_group

    return process_group(op, "group", group)


def _sum(op: str, x: Tensor, group: str) -> Tensor:
    parts = _groups.all_gather(op, x, _pg(op, group))
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    total = parts[0].to(acc)
    for p in parts[1:]:
        total = total + p.to(acc)
    return total.to(x.dtype)


def ref_all_reduce(x: Tensor, group: str, out: Tensor | None = None) -> Tensor:
    y = _sum(ALL_REDUCE_OP, x, group)
    return y if out is None else out.copy_(y)


def _ref_add(op: str, x: Tensor, residual: Tensor, weight: Tensor, group: str, eps: float) -> None:
    s = _sum(op, x, group)
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    residual.copy_((s.to(acc) + residual.to(acc)).to(residual.dtype))
    x.copy_(_rms.ref(residual, weight, eps, False))


def ref_add_rmsnorm(x: Tensor, residual: Tensor, weight: Tensor, group: str, eps: float = 1e-6) -> None:
    _ref_add(ADD_RMSNORM_OP, x, residual, weight, group, eps)


def ref_add_rmsnorm_quant(
    x: Tensor,
    residual: Tensor,
    weight: Tensor,
    group: str,
    eps: float = 1e-6,
    out_q: Tensor | None = None,
    out_scale: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    _ref_add(ADD_RMSNORM_QUANT_OP, x, residual, weight, group, eps)
    return ref_per_token(x, out_q=out_q, out_scale=out_scale)


# -- the torch backends (kernel arguments): torch.distributed, then opmux's own ops --------------
def torch_all_reduce(out: Tensor, x: Tensor, group: Any) -> None:
    if out.data_ptr() != x.data_ptr():
        out.copy_(x)
    _groups.all_reduce_(ALL_REDUCE_OP, out, group)


def _torch_add(op: str, x: Tensor, residual: Tensor, weight: Tensor, eps: float, group: Any) -> None:
    from ..layernorm import fused_add_rmsnorm

    _groups.all_reduce_(op, x, group)
    fused_add_rmsnorm(x, residual, weight, eps)


def torch_add_rmsnorm(x: Tensor, residual: Tensor, weight: Tensor, eps: float, group: Any) -> None:
    _torch_add(ADD_RMSNORM_OP, x, residual, weight, eps, group)


def torch_add_rmsnorm_quant(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float, group: Any, out_q: Tensor, out_scale: Tensor
) -> None:
    from ..quantization import per_token_quant_fp8

    _torch_add(ADD_RMSNORM_QUANT_OP, x, residual, weight, eps, group)
    per_token_quant_fp8(x, out_q=out_q.view(torch.float8_e4m3fn), out_scale=out_scale.view(-1, 1))


# -- the declarations ----------------------------------------------------------------------------
#: NCCL / gloo add in the dtype pairwise (their order, one rounding per step): up to about one
#: ulp per doubling of the world against the reference's single rounding (8 ranks: 3)
_TOLERANCES = (("float32", (4e-5, 4e-5)), ("float16", (4e-3, 4e-3)), ("bfloat16", (3.2e-2, 3.2e-2)))
#: the peer-buffer kernels (``ipc.py``): CUDA, sm_80 and later, a registered group (predicates)
_IPC = Requirement(devices=("cuda",), dtypes=FLOATS, sm_min=80)


def _ipc(kind: str) -> tuple[tuple[str, Any, Requirement], ...]:
    """The peer-buffer backends of one op: ``ipc.<algo>_<kind>``, each with its predicate."""
    return tuple(
        (name, getattr(ipc, f"{name}_{kind}"), replace(_IPC, predicate=f"{ipc.__name__}:{name}_supports"))
        for name in ipc.ALGORITHMS
    )


_ORDER = (("cuda", (*ipc.ALGORITHMS, "torch")),)

all_reduce = declare(
    ALL_REDUCE_OP,
    "(Tensor x, str group, Tensor(a!)? out=None) -> Tensor",
    doc="out = sum of x over the ranks of process group `group` (its name); out may be x (in place)",
    contract=ALL_REDUCE,
    values=values_all_reduce,
    reference=ref_all_reduce,
    torch=torch_all_reduce,
    native=False,
    triton=False,
    vendor=_ipc("all_reduce"),
    priority=_ORDER,
    tolerances=_TOLERANCES,
)
all_reduce_fused_add_rmsnorm = declare(
    ADD_RMSNORM_OP,
    "(Tensor(a!) x, Tensor(a!) residual, Tensor weight, str group, float eps=1e-06) -> ()",
    doc="in place: x = all_reduce(x, group); residual += x; x = rmsnorm(residual, weight, eps)",
    contract=ADD_RMSNORM,
    values=values_add,
    reference=ref_add_rmsnorm,
    torch=torch_add_rmsnorm,
    native=False,
    triton=False,
    vendor=_ipc("add_rmsnorm"),
    priority=_ORDER,
    tolerances=_TOLERANCES,
)
all_reduce_fused_add_rmsnorm_quant_fp8 = declare(
    ADD_RMSNORM_QUANT_OP,
    "(Tensor(a!) x, Tensor(a!) residual, Tensor weight, str group, float eps=1e-06, "
    "Tensor(a!)? out_q=None, Tensor(a!)? out_scale=None) -> (Tensor, Tensor)",
    doc="the fused op, then (out_q fp8, out_scale [..., 1]) = per_token_quant_fp8(x): one e4m3 row and "
    "scale per token",
    contract=ADD_RMSNORM_QUANT,
    values=values_add_quant,
    reference=ref_add_rmsnorm_quant,
    torch=torch_add_rmsnorm_quant,
    native=False,
    triton=False,
    vendor=_ipc("add_rmsnorm_quant"),
    priority=_ORDER,
    tolerances=(*_TOLERANCES, FP8_E4M3_TOLERANCE),
)
