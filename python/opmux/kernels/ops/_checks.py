"""Argument checks shared by backends that index memory themselves (Triton, C++).

Each raises TypeError (wrong type or dtype) or ValueError (shape, device, layout) with
the op name, the argument and what was expected, so a bad call never reaches a kernel.
"""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def tensor(op: str, name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def float_dtype(op: str, name: str, t: torch.Tensor) -> None:
    if t.dtype not in FLOAT_DTYPES:
        valid = ", ".join(str(d).removeprefix("torch.") for d in FLOAT_DTYPES)
        raise TypeError(f"{op}: {name} has dtype {str(t.dtype).removeprefix('torch.')}; supported: {valid}")


def same_dtype(op: str, ref_name: str, ref: torch.Tensor, **others: torch.Tensor) -> None:
    for name, t in others.items():
        if t.dtype != ref.dtype:
            raise TypeError(f"{op}: {name} has dtype {t.dtype}, expected {ref.dtype} like {ref_name}")


def same_device(op: str, ref_name: str, ref: torch.Tensor, **others: torch.Tensor) -> None:
    for name, t in others.items():
        if t.device != ref.device:
            raise ValueError(
                f"{op}: {name} is on {t.device} but {ref_name} is on {ref.device}; move them to one device"
            )


def rows(op: str, name: str, t: torch.Tensor, hidden: int) -> torch.Tensor:
    """``t`` as a [rows, hidden] view with a contiguous last dim, never a copy."""
    if t.dim() == 2 and t.shape[1] == hidden and (t.stride(1) == 1 or hidden <= 1):
        return t  # the serving case: no view to build (a view costs about a microsecond)
    if t.dim() < 1 or t.shape[-1] != hidden:
        raise ValueError(f"{op}: {name} has shape {tuple(t.shape)}, expected [..., {hidden}]")
    if hidden > 1 and t.stride(-1) != 1:
        raise ValueError(
            f"{op}: {name} has a non-contiguous last dimension (stride {t.stride(-1)}); "
            "kernels need stride 1 there: pass x.contiguous()"
        )
    try:
        return t.view(-1, hidden)
    except RuntimeError:
        raise ValueError(
            f"{op}: {name} with shape {tuple(t.shape)} and strides {t.stride()} cannot be viewed as "
            f"[rows, {hidden}]; pass a tensor whose leading dims are contiguous (x.contiguous())"
        ) from None


def exact_dtype(op: str, name: str, t: torch.Tensor, dtype: torch.dtype) -> None:
    """``t`` has exactly ``dtype`` (index tensors, scales)."""
    if t.dtype != dtype:
        want = str(dtype).removeprefix("torch.")
        raise TypeError(f"{op}: {name} has dtype {str(t.dtype).removeprefix('torch.')}, expected {want}")


def positive_int(op: str, name: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(f"{op}: {name} must be a positive int, got {v!r}")
    return v


def heads(op: str, name: str, t: torch.Tensor, tokens: int, num_heads: int, head_dim: int) -> torch.Tensor:
    """``t`` as a [tokens, num_heads, head_dim] view with a dense last dim, never a copy (for
    per-head ops: q / k of [..., H, D] or [..., H * D]; token and head strides stay free)."""
    if head_dim > 1 and t.stride(-1) != 1:
        raise ValueError(
            f"{op}: {name} has a non-contiguous last dimension (stride {t.stride(-1)}); "
            "kernels need stride 1 there: pass x.contiguous()"
        )
    try:
        return t.view(tokens, num_heads, head_dim)
    except RuntimeError:
        raise ValueError(
            f"{op}: {name} with shape {tuple(t.shape)} and strides {t.stride()} cannot be viewed as "
            f"[{tokens}, {num_heads}, {head_dim}]; pass a tensor whose leading dims are contiguous"
        ) from None


def _is_fake(t: torch.Tensor) -> bool:
    # fake tensors (torch.compile, opcheck) have no data; asking for it warns
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor) or t.is_meta


def distinct(op: str, a_name: str, a: torch.Tensor, b_name: str, b: torch.Tensor) -> None:
    """Two tensors updated in place by one op must not start at the same data (skipped for
    fake tensors while tracing, which have no data)."""
    if not a.numel() or _is_fake(a) or _is_fake(b):
        return
    try:
        pa, pb = a.data_ptr(), b.data_ptr()
    except RuntimeError:  # FunctionalTensor while tracing
        return
    if pa == 0 or pb == 0:  # fake/meta tensors report no storage
        return
    if pa == pb:
        raise ValueError(f"{op}: {a_name} and {b_name} must be different tensors (both are updated in place)")
