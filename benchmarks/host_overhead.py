"""Host cost per call of every path a user takes to an op, side by side in one run.

    python benchmarks/host_overhead.py [--device cpu|cuda] [--out docs/benchmarks] [--quick]
                                       [--baseline REV] [--rounds R] [--n N] [--ops a.b,c.d]

Against the tree: ``PYTHONPATH=python`` first; against an installed wheel: nothing else. For
each op, one token (T=1) on ``--device``, median over interleaved rounds of back-to-back calls
(CUDA: synchronised around each batch, so at T=1 the time is the host's); each round times a
path's calls in batches and keeps the fastest batch (best-of), and the rounds' medians are
reported. On the CPU a batch is timed in the calling thread's CPU time (``time.thread_time_ns``:
on a shared machine a preempted batch is not charged for what ran meanwhile); on CUDA in wall
time:

* ``bare``: the chosen backend's kernel on prepared kernel arguments (for aot/jit: the bare
  tvm-ffi function), the floor;
* ``bare+outputs``: the same with the outputs the call returns allocated per call
  (``torch.empty_like`` of each): the floor of a call that returns fresh tensors;
* ``bound``: the backend as dispatch binds it (the argument contract, then the kernel);
* ``default``: the public function (``ops.<group>.<name>(...)``);
* ``forced``: the public function with ``backend=<the chosen one>``;
* ``torch.ops``: ``torch.ops.opmux.<name>`` (what a torch.compile'd graph without CUDA graphs runs),
  with the library ops' C++ kernels registered (``opmux.kernels.torch_kernels``: built, or loaded
  from the JIT cache, before the rounds);
* ``torch.ops, Python kernel``: the same op with its Python kernel (the twin library op
  ``opmux::_py_<name>``, what ``torch.ops`` ran before the C++ kernels and still runs for the ops
  with several results);
* ``torch.ops torch``: the same call through torch's own Python entry into the op (pybind,
  ``createStackForSchema``), where ``torch.ops`` takes the bridge's (``OpCall``, its ``__wrapped__``,
  behind the same ``__call__`` frame as OpOverload's): the two entries side by side;
* ``torch.ops kernel``: that library op's Python kernel called directly (``torch.ops - its
  kernel`` is then what the dispatcher adds for the op's schema: the hop, boxing every argument
  and result);
* ``flashinfer``: FlashInfer's function for the same op, where FlashInfer is importable (CUDA).

Derived: ``dispatch`` = default - bound (goal on the CPU: <= 100 ns); forced / default and
torch.ops / default (goal <= 1.2); default - bare and default - bare+outputs. Each is taken per
round, from the two paths timed in that round, and its median over rounds is reported (a busy
spell of a shared host that spans a round then costs both sides of the ratio). One more row compares an op with size
classes against the same op without. And ``import opmux.kernels.ops`` is timed with
``python -X importtime`` in fresh interpreters (goal <= 20 ms; torch must not be imported).
Writes ``<out>/host_overhead.md`` and ``.json``.

``--baseline REV`` measures git revision ``REV`` (its ``python/``) beside this tree in the same
run: one worker process per tree, every cell set up first, then rounds alternating between the
two (ABBA) so a busy spell of a shared machine lands on both; the report adds a before/after
table. Every cell's rounds are interleaved with the other cells' (medians over rounds).
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
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

EMPTY_LIKE = torch.empty_like


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
    if op in ("quantization.per_token_group_quant_fp8", "quantization.per_token_group_quant_int8"):
        return (r(1, h), 128), {}
    if op == "quantization.per_tensor_quant_fp8":
        return (r(1, h),), {}
    if op == "quantization.static_quant_fp8":
        return (r(1, h), torch.ones(1, 1, device=dev)), {}
    if op == "moe.topk_softmax":
        return (torch.randn(1, 64, device=dev), 8), {}
    if op == "moe.moe_align_block_size":
        return (torch.randint(0, 64, (1, 8), device=dev, dtype=torch.int32), 16, 64), {}
    if op == "layernorm.rmsnorm_static_quant_fp8":
        return (r(1, h), r(h), torch.ones(1, device=dev)), {}
    if op == "layernorm.fused_add_rmsnorm_static_quant_fp8":
        return (r(1, h), r(1, h), r(h), torch.ones(1, device=dev)), {}
    if op == "moe.topk_sigmoid":
        return (torch.randn(1, 64, device=dev), 8), {}
    if op == "moe.batched_moe_align_block_size":
        return (torch.randint(0, 9, (8,), device=dev, dtype=torch.int32), 8, 16), {}
    if op == "kvcache.concat_and_cache_mla":
        cache = torch.zeros(64, 16, 576, device=dev, dtype=dt)
        return (r(1, 512), r(1, 64), cache, torch.zeros(1, dtype=torch.long, device=dev)), {}
    if op == "kvcache.gather_cache":
        i32 = torch.int32
        src, dst = torch.zeros(64, 16, 576, device=dev, dtype=dt), torch.zeros(16, 576, device=dev, dtype=dt)
        return (
            src,
            dst,
            torch.zeros(1, 1, dtype=i32, device=dev),
            torch.tensor([0, 16], dtype=i32, device=dev),
        ), {}
    if op == "kvcache.copy_blocks":
        return (torch.zeros(64, 16, 576, device=dev, dtype=dt), torch.tensor([[0, 1]], device=dev)), {}
    if op == "kvcache.reshape_and_cache":
        k = r(1, 8, 128)
        caches = [torch.zeros(64, 16, 8, 128, device=dev, dtype=dt) for _ in range(2)]
        return (k, k.clone(), *caches, torch.zeros(1, dtype=torch.long, device=dev)), {}
    raise KeyError(op)


def _has_args(op: str) -> bool:
    try:
        _args(op, "meta", 8)
    except KeyError:
        return False
    return True


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
        # (positions, query, key, head_size, cos_sin_cache fp32, is_neox): our argument order
        "rope.rotary_embedding": "apply_rope_with_cos_sin_cache_inplace",
    }
    name = names.get(op)
    return getattr(flashinfer, name, None) if name else None


def _per_call_ns(fn: Callable[[], Any], n: int, sync: Callable[[], None]) -> float:
    # CPU: the calling thread's CPU time, so a batch another process preempted on the shared
    # machine is not charged for the time that process ran (the calls at T=1 spawn no threads);
    # CUDA: wall time (the host waits on the device in sync)
    clock = time.perf_counter_ns if sync is torch.cuda.synchronize else time.thread_time_ns
    sync()
    t0 = clock()
    for _ in range(n):
        fn()
    sync()
    return (clock() - t0) / n


#: a round's calls per path are timed in this many batches and the fastest batch counts
#: (best-of: a batch that a busy neighbour preempted is dropped); ``--batches`` overrides
BATCHES = {"cpu": 20, "cuda": 3}


def _best_of(
    fns: dict[str, Callable[[], Any]], n: int, batches: int, sync: Callable[[], None]
) -> dict[str, float]:
    """Per-call ns of each of ``fns``: ``n`` calls in ``batches`` batches, the paths' batches
    alternating (so a slow spell hits all of them), the fastest batch of each."""
    size = max(1, n // batches)
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(batches):
        for name, fn in fns.items():
            best[name] = min(best[name], _per_call_ns(fn, size, sync))
    return best


def _full(op: Any, args: tuple[Any, ...]) -> list[Any]:
    """``args`` with the signature's defaults filled in (they are Python literals)."""
    return list(args) + [eval(p.default) for p in op.decl.params[len(args) :]]


