"""Platform facts (device type, index, arch, versions) and the detector that gathers them.

Why so careful: the selector trusts these facts, and a GPU machine classified as "cpu" silently
runs reference kernels at a fraction of the speed. Real torch builds are odd in many ways (no
``torch.version.hip`` on old builds, ``is_available()`` raising on a broken driver, no
``torch.npu`` until ``torch_npu`` is imported), so the detector is a pure function over a
torch-like object (:func:`detect_from`, tested with fakes) wrapped by a thin, cached
:func:`detect` that imports torch lazily.

No torch at import time: this module is part of the torch-free metadata layer.

Why ~450 lines in one module: the probing rules for every vendor and their evidence table must
be read together to check the one promise (never "cpu" on a GPU machine); split apart, a rule
would hide in a file the reader did not open.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opmux.kernels import config
from opmux.kernels.config import DEVICE_TYPES

__all__ = [
    "DEVICE_TYPES",
    "Platform",
    "PlatformDetectionError",
    "detect",
    "detect_from",
    "reset",
]


@dataclass(frozen=True)
class Platform:
    """What opmux knows about the machine. ``notes`` records anything odd seen while detecting,
    so ``explain`` can show why a fact is missing rather than just that it is."""

    device_type: str
    device_index: int | None = None
    arch: str | None = None  # "sm_90", "gfx942"; None when unknown or on cpu/xpu/npu/mps
    capability: tuple[int, int] | None = None
    device_name: str | None = None
    torch_version: str | None = None
    runtime_version: str | None = None  # CUDA or HIP runtime torch was built with
    device_count: int = 1
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.device_type not in DEVICE_TYPES:
            raise ValueError(f"unknown device type {self.device_type!r}; valid: {', '.join(DEVICE_TYPES)}")

    @property
    def is_accelerator(self) -> bool:
        return self.device_type != "cpu"

    def describe(self) -> dict[str, Any]:
        """JSON-ready facts for the CLI and bug reports."""
        return {
            "device_type": self.device_type,
            "device_index": self.device_index,
            "arch": self.arch,
            "capability": list(self.capability) if self.capability else None,
            "device_name": self.device_name,
            "torch_version": self.torch_version,
            "runtime_version": self.runtime_version,
            "device_count": self.device_count,
            "notes": list(self.notes),
        }


class PlatformDetectionError(RuntimeError):
    """Detection could not decide, and guessing "cpu" could be wrong.

    Fields: ``device_type`` (the suspected one), ``evidence`` (why we think it is there),
    ``errors`` (what the probes raised) and ``hint`` (what to do). Picklable.
    """

    def __init__(
        self,
        device_type: str,
        *,
        evidence: Sequence[str] = (),
        errors: Sequence[str] = (),
        hint: str = "",
        summary: str | None = None,
    ) -> None:
        self.device_type = device_type
        self.evidence = tuple(evidence)
        self.errors = tuple(errors)
        self.hint = hint
        self.summary = summary or f"cannot tell whether a usable {device_type} device is present"
        parts = [self.summary]
        if self.errors:
            parts.append("probes failed: " + "; ".join(self.errors))
        if self.evidence:
            parts.append("evidence of a device: " + "; ".join(self.evidence))
        if hint:
            parts.append(hint)
        super().__init__(". ".join(parts))

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_error, (self.device_type, self.evidence, self.errors, self.hint, self.summary))


def _rebuild_error(
    device_type: str, evidence: tuple[str, ...], errors: tuple[str, ...], hint: str, summary: str
) -> PlatformDetectionError:
    return PlatformDetectionError(device_type, evidence=evidence, errors=errors, hint=hint, summary=summary)


_HINT = (
    "Fix the driver/runtime, or set OPMUX_DEVICE={forced} (one of "
    + ", ".join(DEVICE_TYPES)
    + ") to skip probing"
)
_HIDDEN = ("", "-1")  # CUDA_VISIBLE_DEVICES values that hide every device


def _module_loader(name: str) -> Any | None:
    """Default importer for optional vendor modules: None when the module is not installed."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return None if spec is None else importlib.import_module(name)


