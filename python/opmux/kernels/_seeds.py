"""The seeds' selection API: ``select_kernel``, ``get_kernel``, ``clear_cache``.

Code written against the seeds (``sglang.kernels``) asks three questions: which kernel runs
op X on platform P, give me a callable for op X (optionally of one named backend), and forget
what you chose. These answer them on top of the one selector (``selector.select`` over
``facts.detect_facts``, exactly what ``explain`` and every call use), so the answers can never
disagree with what a call does. Nothing here imports torch until a callable is asked for.

Migration from ``sglang.kernels`` (docs/compat.md):

* ``select_kernel(op, platform=None)`` returns the chosen backend's name (``"jit"``,
  ``"triton"``, ``"torch"``, ...), not a kernel object; ``select_kernel(...).trace`` is not
  there, ask ``explain_kernel`` (the full ``Selection``) for why.
* ``get_kernel(op)`` returns opmux's public function (it dispatches per call, the dtype and
  device of the arguments choose); ``get_kernel(op, backend)`` returns that backend with the
  op's one argument contract, raising ``BackendUnavailable`` when it cannot run here (no
  silent fallback: you asked for it by name).
* ``clear_cache()`` forgets every cached choice and re-reads ``OPMUX_KERNEL_BACKEND`` /
  ``OPMUX_FALLBACK`` (it is ``refresh()``); the next call selects again.
* Op names are ``group.op`` (``layernorm.rmsnorm``); a bare name that is unique across groups
  (``rmsnorm``) is accepted too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .platform import Platform
    from .selector import Selection

__all__ = ["clear_cache", "explain_kernel", "get_kernel", "resolve_op", "select_kernel"]

#: (op, device type, arch, dtype) -> Selection, valid for one dispatch-state generation
_SELECTIONS: dict[tuple[str, str, str | None, str], Selection] = {}
_GENERATION: list[int] = [-1]


def resolve_op(op: str) -> str:
    """``group.op`` for ``op``; a bare op name unique across groups is accepted."""
    from . import registry

    if "." not in op:
        matches = [name for name in registry.all_ops() if name.partition(".")[2] == op]
        if len(matches) == 1:
            return matches[0]
    return registry.get(op).name  # ValueError listing the valid names


def _device(platform: Platform | str | None) -> tuple[str, str | None]:
    """(device type, arch) of ``platform``: a ``Platform``, a device type (``"cpu"``,
    ``"cuda"``, optionally ``"cuda:sm_90"``), or None for this machine's default device."""
    from . import platform as _platform

    if platform is None:
        plat = _platform.detect()
        return plat.device_type, plat.arch
    if isinstance(platform, str):
        kind, _, arch = platform.partition(":")
        if not kind:
            raise ValueError(f"select_kernel: empty platform {platform!r}; e.g. 'cpu', 'cuda', 'cuda:sm_90'")
        if not arch and kind != "cpu":
            plat = _platform.detect()
            return kind, plat.arch if plat.device_type == kind else None
        return kind, arch or None
    if isinstance(platform, _platform.Platform):
        return platform.device_type, platform.arch
    raise TypeError(
        f"select_kernel: platform must be an opmux.kernels.platform.Platform, a device type string "
        f"or None, got {type(platform).__name__}"
    )


def explain_kernel(op: str, platform: Platform | str | None = None, *, dtype: str | None = None) -> Selection:
    """The full selection behind :func:`select_kernel` (every backend with its decision)."""
    from . import _dispatch_state, facts, registry
    from .selector import select

    name = resolve_op(op)
    device, arch = _device(platform)
    spec = registry.get(name)
    dtypes = {d for b in spec.backends for d in b.requires.dtypes}
    if dtype is None:  # the usual serving dtype the op takes, like explain()
        dtype = next(
            (d for d in (("float32",) if device == "cpu" else ("bfloat16",)) + ("int32",) if d in dtypes),
            "float32",
        )
    elif dtype.removeprefix("torch.") not in dtypes:
        raise ValueError(f"{name}: unsupported dtype {dtype!r}; supported: {', '.join(sorted(dtypes))}")
    dtype = dtype.removeprefix("torch.")
    gen = _dispatch_state.generation()
    if _GENERATION[0] != gen:
        _SELECTIONS.clear()
        _GENERATION[0] = gen
    key = (name, device, arch, dtype)
    sel = _SELECTIONS.get(key)
    if sel is None:
        forced = _dispatch_state.backends_for(name)
        sel = select(spec, facts.detect_facts(device, arch), dtype=dtype, forced=forced)
        if _dispatch_state.cacheable(gen):  # not inside a use_backends block
            _SELECTIONS[key] = sel
    return sel


def select_kernel(op: str, platform: Platform | str | None = None, *, dtype: str | None = None) -> str:
    """The backend that runs ``op`` on ``platform`` (None: this machine's default device),
    for ``dtype`` (default: float32 on cpu, bfloat16 on accelerators; int32 for the ops keyed
    by ids). The same answer a call makes, honouring ``OPMUX_KERNEL_BACKEND`` and
    ``use_backends``; cached until :func:`clear_cache` (or an override change)."""
    return explain_kernel(op, platform, dtype=dtype).chosen


def get_kernel(op: str, backend: str | None = None) -> Callable[..., Any]:
    """A callable running ``op``: the public function (per-call selection) when ``backend`` is
    None, else that backend (validated against the op's backends; the op's argument contract
    runs first) which raises ``BackendUnavailable`` on a call it cannot run."""
    from . import _dispatch_state
    from .errors import BackendUnavailable
    from .explain import op_instance

    name = resolve_op(op)
    instance = op_instance(name)
    if backend is None:
        public: Callable[..., Any] = instance.public
        return public
    names = _dispatch_state.forced(name, backend)  # ValueError naming the valid backends
    if len(names) != 1:
        raise ValueError(f"get_kernel: {name}: one backend, got {backend!r}")
    chosen = names[0]
    checked: set[tuple[Any, Any]] = set()  # (device type, dtype) the selector accepted

    def run(*args: Any, **kwargs: Any) -> Any:
        key = instance._key(args, kwargs)
        where = (getattr(getattr(key, "device", None), "type", None), getattr(key, "dtype", None))
        if where not in checked:
            sel = instance.select_for(args, kwargs, chosen)
            if sel.chosen != chosen:
                d = sel.decision(chosen)
                raise BackendUnavailable(
                    chosen, f"{name}: {d.reason.value if d.reason else ''} {d.detail}".strip()
                )
            checked.add(where)
        return instance.bind(chosen, "cuda" if key.is_cuda else "cpu")(*args, **kwargs)

    run.__name__ = run.__qualname__ = f"{name.partition('.')[2]}[{chosen}]"
    return run


def clear_cache() -> None:
    """Forget every cached selection (these and the ops' own) and re-read the overrides from
    the environment; facts about the machine (compilers, the AOT library) are detected again."""
    from . import _dispatch_state

    _SELECTIONS.clear()
    _dispatch_state.refresh()
