"""``python -m opmux.kernels.jit``: prewarm the JIT cache, and list / prune / clear it.

Prewarm builds each module in its own child process (its own session), so ``-j`` runs them
in parallel and ``--budget`` can stop in-flight compiles by killing their process groups;
the cache's staging/lock design makes a killed build harmless. The CUDA archs are found once,
before any child starts: with no GPU here and none named (``--archs``, ``$OPMUX_CUDA_ARCHS``)
the CUDA modules are skipped in one line that says how to name one. Errors go to stderr, exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

from .. import _env
from .compile import cache as _cache
from .compile import toolchain as _toolchain
from .compile.publish import cache_root
from .compile.toolchain import parse_cuda_archs
from .modules import MODULES, JitModule

__all__ = ["PrewarmResult", "main", "prewarm"]

_CHILD = """\
import json, sys
from pathlib import Path
from opmux.kernels.jit.modules import JitModule
from opmux.kernels.jit.compile.load import ensure_built
from opmux.kernels.jit.compile import CompileError, JitUnavailable, ToolchainNotFound
s = json.loads(sys.argv[1])
m = JitModule(s["name"], tuple(s["sources"]), s["device"])
try:
    r = ensure_built(m, kernel_path=Path(s["kernel_path"]), archs=s["archs"] or None,
                     allow_compile=True)
except ToolchainNotFound as e:
    print(json.dumps({"status": "skipped", "detail": str(e).splitlines()[0]})); sys.exit(0)
except (CompileError, JitUnavailable, ValueError) as e:
    print(json.dumps({"status": "failed", "detail": str(e)})); sys.exit(0)
print(json.dumps({"status": "compiled" if r.compiled else "cached", "detail": str(r.library)}))
"""


@dataclass(frozen=True)
class PrewarmResult:
    """One module's outcome: compiled, cached, skipped, failed or stopped (budget)."""

    name: str
    device: str
    status: str
    seconds: float
    detail: str = ""


def _child_env() -> dict[str, str]:
    # The child must import this same opmux (a checkout on PYTHONPATH or an install).
    package_parent = str(Path(__file__).resolve().parents[3])
    env = _env.child_environ()  # config.scope() overrides too: they are not in os.environ
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    return env


def _cuda_archs(modules: Sequence[JitModule], archs: Sequence[str]) -> tuple[list[str], str | None]:
    """(archs for the CUDA modules, None) or ([], why none can be built here).

    Named archs (``--archs``) are used as they are. Otherwise the archs are detected once, here,
    as every child would (``$OPMUX_CUDA_ARCHS``, else the visible GPUs through torch), and handed
    to the children. No nvcc is not decided here: each module reports it (skipped) in its child.
    """
    if archs or not any(m.device == "cuda" for m in modules):
        return list(archs), None
    try:
        nvcc = _toolchain.find_nvcc()
    except _toolchain.ToolchainNotFound:
        return [], None
    try:
        return _toolchain.local_cuda_archs(nvcc=nvcc), None
    except RuntimeError as exc:  # no GPU visible, a CPU-only torch, a broken driver
        reason = str(exc).removeprefix("opmux: ")
        return [], f"{reason}, or pass --archs (e.g. --archs 9.0a)"


