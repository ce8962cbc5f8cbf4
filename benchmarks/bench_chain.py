"""Decoder-layer chain benchmark (issue 14, point 3): the memory-bound ops of one decoder layer, in
order, captured in one CUDA graph, opmux (PDL on and off) against the same chain built from
FlashInfer, from Liger-Kernel and from torch.compile of the reference chain.

    python benchmarks/bench_chain.py --out DIR [--quick] [--layers llama3-8b] [--tokens 1,16] [--budget-s 480]
    python benchmarks/bench_chain.py --device cpu --dry-run [--out DIR]     # wiring check, tiny shapes
    python benchmarks/bench_chain.py --render DIR/bench_chain.json --md docs/benchmarks/h200_chain.md

Layers (bf16, T = 1, 16, 128, 4096 tokens; ``--quick``: 1 and 4096):

* ``llama3-8b`` (H 4096, 32 q / 8 kv heads of 128, intermediate 14336): fused_add_rmsnorm ->
  rotary_embedding (neox) on the q/k views of a [T, 48*128] qkv buffer -> reshape_and_cache of
  those k/v views (flash layout, block 16) -> fused_add_rmsnorm -> silu_and_mul [T, 2*14336] ->
  per_token_group_quant_fp8 [T, 14336] (group 128).
* ``decode-mlp`` (issue 30's decode chain, Llama-3-8B's sizes: H 4096, intermediate 14336):
  fused_add_rmsnorm -> silu_and_mul -> fused_add_rmsnorm, the MLP's ops between its GEMMs and the
  next layer's first norm; R chains per graph stand for R layers (us per chain = per layer).
* ``qwen3-moe`` (Qwen3-30B-A3B: H 2048, 32 q / 4 kv heads of 128, 128 experts, top-8, moe
  intermediate 768): fused_add_rmsnorm -> qk_norm of the q/k views -> rope -> KV write ->
  fused_add_rmsnorm -> topk_softmax (fp32 router logits [T, 128], renormalized as Qwen3's
  norm_topk_prob) -> moe_align_block_size (its topk_ids, block 64) -> silu_and_mul [T*8, 2*768] ->
  per_token_group_quant_fp8 [T*8, 768].

The GEMMs between the ops are left out: every op reads its own pre-made input buffer (random
data); only rope -> KV write (the same qkv buffer) and topk -> align (its ids) pass data along,
as an engine does. Implementations, each a full chain in its own graph, in one run:
``opmux (PDL)`` (``enable_pdl=True`` on every op), ``opmux (no PDL)`` (``enable_pdl=False``),
``opmux fused (PDL)`` (the same, with silu_and_mul -> per_token_group_quant_fp8 as the one op
``silu_and_mul_per_token_group_quant_fp8`` on the gate/up buffer: the activation is neither written
nor read back, as an engine would call it; checked against the float32 quantization of
silu(gate) * up), ``FlashInfer``, ``Liger`` and ``torch.compile`` (the whole bf16 reference chain compiled as one
function). Where a peer lacks an op its chain runs ``torch.compile`` of that op's piece of the
reference chain (static shapes); ``PIECES`` and the rendered table say which.

Each chain is checked once against a float32 reference (the tolerances of bench_cases.py) before
it is timed; a wrong one is recorded ``wrong`` and not timed, one that raises ``failed`` with its
error (the run goes on). Timing (bench_gpu.time_impls): warm-up, R chains captured in one CUDA
graph per chain cycling over up to ``--max-sets`` input sets, R chosen so a replay lasts >=
``--target-us``; the checked chains of a case timed together, ``--replays`` rounds that replay
each graph once in a rotated order (the GPU's clocks drift within seconds: one after another, the
first column got the cooler GPU); the median per chain, us per chain. Each opmux op is also timed
alone the same way (its PDL on / off columns together), so the table shows the sum of the ops
next to the chain (what PDL overlaps).

opmux must have the ``enable_pdl`` keyword on every op used: without it the opmux chains are
recorded ``failed`` with that message and the script exits 3 after writing its results.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import bench_cases as bc  # noqa: E402  (torch only; peers imported lazily)
import bench_gpu as bg  # noqa: E402  (log, timing, environment, FlashInfer JIT prebuild)
import torch  # noqa: E402

log = bg.log
_err = bg._err

EPS = bc.EPS
GROUP = bc.GROUP
KV_BLOCK = 16
ALIGN_BLOCK = 64
TOKENS = (1, 16, 128, 4096)
QUICK_TOKENS = (1, 4096)
DRY_TOKENS = (1, 5)
FI_MODULES = ("norm", "rope", "page", "silu_and_mul", "quantization")
PDL_EXIT = 3
FI_BUILD = "chain_fi_build"  # OUT/.chain_fi_build.log: FlashInfer's compiler output

Bufs = dict[str, Any]
State = dict[str, Any]
StepFn = Callable[[Bufs, State], None]


@dataclass(frozen=True)
class Layer:
    name: str
    H: int
    Hq: int
    Hk: int
    D: int
    inter: int  # dense MLP intermediate, or the MoE expert intermediate
    experts: int = 0
    topk: int = 0
    qk_norm: bool = False
    max_pos: int = bc.MAX_POS
    #: the steps when the chain is a fixed pattern rather than the whole layer's memory-bound ops
    pattern: tuple[str, ...] = ()

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def quantizes(self) -> bool:
        """The chain has silu_and_mul -> quant_fp8 (what the fused chain runs as one op)."""
        return "quant_fp8" in self.steps()

    def rows(self, T: int) -> int:
        """Rows of the MLP activation: T, or T * top-k for an MoE layer."""
        return T * self.topk if self.moe else T

    def steps(self, fused: bool = False) -> list[str]:
        """The chain's ops in order; ``fused``: the activation and its quantization as one op."""
        if self.pattern:
            return list(self.pattern)
        s = ["add_norm1"] + (["qk_norm"] if self.qk_norm else []) + ["rope", "kv_write", "add_norm2"]
        s += ["topk_softmax", "moe_align"] if self.moe else []
        return s + (["silu_quant"] if fused else ["silu_and_mul", "quant_fp8"])

    def config(self) -> dict[str, Any]:
        keys = ("H", "Hq", "Hk", "D", "inter", "experts", "topk", "qk_norm", "max_pos")
        return {k: getattr(self, k) for k in keys} | ({"pattern": list(self.pattern)} if self.pattern else {})