def _library_args(op: Any, args: tuple[Any, ...]) -> list[Any]:
    """The library op's arguments for ``args``, every one positional (defaults filled in; the
    functional form of an op with ``out`` has no ``out``)."""
    full = _full(op, args)
    return full[:-1] if op.decl.has_out else full


def _library(op: Any, args: tuple[Any, ...]) -> tuple[Callable[[], Any], Callable[[], Any] | None]:
    """``torch.ops.opmux.<name>`` with every argument positional (defaults filled in), and its
    Python kernel called directly (None where the tree does not expose it)."""
    decl = op.decl
    full = _library_args(op, args)
    overload = getattr(torch.ops.opmux, decl.short_name).default
    kernel = getattr(op, "_library_kernels", {}).get(decl.short_name)
    return (lambda: overload(*full)), (None if kernel is None else lambda: kernel(*full))


class _Overload:
    """torch's OpOverload.__call__ (``self._op(*args, **kwargs)``) around another ``_op``: the
    same Python frame as ``torch.ops``, so the two entries compare like for like."""

    __slots__ = ("_op",)

    def __init__(self, op: Callable[..., Any]) -> None:
        self._op = op

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        return self._op(*args, **kwargs)


def _library_torch_entry(op: Any, args: tuple[Any, ...]) -> Callable[[], Any] | None:
    """The same call as ``_library``'s through torch's own entry, where the bridge's wraps it."""
    full = _library_args(op, args)
    torchs = getattr(getattr(torch.ops.opmux, op.decl.short_name).default._op, "__wrapped__", None)
    if torchs is None:
        return None
    overload = _Overload(torchs)
    return lambda: overload(*full)


