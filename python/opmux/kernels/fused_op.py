"""FusedOp: one declared operator (``ops/_decl.py``), many backends, one cheap dispatch.

Everything per op that runs per call is generated from its declaration, ahead of time, into
its group's ``_entrypoints.py`` (``ops/_entry_codegen.py``; ``python tools/gen_contracts.py``
writes it): the bound function of each backend (the argument contract, then the kernel), the
public function with its hot path and the torch library ops' Python kernels and fakes. A FusedOp
makes them on its runtime tables when the op is first used. The hot path is one dict lookup by
device kind and dtype (two for an op with size classes); a miss runs the full explainable
selection, applies the fallback policy, binds the chosen backend's kernel and caches it. A
forced ``backend=`` is cached the same way, by its value.

The contract is the same on every backend, the reference included, and runs once per call:
``check`` (types, dtypes, shapes, strides, scalars), ``values`` (tensor contents, not under
fake tensors), then the generic part of the signature: an input that requires grad while
grad mode is on is a TypeError (the ops are inference-only), the version counter of every
written tensor is bumped in grad mode, and a written tensor may not overlap another argument
except as the very same view of a read one (``rmsnorm(x, w, out=x)``).

``enable_pdl`` (a reserved keyword of every public function, like ``backend``; not part of the
contract nor of the library schema) reaches only the native CUDA kernels, as their trailing
``bool`` argument: ``None`` means "when the GPU has it" (compute capability 9 or newer, read per
device index when the backend is bound, never per call). Every other kernel ignores it.
"""

from __future__ import annotations

import importlib
import types
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import torch

from . import _dispatch_state, _warn, facts, measured, registry, torch_kernels, tracing, tuned
from .errors import BackendUnavailable, CallRefused, FallbackError
from .ops import _entry_codegen
from .ops._decl import Decl, Param
from .ops._entry_runtime import ENTRY
from .ops._native import NativeLoader
from .selector import REFERENCE, Selection, select

# a refreshed tuned table may change a measured op's choice where none spoke before: drop the cached ones
tuned.on_refresh(_dispatch_state._bump)

#: select_for's memo bound (cleared when full): shapes classes x dtypes x forced sets per op
_MAX_SELECTIONS = 1024

__all__ = ["FusedOp", "dtype_name", "instance", "platform_device", "with_contract"]

_WARNED: set[tuple[str, str, str]] = set()
#: op name -> its live op (each FusedOp registers itself here)
_INSTANCES: dict[str, FusedOp[Any]] = {}
#: [True] while the library ops' C++ kernels (torch_kernels) are wanted but not registered yet:
#: the Python kernels then start their build and register them once it is done
_BRIDGE_PENDING = [True]
_bridge_ids = iter(range(1 << 30))
#: [True] until the bridge's entries for the default calls of ops whose lanes allocate their outputs
#: (``Decl.outputs``) are in place: their public functions then start its build and, once it is
#: built, swap their bound lanes for the entries (``FusedOp._bind_entries``)
_ENTRY_PENDING = [True]
#: the ops whose default calls bound a lane the entry could serve, before the bridge was ready
_ENTRY_WAITING: list[FusedOp[Any]] = []
#: what ``torch_kernels.lane_entry`` returns (a C function taking the lane's arguments)
_ENTRY_TYPE = ENTRY


def _entry_poll() -> None:
    """The public functions' per-call check while the entries are pending (see _ENTRY_PENDING):
    start the bridge's build; once it is built, give every waiting op its entries. Unlike
    _bridge_poll this registers nothing with the dispatcher (the entries need no registration)."""
    if not torch_kernels.enabled():
        _ENTRY_PENDING[0] = False
        return
    torch_kernels.kick()
    state = torch_kernels.status()[0]
    if state == "building":
        return
    _ENTRY_PENDING[0] = False
    if state == "ready":
        while _ENTRY_WAITING:
            _ENTRY_WAITING.pop()._bind_entries()
    else:
        torch_kernels.warn_failed()


def _bridge_poll() -> None:
    if not torch_kernels.enabled():
        _BRIDGE_PENDING[0] = False
        return
    torch_kernels.kick()
    if torch_kernels.poll():
        _BRIDGE_PENDING[0] = False


#: every torch library op of opmux (kept alive for the process: dropping it unregisters them)
_LIB = torch.library.Library("opmux", "FRAGMENT")  # type: ignore[no-untyped-call]


