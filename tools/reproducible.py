"""Reproducible builds: the sdist and a target's wheel, built twice, are identical bytes.

One snapshot of the tree is staged (so edits made meanwhile cannot differ between the two
builds) and copied to a second, differently named directory; each copy builds the sdist, then
the target's wheel from that sdist (the release path), with the same ``SOURCE_DATE_EPOCH``.
Besides comparing bytes, every shared library in the wheel is checked for an rpath/runpath
and for the build directories (the staged trees, the isolated build environment) embedded in
it: shipped libraries find ``libtvm_ffi.so`` through the tvm_ffi package at load time.
Used by ``nox -s reproducible`` and tests/packaging/test_sdist.py.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools import from_sdist as _from_sdist
from tools import stage as _stage

__all__ = ["Build", "build_twice", "compare", "elf_runpaths", "library_problems"]

DEFAULT_EPOCH = "315532800"  # 1980-01-01, the earliest zip timestamp
_DT_RPATH, _DT_RUNPATH, _SHT_DYNAMIC = 15, 29, 6


@dataclass
class Build:
    """The artifacts of one build: the sdist and the target's wheel built from it."""

    src: Path
    sdist: Path
    wheel: Path
    forbidden: list[str] = field(default_factory=list)  # directory names that must not leak


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def elf_runpaths(data: bytes) -> list[str]:
    """DT_RPATH and DT_RUNPATH strings of a little-endian ELF64 shared object."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a little-endian ELF64 file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    out = []
    for _name, typ, _flags, _addr, off, size, link, *_ in sections:
        if typ != _SHT_DYNAMIC:
            continue
        strtab = sections[link][4]
        for pos in range(off, off + size, 16):
            tag, val = struct.unpack_from("<qQ", data, pos)
            if tag in (_DT_RPATH, _DT_RUNPATH):
                end = data.index(b"\0", strtab + val)
                out.append(data[strtab + val : end].decode())
    return out


def library_problems(wheel: Path, forbidden: list[str]) -> list[str]:
    """Shared libraries of ``wheel`` that carry an rpath or embed one of ``forbidden``."""
    problems = []
    with zipfile.ZipFile(wheel) as zf:
        for name in sorted(n for n in zf.namelist() if n.endswith(".so")):
            data = zf.read(name)
            for rpath in elf_runpaths(data):
                problems.append(f"{wheel.name}: {name} has rpath/runpath {rpath!r}")
            for text in forbidden:
                if text.encode() in data:
                    problems.append(f"{wheel.name}: {name} embeds the build path {text!r}")
    return problems


def _members(path: Path) -> dict[str, str]:
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as zf:
            return {
                f"{i.filename} ({i.date_time}, {i.external_attr:o})": hashlib.sha256(zf.read(i)).hexdigest()
                for i in zf.infolist()
            }
    import tarfile

    with tarfile.open(path) as tf:
        return {
            f"{m.name} ({m.mtime}, {m.mode:o}, {m.uid}:{m.gid})": hashlib.sha256(
                tf.extractfile(m).read() if m.isfile() else b""
            ).hexdigest()
            for m in tf.getmembers()
        }


def compare(a: Path, b: Path) -> list[str]:
    """Empty when ``a`` and ``b`` are the same bytes; else what differs, member by member."""
    if a.name != b.name:
        return [f"file names differ: {a.name} vs {b.name}"]
    if _sha(a) == _sha(b):
        return []
    ma, mb = _members(a), _members(b)
    diff = sorted(set(ma.items()) ^ set(mb.items()))
    detail = "; ".join(k for k, _ in diff[:10]) or "same members, different archive bytes (order or header)"
    return [f"{a.name} is not reproducible: {detail}"]


def _build(src: Path, work: Path, target: str, env: dict[str, str]) -> Build:
    out = work / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--outdir", str(out), str(src)], check=True, env=env
    )
    (sdist,) = out.glob("*.tar.gz")
    wheel = _from_sdist.build_wheel(sdist, target, work / "unpacked", out, env=env)
    return Build(src=src, sdist=sdist, wheel=wheel, forbidden=[str(src), str(work), "build-env-"])


def build_twice(
    root: Path, workdir: Path, *, target: str = "cpu", env: dict[str, str] | None = None
) -> list[Build]:
    """Two builds of one snapshot of ``root`` from two directories; see the module docstring."""
    env = dict(os.environ if env is None else env)
    env.setdefault("SOURCE_DATE_EPOCH", DEFAULT_EPOCH)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    first = _stage.stage(root, workdir / "one" / "src")
    second = workdir / "second-copy-at-another-path" / "src"
    shutil.copytree(first, second, symlinks=True)
    return [_build(first, workdir / "one", target, env), _build(second, second.parent, target, env)]


def problems(builds: list[Build]) -> list[str]:
    """Every difference between the builds and every leaked path or rpath."""
    a, b = builds
    found = compare(a.sdist, b.sdist) + compare(a.wheel, b.wheel)
    forbidden = a.forbidden + b.forbidden
    for build in builds:
        found += library_problems(build.wheel, forbidden)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="opmux-repro-") as tmp:
        builds = build_twice(args.root, Path(tmp), target=args.target)
        found = problems(builds)
        for p in found:
            print(f"FAIL {p}", file=sys.stderr)
        if not found:
            a = builds[0]
            print(
                f"reproducible: {a.sdist.name} sha256 {_sha(a.sdist)[:16]}, {a.wheel.name} sha256 "
                f"{_sha(a.wheel)[:16]}: identical from two directories; no rpath, no build path"
            )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