class ProbeTimeout(TimeoutError):
    """A vendor module's import did not finish within ``OPMUX_PROBE_TIMEOUT``."""


def _with_timeout(fn: Callable[[], Any], seconds: float, what: str) -> Any:
    """Run ``fn`` in a daemon thread and wait at most ``seconds`` for it.

    Used for vendor-module imports, which run arbitrary native initialisation: one that hangs
    must not hang detection. The thread is left behind (an import cannot be cancelled); its
    result, or any exception it raised (SystemExit included), is returned or re-raised here.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:  # re-raised in the caller, where the probe records it
            box["error"] = err

    thread = threading.Thread(target=run, name=f"opmux-probe-{what}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise ProbeTimeout(f"{what} did not finish within {seconds:g} s (OPMUX_PROBE_TIMEOUT)")
    if "error" in box:
        raise box["error"]
    return box.get("value")


class _Probe:
    """Calls into torch that may raise, collecting the failures as notes.

    Every access goes through here: a torch build (or a vendor plugin) may raise anything from
    an attribute access (RuntimeError, ImportError, even SystemExit), and a probe that raises
    means "this device kind is unusable here", with the reason kept for ``env``.
    """

    def __init__(self) -> None:
        self.notes: list[str] = []

    def call(self, what: str, fn: Callable[[], Any]) -> tuple[bool, Any]:
        try:
            return True, fn()
        except (Exception, SystemExit) as err:  # any failure of a vendor probe is recorded
            self.notes.append(f"{what} raised {type(err).__name__}: {err}")
            return False, None

    def get(self, obj: Any, name: str, what: str) -> Any | None:
        """``getattr(obj, name, None)``, recording (and surviving) whatever the access raises."""
        if obj is None:
            return None
        try:
            return getattr(obj, name, None)
        except (Exception, SystemExit) as err:
            self.notes.append(f"{what} raised {type(err).__name__}: {err}")
            return None

    def attr(self, obj: Any, path: str, root: str = "torch") -> Any | None:
        what = root
        for name in path.split("."):
            what = f"{what}.{name}"
            obj = self.get(obj, name, what)
            if obj is None:
                return None
        return obj

    def version(self, obj: Any, name: str, what: str) -> str | None:
        """A version field as a string: a str as is, a number (``hip = 6.2``) as its decimal
        form with a note, anything else (or an empty string) None with a note."""
        value = self.get(obj, name, what)
        if value is None or isinstance(value, str):
            return value or None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            self.notes.append(f"{what} is a {type(value).__name__} ({value!r}); read as {str(value)!r}")
            return str(value)
        self.notes.append(f"{what} is a {type(value).__name__} ({value!r}), not a version string; ignored")
        return None


def detect_from(
    torch: Any,
    *,
    env: Mapping[str, str] | None = None,
    path_exists: Callable[[str], bool] = os.path.exists,
    load_module: Callable[[str], Any | None] = _module_loader,
) -> Platform:
    """Detect the platform from ``torch`` (any torch-like object), without global state.

    Order of precedence (first match wins):

    1. ``OPMUX_DEVICE`` (from ``env``, else from ``config`` incl. ``scope()``): forces the device
       type; the other facts are still probed, and a mismatch is noted, not an error.
    2. CUDA or ROCm via ``torch.cuda``: ``hip`` when ``torch.version.hip`` is set, else ``cuda``.
       Availability is ``torch.cuda.is_available()``; if that raises, ``device_count()`` and then
       ``torch._C._cuda_getDeviceCount()`` decide. If all of them raise, a GPU is assumed present
       only on evidence (runtime version in torch, visible-devices variable not ``""``/``-1``,
       ``/dev/nvidia0`` or ``/dev/kfd``): with evidence :class:`PlatformDetectionError`, without it
       cpu with a note.
    3. Intel XPU via ``torch.xpu`` (same probing; evidence ``/dev/dri/renderD128``).
    4. Ascend NPU via ``torch.npu``; when absent and ``torch_npu`` is installed, it is imported
       (that is what registers ``torch.npu``). Evidence ``/dev/davinci0``.
    5. Apple MPS via ``torch.backends.mps.is_available()``.
    6. cpu.

    Not evidence: a missing attribute (``torch.version`` without ``hip``, no ``torch.npu``, no
    ``torch.xpu``), a device module that exists but reports unavailable, ``torch.version.cuda``
    on its own (CUDA wheels run fine on CPU-only hosts), or a device file without the matching
    torch build. A probe that raises is recorded in ``notes`` and never turns a GPU into "cpu":
    either another probe answers, or the absence of evidence does, or detection raises.
    Device properties (index, capability, arch, name) that fail to probe are left None
    (index defaults to 0) with a note.
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    probe = _Probe()
    torch_version = probe.version(torch, "__version__", "torch.__version__")
    version = probe.get(torch, "version", "torch.version")
    if version is None:
        probe.notes.append("torch.version is missing")
    hip_version: str | None = None
    if version is not None:
        ok, has_hip = probe.call("torch.version.hip", lambda: hasattr(version, "hip"))
        if ok and not has_hip:
            probe.notes.append("torch.version has no 'hip' attribute; treated as a non-ROCm build")
        elif ok:
            hip_version = probe.version(version, "hip", "torch.version.hip")
    cuda_version = probe.version(version, "cuda", "torch.version.cuda")

    forced = config.get("OPMUX_DEVICE", env=env)
    gpu_type = "hip" if hip_version else "cuda"

    found: str | None = None
    if forced in (None, "cuda", "hip") and _available(
        torch, "cuda", gpu_type, probe, environ, path_exists, hip_version or cuda_version
    ):
        found = gpu_type
    xpu_version = probe.version(version, "xpu", "torch.version.xpu")
    if (
        found is None
        and forced in (None, "xpu")
        and _available(torch, "xpu", "xpu", probe, environ, path_exists, xpu_version)
    ):
        found = "xpu"
    if found is None and forced in (None, "npu"):
        if probe.attr(torch, "npu") is None:
            limit = float(config.get("OPMUX_PROBE_TIMEOUT", env=env))
            ok, module = probe.call(
                "import torch_npu",
                lambda: _with_timeout(lambda: load_module("torch_npu"), limit, "import torch_npu"),
            )
            npu_evidence = None if ok else _evidence("npu", environ, path_exists, None)
            if npu_evidence is not None:
                raise PlatformDetectionError(
                    "npu", evidence=npu_evidence, errors=probe.notes[-1:], hint=_HINT.format(forced="npu")
                )
            if module is not None and probe.attr(torch, "npu") is None:
                probe.notes.append("torch_npu imported but torch.npu is still missing")
        if probe.attr(torch, "npu") is not None and _available(
            torch, "npu", "npu", probe, environ, path_exists, None
        ):
            found = "npu"
    if found is None and forced in (None, "mps"):
        is_mps = probe.attr(torch, "backends.mps.is_available")
        if is_mps is not None:
            ok, value = probe.call("torch.backends.mps.is_available()", is_mps)
            found = "mps" if ok and value else None

    device_type = forced or found or "cpu"
    if forced is not None:
        probe.notes.append(f"device type forced by OPMUX_DEVICE={forced}")
        if found is not None and found != forced:
            probe.notes.append(f"OPMUX_DEVICE={forced} overrides the detected {found}")
        elif found is None and forced != "cpu":
            probe.notes.append(f"OPMUX_DEVICE={forced} but no usable {forced} device was detected")

    if device_type == "cpu":
        return Platform("cpu", torch_version=torch_version, device_count=1, notes=tuple(probe.notes))

    module = probe.attr(torch, "cuda" if device_type in ("cuda", "hip") else device_type)
    runtime = {"cuda": cuda_version, "hip": hip_version, "xpu": xpu_version}.get(device_type)
    if device_type == "npu":
        runtime = probe.version(version, "cann", "torch.version.cann")
    if module is None or device_type == "mps":
        return Platform(
            device_type,
            device_index=0,
            torch_version=torch_version,
            runtime_version=runtime,
            device_count=1,
            notes=tuple(probe.notes),
        )
    return _device_facts(device_type, module, probe, torch_version=torch_version, runtime=runtime)


