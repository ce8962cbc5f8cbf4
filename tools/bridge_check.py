"""The installed wheel's prebuilt torch bridge serves a fresh process with no compiler and no build.

Run with the interpreter of a venv that has the wheel and torch:

    <venv>/bin/python -I tools/bridge_check.py [--require]

In a fresh subprocess (``python -I`` from a temporary directory, a fresh empty ``OPMUX_CACHE_DIR``,
``CXX`` naming no compiler), it calls ``silu_and_mul`` (the default call) and
``torch.ops.opmux.silu_and_mul`` (twice: the first call registers the C++ kernels, on its thread,
as with a cache-built bridge), and checks: the bridge was loaded from the wheel (``shipped``),
the library op ran its C++ kernel through a lane with the right result, ``python -m
opmux.kernels env`` says ``shipped``, and nothing was compiled (no ``builds.log``, no bridge in the
cache). Where the wheel ships no bridge for this interpreter's torch build, Python and tvm-ffi, it
says so and passes, unless ``--require`` (the release rehearsal, whose pinned torch is one of every
target's ``bridge_torch``). Standard library only (this driver must not import opmux itself).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["main"]

_CODE = r"""
import json
import torch
import opmux
from opmux.kernels import _bridge_build, _bridge_key, ops, torch_kernels
x = torch.randn(8, 128)
want = torch.nn.functional.silu(x[:, :64]) * x[:, 64:]
ops.activation.silu_and_mul(x)  # the default call: the bridge's entry wants the bridge
torch.ops.opmux.silu_and_mul(x)  # the first library-op call registers the C++ kernels (its thread)
before = torch_kernels.lane_calls()
y = torch.ops.opmux.silu_and_mul(x)
print("RESULT " + json.dumps({
    "key": _bridge_key.current().filename(),
    "shipped": sorted(opmux.build_info().get("bridges", {})),
    "state": torch_kernels.status()[0],
    "detail": torch_kernels.status()[1],
    "source": torch_kernels.source(),
    "lane_calls": torch_kernels.lane_calls() - before,
    "correct": bool(torch.allclose(y, want, atol=1e-5, rtol=1e-5)),
    "env": _bridge_build.state(),
}))
"""


def _run(require: bool) -> list[str]:
    """The check's problems (empty: it passed, or there was nothing to check without ``require``)."""
    with tempfile.TemporaryDirectory(prefix="opmux-bridge-") as tmp:
        cache, cwd = Path(tmp, "cache"), Path(tmp, "cwd")
        cwd.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "OPMUX_", "TRITON_"))}
        env.update(HOME=tmp, OPMUX_CACHE_DIR=str(cache), CXX=str(Path(tmp, "no-compiler", "c++")))
        proc = subprocess.run(
            [sys.executable, "-I", "-c", _CODE],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if proc.returncode != 0:
            return [f"the subprocess failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"]
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            return [f"no RESULT line:\n{proc.stdout}\n{proc.stderr}"]
        r = json.loads(line[len("RESULT ") :])
        compiled = sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if "torch_bridge" in p.parts)
    if r["key"] not in r["shipped"]:
        note = (
            f"the wheel ships no torch bridge for this process ({r['key']}; it has {r['shipped'] or 'none'})"
        )
        if require:
            return [note]
        print(f"bridge-check n/a  {note}: a process here builds one into its JIT cache")
        return []
    problems = []
    if (r["state"], r["source"]) != ("ready", "shipped"):
        problems.append(
            f"the bridge is {r['state']!r} from {r['source'] or 'nowhere'} ({r['detail']}), not shipped"
        )
    if r["lane_calls"] < 1:
        problems.append("torch.ops.opmux.silu_and_mul did not run the C++ kernel (no lane call)")
    if not r["correct"]:
        problems.append("torch.ops.opmux.silu_and_mul gave a wrong result")
    if r["env"].get("state") != "shipped":
        problems.append(f"`python -m opmux.kernels env` says {r['env']}, not shipped")
    if compiled:
        problems.append(f"a bridge build was started in the fresh cache: {compiled}")
    if not problems:
        print(f"bridge-check ok   {r['key']}: shipped, C++ kernel ran, nothing compiled")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument(
        "--require", action="store_true", help="fail when no bridge is shipped for this torch"
    )
    args = parser.parse_args(argv)
    problems = _run(args.require)
    for p in problems:
        print(f"FAIL bridge-check: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
