"""Nsight Compute profiles of the cases where opmux's default is slower than the fastest peer.

    python benchmarks/ncu_gaps.py DIR/bench.json [--out DIR] [--top N] [--min-ratio 1.0]
        [--cases "layernorm.rmsnorm:T=32768,H=4096;silu_and_mul:T=16,I=14336"] [--budget-s 480]
    python benchmarks/ncu_gaps.py --render DIR/ncu_gaps.json --md FILE

Reads a ``bench.json`` of benchmarks/bench_gpu.py and picks every case whose ratio (opmux default
/ fastest peer) is above ``--min-ratio`` (1.00), worst first (``--top N``: the N worst), or the
cases ``--cases`` names (``op:T=..,H=..``, ``;`` between cases; ``op`` is the registry name or its
part after the dot). For each, the kernel(s) of opmux's default backend and of the fastest peer,
one call each, on the case's exact shape, run under

    ncu --clock-control none --profile-from-start off --target-processes application-only
        --csv --page raw --metrics <METRICS> --log-file F python3 ncu_gaps.py --child <spec>

The child (this script) builds input set 0 with bench_cases (the generator and seed of
bench_gpu), warms the implementation up (JIT builds, torch.compile, FlashInfer's JIT modules in
bench_gpu's cache: ``bench_gpu.flashinfer_env``), then brackets exactly one call with
``cudaProfilerStart``/``cudaProfilerStop``. Clocks are left alone (``--clock-control none``);
ncu flushes the caches before each profiled kernel (its default ``--cache-control all``), so the
profiled call reads cold, as the benchmark's cycling over input sets does.

Writes DIR/ncu_gaps.json (rewritten after every profile) and DIR/ncu_gaps.md: per kernel its
duration, DRAM throughput (% of peak), DRAM bytes read + written against the bytes the case counts,
SM throughput, achieved occupancy, registers, grid x block, waves; one verdict per case computed
from those numbers. A failed profile (ncu's message, the child's error, a timeout: ``--timeout-s``)
is recorded and the run goes on; ``--budget-s`` stops starting new profiles. Exit status: 0, or 3
when some profile failed (the results are written either way), 2 on bad arguments.

The parent imports no torch; the child imports torch, bench_cases, opmux and only the peer library
it profiles. Only benchmarks/ is put on sys.path: opmux comes from wherever it is installed.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import glob
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

T0 = time.perf_counter()
CHILD_MARK = "NCU_GAPS_CHILD "

#: metric -> short key in ncu_gaps.json. Names as Nsight Compute 2023-2025 spells them (a wrong
#: name makes ncu fail the whole profile).
METRICS: dict[str, str] = {
    "gpu__time_duration.sum": "us",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
    "dram__bytes_read.sum": "dram_read",
    "dram__bytes_write.sum": "dram_write",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy_pct",
    "sm__maximum_warps_per_active_cycle_pct": "theoretical_occupancy_pct",
    "launch__registers_per_thread": "regs",
    "launch__grid_size": "grid",
    "launch__block_size": "block",
    "launch__waves_per_multiprocessor": "waves",
    "smsp__average_warp_latency_per_inst_issued.ratio": "cycles_per_issue",
}

# verdict thresholds (percent of peak)
MEM_BOUND_PCT = 80.0
LOW_DRAM_PCT = 60.0
BYTES_EXTRA = 1.15


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def _err(exc: BaseException, limit: int = 600) -> str:
    s = f"{type(exc).__name__}: {exc}".strip()
    return s if len(s) <= limit else s[: limit // 2] + " ... " + s[-limit // 2 :]


def _clip(s: str, limit: int = 1500) -> str:
    s = s.strip()
    return s if len(s) <= limit else s[: limit // 3] + " ... " + s[-2 * limit // 3 :]


# ---------------------------------------------------------------------------------------------
# case selection


def parse_case_specs(specs: Iterable[str]) -> list[tuple[str, dict[str, int]]]:
    """``"op:T=1,H=4096;op2:T=16,I=14336"`` (any number of strings) -> [(op, shape dict)]."""
    out: list[tuple[str, dict[str, int]]] = []
    for spec in specs:
        for part in spec.split(";"):
            part = part.strip()
            if not part:
                continue
            op, sep, dims = part.partition(":")
            if not sep or not op.strip():
                raise ValueError(f"case {part!r}: expected op:T=..,..")
            shape: dict[str, int] = {}
            for kv in dims.split(","):
                k, eq, v = kv.strip().partition("=")
                if not eq:
                    raise ValueError(f"case {part!r}: {kv!r} is not KEY=VALUE")
                shape[k.strip()] = int(v)
            if "T" not in shape:
                raise ValueError(f"case {part!r}: no T=")
            out.append((op.strip(), shape))
    return out


def _op_matches(want: str, op: str) -> bool:
    return want == op or op.endswith("." + want)


def _case_entry(orec: dict[str, Any], crec: dict[str, Any]) -> dict[str, Any]:
    d = crec.get("default")
    best = crec.get("best_peer")
    entry: dict[str, Any] = {
        "op": orec["op"],
        "label": crec.get("label") or ", ".join(f"{k}={v}" for k, v in crec["shape"].items()),
        "shape": crec["shape"],
        "bytes": crec.get("bytes"),
        "default": d,
        "default_us": crec.get("default_us"),
        "best_peer": best,
        "best_peer_us": crec.get("best_peer_us"),
        "ratio": crec.get("ratio_default_best_peer"),
    }
    if d is None or best is None:
        entry["error"] = (
            "bench.json has no "
            + ("opmux default" if d is None else "timed peer")
            + f" for this case ({crec.get('default_error') or crec.get('skipped') or crec.get('error') or 'not measured'})"
        )
    return entry


def select_cases(
    bench: dict[str, Any],
    cases: list[tuple[str, dict[str, int]]] | None = None,
    top: int | None = None,
    min_ratio: float = 1.0,
) -> list[dict[str, Any]]:
    """The cases to profile: the named ones (in the order named), else every case with
    ratio > ``min_ratio``, worst first, the first ``top`` of them."""
    found: list[dict[str, Any]] = []
    if cases:
        for want_op, want_shape in cases:
            hit = None
            for orec in bench.get("ops", []):
                if not _op_matches(want_op, orec["op"]):
                    continue
                for crec in orec.get("cases", []):
                    if {k: int(v) for k, v in crec["shape"].items()} == want_shape:
                        hit = _case_entry(orec, crec)
                        break
                if hit:
                    break
            if hit is None:
                label = ", ".join(f"{k}={v}" for k, v in want_shape.items())
                hit = {
                    "op": want_op,
                    "label": label,
                    "shape": want_shape,
                    "error": "no such case in bench.json",
                }
            found.append(hit)
    else:
        for orec in bench.get("ops", []):
            for crec in orec.get("cases", []):
                r = crec.get("ratio_default_best_peer")
                if r is not None and r > min_ratio:
                    found.append(_case_entry(orec, crec))
        found.sort(key=lambda e: -float(e["ratio"]))
    if top is not None:
        found = found[: max(top, 0)]
    return found


# ---------------------------------------------------------------------------------------------
# ncu's CSV


def _num(s: str) -> float | None:
    s = s.strip().replace(",", "")
    if not s or s.lower() in ("n/a", "nan", "-"):
        return None
    try:
        return float(s)
    except ValueError:
        return None


_SI = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30}
_TIME_US = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6, "ns": 1e-3, "us": 1.0, "ms": 1e3}


def to_base(value: float, unit: str) -> float:
    """A metric value in ncu's (auto-scaled) unit -> bytes for byte units, microseconds for time
    units, unchanged otherwise."""
    u = unit.strip()
    if u in _TIME_US:
        return value * _TIME_US[u]
    for suffix in ("byte", "B"):
        if u.endswith(suffix) and u[: -len(suffix)] in _SI:
            return value * _SI[u[: -len(suffix)]]
    return value


def parse_ncu_csv(text: str) -> tuple[list[dict[str, Any]], list[str]]:
    """ncu ``--csv --page raw`` output (one header row, one units row, one row per profiled kernel;
    ``==PROF==``/``==ERROR==``/``==WARNING==`` lines anywhere) -> (kernels, messages). Each kernel:
    ``name`` plus the short keys of METRICS (``us`` in microseconds, DRAM bytes in bytes). The
    details page layout (one row per metric: Metric Name / Metric Unit / Metric Value) is read too."""
    messages: list[str] = []
    rows_text: list[str] = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("=="):
            if s.startswith(("==ERROR==", "==WARNING==")):
                messages.append(s)
            continue
        if s.startswith('"'):
            rows_text.append(line)
    rows = list(csv.reader(io.StringIO("\n".join(rows_text))))
    start = next((i for i, r in enumerate(rows) if r and r[0] == "ID"), None)
    if start is None:
        return [], messages
    header = rows[start]
    body = [r for r in rows[start + 1 :] if len(r) == len(header)]
    kernels: list[dict[str, Any]] = []
    if "Metric Name" in header and "Metric Value" in header:  # details layout
        i_id, i_name = header.index("ID"), header.index("Kernel Name")
        i_m, i_v = header.index("Metric Name"), header.index("Metric Value")
        i_u = header.index("Metric Unit") if "Metric Unit" in header else None
        by_id: dict[str, dict[str, Any]] = {}
        for r in body:
            kd = by_id.setdefault(r[i_id], {"id": r[i_id], "name": r[i_name]})
            if r[i_m] in METRICS:
                v = _num(r[i_v])
                kd[METRICS[r[i_m]]] = None if v is None else to_base(v, r[i_u] if i_u is not None else "")
        kernels = list(by_id.values())
    else:
        units = [""] * len(header)
        if body and body[0][0] == "":
            units, body = body[0], body[1:]
        for r in body:
            k: dict[str, Any] = {
                "id": r[0],
                "name": r[header.index("Kernel Name")] if "Kernel Name" in header else "?",
            }
            for j, col in enumerate(header):
                if col in METRICS:
                    v = _num(r[j])
                    k[METRICS[col]] = None if v is None else to_base(v, units[j])
            kernels.append(k)
    for k in kernels:
        for key in ("regs", "grid", "block"):
            if k.get(key) is not None:
                k[key] = int(k[key])
    return kernels, messages


def short_kernel(name: str, limit: int = 44) -> str:
    """``void ns::detail::rms_norm_kernel<__nv_bfloat16, 8, true>(T1 *, ...)`` -> ``rms_norm_kernel<…>``."""
    s = name.strip()
    if s.startswith("void "):
        s = s[5:]
    if s.endswith(")"):  # drop the parameter list (match from the end)
        depth = 0
        for i in range(len(s) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(s[i], 0)
            if depth == 0:
                s = s[:i].rstrip()
                break
    # template arguments: keep them only when short
    lt = s.find("<")
    base, targs = (s[:lt], s[lt:]) if lt >= 0 else (s, "")
    base = base.rsplit("::", 1)[-1]
    if targs and len(base) + len(targs) > limit:
        targs = "<…>"
    out = base + targs
    return out if len(out) <= limit else out[: limit - 1] + "…"


def summarize(kernels: list[dict[str, Any]]) -> dict[str, Any]:
    """All kernels of one call together: durations summed, percentages duration-weighted, bytes
    summed, the launch layout (grid, block, regs, waves) of the longest kernel."""
    if not kernels:
        return {}
    durs = [float(k.get("us") or 0.0) for k in kernels]
    total = sum(durs)

    def wavg(key: str) -> float | None:
        pairs = [(float(k[key]), d) for k, d in zip(kernels, durs, strict=True) if k.get(key) is not None]
        if not pairs:
            return None
        w = sum(d for _, d in pairs)
        return sum(v * d for v, d in pairs) / w if w > 0 else sum(v for v, _ in pairs) / len(pairs)

    main = kernels[max(range(len(kernels)), key=lambda i: durs[i])]
    rd = [k.get("dram_read") for k in kernels]
    wr = [k.get("dram_write") for k in kernels]
    out: dict[str, Any] = {
        "kernels": len(kernels),
        "us": total,
        "dram_pct": wavg("dram_pct"),
        "sm_pct": wavg("sm_pct"),
        "occupancy_pct": wavg("occupancy_pct"),
        "dram_read": sum(float(x) for x in rd if x is not None) if any(x is not None for x in rd) else None,
        "dram_write": sum(float(x) for x in wr if x is not None) if any(x is not None for x in wr) else None,
    }
    for key in ("name", "regs", "grid", "block", "waves", "theoretical_occupancy_pct", "cycles_per_issue"):
        out[key] = main.get(key)
    if out["dram_read"] is not None or out["dram_write"] is not None:
        out["dram_bytes"] = (out["dram_read"] or 0.0) + (out["dram_write"] or 0.0)
    return out


# ---------------------------------------------------------------------------------------------
# verdicts


def _f(x: Any, fmt: str = ".0f") -> str:
    return "?" if x is None else format(float(x), fmt)


def verdict(case: dict[str, Any]) -> str:
    """One line from the two profiles' numbers (opmux default vs the fastest peer)."""
    if case.get("error"):
        return f"no verdict: {case['error']}"
    profs = case.get("profiles", {})
    oname, pname = f"opmux:{case['default']}", case["best_peer"]
    o = profs.get(oname, {}).get("total") or {}
    p = profs.get(pname, {}).get("total") or {}
    missing = [n for n, t in ((oname, o), (pname, p)) if not t]
    if missing:
        why = "; ".join(f"{n}: {profs.get(n, {}).get('status', 'not profiled')}" for n in missing)
        return f"no verdict: no profile of {why}"
    od, pd = o.get("dram_pct"), p.get("dram_pct")
    osm = o.get("sm_pct")
    waves = o.get("waves")
    layout = f"{o.get('grid')}x{o.get('block')}"
    players = f"{pname} {p.get('grid')}x{p.get('block')}, {_f(p.get('waves'), '.2g')} waves, {_f(pd)}% DRAM"
    if od is not None and pd is not None and od >= MEM_BOUND_PCT and pd >= MEM_BOUND_PCT:
        main = (
            f"both at ~{(od + pd) / 2:.0f}% DRAM peak (opmux {od:.0f}%, {pname} {pd:.0f}%): "
            "memory-bound, gap is within the bandwidth tail"
        )
    elif od is not None and od < LOW_DRAM_PCT and ((waves is not None and waves < 1.0) or o["us"] < 4.0):
        main = (
            f"opmux at {od:.0f}% DRAM with {_f(waves, '.2g')} wave(s) ({layout}, {o['us']:.2f} us): "
            f"launch/latency bound at this size ({players})"
        )
    elif osm is not None and od is not None and osm >= LOW_DRAM_PCT and osm > od:
        main = f"opmux SM-bound: SM {osm:.0f}% vs DRAM {od:.0f}% ({pname}: SM {_f(p.get('sm_pct'))}%, DRAM {_f(pd)}%)"
    elif od is not None and pd is not None and od + 5.0 < pd:
        main = f"opmux at {od:.0f}% DRAM vs {pname} {pd:.0f}%: below the bandwidth the peer reaches"
        oo, po = o.get("occupancy_pct"), p.get("occupancy_pct")
        if oo is not None and po is not None and oo + 10.0 < po:
            main += f" (occupancy {oo:.0f}% vs {po:.0f}%, {o.get('regs')} vs {p.get('regs')} regs)"
        else:
            main += f" (opmux {layout}, {_f(waves, '.2g')} waves; {players})"
    else:
        main = (
            f"opmux {_f(od)}% DRAM, SM {_f(osm)}%, {layout}; "
            f"{pname} {_f(pd)}% DRAM, SM {_f(p.get('sm_pct'))}%, {p.get('grid')}x{p.get('block')}"
        )
    extra: list[str] = []
    counted = case.get("bytes")
    if counted and o.get("dram_bytes") is not None:
        ob = o["dram_bytes"] / counted
        pb = (p.get("dram_bytes") or 0.0) / counted
        if ob > BYTES_EXTRA and ob > 1.1 * pb:
            extra.append(f"opmux moves {ob:.2f}x the counted bytes ({pname} {pb:.2f}x)")
    if o.get("kernels", 1) > p.get("kernels", 1):
        extra.append(f"opmux launches {o['kernels']} kernels vs {p['kernels']}")
    if o.get("us") and p.get("us"):
        r = o["us"] / p["us"]
        if r <= 1.0:
            extra.append(
                f"ncu kernel time opmux <= {pname} ({r:.2f}x): the gap is outside the kernel "
                "(launch, graph, L2 state)"
            )
        else:
            extra.append(f"kernel time {r:.2f}x")
    return "; ".join([main, *extra])