def generated(decl: Decl, module: Any = None) -> Any:
    """The module with ``decl``'s generated functions (``ops/_entry_codegen.py``): its group's
    ``_entrypoints`` (the package of its reference), or ``module`` (an op declared at run time:
    tests, benchmarks). Refused when they were generated for another form of the op (its
    declaration changed since) or not at all."""
    if module is None:
        package = decl.spec.reference.partition(":")[0].rpartition(".")[0]
        try:
            module = importlib.import_module(f"{package}._entrypoints")
        except ModuleNotFoundError as exc:
            if exc.name != f"{package}._entrypoints":
                raise
    if module is None or getattr(module, "FORMS", {}).get(decl.short_name) != _entry_codegen.form(decl):
        raise RuntimeError(
            f"opmux: {decl.name}: its generated entry points are missing or stale (the declaration "
            "changed): run python tools/gen_contracts.py"
        )
    return module


def _names(module: Any) -> dict[str, Any]:
    """The generated ``module``'s names, for an op's globals: without its ``__name__`` & co., so
    the globals are not taken for the module's own (torch.compile would read the op's tables as
    attributes of the module)."""
    return {k: v for k, v in vars(module).items() if not k.startswith("__") or k == "__builtins__"}


def _function(module: Any, name: str, scope: dict[str, Any]) -> Callable[..., Any]:
    """Function ``name`` of the generated ``module`` running on ``scope``: the module's names and
    one op's tables (``_entry_codegen.TABLES``), its globals as an op's own."""
    template = getattr(module, name)
    return types.FunctionType(template.__code__, scope, template.__name__, template.__defaults__)


def _make_bound(
    decl: Decl, run: Callable[..., Any], reference: bool, flag: Any = None, module: Any = None
) -> Callable[..., Any]:
    """check, values, the generic guard, then the kernel (or, for ``reference``, the reference);
    ``flag``: the kernel's default PDL flag (None: it takes none); ``module``: the op's
    generated entry points, already checked (``generated``)."""
    module = module if module is not None else generated(decl)
    scope = {**_names(module), "OP": decl.name, "CHECK": decl.check, "VALUES": decl.values}
    scope |= {"KERNEL": run, "FLAG": flag}
    name = decl.short_name
    fn = _function(
        module, f"reference_{name}" if reference else f"bound_{name}{'' if flag is None else '_pdl'}", scope
    )
    fn.__qualname__ = f"{decl.name}[{'reference' if reference else 'kernel'}]"
    return fn


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


def _raiser(exc: BaseException) -> Callable[..., Any]:
    def unavailable(*args: Any) -> None:
        raise exc

    return unavailable


def _native_device(x: torch.Tensor) -> str:
    return "cuda" if x.is_cuda else "cpu"


# -- programmatic dependent launch (PDL): the trailing flag of native CUDA kernels -------
_PDL_DEFAULTS: tuple[bool, ...] | None = None


def pdl_defaults() -> tuple[bool, ...]:
    """``enable_pdl=None`` per CUDA device index: compute capability major >= 9 (cached)."""
    global _PDL_DEFAULTS
    if _PDL_DEFAULTS is None:
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        _PDL_DEFAULTS = tuple(torch.cuda.get_device_capability(i)[0] >= 9 for i in range(n))
    return _PDL_DEFAULTS


class _PerDevice:
    """The flag of a host whose GPUs disagree (some with PDL, some without): resolved per call
    from the device of the kernel's first tensor argument."""

    def __repr__(self) -> str:
        return "PER_DEVICE"


PER_DEVICE: Any = _PerDevice()


def pdl_entry(kernel: Callable[..., Any]) -> tuple[Callable[..., Any], Any]:
    """(kernel, flag) for a native CUDA kernel: ``kernel(*kargs, flag)`` is the call when the
    caller passes no ``enable_pdl``. On a host with mixed GPUs the flag is ``PER_DEVICE`` and the
    kernel a wrapper that resolves it (a Python frame more, only there)."""
    flags = pdl_defaults()
    if len(set(flags)) <= 1:
        return kernel, bool(flags and flags[0])

    def per_device(*args: Any) -> Any:
        *kargs, flag = args
        if flag is PER_DEVICE:
            t = next(a for a in kargs if isinstance(a, torch.Tensor))
            flag = flags[t.device.index if t.device.index is not None else torch.cuda.current_device()]
        return kernel(*kargs, flag)

    return per_device, PER_DEVICE


