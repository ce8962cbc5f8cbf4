"""One declaration per op (torch-free): everything else follows from it by convention.

``declare("group.name", "(Tensor x, ..., Tensor(a!)? out=None) -> Tensor", ...)`` in
``ops/<group>/op.py`` states the op once: its signature (a torch schema: ``(a!)`` marks the
tensors it writes), its argument contract (``check``, and ``values`` for data-dependent checks),
its reference, its Python backends (``torch``, ``torch_npu``) and which kernel backends it has
(``native``: the ``aot`` and ``jit`` builds of one C++/CUDA source; ``triton``). From that
follow, without further code per op:

* the spec the registry, the selector, ``explain`` and the CLI read (``OpSpec``, torch-free);
* the kernel of each backend, one argument list for all: ``check(op, *args)`` returns
  ``(kernel_args, result)`` and every backend is called as ``kernel(*kernel_args)``: the
  native function ``<name>_<device>`` of JIT module / AOT library ``<group>_<device>``, the
  Triton launcher ``<package>.triton_kernels:<name>``, the declared ``torch`` function;
* the torch library op ``opmux::<name>`` with its fake (``check`` on fake tensors), plus
  ``opmux::<name>_out`` when the op takes an optional ``out``;
* the public function with its hot path (``fused_op.FusedOp``), and the parity cases
  ``<samples>_samples`` / ``<samples>_invalid`` of ``tests/parity/samples/<group>.py``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..spec import BackendSpec, OpSpec, Requirement
from ._common import AOT, JIT, PRIORITY, TOLERANCES, TORCH, TORCH_NPU, TRITON
from ._contract import Contract, Forms

__all__ = ["NATIVE_TARGETS", "Decl", "Param", "declare", "parse_signature", "variant"]

#: where the two loaders of the native backend live (``_native.AOT`` / ``_native.JIT``)
NATIVE_TARGETS = {"aot": "opmux.kernels.ops._native:AOT", "jit": "opmux.kernels.ops._native:JIT"}
_TYPES = ("Tensor", "Tensor?", "float", "int", "bool", "str", "ScalarType?")
_PARAM = re.compile(r"^(Tensor|float|int|bool|str|ScalarType)(\(a!\))?(\?)? ([a-z_][a-z0-9_]*)(?:=(\S+))?$")


@dataclass(frozen=True)
class Param:
    """One parameter of an op's signature."""

    name: str
    type: str  # one of _TYPES
    written: bool = False
    default: str | None = None  # the Python literal, as written in the signature

    @property
    def is_tensor(self) -> bool:
        return self.type.startswith("Tensor")


def parse_signature(text: str) -> tuple[tuple[Param, ...], str]:
    """``"(Tensor x, float eps=1e-06) -> Tensor"`` -> (params, return type text)."""
    m = re.fullmatch(r"\((.*)\) -> (.+)", text.strip())
    if not m:
        raise ValueError(f"invalid op signature {text!r}: expected '(<params>) -> <returns>'")
    params = []
    for part in filter(None, (p.strip() for p in m.group(1).split(","))):
        pm = _PARAM.match(part)
        if not pm:
            raise ValueError(
                f"invalid parameter {part!r} in {text!r}: expected '<type>[(a!)][?] <name>[=<default>]' "
                f"with type one of {', '.join(_TYPES)}"
            )
        kind, written, optional, name, default = pm.groups()
        if written and kind != "Tensor":
            raise ValueError(f"{text!r}: only tensors can be written, not {name!r}")
        params.append(Param(name, kind + ("?" if optional else ""), bool(written), default))
    names = [p.name for p in params]
    if len(set(names)) != len(names) or {"backend", "enable_pdl"} & set(names):
        raise ValueError(f"{text!r}: parameter names must be unique; 'backend' and 'enable_pdl' are reserved")
    seen_default = False
    for p in params:
        if p.default is None and seen_default:
            raise ValueError(f"{text!r}: {p.name!r} without a default follows one with a default")
        seen_default = seen_default or p.default is not None
    return tuple(params), m.group(2).strip()


