"""examples/engine_dropin.py (a decode loop written against sgl_kernel / vLLM names) runs with
opmux by its import alone, and generates the same tokens on every CPU backend."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GROUPS = ("activation", "kvcache", "layernorm", "moe", "quantization", "rope")


def _run(backend: str | None) -> str:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "python"),
        "TRITON_INTERPRET": "1",
        "OPMUX_FALLBACK": "error",
    }
    if backend:
        env["OPMUX_KERNEL_BACKEND"] = ";".join(f"{g}.*={backend}" for g in GROUPS)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "engine_dropin.py"), "--steps", "2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=True,
    )
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("generated: ["), proc.stdout
    return line


def test_the_drop_in_loop_is_backend_independent() -> None:
    default = _run(None)
    assert {default} == {_run(b) for b in ("jit", "triton", "torch")}
