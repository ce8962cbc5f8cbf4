"""python -m opmux.kernels.profile: opmux kernels mapped to ops and backends, unfused sequences
found with the op that replaces them (a real CPU torch profiler trace, plus device kernel names)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from opmux.kernels import profile as triage
from opmux.kernels.ops import layernorm


def _hf_rmsnorm(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, -1)
    return torch.cat((-x2, x1), -1)


def _trace(tmp_path: Path) -> Path:
    x, r, w = torch.randn(4, 64), torch.randn(4, 64), torch.ones(64)
    g = torch.randn(4, 128)
    cos, sin = torch.randn(4, 64), torch.randn(4, 64)
    assert callable(layernorm.rmsnorm)  # builds the op: registers opmux::rmsnorm
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            _hf_rmsnorm(x + r, w)  # residual add + RMSNorm
            torch.nn.functional.silu(g[:, :64]) * g[:, 64:]  # gated MLP
            a = x.abs().amax(-1, keepdim=True)  # per-token fp8 quant
            (x / (a / 448.0)).to(torch.float8_e4m3fn)
            x * cos + _rotate_half(x) * sin  # rope
            torch.ops.opmux.rmsnorm(x, w, 1e-6)  # the library op, as a compiled graph calls it
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    return path


def test_triage_of_a_real_trace(tmp_path: Path) -> None:
    report = triage.analyze(triage.load_events(_trace(tmp_path)))
    found = {f.use: f for f in report.unfused}
    assert found["opmux.kernels.ops.layernorm.fused_add_rmsnorm"].count == 2
    assert found["opmux.kernels.ops.activation.silu_and_mul"].count == 2
    assert found["opmux.kernels.ops.quantization.per_token_quant_fp8"].count == 2
    assert found["opmux.kernels.ops.rope.rotary_embedding"].count == 2
    assert all(f.time_us > 0 for f in report.unfused)
    lib = [k for k in report.kernels if k.backend == "library op"]
    assert [(k.op, k.calls) for k in lib] == [("layernorm.rmsnorm", 2)]


def test_device_kernel_names_map_to_ops(tmp_path: Path) -> None:
    names = triage.kernel_names()
    assert names["norm_reg_kernel"] == ("layernorm", "aot/jit")
    assert names["_topk_softmax"] == ("moe", "triton")
    events = [
        {
            "ph": "X",
            "cat": "kernel",
            "name": "void opmux::norm_reg_kernel<__nv_bfloat16, 1>(P)",
            "ts": 0,
            "dur": 5,
        },
        {"ph": "X", "cat": "kernel", "name": "_topk_softmax", "ts": 10, "dur": 3},
        {"ph": "X", "cat": "kernel", "name": "_topk_softmax", "ts": 20, "dur": 4},
        {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_tn", "ts": 30, "dur": 9},
        {"ph": "X", "cat": "cpu_op", "name": "aten::silu", "ts": 40, "dur": 2, "tid": 1, "pid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mul", "ts": 43, "dur": 2, "tid": 1, "pid": 1},
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    proc = subprocess.run(
        [sys.executable, "-m", "opmux.kernels.profile", str(path), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    out = json.loads(proc.stdout)
    kernels = {(k["op"], k["backend"]): (k["calls"], k["time_us"]) for k in out["kernels"]}
    assert kernels == {("layernorm.*", "aot/jit"): (1, 5.0), ("moe.*", "triton"): (2, 7.0)}
    assert [(f["use"], f["count"]) for f in out["unfused"]] == [
        ("opmux.kernels.ops.activation.silu_and_mul", 1)
    ]
    bad = subprocess.run([sys.executable, "-m", "opmux.kernels.profile", str(tmp_path / "missing.json")])
    assert bad.returncode == 2