def _available(
    torch: Any,
    attr: str,
    device_type: str,
    probe: _Probe,
    env: Mapping[str, str],
    path_exists: Callable[[str], bool],
    runtime_version: str | None,
) -> bool:
    """Is a ``torch.<attr>`` device usable? See :func:`detect_from` for the rules."""
    module = probe.attr(torch, attr)
    if module is None:
        return False
    is_available = probe.get(module, "is_available", f"torch.{attr}.is_available")
    if is_available is not None:
        ok, value = probe.call(f"torch.{attr}.is_available()", is_available)
        if ok:
            return bool(value)
    counters: list[tuple[str, Any]] = [
        (f"torch.{attr}.device_count()", probe.get(module, "device_count", f"torch.{attr}.device_count"))
    ]
    if attr == "cuda":
        counters.append(("torch._C._cuda_getDeviceCount()", probe.attr(torch, "_C._cuda_getDeviceCount")))
    for what, counter in counters:
        if counter is None:
            continue
        ok, count = probe.call(what, counter)
        if ok and isinstance(count, int):
            return count > 0
    evidence = _evidence(device_type, env, path_exists, runtime_version)
    if evidence is None:
        probe.notes.append(f"{device_type} probes failed and there is no evidence of a {device_type} device")
        return False
    raise PlatformDetectionError(
        device_type,
        evidence=evidence,
        errors=[n for n in probe.notes if f"torch.{attr}" in n or "_cuda_" in n],
        hint=_HINT.format(forced=device_type),
    )


