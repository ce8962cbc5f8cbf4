"""JIT compile and load times per module: cold compile, warm load (and nvcc compile only).

Usage: ``python benchmarks/jit_compile.py [--repeat N] [--archs sm_90a]``. Writes
``docs/benchmarks/jit_compile.md`` and ``.json``. Goals: a cold compile of a small module
under 3 s, a warm load (new process, tvm_ffi already imported) under 20 ms.

Each measurement runs in a fresh process with a fresh cache dir, so no per-process memo,
``--version`` memo or page-cache-warm compiler state from a previous module leaks in.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHONPATH = str(REPO / "python")
GOAL_COLD_S = 3.0
GOAL_WARM_MS = 20.0

_COLD = """\
import json, sys, time
from opmux.kernels.jit import kernel_path
from opmux.kernels.jit.modules import get
from opmux.kernels.jit.compile.load import ensure_built
archs = sys.argv[2].split(",") if sys.argv[2] else None
t = time.perf_counter()
r = ensure_built(get(sys.argv[1]), kernel_path=kernel_path(), archs=archs)
print(json.dumps({"seconds": time.perf_counter() - t, "compiled": r.compiled,
                  "size": r.library.stat().st_size}))
"""

_WARM = """\
import json, sys, time
import tvm_ffi  # imported first: its cost (torch) is the same with or without opmux
from opmux.kernels import jit
from opmux.kernels.jit.compile import stats
t = time.perf_counter()
jit.load_module(sys.argv[1])
print(json.dumps({"seconds": time.perf_counter() - t, "compiles": stats.compiles}))
"""


def _run(code: str, *args: str, cache: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": PYTHONPATH, "OPMUX_CACHE_DIR": str(cache)}
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench(repeat: int, archs: str) -> dict[str, object]:
    from opmux.kernels.jit import kernel_path
    from opmux.kernels.jit.compile.toolchain import ToolchainNotFound, find_cxx, find_nvcc
    from opmux.kernels.jit.modules import MODULES

    cxx = find_cxx()
    try:
        nvcc = find_nvcc()
    except ToolchainNotFound:
        nvcc = None
    rows = []
    for module in MODULES.values():
        missing = [s for s in module.sources if not (kernel_path() / "csrc" / s).is_file()]
        if missing:
            rows.append(
                {
                    "module": module.name,
                    "device": module.device,
                    "skipped": f"sources missing: {', '.join(missing)}",
                }
            )
            continue
        if module.device == "cuda" and nvcc is None:
            rows.append({"module": module.name, "device": "cuda", "skipped": "no nvcc"})
            continue
        cold, warm = [], []
        for _ in range(repeat):
            cache = Path(tempfile.mkdtemp(prefix="opmux-bench-"))
            try:
                r = _run(_COLD, module.name, archs if module.device == "cuda" else "", cache=cache)
                assert r["compiled"]
                cold.append(r["seconds"])
                size = r["size"]
                if module.device == "cpu":
                    w = _run(_WARM, module.name, cache=cache)
                    if w["compiles"]:  # sources edited between the runs: measure again
                        w = _run(_WARM, module.name, cache=cache)
                    if w["compiles"] == 0:
                        warm.append(w["seconds"] * 1e3)
            finally:
                shutil.rmtree(cache)
        row: dict[str, object] = {
            "module": module.name,
            "device": module.device,
            "cold_s": round(statistics.median(cold), 2),
            "cold_runs": [round(c, 2) for c in cold],
            "size_kib": round(size / 1024, 1),
        }
        if warm:
            row["warm_ms"] = round(statistics.median(warm), 2)
            row["warm_runs"] = [round(w, 2) for w in warm]
        if module.device == "cuda":
            row["archs"] = archs
        rows.append(row)
        print(f"{module.name}: {row}", file=sys.stderr)
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.1f} at start",
        "cxx": cxx.version,
        "nvcc": nvcc.version if nvcc else None,
        "repeat": repeat,
        "goals": {"cold_s": GOAL_COLD_S, "warm_ms": GOAL_WARM_MS},
        "date": time.strftime("%Y-%m-%d"),
        "rows": rows,
    }


def write(result: dict[str, object], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "jit_compile.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        "# JIT compile and load times",
        "",
        f"Generated by `benchmarks/jit_compile.py` on {result['date']} ({result['machine']}; "
        f"{result['cxx']}; nvcc: {result['nvcc']}). Median of {result['repeat']} runs, each in "
        "a fresh process and cache dir.",
        "",
        "- **cold**: key + compile + publish of a module absent from the cache "
        f"(goal < {GOAL_COLD_S:g} s for a small CPU module; CUDA rows are nvcc compile only, "
        "nothing runs here).",
        "- **warm load**: `load_module` in a new process with the module cached and tvm_ffi "
        f"already imported: key (compiler `--version`, source/header hashes), digest check, "
        f"dlopen (goal < {GOAL_WARM_MS:g} ms).",
        "",
        "| module | device | cold (s) | warm load (ms) | library | notes |",
        "|---|---|---:|---:|---:|---|",
    ]
    for r in result["rows"]:  # type: ignore[union-attr]
        if "skipped" in r:
            lines.append(f"| {r['module']} | {r['device']} | - | - | - | skipped: {r['skipped']} |")
            continue
        note = f"archs {r['archs']} + PTX" if r["device"] == "cuda" else ""
        warm = f"{r['warm_ms']:.1f}" if "warm_ms" in r else "-"
        lines.append(
            f"| {r['module']} | {r['device']} | {r['cold_s']:.2f} | {warm} | "
            f"{r['size_kib']:.0f} KiB | {note} |"
        )
    (out / "jit_compile.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--archs", default="sm_90a", help="CUDA archs for the nvcc rows")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks")
    args = parser.parse_args()
    sys.path.insert(0, PYTHONPATH)
    write(bench(args.repeat, args.archs), args.out)
    print(f"wrote {args.out / 'jit_compile.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
