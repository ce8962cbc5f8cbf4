"""C++ kernels for the torch library ops (``jit/csrc/torch_bridge.cpp``).

``torch.ops.opmux.<name>`` reaches the op's generated Python kernel through the dispatcher,
whose boxing into Python costs more than a whole default call (docs/benchmarks/host_overhead*).
The bridge registers a C++ kernel for the CPU and CUDA keys of every library op whose serving
lane returns what the op does: it runs the lane the default call bound, and hands anything else
(no bound lane yet, grad inputs, a refused form) to the Python kernel, kept as the twin library
op ``opmux::_py_<name>``. Same contract, same errors, same results; only the hop is gone.
Where the interpreter's C headers are installed it also holds the default calls' entry into their
lanes (``lane_entry``: the arguments read as torch tensors, the outputs allocated in C++, no tvm-ffi
conversion either way), and ``torch.ops.opmux.<name>``'s own entry from Python
(``attach_call``: torch's converts each scalar argument at about 0.4 us).

It is bound to one torch build (its C++ API: the stable ABI can neither read ``requires_grad`` nor
bump a version). A wheel ships it, prebuilt, for the torch builds its target lists (targets.toml
``bridge_torch``): where this process's torch, C++ ABI, Python ABI and tvm-ffi match one exactly
(``_bridge_key``), it is loaded on the first call that wants it, on the calling thread, with no
compiler and no wait. Otherwise it is compiled against the torch in this interpreter, once per
torch build, into the JIT cache: by one
detached builder for every process on that cache (``_bridge_build``), started by the first
library-op call or the first default call of an op with an entry, whose background thread then
waits for it (the Python paths serve meanwhile; a process that exits first leaves the builder to
finish and publish for the next one), or up front by ``enable()`` / ``python -m
opmux.kernels.jit prewarm --torch-kernels``. ``OPMUX_TORCH_KERNELS``: ``all`` (default: CPU and CUDA), ``cpu`` or
``off`` (the Python kernels), read once when the bridge is first asked for. A build that cannot
run (no compiler, a read-only cache, JIT off) warns once and changes nothing.
"""

from __future__ import annotations

import atexit
import os
import threading
from pathlib import Path
from typing import Any

import torch

from . import _bridge_build, _bridge_key, _env, _warn
from ._bridge_build import _flags, build, library_path
from ._bridge_build import _python_include as _python_include  # (tests read it here)

__all__ = [
    "ENV",
    "TorchKernelsWarning",
    "attach_call",
    "build",
    "devices",
    "enable",
    "enabled",
    "kick",
    "lane_calls",
    "library_path",
    "op_calls",
    "poll",
    "register",
    "status",
]

#: ``off`` keeps the Python kernels of the library ops (the bridge is neither built nor loaded);
#: ``cpu`` gives the CPU key C++ kernels, ``all`` (default) the CUDA key too
ENV = "OPMUX_TORCH_KERNELS"


class TorchKernelsWarning(RuntimeWarning):
    """The C++ library-op kernels could not be built or loaded; the Python kernels serve."""


_lock = threading.Lock()
_warned = False
_module: Any = None
_entry: Any = None  # the Python entry module (BRIDGE_PY_ENTRY), or None
_devices: list[int] | None = None  # devices() when the bridge was first asked for
_state = "off"  # off -> building -> ready | failed
_detail = ""
_source = ""  # where the bridge came from (or failed to): "shipped" (the wheel) or "cache" (built here)
_thread: threading.Thread | None = None
#: (library op name, FusedOp) of every library op defined so far, registered when the bridge loads
_pending: list[tuple[str, Any]] = []


def enabled() -> bool:
    """Whether the bridge may be used (``$OPMUX_TORCH_KERNELS`` is not ``off``)."""
    return bool(_env.get(ENV) != "off")


def devices() -> list[int]:
    """The DLPack device types whose dispatch keys get the C++ kernels and whose default calls
    the entries (``$OPMUX_TORCH_KERNELS``: ``all``, the default, or ``cpu``), as read when the
    bridge was first asked for: ops registered later get the same keys."""
    if _devices is not None:
        return _devices
    return {"off": [], "cpu": [1], "all": [1, 2]}[_env.get(ENV)]


def status() -> tuple[str, str]:
    """(state, detail): ``off`` (not asked for yet), ``building``, ``ready`` or ``failed``."""
    return _state, _detail