_EVIDENCE: Mapping[str, tuple[tuple[str, ...], str, bool]] = {
    # device type: (visibility variables, device file, needs a runtime version in torch)
    "cuda": (("CUDA_VISIBLE_DEVICES",), "/dev/nvidia0", True),
    "hip": (("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"), "/dev/kfd", True),
    "xpu": (("ZE_AFFINITY_MASK",), "/dev/dri/renderD128", False),
    "npu": (("ASCEND_RT_VISIBLE_DEVICES",), "/dev/davinci0", False),
}


def _evidence(
    device_type: str, env: Mapping[str, str], path_exists: Callable[[str], bool], runtime_version: str | None
) -> list[str] | None:
    """All three kinds of evidence must agree, else None: the torch build targets the device,
    no visibility variable hides every device, and the device file exists."""
    spec = _EVIDENCE.get(device_type)
    if spec is None:
        return None
    variables, device_file, needs_runtime = spec
    if needs_runtime and not runtime_version:
        return None
    for var in variables:
        if var in env and env[var].strip() in _HIDDEN:
            return None
    if not path_exists(device_file):
        return None
    found = [f"{device_file} exists"]
    if runtime_version:
        found.insert(0, f"torch is built for {device_type} {runtime_version}")
    return found


def _device_facts(
    device_type: str, module: Any, probe: _Probe, *, torch_version: str | None, runtime: str | None
) -> Platform:
    name = f"torch.{'cuda' if device_type in ('cuda', 'hip') else device_type}"
    index = 0
    current = probe.get(module, "current_device", f"{name}.current_device")
    if current is None:
        probe.notes.append(f"{name}.current_device is missing; using device 0")
    else:
        ok, value = probe.call(f"{name}.current_device()", current)
        if ok and isinstance(value, int):
            index = value
        else:
            probe.notes.append("using device 0")
    count = 1
    device_count = probe.get(module, "device_count", f"{name}.device_count")
    if device_count is not None:
        ok, value = probe.call(f"{name}.device_count()", device_count)
        if ok and isinstance(value, int) and value > 0:
            count = value
    capability: tuple[int, int] | None = None
    get_capability = probe.get(module, "get_device_capability", f"{name}.get_device_capability")
    if get_capability is not None:
        ok, value = probe.call(f"{name}.get_device_capability({index})", lambda: get_capability(index))
        if ok and isinstance(value, Sequence) and len(value) == 2:
            try:
                capability = (int(value[0]), int(value[1]))
            except (TypeError, ValueError):
                probe.notes.append(f"{name}.get_device_capability({index}) returned {value!r}; ignored")
    props: Any = None
    get_props = probe.get(module, "get_device_properties", f"{name}.get_device_properties")
    if get_props is not None:
        _, props = probe.call(f"{name}.get_device_properties({index})", lambda: get_props(index))
    device_name = _str_or_none(probe.get(props, "name", f"{name}.get_device_properties({index}).name"))
    get_name = probe.get(module, "get_device_name", f"{name}.get_device_name")
    if device_name is None and get_name is not None:
        _, value = probe.call(f"{name}.get_device_name({index})", lambda: get_name(index))
        device_name = _str_or_none(value)

    arch: str | None = None
    if device_type == "cuda":
        arch = f"sm_{capability[0]}{capability[1]}" if capability else None
        if arch is None:
            probe.notes.append("CUDA compute capability unknown; arch left unset")
    elif device_type == "hip":
        gcn = _str_or_none(
            probe.get(props, "gcnArchName", f"{name}.get_device_properties({index}).gcnArchName")
        )
        # "gfx942:sramecc+:xnack-": the features after ':' are target options, not the arch.
        arch = (gcn.split(":", 1)[0].strip() or None) if gcn else None
        if arch is None:
            probe.notes.append("ROCm gcnArchName unavailable; arch left unset (capability is not a gfx name)")
    return Platform(
        device_type,
        device_index=index,
        arch=arch,
        capability=capability,
        device_name=device_name,
        torch_version=torch_version,
        runtime_version=runtime,
        device_count=count,
        notes=tuple(probe.notes),
    )


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


