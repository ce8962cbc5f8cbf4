"""benchmarks/ncu_gaps.py on the CPU: case selection from a synthetic bench.json (bench_gpu.py's
layout), ncu's ``--csv --page raw`` output parsed (units scaled), the verdicts, the markdown, and
the whole parent run against a fake ``ncu`` that writes canned CSV (a failure and a timeout
recorded, the run going on)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def ng(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.syspath_prepend(str(BENCH))
    sys.modules.pop("ncu_gaps", None)
    yield importlib.import_module("ncu_gaps")
    sys.modules.pop("ncu_gaps", None)


def _impl(kind: str, us: float, nbytes: int) -> dict[str, Any]:
    return {"kind": kind, "status": "ok", "us": us, "method": "graph", "R": 100, "GBps": nbytes / us / 1e3}


def _case(shape: dict[str, int], nbytes: int, default: str, times: dict[str, float]) -> dict[str, Any]:
    impls = {n: _impl("opmux" if n.startswith("opmux:") else "peer", us, nbytes) for n, us in times.items()}
    peers = {n: r for n, r in impls.items() if r["kind"] == "peer"}
    best = min(peers, key=lambda n: peers[n]["us"])
    d_us = impls[f"opmux:{default}"]["us"]
    return {
        "shape": shape,
        "label": ", ".join(f"{k}={v}" for k, v in shape.items()),
        "bytes": nbytes,
        "impls": impls,
        "sets": 8,
        "R": 100,
        "default": default,
        "best_peer": best,
        "best_peer_us": peers[best]["us"],
        "best_opmux": f"opmux:{default}",
        "default_us": d_us,
        "default_frac_copy": 0.5,
        "ratio_default_best_peer": d_us / peers[best]["us"],
    }


RMS_BYTES = 2 * 32768 * 4096 * 2 + 4096 * 2
SILU_BYTES = 16 * 14336 * 2 * 3
GEMMA_BYTES = 2 * 4096 * 4096 * 2 + 4096 * 2


def bench_json() -> dict[str, Any]:
    """bench_gpu.py's bench.json layout: meta + ops[{op, cases[{shape, label, bytes, impls, ...}]}]."""
    return {
        "meta": {
            "date": "2026-11-29T15:57:35+00:00",
            "device": "NVIDIA H200",
            "capability": "9.0",
            "opmux": "0.0.0.dev14",
            "copy": {"bytes": 2 * 2**31, "s": 0.001, "GBps": 4250.0, "checked": True},
            "args": {"seed": 0},
        },
        "ops": [
            {
                "op": "layernorm.rmsnorm",
                "family": "rmsnorm",
                "cases": [
                    _case({"T": 1, "H": 4096}, 24576, "aot", {"opmux:aot": 1.16, "Liger": 1.56}),
                    _case(
                        {"T": 32768, "H": 4096},
                        RMS_BYTES,
                        "aot",
                        {"opmux:aot": 136.8, "opmux:triton": 140.0, "torch.compile": 131.0, "Liger": 129.7},
                    ),
                ],
            },
            {
                "op": "activation.silu_and_mul",
                "family": "activation",
                "cases": [
                    _case({"T": 16, "I": 14336}, SILU_BYTES, "aot", {"opmux:aot": 1.5, "FlashInfer": 1.28}),
                    {
                        "shape": {"T": 4096, "I": 14336},
                        "label": "T=4096, I=14336",
                        "bytes": 1,
                        "impls": {},
                        "skipped": "time budget spent",
                    },
                ],
            },
            {
                "op": "layernorm.gemma_rmsnorm",
                "family": "rmsnorm",
                "cases": [
                    _case({"T": 4096, "H": 4096}, GEMMA_BYTES, "aot", {"opmux:aot": 20.4, "Liger": 20.0}),
                ],
            },
        ],
    }


