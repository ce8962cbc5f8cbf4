"""Load and validate targets.toml, the table of opmux platform targets.

Every consumer (noxfile.py, setup.py, tools/variants.py, tools/wheel_check.py, the README
table) reads the table through :func:`load`, so an unknown key, a missing field or a duplicate
name fails everywhere with the same message.  Standard library only: setup.py imports this
module inside the isolated build environment.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 floor
    import tomli as tomllib

__all__ = ["AOT", "Target", "TargetTableError", "load", "loads", "markdown_table"]

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "targets.toml"

COMPILERS = ("nvcc", "cxx", "hipcc", "none")
TRITON = ("yes", "no", "interpreter")
DEVICES = ("cpu", "cuda")  # devices setup.py can build an AOT library for (csrc/aot_<device>.*)
MACHINES = ("x86_64", "aarch64")
_NAME = re.compile(r"^[a-z][a-z0-9]*$")
_DIST = re.compile(r"^[a-z][a-z0-9-]*$")
_ARCH = re.compile(r"^(sm_\d+[af]?|gfx[0-9a-f]+)$")
_PTX = re.compile(r"^(compute_\d+[af]?)?$")
_TOOLKIT = re.compile(r"^\d+\.\d+$")
_DRIVER = re.compile(r"^\d{3}$")
_TORCH = re.compile(r"^\d+\.\d+\.\d+(\+[a-z0-9.]+)?$")
_IMAGE = re.compile(r"^[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9._-]+)?$")

_TOP_KEYS = {"default": str, "targets": dict}
_TARGET_KEYS: dict[str, type | tuple[type, ...]] = {
    "pyproject": str,
    "distribution": str,
    "torch": str,
    "dependencies": list,
    "aot": dict,
    "jit": str,
    "triton": str,
    "vendor_backends": list,
    "parity_device": str,
    "wheel_size_mb": (int, float),
    "runner": list,
    "manylinux_image": str,
    "build_requires": list,
    "driver": str,
    "machines": list,
    "bridge_torch": list,
}
_AOT_KEYS: dict[str, type] = {"compiler": str, "libraries": list, "archs": list, "ptx": str, "toolkit": str}


#: the torch a release test installs for a target that ships no bridge (pinned: a bare "torch"
#: pulls a multi-GB CUDA build)
TEST_TORCH = "torch==2.13.0"


class TargetTableError(ValueError):
    """targets.toml is malformed; the message names the file, the target and the key."""


@dataclass(frozen=True)
class AOT:
    """The ahead-of-time library of one target."""

    compiler: str
    libraries: tuple[str, ...]
    archs: tuple[str, ...]
    ptx: str
    toolkit: str = ""

    @property
    def filenames(self) -> tuple[str, ...]:
        """File names of the shipped libraries, e.g. ``libopmux_aot_cuda.so``."""
        return tuple(f"libopmux_aot_{lib}.so" for lib in self.libraries)

    def compiler_for(self, library: str) -> str:
        """The compiler of one library: the C++ compiler for cpu, the target's otherwise."""
        return "cxx" if library == "cpu" else self.compiler


@dataclass(frozen=True)
class Target:
    """One row of targets.toml."""

    name: str
    pyproject: str
    distribution: str
    torch: str
    dependencies: tuple[str, ...]
    aot: AOT
    jit: str
    triton: str
    vendor_backends: tuple[str, ...]
    parity_device: str
    wheel_size_mb: float
    runner: tuple[str, ...]
    manylinux_image: str
    default: bool
    build_requires: tuple[str, ...] = ()
    driver: str = ""
    machines: tuple[str, ...] = ("x86_64",)
    bridge_torch: tuple[str, ...] = ()

    @property
    def cuda_major(self) -> int | None:
        """The CUDA major release of an nvcc target (13 for toolkit "13.0"); None otherwise."""
        return int(self.aot.toolkit.split(".")[0]) if self.aot.toolkit else None

    def image(self, machine: str) -> str:
        """The cibuildwheel image of the release build on ``machine``."""
        return self.manylinux_image.replace("x86_64", machine)

    @property
    def test_torch(self) -> str:
        """The torch requirement a release test installs beside the wheel: the oldest release the
        target ships a bridge for (``bridge_torch[-1]``, exactly: :func:`torch_pin`), so the
        bridge check can demand the shipped bridge (``require_bridge``); else :data:`TEST_TORCH`."""
        return torch_pin(self.bridge_torch[-1]) if self.bridge_torch else TEST_TORCH

    @property
    def require_bridge(self) -> bool:
        """Whether the installed wheel must serve :attr:`test_torch` with its shipped bridge."""
        return bool(self.bridge_torch)

    @property
    def requirements(self) -> list[str]:
        """Runtime requirements written into the wheel metadata, in a stable order."""
        return ["apache-tvm-ffi>=0.1.15,<0.2", self.torch, *self.dependencies]