# -- the cached, torch-importing wrapper ------------------------------------------------------

_lock = threading.Lock()
# Keyed by the OPMUX_DEVICE value in force, so scope(OPMUX_DEVICE=...) takes effect without reset().
_cache: dict[str | None, Platform] = {}


def _import_torch() -> Any | None:
    # Lazy on purpose: importing torch costs seconds and the metadata layer must not pay it.
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return None
    try:
        return importlib.import_module("torch")
    except (Exception, SystemExit) as err:  # a broken torch on a GPU box must not read as "cpu"
        raise PlatformDetectionError(
            "unknown",
            summary="torch is installed but cannot be imported, so the device cannot be detected",
            errors=[f"import torch raised {type(err).__name__}: {err}"],
            hint="fix the torch installation (python -c 'import torch' shows the full error)",
        ) from err


def detect() -> Platform:
    """The platform of this process: :func:`detect_from` on the real torch, cached per process
    (and per ``OPMUX_DEVICE`` value). Without torch installed: cpu, with a note saying so.
    The first call may initialise the device runtime; importing this module never does."""
    forced = config.device()
    with _lock:
        cached = _cache.get(forced)
        if cached is not None:
            return cached
        torch = _import_torch()
        if torch is None:
            result = Platform(
                forced or "cpu",
                notes=("torch is not installed; only torch-free facts are known",)
                + ((f"device type forced by OPMUX_DEVICE={forced}",) if forced else ()),
            )
        else:
            result = detect_from(torch)
        _cache[forced] = result
        return result


def reset() -> None:
    """Forget the cached platform (tests, or after changing CUDA_VISIBLE_DEVICES)."""
    with _lock:
        _cache.clear()