# ---------------------------------------------------------------------------------------------
# markdown


def _case_title(case: dict[str, Any]) -> str:
    return f"{case['op'].rsplit('.', 1)[-1]} {case['label']}"


def render_md(result: dict[str, Any]) -> str:
    meta = result.get("meta", {})
    lines = [
        "# Nsight Compute profiles of the gaps (opmux default vs the fastest peer)",
        "",
        f"Source: `{meta.get('bench_json', '?')}` ({meta.get('device', '?')}, bench run {meta.get('bench_date', '?')}, "
        f"copy {_f(meta.get('copy_GBps'))} GB/s); ncu {meta.get('ncu_version', '?')}, `--clock-control none`, caches "
        "flushed before each kernel (ncu's default), one call on input set 0. *bytes / counted*: DRAM bytes read + "
        "written over the bytes the benchmark counts (each input read once, each output written once; writes still "
        "in L2 at the kernel's end are not counted by DRAM). *bench us*: bench_gpu's graph timing per call.",
        "",
        "| case | implementation | kernel | duration us | bench us | DRAM % | bytes / counted | SM % | occupancy % | regs | grid x block | waves |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    verdicts: list[str] = []
    for case in result.get("cases", []):
        title = _case_title(case)
        ratio = case.get("ratio")
        if case.get("error"):
            lines.append(f"| {title} | | {case['error']} | | | | | | | | | |")
        counted = case.get("bytes") or 0
        for impl, prof in case.get("profiles", {}).items():
            role = "default" if impl == f"opmux:{case.get('default')}" else "fastest peer"
            bench_us = case.get("default_us") if role == "default" else case.get("best_peer_us")
            who = f"{impl} ({role})"
            if prof.get("status") != "ok":
                msg = str(prof.get("error") or prof.get("status", "?")).replace("|", "/").replace("\n", " ")
                lines.append(
                    f"| {title} | {who} | {prof.get('status')}: {msg[:160]} | | {_f(bench_us, '.2f')} | | | | | | | |"
                )
                continue
            ks = prof.get("kernels", [])
            rows = [*ks, {**prof["total"], "total": True}] if len(ks) > 1 else ks
            for k in rows:
                if k.get("total"):
                    kname = f"total ({len(ks)} kernels; layout of the longest)"
                else:
                    kname = f"`{short_kernel(str(k.get('name', '?')))}`"
                b_us = _f(bench_us, ".2f") if k.get("total") or len(ks) == 1 else ""
                db = None
                if k.get("dram_read") is not None or k.get("dram_write") is not None:
                    db = (k.get("dram_read") or 0.0) + (k.get("dram_write") or 0.0)
                bc = f"{db / counted:.2f}" if db is not None and counted else "?"
                gb = f"{k.get('grid', '?')} x {k.get('block', '?')}" if k.get("grid") is not None else ""
                lines.append(
                    f"| {title} | {who} | {kname} | {_f(k.get('us'), '.2f')} "
                    f"| {b_us} | {_f(k.get('dram_pct'))} | {bc} | {_f(k.get('sm_pct'))} "
                    f"| {_f(k.get('occupancy_pct'))} | {k.get('regs', '?')} | {gb} | {_f(k.get('waves'), '.2f')} |"
                )
        r = f"{ratio:.3f}x {case.get('best_peer')}" if ratio is not None else "ratio ?"
        verdicts.append(f"- **{title}** ({r}): {case.get('verdict') or verdict(case)}")
    lines += ["", "## Verdicts", "", *verdicts, ""]
    if meta.get("stopped"):
        lines.append(f"Stopped early: {meta['stopped']}.")
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# the parent: one ncu child per (case, implementation)


def find_ncu(explicit: str | None) -> str | None:
    if explicit:
        return explicit
    hit = shutil.which("ncu")
    if hit:
        return hit
    for pat in ("/usr/local/cuda/bin/ncu", "/usr/local/cuda*/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu"):
        hits = sorted(glob.glob(pat))
        if hits:
            return hits[-1]
    return None


def ncu_command(ncu: str, log_file: Path, spec: dict[str, Any]) -> list[str]:
    return [
        ncu,
        "--clock-control",
        "none",
        "--profile-from-start",
        "off",
        "--target-processes",
        "application-only",
        "--csv",
        "--page",
        "raw",
        "--metrics",
        ",".join(METRICS),
        "--log-file",
        str(log_file),
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        json.dumps(spec, separators=(",", ":")),
    ]


def profile_one(ncu: str, spec: dict[str, Any], timeout_s: float, log_file: Path) -> dict[str, Any]:
    """Run one child under ncu (its CSV to ``log_file``); never raises."""
    t = time.perf_counter()
    log_file.unlink(missing_ok=True)
    cmd = ncu_command(ncu, log_file, spec)
    rec: dict[str, Any] = {"status": "failed"}
    out = ""
    try:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
    except OSError as exc:
        rec["error"] = f"could not start ncu: {_err(exc)}"
        rec["elapsed_s"] = round(time.perf_counter() - t, 1)
        return rec
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # ncu and the child it started, by their group id
        except OSError:
            proc.kill()
        out, _ = proc.communicate()
        rec["status"] = "timeout"
    rec["rc"] = proc.returncode
    text = log_file.read_text(errors="replace") if log_file.exists() else ""
    kernels, messages = parse_ncu_csv(text + "\n" + (out or ""))
    child: dict[str, Any] = {}
    for line in (out or "").splitlines():
        if line.startswith(CHILD_MARK):
            try:
                child = json.loads(line[len(CHILD_MARK) :])
            except ValueError:
                pass
    rec["child"] = child
    rec["elapsed_s"] = round(time.perf_counter() - t, 1)
    if rec["status"] == "timeout":
        rec["error"] = f"timed out after {timeout_s:.0f} s; output tail: {_clip(out or '', 600)}"
        return rec
    if kernels and proc.returncode == 0 and child.get("ok", True):
        rec["status"] = "ok"
        rec["kernels"] = kernels
        rec["total"] = summarize(kernels)
        if messages:
            rec["messages"] = messages[:10]
        return rec
    why = [m for m in messages if m.startswith("==ERROR==")]
    if child.get("error"):
        why.append(f"child: {child['error']}")
    if not kernels and not why:
        why.append("ncu profiled no kernel")
    rec["error"] = _clip(" | ".join(why) + f" (rc {proc.returncode}); output tail: {_clip(out or '', 600)}")
    if kernels:
        rec["kernels"] = kernels
    return rec


def _cap(meta: dict[str, Any]) -> tuple[int, int] | None:
    try:
        a, b = str(meta["capability"]).split(".")
        return int(a), int(b)
    except (KeyError, ValueError):
        return None


def ncu_version(ncu: str | None) -> str | None:
    if not ncu:
        return None
    try:
        q = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=30)
        lines = [x for x in q.stdout.splitlines() if x.strip()]
        return lines[-1].strip() if lines else None
    except (OSError, subprocess.SubprocessError) as exc:
        return _err(exc, 120)


