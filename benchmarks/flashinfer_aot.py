"""Build FlashInfer's JIT modules ahead of time for one GPU architecture, on a machine without a GPU.

    python benchmarks/flashinfer_aot.py WHEEL --arch 9.0a --out DIR [--modules sampling,decode_bf16_128,...]

The offline benchmark machine would otherwise JIT-compile every FlashInfer module the peers' runs
touch (minutes of scarce device time per module, and the sources must travel too). FlashInfer loads
a module from ``flashinfer/data/aot/<name>/<name>.so`` without building it when that file exists
(``jit.env.get_aot_artifacts``), so ``fetch_peers.py --aot-arch`` puts what this script builds
there, in the trimmed wheel.

The build runs FlashInfer's own JIT machinery (its ninja files, its flags) from the unpacked wheel,
with ``FLASHINFER_CUDA_ARCH_LIST`` set to ``--arch``; what a CPU machine lacks is supplied for the
build only: cuRAND's and cuBLASLt's headers, where the toolkit has none, from the
``nvidia-curand`` / ``nvidia-cublas`` wheels of the toolkit's CUDA major (headers only unpacked),
``import flashinfer``'s own needs (``IMPORT_DEPS``), and an empty ``libcuda.so`` stub to link against (no driver symbol is used: the modules record only
``libcudart.so.<major>``, which the GPU machine's torch loads: build with the CUDA major of that
torch). nvcc must be on PATH (or CUDA_HOME).
Each module's build prints one line (name, seconds, size); a module that fails is reported and left
out, so the benchmark JIT-compiles or skips that one peer instead.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

#: the modules the GPU benchmarks touch (bench_gpu.FI_MODULES, bench_sampling.py,
#: bench_attention_decode.py and bench_attention_prefill.py's wrappers: bf16, D = 128, causal)
MODULES = (
    "sampling",
    "decode_bf16_128",
    "prefill_fa3_bf16_128",
    "norm",
    "silu_and_mul",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "rope",
    "quantization",
    "page",
)


def spec(key: str):  # type: ignore[no-untyped-def]
    """FlashInfer's JitSpec for one of ``MODULES`` (flashinfer imported from where it is: the
    unpacked wheel here, the installed one in bench_gpu.py's prebuild worker)."""
    import torch

    bf16, i32 = torch.bfloat16, torch.int32
    if key == "sampling":
        from flashinfer.jit.sampling import gen_sampling_module

        return gen_sampling_module()
    if key == "decode_bf16_128":  # BatchDecodeWithPagedKVCacheWrapper.plan's module, no rope / window / cap
        from flashinfer.jit.attention import gen_batch_decode_module

        return gen_batch_decode_module(bf16, bf16, bf16, i32, 128, 128, 0, False, False)
    if key == "prefill_fa3_bf16_128":  # BatchPrefillWithPagedKVCacheWrapper on sm_90a ("auto" -> fa3)
        from flashinfer.jit.attention import gen_batch_prefill_module

        return gen_batch_prefill_module("fa3", bf16, bf16, bf16, i32, 128, 128, 0, False, False, False)
    if key == "norm":
        from flashinfer.jit.norm import gen_norm_module

        return gen_norm_module()
    if key.endswith("_and_mul"):
        from flashinfer.jit.activation import gen_act_and_mul_module

        return gen_act_and_mul_module(key[: -len("_and_mul")])
    if key == "rope":
        from flashinfer.jit.rope import gen_rope_module

        return gen_rope_module()
    if key == "quantization":
        from flashinfer.jit.quantization import gen_quantization_module

        return gen_quantization_module()
    if key == "page":
        from flashinfer.jit.page import gen_page_module

        return gen_page_module()
    raise KeyError(f"unknown module {key!r}; known: {', '.join(MODULES)}")


def _worker(keys: list[str]) -> int:
    """In the build environment: build each module, one JSON line each on stdout."""
    failed = 0
    for key in keys:
        t = time.perf_counter()
        try:
            js = spec(key)
            js.build(verbose=False)
            so = Path(js.jit_library_path)  # the file just built (get_library_path may name an AOT one)
            rec = {"module": key, "name": js.name, "so": str(so), "s": round(time.perf_counter() - t, 1)}
        except Exception as exc:  # reported, the others still built
            failed += 1
            rec = {"module": key, "error": f"{type(exc).__name__}: {str(exc)[-2000:]}"}
        print(json.dumps(rec), flush=True)
    return 1 if failed else 0