HEADER = [
    "ID",
    "Process ID",
    "Process Name",
    "Host Name",
    "Kernel Name",
    "Context",
    "Stream",
    "Block Size",
    "Grid Size",
    "Device",
    "CC",
]
UNITS = {
    "gpu__time_duration.sum": "usecond",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "%",
    "dram__bytes_read.sum": "Mbyte",
    "dram__bytes_write.sum": "Mbyte",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "%",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "%",
    "sm__maximum_warps_per_active_cycle_pct": "%",
    "launch__registers_per_thread": "register/thread",
    "launch__grid_size": "",
    "launch__block_size": "",
    "launch__waves_per_multiprocessor": "",
    "smsp__average_warp_latency_per_inst_issued.ratio": "",
}


def canned_csv(kernels: list[dict[str, Any]], units: dict[str, str] | None = None) -> str:
    """What ``ncu --csv --page raw --metrics ... --log-file F`` writes: PROF lines, a header row,
    a units row, one row per kernel; every field quoted."""
    units = units or UNITS
    cols = list(units)

    def q(xs: list[str]) -> str:
        return ",".join(f'"{x}"' for x in xs)

    lines = ["==PROF== Connected to process 4242 (/usr/bin/python3.12)", q(HEADER + cols)]
    lines.append(q([""] * len(HEADER) + [units[c] for c in cols]))
    for i, k in enumerate(kernels):
        head = [
            str(i),
            "4242",
            "python3.12",
            "127.0.0.1",
            k["name"],
            "1",
            "7",
            f"({k['block']}, 1, 1)",
            f"({k['grid']}, 1, 1)",
            "0",
            "9.0",
        ]
        vals = {
            "gpu__time_duration.sum": k["us"],
            "dram__throughput.avg.pct_of_peak_sustained_elapsed": k["dram"],
            "dram__bytes_read.sum": k["read_mb"],
            "dram__bytes_write.sum": k["write_mb"],
            "sm__throughput.avg.pct_of_peak_sustained_elapsed": k["sm"],
            "sm__warps_active.avg.pct_of_peak_sustained_active": k["occ"],
            "sm__maximum_warps_per_active_cycle_pct": 100,
            "launch__registers_per_thread": k.get("regs", 32),
            "launch__grid_size": k["grid"],
            "launch__block_size": k["block"],
            "launch__waves_per_multiprocessor": k["waves"],
            "smsp__average_warp_latency_per_inst_issued.ratio": "n/a",
        }
        lines.append(q(head + [str(vals[c]) for c in cols]))
    lines.append("==PROF== Disconnected from process 4242")
    return "\n".join(lines) + "\n"


def K(
    name: str,
    us: float,
    dram: float,
    rd: float,
    wr: float,
    grid: int,
    block: int,
    waves: float,
    sm: float = 20.0,
    occ: float = 80.0,
    regs: int = 32,
) -> dict[str, Any]:
    return {
        "name": name,
        "us": us,
        "dram": dram,
        "read_mb": rd,
        "write_mb": wr,
        "grid": grid,
        "block": block,
        "waves": waves,
        "sm": sm,
        "occ": occ,
        "regs": regs,
    }


RMS_MB = RMS_BYTES / 2 / 1e6
#: impl label (as in a child spec: op short name + impl) -> kernels the fake ncu reports
PROFILES: dict[str, Any] = {
    "rmsnorm/opmux:aot": [
        K(
            "void opmux::cuda::rmsnorm_kernel<__nv_bfloat16, 8, true>(const __nv_bfloat16 *, __nv_bfloat16 *, int)",
            140.0,
            89.0,
            RMS_MB,
            RMS_MB,
            32768,
            512,
            31.0,
        )
    ],
    "rmsnorm/Liger": [K("_rms_norm_forward_kernel", 132.0, 93.0, RMS_MB, RMS_MB, 32768, 256, 15.5)],
    "silu_and_mul/opmux:aot": [
        K("void opmux::act_kernel<float>(float *)", 2.1, 31.0, 0.92, 0.0, 66, 256, 0.25)
    ],
    "silu_and_mul/FlashInfer": "FAIL",
    "gemma_rmsnorm/opmux:aot": [
        K("triton_red_fused_add_0", 4.0, 70.0, GEMMA_BYTES / 2 / 1e6, 0.0, 4096, 256, 1.9),
        K("gemma_second_pass", 16.0, 85.0, 0.65 * GEMMA_BYTES / 1e6, 0.5 * GEMMA_BYTES / 1e6, 4096, 256, 1.9),
    ],
    "gemma_rmsnorm/Liger": "SLEEP",
}

