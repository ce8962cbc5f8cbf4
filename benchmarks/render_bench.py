"""Render a bench.json of benchmarks/bench_gpu.py as markdown tables and one multi-panel PNG.

    python benchmarks/render_bench.py BENCH_JSON [--md docs/benchmarks/h200.md] [--png docs/benchmarks/h200.png]

One table per op: shape | each implementation's time in us | best peer | opmux default | ratio
(default / best peer; under 1 means opmux's default is faster) | the default's fraction of the
copy bandwidth. Entries: ``wrong`` (failed the correctness check, not timed), ``fail`` (raised;
bench.json has the error), ``n/a`` (peer not installed or without such an op), ``skip``
(time budget), a ``*`` marks plain event timing where graph capture failed. The PNG has one panel
per op: achieved GB/s against tokens, one line per implementation, the copy bandwidth dashed.
matplotlib is imported only for the PNG.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

SHORT = {"torch eager": "eager", "torch.compile": "compile"}


def _fmt_us(us: float) -> str:
    return f"{us:.2f}" if us < 100 else f"{us:.1f}"


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return ""
    st = r.get("status")
    if st == "ok":
        return _fmt_us(r["us"]) + ("*" if r.get("method") == "events" else "")
    return {"wrong": "wrong", "failed": "fail", "unavailable": "n/a", "skipped": "skip"}.get(
        st or "", st or ""
    )


def _impl_order(op: dict[str, Any]) -> list[str]:
    names: list[str] = list(op.get("impls") or [])
    for c in op.get("cases", []):
        for n in c.get("impls", {}):
            if n not in names:
                names.append(n)
    opm = [n for n in names if n.startswith("opmux:")]
    return opm + [n for n in names if not n.startswith("opmux:")]


def render_md(result: dict[str, Any], title: str = "") -> str:
    meta = result.get("meta", {})
    copy = meta.get("copy", {})
    cbw = copy.get("GBps")
    lines = [f"# {title or 'opmux GPU benchmark'}", ""]
    lines.append(
        f"{meta.get('device', '?')} (sm {meta.get('capability', '?')}), {meta.get('date', '?')}: torch {meta.get('torch', '?')}"
        f" (CUDA {meta.get('torch_cuda', '?')}), triton {meta.get('triton', '?')}, Liger-Kernel {meta.get('liger_kernel', '?')},"
        f" FlashInfer {meta.get('flashinfer', '?')}, opmux {meta.get('opmux', '?')}. bf16 unless noted."
    )
    if cbw:
        lines.append(
            f"Copy bandwidth measured in the same run: {cbw:.0f} GB/s (device-to-device copy of 2 GiB, read + write)."
        )
    args = meta.get("args", {})
    lines += [
        "",
        "Method: each case is R back-to-back calls captured in one CUDA graph, cycling over up to "
        f"{args.get('max_sets', 64)} input sets so the working set exceeds L2; median of {args.get('replays', '?')} replays, "
        "us per call; bytes = each input read once + each output written once. Every implementation was checked "
        "against a float32 reference first (relative L2 error; `wrong` = failed it, not timed). opmux backends forced "
        "with `backend=` under `OPMUX_FALLBACK=error`; *opmux default* = `opmux.kernels.explain(op, *args).chosen`; "
        "*ratio* = default / best peer (below 1: opmux's default is faster); *%copy* = the default's bandwidth over the "
        "copy bandwidth. Peers: torch eager (the plain reference in the input dtype), torch.compile of it (default mode), "
        "Liger-Kernel, FlashInfer. `n/a`: peer missing or without such an op; `fail`: raised (see bench.json); "
        "`*`: plain event timing (graph capture failed).",
        "",
    ]
    if not meta.get("finished", False):
        lines += ["**This run did not finish; tables hold what it measured.**", ""]
    for op in result.get("ops", []):
        lines.append(f"## {op['op']}")
        lines.append("")
        if op.get("notes"):
            lines += [op["notes"], ""]
        if op.get("skipped"):
            lines += [f"Skipped: {op['skipped']}", ""]
            continue
        names = _impl_order(op)
        hdr = ["shape"] + [SHORT.get(n, n) for n in names] + ["best peer", "opmux default", "ratio", "%copy"]
        lines.append("| " + " | ".join(hdr) + " |")
        lines.append("|" + "|".join(["---"] + ["---:"] * len(names) + ["---", "---", "---:", "---:"]) + "|")
        notes: list[str] = []
        for c in op.get("cases", []):
            row = [c.get("label", "?")]
            if c.get("skipped") or c.get("error"):
                row += [""] * len(names) + ["", "", "", ""]
                notes.append(f"{c.get('label')}: {c.get('skipped') or c.get('error')}")
                lines.append("| " + " | ".join(row) + " |")
                continue
            for n in names:
                cell = _cell(c.get("impls", {}).get(n))
                if n == c.get("best_peer"):
                    cell = f"**{cell}**"
                row.append(cell)
            d = c.get("default")
            ratio = c.get("ratio_default_best_peer")
            frac = c.get("default_frac_copy")
            row += [
                SHORT.get(c.get("best_peer", ""), c.get("best_peer", "")) or "",
                (d or "") + ("" if c.get("default_us") is not None or d is None else " (not timed)"),
                f"{ratio:.2f}" if ratio is not None else "",
                f"{100 * frac:.0f}%" if frac is not None else "",
            ]
            lines.append("| " + " | ".join(row) + " |")
            for n, r in c.get("impls", {}).items():
                if r.get("status") in ("failed", "wrong"):
                    why = r.get("error") or r.get("check") or ""
                    notes.append(f"{c.get('label')}, {n}: {r['status']}: {why[:300]}")
        unavailable = {}
        for c in op.get("cases", []):
            for n, r in c.get("impls", {}).items():
                if r.get("status") == "unavailable":
                    unavailable[n] = r.get("why", "")
        if unavailable or notes:
            lines.append("")
        for n, why in unavailable.items():
            lines.append(f"- {n}: n/a ({why})")
        seen = set()
        for nline in notes:
            key = nline.split(": ", 1)[-1][:120]
            if key in seen:
                continue
            seen.add(key)
            lines.append(f"- {nline}")
        lines.append("")
    fib = meta.get("flashinfer_build", {}).get("modules")
    if fib:
        lines.append(
            "FlashInfer JIT builds: "
            + ", ".join(f"{m} {'ok' if r.get('ok') else 'FAILED'} ({r.get('s')} s)" for m, r in fib.items())
        )
        lines.append("")
    return "\n".join(lines)


def render_png(result: dict[str, Any], path: Path, title: str = "") -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        print(f"render_bench: no PNG ({type(exc).__name__}: {exc})")
        return False
    ops = [o for o in result.get("ops", []) if not o.get("skipped") and o.get("cases")]
    panels: list[tuple[str, dict[str, Any], list[dict[str, Any]]]] = []
    for op in ops:
        # one panel per op and per secondary dimension (e.g. H=4096 / H=8192)
        groups: dict[str, list[dict[str, Any]]] = {}
        for c in op["cases"]:
            sh = dict(c.get("shape", {}))
            sh.pop("T", None)
            key = ", ".join(f"{k}={v}" for k, v in sh.items() if k in ("H", "E"))
            groups.setdefault(key, []).append(c)
        for key, cs in groups.items():
            panels.append((op["op"] + (f" ({key})" if key else ""), op, cs))
    if not panels:
        return False
    cbw = result.get("meta", {}).get("copy", {}).get("GBps")
    ncol = 3 if len(panels) > 4 else 2 if len(panels) > 1 else 1
    nrow = math.ceil(len(panels) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(6.2 * ncol, 4.2 * nrow), squeeze=False)
    for ax, (name, op, cs) in zip(axes.flat, panels, strict=False):
        for n in _impl_order(op):
            pts = [
                (c["shape"]["T"], c["impls"][n]["GBps"])
                for c in cs
                if c.get("impls", {}).get(n, {}).get("status") == "ok"
            ]
            if not pts:
                continue
            pts.sort()
            style = "-o" if n.startswith("opmux:") else "--s"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, ms=3.5, lw=1.3, label=SHORT.get(n, n))
        if cbw:
            ax.axhline(cbw, color="k", ls=":", lw=1, label=f"copy {cbw:.0f} GB/s")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens T")
        ax.set_ylabel("GB/s")
        ax.set_title(name, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    meta = result.get("meta", {})
    fig.suptitle(
        title
        or f"opmux vs peers, {meta.get('device', '?')}, {meta.get('date', '')[:10]} (bandwidth, higher is better)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def render_all(result: dict[str, Any], md: Path | None, png: Path | None, title_prefix: str = "") -> None:
    if md is not None:
        md.write_text(render_md(result, title_prefix))
        print(f"wrote {md}")
    if png is not None and render_png(result, png):
        print(f"wrote {png}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bench_json", type=Path)
    ap.add_argument("--md", type=Path, default=Path("docs/benchmarks/h200.md"))
    ap.add_argument("--png", type=Path, default=Path("docs/benchmarks/h200.png"))
    ap.add_argument("--title", default="opmux on the H200: opmux backends against the peers")
    args = ap.parse_args(argv)
    result = json.loads(args.bench_json.read_text())
    args.md.parent.mkdir(parents=True, exist_ok=True)
    render_all(result, args.md, args.png, args.title)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
