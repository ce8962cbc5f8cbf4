"""Each kernel's registers, spills, stack and static shared memory in a CUDA unit, as ptxas reports
them for one arch, optionally beside another revision's copy of the unit: a kernel change's first
check, on a machine without a GPU. Registers decide how many blocks an SM holds and spills cost
local-memory traffic, so a change that moves either wants a benchmark before it lands.

    python tools/kernel_resources.py sampling_cuda [--arch sm_90a] [--base REV] [--match REGEX] [--json]

UNIT is a unit of ``python/opmux/kernels/jit/csrc`` (``sampling_cuda``) or a ``.cu`` path. The
build is the JIT's (its flags, ``-c``, ``-Xptxas -v``; the tree's headers); ``--base REV`` also
builds the unit's file at that git revision, with the same headers, and shows both.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JIT = ROOT / "python" / "opmux" / "kernels" / "jit"
CSRC = JIT / "csrc"

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_BARRIERS = re.compile(r"used (\d+) barriers")
_SMEM = re.compile(r"(\d+) bytes smem")


@dataclass(frozen=True)
class Kernel:
    """One entry function as ptxas reported it."""

    name: str  # mangled
    arch: str
    registers: int
    spill_stores: int  # bytes
    spill_loads: int
    stack: int  # bytes of stack frame
    smem: int  # bytes of static shared memory
    barriers: int


def parse_ptxas(text: str) -> list[Kernel]:
    """The entry functions of ``-Xptxas -v`` output, in its order (device functions skipped)."""
    kernels: list[Kernel] = []
    entry: tuple[str, str] | None = None
    frame = (0, 0, 0)
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            entry, frame = (m.group(1), m.group(2)), (0, 0, 0)
        elif entry is not None and (m := _FRAME.search(line)):
            frame = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        elif entry is not None and (m := _USED.search(line)):
            smem, barriers = _SMEM.search(line), _BARRIERS.search(line)
            kernels.append(
                Kernel(
                    name=entry[0],
                    arch=entry[1],
                    registers=int(m.group(1)),
                    spill_stores=frame[1],
                    spill_loads=frame[2],
                    stack=frame[0],
                    smem=int(smem.group(1)) if smem else 0,
                    barriers=int(barriers.group(1)) if barriers else 0,
                )
            )
            entry = None
    return kernels


def demangle(names: Sequence[str]) -> dict[str, str]:
    """Readable names through ``c++filt`` where it exists (else the mangled ones)."""
    tool = shutil.which("c++filt")
    if tool is None or not names:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, check=False)
    lines = out.stdout.splitlines()
    if out.returncode != 0 or len(lines) != len(names):
        return {n: n for n in names}
    return dict(zip(names, lines, strict=True))


def _unit_source(unit: str) -> Path:
    path = Path(unit)
    if path.suffix == ".cu":
        if not path.is_file():
            raise SystemExit(f"kernel_resources: no file {path}")
        return path.resolve()
    src = CSRC / f"{unit}.cu"
    if not src.is_file():
        units = sorted(p.stem for p in CSRC.glob("*.cu"))
        raise SystemExit(f"kernel_resources: no CUDA unit {unit!r}; valid: {', '.join(units)}")
    return src


def compile_unit(src: Path, arch: str) -> list[Kernel]:
    """``src`` compiled as the JIT compiles it (its flags and includes) for ``arch``, to an object
    in a temporary folder; ptxas's report of its kernels."""
    if str(ROOT / "python") not in sys.path:
        sys.path.insert(0, str(ROOT / "python"))  # the tree's JIT flags, not an installed wheel's
    from opmux.kernels.jit.compile import build, toolchain

    nvcc = toolchain.find_nvcc()
    tvm_includes, _ = toolchain.tvm_ffi_paths()
    includes = [JIT / "include", CSRC, *tvm_includes]
    cutlass = toolchain.cutlass_include_dir()
    if cutlass is not None:
        includes.append(cutlass)
    with tempfile.TemporaryDirectory(prefix="opmux-resources-") as tmp:
        command = [
            nvcc.path,
            *build.compile_flags("cuda", archs=[arch]),
            *(f"-I{d}" for d in includes),
            "-c",
            str(src),
            "-o",
            str(Path(tmp) / "unit.o"),
            "-Xptxas",
            "-v",
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"kernel_resources: nvcc failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return parse_ptxas(done.stdout + done.stderr)


def _base_source(src: Path, rev: str, folder: Path) -> Path:
    rel = src.relative_to(ROOT).as_posix()
    shown = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:{rel}"], capture_output=True, text=True, check=False
    )
    if shown.returncode != 0:
        raise SystemExit(f"kernel_resources: git show {rev}:{rel} failed: {shown.stderr.strip()}")
    out = folder / src.name
    out.write_text(shown.stdout)
    return out


