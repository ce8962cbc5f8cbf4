"""tools/engine_compat.py runs an upstream-style test file unchanged: the import shims and the
CUDA-to-CPU device mapping."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

UPSTREAM_STYLE = """
import pytest
import sgl_kernel
import torch
from vllm import _custom_ops as ops


@pytest.mark.parametrize("hidden", [64, 128])
def test_rmsnorm_on_cuda(hidden):
    x = torch.randn(3, hidden).to(0).to(torch.float16)
    w = torch.randn(hidden, device="cuda").half()
    y = sgl_kernel.rmsnorm(x, w)
    out = torch.empty_like(x)
    ops.rms_norm(out, x, w, 1e-6)
    ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).half()
    torch.testing.assert_close(y, ref, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(out, ref, rtol=1e-3, atol=1e-3)
    torch.cuda.synchronize()


def test_a_failure_is_reported():
    assert sgl_kernel.silu_and_mul(torch.ones(2, 16).cuda()).shape == (2, 9)
"""


def test_runner_runs_upstream_style_files_on_cpu(tmp_path: Path) -> None:
    (tmp_path / "test_upstream_style.py").write_text(UPSTREAM_STYLE)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "engine_compat.py"),
            "--device",
            "cpu",
            str(tmp_path),
            "--",
            "-q",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    out = proc.stdout
    assert "sgl_kernel -> opmux.compat.sgl_kernel" in out, out
    assert "test_upstream_style.py: 1 failed, 2 passed" in out, out
    assert proc.returncode == 1, out
