"""The op registry: every operator's spec, keyed by ``group.op``, loaded without torch.

Op groups are listed in ``opmux.kernels.ops._catalog``; each group's ``op.py`` declares its
ops (``ops/_decl.py``) and imports without torch. See docs/adding-an-op.md.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .spec import OpSpec, Target

__all__ = [
    "TargetProblem",
    "all_ops",
    "get",
    "groups",
    "known_backends",
    "register",
    "resolve_target",
    "verify_targets",
]

_OPS: dict[str, OpSpec] = {}
_loaded = False


def register(spec: OpSpec) -> OpSpec:
    """Register ``spec``; registering an equal spec again is harmless, a different one is not."""
    existing = _OPS.get(spec.name)
    if existing is not None and existing != spec:
        raise ValueError(
            f"op {spec.name!r} is already registered with a different spec; "
            "rename the new op or remove the old registration"
        )
    _OPS[spec.name] = spec
    return spec


def _load_catalog() -> None:
    global _loaded
    if _loaded:
        return
    from .ops._catalog import GROUPS, decls

    for group in GROUPS:
        for decl in decls(importlib.import_module(f"opmux.kernels.ops.{group}.op")):
            register(decl.spec)
    _loaded = True


def all_ops() -> dict[str, OpSpec]:
    """Every registered op, sorted by name."""
    _load_catalog()
    return dict(sorted(_OPS.items()))


def groups() -> dict[str, tuple[str, ...]]:
    """Group name -> its op names."""
    out: dict[str, list[str]] = {}
    for name in all_ops():
        out.setdefault(name.partition(".")[0], []).append(name)
    return {g: tuple(v) for g, v in out.items()}


def known_backends() -> dict[str, tuple[str, ...]]:
    """Op name -> backend names (``reference`` included), for validating overrides."""
    return {name: (*spec.backend_names, "reference") for name, spec in all_ops().items()}


def get(name: str) -> OpSpec:
    """The spec of ``name``; an unknown op is a ValueError listing the valid ones."""
    _load_catalog()
    spec = _OPS.get(name)  # no sorted copy: this runs on every explain and forced call
    if spec is not None:
        return spec
    ops = all_ops()
    hint = ""
    if "." not in name:
        matches = [n for n in ops if n.endswith("." + name)]
        hint = f" (did you mean {', '.join(matches)}?)" if matches else ""
    raise ValueError(f"unknown op {name!r}{hint}; valid: {', '.join(ops)}")


def resolve_target(text: str) -> Any:
    """Import ``module`` and follow the attribute chain of ``module:attr.attr``."""
    target = Target.parse(text)
    obj: Any = importlib.import_module(target.module)
    for i, attr in enumerate(target.attrs):
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            done = ".".join(target.attrs[:i]) or "<module>"
            raise AttributeError(f"{text}: {done} has no attribute {attr!r}") from None
    return obj


@dataclass(frozen=True)
class TargetProblem:
    op: str
    backend: str
    target: str
    problem: str

    def __str__(self) -> str:
        return f"{self.op} [{self.backend}] {self.target}: {self.problem}"


def _targets() -> Iterable[tuple[str, str, str]]:
    for name, spec in all_ops().items():
        yield name, "reference", spec.reference
        for backend in spec.backends:
            yield name, backend.name, backend.target
            if backend.requires.predicate:
                yield name, f"{backend.name}.predicate", backend.requires.predicate


def verify_targets(*, import_modules: bool = True) -> list[TargetProblem]:
    """Check that every registered target's module is findable and its attributes resolve.

    ``find_spec`` runs first so a module missing from the wheel is reported as such;
    with ``import_modules`` the attribute chain is resolved too (this imports torch).
    """
    problems: list[TargetProblem] = []
    for op, backend, text in _targets():
        target = Target.parse(text)
        try:
            found = importlib.util.find_spec(target.module)
        except ModuleNotFoundError as exc:
            found, err = None, str(exc)
        else:
            err = "module not found"
        if found is None:
            problems.append(TargetProblem(op, backend, text, err))
            continue
        if import_modules:
            try:
                obj = resolve_target(text)
            except Exception as exc:  # report every failure, keep checking the rest
                problems.append(TargetProblem(op, backend, text, f"{type(exc).__name__}: {exc}"))
                continue
            if not callable(obj) and not callable(getattr(obj, "kernel", None)):  # a native loader
                problems.append(TargetProblem(op, backend, text, "not callable"))
    return problems