#: what ``import flashinfer`` needs beyond torch (import name: distribution), installed for the
#: build only where this interpreter lacks it
IMPORT_DEPS = {
    "requests": "requests",
    "pynvml": "nvidia-ml-py",
    "einops": "einops",
    "tabulate": "tabulate",
    "ninja": "ninja",
    "tvm_ffi": "apache-tvm-ffi",
    "packaging": "packaging",
    "filelock": "filelock",
    "tqdm": "tqdm",
}


def _import_deps(tmp: Path) -> Path | None:
    """A folder with the distributions of ``IMPORT_DEPS`` that this interpreter cannot import."""
    import importlib.util

    missing = [dist for mod, dist in IMPORT_DEPS.items() if importlib.util.find_spec(mod) is None]
    if not missing:
        return None
    dest = tmp / "deps"
    print(f"installing for the build: {', '.join(missing)}", flush=True)
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--target", str(dest), *missing]  # with their needs
    subprocess.run(cmd, check=True)
    return dest


#: headers FlashInfer's sources include that a bare CUDA toolkit may lack: (header, the
#: distribution whose wheel carries it under ``nvidia/cu*/include``: CUDA 13's name; CUDA 12's
#: has the ``-cu12`` suffix)
TOOLKIT_HEADERS = (("curand.h", "nvidia-curand"), ("cublasLt.h", "nvidia-cublas"))


def cuda_major(home: str) -> int:
    """The toolkit's CUDA major version (nvcc --version's "release X.Y")."""
    nvcc = Path(home) / "bin" / "nvcc"
    out = subprocess.run(
        [str(nvcc) if nvcc.exists() else "nvcc", "--version"], capture_output=True, text=True
    )
    found = re.search(r"release (\d+)\.", out.stdout)
    if found is None:
        raise SystemExit(f"cannot read the CUDA version from nvcc --version: {out.stdout or out.stderr}")
    return int(found.group(1))


def _header_includes(tmp: Path, home: str, major: int) -> list[Path]:
    """Include folders for ``TOOLKIT_HEADERS`` missing from the toolkit: each wheel of the
    toolkit's CUDA major downloaded (pip) and only its headers unpacked."""
    found: list[Path] = []
    for header, dist13 in TOOLKIT_HEADERS:
        dist = dist13 if major >= 13 else f"{dist13}-cu{major}"
        if any((Path(home) / inc / header).exists() for inc in ("include", "targets/x86_64-linux/include")):
            continue
        dl = tmp / "dl" / dist
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(dl), dist]
        print(f"{header} is not in {home}: fetching {dist}'s headers", flush=True)
        if subprocess.run(cmd, check=False).returncode != 0:
            print(
                f"warning: {dist} could not be downloaded: modules including {header} will fail",
                file=sys.stderr,
            )
            continue
        dest = tmp / "headers" / dist
        for whl in dl.glob("*.whl"):
            with zipfile.ZipFile(whl) as zf:
                zf.extractall(dest, [n for n in zf.namelist() if "/include/" in n])
        found += sorted({p.parent for p in dest.rglob(header)})
    return found


def _cuda_stub(tmp: Path) -> Path:
    """A folder holding an empty ``libcuda.so`` (soname ``libcuda.so.1``) for the link step."""
    stub = tmp / "stubs"
    stub.mkdir(parents=True, exist_ok=True)
    src = stub / "empty.c"
    src.write_text("/* link-time stand-in for the driver library: no symbol is needed */\n")
    cc = shutil.which("cc") or shutil.which("gcc") or "cc"
    subprocess.run(
        [cc, "-shared", "-o", str(stub / "libcuda.so"), "-Wl,-soname,libcuda.so.1", str(src)], check=True
    )
    return stub


