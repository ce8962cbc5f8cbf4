"""Pure backend selection over explicit facts, with a decision for every candidate.

Nothing here looks at the machine: ``Facts`` are passed in (``facts.detect_facts``
builds them), so selection is testable with made-up machines and its trace is what
errors, ``explain`` and the CLI all render.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from .spec import BackendSpec, OpSpec

__all__ = ["Decision", "Facts", "Reason", "Selection", "arch_number", "select"]

REFERENCE = "reference"


class Reason(str, Enum):
    """Why a backend was not chosen. Values are stable strings for ``--json``."""

    WRONG_DEVICE = "wrong-device"
    WRONG_ARCH = "wrong-arch"
    WRONG_DTYPE = "wrong-dtype"
    BAD_ARGUMENTS = "bad-arguments"
    NOT_IN_WHEEL = "not-in-wheel"
    NO_COMPILER = "no-compiler"
    JIT_DISABLED = "jit-disabled"
    NO_TRITON = "no-triton"
    MISSING_CAPABILITY = "missing-capability"
    FAILED = "failed"
    DISABLED_BY_USER = "disabled-by-user"
    NOT_IN_PRIORITY = "not-in-priority"
    LOWER_PRIORITY = "lower-priority"

    @property
    def is_environmental(self) -> bool:
        """Rejections that a better-equipped machine or wheel would not have."""
        return self in _ENVIRONMENTAL


_ENVIRONMENTAL = frozenset(
    {
        Reason.NOT_IN_WHEEL,
        Reason.NO_COMPILER,
        Reason.JIT_DISABLED,
        Reason.NO_TRITON,
        Reason.MISSING_CAPABILITY,
        Reason.FAILED,
    }
)

#: Backends that run the same kernel source; choosing one for the other is no fallback.
_SAME_KERNEL = {frozenset({"aot", "jit"})}


@dataclass(frozen=True)
class Facts:
    """What the machine offers for one call's device.

    ``device_type`` is the platform's name (``hip`` on ROCm even though torch calls the
    tensor ``cuda``); ``arch`` is ``sm_90``/``gfx942`` or None; ``capabilities`` holds
    the present ones and ``missing`` explains each absent one as (reason, detail).
    """

    device_type: str
    arch: str | None = None
    capabilities: frozenset[str] = frozenset()
    missing: Mapping[str, tuple[Reason, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    backend: str
    accepted: bool
    reason: Reason | None = None
    detail: str = ""

    def as_dict(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "accepted": self.accepted,
            "reason": self.reason.value if self.reason else None,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class Selection:
    """The outcome: ``chosen`` plus one ``Decision`` per backend, in consideration order.

    ``fallback`` is set when the backend the user forced, or the device's preferred one,
    could not run for a reason of this machine or call; ``fallback_from`` names it.
    """

    op: str
    chosen: str
    decisions: tuple[Decision, ...]
    forced: tuple[str, ...] | None = None
    fallback_from: Decision | None = None
    #: what ordered the backends beyond the declared priority (a measured size class), or ""
    basis: str = ""

    @property
    def fallback(self) -> bool:
        return self.fallback_from is not None

    def decision(self, backend: str) -> Decision:
        for d in self.decisions:
            if d.backend == backend:
                return d
        raise KeyError(backend)

    def trace_str(self) -> str:
        lines = [
            f"{self.op}: chose {self.chosen}" + (f" (forced {','.join(self.forced)})" if self.forced else "")
        ]
        for d in self.decisions:
            mark = (
                "chosen"
                if d.backend == self.chosen
                else ("ok" if d.accepted else d.reason.value if d.reason else "")
            )
            lines.append(f"  {d.backend:<10} {mark:<18} {d.detail}")
        if self.basis:
            lines.append(f"  order: {self.basis}")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, object]:
        return {
            "op": self.op,
            "chosen": self.chosen,
            "forced": list(self.forced) if self.forced else None,
            "fallback_from": self.fallback_from.as_dict() if self.fallback_from else None,
            "decisions": [d.as_dict() for d in self.decisions],
            "basis": self.basis or None,
        }


def arch_number(arch: str | None) -> int | None:
    """``sm_90a`` -> 90; anything that is not an sm arch -> None."""
    if not arch or not arch.startswith("sm_"):
        return None
    digits = "".join(ch for ch in arch[3:] if ch.isdigit())
    return int(digits) if digits else None


def _check(backend: BackendSpec, facts: Facts, dtype: str) -> Decision:
    req = backend.requires
    name = backend.name
    if facts.device_type not in req.devices:
        return Decision(
            name, False, Reason.WRONG_DEVICE, f"runs on {'/'.join(req.devices)}, not {facts.device_type}"
        )
    if facts.device_type == "cuda" and (req.sm_min is not None or req.sm_max is not None):
        sm = arch_number(facts.arch)
        lo, hi = req.sm_min or 0, req.sm_max or 10**6
        if sm is None or not lo <= sm <= hi:
            return Decision(
                name, False, Reason.WRONG_ARCH, f"needs {req.describe().split()[1]}, device is {facts.arch}"
            )
    if facts.device_type == "hip" and req.gfx and facts.arch not in req.gfx:
        return Decision(name, False, Reason.WRONG_ARCH, f"needs {'|'.join(req.gfx)}, device is {facts.arch}")
    if dtype not in req.dtypes:
        return Decision(name, False, Reason.WRONG_DTYPE, f"supports {', '.join(req.dtypes)}, not {dtype}")
    for cap in req.capabilities:
        cap = cap.format(device=facts.device_type)
        if cap not in facts.capabilities:
            reason, detail = facts.missing.get(cap, (Reason.MISSING_CAPABILITY, f"{cap} unavailable"))
            return Decision(name, False, reason, detail)
    return Decision(name, True, None, req.describe().replace("{device}", facts.device_type))


def select(
    spec: OpSpec,
    facts: Facts,
    *,
    dtype: str,
    forced: tuple[str, ...] | None = None,
    arg_rejections: Mapping[str, str] | None = None,
    failed: Mapping[str, str] | None = None,
    numel: int | None = None,
    preferred: tuple[str, str] | None = None,
) -> Selection:
    """Choose a backend for one call.

    Consideration order is ``forced`` (if given) then the device's priority. Each
    backend is checked for device, arch, dtype, machine capabilities, the call's
    arguments (``arg_rejections``, from predicates) and earlier run-time failures
    (``failed``); ``numel`` (the key tensor's size) picks a size class's priority where the
    spec declares one; ``preferred`` (backend, why), the backend measured fastest for this
    call's shape class (``measured.preferred``), goes first where the device's priority has it.
    With nothing acceptable the reference (``forward_native``) runs. The
    caller applies the fallback policy when ``Selection.fallback`` is set.
    """
    arg_rejections = arg_rejections or {}
    failed = failed or {}
    priority = spec.priority_for(facts.device_type, numel)
    basis = ""
    if preferred is not None and preferred[0] in priority:
        # the measured kernel first, with its other deliveries (aot <-> jit) in their order
        same = next((g for g in _SAME_KERNEL if preferred[0] in g), {preferred[0]})
        first = tuple(n for n in priority if n in same)
        priority = (*first, *(n for n in priority if n not in same))
        basis = f"{'/'.join(first)} first: {preferred[1]}"
    checked: dict[str, Decision] = {}
    for backend in spec.backends:
        d = _check(backend, facts, dtype)
        if d.accepted and backend.name in failed:
            d = Decision(backend.name, False, Reason.FAILED, failed[backend.name])
        elif d.accepted and backend.name in arg_rejections:
            d = Decision(backend.name, False, Reason.BAD_ARGUMENTS, arg_rejections[backend.name])
        checked[backend.name] = d
    checked[REFERENCE] = Decision(REFERENCE, True, None, "pure-torch forward_native")

    order = list(forced or ()) + [n for n in priority if n not in (forced or ())]
    chosen: str | None = None
    fallback_from: Decision | None = None
    decisions: list[Decision] = []
    for name in order:
        d = checked[name]
        if chosen is None and d.accepted:
            chosen = name
        elif d.accepted and forced and name not in forced:
            d = Decision(name, False, Reason.DISABLED_BY_USER, "not in the forced list")
        elif d.accepted:
            d = Decision(name, False, Reason.LOWER_PRIORITY, f"{chosen} ranks higher")
        decisions.append(d)
    for name, d in checked.items():
        if name in order or name == REFERENCE:
            continue
        if forced is not None:
            d = Decision(name, False, Reason.DISABLED_BY_USER, "not in the forced list") if d.accepted else d
        elif d.accepted:
            d = Decision(name, False, Reason.NOT_IN_PRIORITY, f"not in the {facts.device_type} priority list")
        decisions.append(d)
    if chosen is None:
        chosen = REFERENCE
    if REFERENCE not in order:
        decisions.append(
            checked[REFERENCE]
            if chosen == REFERENCE
            else Decision(REFERENCE, False, Reason.LOWER_PRIORITY, "used only when no backend can run")
        )

    # A fallback: the first wanted backend (forced, else the preferred one for this
    # device) could not run for a reason other than not applying to this device.
    wanted = (
        forced[0]
        if forced
        else next(
            (
                n
                for n in priority
                if checked[n].reason not in (Reason.WRONG_DEVICE, Reason.WRONG_ARCH, Reason.WRONG_DTYPE)
            ),
            None,
        )
    )
    if wanted is not None and wanted != chosen:
        wanted_decision = checked[wanted]
        one_kernel = any({wanted, chosen} <= group for group in _SAME_KERNEL)
        if (
            not wanted_decision.accepted
            and (forced or (wanted_decision.reason is not None and wanted_decision.reason.is_environmental))
            and not (one_kernel and not forced)
        ):
            fallback_from = wanted_decision
    return Selection(spec.name, chosen, tuple(decisions), forced, fallback_from, basis)