def run(args: argparse.Namespace) -> int:
    bench_path: Path = args.bench_json
    bench = json.loads(bench_path.read_text())
    bmeta = bench.get("meta", {})
    out_dir: Path = args.out or bench_path.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    cases = select_cases(
        bench, parse_case_specs(args.cases) if args.cases else None, args.top, args.min_ratio
    )
    ncu = find_ncu(args.ncu)
    seed = int((bmeta.get("args") or {}).get("seed") or 0)
    result: dict[str, Any] = {
        "meta": {
            "bench_json": str(bench_path),
            "device": bmeta.get("device"),
            "bench_date": bmeta.get("date"),
            "copy_GBps": (bmeta.get("copy") or {}).get("GBps"),
            "opmux": bmeta.get("opmux"),
            "ncu": ncu,
            "ncu_version": ncu_version(ncu),
            "metrics": list(METRICS),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "seed": seed,
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        },
        "cases": cases,
    }
    out_json = out_dir / "ncu_gaps.json"

    def save() -> None:
        for c in cases:
            c["verdict"] = verdict(c)
        result["meta"]["elapsed_s"] = round(time.perf_counter() - T0, 1)
        tmp = out_json.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(result, indent=1, default=str))
        tmp.replace(out_json)
        (args.md or out_dir / "ncu_gaps.md").write_text(render_md(result))

    log(
        f"{len(cases)} case(s) from {bench_path}; ncu: {ncu or 'NOT FOUND'} ({result['meta']['ncu_version']})"
    )
    work: list[tuple[dict[str, Any], str]] = []
    for c in cases:
        c["profiles"] = {}
        if c.get("error"):
            log(f"{_case_title(c)}: {c['error']}")
            continue
        for impl in (f"opmux:{c['default']}", c["best_peer"]):
            c["profiles"][impl] = {"status": "pending"}
            work.append((c, impl))
    # FlashInfer last: its JIT modules (bench_gpu's cache) build in the background meanwhile
    work.sort(key=lambda w: w[1] == "FlashInfer")
    fib: Any = None
    if any(impl == "FlashInfer" for _, impl in work) and ncu and not args.no_fi_prebuild:
        import bench_gpu

        os.environ.update(bench_gpu.flashinfer_env(_cap(bmeta)))
        fib = bench_gpu.start_fi_prebuild(
            out_dir, list(bench_gpu.FI_MODULES), args.fi_wait_s, name="ncu_fi_build"
        )
    save()
    failed = 0
    deadline = T0 + args.budget_s
    with tempfile.TemporaryDirectory(prefix="ncu_gaps_") as td:
        for i, (c, impl) in enumerate(work):
            prof = c["profiles"][impl]
            if ncu is None:
                prof.update(status="failed", error="ncu not found (PATH, /usr/local/cuda*/bin; --ncu PATH)")
                failed += 1
                continue
            if time.perf_counter() > deadline:
                prof.update(status="skipped", error="time budget spent")
                result["meta"]["stopped"] = (
                    f"--budget-s {args.budget_s:.0f} spent before profile {i + 1} of {len(work)}"
                )
                continue
            if impl == "FlashInfer" and fib is not None and fib.proc is not None and fib.proc.poll() is None:
                log("  waiting for the FlashInfer JIT build ...")
                try:
                    fib.proc.wait(timeout=max(1.0, min(args.fi_wait_s, deadline - time.perf_counter())))
                except subprocess.TimeoutExpired:
                    pass
            spec = {"op": c["op"], "shape": c["shape"], "impl": impl, "seed": seed, "warmup": args.warmup}
            log(f"[{i + 1}/{len(work)}] {_case_title(c)} {impl} ...")
            prof.clear()
            prof.update(profile_one(ncu, spec, args.timeout_s, Path(td) / f"ncu_{i}.csv"))
            if prof["status"] == "ok":
                t = prof["total"]
                log(
                    f"  {impl}: {t['kernels']} kernel(s), {t['us']:.2f} us, DRAM {_f(t.get('dram_pct'))}%, "
                    f"SM {_f(t.get('sm_pct'))}%  [{prof['elapsed_s']:.1f}s]"
                )
            else:
                failed += 1
                log(
                    f"  {impl}: {prof['status'].upper()} {str(prof.get('error', ''))[:300]}  [{prof['elapsed_s']:.1f}s]"
                )
            save()
    if fib is not None and fib.proc is not None and fib.proc.poll() is None:
        fib.proc.terminate()
    result["meta"]["finished"] = True
    save()
    for c in cases:
        log(f"{_case_title(c)}: {c['verdict']}")
    log(f"wrote {out_json} and {args.md or out_dir / 'ncu_gaps.md'}")
    return 3 if failed or any(c.get("error") for c in cases) else 0