FAKE_NCU = """\
import json, sys, time
argv = sys.argv[1:]
log = argv[argv.index("--log-file") + 1]
spec = json.loads(argv[argv.index("--child") + 1])
assert argv[argv.index("--clock-control") + 1] == "none"
assert argv[argv.index("--profile-from-start") + 1] == "off"
assert "--csv" in argv and argv[argv.index("--page") + 1] == "raw"
canned = json.load(open(CANNED))
what = canned[spec["op"].rsplit(".", 1)[-1] + "/" + spec["impl"]]
if what == "FAIL":
    open(log, "w").write("==PROF== Connected to process 1\\n==ERROR== Failed to profile kernel in process 1\\n")
    print("NCU_GAPS_CHILD " + json.dumps({"ok": False, "error": "RuntimeError: boom"}))
    sys.exit(1)
if what == "SLEEP":
    time.sleep(30)
open(log, "w").write(what)
print("NCU_GAPS_CHILD " + json.dumps({"ok": True, "spec": spec}))
"""


def test_parent_imports_no_torch() -> None:
    code = f"import sys; sys.path.insert(0, {str(BENCH)!r}); import ncu_gaps; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_select_cases(ng: ModuleType) -> None:
    b = bench_json()
    sel = ng.select_cases(b)
    assert [(c["op"], c["label"]) for c in sel] == [
        ("activation.silu_and_mul", "T=16, I=14336"),  # 1.17
        ("layernorm.rmsnorm", "T=32768, H=4096"),  # 1.055
        ("layernorm.gemma_rmsnorm", "T=4096, H=4096"),  # 1.02
    ]
    assert sel[0]["default"] == "aot" and sel[0]["best_peer"] == "FlashInfer"
    assert sel[1]["best_peer"] == "Liger" and sel[1]["bytes"] == RMS_BYTES
    assert [c["label"] for c in ng.select_cases(b, top=1)] == ["T=16, I=14336"]
    assert [c["label"] for c in ng.select_cases(b, min_ratio=1.05)] == ["T=16, I=14336", "T=32768, H=4096"]
    named = ng.parse_case_specs(["rmsnorm:T=1,H=4096; activation.silu_and_mul:T=4096,I=14336", "x:T=3"])
    assert named == [
        ("rmsnorm", {"T": 1, "H": 4096}),
        ("activation.silu_and_mul", {"T": 4096, "I": 14336}),
        ("x", {"T": 3}),
    ]
    sel = ng.select_cases(b, named)
    assert sel[0]["op"] == "layernorm.rmsnorm" and sel[0]["ratio"] < 1 and "error" not in sel[0]
    assert "no timed peer" in sel[1]["error"] or "no opmux default" in sel[1]["error"]
    assert sel[2]["error"] == "no such case in bench.json"
    with pytest.raises(ValueError):
        ng.parse_case_specs(["rmsnorm T=1"])


