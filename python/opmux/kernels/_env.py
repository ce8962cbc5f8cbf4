"""The one owner of every ``OPMUX_*`` environment variable: name, parser, default, docs.

Torch-free and dependency-free (only :mod:`opmux.kernels.overrides`, itself pure), so both the
public :mod:`opmux.kernels.config` and the JIT machinery (:mod:`opmux.kernels.jit.compile`)
read the same table instead of parsing ``OPMUX_JIT``, ``OPMUX_CACHE_DIR`` and
``OPMUX_CUDA_ARCHS`` each in their own way.

Precedence when reading a knob: a Python override set by :func:`scope` > the environment > the
default. An empty value counts as unset. :func:`scope` never exports its overrides to
``os.environ`` (that would leak into other threads and into every child process); code that
starts an opmux child process passes :func:`child_environ` instead.

>>> with scope(OPMUX_JIT_LOCK_TIMEOUT="5"):
...     get("OPMUX_JIT_LOCK_TIMEOUT")
5.0
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opmux.kernels.overrides import _parse_syntax

__all__ = [
    "CACHE_DIR",
    "CUDA_ARCHS",
    "DEFAULT_CACHE_DIR",
    "DEVICE_TYPES",
    "FALLBACK_POLICIES",
    "JIT",
    "KNOBS",
    "TORCH_KERNEL_DEVICES",
    "TUNED_CONFIG_DIR",
    "Knob",
    "child_environ",
    "get",
    "home",
    "on_change",
    "parse_cuda_archs",
    "scope",
]

#: Device types opmux knows; ``OPMUX_DEVICE`` accepts exactly these.
DEVICE_TYPES: tuple[str, ...] = ("cpu", "cuda", "hip", "xpu", "npu", "mps")
FALLBACK_POLICIES: tuple[str, ...] = ("silent", "warn", "error")
#: ``OPMUX_TORCH_KERNELS``: the devices whose library-op calls get the C++ kernels
TORCH_KERNEL_DEVICES: tuple[str, ...] = ("off", "cpu", "all")
#: ``OPMUX_SAMPLING_SMEM_CACHE``: where the native CUDA sampling kernels cache rows in shared memory
SAMPLING_SMEM_CACHE: tuple[str, ...] = ("auto", "one-wave", "waves", "off")
#: The default cache root, written only here.
DEFAULT_CACHE_DIR = "~/.cache/opmux/jit"

JIT = "OPMUX_JIT"
CACHE_DIR = "OPMUX_CACHE_DIR"
CUDA_ARCHS = "OPMUX_CUDA_ARCHS"
TUNED_CONFIG_DIR = "OPMUX_TUNED_CONFIG_DIR"

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


def home() -> str | None:
    """This user's home directory: ``$HOME`` when absolute, else the passwd entry, else None.

    Not ``os.path.expanduser``: with ``HOME=`` it yields ``/`` and with neither ``HOME`` nor
    a passwd entry (a container's arbitrary uid) it leaves ``~`` in place, a path relative to
    the working directory.
    """
    env_home = os.environ.get("HOME", "")
    if os.path.isabs(env_home):
        return env_home
    try:
        import pwd  # lazy: POSIX only, and only needed when HOME is unusable

        pw_home = pwd.getpwuid(os.getuid()).pw_dir
    except (ImportError, KeyError, OSError):
        return None
    return pw_home if os.path.isabs(pw_home) else None


def _path(raw: str) -> Path:
    # ``~`` is expanded here; a path that stays relative (no usable home) is refused by the
    # cache, which says why and what to set (see jit.compile.publish.cache_root).
    text = raw.strip()
    if text == "~" or text.startswith("~/"):
        base = home()
        if base is not None:
            return Path(base + text[1:])
        return Path(text)
    return Path(os.path.expanduser(text))


def _seconds(raw: str) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        raise ValueError("expected a number of seconds, e.g. 300") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError("expected a positive, finite number of seconds, e.g. 300")
    return value


def _overrides(raw: str) -> str:
    # Syntax only: op and backend names are checked by the selector against the registry.
    _parse_syntax(raw)
    return raw.strip()


def parse_cuda_archs(text: str) -> list[str]:
    """Parse an arch list (``"9.0a"``, ``"sm_80,sm_90a"``, ``"8.0;9.0 10.0f"``) to ``sm_XY[a|f]``.

    >>> parse_cuda_archs("8.0; sm_90a,10.0f")
    ['sm_80', 'sm_90a', 'sm_100f']
    """
    archs: list[str] = []
    for token in re.split(r"[,;\s]+", text.strip()):
        if not token:
            continue
        if token.startswith("sm_") and "." not in token:
            match = re.fullmatch(r"sm_(\d+)([af]?)", token)
            if match is None:
                raise ValueError(_bad_arch(token))
            arch = f"sm_{match.group(1)}{match.group(2)}"
        else:
            match = re.fullmatch(r"(\d+)\.(\d)([af]?)", token)
            if match is None:
                raise ValueError(_bad_arch(token))
            arch = f"sm_{match.group(1)}{match.group(2)}{match.group(3)}"
        if arch not in archs:
            archs.append(arch)
    if not archs:
        raise ValueError(_bad_arch(text))
    return archs


def _bad_arch(token: str) -> str:
    return (
        f"opmux: invalid CUDA arch {token!r} in ${CUDA_ARCHS}; use X.Y[a|f] or "
        f"sm_XY[a|f], separated by commas, e.g. '9.0a' or 'sm_80,sm_90a'"
    )


def _cuda_archs(raw: str) -> str:
    """The canonical ``sm_80,sm_90a`` form, so build keys do not depend on spelling."""
    try:
        return ",".join(parse_cuda_archs(raw))
    except ValueError:
        raise ValueError("expected sm_XY[a|f] or X.Y[a|f], e.g. sm_80, sm_90a, 9.0a") from None


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
        if self.type == "seconds" and isinstance(value, (int, float)) and not isinstance(value, bool):
            return self._parse(str(value), source="override")
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
        "What happens when the backend you forced (this variable's sibling "
        "`OPMUX_KERNEL_BACKEND`, `use_backends()` or `backend=`) cannot run here: `silent` falls "
        "back quietly, `warn` falls back and warns once per op, backend and reason, `error` "
        "raises `FallbackError`. A default (unforced) call whose preferred backend cannot run "
        "(no compiler, JIT cache unusable, JIT disabled) always falls back; it warns once "
        "under `warn` and `error` and is quiet under `silent`. Validated at the first op call.",
        _choice(FALLBACK_POLICIES),
        FALLBACK_POLICIES,
    ),
    Knob(
        JIT,
        "bool",
        "1",
        "Allow compiling native kernels on first use. With `0`, only the AOT library shipped "
        "in the wheel, modules already in the JIT cache and non-compiled backends are used.",
        _bool,
    ),
    Knob(
        CACHE_DIR,
        "path",
        DEFAULT_CACHE_DIR,
        "Where JIT-compiled modules are cached (`~` is expanded; the path must be absolute, so "
        "it never depends on the working directory). A cache that cannot be used (not a "
        "directory, read-only, no permission, no space, owned by someone else) makes the JIT "
        "backend unavailable with a `JitCacheUnavailable` that names the path, the cause and "
        "the fix; ops then fall back.",
        _path,
    ),
    Knob(
        "OPMUX_JIT_LOCK_TIMEOUT",
        "seconds",
        "360",
        "How long a process waits for another process's build of the same JIT module before "
        "giving up on the JIT backend (ops fall back). The waiter reports the holder's pid and "
        "since when every 10 s; a stopped (SIGSTOP) holder is reported and not waited for.",
        _seconds,
    ),
    Knob(
        "OPMUX_JIT_COMPILE_TIMEOUT",
        "seconds",
        "300",
        "Longest one compiler command may run; a compiler that exceeds it is killed (with its "
        "children) and the build fails with `CompileTimeout` (ops fall back).",
        _seconds,
    ),
    Knob(
        "OPMUX_COMM_TIMEOUT",
        "seconds",
        "300",
        "Longest a `comm` op waits for its peers, so a rank that died or never joined the call "
        "fails the others instead of hanging: on the CPU (gloo) they raise `CommError`; opmux's "
        "one-shot / two-shot CUDA kernels print the missing rank and trap (a sticky launch "
        "failure at the next sync: the CUDA context is lost, the process must exit). NCCL calls "
        "(the `torch` backend on CUDA) are bounded by NCCL's own watchdog and the group's "
        "timeout, not by this.",
        _seconds,
    ),
    Knob(
        "OPMUX_PROBE_TIMEOUT",
        "seconds",
        "30",
        "Longest platform detection waits for a vendor module's import (`torch_npu`); a hung "
        "import makes that device kind unusable, with the reason in `python -m opmux.kernels env`.",
        _seconds,
    ),
    Knob(
        "OPMUX_TORCH_KERNELS",
        "choice",
        "all",
        "Which devices get the torch-linked bridge (docs/architecture.md): the wheel ships it "
        "prebuilt for the torch builds of its target's `bridge_torch` in targets.toml (cuda: 2.14.1 "
        "and 2.13.0; cpu: 2.14.1 and 2.13.0+cpu) on CPython 3.12 and any tvm-ffi 0.1.x, loaded at "
        "once with nothing compiled; another torch build or Python gets one built once into the JIT "
        "cache, by one process, in the background (`python -m opmux.kernels env` says which is in "
        "use and why): C++ kernels for `torch.ops.opmux.*` that run the bound "
        "serving lane, `torch.ops.opmux.*`'s own entry from Python (in place of torch's, which costs "
        "about 0.4 us per scalar argument), and the default calls' entry into their lanes (C in place "
        "of tvm-ffi's argument and result conversion). `all` (CPU and CUDA), `cpu`, or `off` (the "
        "Python kernels, torch's entry, tvm-ffi's conversion).",
        _choice(TORCH_KERNEL_DEVICES),
        TORCH_KERNEL_DEVICES,
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
        CUDA_ARCHS,
        "archs",
        None,
        "CUDA archs for JIT builds, e.g. `sm_90a` or `8.0;9.0` (unset: the local device's arch). "
        "Normalised to `sm_80,sm_90a` form.",
        _cuda_archs,
    ),
    Knob(
        TUNED_CONFIG_DIR,
        "path",
        None,
        "A directory of tuned launch configurations, searched before the tables shipped in the "
        "wheel (`opmux/kernels/configs/<op>/`): first `DIR/<op>/`, then `DIR` itself, so a "
        "folder of vLLM / SGLang tuned files works unchanged (`N=..,K=..,device_name=..,"
        "dtype=fp8_w8a8,block_shape=[128,128].json`). `python -m opmux.kernels.tune` writes them. "
        "A malformed file is skipped with a warning naming it. Read once, at the first lookup "
        "(`opmux.kernels.tuned.refresh()` rereads it).",
        _path,
    ),
    Knob(
        "OPMUX_JIT_VERBOSE",
        "bool",
        "0",
        "Print compiler commands and output for JIT builds.",
        _bool,
    ),
    Knob(
        "OPMUX_SAMPLING_SMEM_CACHE",
        "choice",
        "auto",
        "Where the native CUDA sampling kernels cache each block's slice of a row in shared memory "
        "(the row is then read from global memory once): `auto` where the cached blocks fit one "
        "wave, or over several waves (two blocks an SM) for the top-k filters and, for the other "
        "ops, where the rows exceed the L2 cache; "
        "`one-wave` only the first; `waves` over several waves whatever the rows' size; `off` "
        "never (every pass reads global memory). Read once per process by the kernels' launcher "
        "(another value: a ValueError naming these at the first call); the A/B of "
        "`benchmarks/bench_sampling.py` (docs/benchmarks/sampling_h200.md).",
        _choice(SAMPLING_SMEM_CACHE),
        SAMPLING_SMEM_CACHE,
    ),
)

# Python overrides set by scope(); already validated values. A plain dict is enough: scope() is
# meant for tests and setup code, not for concurrent use from several threads.
_overrides_set: dict[str, Any] = {}


def knob(name: str) -> Knob:
    try:
        return KNOBS[name]
    except KeyError:
        raise ValueError(f"unknown opmux setting {name!r}; valid: {', '.join(KNOBS)}") from None


def get(name: str, *, env: Mapping[str, str] | None = None) -> Any:
    """The current value of knob ``name``. With ``env`` given, read only that mapping (no
    Python overrides), which lets pure callers such as ``platform.detect_from`` stay pure."""
    k = knob(name)
    if env is None and name in _overrides_set:
        return _overrides_set[name]
    return k.read(env)


def overridden(name: str) -> bool:
    """Whether :func:`scope` currently sets ``name``."""
    return name in _overrides_set


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
    default, ignoring the environment"). Nothing is written to ``os.environ`` for the block:
    every opmux reader (the JIT loader included) reads through :func:`get`. On exit the Python
    overrides are restored, and so is any ``OPMUX_*`` variable that code inside the block
    changed in ``os.environ`` (only those: a variable the block left alone is not rewritten).
    """
    coerced = {name: knob(name).coerce(value) for name, value in overrides.items()}
    saved_overrides = dict(_overrides_set)
    saved_env = {k: v for k, v in os.environ.items() if k.startswith("OPMUX_")}
    _overrides_set.update(coerced)
    _notify()
    try:
        yield
    finally:
        _overrides_set.clear()
        _overrides_set.update(saved_overrides)
        for key in [k for k in os.environ if k.startswith("OPMUX_")]:
            if key not in saved_env:
                del os.environ[key]
        for key, value in saved_env.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
        _notify()


def to_env(value: Any) -> str:
    """The environment spelling of a parsed value."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def child_environ(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``os.environ`` (or ``base``) plus the :func:`scope` overrides in force, for a child
    process that must see the same settings as this one."""
    env = dict(os.environ if base is None else base)
    for name, value in _overrides_set.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = to_env(value)
    return env
