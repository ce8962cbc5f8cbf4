"""Profiler triage: ``python -m opmux.kernels.profile trace.json [--json] [--top N]``.

Reads a torch profiler trace (``prof.export_chrome_trace(...)``) and reports

1. **opmux kernels**: events whose name is an opmux library op (``opmux::rmsnorm``), one of
   opmux's Triton kernels or CUDA kernels (names read from the package's sources, so the table
   follows the code), mapped to their op and backend, with call counts and time;
2. **unfused sequences an opmux op replaces**: runs of eager aten ops on one thread that match
   a known pattern (add + RMSNorm, RMSNorm's pow/mean/rsqrt/mul, silu + mul, gelu + mul, per-token
   amax + scale + fp8 cast, softmax + topk, rotate_half rope), with the time they took and the
   op to use instead.

Times are the events' own durations (host time for CPU ops, device time for kernels). Torch-free:
the trace is JSON and the kernel names come from source text.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Finding", "KernelHit", "Report", "analyze", "kernel_names", "load_events", "main"]

_HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Event:
    name: str
    cat: str
    ts: float
    dur: float
    tid: Any
    pid: Any


@dataclass
class KernelHit:
    name: str
    op: str
    backend: str
    calls: int = 0
    time_us: float = 0.0


@dataclass
class Finding:
    pattern: str
    use: str
    ops: str  # the aten ops of one occurrence, for recognition
    count: int = 0
    time_us: float = 0.0


@dataclass
class Report:
    kernels: list[KernelHit] = field(default_factory=list)
    unfused: list[Finding] = field(default_factory=list)
    total_us: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "total_us": self.total_us,
            "kernels": [asdict(k) for k in self.kernels],
            "unfused": [asdict(f) for f in self.unfused],
        }


def load_events(path: str | Path) -> list[Event]:
    """The complete (``ph: X``) events of a Chrome trace file (a dict with ``traceEvents``, or
    a bare list)."""
    data = json.loads(Path(path).read_text())
    raw = data.get("traceEvents", []) if isinstance(data, dict) else data
    out = []
    for e in raw:
        if isinstance(e, dict) and e.get("ph") == "X" and "name" in e:
            out.append(
                Event(
                    str(e["name"]),
                    str(e.get("cat", "")),
                    float(e.get("ts", 0.0)),
                    float(e.get("dur", 0.0)),
                    e.get("tid"),
                    e.get("pid"),
                )
            )
    return out


_CUDA_KERNEL = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\((?:[^()]|\([^()]*\))*\)\s*)?(\w+)\s*\(")
_TRITON_KERNEL = re.compile(r"@triton\.jit\s*\ndef\s+(\w+)\s*\(")


def kernel_names() -> dict[str, tuple[str, str]]:
    """Kernel name -> (op group, backend) for opmux's CUDA and Triton kernels, from the sources."""
    names: dict[str, tuple[str, str]] = {}
    for cu in sorted((_HERE / "jit" / "csrc").glob("*_cuda.cu")):
        group = cu.name.removesuffix("_cuda.cu")
        for name in _CUDA_KERNEL.findall(cu.read_text()):
            names[name] = (group, "aot/jit")
    # a group's launchers, and the modules its launchers import from (moe/fused_experts_triton.py)
    for tk in sorted((_HERE / "ops").glob("*/*.py")):
        if "@triton.jit" not in (text := tk.read_text()):
            continue
        group = tk.parent.name
        for name in _TRITON_KERNEL.findall(text):
            names[name] = (group, "triton")
    return names


def _library_ops() -> dict[str, str]:
    """``opmux::<short name>`` -> ``group.op`` (torch-free registry read)."""
    from . import registry

    out = {}
    for name in registry.all_ops():
        short = name.partition(".")[2]
        out[short] = name
        out[f"{short}_out"] = name
    return out


def _kernel_hit(
    ev: Event, kernels: dict[str, tuple[str, str]], lib: dict[str, str]
) -> tuple[str, str] | None:
    """(op, backend) of an opmux event: a library op (``opmux::rmsnorm``), or a device kernel
    whose name is one of opmux's (CUDA names come demangled, ``void ns::norm_reg_kernel<...>(P)``;
    Triton names are the jit function's own)."""
    if ev.name.startswith("opmux::"):
        short = ev.name.removeprefix("opmux::").split(".")[0]
        return (lib.get(short, f"?.{short}"), "library op")
    if ev.name.startswith("aten::") or ev.cat in ("cpu_op", "user_annotation", "python_function"):
        return None
    base = re.sub(r"<.*", "", ev.name.split("(")[0]).split("::")[-1].split()
    hit = kernels.get(base[-1]) if base else None
    return None if hit is None else (f"{hit[0]}.*", hit[1])


@dataclass(frozen=True)
class _Pattern:
    name: str
    use: str
    #: op short names (``aten::`` stripped) that must all appear, in this order, in the window
    sequence: tuple[frozenset[str], ...]
    window: int