def test_parse_csv_and_summary(ng: ModuleType) -> None:
    text = canned_csv(PROFILES["gemma_rmsnorm/opmux:aot"])
    kernels, messages = ng.parse_ncu_csv(text)
    assert messages == []
    assert [k["name"] for k in kernels] == ["triton_red_fused_add_0", "gemma_second_pass"]
    k = kernels[1]
    assert k["us"] == pytest.approx(16.0)
    assert k["dram_read"] == pytest.approx(0.65 * GEMMA_BYTES, rel=1e-6)
    assert (k["grid"], k["block"], k["regs"]) == (4096, 256, 32)
    assert k["cycles_per_issue"] is None  # "n/a"
    t = ng.summarize(kernels)
    assert t["kernels"] == 2 and t["us"] == pytest.approx(20.0)
    assert t["dram_pct"] == pytest.approx((70 * 4 + 85 * 16) / 20)
    assert t["dram_bytes"] == pytest.approx(GEMMA_BYTES * 1.65, rel=1e-6)
    assert t["name"] == "gemma_second_pass"
    # other unit scales, and the details page layout
    units = dict(UNITS, **{"gpu__time_duration.sum": "nsecond", "dram__bytes_read.sum": "Kbyte"})
    (k,), _ = ng.parse_ncu_csv(canned_csv([K("k", 1500, 50, 2.5, 0, 1, 32, 0.01)], units))
    assert k["us"] == pytest.approx(1.5) and k["dram_read"] == pytest.approx(2500)
    details = (
        '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Section Name",'
        '"Metric Name","Metric Unit","Metric Value"\n'
        '"0","1","python3","h","kern","1","7","Command line profiler metrics","gpu__time_duration.sum","usecond","3.25"\n'
        '"0","1","python3","h","kern","1","7","Command line profiler metrics","launch__grid_size","","1,024"\n'
    )
    (k,), _ = ng.parse_ncu_csv(details)
    assert (k["name"], k["us"], k["grid"]) == ("kern", 3.25, 1024)
    assert ng.parse_ncu_csv("==ERROR== unknown metric foo\n") == ([], ["==ERROR== unknown metric foo"])


def test_short_kernel(ng: ModuleType) -> None:
    assert ng.short_kernel(
        "void opmux::cuda::rmsnorm_kernel<__nv_bfloat16, 8>(const __nv_bfloat16 *, int)"
    ) == ("rmsnorm_kernel<__nv_bfloat16, 8>")
    long = (
        "void flashinfer::norm::RMSNormKernel<8u, __nv_bfloat16, cutlass::very::long::Type<1, 2, 3>>(a *, b)"
    )
    assert ng.short_kernel(long) == "RMSNormKernel<…>"
    assert (
        ng.short_kernel("triton_red_fused_add_mean_mul_pow_rsqrt_0")
        == "triton_red_fused_add_mean_mul_pow_rsqrt_0"
    )


def _profiled(ng: ModuleType, case: dict[str, Any], o: str | list[dict[str, Any]], p: Any) -> dict[str, Any]:
    case["profiles"] = {}
    for impl, ks in ((f"opmux:{case['default']}", o), (case["best_peer"], p)):
        if isinstance(ks, list):
            kernels, _ = ng.parse_ncu_csv(canned_csv(ks))
            case["profiles"][impl] = {"status": "ok", "kernels": kernels, "total": ng.summarize(kernels)}
        else:
            case["profiles"][impl] = {"status": "failed", "error": "==ERROR== boom"}
    return case


def test_verdicts(ng: ModuleType) -> None:
    silu, rms, gemma = ng.select_cases(bench_json())
    v = ng.verdict(_profiled(ng, rms, PROFILES["rmsnorm/opmux:aot"], PROFILES["rmsnorm/Liger"]))
    assert v.startswith("both at ~91% DRAM peak (opmux 89%, Liger 93%): memory-bound")
    assert "kernel time 1.06x" in v and "counted bytes" not in v
    v = ng.verdict(
        _profiled(ng, silu, PROFILES["silu_and_mul/opmux:aot"], [K("fi", 1.2, 55, 0.9, 0, 264, 128, 1.0)])
    )
    assert v.startswith("opmux at 31% DRAM with 0.25 wave(s) (66x256, 2.10 us): launch/latency bound")
    assert "FlashInfer 264x128" in v
    v = ng.verdict(_profiled(ng, silu, PROFILES["silu_and_mul/opmux:aot"], "FAIL"))
    assert v == "no verdict: no profile of FlashInfer: failed"
    gemma_liger = [
        K("_rms_norm_forward_kernel", 17.5, 88, GEMMA_BYTES / 2e6, GEMMA_BYTES / 2e6, 4096, 256, 1.9)
    ]
    v = ng.verdict(_profiled(ng, gemma, PROFILES["gemma_rmsnorm/opmux:aot"], gemma_liger))
    assert "opmux moves 1.65x the counted bytes (Liger 1.00x)" in v
    assert "opmux launches 2 kernels vs 1" in v
    slow = [K("k", 20.0, 60, GEMMA_BYTES / 2e6, GEMMA_BYTES / 2e6, 256, 1024, 2.0, occ=30, regs=96)]
    v = ng.verdict(_profiled(ng, gemma, slow, gemma_liger))
    assert v.startswith(
        "opmux at 60% DRAM vs Liger 88%: below the bandwidth the peer reaches (occupancy 30% vs 80%, 96 vs 32 regs)"
    )
    fast = [K("k", 17.0, 90, GEMMA_BYTES / 2e6, GEMMA_BYTES / 2e6, 4096, 256, 1.9)]
    v = ng.verdict(_profiled(ng, gemma, fast, gemma_liger))
    assert "the gap is outside the kernel" in v


