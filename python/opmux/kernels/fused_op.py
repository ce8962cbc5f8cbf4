"""BaseFusedOp: one logical operator, many backends, one cheap dispatch.

A subclass names its spec (``op_name``) and provides ``forward_native`` (the pure-torch
reference and parity oracle) plus ``forward_<backend>`` static methods that the spec's
import targets point at. Calls go through ``__call__``: a dict lookup keyed by
(device kind, dtype) on the hot path, the full explainable selection on a miss.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Generic, TypeVar

import torch

from . import _dispatch_state, config, facts, registry, tracing
from .errors import BackendUnavailable, FallbackError
from .selector import REFERENCE, Selection, select
from .spec import OpSpec

__all__ = ["BaseFusedOp", "dtype_name", "platform_device"]

_WARNED: set[tuple[str, str, str]] = set()


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def platform_device(device: torch.device) -> tuple[str, str | None]:
    """(platform device type, arch) of a tensor's device; ROCm tensors say ``cuda``."""
    kind = device.type
    if kind != "cuda":
        return kind, None
    from . import platform

    plat = platform.detect()
    return ("hip" if plat.device_type == "hip" else "cuda"), plat.arch


def _size_split(
    key: int, threshold: int, small: Callable[..., Any], big: Callable[..., Any]
) -> Callable[..., Any]:
    """One cached callable for an op whose best backend changes with size (spec.size_priority)."""

    def split(*args: Any, **kwargs: Any) -> Any:
        return (big if args[key].numel() >= threshold else small)(*args, **kwargs)

    return split


R = TypeVar("R")