def _with_flag(kernel: Callable[..., Any], flag: Any) -> Callable[..., Any]:
    """``kernel`` taking the kernel arguments alone (``flag`` None: it takes no flag)."""
    if flag is None:
        return kernel
    return lambda *kargs: kernel(*kargs, flag)


def with_contract(decl: Decl, run: Callable[..., Any]) -> Callable[..., Any]:
    """``run(*args)`` behind ``decl``'s whole contract (its checks and values, then the generic
    guard: inference-only, version bumps, overlaps): for an entry that computes the op another
    way, e.g. an engine's convention in ``opmux.compat``, with the op's errors."""
    return _make_bound(decl, run, reference=True)


R = TypeVar("R")


class FusedOp(Generic[R]):
    """A declared op with its dispatch; see the module docstring."""

    def __init__(self, decl: Decl, entrypoints: Any = None) -> None:
        """``entrypoints``: the module with the op's generated functions where its group has
        none (an op declared at run time; see ``generated``)."""
        self.decl = decl
        self._entrypoints = generated(decl, entrypoints)
        self.spec = registry.register(decl.spec)
        self.op_name = decl.name
        self.key_arg = decl.key_arg
        #: the pure-torch reference, unchecked (the parity oracle runs it in float64)
        self.forward_native = decl.reference
        #: default-call caches: dtype -> kernel (cpu), dtype -> (kernel, PDL flag) (cuda); a pair
        #: (small, large) of those where the device has a size rule
        self._cpu: dict[torch.dtype, Any] = {}
        self._cuda: dict[torch.dtype, Any] = {}
        #: the serving lanes of default calls (native kernels that check their call in C++):
        #: dtype -> lane (cpu), dtype -> (lane, PDL flag) (cuda); see ``_entry_codegen._lane_lines``
        self._lane_cpu: dict[torch.dtype, tuple[Callable[..., Any], Any]] = {}
        self._lane_cuda: dict[torch.dtype, tuple[Callable[..., Any], Any]] = {}
        #: (is_cpu, dtype) -> the native (lane, PDL flag) behind each of those: the same, or what the
        #: bridge's entry (torch_kernels.lane_entry) there calls
        self._lane_native: dict[tuple[bool, torch.dtype], tuple[Callable[..., Any], Any]] = {}
        #: (backend, is_cpu, dtype) -> (lane, PDL flag) of forced calls (like ``_forced``)
        self._lane_forced: dict[tuple[Any, ...], tuple[Callable[..., Any], Any]] = {}
        #: the native lanes behind those (as ``_lane_native``), and the bridge id of each forced
        #: backend's entries (its own: the default's id is also its torch.ops kernel's)
        self._lane_forced_native: dict[tuple[Any, ...], tuple[Callable[..., Any], Any]] = {}
        self._forced_ids: dict[Any, int] = {}
        #: (backend, device) -> (lane, PDL flag) of the native backends whose source has one
        self._lanes: dict[tuple[str, str], tuple[Callable[..., Any], Any]] = {}
        #: (backend, is_cpu, dtype) -> (kernel, PDL flag)
        self._forced: dict[tuple[Any, ...], tuple[Callable[..., Any], Any]] = {}
        self._bound: dict[tuple[str, str], Callable[..., R]] = {}
        #: (backend, device) -> (kernel, PDL flag: None where the kernel takes none)
        self._kernels: dict[tuple[str, str], tuple[Callable[..., Any], Any]] = {}
        self._failed: dict[str, str] = {}
        #: select()'s result per its inputs (the full dispatch of an op whose choice depends on
        #: the call: predicates, measured tables): select is a pure function of them
        self._selections: dict[Any, tuple[Any, Selection]] = {}
        self._dtypes = {d for b in self.spec.backends for d in b.requires.dtypes}
        self._python = dict(decl.python_backends)
        # backend -> per-call predicate target; ops with any are never fast-path cached
        self._predicates = {b.name: b.requires.predicate for b in self.spec.backends if b.requires.predicate}
        self._predicate_fns: dict[str, Callable[..., str | None]] = {}
        self._thresholds = {dev: self.spec.size_threshold(dev) for dev in ("cpu", "cuda")}
        #: the backend order per call comes from measured select tables (``measured``)
        self._measured = measured.measured_op(self.op_name)
        #: how a lane's call ends (None: the op has no lane form; see ``_entry_codegen.lane_form``)
        self.lane_form = _entry_codegen.lane_form(decl)
        #: whether the default call enters its lane through the bridge (torch_kernels.lane_entry)
        #: once it is loaded: every lane form, its results (nothing, the caller's tensors, the ones
        #: the lane allocates) crossing back as torch tensors without tvm-ffi's conversion (about
        #: 0.15 us per tensor argument on the H200's host, and a DLPack round trip per result); an
        #: op with several results only where ``outputs`` sizes them (``LRES``)
        self.entry_form = _entry_codegen.entry_form(decl)
        #: this op's id in the library ops' C++ kernels (torch_kernels); whether they hold its lanes
        self._bridge_id = next(_bridge_ids)
        self._bridge: Any = None
        #: library op name -> (params, schema, returns, Python kernel): what the bridge's twin is made of
        self._library_defs: dict[str, tuple[tuple[Param, ...], str, str, Callable[..., Any]]] = {}
        self._library: dict[str, Any] = {}
        #: the Python kernel of each library op (what the dispatcher calls; benchmarks time it alone)
        self._library_kernels: dict[str, Callable[..., Any]] = {}
        #: the globals of the op's generated functions: their module's names and the op's tables
        self._scope = self._tables()
        self._register_library()
        #: the public function (``ops.<group>.<name>``): the hot path, or the library op under
        #: torch.compile
        self.public = self._describe(_function(self._entrypoints, decl.short_name, self._scope))
        _dispatch_state.track(self)
        _INSTANCES[self.op_name] = self

    # -- binding -----------------------------------------------------------------------
    def entry(self, backend: str, device: str) -> tuple[Callable[..., Any], Any]:
        """(kernel, PDL flag) of ``backend`` for ``device``: the kernel takes ``check``'s kernel
        arguments, then the flag unless it is None (native CUDA kernels take one)."""
        fn = self._python.get(backend)
        if fn is not None:
            return fn, None
        obj = registry.resolve_target(self.spec.backend(backend).target)
        if not isinstance(obj, NativeLoader):
            return obj, None
        kernel = obj.kernel(self.op_name, device)
        return pdl_entry(kernel) if device == "cuda" else (kernel, None)

    def _lane(self, backend: str, device: str) -> tuple[Callable[..., Any], Any] | None:
        """(lane, PDL flag) of a native backend whose source has a serving lane for this op."""
        if backend in self._python or not self.lane_form:
            return None
        obj = registry.resolve_target(self.spec.backend(backend).target)
        if not isinstance(obj, NativeLoader):
            return None
        lane = obj.lane(self.op_name, device)
        if lane is None:
            return None
        return pdl_entry(lane) if device == "cuda" else (lane, None)

    def kernel(self, backend: str, device: str) -> Callable[..., Any]:
        """The kernel of ``backend`` for ``device``, taking ``check``'s kernel arguments (a
        native CUDA kernel gets its default PDL flag appended)."""
        return _with_flag(*self.entry(backend, device))

    def bind(self, backend: str, device: str) -> Callable[..., R]:
        """The bound function of ``backend`` on ``device`` (``cpu``/``cuda``): contract + kernel."""
        fn = self._bound.get((backend, device))
        if fn is None:
            if backend == REFERENCE:
                fn = _make_bound(self.decl, self.decl.reference, True, module=self._entrypoints)
            else:
                try:
                    kernel, flag = self.entry(backend, device)
                except BackendUnavailable as exc:
                    # not cached: the contract still speaks first, then the call raises it
                    return _make_bound(self.decl, _raiser(exc), False, module=self._entrypoints)
                fn = _make_bound(self.decl, kernel, False, flag, self._entrypoints)
                self._kernels[(backend, device)] = (kernel, flag)
                lane = self._lane(backend, device)
                if lane is not None:
                    self._lanes[(backend, device)] = lane
            self._bound[(backend, device)] = fn
        return fn

    def impl(self, backend: str) -> Callable[..., R]:
        """Backend ``backend`` for tensors on any device (binds per call: for tests and tools)."""
        key_name = self.decl.params[self.key_arg].name

        def run(*args: Any, **kwargs: Any) -> R:
            x = args[self.key_arg] if len(args) > self.key_arg else kwargs.get(key_name)
            device = _native_device(x) if isinstance(x, torch.Tensor) else "cpu"
            return self.bind(backend, device)(*args, **kwargs)

        return run

    # -- dispatch ------------------------------------------------------------------------
    def __call__(
        self,
        *args: Any,
        backend: str | Sequence[str] | None = None,
        enable_pdl: bool | None = None,
        **kwargs: Any,
    ) -> R:
        """The dispatch without the generated hot path (any argument form)."""
        return self._dispatch(args, kwargs, backend, enable_pdl)

    def lookup(self, x: Any) -> Callable[..., Any] | None:
        """The kernel cached for a default call on a tensor like ``x`` (None: the full dispatch
        runs). The public function runs the contract, then this kernel."""
        try:
            fn = self._cpu.get(x.dtype) if x.is_cpu else self._cuda.get(x.dtype) if x.is_cuda else None
        except AttributeError:
            return None
        threshold = self._thresholds["cpu" if x.is_cpu else "cuda"]
        if fn is not None and threshold:
            fn = fn[x.numel() >= threshold]
        if fn is not None and x.is_cuda:
            fn = fn[0]  # (kernel, PDL flag)
        return fn

    def invalidate(self) -> None:
        """Drop the cached choices (the bound kernels stay: the same choice reuses them)."""
        self._selections.clear()
        self._cpu.clear()
        self._cuda.clear()
        self._lane_cpu.clear()
        self._lane_cuda.clear()
        self._lane_native.clear()
        self._lane_forced.clear()
        self._lane_forced_native.clear()
        self._forced.clear()
        bridge = torch_kernels.module()
        if bridge is not None:
            for op_id in (self._bridge_id, *self._forced_ids.values()):
                bridge["opmux_bridge_clear"](op_id)

    def forget_kernels(self) -> None:
        """Drop the bound kernels and forget failures (the settings that found them changed:
        ``refresh()``); a backend that failed is tried again."""
        self._bound.clear()
        self._kernels.clear()
        self._lanes.clear()
        self._failed.clear()
        self.invalidate()

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

    def _key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if len(args) > self.key_arg:
            return args[self.key_arg]
        return kwargs.get(self.decl.params[self.key_arg].name)

    def check_key_tensor(self, x: Any) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{self.op_name}: expected a torch.Tensor, got {type(x).__name__}")
        if dtype_name(x.dtype) not in self._dtypes:
            raise TypeError(
                f"{self.op_name}: unsupported dtype {dtype_name(x.dtype)}; "
                f"supported: {', '.join(sorted(self._dtypes))}"
            )

    def select_for(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        backend: str | Sequence[str] | None = None,
        refused: dict[str, str] | None = None,
    ) -> Selection:
        """The full selection for these arguments (what ``explain`` shows); ``refused``: the
        backends that declined this call (CallRefused), counted as failed for it alone."""
        x = self._key(args, kwargs)
        self.check_key_tensor(x)
        device_type, arch = platform_device(x.device)
        forced = (
            _dispatch_state.forced(self.op_name, backend)
            if backend is not None
            else _dispatch_state.backends_for(self.op_name)
        )
        found = facts.detect_facts(device_type, arch)
        dtype = dtype_name(x.dtype)
        rejections = self._arg_rejections(args, kwargs)
        preferred = measured.preferred(self.op_name, x.device, args, kwargs) if self._measured else None
        failed = {**self._failed, **refused} if refused else self._failed
        # select reads numel only through the device's size-class priority: that order keys it
        key = (
            id(found),
            dtype,
            forced,
            tuple(sorted(rejections.items())),
            tuple(sorted(self._failed.items())),
            tuple(sorted(refused or ())),  # names only: a refusal's text varies per call
            self.spec.priority_for(device_type, x.numel()),
            preferred,
        )
        hit = self._selections.get(key)
        if hit is not None and hit[0] is found:  # the same facts object (not a reused id)
            return hit[1]
        sel = select(
            self.spec,
            found,
            dtype=dtype,
            forced=forced,
            arg_rejections=rejections,
            failed=failed,
            numel=x.numel(),
            preferred=preferred,
        )
        if len(self._selections) >= _MAX_SELECTIONS:
            self._selections.clear()
        self._selections[key] = (found, sel)
        return sel

    def _apply_policy(self, sel: Selection) -> None:
        if sel.fallback_from is None:
            return
        wanted = sel.fallback_from
        reason = wanted.reason.value if wanted.reason else "rejected"
        tracing.record_fallback(self.op_name, wanted.backend, sel.chosen, reason)
        policy = _dispatch_state.policy()
        if policy == "error" and sel.forced:  # error concerns forced backends (docs/env.md)
            raise FallbackError(self.op_name, wanted.backend, f"{reason}: {wanted.detail}", sel.trace_str())
        if policy != "silent":
            key = (self.op_name, wanted.backend, reason)
            if key not in _WARNED:
                _WARNED.add(key)
                _warn.warn_at_caller(
                    f"opmux: {self.op_name} falls back from {wanted.backend} to {sel.chosen} "
                    f"({reason}: {wanted.detail}); set OPMUX_FALLBACK=silent to hide"
                    + (" or =error to forbid" if sel.forced else ""),
                    RuntimeWarning,
                )

    def _dispatch(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], backend: Any, enable_pdl: bool | None = None
    ) -> R:
        x = self._key(args, kwargs)
        gen = _dispatch_state.generation()  # a use_backends block opening/closing voids the cache
        refused: dict[str, str] | None = None  # made on a first refusal: no allocation per call
        while True:
            sel = self.select_for(args, kwargs, backend, refused)
            self._apply_policy(sel)
            try:
                fn = self.bind(sel.chosen, _native_device(x))
                result = fn(*args, enable_pdl=enable_pdl, **kwargs)
            except CallRefused as exc:  # this call's data: the next backend runs it, this one stays
                refused = {**(refused or {}), sel.chosen: exc.detail}
                continue
            except BackendUnavailable as exc:
                # e.g. a failed JIT compile: remember it, reselect, let the policy speak
                self._failed[sel.chosen] = exc.detail
                self._bound.pop((sel.chosen, _native_device(x)), None)
                self._kernels.pop((sel.chosen, _native_device(x)), None)
                self._lanes.pop((sel.chosen, _native_device(x)), None)
                self.invalidate()
                continue
            break
        if tracing.enabled():
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
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
        elif (
            not self._predicates
            # where a select table speaks for this device the choice depends on the call's shape:
            # never cached per dtype (a device without one keeps the declared order: cached; the
            # cache is per device type, so of two different GPUs the first call's decides)
            and not (self._measured and tuned.has_tables(self.op_name, "select", tuned.device_name(x.device)))
            and not refused  # a backend declined this call's data, not calls like it
            and (x.is_cpu or x.is_cuda)
            and (sel.chosen, _native_device(x)) in self._kernels
            and _dispatch_state.cacheable(gen)
        ):
            self._remember(
                x,
                self._kernels[(sel.chosen, _native_device(x))],
                backend,
                self._lanes.get((sel.chosen, _native_device(x))),
            )
            if not _dispatch_state.cacheable(gen):  # raced with use_backends: drop it
                self.invalidate()
        return result

    def _remember(
        self,
        x: torch.Tensor,
        entry: tuple[Callable[..., Any], Any],
        backend: Any,
        lane: tuple[Callable[..., Any], Any] | None = None,
    ) -> None:
        """Cache ``entry`` (kernel, PDL flag) for calls like this one (default: per dtype, per size
        side where the op has size classes; forced: per ``backend`` value), and the chosen
        backend's serving ``lane`` (default calls of an op without size classes)."""
        if backend is not None:
            key = tuple(backend) if isinstance(backend, list) else backend
            self._forced[(key, x.is_cpu, x.dtype)] = entry
            if lane is not None:
                self._lane_forced_native[(key, x.is_cpu, x.dtype)] = lane
                self._lane_forced[(key, x.is_cpu, x.dtype)] = self._entry(
                    x.is_cpu, x.dtype, lane, self._forced_id(key)
                )
            return
        if lane is not None and not self._thresholds["cpu" if x.is_cpu else "cuda"]:
            self._lane_native[(x.is_cpu, x.dtype)] = lane
            (self._lane_cpu if x.is_cpu else self._lane_cuda)[x.dtype] = self._entry(x.is_cpu, x.dtype, lane)
            if self._bridge is not None:
                self._bridge_lane(x.is_cpu, x.dtype, lane)
        fn: Any = entry[0] if x.is_cpu else entry  # the CPU kernels take no flag
        cache = self._cpu if x.is_cpu else self._cuda
        threshold = self._thresholds["cpu" if x.is_cpu else "cuda"]
        if not threshold:
            cache[x.dtype] = fn
            return
        cache.setdefault(x.dtype, [None, None])[x.numel() >= threshold] = fn

    # -- generated entry points ----------------------------------------------------------
    def _tables(self) -> dict[str, Any]:
        """The generated module's names and the op's tables (``_entry_codegen.TABLES``): the
        globals its functions run on, filled and cleared in place, never rebound."""
        return {
            **_names(self._entrypoints),
            "OP": self.op_name,
            "CHECK": self.decl.check,
            "VALUES": self.decl.values,
            "OUTPUTS": self.decl.outputs,
            "LIB": self._library,
            "CPU": self._cpu,
            "CUDA": self._cuda,
            "CPU_T": self._thresholds["cpu"] or 1 << 62,
            "CUDA_T": self._thresholds["cuda"] or 1 << 62,
            "FORCED": self._forced,
            "DISPATCH": self._dispatch,
            "LANE_CPU": self._lane_cpu,
            "LANE_CUDA": self._lane_cuda,
            "LANE_FORCED": self._lane_forced,
            "BRIDGE_PENDING": _BRIDGE_PENDING,
            "BRIDGE_POLL": _bridge_poll,
            "ENTRY_PENDING": _ENTRY_PENDING,
            "ENTRY_POLL": _entry_poll,
        }

    def _describe(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` under the op's group (its module) and doc, as the group's own functions."""
        fn.__module__ = self.decl.spec.reference.partition(":")[0].rpartition(".")[0]
        fn.__doc__ = self.decl.spec.doc
        return fn

    def _register_library(self) -> None:
        """``opmux::<name>`` (and ``opmux::<name>_out`` for an optional ``out``), fake included;
        their kernel is the hot path itself, generated for the schema's own parameters (no
        wrapper frame, no compiling check: the dispatcher only calls it with real tensors)."""
        for name, params, returns in _entry_codegen.library_ops(self.decl):
            kernel = self._describe(_function(self._entrypoints, f"library_{name}", self._scope))
            fake = _function(self._entrypoints, f"fake_{name}", self._scope)
            self._define(name, params, returns, kernel, fake)

    def _define(
        self,
        name: str,
        params: tuple[Param, ...],
        returns: str,
        fn: Callable[..., Any],
        fake: Callable[..., Any],
    ) -> None:
        aliases = iter(range(len(params)))
        schema = ", ".join(_schema_param(p, next(aliases)) for p in params)
        _LIB.define(f"{name}({schema}) -> {returns}")  # type: ignore[no-untyped-call]
        # CompositeExplicitAutograd: one Python kernel for every device, no Python autograd
        # wrapper (custom_op's costs ~8 us per call); the contract rejects grad inputs anyway
        _LIB.impl(name, fn, "CompositeExplicitAutograd")  # type: ignore[no-untyped-call]
        torch.library.register_fake(f"opmux::{name}", fake, lib=_LIB)
        self._library[name] = getattr(torch.ops.opmux, name).default
        self._library_kernels[name] = fn
        self._library_defs[name] = (params, schema, returns, fn)
        # every lane form's results can be pushed from C++: nothing, the one tensor the lane
        # allocated, or several (the caller's buffers or the lane's, lane.h ``ran_all``)
        if self.lane_form is not None:
            torch_kernels.register(name, self)

    # -- the library ops' C++ kernels (torch_kernels, jit/csrc/torch_bridge.cpp) ---------------
    def _bridge_define(self, name: str, bridge: Any) -> None:
        """Give library op ``name`` the bridge's C++ kernel (CPU, CUDA): its twin ``_py_<name>``
        keeps the Python kernel for what the lane does not run."""
        params, schema, returns, fn = self._library_defs[name]
        twin = f"_py_{name}"
        _LIB.define(f"{twin}({schema}) -> {returns}")  # type: ignore[no-untyped-call]
        _LIB.impl(twin, fn, "CompositeExplicitAutograd")  # type: ignore[no-untyped-call]
        index = {p.name: i for i, p in enumerate(params)}
        key = self.decl.params[self.key_arg].name
        if returns == "()":
            results: list[int] = []
        elif returns == "Tensor":
            results = [-1]  # the lane's own
        else:  # several: the optional written parameters, in order, are the results' buffers
            buffers = [i for i, p in enumerate(params) if p.written and p.type == "Tensor?"]
            results = buffers[: returns.count("Tensor")]
        bridge["opmux_bridge_define"](
            name,
            self._bridge_id,
            [index.get(p.name, -1) for p in self.decl.params],
            index[key],
            results,
            [i for i, p in enumerate(params) if p.written],
            [i for i, p in enumerate(params) if p.is_tensor],
            twin,
            torch_kernels.devices(),
        )
        torch_kernels.attach_call(name)
        self._bridge = bridge
        for (is_cpu, dtype), lane in list(self._lane_native.items()):
            self._bridge_lane(is_cpu, dtype, lane)

    def _bridge_lane(self, is_cpu: bool, dtype: torch.dtype, lane: tuple[Callable[..., Any], Any]) -> None:
        fn, flag = lane
        if flag is not None and not isinstance(flag, bool):
            return  # PER_DEVICE (a host with mixed GPUs): resolved per call, by the Python path only
        self._bridge["opmux_bridge_set_lane"](
            self._bridge_id,
            1 if is_cpu else 2,
            dtype_name(dtype),
            fn,
            -1 if flag is None else int(flag),
        )
        if self._lane_native.get((is_cpu, dtype)) is not lane:
            # invalidated meanwhile (use_backends, tracing, refresh on another thread): take it back
            self._bridge["opmux_bridge_clear"](self._bridge_id)

    # -- the default call's entry into its lane (torch_kernels) ---------------------------------
    def _forced_id(self, backend: Any) -> int:
        return self._forced_ids.setdefault(backend, next(_bridge_ids))

    def _entry(
        self, is_cpu: bool, dtype: torch.dtype, lane: tuple[Callable[..., Any], Any], op_id: int | None = None
    ) -> Any:
        """What the default call (or, with a forced backend's ``op_id``, a forced call) keeps for
        ``lane``: the bridge's entry into it where the bridge is loaded, else the lane itself (an
        op waiting for the bridge is given its entries once it is built)."""
        if not self.entry_form:
            return lane
        fn, flag = lane
        entry = None
        if flag is None or isinstance(flag, bool):  # (PER_DEVICE: resolved per call, in Python)
            entry = torch_kernels.lane_entry(
                self._bridge_id if op_id is None else op_id, is_cpu, dtype_name(dtype), self.op_name, fn, flag
            )
        if entry is not None:
            return entry, flag
        if _ENTRY_PENDING[0] and self not in _ENTRY_WAITING:
            _ENTRY_WAITING.append(self)
        return lane

    def _bind_entries(self) -> None:
        """Swap the lanes bound so far for the bridge's entries (it has just been built)."""
        for (is_cpu, dtype), lane in list(self._lane_native.items()):
            entry = self._entry(is_cpu, dtype, lane)
            table = self._lane_cpu if is_cpu else self._lane_cuda
            if entry is not lane and table.get(dtype) is lane:
                table[dtype] = entry
                if self._lane_native.get((is_cpu, dtype)) is not lane:  # invalidated meanwhile
                    table.pop(dtype, None)
        for fkey, lane in list(self._lane_forced_native.items()):
            entry = self._entry(fkey[1], fkey[2], lane, self._forced_id(fkey[0]))
            if entry is not lane and self._lane_forced.get(fkey) is lane:
                self._lane_forced[fkey] = entry
                if self._lane_forced_native.get(fkey) is not lane:  # invalidated meanwhile
                    self._lane_forced.pop(fkey, None)


def instance(decl: Decl) -> FusedOp[Any]:
    """The live op of ``decl`` (one per process: it owns the torch library registrations)."""
    op = _INSTANCES.get(decl.name)
    if op is None:
        op = FusedOp(decl)
    return op


def _schema_param(p: Param, alias: int) -> str:
    kind = f"Tensor(a{alias}!)" if p.written else p.type.rstrip("?")
    # the signature's defaults are the schema's too: torch.ops.opmux.silu_and_mul(x) works
    default = "" if p.default is None else f"={p.default}"
    return f"{kind}{'?' if p.type.endswith('?') else ''} {p.name}{default}"
