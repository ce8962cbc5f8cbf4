"""Every ``OPMUX_*`` environment variable, in one typed registry.

Why a registry: each variable is declared once (name, type, default, doc), read at call time (so
a test or a ``scope()`` can change it without reloading modules) and validated when read (a bad
value is a ``ValueError`` naming the variable, the value and the valid choices, never a silent
default). ``docs/env.md`` is generated from the same table, so the docs cannot omit a variable.

Precedence when reading a knob: a Python override set by :func:`scope` > the environment >
the default. An empty value (``OPMUX_JIT=``) counts as unset, matching the shell idiom for
clearing a variable. Each default is written once, as the string a user would set, and is
parsed by the same code as the environment, so it is validated too.

>>> with scope(OPMUX_FALLBACK="error"):
...     fallback()
'error'
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

from opmux.kernels.jit.compile.publish import DEFAULT_CACHE_DIR as _DEFAULT_CACHE_DIR
from opmux.kernels.overrides import _parse_syntax

__all__ = [
    "DEVICE_TYPES",
    "FALLBACK_POLICIES",
    "KNOBS",
    "Knob",
    "cache_dir",
    "cuda_archs",
    "describe",
    "device",
    "fallback",
    "get",
    "jit",
    "jit_verbose",
    "kernel_backend",
    "render_env_md",
    "scope",
    "trace",
    "write_env_md",
]

#: Device types opmux knows; ``OPMUX_DEVICE`` accepts exactly these (``platform`` re-exports it).
DEVICE_TYPES: tuple[str, ...] = ("cpu", "cuda", "hip", "xpu", "npu", "mps")
FALLBACK_POLICIES: tuple[str, ...] = ("silent", "warn", "error")
FallbackPolicy = Literal["silent", "warn", "error"]

_TRUE = ("1", "true", "on", "yes")
_FALSE = ("0", "false", "off", "no")


def _bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"expected one of {', '.join(_TRUE + _FALSE)}")


def _choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return value

    return parse


def _path(raw: str) -> Path:
    return Path(os.path.expanduser(raw.strip()))


def _overrides(raw: str) -> str:
    # Syntax only: op and backend names are checked by the selector against the registry,
    # which this torch-free, registry-free module must not import.
    _parse_syntax(raw)
    return raw.strip()


# Same grammar as jit.compile.toolchain.parse_cuda_archs: sm_XY[a|f] or X.Y[a|f].
_ARCH_RE = re.compile(r"\A(?:sm_(\d+)([af]?)|(\d+)\.(\d)([af]?))\Z")


def _cuda_archs(raw: str) -> str:
    """Accept ``sm_80``, ``sm_90a``, ``8.0``, ``10.0f``, separated by ',', ';' or spaces; return
    the canonical ``sm_80,sm_90a`` so build keys do not depend on spelling."""
    out: list[str] = []
    for token in re.split(r"[,;\s]+", raw.strip()):
        if not token:
            continue
        match = _ARCH_RE.match(token)
        if not match:
            raise ValueError(f"bad arch {token!r}; expected sm_XY[a|f] or X.Y[a|f], e.g. sm_80, sm_90a, 9.0a")
        if match[1] is not None:
            arch = f"sm_{match[1]}{match[2]}"
        else:
            arch = f"sm_{match[3]}{match[4]}{match[5]}"
        if arch not in out:
            out.append(arch)
    if not out:
        raise ValueError("no arch named; expected e.g. sm_80,sm_90a")
    return ",".join(out)


@dataclass(frozen=True)
class Knob:
    """One environment variable: its parser, its default (as a user would write it) and docs."""

    name: str
    type: str
    default: str | None
    doc: str
    parse: Callable[[str], Any]
    choices: tuple[str, ...] = ()

    def read(self, env: Mapping[str, str] | None = None) -> Any:
        """The validated value from ``env`` (``os.environ`` when None); no Python overrides."""
        raw = (os.environ if env is None else env).get(self.name)
        if raw is None or not raw.strip():
            return self.default_value()
        return self._parse(raw, source="environment")

    def default_value(self) -> Any:
        return None if self.default is None else self._parse(self.default, source="default")

    def coerce(self, value: Any) -> Any:
        """Validate a Python override: strings go through the parser, typed values are checked."""
        if value is None:
            return self.default_value()
        if isinstance(value, str):
            return self.default_value() if not value.strip() else self._parse(value, source="override")
        if self.type == "bool" and isinstance(value, bool):
            return value
        if self.type == "path" and isinstance(value, os.PathLike):
            return _path(os.fspath(value))
        raise ValueError(
            f"{self.name}: bad override {value!r} ({type(value).__name__}); expected {self.type}"
        )

    def _parse(self, raw: str, *, source: str) -> Any:
        try:
            return self.parse(raw)
        except ValueError as err:
            raise ValueError(f"{self.name}={raw!r} (from {source}) is invalid: {err}") from None


def _knobs(*knobs: Knob) -> dict[str, Knob]:
    return {k.name: k for k in knobs}


KNOBS: Mapping[str, Knob] = _knobs(
    Knob(
        "OPMUX_KERNEL_BACKEND",
        "overrides",
        "",
        "Force backends per op, in the override grammar: `rule(;rule)*`, "
        "rule = `pattern=backend(,backend)*`, pattern = `group.op`, `group.*` or `*`. "
        "Example: `layernorm.rmsnorm=triton,jit;activation.*=torch`. The most specific pattern "
        "wins; unknown ops or backends are an error naming the valid ones.",
        _overrides,
    ),
    Knob(
        "OPMUX_FALLBACK",
        "choice",
        "warn",
        "What happens when a forced backend cannot run here: `silent` falls back quietly, "
        "`warn` falls back and warns once per op and backend, `error` raises.",
        _choice(FALLBACK_POLICIES),
        FALLBACK_POLICIES,
    ),
    Knob(
        "OPMUX_JIT",
        "bool",
        "1",
        "Allow compiling native kernels on first use. With `0`, only the AOT library shipped "
        "in the wheel and non-compiled backends are used.",
        _bool,
    ),
    Knob(
        "OPMUX_CACHE_DIR",
        "path",
        _DEFAULT_CACHE_DIR,
        "Where JIT-compiled modules are cached (`~` is expanded).",
        _path,
    ),
    Knob(
        "OPMUX_TRACE",
        "bool",
        "0",
        "Record every op call with the backend chosen and why (see `python -m opmux.kernels explain`).",
        _bool,
    ),
    Knob(
        "OPMUX_DEVICE",
        "choice",
        None,
        "Force the detected device type instead of probing torch (unset: detect).",
        _choice(DEVICE_TYPES),
        DEVICE_TYPES,
    ),
    Knob(
        "OPMUX_CUDA_ARCHS",
        "archs",
        None,
        "CUDA archs for JIT builds, e.g. `sm_90a` or `8.0;9.0` (unset: the local device's arch). "
        "Normalised to `sm_80,sm_90a` form.",
        _cuda_archs,
    ),
    Knob(
        "OPMUX_JIT_VERBOSE",
        "bool",
        "0",
        "Print compiler commands and output for JIT builds.",
        _bool,
    ),
)

# Python overrides set by scope(); already validated values. A plain dict is enough: scope() is
# meant for tests and setup code, not for concurrent use from several threads.
_overrides_set: dict[str, Any] = {}


def _knob(name: str) -> Knob:
    try:
        return KNOBS[name]
    except KeyError:
        raise ValueError(f"unknown opmux setting {name!r}; valid: {', '.join(KNOBS)}") from None


def get(name: str, *, env: Mapping[str, str] | None = None) -> Any:
    """The current value of knob ``name``. With ``env`` given, read only that mapping (no
    Python overrides), which lets pure callers such as ``platform.detect_from`` stay pure."""
    knob = _knob(name)
    if env is None and name in _overrides_set:
        return _overrides_set[name]
    return knob.read(env)


# Typed accessors: what the rest of the package calls.
def kernel_backend() -> str:
    return cast(str, get("OPMUX_KERNEL_BACKEND"))


def fallback() -> FallbackPolicy:
    return cast(FallbackPolicy, get("OPMUX_FALLBACK"))


def jit() -> bool:
    return cast(bool, get("OPMUX_JIT"))


def cache_dir() -> Path:
    return cast(Path, get("OPMUX_CACHE_DIR"))


def trace() -> bool:
    return cast(bool, get("OPMUX_TRACE"))


def device() -> str | None:
    return cast("str | None", get("OPMUX_DEVICE"))


def cuda_archs() -> str | None:
    return cast("str | None", get("OPMUX_CUDA_ARCHS"))


def jit_verbose() -> bool:
    return cast(bool, get("OPMUX_JIT_VERBOSE"))


_listeners: list[Callable[[], None]] = []


def on_change(listener: Callable[[], None]) -> None:
    """Call ``listener`` when a ``scope`` starts or ends (values cached by readers go stale)."""
    _listeners.append(listener)


def _notify() -> None:
    for listener in list(_listeners):
        listener()


@contextlib.contextmanager
def scope(**overrides: Any) -> Iterator[None]:
    """Override knobs inside a ``with`` block, e.g. ``scope(OPMUX_FALLBACK="error")``.

    Values are validated on entry (a str is parsed like the environment; ``None`` means "the
    default, ignoring the environment"). On exit both the Python overrides and every ``OPMUX_*``
    variable in ``os.environ`` are restored, so a test that sets the environment inside the
    block leaks nothing. Overrides are also exported to ``os.environ`` for the block, so the JIT
    loader and child processes see them.
    """
    coerced = {name: _knob(name).coerce(value) for name, value in overrides.items()}
    saved_overrides = dict(_overrides_set)
    saved_env = {k: v for k, v in os.environ.items() if k.startswith("OPMUX_")}
    _overrides_set.update(coerced)
    for name, value in overrides.items():
        # export too: the JIT loader (which depends on nothing else in opmux) and child
        # processes read the environment, and must see what this block sets
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = _to_env(coerced[name])
    _notify()
    try:
        yield
    finally:
        _overrides_set.clear()
        _overrides_set.update(saved_overrides)
        for key in [k for k in os.environ if k.startswith("OPMUX_")]:
            if key not in saved_env:
                del os.environ[key]
        os.environ.update(saved_env)
        _notify()


def _to_env(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _jsonable(value: Any) -> Any:
    return str(value) if isinstance(value, Path) else value


def describe() -> list[dict[str, Any]]:
    """One JSON-ready entry per knob: name, type, default, choices, current, source, error, doc.

    An invalid environment value does not raise here (the CLI must still list everything):
    ``current`` is then None and ``error`` holds the message.
    """
    rows: list[dict[str, Any]] = []
    for knob in KNOBS.values():
        row: dict[str, Any] = {
            "name": knob.name,
            "type": knob.type,
            "default": knob.default,
            "choices": list(knob.choices),
            "current": None,
            "source": "default",
            "error": None,
            "doc": knob.doc,
        }
        if knob.name in _overrides_set:
            row["source"] = "override"
        elif (os.environ.get(knob.name) or "").strip():
            row["source"] = "environment"
        try:
            row["current"] = _jsonable(get(knob.name))
        except ValueError as err:
            row["error"] = str(err)
        rows.append(row)
    return rows


def render_env_md() -> str:
    """The text of ``docs/env.md``; machine-independent (no current values)."""
    lines = [
        "# Environment variables",
        "",
        "<!-- Generated from opmux.kernels.config by `write_env_md()`; do not edit. Regenerate with",
        "     PYTHONPATH=python python -c 'from opmux.kernels import config; config.write_env_md()' -->",
        "",
        "Every variable is read when used and validated when read: a bad value is an error",
        "naming the variable, the value and the valid choices. An empty value counts as unset.",
        "Booleans accept `1/0`, `true/false`, `on/off`, `yes/no`.",
        "",
        "| variable | type | default | description |",
        "|---|---|---|---|",
    ]
    for row in describe():
        kind = row["type"]
        if row["choices"]:
            kind += " (" + r" \| ".join(row["choices"]) + ")"
        default = "(unset)" if row["default"] is None else f"`{row['default']}`"
        if row["default"] == "":
            default = "(empty)"
        lines.append(f"| `{row['name']}` | {kind} | {default} | {row['doc']} |")
    return "\n".join(lines) + "\n"


def write_env_md(path: str | os.PathLike[str] = "docs/env.md") -> Path:
    """Write :func:`render_env_md` to ``path`` (relative to the working directory: run it from
    the repository root). Returns the path written."""
    target = Path(path)
    target.write_text(render_env_md(), encoding="utf-8")
    return target