def _cuda_home() -> str:
    """The toolkit folder whose ``lib64`` / ``lib`` holds libcudart (CUDA_HOME, else nvcc's, else
    /usr/local/cuda)."""
    cands = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc is not None:
        cands.append(str(Path(nvcc).resolve().parent.parent))
    cands.append("/usr/local/cuda")
    for home in filter(None, cands):
        if any((Path(home) / lib / "libcudart.so").exists() for lib in ("lib64", "lib")):
            return home
    raise SystemExit("no CUDA toolkit with libcudart.so found: set CUDA_HOME (nvcc must be on PATH)")


def build(wheel: Path, arch: str, out: Path, keys: list[str], workdir: Path | None = None) -> dict[str, Path]:
    """Build ``keys`` from ``wheel`` for ``arch`` (e.g. ``9.0a``); returns {FlashInfer's module
    name: .so path under ``out``} for the ones that built."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fi-aot-", dir=workdir) as t:
        tmp = Path(t)
        pkg = tmp / "pkg"
        print(f"unpacking {wheel.name} ...", flush=True)
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(pkg)
        env = {k: v for k, v in os.environ.items() if k != "FLASHINFER_DISABLE_JIT"}  # this builds
        home = _cuda_home()
        major = cuda_major(home)
        print(
            f"CUDA {major} toolkit at {home}: the modules will need libcudart.so.{major} on the GPU machine "
            f"(a torch built for CUDA {major})",
            flush=True,
        )
        env.update(
            CUDA_HOME=home,
            FLASHINFER_CUDA_ARCH_LIST=arch,
            FLASHINFER_WORKSPACE_BASE=str(tmp / "ws"),
            FLASHINFER_EXTRA_LDFLAGS=f"-L{_cuda_stub(tmp)} -L{home}/lib64 -L{home}/lib",
        )
        deps = _import_deps(tmp)
        paths = [str(pkg), *([str(deps)] if deps else []), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        if deps is not None:  # ninja's executable, when it came from the wheel
            env["PATH"] = os.pathsep.join([str(deps / "bin"), env.get("PATH", "")])
        incs = _header_includes(tmp, home, major)
        if incs:
            env["FLASHINFER_EXTRA_CUDAFLAGS"] = " ".join(f"-I{p}" for p in incs)
            env["FLASHINFER_EXTRA_CFLAGS"] = env["FLASHINFER_EXTRA_CUDAFLAGS"]
        cmd = [sys.executable, __file__, "--worker", ",".join(keys)]
        built: dict[str, Path] = {}
        t0 = time.perf_counter()
        with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True, cwd=tmp) as proc:
            assert proc.stdout is not None
            for i, line in enumerate(proc.stdout, 1):
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if "error" in rec:
                    print(f"[{i}/{len(keys)}] {rec['module']}: FAILED {rec['error'][-400:]}", flush=True)
                    continue
                dest = out / rec["name"] / f"{rec['name']}.so"
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(rec["so"], dest)
                built[rec["name"]] = dest
                size = dest.stat().st_size / 2**20
                print(
                    f"[{i}/{len(keys)}] {rec['module']}: {rec['s']} s, {size:.1f} MiB ({rec['name'][:60]})",
                    flush=True,
                )
        if proc.returncode not in (0, 1):  # 1: some module failed (each reported above)
            print(f"warning: the build worker exited with {proc.returncode}", file=sys.stderr)
        print(f"built {len(built)} of {len(keys)} modules in {time.perf_counter() - t0:.0f} s", flush=True)
    return built


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("wheel", type=Path, nargs="?")
    ap.add_argument("--arch", default="9.0a", help="FLASHINFER_CUDA_ARCH_LIST (default 9.0a: H100 / H200)")
    ap.add_argument("--out", type=Path, default=Path("fi-aot"))
    ap.add_argument("--modules", default=",".join(MODULES), help=f"comma-separated, of: {', '.join(MODULES)}")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        return _worker([k for k in args.worker.split(",") if k])
    if args.wheel is None:
        ap.error("WHEEL is required")
    keys = [k for k in args.modules.split(",") if k]
    unknown = sorted(set(keys) - set(MODULES))
    if unknown:
        ap.error(f"unknown modules {unknown}; known: {', '.join(MODULES)}")
    built = build(args.wheel, args.arch, args.out, keys)
    return 0 if len(built) == len(keys) else 1


if __name__ == "__main__":
    sys.exit(main())
