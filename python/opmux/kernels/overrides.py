"""The one override grammar, shared by ``OPMUX_KERNEL_BACKEND``, the context manager and the
per-call ``backend=`` argument.

Grammar (whitespace around tokens is ignored; the empty string means "no overrides")::

    overrides := rule (";" rule)*
    rule      := pattern "=" backend ("," backend)*
    pattern   := group "." op  |  group ".*"  |  "*"
    name      := [A-Za-z_][A-Za-z0-9_]*        (group, op and backend are names)

Example: ``layernorm.rmsnorm=triton,jit; activation.*=torch``.

Why one strict parser: a typo in an environment variable that is silently ignored is the worst
kind of override, since the user believes a backend is forced when it is not. So every token is
checked when the text is read, and an error names the bad token, the rule it sits in and the
valid choices. Syntax checks need nothing; name checks need ``known`` (op name -> its backend
names), which the registry supplies, so this module stays free of the registry and of torch.

>>> known = {"layernorm.rmsnorm": ("torch", "triton", "jit"), "activation.silu_and_mul": ("torch",)}
>>> o = parse_overrides(" layernorm.*= triton ,jit ; *=torch", known=known)
>>> str(o)
'layernorm.*=triton,jit;*=torch'
>>> o.backends_for("layernorm.rmsnorm"), o.backends_for("activation.silu_and_mul")
(('triton', 'jit'), ('torch',))
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "OverrideError",
    "OverrideRule",
    "Overrides",
    "forced_backend",
    "parse_overrides",
]

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_NAME_RE = re.compile(rf"\A{_NAME}\Z")
_PATTERN_RE = re.compile(rf"\A(?:\*|{_NAME}\.(?:{_NAME}|\*))\Z")
_GRAMMAR_HINT = "expected 'group.op=backend[,backend...]', 'group.*=...' or '*=...', rules separated by ';'"


class OverrideError(ValueError):
    """A bad override string. Carries the pieces a caller (or the CLI) may want to render.

    ``token`` is the offending token exactly as written (stripped), ``where`` says which rule,
    ``choices`` lists what would have been valid there (may be empty for pure syntax errors).
    Picklable, so it survives multiprocessing and pytest-xdist.
    """

    def __init__(
        self, problem: str, *, token: str, where: str, choices: Sequence[str] = (), hint: str = ""
    ) -> None:
        self.problem = problem
        self.token = token
        self.where = where
        self.choices = tuple(choices)
        self.hint = hint
        message = f"{problem}: {token!r} {where}"
        if self.choices:
            message += f"; valid choices: {', '.join(self.choices)}"
        if hint:
            message += f"; {hint}"
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_error, (type(self), self.problem, self.token, self.where, self.choices, self.hint))


def _rebuild_error(
    cls: type[OverrideError], problem: str, token: str, where: str, choices: tuple[str, ...], hint: str
) -> OverrideError:
    return cls(problem, token=token, where=where, choices=choices, hint=hint)


@dataclass(frozen=True)
class OverrideRule:
    """One ``pattern=backend,...`` rule. Syntax is checked on construction, names are not
    (that needs the registry; see :func:`parse_overrides`)."""

    pattern: str
    backends: tuple[str, ...]

    def __post_init__(self) -> None:
        where = f"in rule {str(self)!r}"
        _check_pattern_syntax(self.pattern, where=where)
        _check_backend_list(self.backends, where=where)

    @property
    def specificity(self) -> int:
        """2 for ``group.op``, 1 for ``group.*``, 0 for ``*``."""
        if self.pattern == "*":
            return 0
        return 1 if self.pattern.endswith(".*") else 2

    def matches(self, op: str) -> bool:
        if self.pattern == "*":
            return True
        if self.pattern.endswith(".*"):
            return op.partition(".")[0] == self.pattern[:-2]
        return op == self.pattern

    def __str__(self) -> str:
        return f"{self.pattern}={','.join(self.backends)}"


@dataclass(frozen=True)
class Overrides:
    """An ordered list of rules; ``str()`` gives the canonical form, which ``parse`` reads back
    to an equal value."""

    rules: tuple[OverrideRule, ...] = ()

    @classmethod
    def parse(cls, text: str, *, known: Mapping[str, Collection[str]]) -> Overrides:
        return parse_overrides(text, known=known)

    def backends_for(self, op: str) -> tuple[str, ...] | None:
        """The forced backends for ``op``, or None when no rule matches.

        The most specific pattern wins (``group.op`` > ``group.*`` > ``*``), so a broad default
        can be refined per op regardless of order; among equally specific matches the last rule
        wins, as later settings conventionally replace earlier ones. A ``group.*`` or ``*`` rule
        may name a backend that this particular op lacks (it was accepted because another op
        of the group has it); the selector decides what that means under the fallback policy.
        """
        best: OverrideRule | None = None
        for rule in self.rules:
            if rule.matches(op) and (best is None or rule.specificity >= best.specificity):
                best = rule
        return None if best is None else best.backends

    def __bool__(self) -> bool:
        return bool(self.rules)

    def __str__(self) -> str:
        return ";".join(str(rule) for rule in self.rules)


def parse_overrides(text: str, *, known: Mapping[str, Collection[str]]) -> Overrides:
    """Parse and validate ``text`` against ``known`` (op name ``"group.op"`` -> backend names).

    Raises :class:`OverrideError` (a ``ValueError``) naming the bad token, its rule and the valid
    choices: unknown op, group or backend; an empty or duplicated backend; a missing ``=``; an
    empty or malformed pattern; stray characters; an empty rule (e.g. a trailing ``;``).
    Rules are checked left to right, so the first bad token is the one reported.
    """
    if not isinstance(text, str):
        raise TypeError(f"override text must be a str, got {type(text).__name__}")
    ops = _check_known(known)
    groups: dict[str, list[str]] = {}
    for op in ops:
        groups.setdefault(op.partition(".")[0], []).append(op)

    def resolve(pattern: str, where: str) -> tuple[str, list[str]]:
        """(what the pattern covers, valid backends), or an error for an unknown op/group."""
        if pattern == "*":
            matched = ops
        elif pattern.endswith(".*"):
            group = pattern[:-2]
            if group not in groups:
                choices = [f"{g}.*" for g in sorted(groups)]
                raise OverrideError(
                    "unknown op group",
                    token=group,
                    where=where,
                    choices=choices,
                    hint=_did_you_mean(pattern, choices),
                )
            matched = groups[group]
        else:
            if pattern not in known:
                raise OverrideError(
                    "unknown op", token=pattern, where=where, choices=ops, hint=_did_you_mean(pattern, ops)
                )
            matched = [pattern]
        label = pattern if len(matched) == 1 else f"any op matched by {pattern!r}"
        return label, sorted({b for op in matched for b in known[op]})

    return Overrides(tuple(_parse_syntax(text, resolve=resolve)))


def forced_backend(
    value: str | Sequence[str], *, op: str, known_backends: Collection[str]
) -> tuple[str, ...]:
    """Validate a per-call ``backend=`` argument for ``op``: ``"triton"``, ``"triton,jit"`` or a
    sequence of names. Returns the backends in preference order; errors as for overrides."""
    where = f"in backend= argument for {op}"
    if isinstance(value, str):
        if not value.strip():
            raise OverrideError(
                "empty backend list", token=value, where=where, choices=sorted(known_backends)
            )
        names = [part.strip() for part in value.split(",")]
    elif isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        names = [v.strip() for v in value]
    else:
        raise TypeError(f"backend= must be a str or a sequence of str, got {value!r}")
    valid = sorted(known_backends)
    _check_backend_list(tuple(names), where=where, choices=valid)
    for name in names:
        if name not in known_backends:
            raise OverrideError(
                f"unknown backend for {op}",
                token=name,
                where=where,
                choices=valid,
                hint=_did_you_mean(name, valid),
            )
    return tuple(names)


# -- internals ---------------------------------------------------------------------------------


_Resolver = Callable[[str, str], "tuple[str, list[str]]"]


def _parse_syntax(text: str, *, resolve: _Resolver | None = None) -> list[OverrideRule]:
    """Parse ``text``; with ``resolve`` (pattern, where -> label, valid backends) names are
    checked too. Without it this is syntax only, which ``config`` uses to validate
    ``OPMUX_KERNEL_BACKEND`` when read: it has no registry to check names against."""
    if not text.strip():
        return []
    pieces = text.split(";")
    rules: list[OverrideRule] = []
    for index, piece in enumerate(pieces, start=1):
        raw = piece.strip()
        where = _where(index, len(pieces), raw)
        if not raw:
            raise OverrideError(
                "empty rule (stray ';')", token=piece, where=f"{where} of {text!r}", hint=_GRAMMAR_HINT
            )
        if "=" not in raw:
            raise OverrideError("missing '='", token=raw, where=where, hint=_GRAMMAR_HINT)
        pattern, _, rhs = raw.partition("=")
        pattern = pattern.strip()
        if "=" in rhs:
            extra = rhs[rhs.index("=") :].strip()
            raise OverrideError("more than one '=' in a rule", token=extra, where=where, hint=_GRAMMAR_HINT)
        _check_pattern_syntax(pattern, where=where)
        label, valid = resolve(pattern, where) if resolve else (pattern, [])
        backends = tuple(part.strip() for part in rhs.split(","))
        _check_backend_list(backends, where=where, choices=valid)
        for backend in backends if resolve else ():
            if backend not in valid:
                raise OverrideError(
                    f"unknown backend for {label}",
                    token=backend,
                    where=where,
                    choices=valid,
                    hint=_did_you_mean(backend, valid),
                )
        rules.append(OverrideRule(pattern, backends))
    return rules


def _check_pattern_syntax(pattern: str, *, where: str) -> None:
    if not pattern:
        raise OverrideError("empty pattern", token=pattern, where=where, hint=_GRAMMAR_HINT)
    if _PATTERN_RE.match(pattern):
        return
    if _NAME_RE.match(pattern):
        problem, hint = "pattern needs a group and an op", f"did you mean '{pattern}.*'?"
    elif pattern.count(".") > 1:
        problem, hint = "pattern has more than one '.'", "expected 'group.op', 'group.*' or '*'"
    else:
        problem, hint = "bad pattern", f"{_GRAMMAR_HINT}; names are letters, digits and '_'"
    raise OverrideError(problem, token=pattern, where=where, hint=hint)


def _check_backend_list(backends: tuple[str, ...], *, where: str, choices: Sequence[str] = ()) -> None:
    if all(not b for b in backends):
        raise OverrideError("empty backend list", token=",".join(backends), where=where, choices=choices)
    seen: set[str] = set()
    for backend in backends:
        if not backend:
            raise OverrideError(
                "empty backend name (stray ',')", token=",".join(backends), where=where, choices=choices
            )
        if not _NAME_RE.match(backend):
            raise OverrideError(
                "bad backend name",
                token=backend,
                where=where,
                choices=choices,
                hint="names are letters, digits and '_'; separate backends with ','",
            )
        if backend in seen:
            raise OverrideError("duplicate backend", token=backend, where=where, choices=choices)
        seen.add(backend)


def _check_known(known: Mapping[str, Collection[str]]) -> list[str]:
    ops = sorted(known)
    for op in ops:
        group, dot, name = op.partition(".")
        if not (dot and _NAME_RE.match(group) and _NAME_RE.match(name)):
            raise ValueError(f"known op names must look like 'group.op', got {op!r}")
    return ops


def _where(index: int, count: int, rule: str) -> str:
    return f"in rule {index} of {count} ({rule!r})"


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"did you mean {close[0]!r}?" if close else ""
