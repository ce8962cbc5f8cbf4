"""Fetch the peer libraries of the GPU benchmark as wheels for the offline H200, and trim FlashInfer.

    python benchmarks/fetch_peers.py [--dir .whl] [--no-download]

The device machine has no internet, so peers travel as wheels in ``.whl/`` (ignored by git; the
device tool's ``carry``). The whole working tree plus carried paths must stay under 64 MiB, and
``flashinfer-python`` 0.7.4 is a ~100 MB wheel (mostly CUDA sources of kernels we do not
benchmark), so it is rewritten into a trimmed wheel of the same name and version that keeps:

* every Python file of the package (so any import, eager or lazy, resolves: ``import
  flashinfer`` itself imports ``flashinfer.fused_moe``); the modules the benchmark runs
  (``VERBATIM_PY``) verbatim, the others as ``ast.unparse`` writes them without docstrings
  (checked to parse to the same code; comments, docstrings and layout go, which takes 24 MiB of
  compressed Python down to about 14);
* the sources of the JIT modules the benchmarks and parity-cuda build (norm, activation, rope,
  quantization, page; the samplers, batch decode and prefill, their jinja templates read for
  includes like a source) and the transitive ``#include`` closure of those over FlashInfer's
  bundled include trees (include, csrc, cutlass, spdlog; every match, a superset of what the
  compiler picks); headers that do not resolve there come from the CUDA toolkit, exactly as they
  would with the full wheel;
* the whole vendored CCCL (it is first on the include path, and the toolkit's own headers, e.g.
  cooperative_groups, include ``<cuda/std/...>`` headers that must then come from it);
* the non-source package data (json, jinja templates, ...), except files over
  ``LARGE_DATA`` bytes outside the benchmarked modules (build manifests of other kernels).

With ``--aot-arch 9.0a`` the JIT modules the GPU benchmarks touch (the glue ops', the samplers',
bf16 batch decode and FA3 paged prefill at D = 128) are built here first, from the whole wheel, by
``flashinfer_aot.py``, and ride in the trimmed wheel as FlashInfer's own AOT files
(``flashinfer/data/aot/<name>/<name>.so``): the device machine then loads them without compiling.
Their gen functions still run at first use (they render jinja templates and copy sources from the
top of ``data/csrc`` before finding the built file), so those top-level files are kept too.

The RECORD is regenerated, and a ``TRIMMED`` note is added to the dist-info. Wheels fetched:
liger-kernel (pure Python), apache-tvm-ffi (cp312 manylinux; opmux's compiled code binds through
it, and the device image lacks it), flashinfer-python, nvidia-cudnn-frontend (cp312 manylinux: the
``cudnn`` backend of attention.paged_prefill; it loads the image's libcudnn, torch's), and
nvidia-cutlass at ``targets.toml``'s pin
(:func:`cutlass_pin`). Their other requirements are already in
the device image (see benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import ast
import base64
import hashlib
import re
import stat
import subprocess
import sys
import zipfile
from pathlib import Path, PurePosixPath

PEERS = (
    "liger-kernel==0.8.5",
    "apache-tvm-ffi==0.1.15.post2",
    "flashinfer-python==0.7.4",
    "nvidia-cudnn-frontend==1.32.0",
)


def cutlass_pin() -> str:
    """The CUTLASS headers package the CUDA wheels build with (``targets.toml``'s pin, stated
    there once): a tree run on the device machine JIT-builds opmux's CUTLASS units (``gemm_cuda``,
    ``moe_grouped_cuda``) from it, and fails with ``ToolchainNotFound`` without it."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    try:
        import targets  # the repository's target table reader (tools/targets.py)
    finally:
        sys.path.pop(0)
    pins = {r for t in targets.load().values() for r in t.build_requires if r.startswith("nvidia-cutlass")}
    if len(pins) != 1:
        raise SystemExit(
            f"fetch_peers: expected one nvidia-cutlass pin in targets.toml, found {sorted(pins)}"
        )
    return pins.pop()


PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "any",
)

# JIT modules the benchmarks and parity-cuda build: their translation units (relative to
# flashinfer/data/csrc)
CSRC_UNITS = (
    "norm.cu",
    "flashinfer_norm_binding.cu",
    "rope.cu",
    "flashinfer_rope_binding.cu",
    "quantization.cu",
    "csf_scales.cu",
    "flashinfer_quantization_binding.cu",
    "page.cu",
    "flashinfer_page_binding.cu",
    # parity-cuda's FlashInfer backends: the samplers, batch decode and batch prefill (their
    # generated units come from the templates, read for their includes like a source)
    "sampling.cu",
    "renorm.cu",
    "flashinfer_sampling_binding.cu",
    "batch_decode.cu",
    "batch_decode_jit_binding.cu",
    "batch_decode_customize_config.jinja",
    "batch_decode_kernel_inst.jinja",
    "batch_prefill.cu",
    "batch_prefill_jit_binding.cu",
    "batch_prefill_paged.cu",
    "batch_prefill_paged_jit_binding.cu",
    "batch_prefill_fp8_sm90.cu",
    "batch_prefill_fp8_paged_sm90_kernel_inst.jinja",
    "batch_prefill_fp8_ragged_sm90_kernel_inst.jinja",
    "batch_prefill_customize_config.jinja",
    "batch_prefill_paged_kernel_inst.jinja",
    "batch_prefill_ragged_kernel_inst.jinja",
    "batch_prefill_sm90.cu",
    "batch_prefill_sm90_jit_binding.cu",
    "batch_prefill_sm90_customize_config.jinja",
    "batch_prefill_paged_sm90_kernel_inst.jinja",
    "batch_prefill_ragged_sm90_kernel_inst.jinja",
)
# headers the generated activation source includes
EXTRA_ROOT_HEADERS = ("flashinfer/activation.cuh", "tvm_ffi_utils.h")
INCLUDE_ROOTS = (
    "data/cccl/cub",
    "data/cccl/libcudacxx/include",
    "data/cccl/thrust",
    "data/include",
    "data/csrc",
    "data/cutlass/include",
    "data/cutlass/tools/util/include",
    "data/spdlog/include",
)
#: non-Python files larger than this (bytes) are dropped outside VERBATIM_PY
LARGE_DATA = 16 * 1024
# Python the benchmark runs, kept byte for byte (every other .py is kept with its comments and
# docstrings blanked: see strip_py)
VERBATIM_PY = (
    "flashinfer/__init__.py",
    "flashinfer/activation.py",
    "flashinfer/rope.py",
    "flashinfer/page.py",
    "flashinfer/utils.py",
    "flashinfer/api_logging.py",
    "flashinfer/norm/",
    "flashinfer/quantization/",
    "flashinfer/jit/",
)
SOURCE_EXT = (".cu", ".cuh", ".h", ".hpp", ".inl", ".cpp", ".cc", ".c", ".inc", ".ptx")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]', re.M)


def download(dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for req in (*PEERS, cutlass_pin()):
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.12",
            "--implementation",
            "cp",
            "-d",
            str(dest),
            req,
        ]
        for p in PLATFORMS:
            cmd += ["--platform", p]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)


