"""The tuning loop of ``moe.fused_experts``: per (E, N, K, topk, form) and M (tokens), time
candidate launch configurations, keep the fastest, write the tables: the Triton kernel's
(vLLM-named files) or, with ``backend="cuda"``, the native decode kernels' columns per warp
(``...,backend=cuda.json``, ``{"<M>": {"UP_ROWS": u, "DOWN_ROWS": d}}``: ``ops/moe/_decode_split``).

The same discipline as the GEMM's loop (:mod:`.runner`): resumable (each table in the output
directory is reread and its finished M entries kept; a table is rewritten atomically after each
M), a wall-clock budget shared out over the remaining entries, every candidate checked against
the op's definition before it is timed (a wrong config is never written), the default config
timed first. One config serves both grouped products of a call, as in vLLM's files, so each
candidate is timed on the whole op (both products, routing, activation, sum), in a CUDA graph
(``triton.testing.do_bench_cudagraph``). Routing is random top-k over the experts (about
``M * topk / E`` rows per expert, as a balanced router gives). Without a GPU the kernels run in
the Triton interpreter: that exercises the loop and the files; the timings mean nothing.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from opmux.kernels import tuned
from opmux.kernels.tune.interleaved import final_round
from opmux.kernels.tune.runner import Report, _label, _setup, _timer

__all__ = ["BACKENDS", "MoeEntry", "cuda_candidates", "make_weights", "moe_candidates", "tune_moe"]

OP = "moe.fused_experts"
#: the backends with launch tables: the Triton kernel, the native decode kernels
BACKENDS = ("triton", "cuda")
#: vLLM's token counts for its fused-MoE tables (benchmark_moe.py), so files line up
MOE_MS: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)
_BLOCK_M = (16, 32, 64, 128)
_BLOCK_N = (32, 64, 128, 256)
_BLOCK_K = (64, 128, 256)
_GROUP_M = (1, 16, 32, 64)
_WARPS = (4, 8)
_STAGES = (2, 3, 4, 5)
#: configurations of the kinds that win on Hopper for this kernel (thin M tiles with deep K
#: pipelines at decode; 64 x 128 with grouping mid-range; 128 x 256 tiles, 8 warps, when each
#: expert gets many rows), tried right after the default so that a short budget times them
_SEEDS_BF16 = (
    (16, 128, 128, 16, 4, 5),
    (16, 64, 128, 1, 4, 4),
    (16, 64, 256, 16, 4, 3),
    (32, 128, 128, 16, 4, 3),
    (16, 256, 128, 1, 8, 2),
    (64, 128, 128, 1, 8, 4),
    (64, 128, 64, 1, 4, 3),
    (128, 256, 64, 16, 8, 4),
    (128, 256, 64, 1, 8, 4),
    (128, 128, 64, 16, 8, 4),
)
_SEEDS_FP8 = (
    (64, 128, 128, 32, 4, 3),
    (16, 128, 128, 1, 4, 5),
    (16, 64, 128, 1, 4, 4),
    (32, 128, 128, 16, 4, 3),
    (16, 256, 128, 1, 8, 3),
    (128, 128, 128, 32, 8, 3),
    (64, 256, 128, 16, 8, 3),
    (128, 256, 128, 16, 8, 2),
)
#: the decode path (``DECODE: 1``, a program per slot and block of weight rows) is timed beside
#: the grouped configurations up to this many tokens; its space: (up rows, down rows, K step,
#: warps, stages), the fp32 partial sums of a program kept within 1K-8K (up) and 16K (down)
DECODE_MAX_M = 8
_DECODE_ROWS = (2, 4, 8, 16, 32, 64)
_DECODE_K = (128, 256, 512)
_DECODE_WARPS = (2, 4, 8)
_DECODE_STAGES = (2, 3, 4)
_SEEDS_DECODE = (
    (16, 8, 256, 4, 3),
    (16, 4, 256, 4, 3),
    (8, 4, 512, 4, 3),
    (32, 8, 128, 8, 3),
    (8, 8, 512, 4, 3),
    (32, 16, 128, 4, 3),
    (16, 16, 256, 8, 3),
    (8, 4, 256, 4, 2),
    (16, 8, 128, 4, 4),
    (32, 32, 128, 8, 3),
    (8, 8, 128, 2, 4),
    (64, 8, 128, 4, 3),
    (32, 4, 256, 4, 3),
    (64, 16, 128, 8, 3),
)
#: mean |candidate - definition| / mean |definition| a candidate must stay below (bf16 outputs:
#: the definition rounds where the kernel does, so correct configs agree to ~1e-3)
_AGREE = 1e-2


@dataclass
class MoeEntry:
    e: int
    n: int
    k: int
    topk: int
    form: str
    m: int
    config: dict[str, int]
    us: float
    tried: int
    skipped: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    #: the final round: the fastest candidates' us with their replays interleaved (the pick)
    final: dict[str, float] = field(default_factory=dict)


def form_tags(form: str) -> tuple[tuple[str, str], ...]:
    """The file-name components of a weight form (vLLM's names)."""
    return tuned.FP8_BLOCK_TAGS if form == "fp8" else ()


def moe_candidates(
    m: int, shape: tuple[int, int, int, int], form: str, *, seed: int = 0
) -> list[dict[str, int]]:
    """The default config first, then the space in a seeded shuffle; M tiles taller than the
    rows an expert gets (``M * topk / E``, at least 16) are left out, and for fp8 the K step is
    one scale block."""
    e, n, _, topk = shape
    tags = form_tags(form)
    first = tuned.default_config(OP, "triton", m, (e, n), tags)
    rows = max(16, 1 << max(0, math.ceil(m * topk / e) - 1).bit_length())
    space = []
    for bm, bn, bk, group, warps, stages in _product(form):
        if bm > 2 * rows or (bm * bn >= 128 * 128 and warps == 4) or (bm * bn <= 32 * 64 and warps == 8):
            continue
        if bk * (bm + bn) * stages > 4 * 64 * 1024:  # shared memory: skip what cannot compile
            continue
        space.append(
            {
                "BLOCK_SIZE_M": bm,
                "BLOCK_SIZE_N": bn,
                "BLOCK_SIZE_K": bk,
                "GROUP_SIZE_M": group,
                "num_warps": warps,
                "num_stages": stages,
            }
        )
    random.Random(seed).shuffle(space)
    keys = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
    seeds = [dict(zip(keys, v, strict=True)) for v in (_SEEDS_FP8 if form == "fp8" else _SEEDS_BF16)]
    # the seeds whose M tile suits the rows an expert gets first
    seeds = sorted(
        (c for c in seeds if c["BLOCK_SIZE_M"] <= 2 * rows),
        key=lambda c: abs(c["BLOCK_SIZE_M"].bit_length() - min(rows, 128).bit_length()),
    )
    ordered = [first] + [c for c in seeds if c != first]
    if m <= DECODE_MAX_M:  # the decode path's seeds next, then its space mixed into the rest
        decode = _decode_space(form, topk, seed)
        ordered += [c for c in decode[0] if c not in ordered]
        pairs = itertools.zip_longest(space, decode[1])
        space = [c for pair in pairs for c in pair if c is not None]
    ordered += [c for c in space if c not in ordered]
    assert all(not tuned.validate_entry(OP, "triton", c, tags) for c in ordered)  # internal invariant
    return ordered


#: the native decode kernels' (up, down) pairs that won somewhere on an H100 (session 29's
#: bench_moe --cuda-splits over the four models at 1-32 tokens), timed right after the default
_SEEDS_CUDA = ((2, 4), (4, 8), (4, 4), (2, 2), (1, 2), (1, 1))


def cuda_candidates(m: int, shape: tuple[int, int] = (0, 0)) -> list[dict[str, int]]:
    """The native decode kernels' (up, down) columns per warp for ``shape`` (E, N): the default
    for ``m`` first, then the unit's own choice and the seeds, then every other instantiated pair."""
    from opmux.kernels.ops.moe import _decode_split as split

    first = dict(tuned.default_config(OP, "cuda", m, shape))
    pairs = [(split.AUTO, split.AUTO), *_SEEDS_CUDA]
    pairs += [(u, d) for u in split.UP_ROWS for d in split.DOWN_ROWS]
    ordered = [first] + [dict(zip(split.KEYS, p, strict=True)) for p in pairs]
    return [c for i, c in enumerate(ordered) if c not in ordered[:i]]


def cuda_refusal(e: int, n: int, k: int, topk: int, form: str, m: int) -> str | None:
    """Why the native decode kernels cannot run (E, N, K, topk, form) at M tokens on the current
    GPU (None: they can), from the shape alone: the tuner asks before making the weights."""
    import torch

    from opmux.kernels.ops.moe import fused_experts_cuda as fc

    try:
        capability, optin = fc._device_facts(torch.cuda.current_device())
    except Exception as exc:  # no GPU to read
        return f"the GPU's properties cannot be read: {type(exc).__name__}: {exc}"
    return fc.refusal(
        device="cuda", capability=capability, w1_dtype="float8_e4m3fn" if form == "fp8" else "bfloat16",
        hidden_dtype="bfloat16", tokens=m, topk=topk, n=n, k=k, aligned=True, smem_optin=optin,
    )  # fmt: skip


def _launch_cuda(*args: Any, config: dict[str, Any]) -> None:
    """The native decode backend's kernels with the candidate's columns per warp."""
    from opmux.kernels.ops.moe.fused_experts_cuda import launch

    launch(*args, rows_per_warp=(config["UP_ROWS"], config["DOWN_ROWS"]))


def _decode_space(form: str, topk: int, seed: int) -> tuple[list[dict[str, int]], list[dict[str, int]]]:
    """(seeds, shuffled space) of the decode path's configurations (fp8: a K step of whole groups);
    the down kernel's tile holds every slot of a token (topk x rows x K step: at most 16K fp32)."""
    slots = 1 << max(0, topk - 1).bit_length()
    ks = _DECODE_K[:3]

    def entry(up: int, down: int, bk: int, warps: int, stages: int) -> dict[str, int]:
        return {
            "BLOCK_SIZE_M": down,
            "BLOCK_SIZE_N": up,
            "BLOCK_SIZE_K": bk,
            "GROUP_SIZE_M": 1,
            "num_warps": warps,
            "num_stages": stages,
            "DECODE": 1,
        }

    def fits(up: int, down: int, bk: int) -> bool:
        if form == "fp8":  # groups of 128 a step, each a tensor-core product (16 rows or more)
            return 16 <= up <= 64 and 16 <= slots * down <= 128
        return 1024 <= up * bk <= 8192 and 512 <= slots * down * bk <= 16384

    seeds = [entry(*v) for v in _SEEDS_DECODE if v[2] in ks and fits(*v[:3])]
    space = [
        entry(up, down, bk, w, st)
        for up in _DECODE_ROWS
        for down in _DECODE_ROWS
        for bk in ks
        for w in _DECODE_WARPS
        for st in _DECODE_STAGES
        if fits(up, down, bk)
    ]
    random.Random(seed).shuffle(space)
    return seeds, [c for c in space if c not in seeds]


def _product(form: str) -> list[tuple[int, int, int, int, int, int]]:
    ks = (128,) if form == "fp8" else _BLOCK_K
    return [
        (bm, bn, bk, g, w, s)
        for bm in _BLOCK_M
        for bn in _BLOCK_N
        for bk in ks
        for g in _GROUP_M
        for w in _WARPS
        for s in _STAGES
    ]


def make_weights(torch: Any, e: int, n: int, k: int, form: str, device: str) -> dict[str, Any]:
    """Random experts of order-1 outputs in ``form`` (fp8: 128x128 blocks scaled to e4m3's range
    by each block's amax), with their scales (None for bf16); the tuner's and the benchmark's."""
    # made on the device (DeepSeek-V3's experts are 22 GB in bf16), one expert at a time in fp32
    gen = torch.Generator(device=device).manual_seed(e * 131 + n * 7 + k)
    w1 = torch.empty(e, 2 * n, k, dtype=torch.bfloat16, device=device)
    w2 = torch.empty(e, k, n, dtype=torch.bfloat16, device=device)
    for i in range(e):
        w1[i] = torch.randn(2 * n, k, generator=gen, device=device) * k**-0.5
        w2[i] = torch.randn(k, n, generator=gen, device=device) * n**-0.5
    if form != "fp8":
        return {"w1": w1, "w2": w2, "w1_scale": None, "w2_scale": None}
    out: dict[str, Any] = {}
    for name, w in (("w1", w1), ("w2", w2)):
        r, c = w.shape[1:]
        rb, cb = -(-r // 128), -(-c // 128)
        # one scale per 128x128 block from the block's amax; values quantized by it
        q = torch.empty(w.shape, dtype=torch.float8_e4m3fn, device=device)
        scale = torch.empty(e, rb, cb, dtype=torch.float32, device=device)
        for i in range(e):  # one expert at a time: no fp32 copy of them all
            blocks = torch.nn.functional.pad(w[i].float(), (0, cb * 128 - c, 0, rb * 128 - r))
            blocks = blocks.view(rb, 128, cb, 128)
            scale[i] = blocks.abs().amax(dim=(1, 3)).clamp_min(1e-8) / 448.0
            q[i] = (blocks / scale[i][:, None, :, None]).view(rb * 128, cb * 128)[:r, :c].to(q.dtype)
        out[name], out[name + "_scale"] = q, scale
    return out


def _routing(torch: Any, m: int, e: int, k: int, topk: int, device: str, seed: int) -> dict[str, Any]:
    gen = torch.Generator(device="cpu").manual_seed(seed * 1009 + m)
    hidden = torch.randn(m, k, generator=gen).to(torch.bfloat16).to(device)
    ids = torch.stack([torch.randperm(e, generator=gen)[:topk] for _ in range(m)]).to(torch.int32).to(device)
    weights = torch.rand(m, topk, generator=gen).to(device)
    return {"hidden": hidden, "tw": weights, "ti": ids}


class _Alternating:
    """A launch that takes its argument sets in turn, call after call: a timed graph of calls
    then routes each call to other experts than the last, as a serving step does (one routing
    over and over let the last call's experts linger in L2 and TLBs: the tuner timed a config at
    184 us that the benchmark, routing afresh each call, timed at 206)."""

    def __init__(self, launch: Any, sets: tuple[tuple[Any, ...], ...]) -> None:
        self.launch, self.sets, self.calls = launch, sets, 0

    def __call__(self, *, config: dict[str, Any]) -> None:
        self.calls += 1
        self.launch(*self.sets[self.calls % len(self.sets)], config=config)


def _confirm(
    torch: Any,
    device: str,
    timed: _Alternating,
    measured: list[tuple[float, dict[str, Any]]],
    progress: IO[str],
) -> tuple[tuple[float, dict[str, Any]], dict[str, float]]:
    """The first pass's fastest few timed again with their replays interleaved, each repetition
    one call per routing set (``interleaved.final_round``): a minimum over many noisy single
    timings favours a lucky one (on the H200 a config timed 185 us in the loop and 206 us in the
    benchmark), and timed one after another the GPU's clock drift favours some positions.
    (best, us per finalist); a failure there keeps the first pass's pick."""
    if len(measured) < 2:
        return min(measured, key=lambda x: x[0]), {}
    calls = len(timed.sets)

    def make(config: dict[str, Any], reps: int) -> Callable[[], None]:
        def run() -> None:
            for _ in range(reps * calls):
                timed(config=config)

        return run

    return final_round(torch, device, measured, _label, make, calls, progress)


def tune_moe(
    shapes: Sequence[tuple[int, int, int, int, str]],
    ms: Sequence[int],
    *,
    out: Path,
    budget_s: float,
    device: str | None = None,
    max_configs: int | None = None,
    progress: IO[str] | None = None,
    retune: bool = False,
    backend: str = "triton",
) -> Report:
    """Tune ``backend``'s launch for every (E, N, K, topk, form) in ``shapes`` and M in ``ms``;
    tables (``E=..,N=..,device_name=..[,dtype=fp8_w8a8,block_shape=[128,128]][,backend=cuda].json``)
    go to ``out``. Entries already there are kept, or with ``retune`` timed again, theirs first.
    The native decode kernels (``cuda``) need a CUDA GPU and take M up to their ``MAX_TOKENS``
    (larger M are left out, said on ``progress``)."""
    progress = sys.stderr if progress is None else progress
    for shape in shapes:
        if shape[4] not in ("bf16", "fp8"):
            raise ValueError(f"weight form {shape[4]!r}; valid: bf16, fp8")
    if backend not in BACKENDS:
        raise ValueError(f"{OP} has no tuned launch for backend {backend!r}; valid: {', '.join(BACKENDS)}")
    torch, device = _setup(device)
    from opmux.kernels.ops.moe import _experts
    from opmux.kernels.ops.moe.fused_experts_triton import launch_fused_experts

    launch: Any = launch_fused_experts
    if backend == "cuda":
        from opmux.kernels.ops.moe import fused_experts_cuda

        if device == "cpu":
            raise ValueError(f"{OP} --backend cuda tunes the native decode kernels: it needs a CUDA GPU")
        launch = _launch_cuda
        dropped = [m for m in ms if m > fused_experts_cuda.MAX_TOKENS]
        if dropped:
            print(
                f"M {', '.join(map(str, dropped))} left out: the native decode kernels take at most "
                f"{fused_experts_cuda.MAX_TOKENS} tokens",
                file=progress,
            )
        ms = [m for m in ms if m <= fused_experts_cuda.MAX_TOKENS]

    dev_name = tuned.device_name(torch.device(device))
    timing = (
        "CUDA graphs (triton.testing.do_bench_cudagraph)"
        if device != "cpu"
        else "time.perf_counter in the Triton interpreter: NOT meaningful, a test of the tuner only"
    )
    report = Report(dev_name, timing, str(out))
    bench = _timer(torch, device)
    deadline = time.monotonic() + budget_s
    empty = torch.empty(0, device=device)
    no_map = torch.empty(0, dtype=torch.int32, device=device)

    tables: dict[tuple[int, int, str], dict[int, dict[str, Any]]] = {}
    todo: list[tuple[int, int, int, int, str, int]] = []
    for e, n, k, topk, form in shapes:
        key = tuned.table_key(OP, backend, dev_name, (e, n), form_tags(form))
        path = out / key.file_name()
        table = {m: dict(c) for m, c in tuned.read_table(path, key).items()} if path.exists() else {}
        tables[(e, n, form)] = table
        for m in ms:
            if m in table and not retune:
                report.entries.append(MoeEntry(e, n, k, topk, form, m, table[m], math.nan, 0, skipped=True))
            else:
                todo.append((e, n, k, topk, form, m))
    print(
        f"tuning {OP} on {dev_name}: {len(todo)} entries, budget {budget_s:g} s; timing: {timing}",
        file=progress,
    )

    weights: dict[tuple[int, int, int, str], dict[str, Any]] = {}
    for done, (e, n, k, topk, form, m) in enumerate(todo):
        share = (deadline - time.monotonic()) / (len(todo) - done)
        if share <= 0:
            report.unfinished += todo[done:]  # after those no config ran for
            break
        entry_deadline = time.monotonic() + share
        why = cuda_refusal(e, n, k, topk, form, m) if backend == "cuda" else None
        if why:  # before its weights are made: the unit cannot run this shape here at all
            print(f"  E={e} N={n} K={k} {form} M={m} not tuned: {why}", file=progress)
            report.refused.append((e, n, k, topk, form, m))
            continue
        if (e, n, k, form) not in weights:
            weights.clear()  # one model's weights at a time (DeepSeek-V3's are 11 GB in fp8)
            weights[(e, n, k, form)] = make_weights(torch, e, n, k, form, device)
        w = weights[(e, n, k, form)]
        s, s_other = (_routing(torch, m, e, k, topk, device, seed) for seed in (0, 1))
        s1 = w["w1_scale"] if w["w1_scale"] is not None else empty
        s2 = w["w2_scale"] if w["w2_scale"] is not None else empty
        y = torch.empty_like(s["hidden"])
        args = (y, s["hidden"], w["w1"], w["w2"], s["tw"], s["ti"], s1, s2, no_map, "silu", False)
        other = (torch.empty_like(y), s_other["hidden"], *args[2:4], s_other["tw"], s_other["ti"], *args[6:])
        timed = _Alternating(launch, (args, other))
        mr = min(m, 256)  # the definition on the first rows (its per-expert loop is slow)
        exact = _experts.reference(
            s["hidden"][:mr],
            w["w1"],
            w["w2"],
            s["tw"][:mr],
            s["ti"][:mr],
            w1_scale=w["w1_scale"],
            w2_scale=w["w2_scale"],
        ).float()
        previous = tables[(e, n, form)].get(m)
        # this table's entry first, then those of the tables the op reads (the user's, the
        # wheel's), then the space
        key = tuned.table_key(OP, backend, dev_name, (e, n), form_tags(form))
        path = out / key.file_name()
        known = [
            {k: v for k, v in c.items() if k not in tuned.IGNORED_MOE_KEYS}
            for c in tuned.table_entries(key, m)
        ]
        first = [
            c
            for c in ([previous] if previous else []) + known
            if not tuned.validate_entry(OP, backend, c, key.tags)
        ]
        first = [c for i, c in enumerate(first) if c not in first[:i]]
        space = cuda_candidates(m, (e, n)) if backend == "cuda" else moe_candidates(m, (e, n, k, topk), form)
        best: tuple[float, dict[str, Any]] | None = None
        tried = 0
        timings: dict[str, float] = {}
        measured: list[tuple[float, dict[str, Any]]] = []
        for config in first + [c for c in space if c not in first]:
            if tried >= 2 and time.monotonic() > entry_deadline:
                break
            if max_configs is not None and tried >= max_configs:
                break
            tried += 1
            try:
                y.fill_(math.nan)
                launch(*args, config=config)
                got = y[:mr].float()
                if not bool(got.isfinite().all()):
                    print(f"  wrong {config}: elements not written or not finite", file=progress)
                    continue
                err = float((got - exact).abs().mean() / exact.abs().mean().clamp_min(1e-30))
                if not err <= _AGREE:
                    print(f"  wrong {config}: mean |diff| / mean |exact| = {err:.2e}", file=progress)
                    continue
                us = bench(functools.partial(timed, config=config))
                timings[_label(config)] = us
            except Exception as err:  # out of resources, a compile failure: skip the config
                print(f"  skipped {config}: {type(err).__name__}: {err}".splitlines()[0], file=progress)
                continue
            measured.append((us, config))
            if best is None or us < best[0]:
                best = (us, config)
        if best is None:
            report.unfinished.append((e, n, k, topk, form, m))
            continue
        best, final = _confirm(torch, device, timed, measured, progress)
        tables[(e, n, form)][m] = best[1]
        tuned.write_table(path, tables[(e, n, form)])
        report.entries.append(
            MoeEntry(e, n, k, topk, form, m, best[1], best[0], tried, timings=timings, final=final)
        )
        print(
            f"[{done + 1}/{len(todo)}] E={e} N={n} K={k} {form} M={m} best {best[0]:.1f} us ({tried} configs)",
            file=progress,
        )
    if report.refused:
        print(
            f"{len(report.refused)} entries refused by the backend on this GPU (a rerun refuses them too)",
            file=progress,
        )
    if report.unfinished:
        print(
            f"budget spent: {len(report.unfinished)} entries left; run again to continue (finished ones are kept)",
            file=progress,
        )
    return report