def _kill(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()  # reap it and close its pipes


def prewarm(
    modules: Sequence[JitModule],
    *,
    kernel_path: Path,
    archs: Sequence[str] = (),
    jobs: int = 1,
    budget: float | None = None,
    out: TextIO | None = None,
) -> list[PrewarmResult]:
    """Build ``modules`` into the cache, ``jobs`` at a time, stopping at ``budget`` seconds.

    Prints one line per module to ``out`` (stderr), and one line for all the CUDA modules when
    no arch can be found for them here (skipped). Compiling is allowed even under
    ``OPMUX_JIT=0``: that variable forbids compiling at run time, and this is build time.
    """
    out = sys.stderr if out is None else out
    start = time.monotonic()
    pending = list(modules)
    running: dict[subprocess.Popen[str], tuple[JitModule, float]] = {}
    results: list[PrewarmResult] = []
    archs, no_archs = _cuda_archs(pending, archs)
    if no_archs is not None:
        cuda = [m for m in pending if m.device == "cuda"]
        pending = [m for m in pending if m.device != "cuda"]
        results.extend(PrewarmResult(m.name, m.device, "skipped", 0.0, no_archs) for m in cuda)
        out.write(
            f"opmux: prewarm: {len(cuda)} CUDA module(s) skipped "
            f"({', '.join(m.name for m in cuda)}): {no_archs}\n"
        )
        out.flush()
    env = _child_env()

    def report(result: PrewarmResult) -> None:
        results.append(result)
        tail = f": {result.detail}" if result.status in ("failed", "skipped", "stopped") else ""
        out.write(
            f"opmux: prewarm {result.name} ({result.device}) ... {result.status} "
            f"in {result.seconds:.1f} s{tail}\n"
        )
        out.flush()

    while pending or running:
        over = budget is not None and time.monotonic() - start >= budget
        if over:
            for proc, (module, t0) in list(running.items()):
                _kill(proc)
                report(
                    PrewarmResult(
                        module.name,
                        module.device,
                        "stopped",
                        time.monotonic() - t0,
                        f"budget of {budget:g} s reached",
                    )
                )
            for module in pending:
                report(
                    PrewarmResult(
                        module.name, module.device, "stopped", 0.0, f"budget of {budget:g} s reached"
                    )
                )
            break
        while pending and len(running) < max(1, jobs):
            module = pending.pop(0)
            spec = {
                "name": module.name,
                "sources": list(module.sources),
                "device": module.device,
                "kernel_path": str(kernel_path),
                "archs": list(archs),
            }
            proc = subprocess.Popen(
                [sys.executable, "-c", _CHILD, json.dumps(spec)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                start_new_session=True,
            )
            running[proc] = (module, time.monotonic())
        for proc in [p for p in running if p.poll() is not None]:
            module, t0 = running.pop(proc)
            stdout, stderr = proc.communicate()
            seconds = time.monotonic() - t0
            if proc.returncode == 0 and stdout.strip():
                info = json.loads(stdout.strip().splitlines()[-1])
                report(PrewarmResult(module.name, module.device, info["status"], seconds, info["detail"]))
            else:
                lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
                report(
                    PrewarmResult(
                        module.name,
                        module.device,
                        "failed",
                        seconds,
                        "\n".join(lines[-20:]) or f"exit {proc.returncode}",
                    )
                )
        time.sleep(0.02)
    return results


def _format_size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _cmd_prewarm(args: argparse.Namespace, table: Mapping[str, JitModule], kernel_path: Path) -> int:
    names = args.modules or [m.name for m in table.values()]
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ValueError(f"unknown JIT module(s) {', '.join(unknown)}; valid: {', '.join(sorted(table))}")
    selected = [table[n] for n in names if args.device is None or table[n].device == args.device]
    # settings the builds read, validated here so a typo is one error line, not N failed builds
    for name in (
        "OPMUX_JIT_LOCK_TIMEOUT",
        "OPMUX_JIT_COMPILE_TIMEOUT",
        "OPMUX_CUDA_ARCHS",
        "OPMUX_CACHE_DIR",
    ):
        _env.get(name)
    cache_root()
    archs = parse_cuda_archs(" ".join(args.archs)) if args.archs else []
    results = prewarm(selected, kernel_path=kernel_path, archs=archs, jobs=args.jobs, budget=args.budget)
    failed = any(r.status == "failed" for r in results)
    if args.torch_kernels:  # imports torch: only when asked
        from opmux.kernels import torch_kernels

        try:
            torch_kernels.build(out=sys.stderr, retry=True)
        except Exception as exc:
            print(f"opmux: prewarm torch_bridge ... failed: {exc}", file=sys.stderr)
            failed = True
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=1))
    return 1 if failed else 0


def _cmd_cache(args: argparse.Namespace) -> int:
    root = cache_root(create=False)
    action = args.action or "list"
    if action == "list":
        rows = _cache.list_entries(root)
        if args.json:
            print(json.dumps({"root": str(root), "entries": rows}, indent=1))
        else:
            print(f"cache: {root}")
            for r in rows:
                age = (time.time() - r["last_used"]) / 86400
                print(
                    f"  {r['module']:<18} {r['device']:<5} {r['key'][:12]}  "
                    f"{_format_size(r['size']):>10}  used {age:.1f} d ago  {r['status']}"
                )
            if not rows:
                print("  (empty)")
        return 0
    summary = _cache.prune(root, older_than_days=args.older_than) if action == "prune" else _cache.clear(root)
    if args.json:
        print(json.dumps({"root": str(root), **summary}))
    else:
        print(
            f"cache: {root}: removed {summary['removed']}"
            + (f"; skipped {len(summary['skipped_busy'])} being built" if summary["skipped_busy"] else "")
        )
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m opmux.kernels.jit",
        allow_abbrev=False,
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    sub = parser.add_subparsers(dest="command", required=True)
    pre = sub.add_parser("prewarm", allow_abbrev=False, help="compile JIT modules into the cache")
    pre.add_argument("--modules", nargs="+", metavar="NAME", help="default: all")
    pre.add_argument("--device", choices=("cpu", "cuda"), help="only this device's modules")
    pre.add_argument(
        "--archs",
        nargs="+",
        metavar="ARCH",
        help="CUDA archs, e.g. sm_90a 10.0a (default: $OPMUX_CUDA_ARCHS or the GPUs)",
    )
    pre.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    pre.add_argument(
        "--torch-kernels",
        action="store_true",
        help="also build the torch library ops' C++ kernels for this torch (imports torch)",
    )
    pre.add_argument(
        "--budget", type=float, metavar="SECONDS", help="stop (killing in-flight compiles) after this long"
    )
    pre.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
    cache = sub.add_parser("cache", allow_abbrev=False, help="list, prune or clear the cache")
    cache.add_argument("action", nargs="?", choices=("list", "prune", "clear"), default="list")
    cache.add_argument(
        "--older-than", type=float, metavar="DAYS", help="prune: also remove entries unused for DAYS days"
    )
    cache.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
    return parser


def main(
    argv: Sequence[str] | None = None,
    *,
    table: Mapping[str, JitModule] | None = None,
    kernel_path: Path | None = None,
) -> int:
    """Run the CLI; ``table``/``kernel_path`` replace the module table and KERNEL_PATH (tests)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on a usage error; the CLI contract is 1
        return 0 if exc.code in (0, None) else 1
    try:
        if args.command == "prewarm":
            if args.jobs < 1:
                raise ValueError(f"-j must be at least 1, not {args.jobs}")
            if kernel_path is None:
                from . import kernel_path as _kernel_path

                kernel_path = _kernel_path()
            return _cmd_prewarm(args, MODULES if table is None else table, kernel_path)
        return _cmd_cache(args)
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