def _include_closure(names: dict[str, zipfile.ZipInfo], zf: zipfile.ZipFile, pkg: str) -> set[str]:
    roots = [f"{pkg}/{r}" for r in INCLUDE_ROOTS]
    todo = [f"{pkg}/data/csrc/{u}" for u in CSRC_UNITS]
    for h in EXTRA_ROOT_HEADERS:
        for r in roots:
            if f"{r}/{h}" in names:
                todo.append(f"{r}/{h}")
                break
    seen: set[str] = set()
    while todo:
        path = todo.pop()
        if path in seen or path not in names:
            continue
        seen.add(path)
        text = zf.read(path).decode("utf-8", "replace")
        here = str(PurePosixPath(path).parent)
        for inc in INCLUDE_RE.findall(text):
            for base in (here, *roots):
                cand = str(PurePosixPath(base) / inc)
                # normalise ../
                parts: list[str] = []
                for seg in cand.split("/"):
                    if seg == "..":
                        if parts:
                            parts.pop()
                    elif seg and seg != ".":
                        parts.append(seg)
                cand = "/".join(parts)
                if cand in names:  # every match, not only the first: a superset of what the compiler picks
                    todo.append(cand)
    missing = [u for u in CSRC_UNITS if f"{pkg}/data/csrc/{u}" not in names]
    if missing:
        print(f"warning: translation units not in the wheel: {missing}", file=sys.stderr)
    return seen


def strip_py(src: str) -> str:
    """``src`` without comments, docstrings and layout (``ast.unparse``), when the result parses
    to the same code (docstrings aside); else ``src`` as it is. Line numbers change: tracebacks
    from these modules point into the published wheel's files only approximately."""
    try:
        tree = ast.parse(src)
        for doc in _docstrings(tree):
            doc.value = ""
        out = ast.unparse(tree)
        same = ast.dump(ast.parse(out)) == ast.dump(tree)
    except (SyntaxError, ValueError, RecursionError):  # newer syntax than this interpreter reads, ...
        return src
    return out + "\n" if same else src


def _docstrings(tree: ast.AST) -> list[ast.Constant]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    found.append(first.value)
    return found