# ---------------------------------------------------------------------------------------------
# the child: runs under ncu, profiles exactly one call


def child(spec: dict[str, Any]) -> int:
    """Build input set 0 of the case, warm the implementation up, profile one call."""
    info: dict[str, Any] = {"ok": False, "spec": spec}
    try:
        impl = str(spec["impl"])
        os.environ["OPMUX_FALLBACK"] = "error"
        import bench_cases as bc
        import torch

        if impl == "FlashInfer":
            import bench_gpu  # stdlib only at import

            os.environ.update(bench_gpu.flashinfer_env(torch.cuda.get_device_capability(0)))
        case = next((c for c in bc.cases() if _op_matches(spec["op"], c.op)), None)
        if case is None:
            raise KeyError(f"no bench case for op {spec['op']!r}")
        want = {k: int(v) for k, v in spec["shape"].items()}
        shape = next((s for s in [*case.shapes, *case.quick] if s.as_dict() == want), None)
        if shape is None:
            shape = bc.Shape(want["T"], tuple((k, v) for k, v in want.items() if k != "T"))
        args = case.make(shape, bc._gen("cuda", int(spec.get("seed", 0)) * 1000), "cuda")
        if impl.startswith("opmux:"):
            backend = impl.split(":", 1)[1]
            fn = case.opmux_fn()
            pos, kw = case.callargs(args)

            def call() -> Any:
                return fn(*pos, **kw, backend=backend)

        elif impl == "torch eager":

            def call() -> Any:
                return case.eager(*args)

        elif impl == "torch.compile":
            compiled = torch.compile(case.eager)

            def call() -> Any:
                return compiled(*args)

        else:
            peer = next((p for p in case.peers() if not isinstance(p, tuple) and p.name == impl), None)
            if peer is None:
                raise KeyError(f"{case.op} has no peer {impl!r}")
            pargs = peer.prepare(args) if peer.prepare else args
            pfn = peer.fn

            def call() -> Any:
                return pfn(pargs)

        t = time.perf_counter()
        for _ in range(max(1, int(spec.get("warmup", 3)))):
            keep = call()
        torch.cuda.synchronize()
        info["warmup_s"] = round(time.perf_counter() - t, 2)
        del keep
        cudart_of: Any = torch.cuda.cudart  # untyped in torch's annotations
        cudart = cudart_of()
        cudart.cudaProfilerStart()
        keep = call()
        torch.cuda.synchronize()
        cudart.cudaProfilerStop()
        del keep
        info["ok"] = True
    except BaseException as exc:
        traceback.print_exc()
        info["error"] = _err(exc, 800)
    print(CHILD_MARK + json.dumps(info, default=str), flush=True)
    return 0 if info["ok"] else 1


# ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    ap.add_argument("bench_json", nargs="?", type=Path, help="bench.json of bench_gpu.py")
    ap.add_argument(
        "--out", type=Path, default=None, help="folder for ncu_gaps.{json,md} (default: bench.json's)"
    )
    ap.add_argument("--md", type=Path, default=None, help="markdown file (default OUT/ncu_gaps.md)")
    ap.add_argument(
        "--cases",
        action="append",
        default=[],
        help='cases to profile, "op:T=..,H=..;op2:T=..,I=.." (default: every case with ratio > --min-ratio)',
    )
    ap.add_argument("--top", type=int, default=None, help="only the N worst (or first N named) cases")
    ap.add_argument("--min-ratio", type=float, default=1.0, help="profile cases with ratio above this (1.00)")
    ap.add_argument("--timeout-s", type=float, default=120.0, help="per profile (ncu + child)")
    ap.add_argument("--budget-s", type=float, default=480.0, help="no new profile starts after this")
    ap.add_argument("--warmup", type=int, default=3, help="calls before the profiled one")
    ap.add_argument("--ncu", default=None, help="ncu executable (default: PATH, /usr/local/cuda*/bin)")
    ap.add_argument("--no-fi-prebuild", action="store_true", help="no background FlashInfer JIT build")
    ap.add_argument("--fi-wait-s", type=float, default=240.0, help="longest wait for the FlashInfer build")
    ap.add_argument("--render", type=Path, default=None, help="ncu_gaps.json -> markdown (--md), nothing run")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)  # internal: runs under ncu
    args = ap.parse_args(argv)
    if args.child is None and args.render is None and args.bench_json is None:
        ap.error("give a bench.json (or --render ncu_gaps.json)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        return child(json.loads(args.child))
    if args.render is not None:
        result = json.loads(args.render.read_text())
        md = args.md or args.render.with_suffix(".md")
        md.write_text(render_md(result))
        print(f"wrote {md}")
        return 0
    try:
        if args.cases:
            parse_case_specs(args.cases)
    except ValueError as exc:
        print(f"--cases: {exc}", file=sys.stderr)
        return 2
    try:
        return run(args)
    except BaseException:
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    sys.exit(main())