def render(tree: list[Kernel], base: list[Kernel] | None, names: dict[str, str]) -> str:
    """A table: one row per kernel of the tree (and, with a base, the base's figures beside it;
    kernels only one side has are marked)."""

    def cells(k: Kernel | None) -> list[str]:
        if k is None:
            return ["-"] * 4
        return [str(k.registers), f"{k.spill_stores}/{k.spill_loads}", str(k.stack), str(k.smem)]

    head = ["kernel", "regs", "spill st/ld", "stack", "smem"]
    rows: list[list[str]] = []
    if base is None:
        rows = [[names[k.name], *cells(k)] for k in tree]
    else:
        head = ["kernel", "regs", "base", "spill st/ld", "base", "stack", "base", "smem", "base", ""]
        by_name = {k.name: k for k in base}
        seen = set()
        for k in tree:
            b = by_name.get(k.name)
            seen.add(k.name)
            t, o = cells(k), cells(b)
            changed = "new" if b is None else ("*" if t != o else "")
            rows.append([names[k.name], t[0], o[0], t[1], o[1], t[2], o[2], t[3], o[3], changed])
        for b in base:
            if b.name not in seen:
                o = cells(b)
                rows.append([names[b.name], "-", o[0], "-", o[1], "-", o[2], "-", o[3], "gone"])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in [head, *rows]
    ]
    return "\n".join(line.rstrip() for line in lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("unit", help="a jit/csrc unit name (sampling_cuda) or a .cu path")
    ap.add_argument("--arch", default="sm_90a", help="one CUDA arch (default sm_90a)")
    ap.add_argument("--base", help="also the unit's file at this git revision, beside the tree's")
    ap.add_argument("--match", help="only kernels whose readable name matches this regular expression")
    ap.add_argument("--json", action="store_true", help="the figures as JSON")
    args = ap.parse_args(argv)

    src = _unit_source(args.unit)
    print(f"kernel_resources: compiling {src.name} for {args.arch} ...", file=sys.stderr, flush=True)
    tree = compile_unit(src, args.arch)
    base = None
    if args.base:
        with tempfile.TemporaryDirectory(prefix="opmux-resources-base-") as tmp:
            print(f"kernel_resources: compiling {src.name} at {args.base} ...", file=sys.stderr, flush=True)
            base = compile_unit(_base_source(src, args.base, Path(tmp)), args.arch)
    names = demangle(sorted({k.name for k in [*tree, *(base or [])]}))
    if args.match:
        keep = re.compile(args.match)
        tree = [k for k in tree if keep.search(names[k.name])]
        base = None if base is None else [k for k in base if keep.search(names[k.name])]
    if args.json:
        record = {
            "unit": src.name,
            "arch": args.arch,
            "tree": [asdict(k) | {"readable": names[k.name]} for k in tree],
        }
        if base is not None:
            record["base"] = {
                "rev": args.base,
                "kernels": [asdict(k) | {"readable": names[k.name]} for k in base],
            }
        print(json.dumps(record, indent=1))
    else:
        print(render(tree, base, names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