def _library_twin(op: Any, args: tuple[Any, ...]) -> Callable[[], Any] | None:
    """``torch.ops.opmux._py_<name>`` (the library op with its Python kernel), where there is one."""
    full = _library_args(op, args)
    packet = getattr(torch.ops.opmux, f"_py_{op.decl.short_name}", None) if _CPP_KERNELS[0] == "on" else None
    if packet is None:
        return None
    overload = packet.default
    return lambda: overload(*full)


#: whether the library ops' C++ kernels are registered in this process ("on", or why not)
_CPP_KERNELS = ["not asked"]
_CPP_KEY = "__cpp_kernels__"  # (a worker's first line carries its state under this key)


def _enable_cpp_kernels(device: str) -> None:
    try:
        from opmux.kernels import _env, torch_kernels
    except ImportError:  # a --baseline tree from before them
        _CPP_KERNELS[0] = "absent (this tree predates them)"
        return
    try:  # the device's key whatever $OPMUX_TORCH_KERNELS says: this run measures them (the
        # devices are read once, here: library ops registered later get the same keys)
        with _env.scope(OPMUX_TORCH_KERNELS="all" if device == "cuda" else "cpu"):
            torch_kernels.enable()
    except Exception as exc:
        _CPP_KERNELS[0] = f"unavailable: {type(exc).__name__}: {exc}"
        print(f"host_overhead: {_CPP_KERNELS[0]}", file=sys.stderr, flush=True)
        return
    # (their entries for the default calls of the ops returning several tensors: where the
    # interpreter's headers let the bridge hold them; the default column then times them)
    entries = "on" if getattr(torch_kernels, "_entry", None) is not None else "off"
    _CPP_KERNELS[0] = f"on (the default calls' entries into their lanes: {entries})"


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
            check=ln.rmsnorm.check,
            reference=ln.rmsnorm.reference,
            torch=dict(ln.rmsnorm.python_backends)["torch"],
            native=False,
            triton=False,
            size_priority=rule,
            samples="rmsnorm",
        )
        out.append((f"(size classes: {name}) torch rmsnorm", FusedOp(decl, *_entrypoints(decl))))
    return out


def _entrypoints(decl: Any) -> tuple[Any, ...]:
    """The generated functions of a benchmark-only op (no group holds them): the generator's
    text for it, as a module of its reference's package; () for a --baseline tree whose FusedOp
    generates them itself."""
    try:
        from opmux.kernels.ops._entry_codegen import render_group
    except ImportError:
        return ()
    package = decl.spec.reference.partition(":")[0].rpartition(".")[0]
    module = types.ModuleType(f"{package}._bench_entrypoints")
    module.__package__ = package
    exec(compile(render_group([decl]), f"<{decl.name} entry points>", "exec"), module.__dict__)
    return (module,)


