"""Host cost per call of every path a user takes to an op, side by side in one run.

    python benchmarks/host_overhead.py [--device cpu|cuda] [--out docs/benchmarks] [--quick]

Against the tree: ``PYTHONPATH=python`` first; against an installed wheel: nothing else. For
each op, one token (T=1) on ``--device``, median over interleaved rounds of back-to-back calls
(CUDA: synchronised around each batch, so at T=1 the time is the host's):

* ``bare``: the chosen backend's kernel on prepared kernel arguments (for aot/jit: the bare
  tvm-ffi function), the floor;
* ``bound``: the backend as dispatch binds it (the argument contract, then the kernel);
* ``default``: the public function (``ops.<group>.<name>(...)``);
* ``forced``: the public function with ``backend=<the chosen one>``;
* ``torch.ops``: ``torch.ops.opmux.<name>`` (what a torch.compile'd graph without CUDA graphs runs);
* ``flashinfer``: FlashInfer's function for the same op, where FlashInfer is importable (CUDA).

Derived: ``dispatch`` = default - bound (goal on the CPU: <= 100 ns); forced / default and
torch.ops / default (goal <= 1.2); default - bare. One more row compares an op with size
classes against the same op without. And ``import opmux.kernels.ops`` is timed with
``python -X importtime`` in fresh interpreters (goal <= 20 ms; torch must not be imported).
Writes ``<out>/host_overhead.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def _args(op: str, dev: str, h: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """One token of ``op`` on ``dev`` (hidden size ``h``, bf16 on CUDA, fp32 on the CPU)."""
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    r = lambda *s: torch.randn(*s, device=dev, dtype=dt)  # noqa: E731
    if op in ("layernorm.rmsnorm", "layernorm.gemma_rmsnorm"):
        return (r(1, h), r(h)), {}
    if op in ("layernorm.fused_add_rmsnorm", "layernorm.gemma_fused_add_rmsnorm"):
        return (r(1, h), r(1, h), r(h)), {}
    if op == "layernorm.qk_norm":
        return (r(1, 32, 128), r(1, 8, 128), r(128), r(128)), {}
    if op.startswith("activation."):
        return (r(1, 2 * h),), {}
    if op == "rope.rotary_embedding":
        cache = torch.randn(4096, 128, device=dev)
        return (torch.zeros(1, dtype=torch.long, device=dev), r(1, 32 * 128), r(1, 8 * 128), 128, cache), {}
    if op == "quantization.per_token_quant_fp8":
        return (r(1, h),), {}
    if op == "quantization.per_token_group_quant_fp8":
        return (r(1, h), 128), {}
    if op == "moe.topk_softmax":
        return (torch.randn(1, 64, device=dev), 8), {}
    if op == "moe.moe_align_block_size":
        return (torch.randint(0, 64, (1, 8), device=dev, dtype=torch.int32), 16, 64), {}
    if op == "kvcache.reshape_and_cache":
        k = r(1, 8, 128)
        caches = [torch.zeros(64, 16, 8, 128, device=dev, dtype=dt) for _ in range(2)]
        return (k, k.clone(), *caches, torch.zeros(1, dtype=torch.long, device=dev)), {}
    raise KeyError(op)


def _flashinfer(op: str) -> Callable[..., Any] | None:
    """FlashInfer's function taking the same arguments, if FlashInfer is importable."""
    try:
        import flashinfer
    except Exception:
        return None
    names = {
        "layernorm.rmsnorm": "rmsnorm",
        "layernorm.fused_add_rmsnorm": "fused_add_rmsnorm",
        "layernorm.gemma_rmsnorm": "gemma_rmsnorm",
        "layernorm.gemma_fused_add_rmsnorm": "gemma_fused_add_rmsnorm",
        "activation.silu_and_mul": "silu_and_mul",
        "activation.gelu_and_mul": "gelu_and_mul",
        "activation.gelu_tanh_and_mul": "gelu_tanh_and_mul",
    }
    name = names.get(op)
    return getattr(flashinfer, name, None) if name else None


def _per_call_ns(fn: Callable[[], Any], n: int, sync: Callable[[], None]) -> float:
    sync()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter_ns() - t0) / n


def _full(op: Any, args: tuple[Any, ...]) -> list[Any]:
    """``args`` with the signature's defaults filled in (they are Python literals)."""
    return list(args) + [eval(p.default) for p in op.decl.params[len(args) :]]