def source() -> str:
    """Where the loaded bridge came from: ``shipped`` (the wheel's, for this exact torch build),
    ``cache`` (compiled here into the JIT cache) or ``""`` (none loaded)."""
    return _source if _state == "ready" else ""


def _load(path: Path, *, entries: bool | None = None) -> tuple[Any, Any]:
    """(the tvm-ffi module, the Python entry module or None: built without the interpreter's
    headers). ``entries``: whether it holds them (a shipped bridge always does); None: as a
    cache build here would."""
    import importlib.machinery
    import importlib.util

    import tvm_ffi

    module = tvm_ffi.load_module(str(path))
    entry = None
    if entries if entries is not None else "-DBRIDGE_PY_ENTRY" in _flags()[0]:
        loader = importlib.machinery.ExtensionFileLoader("_opmux_torch_bridge", str(path))
        spec = importlib.util.spec_from_file_location("_opmux_torch_bridge", str(path), loader=loader)
        if spec is not None:
            entry = importlib.util.module_from_spec(spec)
            loader.exec_module(entry)
    return module, entry


def _background() -> None:
    global _module, _entry, _state, _detail, _source
    try:
        module, entry = _load(_bridge_build.obtain(_decided))  # one builder, for every process
    except Exception as exc:  # a machine fault: warn once, the Python kernels keep serving
        with _lock:
            _state, _detail = "failed", f"{type(exc).__name__}: {exc}"
        return
    with _lock:
        _module, _entry, _source = module, entry, "cache"
        _state = "ready"


def _load_shipped() -> bool:
    """Load the wheel's bridge for this exact torch build, if it ships one (under ``_lock``, state
    ``off``): -> whether it is loaded. A shipped bridge that fails to load is a broken install:
    the state is ``failed`` (warned once) and no build is started over it."""
    global _module, _entry, _state, _detail, _source
    try:
        path = _bridge_key.shipped()
    except Exception:  # (no tvm-ffi metadata, ...): the cache build reports it
        return False
    if path is None:
        return False
    try:
        _module, _entry = _load(path, entries=True)
    except Exception as exc:
        _state, _source = "failed", "shipped"
        _detail = f"the shipped {path.name} did not load: {type(exc).__name__}: {exc}"
        return True
    _state, _source = "ready", "shipped"
    _decided.set()
    return True


def _fix_devices() -> None:
    global _devices
    if _devices is None:
        _devices = devices()


def kick(*, wait: bool = False) -> bool:
    """Load the bridge (once): the wheel's for this torch build, here, or else one built into the
    cache, in the background; with ``wait``, finish it here. -> whether it is ready. Called by
    the library ops' Python kernels and the default calls on their first call, and by prewarm."""
    global _thread, _state
    if not enabled():
        return False
    with _lock:
        if _state == "off":
            _fix_devices()
            if not _load_shipped():  # the wheel has none for this torch build: build it
                _state = "building"
                _thread = threading.Thread(target=_background, name="opmux-torch-kernels", daemon=True)
                _thread.start()
        thread = _thread
    if wait and thread is not None:
        thread.join()
    return _state == "ready"


def poll() -> bool:
    """The Python kernels' per-call check while the bridge is pending: register it once it is
    built (on the calling thread), warn once if it failed. -> True when nothing is pending."""
    global _pending
    state = _state
    if state == "building":
        return False
    if state == "failed":
        warn_failed()
        return True
    if state == "ready":
        with _lock:
            pending, _pending = _pending, []
        for name, op in pending:
            op._bridge_define(name, _module)
        return True
    return False


def warn_failed() -> None:
    """Once per process: the bridge could not be built or loaded (why), and what serves instead."""
    global _warned
    if not _warned:
        _warned = True
        _warn.warn_at_caller(
            f"opmux: the C++ kernels of torch.ops.opmux.* are unavailable ({_detail}); the library "
            f"ops keep their Python kernels and torch's entry, and the default calls call their lanes "
            f"through tvm-ffi (microseconds more per call). Set {ENV}=off to silence this.",
            TorchKernelsWarning,
        )


