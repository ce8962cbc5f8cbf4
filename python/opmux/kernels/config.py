"""Every ``OPMUX_*`` environment variable, typed: the public face of :mod:`opmux.kernels._env`.

The table itself (names, parsers, defaults, docs) lives in the torch-free, dependency-free
``_env`` module, which the JIT machinery reads too, so each variable has exactly one owner.

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

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, cast

from opmux.kernels import _env
from opmux.kernels._env import (
    DEVICE_TYPES,
    FALLBACK_POLICIES,
    KNOBS,
    Knob,
    on_change,
    scope,
)

__all__ = [
    "DEVICE_TYPES",
    "FALLBACK_POLICIES",
    "KNOBS",
    "Knob",
    "cache_dir",
    "compile_timeout",
    "cuda_archs",
    "describe",
    "device",
    "fallback",
    "get",
    "jit",
    "jit_verbose",
    "kernel_backend",
    "lock_timeout",
    "on_change",
    "probe_timeout",
    "render_env_md",
    "scope",
    "trace",
    "write_env_md",
]

FallbackPolicy = Literal["silent", "warn", "error"]


def get(name: str, *, env: Mapping[str, str] | None = None) -> Any:
    """The current value of knob ``name``. With ``env`` given, read only that mapping (no
    Python overrides), which lets pure callers such as ``platform.detect_from`` stay pure."""
    return _env.get(name, env=env)


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


def lock_timeout() -> float:
    return cast(float, get("OPMUX_JIT_LOCK_TIMEOUT"))


def compile_timeout() -> float:
    return cast(float, get("OPMUX_JIT_COMPILE_TIMEOUT"))


def comm_timeout() -> float:
    return cast(float, get("OPMUX_COMM_TIMEOUT"))


def probe_timeout() -> float:
    return cast(float, get("OPMUX_PROBE_TIMEOUT"))


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
        if _env.overridden(knob.name):
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