class BaseFusedOp(Generic[R]):
    """The multi-backend operator contract; see the module docstring.

    ``R`` is what the op returns, so the public functions' hot path is typed without a
    runtime ``cast``.
    """

    op_name: ClassVar[str]
    #: index of the argument whose device and dtype pick the backend
    key_arg: ClassVar[int] = 0

    def __init__(self) -> None:
        self.spec: OpSpec = registry.get(self.op_name)
        self._cpu: dict[torch.dtype, Callable[..., R]] = {}
        self._cuda: dict[torch.dtype, Callable[..., R]] = {}
        self._impls: dict[str, Callable[..., Any]] = {}
        self._failed: dict[str, str] = {}
        self._sides: dict[tuple[bool, torch.dtype], dict[bool, Callable[..., Any]]] = {}
        self._dtypes = {d for b in self.spec.backends for d in b.requires.dtypes}
        # backend -> per-call predicate target; ops with any are never fast-path cached
        self._predicates = {b.name: b.requires.predicate for b in self.spec.backends if b.requires.predicate}
        self._predicate_fns: dict[str, Callable[..., str | None]] = {}
        _dispatch_state.track(self)

    # -- the reference ---------------------------------------------------------------
    @staticmethod
    def forward_native(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    # -- dispatch --------------------------------------------------------------------
    def __call__(self, *args: Any, backend: str | Sequence[str] | None = None, **kwargs: Any) -> Any:
        if backend is None:
            x = args[self.key_arg]
            try:
                fn = self._cpu.get(x.dtype) if x.is_cpu else self._cuda.get(x.dtype) if x.is_cuda else None
            except AttributeError:  # not a tensor: the slow path says so clearly
                fn = None
            if fn is not None:
                return fn(*args, **kwargs)
        return self._dispatch(args, kwargs, backend)

    def lookup(self, x: Any) -> Callable[..., R] | None:
        """The cached backend for a tensor like ``x`` (None: take the full dispatch).

        The public functions call this first, then the backend with their positional
        arguments: no ``*args``/``**kwargs`` packing on the hot path.
        """
        try:
            return self._cpu.get(x.dtype) if x.is_cpu else self._cuda.get(x.dtype) if x.is_cuda else None
        except AttributeError:  # not a tensor: the full dispatch says so clearly
            return None

    def invalidate(self) -> None:
        self._cpu.clear()
        self._cuda.clear()
        self._sides.clear()

    def impl(self, name: str) -> Callable[..., Any]:
        """The callable of backend ``name`` (``reference`` is ``forward_native``)."""
        fn = self._impls.get(name)
        if fn is None:
            fn = (
                type(self).forward_native
                if name == REFERENCE
                else registry.resolve_target(self.spec.backend(name).target)
            )
            self._impls[name] = fn
        return fn

    def _arg_rejections(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, target in self._predicates.items():
            fn = self._predicate_fns.get(name)
            if fn is None:
                fn = self._predicate_fns[name] = registry.resolve_target(target)
            reason = fn(*args, **kwargs)
            if reason:
                out[name] = reason
        return out

    def check_key_tensor(self, x: Any) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{self.op_name}: expected a torch.Tensor, got {type(x).__name__}")
        if dtype_name(x.dtype) not in self._dtypes:
            raise TypeError(
                f"{self.op_name}: unsupported dtype {dtype_name(x.dtype)}; "
                f"supported: {', '.join(sorted(self._dtypes))}"
            )

    def select_for(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], backend: str | Sequence[str] | None = None
    ) -> Selection:
        """The full selection for these arguments (what ``explain`` shows)."""
        x = args[self.key_arg]
        self.check_key_tensor(x)
        device_type, arch = platform_device(x.device)
        forced = (
            _dispatch_state.forced(self.op_name, backend)
            if backend is not None
            else _dispatch_state.backends_for(self.op_name)
        )
        return select(
            self.spec,
            facts.detect_facts(device_type, arch),
            dtype=dtype_name(x.dtype),
            forced=forced,
            arg_rejections=self._arg_rejections(args, kwargs),
            failed=self._failed,
            numel=x.numel(),
        )

    def _apply_policy(self, sel: Selection) -> None:
        if sel.fallback_from is None:
            return
        wanted = sel.fallback_from
        reason = wanted.reason.value if wanted.reason else "rejected"
        tracing.record_fallback(self.op_name, wanted.backend, sel.chosen, reason)
        policy = config.fallback()
        if policy == "error":
            raise FallbackError(self.op_name, wanted.backend, f"{reason}: {wanted.detail}", sel.trace_str())
        if policy == "warn":
            key = (self.op_name, wanted.backend, reason)
            if key not in _WARNED:
                _WARNED.add(key)
                warnings.warn(
                    f"opmux: {self.op_name} falls back from {wanted.backend} to {sel.chosen} "
                    f"({reason}: {wanted.detail}); set OPMUX_FALLBACK=silent to hide or =error to forbid",
                    RuntimeWarning,
                    stacklevel=4,
                )

    def _dispatch(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], backend: str | Sequence[str] | None
    ) -> Any:
        while True:
            sel = self.select_for(args, kwargs, backend)
            self._apply_policy(sel)
            fn = self.impl(sel.chosen)
            try:
                result = fn(*args, **kwargs)
            except BackendUnavailable as exc:
                # e.g. a failed JIT compile: remember it, reselect, let the policy speak
                self._failed[sel.chosen] = exc.detail
                self.invalidate()
                continue
            break
        x = args[self.key_arg]
        if tracing.enabled():
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            tracing.record(
                tracing.CallRecord(
                    self.op_name,
                    sel.chosen,
                    tuple(dtype_name(t.dtype) for t in tensors),
                    tuple(tuple(t.shape) for t in tensors),
                    str(x.device),
                    sel.fallback_from.backend if sel.fallback_from else None,
                )
            )
        elif backend is None and not self._predicates:
            self._remember(x, fn)
        return result

    def _remember(self, x: torch.Tensor, fn: Callable[..., Any]) -> None:
        """Cache ``fn`` for tensors like ``x``; with a size rule, once both sides are known."""
        cache = self._cpu if x.is_cpu else self._cuda if x.is_cuda else None
        if cache is None:
            return
        threshold = self.spec.size_threshold(platform_device(x.device)[0])
        if threshold is None:
            cache[x.dtype] = fn
            return
        sides = self._sides.setdefault((x.is_cuda, x.dtype), {})
        sides[x.numel() >= threshold] = fn
        if len(sides) == 2:
            cache[x.dtype] = _size_split(self.key_arg, threshold, sides[False], sides[True])