def _target(fn: Callable[..., Any]) -> str:
    fn = getattr(fn, "func", fn)  # a functools.partial names its function
    return f"{fn.__module__}:{fn.__qualname__}"


@dataclass(frozen=True)
class Decl:
    """An op as declared; ``spec`` is its torch-free registry entry."""

    spec: OpSpec
    params: tuple[Param, ...]
    returns: str
    #: the hand-written check of an op without a contract (None: the contract's generated one)
    check_fn: Callable[..., tuple[tuple[Any, ...], Any]] | None
    reference: Callable[..., Any]
    values: Callable[..., None] | None
    python_backends: tuple[tuple[str, Callable[..., None]], ...]
    key_arg: int
    #: for a serving lane of an op with several outputs: ``outputs(*args) -> (outs, result)``
    #: allocates the optional outputs (``outs``, in signature order) for a call that passes
    #: none, and says what the call returns (see ``_entry_codegen._lane_lines``); None for a contract
    #: with several outputs: its generated ``outputs_<contract>`` (``Decl.outputs``)
    outputs_fn: Callable[..., tuple[tuple[Any, ...], Any]] | None = None
    #: the arguments ``declare`` was given (for ``variant``)
    declared: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)
    #: the argument contract as data (``ops/_contract.py``); its check is generated into
    #: ``ops/<group>/_contracts.py``
    contract: Contract | Forms | None = None

    @property
    def check(self) -> Callable[..., tuple[tuple[Any, ...], Any]]:
        """``check(op, *args) -> (kernel_args, result)``: the contract's generated function
        (imported on first use: it needs torch), or the hand-written one."""
        if self.check_fn is None:
            assert self.contract is not None
            fn = getattr(self._generated(), f"check_{self.contract.name}")
            object.__setattr__(self, "check_fn", fn)
        return self.check_fn  # type: ignore[return-value]

    @property
    def outputs(self) -> Callable[..., tuple[tuple[Any, ...], Any]] | None:
        """The hand-written ``outputs`` hook, or the generated one of a contract with several
        outputs (imported on first use, as ``check``), or None."""
        if self.outputs_fn is None and isinstance(self.contract, Contract) and len(self.contract.outputs) > 1:
            fn = getattr(self._generated(), f"outputs_{self.contract.name}")
            object.__setattr__(self, "outputs_fn", fn)
        return self.outputs_fn

    def _generated(self) -> Any:
        """The group's ``_contracts`` module (it needs torch: imported on first use)."""
        import importlib

        package = self.spec.reference.partition(":")[0].rpartition(".")[0]
        return importlib.import_module(f"{package}._contracts")

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def short_name(self) -> str:
        return self.spec.name.partition(".")[2]

    @property
    def has_out(self) -> bool:
        """An optional ``out`` it writes: also registered as ``opmux::<name>_out``."""
        return any(p.name == "out" and p.written and p.type == "Tensor?" for p in self.params)