def torch_pin(release: str) -> str:
    """The requirement of exactly the torch build ``release`` names (``2.13.0``: PyPI's;
    ``2.13.0+cpu``: PyTorch's CPU index, which CI and the release configure). ``===``, not
    ``==``: ``==2.13.0`` also takes ``2.13.0+cpu`` (a local version matches its public one) and
    pip prefers it wherever that index is configured: another build, another bridge."""
    return f"torch==={release}"


def _fail(where: str, msg: str) -> TargetTableError:
    return TargetTableError(f"{where}: {msg}")


def _check_keys(where: str, data: dict[str, Any], spec: dict[str, Any]) -> None:
    unknown = sorted(set(data) - set(spec))
    if unknown:
        raise _fail(where, f"unknown key(s) {unknown}; valid keys: {sorted(spec)}")
    missing = sorted(set(spec) - set(data))
    if missing:
        raise _fail(where, f"missing field(s) {missing}")
    for key, typ in spec.items():
        value = data[key]
        if not isinstance(value, typ) or isinstance(value, bool):
            names = typ.__name__ if isinstance(typ, type) else "/".join(t.__name__ for t in typ)
            raise _fail(where, f"{key} = {value!r} must be of type {names}")
        if isinstance(value, list) and not all(isinstance(v, str) for v in value):
            raise _fail(where, f"{key} = {value!r} must be a list of strings")