class _Cell:
    """One op's paths, set up once (inputs, warm-up, dispatch caches filled); ``round`` adds one
    sample per path."""

    def __init__(self, label: str, op: Any, device: str, h: int, n: int, sync: Callable[[], None]) -> None:
        from opmux.kernels import explain

        self.label, self.n, self.sync, self.batches = label, n, sync, BATCHES[device]
        native_dev = "cuda" if device == "cuda" else "cpu"
        args, _ = _args("layernorm.rmsnorm" if label.startswith("(") else op.op_name, device, h)
        self.chosen = chosen = explain(op.op_name, *args).chosen
        kargs, result = op.decl.check(op.op_name, *_full(op, args))
        paths: dict[str, Callable[[], Any]] = {}
        if chosen not in ("reference", "torch"):
            entry = getattr(op, "entry", None)  # (kernel, PDL flag); older trees: the kernel alone
            kernel, flag = entry(chosen, native_dev) if entry else (op.kernel(chosen, native_dev), None)
            bare_args = (*kargs, flag) if flag is not None else kargs
            paths["bare"] = lambda: kernel(*bare_args)
            # the same with fresh outputs (torch.empty_like of each the call returns), as any
            # caller that wants results must allocate them: the floor of an op that returns tensors
            made = [r for r in (result if isinstance(result, tuple) else (result,)) if r is not None]
            # (by address: a kernel may take a view of what the call returns, e.g. fp8 as uint8)
            ptrs = {r.data_ptr() for r in made if isinstance(r, torch.Tensor) and r.numel()}
            slots = [
                i for i, a in enumerate(bare_args) if isinstance(a, torch.Tensor) and a.data_ptr() in ptrs
            ]
            if slots:

                def bare_alloc(slots: list[int] = slots, base: tuple[Any, ...] = bare_args) -> Any:
                    a = list(base)
                    for i in slots:
                        a[i] = EMPTY_LIKE(base[i])
                    return kernel(*a)

                paths["bare+outputs"] = bare_alloc
        bound, public = op.bind(chosen, native_dev), op.public  # both called as a user holds them
        paths["bound"] = lambda: bound(*args)
        paths["default"] = lambda: public(*args)
        paths["forced"] = lambda: public(*args, backend=chosen)
        if not label.startswith("("):
            paths["torch.ops"], kernel_alone = _library(op, args)
            if kernel_alone is not None:
                paths["torch.ops kernel"] = kernel_alone
            torchs = _library_torch_entry(op, args)
            if torchs is not None:
                paths["torch.ops torch"] = torchs
            twin = _library_twin(op, args)
            if twin is not None:
                paths["torch.ops py"] = twin
            peer = _flashinfer(op.op_name) if device == "cuda" else None
            if peer is not None:
                paths["flashinfer"] = lambda: peer(*args)
        for fn in paths.values():  # warm: compile/load, fill the dispatch caches
            fn(), fn()
        self.paths = paths
        self.samples: dict[str, list[float]] = {k: [] for k in paths}

    def round(self) -> dict[str, float]:
        got = _best_of(self.paths, self.n, self.batches, self.sync)
        # bound and default once more, their batches alternating (pairs the two tightly)
        pair = {k: self.paths[k] for k in ("default", "bound")}
        for k, v in _best_of(pair, self.n, self.batches, self.sync).items():
            got[k] = min(got[k], v)
        for k, v in got.items():
            self.samples[k].append(v)
        return got


def summarize(label: str, chosen: str, samples: dict[str, list[float]]) -> dict[str, Any]:
    """Medians per path, and the derived columns (see the module docstring)."""
    med = {k: round(statistics.median(v), 1) for k, v in samples.items()}
    row: dict[str, Any] = {"op": label, "backend": chosen, **{f"{k}_ns": v for k, v in med.items()}}
    # paired per round (the two run back to back), so drift in the machine's load cancels
    pairs = [d - b for d, b in zip(samples["default"], samples["bound"], strict=True)]
    row["dispatch_ns"] = round(statistics.median(pairs), 1)
    row["dispatch_min_ns"] = round(min(samples["default"]) - min(samples["bound"]), 1)

    def ratio(path: str) -> float:  # per round, then the median: a spell longer than a round cancels
        return round(
            statistics.median(a / d for a, d in zip(samples[path], samples["default"], strict=True)), 3
        )

    def over(path: str) -> float:
        return round(
            statistics.median(d - a for a, d in zip(samples[path], samples["default"], strict=True)), 1
        )

    row["forced_ratio"] = ratio("forced")
    for path, key in (("torch.ops", "torch_ops_ratio"), ("torch.ops torch", "torch_ops_torch_ratio")):
        if path in med:
            row[key] = ratio(path)
    if "torch.ops py" in med:
        row["torch_ops_py_ratio"] = ratio("torch.ops py")
    if "torch.ops kernel" in med:  # what the dispatcher adds for this schema (boxing included)
        row["torch_ops_hop_ns"] = round(med["torch.ops"] - med["torch.ops kernel"], 1)
    if "bare" in med:
        row["over_bare_ns"] = over("bare")
        row["over_floor_ns"] = over("bare+outputs" if "bare+outputs" in med else "bare")
    return row


