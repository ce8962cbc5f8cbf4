"""Import-cleanliness checks of an installed opmux, each in a fresh subprocess.

Run with the interpreter of a venv that has only the wheel, torch and their dependencies:

    <venv>/bin/python -I tools/import_smoke.py

Each check runs ``python -I -c ...`` from a temporary working directory with a temporary HOME,
so neither the checkout nor python/ is on sys.path and nothing the import creates can hide.
Standard library only (this driver must not import opmux itself).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

__all__ = ["CHECKS", "main", "run_check"]

_PRELUDE = r"""
import json, os, sys, sysconfig, threading
def _maps():
    with open("/proc/self/maps") as f:
        return sorted({line.split()[-1] for line in f if "/" in line.split()[-1]})
def _tasks():
    return len(os.listdir("/proc/self/task"))
def _children():
    kids = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                kids |= set(f.read().split())
        except OSError:
            pass
    return sorted(kids)
def _report(**kw):
    print("RESULT " + json.dumps(kw))
"""

# name -> (code run after the prelude, what it asserts)
CHECKS: dict[str, str] = {
    "baseline-torch": """
        import torch
        _report(tasks=_tasks(), threads=threading.active_count(), children=_children())
    """,
    "import-opmux": """
        import opmux
        bad = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "triton", "tvm_ffi", "numpy"))
        paths = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
        _report(bad=bad, file=opmux.__file__, site=sorted(paths), path=sys.path)
    """,
    "import-opmux.kernels": """
        import opmux.kernels
        bad = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "triton", "tvm_ffi"))
        _report(bad=bad)
    """,
    "import-opmux.kernels.ops": """
        import opmux.kernels.ops
        import torch
        bad = sorted(m for m in sys.modules if m.split(".")[0] in ("triton", "tvm_ffi"))
        # by file name: a venv whose path happens to contain "opmux" must not match torch's files
        maps = [p for p in _maps() if os.path.basename(p).startswith("libopmux") or "tvm_ffi" in os.path.basename(p)
                or "/opmux/" in p.split("site-packages", 1)[-1]]
        _report(bad=bad, maps=maps, cuda_initialized=bool(torch.cuda.is_initialized()),
                tasks=_tasks(), threads=threading.active_count(), children=_children())
    """,
}


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def run_check(name: str, *, python: str = sys.executable) -> tuple[dict, set[str], set[str]]:
    """Run one check; return its report, files created in HOME and files created in the cwd."""
    with tempfile.TemporaryDirectory(prefix="opmux-smoke-") as tmp:
        home, cwd = Path(tmp, "home"), Path(tmp, "cwd")
        home.mkdir()
        cwd.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "OPMUX_", "TRITON_"))}
        env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"))
        code = _PRELUDE + textwrap.dedent(CHECKS[name])
        proc = subprocess.run(
            [python, "-I", "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{name}: the subprocess failed (exit {proc.returncode}):\n{proc.stderr}")
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            raise RuntimeError(f"{name}: no RESULT line in output:\n{proc.stdout}\n{proc.stderr}")
        return json.loads(line[len("RESULT ") :]), _files(home), _files(cwd)


def main(argv: list[str] | None = None) -> int:
    failures: list[str] = []

    def fail(check: str, msg: str) -> None:
        failures.append(f"{check}: {msg}")

    results = {}
    for name in CHECKS:
        try:
            results[name] = report, home_files, cwd_files = run_check(name)
        except RuntimeError as exc:
            fail(name, str(exc))
            continue
        if home_files:
            fail(name, f"created files in HOME: {sorted(home_files)} (expected none, e.g. no ~/.cache/opmux)")
        if cwd_files:
            fail(name, f"created files in the working directory: {sorted(cwd_files)}")
        if report.get("bad"):
            fail(name, f"imported {report['bad']}")
        if report.get("maps"):
            fail(name, f"mapped compiled libraries {report['maps']} (importing must load no compiled code)")
        if report.get("cuda_initialized"):
            fail(name, "initialised CUDA (torch.cuda.is_initialized() is True)")
        if "file" in report:
            in_site = any(Path(report["file"]).is_relative_to(p) for p in report["site"])
            if not in_site:
                fail(
                    name, f"opmux was imported from {report['file']}, not from site-packages {report['site']}"
                )
            repo = Path(__file__).resolve().parent.parent
            if any(p and Path(p).resolve() in (repo, repo / "python") for p in report["path"]):
                fail(name, f"the checkout is on sys.path: {report['path']}")
    base = results.get("baseline-torch", ({},))[0]
    ops = results.get("import-opmux.kernels.ops", ({},))[0]
    if base and ops:
        if ops["threads"] > base["threads"] or ops["tasks"] > base["tasks"]:
            fail(
                "import-opmux.kernels.ops",
                f"started threads: {ops['threads']} Python / {ops['tasks']} OS threads after import, "
                f"torch alone has {base['threads']} / {base['tasks']}",
            )
        if len(ops["children"]) > len(base["children"]):
            fail(
                "import-opmux.kernels.ops",
                f"started processes {ops['children']} (torch alone: {base['children']})",
            )
    for name in CHECKS:
        status = "FAIL" if any(f.startswith(name + ":") for f in failures) else "ok"
        print(f"import-smoke {status:4} {name}")
    for f in failures:
        print(f"FAIL {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