def _one_of(where: str, key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise _fail(where, f"{key} = {value!r} is not one of {list(choices)}")


def _target(where: str, name: str, data: Any, default: str) -> Target:
    if not _NAME.match(name):
        raise _fail(where, "target names are lower-case letters and digits")
    if not isinstance(data, dict):
        raise _fail(where, "must be a table")
    _check_keys(where, data, _TARGET_KEYS)
    aot_where = f"{where}.aot"
    _check_keys(aot_where, data["aot"], _AOT_KEYS)
    aot = AOT(
        compiler=data["aot"]["compiler"],
        libraries=tuple(data["aot"]["libraries"]),
        archs=tuple(data["aot"]["archs"]),
        ptx=data["aot"]["ptx"],
        toolkit=data["aot"]["toolkit"],
    )
    _one_of(aot_where, "compiler", aot.compiler, COMPILERS)
    for lib in aot.libraries:
        _one_of(aot_where, "libraries entry", lib, DEVICES)
    if aot.compiler == "none" and aot.libraries:
        raise _fail(aot_where, "compiler 'none' cannot build libraries " + repr(list(aot.libraries)))
    if aot.compiler != "none" and not aot.libraries:
        raise _fail(aot_where, f"compiler {aot.compiler!r} given but libraries is empty")
    for arch in aot.archs:
        if not _ARCH.match(arch):
            raise _fail(aot_where, f"arch {arch!r} is not like 'sm_90a' or 'gfx942'")
    if not _PTX.match(aot.ptx):
        raise _fail(aot_where, f"ptx = {aot.ptx!r} is not like 'compute_90' (or empty)")
    if (aot.compiler == "nvcc") != bool(aot.toolkit) or (aot.toolkit and not _TOOLKIT.match(aot.toolkit)):
        raise _fail(
            aot_where,
            f"toolkit = {aot.toolkit!r}: an nvcc target names its CUDA release like '13.0', others ''",
        )
    if (aot.compiler == "nvcc") != bool(data["driver"]) or (
        data["driver"] and not _DRIVER.match(data["driver"])
    ):
        raise _fail(
            where,
            f"driver = {data['driver']!r}: an nvcc target names its driver branch like '580', others ''",
        )
    if not data["machines"] or any(m not in MACHINES for m in data["machines"]):
        raise _fail(where, f"machines = {data['machines']!r} must be a non-empty subset of {list(MACHINES)}")
    if len(set(aot.libraries)) != len(aot.libraries) or len(set(aot.archs)) != len(aot.archs):
        raise _fail(aot_where, "duplicate entry in libraries or archs")
    bridges = data["bridge_torch"]
    bad = [v for v in bridges if not _TORCH.match(v)]
    if bad or len(set(bridges)) != len(bridges):
        raise _fail(
            where, f"bridge_torch = {bridges!r}: distinct torch versions like '2.14.1' or '2.13.0+cpu'"
        )
    if bridges and "cpu" not in aot.libraries:
        raise _fail(where, "bridge_torch needs the C++ compiler of the cpu AOT library (aot.libraries)")
    _one_of(where, "jit", data["jit"], COMPILERS)
    _one_of(where, "triton", data["triton"], TRITON)
    if not _DIST.match(data["distribution"]):
        raise _fail(where, f"distribution = {data['distribution']!r} is not a normalized name")
    if not data["torch"].startswith("torch"):
        raise _fail(where, f"torch = {data['torch']!r} must be a requirement on torch")
    if data["wheel_size_mb"] <= 0:
        raise _fail(where, "wheel_size_mb must be positive")
    if not data["runner"]:
        raise _fail(where, "runner must name at least one runner label, e.g. ['ubuntu-latest']")
    if not _IMAGE.match(data["manylinux_image"]):
        raise _fail(
            where,
            f"manylinux_image = {data['manylinux_image']!r} is not an image name like 'quay.io/pypa/manylinux_2_28_x86_64'",
        )
    return Target(
        name=name,
        pyproject=data["pyproject"],
        distribution=data["distribution"],
        torch=data["torch"],
        dependencies=tuple(data["dependencies"]),
        aot=aot,
        jit=data["jit"],
        triton=data["triton"],
        vendor_backends=tuple(data["vendor_backends"]),
        parity_device=data["parity_device"],
        wheel_size_mb=float(data["wheel_size_mb"]),
        runner=tuple(data["runner"]),
        manylinux_image=data["manylinux_image"],
        default=name == default,
        build_requires=tuple(data["build_requires"]),
        driver=data["driver"],
        machines=tuple(data["machines"]),
        bridge_torch=tuple(bridges),
    )


def loads(text: str, *, source: str = "targets.toml") -> dict[str, Target]:
    """Parse and validate the table; return the targets by name, default first."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:  # e.g. a [targets.cpu] table declared twice
        raise TargetTableError(f"{source}: not valid TOML (is a target declared twice?): {exc}") from None
    _check_keys(source, raw, _TOP_KEYS)
    default = raw["default"]
    if default not in raw["targets"]:
        raise _fail(source, f"default = {default!r} is not a target; targets: {sorted(raw['targets'])}")
    targets = [_target(f"{source}: [targets.{n}]", n, d, default) for n, d in raw["targets"].items()]
    for field in ("distribution", "pyproject"):
        seen: dict[str, str] = {}
        for t in targets:
            value = getattr(t, field)
            if value in seen:
                raise _fail(source, f"duplicate {field} {value!r} in targets {seen[value]!r} and {t.name!r}")
            seen[value] = t.name
    for t in targets:
        if t.default and t.pyproject != "pyproject.toml":
            raise _fail(source, f"the default target {t.name!r} must build from pyproject.toml")
        if not t.default and t.pyproject != f"pyproject_{t.name}.toml":
            raise _fail(source, f"[targets.{t.name}] pyproject must be 'pyproject_{t.name}.toml'")
    targets.sort(key=lambda t: not t.default)
    return {t.name: t for t in targets}


def load(path: Path | str = TABLE) -> dict[str, Target]:
    """Read and validate a targets.toml file."""
    path = Path(path)
    return loads(path.read_text(encoding="utf-8"), source=str(path))


def default_target(targets: dict[str, Target]) -> Target:
    """The target whose pyproject is pyproject.toml."""
    return next(t for t in targets.values() if t.default)


def markdown_table(targets: dict[str, Target]) -> str:
    """The README's target table, generated from the table (a test keeps them in sync)."""
    rows = [
        "| target | distribution | AOT libraries | archs | CUDA (driver) | machines | JIT | Triton "
        "| torch bridges shipped | vendor backends | parity device | parity runner | size budget |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in targets.values():
        libs = ", ".join(f"`{f}`" for f in t.aot.filenames) or "none"
        archs = ", ".join([*t.aot.archs, *([t.aot.ptx + " (PTX)"] if t.aot.ptx else [])]) or "-"
        name = f"{t.name} (default)" if t.default else t.name
        aot = f"{t.aot.compiler}: {libs}" if t.aot.compiler != "none" else "none"
        cuda = f"{t.aot.toolkit} (R{t.driver}+)" if t.aot.toolkit else "-"
        rows.append(
            f"| {name} | `{t.distribution}` | {aot} | {archs} | {cuda} | {', '.join(t.machines)} | "
            f"{t.jit} | {t.triton} | {', '.join(t.bridge_torch) or '-'} | "
            f"{', '.join(t.vendor_backends) or '-'} | {t.parity_device} | {', '.join(t.runner)} | "
            f"{t.wheel_size_mb:g} MB |"
        )
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # python tools/targets.py: validate and print the README table
    print(markdown_table(load()), end="")
