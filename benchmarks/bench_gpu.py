"""opmux against its peers on one GPU, in one run (the method of shared/ANCHORS.md).

    python benchmarks/bench_gpu.py --out DIR [--quick] [--ops rmsnorm,silu] [--replays 30] [--budget-s 420]

For each op and shape: every opmux backend (forced with ``backend=``, ``OPMUX_FALLBACK=error``),
torch eager (the plain reference as users write it, in the input dtype), ``torch.compile`` of it
(default mode, warmed up), Liger-Kernel and FlashInfer when importable. Each implementation is
checked once against a float32 reference (relative L2 error; bf16 tolerance) before it is timed;
a wrong one is recorded as ``wrong`` and not timed. Timing: R back-to-back calls captured in one
CUDA graph, cycling over up to 64 input sets so the working set exceeds L2, one graph per
implementation and the graphs of a case replayed in turn (the order rotated every round:
``time_impls``, so that clock drift favours no column); median over ``--replays`` replays, in
microseconds per call (plain CUDA-event timing of R eager calls where a capture fails, recorded
as such). Bytes: each input read once, each output written once. Copy
bandwidth (device-to-device copy of 2 GiB, read + write) is measured in the same run.

Writes DIR/bench.json (raw numbers and metadata; rewritten after every op, so a run cut short
keeps what it measured), DIR/bench.md and DIR/bench.png (benchmarks/render_bench.py). Progress
goes to stdout. See benchmarks/README.md for the device command line.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

#: opmux backends never timed here (not a GPU backend / not a kernel)
SKIP_BACKENDS = {"reference", "torch_npu"}
FI_MODULES = ("norm", "silu_and_mul", "rope", "quantization", "gelu_tanh_and_mul", "gelu_and_mul", "page")
L2_BYTES_DEFAULT = 60 * 2**20
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    ap.add_argument("--out", type=Path, required=True, help="folder for bench.json, bench.md, bench.png")
    ap.add_argument("--quick", action="store_true", help="2 shapes per op, few replays")
    ap.add_argument(
        "--ops", default="", help="comma-separated filter: substrings of op names (e.g. rmsnorm,silu)"
    )
    ap.add_argument("--impls", default="", help="comma-separated filter on implementation names (debugging)")
    ap.add_argument("--replays", type=int, default=None, help="graph replays per case (default 30, quick 10)")
    ap.add_argument(
        "--target-us", type=float, default=None, help="graph length aimed at, us (default 1500, quick 600)"
    )
    ap.add_argument("--max-sets", type=int, default=64, help="most input sets cycled per case")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=420.0,
        help="wall-clock budget; cases left when it is spent are recorded as skipped",
    )
    ap.add_argument("--no-compile", action="store_true", help="leave out torch.compile")
    ap.add_argument("--no-peers", action="store_true", help="leave out Liger-Kernel and FlashInfer")
    ap.add_argument(
        "--no-fi-prebuild", action="store_true", help="build FlashInfer's JIT modules on first use instead"
    )
    ap.add_argument("--fi-wait-s", type=float, default=240.0, help="longest wait for a FlashInfer JIT module")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fi-prebuild", default=None, help=argparse.SUPPRESS)  # internal: worker mode
    ap.add_argument("--fi-status", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.replays is None:
        args.replays = 10 if args.quick else 30
    if args.target_us is None:
        args.target_us = 600.0 if args.quick else 1500.0
    return args


def select_cases(all_cases: list[Any], ops: str, quick: bool) -> list[tuple[Any, list[Any]]]:
    wanted = [w.strip() for w in ops.split(",") if w.strip()]
    out = []
    for c in all_cases:
        if wanted and not any(w in c.op for w in wanted):
            continue
        out.append((c, list(c.quick if quick else c.shapes)))
    return out


# ---------------------------------------------------------------------------------------------
# FlashInfer environment and background JIT build


def flashinfer_env(cap: tuple[int, int] | None) -> dict[str, str]:
    """Environment for FlashInfer's JIT: only this GPU's arch, the CUDA (not CuTe DSL) norm kernels,
    cuBLAS headers from the pip packages when the toolkit lacks them."""
    env: dict[str, str] = {"FLASHINFER_USE_CUDA_NORM": "1"}
    if cap is not None:
        env["FLASHINFER_CUDA_ARCH_LIST"] = f"{cap[0]}.{cap[1]}" + ("a" if cap[0] in (9, 10, 12) else "")
    env["FLASHINFER_WORKSPACE_BASE"] = os.environ.get(
        "FLASHINFER_WORKSPACE_BASE", "/tmp/opmux-bench-flashinfer"
    )
    cuda_home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    extra: list[str] = []
    for header in (
        "cublasLt.h",
        "curand_kernel.h",
    ):  # toolkit headers FlashInfer's norm/quant sources include
        if Path(cuda_home, "include", header).exists():
            continue
        for p in map(Path, sys.path):
            hits = list(p.glob(f"nvidia/*/include/{header}")) + list(p.glob(f"nvidia/include/{header}"))
            if hits:
                inc = f"-isystem {hits[0].parent}"
                if inc not in extra:
                    extra.append(inc)
                break
    if extra:
        for var in ("FLASHINFER_EXTRA_CUDAFLAGS", "FLASHINFER_EXTRA_CFLAGS"):
            env[var] = " ".join([os.environ.get(var, ""), *extra]).strip()
    return env


def fi_prebuild_worker(modules: list[str], status: Path) -> int:
    """Worker process: build FlashInfer JIT modules (3 at a time), one status line each."""
    from concurrent.futures import ThreadPoolExecutor

    from flashinfer_aot import spec  # the module names' JIT specs, as fetch_peers --aot-arch builds them

    lock = threading.Lock()

    def build(name: str) -> None:
        t = time.perf_counter()
        try:
            spec(name).build_and_load()
            rec = {"module": name, "ok": True, "s": round(time.perf_counter() - t, 1)}
        except BaseException as exc:
            rec = {
                "module": name,
                "ok": False,
                "s": round(time.perf_counter() - t, 1),
                "error": _err(exc, 1500),
            }
        with lock, status.open("a") as f:
            f.write(json.dumps(rec) + "\n")

    import flashinfer  # noqa: F401 - fail early (and report) if it does not import

    with ThreadPoolExecutor(3) as ex:
        list(ex.map(build, modules))
    return 0


class FlashInferBuild:
    """The background JIT build of FlashInfer's modules, and waiting for one of them."""

    def __init__(self, status: Path | None, proc: subprocess.Popen[bytes] | None, wait_s: float) -> None:
        self.status, self.proc, self.wait_s = status, proc, wait_s

    def _read(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        if self.status and self.status.exists():
            for line in self.status.read_text().splitlines():
                try:
                    rec = json.loads(line)
                    out[rec["module"]] = rec
                except (ValueError, KeyError):
                    pass
        return out

    def wait(self, module: str, deadline: float) -> str | None:
        """None when ``module`` is ready (or no background build runs); else why it is not."""
        if self.proc is None:
            return None
        end = min(time.perf_counter() + self.wait_s, deadline)
        announced = False
        while True:
            rec = self._read().get(module)
            if rec is not None:
                return (
                    None if rec["ok"] else f"FlashInfer JIT build of {module} failed: {rec.get('error', '?')}"
                )
            if self.proc.poll() is not None:
                rec = self._read().get(module)
                if rec is not None:
                    return (
                        None
                        if rec["ok"]
                        else f"FlashInfer JIT build of {module} failed: {rec.get('error', '?')}"
                    )
                return (
                    f"FlashInfer JIT build process exited ({self.proc.returncode}) before building {module}"
                )
            if time.perf_counter() > end:
                return f"FlashInfer JIT module {module} not built within the wait limit"
            if not announced:
                log(f"  waiting for FlashInfer JIT module {module} ...")
                announced = True
            time.sleep(0.5)

    def summary(self) -> dict[str, Any]:
        return {"background": self.proc is not None, "modules": self._read()}


def start_fi_prebuild(
    out: Path, modules: list[str], wait_s: float, name: str = "fi_build"
) -> FlashInferBuild:
    """Start building FlashInfer's JIT ``modules`` in a background process (this script's
    ``--fi-prebuild`` worker; the environment of ``flashinfer_env`` must already be set):
    status lines in OUT/.<name>_status.jsonl, compiler output in OUT/.<name>.log. Also used by
    bench_chain.py."""
    status = out / f".{name}_status.jsonl"
    status.unlink(missing_ok=True)
    logf = open(out / f".{name}.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--out",
            str(out),
            "--fi-prebuild",
            ",".join(modules),
            "--fi-status",
            str(status),
        ],
        stdout=logf,
        stderr=subprocess.STDOUT,
        env=dict(os.environ),
    )
    log(f"FlashInfer JIT build started in the background: {', '.join(modules)}")
    return FlashInferBuild(status, proc, wait_s)