LAYERS = {
    "llama3-8b": Layer("llama3-8b", 4096, 32, 8, 128, 14336),
    "qwen3-moe": Layer("qwen3-moe", 2048, 32, 4, 128, 768, experts=128, topk=8, qk_norm=True),
    # issue 30's decode chain: the MLP's norm -> activation -> next layer's norm, Llama-3-8B sizes
    "decode-mlp": Layer(
        "decode-mlp", 4096, 32, 8, 128, 14336, pattern=("add_norm1", "silu_and_mul", "add_norm2")
    ),
}
#: --dry-run shapes (CPU): same structure, small enough for a unit test
TINY = {
    "llama3-8b": replace(LAYERS["llama3-8b"], H=256, Hq=4, Hk=2, inter=256, max_pos=64),
    "qwen3-moe": replace(LAYERS["qwen3-moe"], H=256, Hq=4, Hk=2, inter=128, experts=16, topk=4, max_pos=64),
    "decode-mlp": replace(LAYERS["decode-mlp"], H=256, Hq=4, Hk=2, inter=256, max_pos=64),
}
#: what each step writes that the check compares with the float32 reference (name -> tolerance kind)
STEP_OUTPUTS: dict[str, dict[str, str]] = {
    "add_norm1": {"add_norm1.x": "float", "add_norm1.res": "float"},
    "qk_norm": {},  # checked through rope's q / k, which read its output
    "rope": {"q": "float", "k": "float"},
    "kv_write": {"kv.k": "float", "kv.v": "exact"},
    "add_norm2": {"add_norm2.x": "float", "add_norm2.res": "float"},
    "topk_softmax": {},  # checked by its own rule (ties may reorder), with moe_align
    "moe_align": {},
    "silu_and_mul": {"silu": "float"},
    "quant_fp8": {"quant.q": "fp8", "quant.s": "float"},
    "silu_quant": {"silu_quant.q": "fp8", "silu_quant.s": "float"},
}
OPMUX_OPS = {  # step -> (registry name, public function)
    "add_norm1": ("layernorm.fused_add_rmsnorm", "opmux.kernels.ops.layernorm:fused_add_rmsnorm"),
    "add_norm2": ("layernorm.fused_add_rmsnorm", "opmux.kernels.ops.layernorm:fused_add_rmsnorm"),
    "qk_norm": ("layernorm.qk_norm", "opmux.kernels.ops.layernorm:qk_norm"),
    "rope": ("rope.rotary_embedding", "opmux.kernels.ops.rope:rotary_embedding"),
    "kv_write": ("kvcache.reshape_and_cache", "opmux.kernels.ops.kvcache:reshape_and_cache"),
    "topk_softmax": ("moe.topk_softmax", "opmux.kernels.ops.moe:topk_softmax"),
    "moe_align": ("moe.moe_align_block_size", "opmux.kernels.ops.moe:moe_align_block_size"),
    "silu_and_mul": ("activation.silu_and_mul", "opmux.kernels.ops.activation:silu_and_mul"),
    "quant_fp8": (
        "quantization.per_token_group_quant_fp8",
        "opmux.kernels.ops.quantization:per_token_group_quant_fp8",
    ),
}
#: the fused chain's one op for silu_and_mul -> quant_fp8 (an opmux without it: that chain is n/a)
FUSED_OP = (
    "quantization.silu_and_mul_per_token_group_quant_fp8",
    "opmux.kernels.ops.quantization:silu_and_mul_per_token_group_quant_fp8",
)
TC = "torch.compile piece"
#: what each peer chain runs per step (the rendered substitution table)
PIECES: dict[str, dict[str, str]] = {
    "FlashInfer": {
        "add_norm1": "flashinfer.norm.fused_add_rmsnorm",
        "add_norm2": "flashinfer.norm.fused_add_rmsnorm",
        "qk_norm": "flashinfer.norm.rmsnorm in its 3-D QK form on the strided [T, heads, 128] views (writes new q/k)",
        "rope": "flashinfer.rope.apply_rope_with_cos_sin_cache_inplace",
        "kv_write": "flashinfer.page.append_paged_kv_cache (NHD; one page entry per token)",
        "topk_softmax": TC,
        "moe_align": TC + " (static-shape torch version)",
        "silu_and_mul": "flashinfer.activation.silu_and_mul",
        "quant_fp8": "flashinfer.quantization.per_token_group_quant_8bit",
    },
    "Liger": {
        "add_norm1": "LigerFusedAddRMSNormFunction",
        "add_norm2": "LigerFusedAddRMSNormFunction",
        "qk_norm": "LigerRMSNormFunction (its ensure_contiguous copies the strided q/k views)",
        "rope": TC,
        "kv_write": TC,
        "topk_softmax": TC,
        "moe_align": TC + " (static-shape torch version)",
        "silu_and_mul": "LigerSiLUMulFunction (copies the gate/up halves to contiguous)",
        "quant_fp8": TC,
    },
    "torch.compile": {"*": "the whole bf16 reference chain, one torch.compile(dynamic=False) function"},
}


class MissingPDL(RuntimeError):
    """opmux's public ops lack the ``enable_pdl`` keyword this benchmark times."""


# --------------------------------------------------------------------------------------------
# inputs


def make_set(layer: Layer, T: int, seed: int, device: str, consts: Bufs) -> Bufs:
    """One input set: every op's own pre-made buffer (random, never zeros); weights and the
    cos/sin table are shared between sets (``consts``)."""
    g = bc._gen(device, seed)
    H, Hq, Hk, D, inter = layer.H, layer.Hq, layer.Hk, layer.D, layer.inter
    M = layer.rows(T)
    nblocks = max(4, math.ceil(2 * T / KV_BLOCK))
    b: Bufs = dict(consts)
    b.update(
        x1=bc._randn((T, H), g, device),
        r1=bc._randn((T, H), g, device),
        qkv=bc._randn((T, (Hq + 2 * Hk) * D), g, device),
        pos=torch.randint(0, layer.max_pos, (T,), generator=g, device=device, dtype=torch.int64),
        kc=bc._randn((nblocks, KV_BLOCK, Hk, D), g, device),
        vc=bc._randn((nblocks, KV_BLOCK, Hk, D), g, device),
        slots=torch.randperm(nblocks * KV_BLOCK, generator=g, device=device)[:T].to(torch.int64),
        x2=bc._randn((T, H), g, device),
        r2=bc._randn((T, H), g, device),
        gate_up=bc._randn((M, 2 * inter), g, device),
        act=bc._randn((M, inter), g, device),
    )
    if layer.moe:
        b["logits"] = bc._randn((T, layer.experts), g, device, dtype=torch.float32)
        # the align step's input when it is timed alone (in the chain it reads topk's ids)
        b["ids0"] = b["logits"].topk(layer.topk, dim=-1).indices.to(torch.int32)
    return b


def make_consts(layer: Layer, seed: int, device: str) -> Bufs:
    g = bc._gen(device, seed + 7919)
    D = layer.D
    inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, device=device, dtype=torch.float32) / D))
    freqs = torch.arange(layer.max_pos, device=device, dtype=torch.float32)[:, None] * inv[None, :]
    c: Bufs = {
        "w1": bc._randn((layer.H,), g, device, scale=0.5) + 1.0,
        "w2": bc._randn((layer.H,), g, device, scale=0.5) + 1.0,
        "cos_sin": torch.cat([freqs.cos(), freqs.sin()], dim=-1),  # [max_pos, D] float32
    }
    if layer.qk_norm:
        c["qw"] = bc._randn((D,), g, device, scale=0.5) + 1.0
        c["kw"] = bc._randn((D,), g, device, scale=0.5) + 1.0
    return c


def clone_set(b: Bufs) -> Bufs:
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in b.items()}


def init_state(layer: Layer, b: Bufs) -> State:
    """The chain's running state: q/k/v views of the qkv buffer, the ids align reads alone."""
    qkv, Hq, Hk, D = b["qkv"], layer.Hq, layer.Hk, layer.D
    st: State = {
        "q": qkv[:, : Hq * D],
        "k": qkv[:, Hq * D : (Hq + Hk) * D],
        "v": qkv[:, (Hq + Hk) * D :],
    }
    if layer.moe:
        st["topk.ids"] = b["ids0"]
    return st