def _library(op: Any, args: tuple[Any, ...]) -> Callable[[], Any]:
    """``torch.ops.opmux.<name>`` with every argument positional (defaults filled in)."""
    decl = op.decl
    full = _full(op, args)
    overload = getattr(torch.ops.opmux, decl.short_name).default
    if decl.has_out:
        full = full[:-1]
    return lambda: overload(*full)


def _twins() -> list[tuple[str, Any]]:
    """Two torch-backend rmsnorm ops, one with size classes (a rule on every device whose both
    sides pick the same backend), one without: the cost of size classes alone."""
    from opmux.kernels.fused_op import FusedOp
    from opmux.kernels.ops._decl import declare
    from opmux.kernels.ops.layernorm import op as ln

    out = []
    for name, rule in (("plain", ()), ("sized", tuple((d, 1 << 20, ("torch",)) for d in ("cpu", "cuda")))):
        decl = declare(
            f"bench.{name}_rmsnorm",
            "(Tensor x, Tensor weight, float eps=1e-06, Tensor(a!)? out=None) -> Tensor",
            doc="rmsnorm on the torch backend (benchmark only)",
            check=ln.check_norm,
            reference=ln.rmsnorm.reference,
            torch=dict(ln.rmsnorm.python_backends)["torch"],
            native=False,
            triton=False,
            size_priority=rule,
            samples="rmsnorm",
        )
        out.append((f"(size classes: {name}) torch rmsnorm", FusedOp(decl)))
    return out


def _measure_one(
    label: str, op: Any, device: str, h: int, rounds: int, n: int, sync: Callable[[], None]
) -> dict[str, Any]:
    from opmux.kernels import explain

    native_dev = "cuda" if device == "cuda" else "cpu"
    args, _ = _args("layernorm.rmsnorm" if label.startswith("(") else op.op_name, device, h)
    chosen = explain(op.op_name, *args).chosen
    kargs, _ = op.decl.check(op.op_name, *_full(op, args))
    paths: dict[str, Callable[[], Any]] = {}
    if chosen not in ("reference", "torch"):
        kernel = op.kernel(chosen, native_dev)
        paths["bare"] = lambda: kernel(*kargs)
    bound = op.bind(chosen, native_dev)
    paths["bound"] = lambda: bound(*args)
    paths["default"] = lambda: op.public(*args)
    paths["forced"] = lambda: op.public(*args, backend=chosen)
    if not label.startswith("("):
        paths["torch.ops"] = _library(op, args)
        peer = _flashinfer(op.op_name) if device == "cuda" else None
        if peer is not None:
            paths["flashinfer"] = lambda: peer(*args)
    for fn in paths.values():  # warm: compile/load, fill the dispatch caches
        fn(), fn()
    samples: dict[str, list[float]] = {k: [] for k in paths}
    for _ in range(rounds):
        for name, fn in paths.items():
            samples[name].append(_per_call_ns(fn, n, sync))
        # bound and default once more, adjacent, in the other order (pairs the two tightly)
        samples["default"][-1] = (samples["default"][-1] + _per_call_ns(paths["default"], n, sync)) / 2
        samples["bound"][-1] = (samples["bound"][-1] + _per_call_ns(paths["bound"], n, sync)) / 2
    med = {k: round(statistics.median(v), 1) for k, v in samples.items()}
    row: dict[str, Any] = {"op": label, "backend": chosen, **{f"{k}_ns": v for k, v in med.items()}}
    # paired per round (the two run back to back), so drift in the machine's load cancels
    pairs = [d - b for d, b in zip(samples["default"], samples["bound"], strict=True)]
    row["dispatch_ns"] = round(statistics.median(pairs), 1)
    row["dispatch_min_ns"] = round(min(samples["default"]) - min(samples["bound"]), 1)
    row["forced_ratio"] = round(med["forced"] / med["default"], 3)
    if "torch.ops" in med:
        row["torch_ops_ratio"] = round(med["torch.ops"] / med["default"], 3)
    if "bare" in med:
        row["over_bare_ns"] = round(med["default"] - med["bare"], 1)
    return row


def measure(device: str, rounds: int, n: int, ops: list[str]) -> list[dict[str, Any]]:
    from opmux.kernels.explain import op_instance

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    h = 4096 if device == "cuda" else 128
    rows = []
    targets = [(name, op_instance(name)) for name in ops]
    targets += _twins()
    for label, op in targets:
        row = _measure_one(label, op, device, h, rounds, n, sync)
        rows.append(row)
        print(json.dumps(row), flush=True)
    plain = next(r for r in rows if r["op"].startswith("(size classes: plain)"))
    sized = next(r for r in rows if r["op"].startswith("(size classes: sized)"))
    sized["vs_plain_default_ns"] = round(sized["default_ns"] - plain["default_ns"], 1)
    return rows