def test_run_with_fake_ncu(ng: ModuleType, tmp_path: Path) -> None:
    canned = {k: (v if isinstance(v, str) else canned_csv(v)) for k, v in PROFILES.items()}
    (tmp_path / "canned.json").write_text(json.dumps(canned))
    fake = tmp_path / "ncu"
    fake.write_text(f"#!{sys.executable}\nCANNED = {str(tmp_path / 'canned.json')!r}\n" + FAKE_NCU)
    fake.chmod(0o755)
    (tmp_path / "bench.json").write_text(json.dumps(bench_json()))
    out = tmp_path / "out"
    rc = ng.main(
        [
            str(tmp_path / "bench.json"),
            "--out",
            str(out),
            "--ncu",
            str(fake),
            "--timeout-s",
            "3",
            "--no-fi-prebuild",
        ]
    )
    assert rc == 3  # FlashInfer failed, Liger on gemma timed out: recorded, the run went on
    res = json.loads((out / "ncu_gaps.json").read_text())
    assert res["meta"]["finished"] and res["meta"]["metrics"] == list(ng.METRICS)
    by = {c["label"]: c for c in res["cases"]}
    rms = by["T=32768, H=4096"]
    assert rms["profiles"]["opmux:aot"]["status"] == "ok"
    assert rms["profiles"]["opmux:aot"]["child"]["spec"] == {
        "op": "layernorm.rmsnorm",
        "shape": {"T": 32768, "H": 4096},
        "impl": "opmux:aot",
        "seed": 0,
        "warmup": 3,
    }
    assert rms["verdict"].startswith("both at ~91% DRAM peak")
    fi = by["T=16, I=14336"]["profiles"]["FlashInfer"]
    assert fi["status"] == "failed" and "==ERROR== Failed to profile" in fi["error"] and "boom" in fi["error"]
    assert by["T=4096, H=4096"]["profiles"]["Liger"]["status"] == "timeout"
    md = (out / "ncu_gaps.md").read_text()
    assert (
        "| rmsnorm T=32768, H=4096 | opmux:aot (default) | `rmsnorm_kernel<__nv_bfloat16, 8, true>` | 140.00 | 136.80 | 89 | 1.00 |"
        in md
    )
    assert (
        "| total (2 kernels; layout of the longest) | 20.00 | 20.40 | 82 | 1.65 |" in md
        and "| failed: " in md
        and "| timeout: " in md
    )
    assert "- **silu_and_mul T=16, I=14336** (1.172x FlashInfer): no verdict" in md
    # --render reproduces the markdown from the json alone
    md2 = tmp_path / "again.md"
    assert ng.main(["--render", str(out / "ncu_gaps.json"), "--md", str(md2)]) == 0
    assert md2.read_text() == md
    # budget spent: nothing started, everything recorded as skipped
    rc = ng.main(
        [
            str(tmp_path / "bench.json"),
            "--out",
            str(tmp_path / "o2"),
            "--ncu",
            str(fake),
            "--budget-s",
            "0",
            "--top",
            "1",
            "--no-fi-prebuild",
        ]
    )
    res = json.loads((tmp_path / "o2" / "ncu_gaps.json").read_text())
    assert [p["status"] for p in res["cases"][0]["profiles"].values()] == ["skipped", "skipped"]
    assert "spent" in res["meta"]["stopped"] and rc == 0