def cells(device: str, n: int, ops: list[str]) -> list[_Cell]:
    """Every op's cell (plus the size-class twins), all set up before any round runs."""
    from opmux.kernels.explain import op_instance

    _enable_cpp_kernels(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    h = 4096 if device == "cuda" else 128
    from opmux.kernels import registry

    known = set(registry.all_ops())  # a --baseline tree may predate some ops: they are left out
    unset = [name for name in ops if name in known and not _has_args(name)]
    if unset:  # an op added since _args was written: say so rather than time it with no inputs
        print(f"no T=1 inputs in _args for {', '.join(unset)}: left out", file=sys.stderr, flush=True)
    targets = [(name, op_instance(name)) for name in ops if name in known and name not in unset] + _twins()
    return [_Cell(label, op, device, h, n, sync) for label, op in targets]


def _size_row(rows: list[dict[str, Any]]) -> None:
    plain = next(r for r in rows if r["op"].startswith("(size classes: plain)"))
    sized = next(r for r in rows if r["op"].startswith("(size classes: sized)"))
    sized["vs_plain_default_ns"] = round(sized["default_ns"] - plain["default_ns"], 1)


def measure(device: str, rounds: int, n: int, ops: list[str]) -> list[dict[str, Any]]:
    """Rounds interleaved over every cell (a busy spell of the machine costs each cell a round)."""
    all_cells = cells(device, n, ops)
    for _ in range(rounds):
        for cell in all_cells:
            cell.round()
    rows = [summarize(c.label, c.chosen, c.samples) for c in all_cells]
    for row in rows:
        print(json.dumps(row), flush=True)
    _size_row(rows)
    return rows


def _worker(device: str, n: int, ops: list[str]) -> None:
    """``--worker``: set up every cell, then one round per ``round`` line on stdin (a JSON line
    of label -> path -> ns on stdout each time)."""
    all_cells = cells(device, n, ops)
    print(json.dumps({c.label: c.chosen for c in all_cells} | {_CPP_KEY: _CPP_KERNELS[0]}), flush=True)
    for line in sys.stdin:
        if line.strip() != "round":
            break
        print(json.dumps({c.label: c.round() for c in all_cells}), flush=True)


def _baseline_tree(rev: str, into: Path) -> Path:
    """``python/`` of git revision ``rev`` (a clean copy, its own opmux) under ``into``."""
    archive = subprocess.run(["git", "archive", rev, "python"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "python"


def compare(rev: str, device: str, rounds: int, n: int, ops: list[str]) -> dict[str, Any]:
    """This tree and revision ``rev`` side by side in one run: one worker process each, rounds
    alternating between them (ABBA), imports alternating too. Returns both trees' rows."""
    import tempfile

    here = Path(__file__).resolve().parents[1] / "python"
    with tempfile.TemporaryDirectory(prefix="opmux-baseline-") as tmp:
        trees = {"before": _baseline_tree(rev, Path(tmp)), "after": here}
        cmd = [sys.executable, __file__, "--worker", "--device", device, "--ops", ",".join(ops)]
        cmd += ["--n", str(n), "--batches", str(BATCHES[device])]
        procs, chosen = {}, {}
        for name, tree in trees.items():
            env = {**os.environ, "PYTHONPATH": str(tree)}
            procs[name] = subprocess.Popen(
                cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            chosen[name] = json.loads(procs[name].stdout.readline())  # type: ignore[union-attr]
            cpp = chosen[name].pop(_CPP_KEY, "?")
            if name == "after":
                _CPP_KERNELS[0] = cpp
        samples: dict[str, dict[str, dict[str, list[float]]]] = {t: {} for t in trees}
        imports: dict[str, list[float]] = {t: [] for t in trees}
        for r in range(rounds):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            for name in order:
                p = procs[name]
                p.stdin.write("round\n")  # type: ignore[union-attr]
                p.stdin.flush()  # type: ignore[union-attr]
                for label, got in json.loads(p.stdout.readline()).items():  # type: ignore[union-attr]
                    cell = samples[name].setdefault(label, {})
                    for path, ns in got.items():
                        cell.setdefault(path, []).append(ns)
            for name in order:
                imports[name].append(_import_ms(trees[name])[0])
        for p in procs.values():
            p.stdin.close()  # type: ignore[union-attr]
            p.wait()
    out: dict[str, Any] = {"revision": rev}
    for name in trees:
        rows = [summarize(label, chosen[name][label], s) for label, s in samples[name].items()]
        _size_row(rows)
        ms = imports[name]
        imp = {"median_ms": round(statistics.median(ms), 1), "min_ms": round(min(ms), 1), "runs": len(ms)}
        out[name] = {"rows": rows, "import": imp}
    return out


def library_hop(device: str, rounds: int, n: int) -> list[dict[str, Any]]:
    """What a torch library op with a Python kernel costs by itself, per registration choice:
    an op whose kernel returns its input at once (``torch.ops`` call minus the Python call)."""
    lib = torch.library.Library("opmux_hostbench", "DEF")  # type: ignore[no-untyped-call]

    def ret(x: Any, w: Any, eps: float) -> Any:
        return x

    def none(out: Any, x: Any, w: Any, eps: float) -> None:
        return None

    keys = {
        "CompositeExplicitAutograd (what opmux registers)": ("a", ("CompositeExplicitAutograd",), False),
        "CPU and CUDA keys": ("b", ("CPU", "CUDA"), False),
        "CompositeExplicitAutograd + Autograd kernel": (
            "c",
            ("CompositeExplicitAutograd", "Autograd"),
            False,
        ),
        "CPU and CUDA + Autograd fallthrough": ("d", ("CPU", "CUDA", "fallthrough"), False),
        "out= form (Tensor(a!) out) -> (), CompositeExplicitAutograd": (
            "e",
            ("CompositeExplicitAutograd",),
            True,
        ),
    }
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    x, w = torch.randn(1, 128, device=device, dtype=dt), torch.randn(128, device=device, dtype=dt)
    paths: dict[str, Callable[[], Any]] = {"python call": lambda: ret(x, w, 1e-6)}
    for label, (name, where, out) in keys.items():
        schema = (
            "(Tensor(a!) out, Tensor x, Tensor w, float eps) -> ()"
            if out
            else "(Tensor x, Tensor w, float eps) -> Tensor"
        )
        lib.define(name + schema)  # type: ignore[no-untyped-call]
        for key in where:
            if key == "fallthrough":
                lib.impl(name, torch.library.fallthrough_kernel, "Autograd")  # type: ignore[no-untyped-call]
            else:
                lib.impl(name, none if out else ret, key)  # type: ignore[no-untyped-call]
        overload = getattr(torch.ops.opmux_hostbench, name).default
        paths[label] = (lambda o=overload: o(x, x, w, 1e-6)) if out else (lambda o=overload: o(x, w, 1e-6))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    samples: dict[str, list[float]] = {k: [] for k in paths}
    for _ in range(rounds):
        for k, v in _best_of(paths, n, BATCHES[device], sync).items():
            samples[k].append(v)
    base = statistics.median(samples["python call"])
    return [
        {
            "registration": k,
            "call_ns": round(statistics.median(v), 1),
            "hop_ns": round(statistics.median(v) - base, 1),
        }
        for k, v in samples.items()
    ]


def _import_ms(tree: Path | None = None) -> tuple[float, bool]:
    """``import opmux.kernels.ops`` in a fresh interpreter (``-X importtime``), in ms, and
    whether it imported torch; ``tree``: the ``python/`` folder to import it from."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    code = "import sys, opmux.kernels.ops; print('TORCH', 'torch' in sys.modules)"
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, env=env, check=True
    )
    line = [ln for ln in run.stderr.splitlines() if ln.rstrip().endswith("| opmux.kernels.ops")][-1]
    return int(re.split(r"\|", line)[1]) / 1000, "TORCH True" in run.stdout


def import_time(runs: int = 9) -> dict[str, Any]:
    """``import opmux.kernels.ops`` in ``runs`` fresh interpreters: median and min ms, torch?"""
    got = [_import_ms() for _ in range(runs)]
    ms = [m for m, _ in got]
    torch_loaded = any(t for _, t in got)
    return {"median_ms": round(statistics.median(ms), 1), "min_ms": round(min(ms), 1), "torch": torch_loaded}


def _render_hop(hop: list[dict[str, Any]]) -> str:
    lines = ["| registration | call (ns) | over the Python call (ns) |", "|---|---:|---:|"]
    lines += [f"| {h['registration']} | {h['call_ns']} | {h['hop_ns']} |" for h in hop]
    return (
        "\n## The torch library op by itself\n\nAn op whose Python kernel returns its input at once, "
        "registered each way (`library_hop` in the script): the dispatcher's round trip to a Python kernel "
        "and back, which `torch.ops.opmux.*` pays on top of the default call's work. Per op, the first "
        "table's `torch.ops - its kernel` is that cost for the op's own schema (every argument and result "
        "is boxed, so longer signatures pay more); the library op's kernel itself costs what the default "
        "call does (`torch.ops kernel` vs `default`). `torch.ops / default` <= 1.2 thus needs a default "
        "call of at least five times that cost.\n\n" + "\n".join(lines) + "\n"
    )


def _render(meta: dict[str, Any], rows: list[dict[str, Any]], imp: dict[str, Any], cmd: str) -> str:
    cols = [
        "bare",
        "bare+outputs",
        "bound",
        "default",
        "forced",
        "torch.ops",
        "torch.ops torch",
        "torch.ops py",
        "torch.ops kernel",
        "flashinfer",
    ]
    cols = [c for c in cols if any(f"{c}_ns" in r for r in rows)]
    head = "| op | backend | " + " | ".join(f"{c} (ns)" for c in cols)
    head += " | dispatch (ns) | dispatch, min (ns) | forced / default | torch.ops / default"
    head += " | torch.ops torch / default | torch.ops py / default"
    head += " | torch.ops - its kernel (ns) | default - bare (ns) | default - bare+outputs (ns) |"
    lines = [head, "|---|---|" + "---:|" * (len(cols) + 9)]
    for r in rows:
        cells = [str(r.get(f"{c}_ns", "-")) for c in cols]
        cells += [str(r["dispatch_ns"]), str(r["dispatch_min_ns"]), str(r["forced_ratio"])]
        cells.append(str(r.get("torch_ops_ratio", "-")))
        cells.append(str(r.get("torch_ops_torch_ratio", "-")))
        cells.append(str(r.get("torch_ops_py_ratio", "-")))
        cells.append(str(r.get("torch_ops_hop_ns", "-")))
        cells.append(str(r.get("over_bare_ns", "-")))
        cells.append(str(r.get("over_floor_ns", "-")))
        lines.append(f"| {r['op']} | {r['backend']} | " + " | ".join(cells) + " |")
    sized = next(r for r in rows if r["op"].startswith("(size classes: sized)"))
    return (
        f"# Host overhead ({meta['device']})\n\n`{cmd}` on {meta['machine']}, Python {meta['python']}, "
        f"torch {meta['torch']}, opmux {meta['opmux']}: one token per call, median over {meta['rounds']} "
        f"rounds (interleaved over every op) of {meta['n']} calls per path, each round's calls timed in "
        f"{meta['batches']} batches and the fastest batch kept (best-of: the machine is shared)"
        + ("; a batch's time is the calling thread's CPU time" if meta["device"].startswith("cpu") else "")
        + f". The library ops' C++ kernels: {meta.get('cpp_kernels', '?')}"
        + ". Columns are explained in the script's docstring: "
        "`dispatch` = default - bound (the public call over the bound kernel, contract included in both; "
        "the median of per-round differences, and the difference of the fastest rounds), "
        "`bare` = the chosen kernel alone on prepared arguments, `bare+outputs` = the same with the "
        "outputs it returns allocated per call (torch.empty_like: what any caller that wants results "
        "pays).\n\n"
        + "\n".join(lines)
        + f"\n\nSize classes: the same op with a size rule costs {sized['vs_plain_default_ns']} ns more per "
        "default call than without.\n\n"
        f"`import opmux.kernels.ops` (`python -X importtime`, {imp['runs']} fresh interpreters): median "
        f"{imp['median_ms']} ms, min {imp['min_ms']} ms; torch imported: {imp['torch']}.\n"
    )


def _render_compare(cmp: dict[str, Any]) -> str:
    """Before (``--baseline``) and after, side by side: the columns the goals are about."""
    before = {r["op"]: r for r in cmp["before"]["rows"]}
    keys = (
        ("default_ns", "default (ns)"),
        ("dispatch_ns", "dispatch (ns)"),
        ("dispatch_min_ns", "dispatch, min (ns)"),
        ("forced_ratio", "forced / default"),
        ("torch_ops_ratio", "torch.ops / default"),
        ("over_bare_ns", "default - bare (ns)"),
    )
    head = "| op | " + " | ".join(f"{t}: before | after" for _, t in keys) + " |"
    lines = [head, "|---|" + "---:|---:|" * len(keys)]
    for r in cmp["after"]["rows"]:
        b = before.get(r["op"], {})
        cells = [f"{b.get(k, '-')} | {r.get(k, '-')}" for k, _ in keys]
        lines.append(f"| {r['op']} | " + " | ".join(cells) + " |")
    ib, ia = cmp["before"]["import"], cmp["after"]["import"]
    sized_b = next(r for r in cmp["before"]["rows"] if r["op"].startswith("(size classes: sized)"))
    sized_a = next(r for r in cmp["after"]["rows"] if r["op"].startswith("(size classes: sized)"))
    return (
        f"\n## Before and after, one run\n\nBefore = `{cmp['revision']}` (its `python/` from `git archive`), "
        "after = this tree; one worker process each, set up once, rounds alternating between them (ABBA), "
        "medians over rounds as above.\n\n"
        + "\n".join(lines)
        + f"\n\nSize classes, sized minus plain default: before {sized_b['vs_plain_default_ns']} ns, after "
        f"{sized_a['vs_plain_default_ns']} ns. `import opmux.kernels.ops` (fresh interpreters, alternating): "
        f"before median {ib['median_ms']} ms (min {ib['min_ms']}), after median {ia['median_ms']} ms "
        f"(min {ia['min_ms']}), {ia['runs']} runs each.\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--out", type=Path, default=None, help="folder for host_overhead.md / .json")
    ap.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    ap.add_argument("--ops", default="", help="comma-separated op names (default: all)")
    ap.add_argument("--baseline", default=None, help="git revision measured beside this tree (before/after)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds (default: 15 on cpu, 7 on cuda)")
    ap.add_argument("--n", type=int, default=None, help="calls per round and path")
    ap.add_argument("--batches", type=int, default=None, help="batches per round and path (best-of)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    import opmux
    from opmux.kernels import registry

    ops = args.ops.split(",") if args.ops else sorted(registry.all_ops())
    rounds, n = (3, 200) if args.quick else ((15, 2000) if args.device == "cpu" else (7, 3000))
    rounds, n = args.rounds or rounds, args.n or n
    if args.batches:
        BATCHES[args.device] = args.batches
    if args.worker:
        _worker(args.device, n, ops)
        return
    cmp = compare(args.baseline, args.device, rounds, n, ops) if args.baseline else None
    if cmp is not None:
        rows, imp = cmp["after"]["rows"], {**cmp["after"]["import"], "torch": _import_ms()[1]}
    else:
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
        "batches": BATCHES[args.device],
        "cpp_kernels": _CPP_KERNELS[0],
    }
    cmd = " ".join(["python", "benchmarks/host_overhead.py", *sys.argv[1:]])
    if "site-packages" not in Path(opmux.__file__).resolve().parts:
        cmd = "PYTHONPATH=python " + cmd
    hop = library_hop(args.device, rounds, n)
    text = (
        _render(meta, rows, imp, cmd) + _render_hop(hop) + (_render_compare(cmp) if cmp is not None else "")
    )
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        stem = "host_overhead" if args.device == "cpu" else f"host_overhead_{args.device}"
        (args.out / f"{stem}.json").write_text(
            json.dumps(
                {"meta": meta, "command": cmd, "import": imp, "rows": rows, "hop": hop, "compare": cmp},
                indent=1,
            )
            + "\n"
        )
        (args.out / f"{stem}.md").write_text(text)


if __name__ == "__main__":
    main()
