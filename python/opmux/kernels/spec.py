"""Value types that describe an operator and its backends, without importing torch.

Specs name their implementations as import targets (``"module:attr.attr"``) so the
metadata layer can list, explain and validate every kernel without loading any of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "DEVICE_TYPES",
    "DTYPES",
    "BackendSpec",
    "OpSpec",
    "Requirement",
    "Target",
]

#: Platform device types. ``hip`` is a ROCm GPU (torch calls its tensors ``cuda``).
DEVICE_TYPES: tuple[str, ...] = ("cpu", "cuda", "hip", "xpu", "npu", "mps")
#: Dtype names as ``str(torch.float16).removeprefix("torch.")`` spells them. ``int32`` and
#: ``int64`` are for ops whose key tensor holds indices (``moe.moe_align_block_size``'s expert ids).
DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16", "float64", "int32", "int64", "float8_e4m3fn")
#: Environment capabilities a backend may need (see ``selector.Facts.capabilities``).
Capability = Literal["triton", "jit:cpu", "jit:cuda", "aot:cpu", "aot:cuda", "torch_npu"]

_TARGET_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


@dataclass(frozen=True)
class Target:
    """An import target ``module:attr[.attr...]``, resolved only when first needed."""

    module: str
    attrs: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> Target:
        if not _TARGET_RE.match(text):
            raise ValueError(
                f"invalid import target {text!r}: expected 'package.module:attr' "
                "(nested attributes allowed, e.g. 'pkg.mod:Class.method')"
            )
        module, _, attrs = text.partition(":")
        return cls(module, tuple(attrs.split(".")))

    def __str__(self) -> str:
        return f"{self.module}:{'.'.join(self.attrs)}"


@dataclass(frozen=True)
class Requirement:
    """What a backend needs from the machine and the call.

    ``sm_min``/``sm_max`` bound the CUDA compute capability as ``major*10+minor``
    (``sm_min=90`` is sm_90 and newer); ``gfx`` lists allowed ROCm archs (empty: any).
    ``capabilities`` must all be present on the machine (see ``selector.Facts``).
    ``predicate`` is an optional import target called with the op's arguments; it
    returns ``None`` to accept or a reason string to reject.
    """

    devices: tuple[str, ...]
    dtypes: tuple[str, ...] = ("float32", "float16", "bfloat16")
    sm_min: int | None = None
    sm_max: int | None = None
    gfx: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()
    predicate: str | None = None

    def __post_init__(self) -> None:
        bad = [d for d in self.devices if d not in DEVICE_TYPES]
        if bad or not self.devices:
            raise ValueError(f"unknown device type(s) {bad}; valid: {', '.join(DEVICE_TYPES)}")
        bad = [d for d in self.dtypes if d not in DTYPES]
        if bad:
            raise ValueError(f"unknown dtype(s) {bad}; valid: {', '.join(DTYPES)}")
        if self.sm_min is not None and self.sm_max is not None and self.sm_min > self.sm_max:
            raise ValueError(f"empty arch window sm_{self.sm_min}..sm_{self.sm_max}")
        if self.predicate is not None:
            Target.parse(self.predicate)

    def describe(self) -> str:
        parts = ["/".join(self.devices)]
        if self.sm_min is not None or self.sm_max is not None:
            lo = f"sm_{self.sm_min}" if self.sm_min is not None else ""
            hi = f"sm_{self.sm_max}" if self.sm_max is not None else ""
            parts.append(f"{lo}+" if not hi else f"{lo}..{hi}")
        if self.gfx:
            parts.append("|".join(self.gfx))
        parts.append(",".join(self.dtypes))
        if self.capabilities:
            parts.append("needs " + ",".join(self.capabilities))
        return " ".join(parts)


@dataclass(frozen=True)
class BackendSpec:
    """One implementation of an op: a name (``torch``, ``triton``, ``jit``, ``aot``, ...)."""

    name: str
    target: str
    requires: Requirement

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9_]*", self.name):
            raise ValueError(f"invalid backend name {self.name!r}: use lowercase [a-z0-9_]")
        Target.parse(self.target)


@dataclass(frozen=True)
class OpSpec:
    """A logical operator: its reference, backends, per-device priority and test data.

    ``priority`` maps a platform device type to backend names, best first; a device
    type missing from it uses ``default_priority``. ``tolerances`` maps a dtype to
    ``(atol, rtol)`` against the reference. ``samples`` names the op's parity cases,
    ``<group>:<prefix>``: test data, kept with the tests (``tests/parity/samples/<group>.py``
    defines ``<prefix>_samples(device, dtype)`` and ``<prefix>_invalid(device)``), not shipped.
    """

    name: str
    reference: str
    backends: tuple[BackendSpec, ...]
    default_priority: tuple[str, ...]
    priority: tuple[tuple[str, tuple[str, ...]], ...] = ()
    tolerances: tuple[tuple[str, tuple[float, float]], ...] = ()
    samples: str | None = None
    mutates: tuple[str, ...] = ()
    doc: str = ""
    #: (device type, min elements of the key tensor, priority): from that size on, this
    #: order replaces the device's priority (one threshold per device; measured, see
    #: docs/benchmarks). Dispatch caches one backend per side of the threshold.
    size_priority: tuple[tuple[str, int, tuple[str, ...]], ...] = ()
    _by_name: dict[str, BackendSpec] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9_]*\.[a-z][a-z0-9_]*", self.name):
            raise ValueError(f"invalid op name {self.name!r}: expected 'group.op'")
        Target.parse(self.reference)
        names = [b.name for b in self.backends]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"{self.name}: duplicate backend(s) {dupes}")
        if "reference" in names:
            raise ValueError(f"{self.name}: 'reference' is reserved for forward_native")
        devices = [dev for dev, _, _ in self.size_priority]
        if len(devices) != len(set(devices)):
            raise ValueError(f"{self.name}: one size_priority threshold per device type")
        for _, order in (
            ("*", self.default_priority),
            *self.priority,
            *((d, o) for d, _, o in self.size_priority),
        ):
            unknown = [n for n in order if n not in names]
            if unknown:
                raise ValueError(
                    f"{self.name}: priority names unknown backend(s) {unknown}; declared: {', '.join(names)}"
                )
        self._by_name.update({b.name: b for b in self.backends})

    @property
    def group(self) -> str:
        return self.name.partition(".")[0]

    @property
    def backend_names(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.backends)

    def backend(self, name: str) -> BackendSpec:
        try:
            return self._by_name[name]
        except KeyError:
            raise ValueError(
                f"{self.name} has no backend {name!r}; valid: {', '.join(self.backend_names)}"
            ) from None

    def size_threshold(self, device_type: str) -> int | None:
        """The element count from which ``size_priority`` applies on ``device_type``."""
        return next((n for dev, n, _ in self.size_priority if dev == device_type), None)

    def priority_for(self, device_type: str, numel: int | None = None) -> tuple[str, ...]:
        """Best first, for a key tensor of ``numel`` elements (None: the size-independent order)."""
        if numel is not None:
            for dev, threshold, order in self.size_priority:
                if dev == device_type and numel >= threshold:
                    return order
        return dict(self.priority).get(device_type, self.default_priority)

    def tolerance(self, dtype: str) -> tuple[float, float]:
        tol = dict(self.tolerances)
        if dtype not in tol:
            raise KeyError(f"{self.name} declares no tolerance for {dtype}")
        return tol[dtype]