def import_time(runs: int = 9) -> dict[str, Any]:
    """``import opmux.kernels.ops`` in fresh interpreters (``-X importtime``), in ms, and whether
    it imported torch."""
    env = dict(os.environ)
    code = "import sys, opmux.kernels.ops; print('TORCH', 'torch' in sys.modules)"
    ms, torch_loaded = [], False
    for _ in range(runs):
        run = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", code],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        line = [ln for ln in run.stderr.splitlines() if ln.rstrip().endswith("| opmux.kernels.ops")][-1]
        ms.append(int(re.split(r"\|", line)[1]) / 1000)
        torch_loaded |= "TORCH True" in run.stdout
    return {"median_ms": round(statistics.median(ms), 1), "min_ms": round(min(ms), 1), "torch": torch_loaded}


def _render(meta: dict[str, Any], rows: list[dict[str, Any]], imp: dict[str, Any], cmd: str) -> str:
    cols = ["bare", "bound", "default", "forced", "torch.ops", "flashinfer"]
    cols = [c for c in cols if any(f"{c}_ns" in r for r in rows)]
    head = "| op | backend | " + " | ".join(f"{c} (ns)" for c in cols)
    head += " | dispatch (ns) | dispatch, min (ns) | forced / default | torch.ops / default | default - bare (ns) |"
    lines = [head, "|---|---|" + "---:|" * (len(cols) + 5)]
    for r in rows:
        cells = [str(r.get(f"{c}_ns", "-")) for c in cols]
        cells += [str(r["dispatch_ns"]), str(r["dispatch_min_ns"]), str(r["forced_ratio"])]
        cells.append(str(r.get("torch_ops_ratio", "-")))
        cells.append(str(r.get("over_bare_ns", "-")))
        lines.append(f"| {r['op']} | {r['backend']} | " + " | ".join(cells) + " |")
    sized = next(r for r in rows if r["op"].startswith("(size classes: sized)"))
    return (
        f"# Host overhead ({meta['device']})\n\n`{cmd}` on {meta['machine']}, Python {meta['python']}, "
        f"torch {meta['torch']}, opmux {meta['opmux']}: one token per call, median over {meta['rounds']} "
        f"interleaved rounds of {meta['n']} calls. Columns are explained in the script's docstring: "
        "`dispatch` = default - bound (the public call over the bound kernel, contract included in both; "
        "the median of per-round differences, and the difference of the fastest rounds), "
        "`bare` = the chosen kernel alone on prepared arguments.\n\n"
        + "\n".join(lines)
        + f"\n\nSize classes: the same op with a size rule costs {sized['vs_plain_default_ns']} ns more per "
        "default call than without.\n\n"
        f"`import opmux.kernels.ops` (`python -X importtime`, {imp['runs']} fresh interpreters): median "
        f"{imp['median_ms']} ms, min {imp['min_ms']} ms; torch imported: {imp['torch']}.\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--out", type=Path, default=None, help="folder for host_overhead.md / .json")
    ap.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    ap.add_argument("--ops", default="", help="comma-separated op names (default: all)")
    args = ap.parse_args()
    import opmux
    from opmux.kernels import registry

    ops = args.ops.split(",") if args.ops else sorted(registry.all_ops())
    rounds, n = (3, 200) if args.quick else ((15, 2000) if args.device == "cpu" else (7, 3000))
    imp = {**import_time(3 if args.quick else 9), "runs": 3 if args.quick else 9}
    rows = measure(args.device, rounds, n, ops)
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else f"cpu ({platform.machine()})"
    meta = {
        "device": device_name,
        "machine": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "opmux": getattr(opmux, "__version__", "?"),
        "rounds": rounds,
        "n": n,
        "threads": torch.get_num_threads(),
    }
    cmd = " ".join(["python", "benchmarks/host_overhead.py", *sys.argv[1:]])
    if "site-packages" not in Path(opmux.__file__).resolve().parts:
        cmd = "PYTHONPATH=python " + cmd
    text = _render(meta, rows, imp, cmd)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        stem = "host_overhead" if args.device == "cpu" else f"host_overhead_{args.device}"
        (args.out / f"{stem}.json").write_text(
            json.dumps({"meta": meta, "command": cmd, "import": imp, "rows": rows}, indent=1) + "\n"
        )
        (args.out / f"{stem}.md").write_text(text)


if __name__ == "__main__":
    main()