def declare(
    name: str,
    signature: str,
    *,
    check: Callable[..., tuple[tuple[Any, ...], Any]] | None = None,
    contract: Contract | Forms | None = None,
    reference: Callable[..., Any],
    doc: str,
    values: Callable[..., None] | None = None,
    torch: Callable[..., None] | None = None,
    torch_npu: Callable[..., None] | None = None,
    native: bool = True,
    triton: bool = True,
    dtypes: tuple[str, ...] | None = None,
    tolerances: tuple[tuple[str, tuple[float, float]], ...] = TOLERANCES,
    size_priority: tuple[tuple[str, int, tuple[str, ...]], ...] = (),
    samples: str | None = None,
    key_arg: int = 0,
    outputs: Callable[..., tuple[tuple[Any, ...], Any]] | None = None,
    vendor: tuple[tuple[str, Callable[..., None], Requirement], ...] = (),
    priority: tuple[tuple[str, tuple[str, ...]], ...] = (),
    native_predicate: str | None = None,
) -> Decl:
    """Declare op ``name`` (``group.op``); see the module docstring for what follows.

    ``check(op, *args)`` (``op`` is the op's name, for messages) validates the arguments (raising TypeError / ValueError that name the
    argument, the bad value and the valid choices), allocates outputs and returns
    ``(kernel_args, result)``. ``values(*args)`` checks tensor contents (e.g. index ranges) and
    is skipped under torch.compile's fake tensors. ``dtypes`` narrows the key tensor dtypes
    every backend takes; ``samples`` names another op's parity cases to reuse; ``key_arg`` is
    the index of the argument whose device and dtype choose the backend. ``outputs`` (ops with
    several results) allocates a serving lane's outputs: ``outputs(*args) -> (outs, result)``.
    """
    params, returns = parse_signature(signature)
    if (check is None) == (contract is None):
        raise ValueError(f"{name}: give exactly one of check= (hand-written) or contract= (data)")
    if any(p.name == "out" for p in params[:-1]):
        raise ValueError(f"{name}: 'out' must be the last parameter")
    package = _target(reference).partition(":")[0].rpartition(".")[0]
    short = name.partition(".")[2]
    python = tuple((n, fn) for n, fn in (("torch", torch), ("torch_npu", torch_npu)) if fn is not None)
    backends: list[BackendSpec] = []
    if native:
        # a per-call predicate (``"module:function"``, called with the op's arguments, returning
        # a reason or None) where the native kernel takes fewer layouts than the contract (TMA)
        reqs = [
            (k, replace(r, predicate=native_predicate) if native_predicate else r)
            for k, r in (("aot", AOT), ("jit", JIT))
        ]
        backends += [BackendSpec(k, NATIVE_TARGETS[k], req) for k, req in reqs]
    if triton:
        backends.append(BackendSpec("triton", f"{package}.triton_kernels:{short}", TRITON))
    requirements = {"torch": TORCH, "torch_npu": TORCH_NPU}
    backends += [BackendSpec(n, _target(fn), requirements[n]) for n, fn in python]
    # vendor libraries called from Python (e.g. cuBLASLt through torch._scaled_mm): name,
    # function (the kernel arguments, like every backend), requirement
    backends += [BackendSpec(n, _target(fn), req) for n, fn, req in vendor]
    python = (*python, *((n, fn) for n, fn, _ in vendor))
    if dtypes is not None:
        backends = [replace(b, requires=replace(b.requires, dtypes=dtypes)) for b in backends]
    names = {b.name for b in backends}
    # the op's own order on a device (measured: docs/benchmarks) replaces the default one there
    own = dict(priority)
    orders = tuple((dev, tuple(b for b in own.get(dev, order) if b in names)) for dev, order in PRIORITY)
    spec = OpSpec(
        name=name,
        reference=_target(reference),
        backends=tuple(backends),
        default_priority=("torch",) if "torch" in names else (),
        priority=orders,
        tolerances=tolerances,
        samples=f"{name.partition('.')[0]}:{samples or short}",
        mutates=tuple(p.name for p in params if p.written),
        doc=doc,
        size_priority=size_priority,
    )
    declared = {k: v for k, v in locals().items() if k in _DECLARE_ARGS}
    return Decl(spec, params, returns, check, reference, values, python, key_arg, outputs, declared, contract)


def variant(of: Decl, name: str, *, doc: str, **changes: Any) -> Decl:
    """Another op declared like ``of`` but for ``changes`` (e.g. the Gemma variant of rmsnorm:
    another reference and torch backend, the same contract and kernel arguments)."""
    return declare(
        name, **{**of.declared, "doc": doc, "samples": of.declared["samples"] or of.short_name, **changes}
    )


_DECLARE_ARGS = (
    "signature",
    "check",
    "reference",
    "values",
    "torch",
    "torch_npu",
    "native",
    "triton",
    "dtypes",
    "tolerances",
    "size_priority",
    "samples",
    "key_arg",
    "outputs",
    "contract",
    "vendor",
    "priority",
    "native_predicate",
)
