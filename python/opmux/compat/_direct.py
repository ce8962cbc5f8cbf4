"""Run an op's chosen backend kernel on buffers the caller allocated (no result copies).

The op's own contract (``check``, ``values``) validates the inputs and returns the kernel
arguments; the compat function swaps the outputs ``check`` allocated for the caller's buffers
(after checking their shape, dtype, device and strides itself) and calls the kernel the
selector chose for this call, the same choice the public function makes (``OPMUX_KERNEL_BACKEND``,
``use_backends`` and the fallback policy included).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from opmux.kernels.ops._torch import torch

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["check", "kernel", "need"]

_KERNELS: dict[tuple[str, str, Any], Callable[..., Any]] = {}
_GEN: list[int] = [-1]


def _op(name: str) -> Any:
    from opmux.kernels.explain import op_instance

    return op_instance(name)


def check(name: str, *args: Any) -> tuple[tuple[Any, ...], Any]:
    """The op's contract on ``args``: its kernel arguments and result (outputs it allocated)."""
    decl = _op(name).decl
    kargs, result = decl.check(name, *args)
    if decl.values is not None:
        decl.values(*args)
    return kargs, result


def kernel(name: str, key: Tensor) -> Callable[..., Any]:
    """The kernel of the backend the selector picks for ``name`` on a call keyed by ``key``
    (the reference has no kernel form: then the op's ``torch`` backend runs)."""
    from opmux.kernels import _dispatch_state
    from opmux.kernels.errors import BackendUnavailable
    from opmux.kernels.selector import REFERENCE

    gen = _dispatch_state.generation()
    if _GEN[0] != gen:
        _KERNELS.clear()
        _GEN[0] = gen
    device = "cuda" if key.is_cuda else "cpu"
    cache_key = (name, device, key.dtype)
    fn = _KERNELS.get(cache_key)
    if fn is not None:
        return fn
    op = _op(name)
    args = (None,) * op.key_arg + (key,)
    sel = op.select_for(args, {})
    op._apply_policy(sel)
    backend = "torch" if sel.chosen == REFERENCE else sel.chosen
    try:
        fn = op.kernel(backend, device)
    except BackendUnavailable:
        fn = op.kernel("torch", device)
    if _dispatch_state.cacheable(gen):
        _KERNELS[cache_key] = fn
    return fn  # type: ignore[no-any-return]


def need(cond: bool, message: str, exc: type[Exception] = ValueError) -> None:
    if not cond:
        raise exc(message)


def out_like(op: str, name: str, buf: Any, shape: tuple[int, ...], dtype: Any, device: Any) -> Tensor:
    """``buf`` checked as an output: a tensor of ``shape`` and ``dtype`` on ``device``."""
    need(
        isinstance(buf, torch.Tensor),
        f"{op}: {name} must be a torch.Tensor, got {type(buf).__name__}",
        TypeError,
    )
    need(buf.dtype == dtype, f"{op}: {name} has dtype {buf.dtype}, expected {dtype}", TypeError)
    need(
        tuple(buf.shape) == tuple(shape),
        f"{op}: {name} has shape {tuple(buf.shape)}, expected {tuple(shape)}",
    )
    need(buf.device == device, f"{op}: {name} is on {buf.device}, expected {device}")
    return buf  # type: ignore[no-any-return]