def trim_flashinfer(wheel: Path, aot: dict[str, Path] | None = None) -> Path:
    """Rewrite ``wheel`` in place, trimmed; ``aot``: {module name: built .so} to add as
    ``flashinfer/data/aot/<name>/<name>.so``."""
    pkg = "flashinfer"
    aot = aot or {}
    with zipfile.ZipFile(wheel) as zf:
        infos = zf.infolist()
        names = {i.filename: i for i in infos}
        headers = _include_closure(names, zf, pkg)
        keep: list[zipfile.ZipInfo] = []
        distinfo = next(n for n in names if n.endswith(".dist-info/RECORD")).rsplit("/", 1)[0]
        for i in infos:
            n = i.filename
            if n.endswith("/") or n == f"{distinfo}/RECORD":
                continue
            if n.startswith(distinfo + "/"):
                keep.append(i)
                continue
            if n.endswith(".py"):  # every one (see the module docstring)
                keep.append(i)
            elif aot and n.startswith(f"{pkg}/data/csrc/") and n.count("/") == 3:
                keep.append(i)  # the AOT modules' gen functions still read their templates here
            elif n.startswith(f"{pkg}/data/cccl/"):
                keep.append(
                    i
                )  # whole: the CUDA toolkit's own headers include the vendored CCCL (it is -I first)
            elif n in headers:  # the units (templates too) and their include closure
                keep.append(i)
            elif n.endswith(SOURCE_EXT) or ("/data/" in n and Path(n).suffix == ""):
                continue  # sources and extensionless headers outside the closure
            elif "/data/" in n:
                continue  # build scripts, licences of dropped trees, ...
            elif "/csrc/" in n or "/kernel_src/" in n:
                continue  # sources of kernels the benchmark does not build
            elif i.file_size > LARGE_DATA and not n.startswith(VERBATIM_PY):
                continue  # large data of other kernels (build manifests, kernel tables, ...)
            else:
                keep.append(i)
        out = wheel.with_suffix(".trimmed")
        record: list[str] = []
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zo:
            stripped = 0
            for i in keep:
                data = zf.read(i.filename)
                if i.filename.endswith(".py") and not i.filename.startswith(VERBATIM_PY):
                    new = strip_py(data.decode("utf-8")).encode("utf-8")
                    stripped += new != data
                    data = new
                zo.writestr(i, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                record.append(f"{i.filename},sha256={digest},{len(data)}")
            for name, so in sorted(aot.items()):
                data = so.read_bytes()
                arc = f"{pkg}/data/aot/{name}/{name}.so"
                info = zipfile.ZipInfo(arc, date_time=(2020, 1, 1, 0, 0, 0))
                info.external_attr = (stat.S_IFREG | 0o755) << 16  # a regular file pip makes executable
                zo.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                record.append(f"{arc},sha256={digest},{len(data)}")
            note = (
                f"Trimmed by opmux benchmarks/fetch_peers.py for the offline benchmark machine: kept "
                f"{len(keep)} of {len(infos)} files: every Python file ({stripped} rewritten by "
                f"ast.unparse without comments and docstrings); CUDA sources only for {', '.join(CSRC_UNITS)} "
                f"and their #include closure; {len(aot)} modules built ahead of time (data/aot): "
                f"{', '.join(sorted(aot)) or 'none'}.\n"
            ).encode()
            zo.writestr(f"{distinfo}/TRIMMED", note)
            digest = base64.urlsafe_b64encode(hashlib.sha256(note).digest()).rstrip(b"=").decode()
            record.append(f"{distinfo}/TRIMMED,sha256={digest},{len(note)}")
            record.append(f"{distinfo}/RECORD,,")
            zo.writestr(f"{distinfo}/RECORD", "\n".join(record) + "\n")
    before = wheel.stat().st_size
    out.replace(wheel)
    print(
        f"trimmed {wheel.name}: {before / 2**20:.1f} MiB -> {wheel.stat().st_size / 2**20:.1f} MiB "
        f"({len(keep)} of {len(infos)} files, {len(headers)} C++ files)",
        flush=True,
    )
    return wheel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path(".whl"))
    ap.add_argument(
        "--no-download", action="store_true", help="only trim the flashinfer wheel already in --dir"
    )
    ap.add_argument(
        "--aot-arch",
        help="build the benchmarks' FlashInfer modules for this arch first (e.g. 9.0a; needs nvcc) "
        "and ship them in the trimmed wheel (flashinfer_aot.py)",
    )
    ap.add_argument("--aot-modules", help="comma-separated subset of flashinfer_aot.MODULES")
    args = ap.parse_args()
    keys: list[str] = []
    if args.aot_arch:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import flashinfer_aot

        keys = args.aot_modules.split(",") if args.aot_modules else list(flashinfer_aot.MODULES)
        unknown = sorted(set(keys) - set(flashinfer_aot.MODULES))
        if unknown:
            ap.error(f"unknown --aot-modules {unknown}; known: {', '.join(flashinfer_aot.MODULES)}")
    if not args.no_download:
        download(args.dir)
    for w in sorted(args.dir.glob("flashinfer_python-*.whl")):
        with zipfile.ZipFile(w) as zf:
            if any(n.endswith(".dist-info/TRIMMED") for n in zf.namelist()):
                print(f"{w.name}: already trimmed (--aot-arch needs the whole wheel: download it again)")
                continue
        aot: dict[str, Path] = {}
        if args.aot_arch:
            import tempfile

            with tempfile.TemporaryDirectory(prefix="fi-aot-out-") as t:
                aot = flashinfer_aot.build(w, args.aot_arch, Path(t), keys)
                if len(aot) < len(keys):  # the wheel stays whole: fix the build, run again
                    print(
                        f"{len(keys) - len(aot)} module(s) failed: {w.name} left untrimmed", file=sys.stderr
                    )
                    sys.exit(1)
                trim_flashinfer(w, aot)
            continue
        trim_flashinfer(w)
    total = 0
    for w in sorted(args.dir.glob("*.whl")):
        total += w.stat().st_size
        print(f"{w.stat().st_size / 2**20:8.2f} MiB  {w.name}")
    print(f"{total / 2**20:8.2f} MiB  total")


if __name__ == "__main__":
    main()