def lane_entry(op_id: int, is_cpu: bool, dtype: str, name: str, lane: Any, flag: bool | None) -> Any:
    """The bridge's entry into ``lane`` for a default call (``lane`` allocates its outputs), or
    None: the bridge is not loaded, or was built without the interpreter's headers. Called with
    the lane's arguments (its trailing PDL flag too), it returns the lane's results as torch
    tensors, or None where the lane refuses, as the tvm-ffi call would."""
    device = 1 if is_cpu else 2
    if _entry is None or _module is None or not enabled() or device not in devices():
        return None
    _module["opmux_bridge_set_lane"](op_id, device, dtype, lane, -1 if flag is None else int(flag))
    return _entry.lane(op_id, device, dtype, name)


def entry_calls() -> int:
    """How many default calls the bridge's entries ran through a lane (tests, benchmarks)."""
    return int(_entry.lane_calls()) if _entry is not None else 0


def register(name: str, op: Any) -> None:
    """Remember library op ``name`` of ``op`` for the bridge (defined now if it is loaded)."""
    with _lock:
        if _state != "ready":
            _pending.append((name, op))
            return
    op._bridge_define(name, _module)


def enable() -> None:
    """Build (or load) the bridge and register it now, on this thread; raises what the build
    raises. For servers (before their threads start: registering kernels while another thread
    dispatches the same op is not safe in torch), prewarm, benchmarks and tests; other processes
    get it in the background, registered by the next library-op call. A shipped bridge that
    does not load is a broken install, as for :func:`kick`: it raises, building nothing over it."""
    global _state, _detail, _module, _entry, _source
    if _state != "ready":
        with _lock:
            _fix_devices()
            if _state == "off":
                _load_shipped()
        if _state == "failed" and _source == "shipped":
            raise RuntimeError(
                f"opmux: {_detail}; reinstall opmux for this torch build, or set {ENV}=off "
                "(the library ops then keep their Python kernels)"
            )
        if _state != "ready":
            module, entry = _load(build())  # (outside the lock: a compile takes seconds)
            with _lock:
                if _state != "ready":
                    _module, _entry, _state, _detail, _source = module, entry, "ready", "", "cache"
    poll()


#: set by the background thread once a builder runs (or nothing is left to start)
_decided = threading.Event()


def _settle_at_exit() -> None:
    """A process that asked for the bridge and exits at once still leaves its builder running:
    wait (briefly) until the background thread has started it or seen one, not for the compile."""
    if _state == "building":
        _decided.wait(30)


atexit.register(_settle_at_exit)


def _after_fork_in_child() -> None:
    """A child forked while the build thread ran has no such thread: start over there."""
    global _state, _thread, _lock, _decided
    _lock = threading.Lock()
    _decided = threading.Event()
    if _state == "building":
        _state, _thread = "off", None


os.register_at_fork(after_in_child=_after_fork_in_child)


def attach_call(name: str) -> bool:
    """Give ``torch.ops.opmux.<name>`` (the packet and its default overload) the bridge's entry
    from Python (``OpCall`` in torch_bridge.cpp): torch's own conversion of the arguments costs
    about 0.4 us per scalar, which an op with several options pays on every call, compiled graphs
    included (Inductor passes every argument). The entry converts the same values, calls the same
    operator through the dispatcher and hands anything else to torch's entry; it hashes as torch's
    does, so the op objects stay the same keys. -> whether it is attached (no Python entry in this
    build, another overload, or a schema it does not cover: torch's entry stays)."""
    if _entry is None:
        return False
    packet = getattr(torch.ops.opmux, name)
    if list(packet.overloads()) != ["default"]:
        return False
    qualname = f"opmux::{name}"
    for holder in (packet.default, packet):
        original = holder._op
        if type(original).__name__ == "OpCall":
            continue
        call = _entry.op_call(qualname, original)
        if call is None:
            return False
        holder._op = call  # (OpOverload / OpOverloadPacket.__call__: ``self._op(*args, **kwargs)``)
        if holder is packet:  # TorchScript resolves the packet's function as before
            torch.jit._builtins._register_builtin(call, qualname)
    return True


def op_calls() -> int:
    """How many ``torch.ops.opmux.*`` calls the bridge's entries took (tests, benchmarks)."""
    return int(_entry.op_calls()) if _entry is not None else 0


def lane_calls() -> int:
    """How many library-op calls the bridge's C++ kernels ran through a lane (tests, benchmarks)."""
    return int(_module["opmux_bridge_lane_calls"]()) if _module is not None else 0


def module() -> Any:
    """The loaded bridge module, or None."""
    return _module