def step_bytes(layer: Layer, T: int, step: str) -> int:
    """Bytes one step must move (inputs read once, outputs written once)."""
    H, Hq, Hk, D, M, inter = layer.H, layer.Hq, layer.Hk, layer.D, layer.rows(T), layer.inter
    E, k = layer.experts, layer.topk
    if step.startswith("add_norm"):
        return 4 * T * H * 2 + H * 2
    if step == "qk_norm":
        return 2 * 2 * T * (Hq + Hk) * D + 4 * D
    if step == "rope":
        return 2 * T * (Hq + Hk) * D * 2 + T * 8 + T * D * 4
    if step == "kv_write":
        return 4 * T * Hk * D * 2 + T * 8
    if step == "topk_softmax":
        return T * E * 4 + T * k * 8
    if step == "moe_align":
        n = T * k
        return n * 4 + (n + E * (ALIGN_BLOCK - 1)) * 4 * 2
    if step == "silu_and_mul":
        return 3 * M * inter * 2
    if step == "quant_fp8":
        return M * inter * 3 + M * (inter // GROUP) * 4
    if step == "silu_quant":
        return M * inter * 5 + M * (inter // GROUP) * 4
    raise KeyError(step)


# --------------------------------------------------------------------------------------------
# the float32 reference and the checks


def reference(layer: Layer, b: Bufs) -> dict[str, torch.Tensor]:
    """Float32 outputs of the chain on a pristine set (the KV cache as the rows at the slots)."""
    T, Hq, Hk, D = b["x1"].shape[0], layer.Hq, layer.Hk, layer.D
    out: dict[str, torch.Tensor] = {}
    for n in ("1", "2"):
        r = b[f"x{n}"].float() + b[f"r{n}"].float()
        out[f"add_norm{n}.x"], out[f"add_norm{n}.res"] = bc.rms_ref(r, b[f"w{n}"]), r
    st = init_state(layer, b)
    q, k = st["q"].float(), st["k"].float()
    if layer.qk_norm:
        q = bc.rms_ref(q.view(T, Hq, D), b["qw"]).view(T, Hq * D)
        k = bc.rms_ref(k.view(T, Hk, D), b["kw"]).view(T, Hk * D)
    out["q"], out["k"] = bc._rope_ref((b["pos"], q, k, D, b["cos_sin"]))
    out["kv.k"], out["kv.v"] = out["k"].view(T, Hk, D), st["v"].float().reshape(T, Hk, D)
    if layer.moe:
        p = torch.softmax(b["logits"].float(), dim=-1)
        w, ids = p.topk(layer.topk, dim=-1)
        out["topk.w"], out["topk.ids"], out["topk.p"] = w / w.sum(-1, keepdim=True), ids, p
    (out["silu"],) = bc._act_ref("silu")((b["gate_up"],))
    out["quant.q"], out["quant.s"] = bc._ptgq_ref((b["act"],))
    out["silu_quant.q"], out["silu_quant.s"] = bc._ptgq_ref(
        (out["silu"],)
    )  # the fused op: no bf16 rounding between
    return out


def align_reference(ids: torch.Tensor, block: int, E: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """vLLM's layout, by a plain loop over experts (CPU): (sorted ids, expert ids, padded count)."""
    flat = ids.flatten().long().cpu()
    sorted_ids, expert_ids, pos = [], [], 0
    for e in range(E):
        idx = (flat == e).nonzero().flatten().tolist()
        padded = -(-len(idx) // block) * block
        sorted_ids += idx + [flat.numel()] * (padded - len(idx))
        expert_ids += [e] * (padded // block)
        pos += padded
    return torch.tensor(sorted_ids, dtype=torch.long), torch.tensor(expert_ids, dtype=torch.long), pos


def check(layer: Layer, b: Bufs, st: State, ref: dict[str, torch.Tensor]) -> tuple[bool, float, str]:
    """(ok, worst relative error, detail) of one chain run (``b`` its buffers after the run)."""
    T, Hk, D = b["x1"].shape[0], layer.Hk, layer.D
    fused = "silu_quant.q" in st  # the fused chain
    where: dict[str, Callable[[], torch.Tensor]] = {
        "q": lambda: st["q"].reshape(T, -1),
        "k": lambda: st["k"].reshape(T, -1),
        "kv.k": lambda: b["kc"].view(-1, Hk, D)[b["slots"]],
        "kv.v": lambda: b["vc"].view(-1, Hk, D)[b["slots"]],
    }
    got: dict[str, tuple[str, torch.Tensor]] = {
        name: (kind, where[name]() if name in where else st[name])
        for step in layer.steps(fused)
        for name, kind in STEP_OUTPUTS[step].items()
    }
    worst, bad, parts = 0.0, [], []
    for name, (kind, o) in got.items():
        r = ref[name]
        if kind == "fp8" and bc.FP8 is not None and o.dtype != bc.FP8:
            return False, math.inf, f"{name}: dtype {o.dtype}, expected float8_e4m3fn"
        if o.numel() != r.numel():
            return False, math.inf, f"{name}: shape {tuple(o.shape)}, expected {tuple(r.shape)}"
        e = bc.rel_l2(o, r)
        worst = max(worst, e)
        parts.append(f"{name} {e:.1e}")
        if not e <= bc.TOL[kind]:
            bad.append(name)
    if layer.moe:
        w, ids = st["topk.w"].float(), st["topk.ids"].long()
        order = w.argsort(dim=-1, descending=True)
        w, ids = w.gather(-1, order), ids.gather(-1, order)
        pk = ref["topk.p"].gather(-1, ids)
        e = max(bc.rel_l2(w, ref["topk.w"]), bc.rel_l2(pk / pk.sum(-1, keepdim=True), ref["topk.w"]))
        worst = max(worst, e)
        parts.append(f"topk {e:.1e}")
        if not e <= bc.TOL["topk"]:
            bad.append("topk")
        s_ref, e_ref, n_ref = align_reference(st["topk.ids"], ALIGN_BLOCK, layer.experts)
        sorted_ids, expert_ids, post = (t.long().cpu() for t in st["align"])
        ok_align = (
            int(post.flatten()[0]) == n_ref
            and torch.equal(sorted_ids[:n_ref], s_ref)
            and torch.equal(expert_ids[: n_ref // ALIGN_BLOCK], e_ref)
        )
        parts.append("align " + ("exact" if ok_align else "DIFFERS"))
        if not ok_align:
            bad.append("moe_align")
    detail = ("WRONG: " + ", ".join(bad) + " | " if bad else "") + "rel. L2 " + ", ".join(parts)
    return not bad, worst, detail


# --------------------------------------------------------------------------------------------
# the torch pieces (what torch.compile compiles; the peers' substitutes)


def t_add_norm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return bc.eager_fused_add_rmsnorm(x, r, w)


def t_qk_norm(
    q: torch.Tensor, k: torch.Tensor, qw: torch.Tensor, kw: torch.Tensor, Hq: int, Hk: int, D: int
) -> tuple[torch.Tensor, torch.Tensor]:
    T = q.shape[0]
    qn, kn = bc.eager_qk_norm(q.view(T, Hq, D), k.view(T, Hk, D), qw, kw)
    return qn.reshape(T, Hq * D), kn.reshape(T, Hk * D)


def t_rope(
    pos: torch.Tensor, q: torch.Tensor, k: torch.Tensor, D: int, cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return bc.eager_rope(pos, q, k, D, cache)


def t_kv_write(
    k: torch.Tensor, v: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slots: torch.Tensor, Hk: int, D: int
) -> None:
    T = k.shape[0]
    bc.eager_reshape_and_cache(k.reshape(T, Hk, D), v.reshape(T, Hk, D), kc, vc, slots)


def t_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax in fp32, top-k, renormalized (Qwen3-MoE's norm_topk_prob)."""
    w, ids = torch.softmax(logits, dim=-1, dtype=torch.float32).topk(k, dim=-1)
    return w / w.sum(-1, keepdim=True), ids


def t_align(ids: torch.Tensor, block: int, E: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """moe_align_block_size with static shapes (vLLM's layout; ids assumed in [0, E)): counts by
    scatter_add, padded cumsum, stable argsort, scatter of the token ids, searchsorted for the
    expert of each block."""
    flat = ids.flatten().long()
    n = flat.numel()
    counts = torch.zeros(E, dtype=torch.long, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block - 1) // block * block
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    order = torch.argsort(flat, stable=True)
    se = flat[order]
    first = torch.cumsum(counts, 0) - counts
    dest = starts[se] + torch.arange(n, device=flat.device) - first[se]
    max_padded = n + E * (block - 1)
    sorted_ids = torch.full((max_padded,), n, dtype=torch.long, device=flat.device).scatter(0, dest, order)
    blocks = torch.arange((max_padded + block - 1) // block, device=flat.device)
    owner = torch.searchsorted(ends // block, blocks, right=True)
    total = ends[-1:]
    expert_ids = torch.where(blocks < total // block, owner, -1)
    return sorted_ids.to(torch.int32), expert_ids.to(torch.int32), total.to(torch.int32)


def t_silu(x: torch.Tensor) -> torch.Tensor:
    return bc.eager_silu_and_mul(x)


def t_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return bc.eager_per_token_group_quant_fp8(x)


def torch_chain_fn(layer: Layer) -> Callable[..., dict[str, Any]]:
    """The whole bf16 reference chain as one function of tensors (what torch.compile compiles):
    the chain's steps only, each output under its check name (``STEP_OUTPUTS``)."""
    Hq, Hk, D, E, k = layer.Hq, layer.Hk, layer.D, layer.experts, layer.topk
    steps = set(layer.steps())

    def chain(*a: torch.Tensor) -> dict[str, Any]:
        x1, r1, w1, qkv, pos, cache, kc, vc, slots, x2, r2, w2, gate_up, act = a[:14]
        out: dict[str, Any] = {}
        if "add_norm1" in steps:
            out["add_norm1.x"], out["add_norm1.res"] = t_add_norm(x1, r1, w1)
        if "rope" in steps:
            q, kk, v = qkv[:, : Hq * D], qkv[:, Hq * D : (Hq + Hk) * D], qkv[:, (Hq + Hk) * D :]
            if "qk_norm" in steps:
                q, kk = t_qk_norm(q, kk, a[14], a[15], Hq, Hk, D)
            out["q"], out["k"] = t_rope(pos, q, kk, D, cache)
            if "kv_write" in steps:
                t_kv_write(out["k"], v, kc, vc, slots, Hk, D)
        if "add_norm2" in steps:
            out["add_norm2.x"], out["add_norm2.res"] = t_add_norm(x2, r2, w2)
        if "topk_softmax" in steps:
            out["topk.w"], out["topk.ids"] = t_topk(a[16], k)
            if "moe_align" in steps:
                out["align"] = t_align(out["topk.ids"], ALIGN_BLOCK, E)
        if "quant_fp8" in steps:
            out["quant.q"], out["quant.s"] = t_quant(act)
        if "silu_and_mul" in steps:
            out["silu"] = t_silu(gate_up)
        return out

    return chain


def torch_chain_step(layer: Layer, fn: Callable[..., dict[str, Any]]) -> StepFn:
    names = [
        "x1",
        "r1",
        "w1",
        "qkv",
        "pos",
        "cos_sin",
        "kc",
        "vc",
        "slots",
        "x2",
        "r2",
        "w2",
        "gate_up",
        "act",
    ]
    names += (["qw", "kw"] if layer.qk_norm else ["w1", "w1"]) + (["logits"] if layer.moe else [])

    def step(b: Bufs, st: State) -> None:
        st.update(fn(*(b[n] for n in names)))

    return step


def compiled(fn: Callable[..., Any], compile_: bool) -> Callable[..., Any]:
    return torch.compile(fn, dynamic=False) if compile_ else fn


def piece_steps(layer: Layer, compile_: bool) -> dict[str, StepFn]:
    """Every step as torch.compile of its reference piece (the peers' substitutes)."""
    Hq, Hk, D, E, k = layer.Hq, layer.Hk, layer.D, layer.experts, layer.topk
    add_norm, qk, rope, kv = (compiled(f, compile_) for f in (t_add_norm, t_qk_norm, t_rope, t_kv_write))
    topk, align, silu, quant = (compiled(f, compile_) for f in (t_topk, t_align, t_silu, t_quant))

    def norm_step(n: str) -> StepFn:
        def f(b: Bufs, st: State) -> None:
            st[f"add_norm{n}.x"], st[f"add_norm{n}.res"] = add_norm(b[f"x{n}"], b[f"r{n}"], b[f"w{n}"])

        return f

    def s_qk(b: Bufs, st: State) -> None:
        st["q"], st["k"] = qk(st["q"], st["k"], b["qw"], b["kw"], Hq, Hk, D)

    def s_rope(b: Bufs, st: State) -> None:
        st["q"], st["k"] = rope(b["pos"], st["q"], st["k"], D, b["cos_sin"])

    def s_kv(b: Bufs, st: State) -> None:
        kv(st["k"], st["v"], b["kc"], b["vc"], b["slots"], Hk, D)

    def s_topk(b: Bufs, st: State) -> None:
        st["topk.w"], st["topk.ids"] = topk(b["logits"], k)

    def s_align(b: Bufs, st: State) -> None:
        st["align"] = align(st["topk.ids"], ALIGN_BLOCK, E)

    def s_silu(b: Bufs, st: State) -> None:
        st["silu"] = silu(b["gate_up"])

    def s_quant(b: Bufs, st: State) -> None:
        st["quant.q"], st["quant.s"] = quant(b["act"])

    return {
        "add_norm1": norm_step("1"),
        "add_norm2": norm_step("2"),
        "qk_norm": s_qk,
        "rope": s_rope,
        "kv_write": s_kv,
        "topk_softmax": s_topk,
        "moe_align": s_align,
        "silu_and_mul": s_silu,
        "quant_fp8": s_quant,
    }


# --------------------------------------------------------------------------------------------
# the implementations


@dataclass
class Impl:
    name: str
    kind: str  # "opmux" or "peer"
    steps: list[tuple[str, StepFn]] = field(default_factory=list)
    pieces: dict[str, str] = field(default_factory=dict)  # step -> what runs it
    unavailable: str | None = None  # why this implementation is not run
    failed: str | None = None  # set up failed (e.g. the opmux API lacks enable_pdl)
    prepare: Callable[[Bufs], None] | None = None  # adds its own per-set arguments, before timing
    fi: bool = False  # waits for FlashInfer's JIT modules
    fused: bool = False  # runs Layer.steps(fused=True)

    def chain(self, layer: Layer) -> Callable[[Bufs], State]:
        steps = [f for _, f in self.steps]

        def run(b: Bufs) -> State:
            st = init_state(layer, b)
            for f in steps:
                f(b, st)
            return st

        return run


def opmux_api() -> dict[str, Callable[..., Any]]:
    """The public opmux functions of the chain; MissingPDL when one lacks ``enable_pdl``."""
    fns: dict[str, Callable[..., Any]] = {}
    missing = []
    for step, (_, public) in OPMUX_OPS.items():
        mod, attr = public.split(":")
        fn = getattr(importlib.import_module(mod), attr)
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            params = {}  # type: ignore[assignment]
        if "enable_pdl" not in params and public not in missing:
            missing.append(public)
        fns[step] = fn
    if missing:
        raise MissingPDL(
            "opmux ops without the enable_pdl keyword: "
            + ", ".join(m.replace(":", ".") for m in missing)
            + " (issue 14 point 2); this benchmark times opmux with enable_pdl=True and =False "
            "and does not run opmux without it"
        )
    return fns


def opmux_impl(layer: Layer, pdl: bool, fused: bool = False) -> Impl:
    name = "opmux fused (PDL)" if fused else "opmux (PDL)" if pdl else "opmux (no PDL)"
    what = f"opmux default backends, enable_pdl={pdl}"
    if fused:
        what += f"; silu_and_mul -> quant_fp8 as {FUSED_OP[0]}"
    imp = Impl(name, "opmux", pieces={"*": what}, fused=fused)
    if fused and not layer.quantizes:
        imp.unavailable = "the chain has no silu_and_mul -> quant_fp8 to fuse"
        return imp
    try:
        api = opmux_api()
        if fused:
            mod, attr = FUSED_OP[1].split(":")
            fn = getattr(importlib.import_module(mod), attr, None)
            if fn is None:
                imp.unavailable = f"this opmux has no {FUSED_OP[0]}"
                return imp
            if "enable_pdl" not in inspect.signature(fn).parameters:
                raise MissingPDL(f"opmux ops without the enable_pdl keyword: {FUSED_OP[1].replace(':', '.')}")
            api["silu_quant"] = fn
    except Exception as exc:
        imp.failed = _err(exc, 800)
        return imp
    Hq, Hk, D, E, k = layer.Hq, layer.Hk, layer.D, layer.experts, layer.topk
    kw = {"enable_pdl": pdl}

    def norm_step(n: str) -> StepFn:
        f = api[f"add_norm{n}"]

        def s(b: Bufs, st: State) -> None:
            x, r = b[f"x{n}"], b[f"r{n}"]
            f(x, r, b[f"w{n}"], eps=EPS, **kw)
            st[f"add_norm{n}.x"], st[f"add_norm{n}.res"] = x, r

        return s

    def s_qk(b: Bufs, st: State) -> None:
        T = st["q"].shape[0]
        api["qk_norm"](st["q"].view(T, Hq, D), st["k"].view(T, Hk, D), b["qw"], b["kw"], eps=EPS, **kw)

    def s_rope(b: Bufs, st: State) -> None:
        api["rope"](b["pos"], st["q"], st["k"], D, b["cos_sin"], is_neox=True, **kw)

    def s_kv(b: Bufs, st: State) -> None:
        T = st["k"].shape[0]
        k3, v3 = st["k"].view(T, Hk, D), st["v"].view(T, Hk, D)
        api["kv_write"](k3, v3, b["kc"], b["vc"], b["slots"], **kw)

    def s_topk(b: Bufs, st: State) -> None:
        st["topk.w"], st["topk.ids"] = api["topk_softmax"](b["logits"], k, renormalize=True, **kw)

    def s_align(b: Bufs, st: State) -> None:
        st["align"] = api["moe_align"](st["topk.ids"], ALIGN_BLOCK, E, **kw)

    def s_silu(b: Bufs, st: State) -> None:
        st["silu"] = api["silu_and_mul"](b["gate_up"], **kw)

    def s_quant(b: Bufs, st: State) -> None:
        st["quant.q"], st["quant.s"] = api["quant_fp8"](b["act"], group_size=GROUP, **kw)

    def s_silu_quant(b: Bufs, st: State) -> None:
        st["silu_quant.q"], st["silu_quant.s"] = api["silu_quant"](b["gate_up"], group_size=GROUP, **kw)

    fns: dict[str, StepFn] = {
        "add_norm1": norm_step("1"),
        "add_norm2": norm_step("2"),
        "qk_norm": s_qk,
        "rope": s_rope,
        "kv_write": s_kv,
        "topk_softmax": s_topk,
        "moe_align": s_align,
        "silu_and_mul": s_silu,
        "quant_fp8": s_quant,
        "silu_quant": s_silu_quant,
    }
    imp.steps = [(s, fns[s]) for s in layer.steps(fused)]
    return imp


def _peer(peers: list[bc.Peer | tuple[str, str]], name: str) -> bc.Peer:
    for p in peers:
        if isinstance(p, bc.Peer) and p.name == name:
            return p
    raise LookupError(f"bench_cases has no {name} peer here")


def flashinfer_impl(layer: Layer, pieces: dict[str, StepFn]) -> Impl:
    """FlashInfer's own calls (bench_cases' peer calls where it has them), else the pieces."""
    import flashinfer.norm

    imp = Impl("FlashInfer", "peer", pieces=dict(PIECES["FlashInfer"]), fi=True)
    add_norm = _peer(bc._add_norm_peers(False), "FlashInfer").fn
    rope = _peer(bc._rope_peers(), "FlashInfer").fn
    kv = _peer(bc._kv_peers(), "FlashInfer")
    silu = _peer(bc._act_peers("silu"), "FlashInfer").fn
    quant = _peer(bc._ptgq_peers(), "FlashInfer").fn
    rmsnorm = flashinfer.norm.rmsnorm
    Hq, Hk, D = layer.Hq, layer.Hk, layer.D

    def prepare(b: Bufs) -> None:  # FlashInfer's paged-append metadata: one page entry per token
        if "fi_kv" not in b and "kv_write" in layer.steps():
            T = b["slots"].shape[0]
            dummy = torch.empty(T, Hk, D, device=b["kc"].device, dtype=b["kc"].dtype)
            assert kv.prepare is not None
            b["fi_kv"] = kv.prepare((dummy, dummy, b["kc"], b["vc"], b["slots"]))[5:]

    def norm_step(n: str) -> StepFn:
        def s(b: Bufs, st: State) -> None:
            x, r = b[f"x{n}"], b[f"r{n}"]
            add_norm((x, r, b[f"w{n}"]))
            st[f"add_norm{n}.x"], st[f"add_norm{n}.res"] = x, r

        return s

    def s_qk(b: Bufs, st: State) -> None:
        T = st["q"].shape[0]
        q = rmsnorm(st["q"].view(T, Hq, D), b["qw"], EPS)  # its QK form: strided 3-D in, new tensor out
        k = rmsnorm(st["k"].view(T, Hk, D), b["kw"], EPS)
        st["q"], st["k"] = q.view(T, Hq * D), k.view(T, Hk * D)

    def s_rope(b: Bufs, st: State) -> None:
        rope((b["pos"], st["q"], st["k"], D, b["cos_sin"]))

    def s_kv(b: Bufs, st: State) -> None:
        T = st["k"].shape[0]
        kv.fn((st["k"].view(T, Hk, D), st["v"].view(T, Hk, D), b["kc"], b["vc"], b["slots"], *b["fi_kv"]))

    def s_silu(b: Bufs, st: State) -> None:
        st["silu"] = silu((b["gate_up"],))

    def s_quant(b: Bufs, st: State) -> None:
        st["quant.q"], st["quant.s"] = quant((b["act"],))

    own: dict[str, StepFn] = {
        "add_norm1": norm_step("1"),
        "add_norm2": norm_step("2"),
        "qk_norm": s_qk,
        "rope": s_rope,
        "kv_write": s_kv,
        "silu_and_mul": s_silu,
        "quant_fp8": s_quant,
    }
    imp.steps = [(s, own.get(s) or pieces[s]) for s in layer.steps()]
    imp.prepare = prepare
    return imp


def liger_impl(layer: Layer, pieces: dict[str, StepFn]) -> Impl:
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    imp = Impl("Liger", "peer", pieces=dict(PIECES["Liger"]))
    add_norm = _peer(bc._add_norm_peers(False), "Liger").fn
    silu = _peer(bc._act_peers("silu"), "Liger").fn
    Hq, Hk, D = layer.Hq, layer.Hk, layer.D

    def norm_step(n: str) -> StepFn:
        def s(b: Bufs, st: State) -> None:
            st[f"add_norm{n}.x"], st[f"add_norm{n}.res"] = add_norm((b[f"x{n}"], b[f"r{n}"], b[f"w{n}"]))

        return s

    def s_qk(b: Bufs, st: State) -> None:
        T = st["q"].shape[0]
        q = LigerRMSNormFunction.apply(st["q"].view(T, Hq, D), b["qw"], EPS)
        k = LigerRMSNormFunction.apply(st["k"].view(T, Hk, D), b["kw"], EPS)
        st["q"], st["k"] = q.reshape(T, Hq * D), k.reshape(T, Hk * D)

    def s_silu(b: Bufs, st: State) -> None:
        st["silu"] = silu((b["gate_up"],))

    own: dict[str, StepFn] = {
        "add_norm1": norm_step("1"),
        "add_norm2": norm_step("2"),
        "qk_norm": s_qk,
        "silu_and_mul": s_silu,
    }
    imp.steps = [(s, own.get(s) or pieces[s]) for s in layer.steps()]
    return imp


def torch_impl(layer: Layer, compile_: bool) -> Impl:
    name = "torch.compile" if compile_ else "torch eager"
    imp = Impl(name, "peer", pieces=dict(PIECES["torch.compile"]))
    if not compile_:
        imp.pieces = {"*": "the bf16 reference chain, eager (what torch.compile compiles; --dry-run)"}
    imp.steps = [("chain", torch_chain_step(layer, compiled(torch_chain_fn(layer), compile_)))]
    return imp


def build_impls(layer: Layer, args: argparse.Namespace) -> list[Impl]:
    """Every implementation of ``layer``'s chain; one that cannot be built is recorded, not raised."""
    # run order: opmux first, FlashInfer last (its JIT modules build in the background meanwhile)
    impls = [opmux_impl(layer, True), opmux_impl(layer, False)]
    impls += [opmux_impl(layer, True, fused=True)] if layer.quantizes else []
    if args.no_compile and not args.dry_run:
        impls.append(Impl("torch.compile", "peer", unavailable="left out (--no-compile)"))
    else:
        impls.append(torch_impl(layer, compile_=not args.dry_run))
    peer_pieces: dict[str, StepFn] | None = None
    for name, build in (("Liger", liger_impl), ("FlashInfer", flashinfer_impl)):
        if args.dry_run:
            impls.append(Impl(name, "peer", pieces=dict(PIECES[name]), unavailable="skipped in --dry-run"))
            continue
        if args.no_peers:
            impls.append(Impl(name, "peer", pieces=dict(PIECES[name]), unavailable="left out (--no-peers)"))
            continue
        try:
            if peer_pieces is None:
                peer_pieces = piece_steps(layer, compile_=not args.no_compile)
            imp = build(layer, peer_pieces)
            if args.no_compile:
                imp.pieces = {k: v.replace(TC, "torch eager piece") for k, v in imp.pieces.items()}
            impls.append(imp)
        except Exception as exc:
            why = _err(exc, 300)
            imp = Impl(name, "peer", pieces=dict(PIECES[name]))
            if isinstance(exc, ImportError):
                imp.unavailable = f"not installed ({why})"
            else:
                imp.failed = why
            impls.append(imp)
    wanted = [w.strip() for w in args.impls.split(",") if w.strip()]
    return [i for i in impls if not wanted or any(w in i.name for w in wanted)]


# --------------------------------------------------------------------------------------------
# the run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    ap.add_argument("--out", type=Path, default=None, help="folder for bench_chain.json and bench_chain.md")
    ap.add_argument("--quick", action="store_true", help=f"T in {QUICK_TOKENS}, 20 replays, shorter graphs")
    ap.add_argument("--layers", default=",".join(LAYERS), help="comma-separated: " + ", ".join(LAYERS))
    ap.add_argument("--tokens", default="", help="comma-separated T (default 1,16,128,4096)")
    ap.add_argument("--impls", default="", help="comma-separated filter on implementation names")
    ap.add_argument("--replays", type=int, default=None, help="graph replays (default 30, quick 20; >= 20)")
    ap.add_argument("--target-us", type=float, default=None, help="shortest replay aimed at (default 400)")
    ap.add_argument("--max-sets", type=int, default=16, help="most input sets cycled in one graph")
    ap.add_argument("--budget-s", type=float, default=480.0, help="stop starting new work once spent")
    ap.add_argument("--no-compile", action="store_true", help="no torch.compile (peers' pieces run eager)")
    ap.add_argument("--no-peers", action="store_true", help="leave out FlashInfer and Liger-Kernel")
    ap.add_argument("--no-op-times", action="store_true", help="skip timing each opmux op alone")
    ap.add_argument("--fi-wait-s", type=float, default=240.0, help="longest wait for a FlashInfer JIT module")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="build every chain and run it once, checked, on tiny shapes (opmux and torch only); no timing",
    )
    ap.add_argument("--render", type=Path, default=None, help="bench_chain.json to render (no run)")
    ap.add_argument("--md", type=Path, default=None, help="with --render: markdown file to write")
    args = ap.parse_args(argv)
    if args.replays is None:
        args.replays = 20 if args.quick else 30
    if args.target_us is None:
        args.target_us = 300.0 if args.quick else 400.0
    if args.render is None:
        if args.device == "cpu" and not args.dry_run:
            ap.error("timing needs CUDA: --device cpu only with --dry-run")
        if args.out is None and not args.dry_run:
            ap.error("--out is required")
        unknown = [n for n in args.layers.split(",") if n and n not in LAYERS]
        if unknown:
            ap.error(f"unknown layer(s) {unknown}; known: {', '.join(LAYERS)}")
    return args


def plan(nbytes: int, n_ops: int, l2: int, max_sets: int, target_us: float) -> tuple[int, int]:
    """(input sets, chains per graph): sets so the working set passes 3x L2 where it can, R so a
    replay lasts about ``target_us`` (estimate: 3.5 TB/s plus 2 us per kernel)."""
    sets = max(1, min(max_sets, math.ceil(3 * l2 / max(nbytes, 1)), (8 * 2**30) // max(nbytes, 1)))
    est_us = nbytes / 3.5e6 + 2.0 * n_ops
    return sets, max(1, min(2000, math.ceil(target_us / est_us)))


def run(args: argparse.Namespace) -> tuple[dict[str, Any], int]:
    dev = args.device
    deadline = bg.T0 + args.budget_s
    cuda = dev == "cuda" and not args.dry_run
    if dev == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "bench_chain.py needs a CUDA GPU (torch.cuda.is_available() is False); try --device cpu --dry-run"
        )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    tokens = tuple(int(t) for t in args.tokens.split(",") if t) or (
        DRY_TOKENS if args.dry_run else QUICK_TOKENS if args.quick else TOKENS
    )
    layers = [(TINY if args.dry_run else LAYERS)[n] for n in args.layers.split(",") if n]
    fib = bg.FlashInferBuild(None, None, args.fi_wait_s)
    fi_err = None
    if dev == "cuda":
        os.environ.update(bg.flashinfer_env(torch.cuda.get_device_capability(0)))
    if cuda and not args.no_peers:
        try:
            import flashinfer  # noqa: F401
        except Exception as exc:
            fi_err = _err(exc, 300)
        if fi_err is None and args.out is not None:
            fib = bg.start_fi_prebuild(args.out, list(FI_MODULES), args.fi_wait_s, name=FI_BUILD)
    if cuda:
        import torch._dynamo.config as dc

        for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit"):
            if hasattr(dc, knob):
                setattr(dc, knob, max(int(getattr(dc, knob)), 256))
    meta = bg.environment(torch)
    meta["args"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    meta["flashinfer_import_error"] = fi_err
    meta["dry_run"] = bool(args.dry_run)
    l2 = int(meta.get("l2_bytes") or bg.L2_BYTES_DEFAULT)
    log(
        f"bench_chain on {meta.get('device', dev)}: torch {torch.__version__}, opmux {meta.get('opmux')}, "
        f"liger {meta.get('liger_kernel')}, flashinfer {meta.get('flashinfer')}; layers "
        f"{', '.join(x.name for x in layers)}; T {', '.join(map(str, tokens))}"
        + (" (dry run, tiny shapes)" if args.dry_run else "")
    )
    result: dict[str, Any] = {"meta": meta, "layers": []}
    pdl_missing: str | None = None

    def save() -> None:
        meta["flashinfer_build"] = fib.summary()
        meta["elapsed_s"] = round(time.perf_counter() - bg.T0, 1)
        if args.out is not None:
            path = args.out / "bench_chain.json"
            tmp = path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(result, indent=1, default=str))
            tmp.replace(path)

    for layer in layers:
        t_layer = time.perf_counter()
        impls = build_impls(layer, args)
        lrec: dict[str, Any] = {
            "layer": layer.name,
            "config": layer.config(),
            "steps": layer.steps(),
            "impls": {
                i.name: {"kind": i.kind, "pieces": i.pieces, "unavailable": i.unavailable, "failed": i.failed}
                for i in impls
            },
            "cases": [],
        }
        result["layers"].append(lrec)
        for i in impls:
            if i.failed and i.kind == "opmux" and "enable_pdl" in i.failed:
                pdl_missing = i.failed
        if pdl_missing:
            log(f"ERROR: {pdl_missing}")
        log(f"{layer.name}: {' -> '.join(layer.steps())}; chains: {', '.join(i.name for i in impls)}")
        consts = make_consts(layer, args.seed, dev)
        for T in tokens:
            try:
                crec = run_case(layer, T, impls, consts, args, l2, deadline, fib)
            except BaseException as exc:  # a sticky CUDA error: keep what was measured, then stop
                lrec["cases"].append({"T": T, "error": f"aborted: {_err(exc, 400)}", "impls": {}})
                save()
                raise
            lrec["cases"].append(crec)
            save()
        log(f"{layer.name}: done in {time.perf_counter() - t_layer:.1f}s")
    if fib.proc is not None and fib.proc.poll() is None:
        fib.proc.terminate()
    meta["finished"] = True
    meta["pdl_keyword_missing"] = pdl_missing
    save()
    if args.out is not None:
        (args.out / "bench_chain.md").write_text(render(result))
        (args.out / f".{FI_BUILD}_status.jsonl").unlink(missing_ok=True)
    rc = 0
    if pdl_missing:
        log(f"FAILED: {pdl_missing}")
        rc = PDL_EXIT
    return result, rc


def run_case(
    layer: Layer,
    T: int,
    impls: list[Impl],
    consts: Bufs,
    args: argparse.Namespace,
    l2: int,
    deadline: float,
    fib: bg.FlashInferBuild,
) -> dict[str, Any]:
    dev = args.device
    timing = not args.dry_run
    steps = layer.steps()
    nbytes = sum(step_bytes(layer, T, s) for s in steps)
    crec: dict[str, Any] = {"T": T, "bytes": nbytes, "impls": {}, "ops": {}}
    if time.perf_counter() > deadline:
        crec["skipped"] = "time budget spent"
        log(f"  T={T}: skipped (time budget spent)")
        return crec
    t_case = time.perf_counter()
    try:
        nsets, R = plan(nbytes, len(steps), l2, args.max_sets, args.target_us) if timing else (1, 1)
        sets = [make_set(layer, T, args.seed * 1000 + i, dev, consts) for i in range(nsets)]
        pristine = clone_set(sets[0])
        ref = reference(layer, clone_set(pristine))
        crec.update(sets=nsets, R=R)
        log(f"  {layer.name} T={T}: {nbytes / 1e6:.2f} MB per chain, {nsets} input sets, R={R}")
    except Exception as exc:
        crec["error"] = f"inputs/reference: {_err(exc, 400)}"
        log(f"  T={T}: ERROR {crec['error']}")
        return crec
    ready: dict[str, Callable[[Bufs], State]] = {}
    fused_names = {i.name for i in impls if i.fused}
    for imp in impls:
        ir: dict[str, Any] = {"kind": imp.kind}
        crec["impls"][imp.name] = ir
        if imp.unavailable:
            ir.update(status="unavailable", why=imp.unavailable)
            continue
        if imp.failed:
            ir.update(status="failed", error=imp.failed)
            continue
        if time.perf_counter() > deadline:
            ir.update(status="skipped", why="time budget spent")
            continue
        t_impl = time.perf_counter()
        try:
            if imp.fi:
                why = fib.wait("norm", deadline)
                for m in FI_MODULES[1:]:
                    why = why or fib.wait(m, deadline)
                if why:
                    ir.update(status="failed", error=why)
                    continue
            if imp.prepare is not None:  # its own per-set arguments, beside the shared tensors
                for b in sets:
                    imp.prepare(b)
            chain = imp.chain(layer)
            probe = clone_set(pristine)
            if imp.prepare is not None:
                imp.prepare(probe)
            st = chain(probe)
            if dev == "cuda":
                torch.cuda.synchronize()
            ok, err, detail = check(layer, probe, st, ref)
            ir.update(rel_err=err if math.isfinite(err) else None, check=detail)
            if imp.kind == "opmux" and imp.name == "opmux (PDL)" and "backends" not in crec:
                crec["backends"] = opmux_backends(layer, pristine)
            del probe, st
            ir["status"] = "ok" if ok else "wrong"
            if ok and timing:
                ready[imp.name] = chain
        except Exception as exc:
            ir.update(status="failed", error=_err(exc))
            _sync_after_failure(dev, ir)
        ir["s"] = round(time.perf_counter() - t_impl, 1)
    if ready and time.perf_counter() > deadline:
        for name in ready:
            crec["impls"][name].update(status="skipped", why="time budget spent (checked, not timed)")
        ready = {}
    if ready:
        t_time = time.perf_counter()
        try:
            timed = bg.time_impls(torch, ready, sets, R, args.replays)
        except Exception as exc:
            timed = {name: {"error": _err(exc)} for name in ready}
            _sync_after_failure(dev, crec["impls"][next(iter(ready))])
        for name, t in timed.items():
            ir = crec["impls"][name]
            if "error" in t:  # the timer keeps the error per column: a sticky one still ends the run
                ir.update(status="failed", error=t["error"])
                _sync_after_failure(dev, ir)
                continue
            ir.update(t)
            imp_bytes = sum(step_bytes(layer, T, s) for s in layer.steps(name in fused_names))
            ir["GBps"] = imp_bytes / (ir["us"] * 1e-6) / 1e9
        crec["timing_s"] = round(time.perf_counter() - t_time, 1)
    for imp in impls:
        ir = crec["impls"][imp.name]
        if "us" in ir:
            what = f"{ir['us']:.2f} us/chain ({ir.get('method')}, R={ir.get('R')})"
        elif ir["status"] == "ok":
            what = f"checked (worst rel. L2 {ir.get('rel_err') or 0:.1e})"
        else:
            what = str(ir.get("error") or ir.get("check") or ir.get("why", ""))[:300]
        log(f"    {layer.name} T={T} {imp.name}: {ir['status']} {what}  [{ir.get('s', 0)}s]")
    if timing and not args.no_op_times:
        # the op columns pair the chains' steps: the unfused chains only (the fused chain has no
        # per-op row and no sum of ops)
        mine = [
            i
            for i in impls
            if i.kind == "opmux" and not i.fused and crec["impls"][i.name].get("status") == "ok"
        ]
        if mine:
            crec["ops"].update(time_ops(layer, T, mine, sets, args, l2, deadline))
    summarize(crec)
    del sets
    if dev == "cuda":
        torch.cuda.empty_cache()
    log(f"  {layer.name} T={T}: {case_line(crec)}  [{time.perf_counter() - t_case:.1f}s]")
    return crec


def time_ops(
    layer: Layer,
    T: int,
    imps: list[Impl],
    sets: list[Bufs],
    args: argparse.Namespace,
    l2: int,
    deadline: float,
) -> dict[str, dict[str, Any]]:
    """Each op of the opmux chains alone, the same graph setup (its own R); an op's columns (PDL on
    and off) timed together, their replays interleaved (``bench_gpu.time_impls``)."""
    out: dict[str, dict[str, Any]] = {i.name: {} for i in imps}
    for k, (name, _) in enumerate(imps[0].steps):
        if time.perf_counter() > deadline:
            for i in imps:
                out[i.name][name] = {"status": "skipped", "why": "time budget spent"}
            continue

        def one_of(f: StepFn) -> Callable[[Bufs], State]:
            def one(b: Bufs) -> State:
                st = init_state(layer, b)
                f(b, st)
                return st

            return one

        fns = {i.name: one_of(i.steps[k][1]) for i in imps}
        try:
            _, R = plan(step_bytes(layer, T, name), 1, l2, args.max_sets, args.target_us)
            timed = bg.time_impls(torch, fns, sets, R, args.replays)
        except Exception as exc:
            timed = {n: {"error": _err(exc, 300)} for n in fns}
        for n, t in timed.items():
            out[n][name] = {"status": "failed", **t} if "error" in t else {**t, "status": "ok"}
            if "error" in t:  # a sticky CUDA error ends the run
                _sync_after_failure(args.device, out[n][name])
    return out


def _sync_after_failure(dev: str, ir: dict[str, Any]) -> None:
    """After a column failed: a sticky CUDA error ends the run (nothing later can run; the
    caller records the case as aborted with it), any other leaves the next columns to run."""
    if dev != "cuda":
        return
    try:
        torch.cuda.synchronize()
    except Exception as exc2:
        ir["error"] = f"{ir.get('error', '')} | then: {_err(exc2, 200)}"
        raise


def opmux_backends(layer: Layer, b: Bufs) -> dict[str, str]:
    """The backend opmux's default picks for each op of the chain (``explain``), on a copy."""
    from opmux.kernels import explain

    b = clone_set(b)
    st = init_state(layer, b)
    T = b["x1"].shape[0]
    q3, k3 = st["q"].view(T, layer.Hq, layer.D), st["k"].view(T, layer.Hk, layer.D)
    calls: dict[str, tuple[Any, ...]] = {
        "add_norm1": (b["x1"], b["r1"], b["w1"], EPS),
        "rope": (b["pos"], st["q"], st["k"], layer.D, b["cos_sin"], True),
        "kv_write": (k3, st["v"].view(T, layer.Hk, layer.D), b["kc"], b["vc"], b["slots"]),
        "silu_and_mul": (b["gate_up"],),
        "quant_fp8": (b["act"], GROUP),
    }
    mod, attr = FUSED_OP[1].split(":")
    if hasattr(importlib.import_module(mod), attr):  # an opmux without the fused op: no entry
        calls["silu_quant"] = (b["gate_up"], GROUP)
    if layer.qk_norm:
        calls["qk_norm"] = (q3, k3, b["qw"], b["kw"], EPS)
    if layer.moe:
        calls["topk_softmax"] = (b["logits"], layer.topk, True)
        calls["moe_align"] = (b["ids0"], ALIGN_BLOCK, layer.experts)
    out: dict[str, str] = {}
    wanted = set(layer.steps()) | ({"silu_quant"} if layer.quantizes else set())
    for step, a in calls.items():
        if step not in wanted:
            continue
        try:
            out[step] = str(explain(FUSED_OP[0] if step == "silu_quant" else OPMUX_OPS[step][0], *a).chosen)
        except Exception as exc:
            out[step] = f"? ({_err(exc, 120)})"
    return out


def summarize(crec: dict[str, Any]) -> None:
    ok = {n: r["us"] for n, r in crec["impls"].items() if r.get("status") == "ok" and "us" in r}
    peers = {n: us for n, us in ok.items() if crec["impls"][n]["kind"] == "peer"}
    if peers:
        crec["best_peer"] = min(peers, key=lambda n: peers[n])
        crec["best_peer_us"] = peers[crec["best_peer"]]
    on, off, fused = ok.get("opmux (PDL)"), ok.get("opmux (no PDL)"), ok.get("opmux fused (PDL)")
    if on is not None and peers:
        crec["ratio_pdl_best_peer"] = on / crec["best_peer_us"]
    if fused is not None and peers:
        crec["ratio_fused_best_peer"] = fused / crec["best_peer_us"]
    if on is not None and off is not None:
        crec["ratio_pdl_on_off"] = on / off
    for name, ops in crec.get("ops", {}).items():
        if ops and all(o.get("status") == "ok" for o in ops.values()):
            crec.setdefault("sum_ops_us", {})[name] = sum(o["us"] for o in ops.values())


def case_line(crec: dict[str, Any]) -> str:
    parts = []
    for n, r in crec["impls"].items():
        st = r.get("status")
        if st == "ok":
            parts.append(
                f"{n} {r['us']:.2f}" + ("*" if r.get("method") == "events" else "")
                if "us" in r
                else f"{n} ok"
            )
        elif st in ("wrong", "failed"):
            parts.append(f"{n} {st.upper()}")
    tail = ""
    if "ratio_pdl_best_peer" in crec:
        tail += f" | PDL / {crec['best_peer']} = {crec['ratio_pdl_best_peer']:.3f}"
    if "ratio_fused_best_peer" in crec:
        tail += f" | fused / {crec['best_peer']} = {crec['ratio_fused_best_peer']:.3f}"
    if "ratio_pdl_on_off" in crec:
        tail += f" | PDL on/off = {crec['ratio_pdl_on_off']:.3f}"
    for n, s in crec.get("sum_ops_us", {}).items():
        tail += f" | sum of ops {n} {s:.2f}"
    return "; ".join(parts) + tail


# --------------------------------------------------------------------------------------------
# rendering

IMPL_ORDER = (
    "opmux (PDL)",
    "opmux (no PDL)",
    "opmux fused (PDL)",
    "FlashInfer",
    "Liger",
    "torch.compile",
    "torch eager",
)


def _cell(r: dict[str, Any] | None) -> str:
    if not r:
        return "-"
    st = r.get("status")
    if st == "ok" and "us" in r:
        return f"{r['us']:.2f}" + ("*" if r.get("method") == "events" else "")
    return {"ok": "ok", "wrong": "wrong", "failed": "fail", "unavailable": "n/a", "skipped": "skip"}.get(
        str(st), str(st)
    )


def render(result: dict[str, Any]) -> str:
    meta = result.get("meta", {})
    args = meta.get("args", {})
    lines = [
        "# Decoder-layer chains on one GPU: opmux (PDL on / off) vs FlashInfer, Liger-Kernel, torch.compile",
        "",
        "Generated by `benchmarks/bench_chain.py` (`--render`); do not edit by hand.",
        "",
        f"Device: {meta.get('device', '?')} (sm {meta.get('capability', '?')}), torch {meta.get('torch', '?')}, "
        f"triton {meta.get('triton', '?')}, opmux {meta.get('opmux', '?')}, Liger-Kernel {meta.get('liger_kernel', '?')}, "
        f"FlashInfer {meta.get('flashinfer', '?')}; {meta.get('date', '?')}.",
        "",
        "The memory-bound ops of one decoder layer in order, bf16, captured in one CUDA graph (the GEMMs "
        "left out: every op reads its own pre-made random buffer; rope -> KV write share the qkv buffer, "
        "align reads topk's ids). Each chain was checked against a float32 reference first (`wrong`: "
        "failed it, not timed). Timing: R chains per graph cycling over up to "
        f"{args.get('max_sets', '?')} input sets, replay >= {args.get('target_us', '?')} us; median of "
        f"{args.get('replays', '?')} replays, a case's chains interleaved (each round replays every "
        "chain's graph once, in a rotated order); **us per chain**. *PDL / best peer* = opmux (PDL) over the "
        "fastest peer chain (below 1: opmux faster); *fused / best peer* the same for opmux fused (PDL), "
        "whose chain runs silu_and_mul -> quant_fp8 as one op (the activation never written: fewer "
        "bytes and one launch less, as an engine calling that op; the peers have no such op, so their "
        "chains keep the two steps); *PDL on/off* = opmux (PDL) over opmux (no PDL); "
        "*sum of ops* = each opmux op timed alone in the same setup, summed (PDL off / on). "
        "FlashInfer runs at its defaults (PDL on sm_90+ wherever its API has the switch). "
        "`n/a`: not available, `fail`: raised (see bench_chain.json), `*`: event timing (capture failed).",
        "",
    ]
    if meta.get("dry_run"):
        lines += ["**Dry run (CPU, tiny shapes): checks only, no timing.**", ""]
    if not meta.get("finished", False):
        lines += ["**This run did not finish; the tables hold what it measured.**", ""]
    if meta.get("pdl_keyword_missing"):
        lines += [f"**opmux not run: {meta['pdl_keyword_missing']}**", ""]
    for lrec in result.get("layers", []):
        cfg = lrec.get("config", {})
        names = [n for n in IMPL_ORDER if n in lrec.get("impls", {})]
        names += [n for n in lrec.get("impls", {}) if n not in names]
        desc = f"H {cfg.get('H')}, "
        if "rope" in lrec.get("steps", ["rope"]):
            desc += f"{cfg.get('Hq')} q / {cfg.get('Hk')} kv heads x {cfg.get('D')}, "
        desc += f"{'expert ' if cfg.get('experts') else ''}intermediate {cfg.get('inter')}"
        if cfg.get("experts"):
            desc += f", {cfg['experts']} experts top-{cfg.get('topk')}"
        lines += [f"## {lrec['layer']}", "", f"{desc}: {' -> '.join(lrec.get('steps', []))}", ""]
        has_fused = any("ratio_fused_best_peer" in c for c in lrec.get("cases", []))
        head = ["T", *names, "sum of ops (PDL off / on)", "PDL / best peer"]
        head += ["fused / best peer"] * has_fused + ["PDL on/off"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
        for c in lrec.get("cases", []):
            if "skipped" in c or "error" in c:
                lines.append(f"| {c['T']} | " + c.get("skipped", c.get("error", "")) + " |" * (len(head) - 1))
                continue
            sums = c.get("sum_ops_us", {})
            s_off, s_on = sums.get("opmux (no PDL)"), sums.get("opmux (PDL)")
            sum_cell = " / ".join("-" if v is None else f"{v:.2f}" for v in (s_off, s_on))
            ratio = c.get("ratio_pdl_best_peer")
            ratio_cell = f"{ratio:.3f} ({c.get('best_peer')})" if ratio is not None else "-"
            onoff = c.get("ratio_pdl_on_off")
            row = [str(c["T"]), *(_cell(c["impls"].get(n)) for n in names), sum_cell, ratio_cell]
            if has_fused:
                fr = c.get("ratio_fused_best_peer")
                row.append(f"{fr:.3f} ({c.get('best_peer')})" if fr is not None else "-")
            row.append(f"{onoff:.3f}" if onoff is not None else "-")
            lines.append("| " + " | ".join(row) + " |")
        steps = lrec.get("steps", [])
        whole = [n for n in names if "*" in lrec["impls"][n].get("pieces", {})]
        per_op = [n for n in names if n not in whole]
        lines.append("")
        lines += [f"- {n}: {lrec['impls'][n]['pieces']['*']}" for n in whole]
        if per_op:
            lines += ["", "What the peer chains run per op:", ""]
            lines += ["| op | " + " | ".join(per_op) + " |", "|---|" + "---|" * len(per_op)]
            for s in steps:
                cells = [lrec["impls"][n].get("pieces", {}).get(s, "?") for n in per_op]
                lines.append(f"| {s} | " + " | ".join(cells) + " |")
        backends = next((c["backends"] for c in lrec.get("cases", []) if c.get("backends")), None)
        if backends:
            lines += ["", "opmux default backends: " + ", ".join(f"{k} {v}" for k, v in backends.items())]
        op_rows = [c for c in lrec.get("cases", []) if c.get("ops")]
        if op_rows:
            lines += ["", "opmux ops alone (us per call, PDL off / on):", ""]
            lines += ["| T | " + " | ".join(steps) + " |", "|---:|" + "---:|" * len(steps)]
            for c in op_rows:
                cells = []
                for s in steps:
                    vals = [c["ops"].get(n, {}).get(s, {}) for n in ("opmux (no PDL)", "opmux (PDL)")]
                    cells.append(" / ".join(_cell(v) for v in vals))
                lines.append(f"| {c['T']} | " + " | ".join(cells) + " |")
        notes = []
        for c in lrec.get("cases", []):
            for n, r in c.get("impls", {}).items():
                if r.get("status") in ("failed", "wrong"):
                    notes.append(f"- T={c['T']} {n}: {r['status']}: {r.get('error') or r.get('check')}")
        for n, info in lrec.get("impls", {}).items():
            if info.get("unavailable"):
                notes.append(f"- {n}: n/a: {info['unavailable']}")
        if notes:
            lines += ["", *sorted(set(notes), key=notes.index)]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render is not None:
        md = render(json.loads(args.render.read_text()))
        if args.md is not None:
            args.md.write_text(md)
            print(f"wrote {args.md}")
        else:
            print(md)
        return 0
    try:
        _, rc = run(args)
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        return 1
    log("done" if rc == 0 else f"done (exit {rc})")
    return rc


if __name__ == "__main__":
    sys.exit(main())