# ---------------------------------------------------------------------------------------------
# timing


def _err(exc: BaseException, limit: int = 600) -> str:
    s = f"{type(exc).__name__}: {exc}".strip()
    return s if len(s) <= limit else s[: limit // 2] + " ... " + s[-limit // 2 :]


def copy_bandwidth(torch: Any, nbytes: int = 2 * 2**30, reps: int = 20) -> dict[str, float]:
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    src.random_(0, 255)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e-3)
    med = statistics.median(ts)
    ok = bool(torch.equal(src[:4096], dst[:4096]))
    del src, dst
    torch.cuda.empty_cache()
    return {"bytes": 2 * nbytes, "s": med, "GBps": 2 * nbytes / med / 1e9, "checked": ok}


def _warm_up(torch: Any, fn: Any, sets: list[Any]) -> None:
    """A few calls on a side stream before capture (compiles, allocator pools, lazy init)."""
    n = len(sets)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(min(3, n) if n > 1 else 2):
            fn(sets[i % n])
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()


def _capture(torch: Any, fn: Any, sets: list[Any], R: int) -> Any:
    """One CUDA graph of R calls cycling over ``sets``, replayed once."""
    n = len(sets)
    g = torch.cuda.CUDAGraph()
    keep = []
    with torch.cuda.graph(g):
        for i in range(R):
            keep.append(fn(sets[i % n]))  # keep outputs alive: each call writes its own memory
    del keep
    g.replay()
    torch.cuda.synchronize()
    return g