_P = frozenset
# Each pattern is an ordered list of steps; a step is the set of aten op names that satisfy it.
PATTERNS: tuple[_Pattern, ...] = (
    _Pattern(
        "residual add + RMSNorm (pow, mean, rsqrt, mul)",
        "opmux.kernels.ops.layernorm.fused_add_rmsnorm",
        (_P({"add", "add_"}), _P({"pow"}), _P({"mean"}), _P({"rsqrt"}), _P({"mul", "mul_"})),
        10,
    ),
    _Pattern(
        "RMSNorm (pow, mean, rsqrt, mul)",
        "opmux.kernels.ops.layernorm.rmsnorm",
        (_P({"pow"}), _P({"mean"}), _P({"rsqrt"}), _P({"mul", "mul_"})),
        8,
    ),
    _Pattern(
        "silu + mul (gated MLP)", "opmux.kernels.ops.activation.silu_and_mul", (_P({"silu"}), _P({"mul"})), 3
    ),
    _Pattern(
        "gelu + mul (gated MLP)",
        "opmux.kernels.ops.activation.gelu_and_mul / gelu_tanh_and_mul",
        (_P({"gelu"}), _P({"mul"})),
        3,
    ),
    _Pattern(
        "per-token amax + scale + fp8 cast",
        "opmux.kernels.ops.quantization.per_token_quant_fp8",
        (
            _P({"abs"}),
            _P({"amax", "max"}),
            _P({"div", "mul", "clamp", "clamp_min", "reciprocal"}),
            _P({"to", "_to_copy"}),
        ),
        10,
    ),
    _Pattern(
        "softmax + topk (MoE routing)",
        "opmux.kernels.ops.moe.topk_softmax",
        (_P({"softmax", "_softmax"}), _P({"topk"})),
        3,
    ),
    _Pattern(
        "rotate_half rope (mul, neg, cat, mul, add)",
        "opmux.kernels.ops.rope.rotary_embedding",
        (_P({"mul"}), _P({"neg"}), _P({"cat"}), _P({"mul"}), _P({"add"})),
        10,
    ),
)


def _top_level_aten(events: Sequence[Event]) -> dict[Any, list[Event]]:
    """Per (pid, tid): the aten ops not nested inside another aten op, in time order."""
    by_thread: dict[Any, list[Event]] = {}
    for ev in sorted(events, key=lambda e: (e.ts, -e.dur)):
        if not ev.name.startswith("aten::") or ev.cat not in ("cpu_op", "operator", ""):
            continue
        lst = by_thread.setdefault((ev.pid, ev.tid), [])
        if lst and ev.ts < lst[-1].ts + lst[-1].dur:  # nested in the previous top-level op
            continue
        lst.append(ev)
    return by_thread


def _match(seq: list[Event], start: int, pat: _Pattern) -> int | None:
    """End index (exclusive) of ``pat`` starting exactly at ``start``, or None."""
    step, i = 0, start
    limit = min(len(seq), start + pat.window)
    while i < limit and step < len(pat.sequence):
        if seq[i].name.removeprefix("aten::") in pat.sequence[step]:
            step += 1
        elif step == 0:
            return None
        i += 1
    return i if step == len(pat.sequence) else None


def analyze(events: Iterable[Event]) -> Report:
    events = list(events)
    report = Report()
    kernels = kernel_names()
    lib = _library_ops()
    hits: dict[tuple[str, str, str], KernelHit] = {}
    for ev in events:
        hit = _kernel_hit(ev, kernels, lib)
        if hit is None:
            continue
        key = (ev.name if hit[1] == "library op" else ev.name.split("(")[0], hit[0], hit[1])
        k = hits.setdefault(key, KernelHit(key[0], hit[0], hit[1]))
        k.calls += 1
        k.time_us += ev.dur
    report.kernels = sorted(hits.values(), key=lambda k: -k.time_us)
    found: dict[str, Finding] = {}
    for seq in _top_level_aten(events).values():
        report.total_us += sum(e.dur for e in seq)
        i = 0
        while i < len(seq):
            for pat in PATTERNS:
                end = _match(seq, i, pat)
                if end is not None:
                    f = found.get(pat.name)
                    if f is None:
                        ops = " ".join(e.name.removeprefix("aten::") for e in seq[i:end])
                        f = found[pat.name] = Finding(pat.name, pat.use, ops)
                    f.count += 1
                    f.time_us += sum(e.dur for e in seq[i:end])
                    i = end
                    break
            else:
                i += 1
    report.unfused = sorted(found.values(), key=lambda f: -f.time_us)
    return report


def _render(report: Report, top: int) -> str:
    lines = ["opmux kernels in the trace:"]
    if not report.kernels:
        lines.append("  (none)")
    for k in report.kernels[:top]:
        lines.append(f"  {k.time_us:12.1f} us {k.calls:7d} calls  {k.op:<32} {k.backend:<10} {k.name[:70]}")
    lines.append("")
    lines.append("unfused sequences an opmux op replaces:")
    if not report.unfused:
        lines.append("  (none)")
    for f in report.unfused[:top]:
        share = (
            f" ({100 * f.time_us / report.total_us:.1f}% of top-level aten time)" if report.total_us else ""
        )
        lines.append(f"  {f.time_us:12.1f} us {f.count:7d} times  {f.pattern}{share}")
        lines.append(f"  {'':>36}use {f.use}   [{f.ops}]")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m opmux.kernels.profile", description=__doc__.split("\n\n")[0])
    p.add_argument("trace", type=Path, help="a torch profiler Chrome trace (export_chrome_trace)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--top", type=int, default=20, help="rows per table (default 20)")
    args = p.parse_args(argv)
    try:
        report = analyze(load_events(args.trace))
    except (OSError, ValueError) as exc:
        print(f"error: {args.trace}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.as_dict(), indent=1) if args.json else _render(report, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
