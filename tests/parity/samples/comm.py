"""Parity cases of the comm ops, over a one-rank group of this process.

A one-rank group makes the all-reduce the identity, so these cases check what every backend
shares with one rank: the contract (shapes, strides, dtypes, outputs, the group's name), the
fused add / RMSNorm / fp8 quant after the reduction, and the errors. The sums over several ranks
are tests/unit/test_comm_groups.py (gloo with 2 and 4 processes; NCCL and the peer-buffer
kernels with 2, 4 and 8 GPUs where a machine has them).
"""

from __future__ import annotations

import torch

from opmux.kernels.ops._common import Sample

Invalid = list[tuple[str, tuple[object, ...], dict[str, object], type[Exception], str]]


def group(device: str) -> str:
    """This process's default group, initialised as a one-rank group if there is none yet; on a
    GPU registered for the peer-buffer kernels too (one rank: their barriers are no-ops, so the
    parity cells of ``oneshot`` / ``twoshot`` check their arithmetic and bounds on one GPU)."""
    from opmux.kernels.ops.comm import ipc

    dist = torch.distributed
    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    assert dist.group.WORLD is not None
    name = str(dist.group.WORLD.group_name)
    if torch.device(device).type == "cuda" and ipc.registered(name) is None:
        ipc.register(name, 1 << 20)
    return name


#: the peer-buffer kernels take contiguous x: a strided one goes to NCCL (their predicate)
_DENSE_ONLY = (("oneshot", "strided x: NCCL runs it"), ("twoshot", "strided x: NCCL runs it"))


def _t(shape: tuple[int, ...], device: str, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(device=device, dtype=dtype)


# -- all_reduce --------------------------------------------------------------------------------
def all_reduce_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    g = group(device)
    wide = _t((4, 96), device, dtype, 3)
    return [
        Sample("rows", (_t((5, 64), device, dtype, 0), g)),
        Sample("batched", (_t((2, 3, 33), device, dtype, 1), g)),
        Sample("one-row", (_t((1, 4096), device, dtype, 2), g)),
        Sample("strided-rows", (wide[:, :64], g), skip=_DENSE_ONLY),
        Sample(
            "caller-out",
            (_t((3, 40), device, dtype, 5), g),
            {"out": torch.zeros(3, 40, dtype=dtype, device=device)},
        ),
        # (in place, out=x: tests/unit/test_comm_groups.py; the harness fills a caller's out with NaN)
        Sample("no-rows", (_t((0, 16), device, dtype, 6), g)),
    ]


def all_reduce_invalid(device: str) -> Invalid:
    g = group(device)
    x = _t((2, 8), device, torch.float32, 0)
    return [
        ("group-not-a-name", (x, 7), {}, TypeError, "must be a process group's name"),
        ("unknown-group", (x, "no-such-group"), {}, ValueError, "names no live process group; live groups:"),
        ("int-x", (x.to(torch.int32), g), {}, TypeError, "dtype int32"),
        ("scalar-x", (x[0, 0], g), {}, ValueError, "x has shape"),
        ("out-shape", (x, g), {"out": torch.empty(2, 9, device=device)}, ValueError, "out has shape"),
        (
            "out-dtype",
            (x, g),
            {"out": torch.empty(2, 8, dtype=torch.float16, device=device)},
            TypeError,
            "out",
        ),
    ]


# -- all_reduce_fused_add_rmsnorm (and its fp8 variant: the same cases) --------------------------
def _norm_args(t: int, h: int, device: str, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    return (
        _t((t, h), device, dtype, seed),
        _t((t, h), device, dtype, seed + 1),
        _t((h,), device, dtype, seed + 2),
    )


def all_reduce_fused_add_rmsnorm_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    g = group(device)
    x, res, w = _norm_args(4, 128, device, dtype, 0)
    wide = _t((3, 200), device, dtype, 9)
    _, res2, w2 = _norm_args(3, 96, device, dtype, 10)
    xb, resb, wb = _norm_args(6, 64, device, dtype, 20)
    return [
        Sample("rows", (x, res, w, g)),
        Sample("eps", (*_norm_args(2, 64, device, dtype, 3), g), {"eps": 1e-5}),
        Sample("one-row", (*_norm_args(1, 4096, device, dtype, 6), g)),
        Sample("strided-x", (wide[:, :96], res2, w2, g), skip=_DENSE_ONLY),
        Sample("batched", (xb.view(2, 3, 64), resb.view(2, 3, 64), wb, g)),
    ]


def all_reduce_fused_add_rmsnorm_invalid(device: str) -> Invalid:
    g = group(device)
    x, res, w = _norm_args(2, 16, device, torch.float32, 0)
    return [
        ("unknown-group", (x, res, w, "nope"), {}, ValueError, "names no live process group"),
        ("weight-shape", (x, res, w[:8], g), {}, ValueError, "weight has shape"),
        ("residual-shape", (x, res[:1], w, g), {}, ValueError, "residual has shape"),
        ("residual-dtype", (x, res.half(), w, g), {}, TypeError, "residual"),
        ("eps-zero", (x, res, w, g), {"eps": 0.0}, ValueError, "eps"),
        ("group-not-a-name", (x, res, w, None), {}, TypeError, "must be a process group's name"),
    ]


def all_reduce_fused_add_rmsnorm_quant_fp8_samples(device: str, dtype: torch.dtype) -> list[Sample]:
    g = group(device)
    x, res, w = _norm_args(3, 64, device, dtype, 30)
    q = torch.empty(3, 64, dtype=torch.float8_e4m3fn, device=device)
    s = torch.empty(3, 1, dtype=torch.float32, device=device)
    return [
        *all_reduce_fused_add_rmsnorm_samples(device, dtype),
        Sample("caller-outputs", (x, res, w, g), {"out_q": q, "out_scale": s}),
        Sample("zero-rows-min-scale", (torch.zeros_like(x), torch.zeros_like(res), w, g)),
    ]


def all_reduce_fused_add_rmsnorm_quant_fp8_invalid(device: str) -> Invalid:
    g = group(device)
    x, res, w = _norm_args(2, 16, device, torch.float32, 0)
    return [
        *all_reduce_fused_add_rmsnorm_invalid(device),
        ("out-q-dtype", (x, res, w, g), {"out_q": torch.empty(2, 16, device=device)}, TypeError, "out_q"),
        (
            "out-scale-shape",
            (x, res, w, g),
            {"out_scale": torch.empty(3, 1, device=device)},
            ValueError,
            "out_scale",
        ),
    ]