def _time_graph(torch: Any, fn: Any, sets: list[Any], R: int, replays: int) -> dict[str, Any]:
    """Median us per call over ``replays`` replays of one captured graph of R calls."""
    g = _capture(torch, fn, sets, R)
    ts = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / R)
    del g
    return {"us": statistics.median(ts), "us_min": min(ts), "us_max": max(ts), "method": "graph", "R": R}


def time_impls(
    torch: Any,
    fns: dict[str, Any],
    sets: list[Any],
    R: int,
    replays: int,
    sets_of: dict[str, list[Any]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Like :func:`time_impl` for several implementations of one case, their replays interleaved:
    one graph of R calls each, then ``replays`` rounds that replay every graph once, each round in
    a rotated order; the median per implementation. Under fp8 load the clocks drift within
    seconds, and timing the implementations one after another hands the first ones the cooler
    GPU (on an H100 the same GEMM 10% apart as the first and a late column); interleaved, each
    sees the same conditions. ``sets_of``: an implementation's own input sets (a peer's layout of
    them), else ``sets``. One whose capture fails is timed alone (:func:`time_impl`); one that
    fails that too gets ``{"error": ...}``. Every graph, with the outputs of its R calls, is held
    until the last round: the memory of all the columns at once."""
    out: dict[str, dict[str, Any]] = {}
    graphs: dict[str, Any] = {}
    for name, fn in fns.items():
        its_sets = (sets_of or {}).get(name, sets)
        try:
            _warm_up(torch, fn, its_sets)
            graphs[name] = _capture(torch, fn, its_sets, R)
        except Exception:
            try:
                torch.cuda.synchronize()
            except Exception:
                pass
            try:
                out[name] = time_impl(torch, fn, its_sets, R, replays)
            except Exception as exc:  # this column only: the others are still timed
                out[name] = {"error": _err(exc, 300)}
    names = list(graphs)
    ts: dict[str, list[float]] = {name: [] for name in names}
    try:
        for r in range(replays):
            k = r % len(names) if names else 0
            for name in names[k:] + names[:k]:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                graphs[name].replay()
                b.record()
                b.synchronize()
                ts[name].append(a.elapsed_time(b) * 1e3 / R)
    except Exception as exc:  # a fault in a replay: every graphed column is reported, none timed
        why = _err(exc, 300)
        graphs.clear()
        return {n: out.get(n, {"error": f"replays: {why}"}) for n in fns}
    for name in names:
        t = ts[name]
        out[name] = {
            "us": statistics.median(t),
            "us_min": min(t),
            "us_max": max(t),
            "method": "graph, interleaved",
            "R": R,
        }
    graphs.clear()
    return {n: out[n] for n in fns}  # the columns in the caller's order


def time_impl(
    torch: Any, fn: Any, sets: list[Any], R: int, replays: int, graph: bool = True
) -> dict[str, Any]:
    """Median us per call over ``replays`` replays of a graph of R calls cycling over ``sets``
    (``graph=False``, or a call the capture refuses: R calls between two events, host work
    included)."""
    n = len(sets)
    _warm_up(torch, fn, sets)
    capture_error = "not asked (graph=False)"
    if graph:
        try:
            return _time_graph(torch, fn, sets, R, replays)
        except Exception as exc:
            capture_error = _err(exc, 300)
            try:
                torch.cuda.synchronize()
            except Exception:
                pass
    # eager fallback: R calls between two events (includes CPU launch overhead)
    R2 = min(R, 200)
    ts = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for i in range(R2):
            fn(sets[i % n])
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / R2)
    return {
        "us": statistics.median(ts),
        "us_min": min(ts),
        "us_max": max(ts),
        "method": "events",
        "R": R2,
        "capture_error": capture_error,
    }


def plan(nbytes: int, l2: int, max_sets: int, target_us: float, mem_cap: int = 8 * 2**30) -> tuple[int, int]:
    """(input sets, calls per graph) for a case moving ``nbytes`` per call."""
    sets = max(1, min(max_sets, math.ceil(3 * l2 / max(nbytes, 1)), max(1, mem_cap // max(nbytes, 1))))
    est_us = nbytes / 3.5e6 + 2.0
    R = max(sets, min(2000, math.ceil(target_us / est_us)))
    return sets, R


# ---------------------------------------------------------------------------------------------
# the run


def environment(torch: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
    }
    for mod in ("triton", "liger_kernel", "flashinfer", "tvm_ffi", "opmux"):
        try:
            if mod == "liger_kernel":
                from importlib.metadata import version

                meta[mod] = version("liger-kernel")
            elif mod == "flashinfer":
                from importlib.metadata import version

                meta[mod] = version("flashinfer-python")
            else:
                meta[mod] = getattr(__import__(mod), "__version__", "?")
        except Exception as exc:
            meta[mod] = f"not installed ({_err(exc, 120)})"
    try:
        import opmux

        meta["opmux_file"] = opmux.__file__
        meta["opmux_build"] = opmux.build_info() if hasattr(opmux, "build_info") else None
    except Exception as exc:
        meta["opmux_build"] = _err(exc)
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        meta["device"] = p.name
        meta["capability"] = f"{p.major}.{p.minor}"
        meta["sms"] = p.multi_processor_count
        meta["memory_GiB"] = round(p.total_memory / 2**30, 1)
        meta["l2_bytes"] = getattr(p, "L2_cache_size", None) or getattr(p, "l2_cache_size", None)
    try:
        q = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=driver_version,clocks.sm,clocks.mem,power.limit",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=20,
        )
        meta["nvidia_smi"] = q.stdout.strip()
    except Exception as exc:
        meta["nvidia_smi"] = _err(exc, 100)
    meta["env"] = {
        k: v for k, v in os.environ.items() if k.startswith(("OPMUX_", "FLASHINFER_", "TORCH_", "TRITON_"))
    }
    return meta


def peers_for(case: Any, no_peers: bool) -> list[Any]:
    if no_peers:
        return [("Liger", "left out (--no-peers)"), ("FlashInfer", "left out (--no-peers)")]
    out = []
    for p in case.peers():
        if isinstance(p, tuple):
            out.append(p)
            continue
        lib = {"Liger": "liger_kernel", "FlashInfer": "flashinfer"}.get(p.name)
        if lib:
            try:
                __import__(lib)
            except Exception as exc:
                out.append((p.name, f"not installed ({_err(exc, 200)})"))
                continue
        out.append(p)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    os.environ.setdefault("OPMUX_FALLBACK", "error")
    os.environ["OPMUX_FALLBACK"] = "error"
    import bench_cases as bc
    import torch
    from render_bench import render_all

    deadline = T0 + args.budget_s
    if not torch.cuda.is_available():
        raise SystemExit("bench_gpu.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    cap = torch.cuda.get_device_capability(0)
    os.environ.update(flashinfer_env(cap))
    args.out.mkdir(parents=True, exist_ok=True)
    chosen = select_cases(bc.cases(), args.ops, args.quick)
    if not chosen:
        raise SystemExit(f"--ops {args.ops!r} matches no op; ops: {', '.join(c.op for c in bc.cases())}")

    # FlashInfer's JIT modules build in the background while the rest runs
    fib = FlashInferBuild(None, None, args.fi_wait_s)
    fi_err = None
    if not args.no_peers:
        try:
            import flashinfer  # noqa: F401
        except Exception as exc:
            fi_err = _err(exc, 300)
    if not args.no_peers and fi_err is None and not args.no_fi_prebuild:
        needed: list[str] = []
        for case, _ in chosen:
            for p in case.peers():
                if not isinstance(p, tuple) and p.fi_module and p.fi_module not in needed:
                    needed.append(p.fi_module)
        if needed:
            fib = start_fi_prebuild(args.out, needed, args.fi_wait_s)

    meta = environment(torch)
    meta["args"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    meta["flashinfer_import_error"] = fi_err
    l2 = int(meta.get("l2_bytes") or L2_BYTES_DEFAULT)
    log(
        f"device {meta.get('device')} sm_{cap[0]}{cap[1]}, torch {torch.__version__}, triton {meta.get('triton')}, "
        f"liger {meta.get('liger_kernel')}, flashinfer {meta.get('flashinfer')}, opmux {meta.get('opmux')}"
    )
    cb = copy_bandwidth(torch)
    meta["copy"] = cb
    log(f"copy bandwidth {cb['GBps']:.0f} GB/s (2 GiB device-to-device, read + write)")
    result: dict[str, Any] = {"meta": meta, "ops": []}
    out_json = args.out / "bench.json"

    def save() -> None:
        meta["flashinfer_build"] = fib.summary()
        meta["elapsed_s"] = round(time.perf_counter() - T0, 1)
        tmp = out_json.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(result, indent=1, default=str))
        tmp.replace(out_json)

    impl_filter = [w.strip() for w in args.impls.split(",") if w.strip()]
    for case, shapes in chosen:
        t_op = time.perf_counter()
        rec: dict[str, Any] = {"op": case.op, "family": case.family, "notes": case.notes, "cases": []}
        result["ops"].append(rec)
        try:
            from opmux.kernels import explain, registry

            fn = case.opmux_fn()
            backends = [b for b in registry.get(case.op).backend_names if b not in SKIP_BACKENDS]
        except Exception as exc:
            rec["skipped"] = f"opmux op does not import: {_err(exc, 400)}"
            log(f"{case.op}: SKIPPED ({rec['skipped']})")
            save()
            continue
        rec["backends"] = backends
        peers = peers_for(case, args.no_peers)
        compiled = None
        if not args.no_compile:
            compiled = torch.compile(case.eager)
        impls: list[tuple[str, str, Any]] = [(f"opmux:{b}", "opmux", b) for b in backends]
        impls.append(("torch eager", "peer", None))
        if compiled is not None:
            impls.append(("torch.compile", "peer", None))
        for p in peers:
            impls.append((p[0] if isinstance(p, tuple) else p.name, "peer", p))
        if impl_filter:
            impls = [i for i in impls if any(w in i[0] for w in impl_filter)]
        rec["impls"] = [i[0] for i in impls]
        log(f"{case.op}: {len(shapes)} shapes x {len(impls)} implementations ({', '.join(rec['impls'])})")
        for shape in shapes:
            crec: dict[str, Any] = {
                "shape": shape.as_dict(),
                "label": shape.label,
                "bytes": case.nbytes(shape),
                "impls": {},
            }
            rec["cases"].append(crec)
            if time.perf_counter() > deadline:
                crec["skipped"] = "time budget spent"
                continue
            t_case = time.perf_counter()
            try:
                nsets, R = plan(crec["bytes"], l2, args.max_sets, args.target_us)
                sets = [case.make(shape, bc._gen("cuda", args.seed * 1000 + i), "cuda") for i in range(nsets)]
                ref = case.reference(bc.clone_args(sets[0]))
                # timing replays of in-place ops rewrite the sets: check every impl on this copy
                pristine = bc.clone_args(sets[0])
                crec.update(sets=nsets, R=R)
                pos, kw = case.callargs(sets[0])
                try:
                    crec["default"] = explain(case.op, *pos, **kw).chosen
                except Exception as exc:
                    crec["default_error"] = _err(exc, 300)
            except Exception as exc:
                crec["error"] = f"inputs/reference: {_err(exc, 400)}"
                log(f"  {shape.label}: ERROR {crec['error']}")
                continue
            timed: dict[str, tuple[Any, list[Any]]] = {}  # checked columns: (call, its input sets)
            for name, kind, what in impls:
                ir: dict[str, Any] = {"kind": kind}
                crec["impls"][name] = ir
                if isinstance(what, tuple):  # peer not available
                    ir["status"] = "unavailable"
                    ir["why"] = what[1]
                    continue
                if time.perf_counter() > deadline:
                    ir["status"] = "skipped"
                    ir["why"] = "time budget spent"
                    continue
                try:
                    if kind == "opmux":

                        def call(a: Any, b: str = what, case: Any = case, fn: Any = fn) -> Any:
                            p_, k_ = case.callargs(a)
                            return fn(*p_, **k_, backend=b)

                        outs_of = case.outputs
                        set_list = sets
                    elif name == "torch eager":

                        def call(a: Any, case: Any = case) -> Any:
                            return case.eager(*a)

                        outs_of = case.eager_outputs
                        set_list = sets
                    elif name == "torch.compile":

                        def call(a: Any, compiled: Any = compiled) -> Any:
                            return compiled(*a)

                        outs_of = case.eager_outputs
                        set_list = sets
                    else:
                        if what.fi_module:
                            why = fib.wait(what.fi_module, deadline)
                            if why:
                                ir["status"] = "failed"
                                ir["error"] = why
                                continue
                        call = what.fn
                        outs_of = what.outputs
                        set_list = [what.prepare(s) for s in sets] if what.prepare else sets
                    # correctness, on a fresh copy of the untouched set 0 (in-place ops write their
                    # inputs, and earlier impls' timing replays have rewritten `sets`)
                    probe = bc.clone_args(pristine)
                    if kind == "peer" and what is not None and getattr(what, "prepare", None):
                        probe = what.prepare(probe)
                    ret = call(probe)
                    torch.cuda.synchronize()
                    ok, err, detail = bc.compare(case, outs_of(probe, ret), ref)
                    ir["rel_err"] = err if math.isfinite(err) else None
                    ir["check"] = detail
                    del probe, ret
                    if not ok:
                        ir["status"] = "wrong"
                        continue
                    timed[name] = (call, set_list)  # timed with the case's other columns below
                except Exception as exc:
                    ir["status"] = "failed"
                    ir["error"] = _err(exc)
                    try:
                        torch.cuda.synchronize()
                    except Exception as exc2:
                        ir["error"] += f" | then: {_err(exc2, 200)}"
                        save()
                        raise
            # the checked columns' replays interleaved (time_impls): each sees the same clocks
            times = time_impls(
                torch,
                {n: c for n, (c, _) in timed.items()},
                sets,
                R,
                args.replays,
                sets_of={n: s for n, (_, s) in timed.items()},
            )
            for name, t in times.items():
                ir = crec["impls"][name]
                if "us" in t:
                    ir.update(t, status="ok")
                    ir["GBps"] = crec["bytes"] / (t["us"] * 1e-6) / 1e9
                    ir["frac_copy"] = ir["GBps"] / cb["GBps"]
                else:
                    ir.update(status="failed", error=t["error"])
            del timed, times
            if any(r.get("status") == "failed" for r in crec["impls"].values()):
                try:  # a fault that outlives its column ends the run here, its record saved
                    torch.cuda.synchronize()
                except Exception:
                    save()
                    raise
            summarize_case(crec)
            del sets, ref
            torch.cuda.empty_cache()
            log(f"  {shape.label}: {case_line(crec)}  [{time.perf_counter() - t_case:.1f}s]")
        log(f"{case.op}: done in {time.perf_counter() - t_op:.1f}s")
        save()
    if fib.proc is not None and fib.proc.poll() is None:
        fib.proc.terminate()
    meta["finished"] = True
    save()
    render_all(result, args.out / "bench.md", args.out / "bench.png", title_prefix="")
    for p in (args.out / ".fi_build_status.jsonl",):
        p.unlink(missing_ok=True)
    return result


def summarize_case(crec: dict[str, Any]) -> None:
    ok = {n: r for n, r in crec["impls"].items() if r.get("status") == "ok"}
    peers = {n: r for n, r in ok.items() if r["kind"] == "peer"}
    if peers:
        best = min(peers, key=lambda n: peers[n]["us"])
        crec["best_peer"] = best
        crec["best_peer_us"] = peers[best]["us"]
    opm = {n: r for n, r in ok.items() if r["kind"] == "opmux"}
    if opm:
        crec["best_opmux"] = min(opm, key=lambda n: opm[n]["us"])
    d = crec.get("default")
    if d is not None:
        r = crec["impls"].get(f"opmux:{d}")
        if r and r.get("status") == "ok":
            crec["default_us"] = r["us"]
            crec["default_frac_copy"] = r["frac_copy"]
            if "best_peer_us" in crec:
                crec["ratio_default_best_peer"] = r["us"] / crec["best_peer_us"]


def case_line(crec: dict[str, Any]) -> str:
    parts = []
    for n, r in crec["impls"].items():
        st = r.get("status")
        if st == "ok":
            parts.append(f"{n} {r['us']:.2f}" + ("*" if r.get("method") == "events" else ""))
        elif st in ("wrong", "failed"):
            parts.append(f"{n} {st.upper()}")
    tail = ""
    if "ratio_default_best_peer" in crec:
        tail = f" | default {crec.get('default')} / {crec.get('best_peer')} = {crec['ratio_default_best_peer']:.2f}"
    return "; ".join(parts) + tail


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.fi_prebuild is not None:
        return fi_prebuild_worker([m for m in args.fi_prebuild.split(",") if m], args.fi_status)
    try:
        run(args)
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        return 1
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
