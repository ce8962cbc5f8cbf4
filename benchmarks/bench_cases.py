"""Op cases of the GPU benchmark (benchmarks/bench_gpu.py): inputs, bytes, references, peers.

Each ``OpCase`` says, for one opmux op: its shapes, how to make one input set, how many bytes
one call must move (each input read once, each output written once), a float32 reference, how to
call opmux (``backend=`` forced), the plain eager PyTorch version (as users write it, in the input
dtype; it is also what ``torch.compile`` compiles) and the peer libraries' calls. Imports of opmux,
Liger-Kernel and FlashInfer happen lazily, inside the functions, so this module imports with torch
alone (and the CPU-side tests can exercise it).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

DT = torch.bfloat16
EPS = 1e-6
FP8 = getattr(torch, "float8_e4m3fn", None)
FP8_MAX = 448.0
DECODE_T = (1, 16, 128)
PREFILL_T = (4096, 16384, 32768)
ALL_T = DECODE_T + PREFILL_T

Args = tuple[Any, ...]
Outputs = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class Shape:
    T: int
    dims: tuple[tuple[str, int], ...] = ()

    def get(self, key: str) -> int:
        return dict(self.dims)[key]

    @property
    def label(self) -> str:
        return ", ".join([f"T={self.T}"] + [f"{k}={v}" for k, v in self.dims])

    def as_dict(self) -> dict[str, int]:
        return {"T": self.T, **dict(self.dims)}


@dataclass
class Peer:
    """One non-opmux implementation. ``fn(args) -> return value``; ``prepare`` may turn an input
    set into the peer's own argument layout once, before timing (e.g. split gate/up)."""

    name: str
    fn: Callable[[Args], Any]
    outputs: Callable[[Args, Any], Outputs]
    prepare: Callable[[Args], Args] | None = None
    # FlashInfer JIT module the call needs (waited for while the background build runs)
    fi_module: str | None = None


@dataclass
class OpCase:
    op: str  # opmux registry name, e.g. "layernorm.rmsnorm"
    family: str  # plot panel / table group
    public: str  # "module:function" of the opmux public API
    shapes: Sequence[Shape]
    quick: Sequence[Shape]
    make: Callable[[Shape, torch.Generator, str], Args]
    nbytes: Callable[[Shape], int]
    reference: Callable[[Args], Outputs]  # float32
    callargs: Callable[
        [Args], tuple[tuple[Any, ...], dict[str, Any]]
    ]  # input set -> (positional, keyword) of the opmux call
    outputs: Callable[[Args, Any], Outputs]  # ret (+ mutated args) -> outputs, in reference order
    eager: Callable[..., Any]  # plain torch, positional tensors of args
    eager_outputs: Callable[[Args, Any], Outputs]
    peers: Callable[[], list[Peer | tuple[str, str]]] = lambda: []  # tuple = (name, why unavailable)
    #: per output: "float" (rel. L2 against the reference), "fp8" (as float), "exact", "topk"
    kinds: tuple[str, ...] = ("float",)
    mutates: tuple[int, ...] = ()  # indices of args an implementation may write (cloned for checks)
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def opmux_fn(self) -> Callable[..., Any]:
        mod, attr = self.public.split(":")
        return getattr(importlib.import_module(mod), attr)  # type: ignore[no-any-return]


# --------------------------------------------------------------------------------------------
# helpers


def _randn(
    shape: Sequence[int], g: torch.Generator, device: str, dtype: torch.dtype = DT, scale: float = 1.0
) -> torch.Tensor:
    t = torch.randn(*shape, generator=g, device=device, dtype=torch.float32)
    if scale != 1.0:
        t.mul_(scale)
    return t.to(dtype)


def _gen(device: str, seed: int) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def _import(mod: str) -> Any:
    return importlib.import_module(mod)


def _liger(modname: str, attr: str) -> Any:
    return getattr(_import(f"liger_kernel.ops.{modname}"), attr)


def _fi(modname: str, attr: str) -> Any:
    return getattr(_import(f"flashinfer.{modname}"), attr)


def _first(ret: Any) -> torch.Tensor:
    return ret[0] if isinstance(ret, (tuple, list)) else ret


def _ret_or(args_idx: tuple[int, ...]) -> Callable[[Args, Any], Outputs]:
    """Outputs of an op that either returns them or writes ``args[i]`` in place."""

    def out(args: Args, ret: Any) -> Outputs:
        if (
            isinstance(ret, (tuple, list))
            and len(ret) >= len(args_idx)
            and all(isinstance(r, torch.Tensor) for r in ret[: len(args_idx)])
        ):
            return tuple(ret[: len(args_idx)])
        if isinstance(ret, torch.Tensor) and len(args_idx) == 1:
            return (ret,)
        return tuple(args[i] for i in args_idx)

    return out


def _ret(args: Args, ret: Any) -> Outputs:
    return tuple(ret) if isinstance(ret, (tuple, list)) else (ret,)


def rms_ref(x: torch.Tensor, w: torch.Tensor, eps: float = EPS, offset: float = 0.0) -> torch.Tensor:
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (w.float() + offset)


# --------------------------------------------------------------------------------------------
# layernorm


def _norm_shapes(hs: Sequence[int], ts: Sequence[int] = ALL_T) -> list[Shape]:
    return [Shape(t, (("H", h),)) for h in hs for t in ts]


def _make_norm(s: Shape, g: torch.Generator, dev: str) -> Args:
    H = s.get("H")
    return (_randn((s.T, H), g, dev), _randn((H,), g, dev, scale=0.5) + 1.0)


def _make_add_norm(s: Shape, g: torch.Generator, dev: str) -> Args:
    H = s.get("H")
    return (_randn((s.T, H), g, dev), _randn((s.T, H), g, dev), _randn((H,), g, dev, scale=0.5) + 1.0)


def eager_rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def eager_gemma_rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * (1.0 + w)


def eager_fused_add_rmsnorm(
    x: torch.Tensor, r: torch.Tensor, w: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    r = x + r
    return r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + EPS) * w, r


def eager_gemma_fused_add_rmsnorm(
    x: torch.Tensor, r: torch.Tensor, w: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    r = x + r
    return r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + EPS) * (1.0 + w), r


def _norm_peers(gemma: bool) -> list[Peer | tuple[str, str]]:
    off, cast = (1.0, "gemma") if gemma else (0.0, "llama")
    fi_name = "gemma_rmsnorm" if gemma else "rmsnorm"
    return [
        Peer(
            "Liger",
            lambda a: _liger("rms_norm", "LigerRMSNormFunction").apply(a[0], a[1], EPS, off, cast),
            _ret,
        ),
        Peer("FlashInfer", lambda a: _fi("norm", fi_name)(a[0], a[1], EPS), _ret, fi_module="norm"),
    ]


def _add_norm_peers(gemma: bool) -> list[Peer | tuple[str, str]]:
    off, cast = (1.0, "gemma") if gemma else (0.0, "llama")
    fi_name = "gemma_fused_add_rmsnorm" if gemma else "fused_add_rmsnorm"
    return [
        Peer(
            "Liger",
            lambda a: _liger("fused_add_rms_norm", "LigerFusedAddRMSNormFunction").apply(
                a[0], a[1], a[2], EPS, off, cast
            ),
            _ret,
        ),
        Peer(
            "FlashInfer",
            lambda a: _fi("norm", fi_name)(a[0], a[1], a[2], EPS),
            lambda a, r: (a[0], a[1]),
            fi_module="norm",
        ),
    ]


def _norm_bytes(s: Shape) -> int:
    return 2 * s.T * s.get("H") * 2 + s.get("H") * 2


def _add_norm_bytes(s: Shape) -> int:
    return 4 * s.T * s.get("H") * 2 + s.get("H") * 2


def _add_ref(offset: float) -> Callable[[Args], Outputs]:
    def ref(a: Args) -> Outputs:
        r = a[0].float() + a[1].float()
        return rms_ref(r, a[2], EPS, offset), r

    return ref


def _qk_shapes(ts: Sequence[int] = ALL_T) -> list[Shape]:
    return [Shape(t, (("Hq", 32), ("Hk", 8), ("D", 128))) for t in ts]


def _make_qk(s: Shape, g: torch.Generator, dev: str) -> Args:
    T, Hq, Hk, D = s.T, s.get("Hq"), s.get("Hk"), s.get("D")
    return (
        _randn((T, Hq, D), g, dev),
        _randn((T, Hk, D), g, dev),
        _randn((D,), g, dev, scale=0.5) + 1.0,
        _randn((D,), g, dev, scale=0.5) + 1.0,
    )


def eager_qk_norm(
    q: torch.Tensor, k: torch.Tensor, qw: torch.Tensor, kw: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + EPS) * qw,
        k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + EPS) * kw,
    )


def _qk_peers() -> list[Peer | tuple[str, str]]:
    def liger(a: Args) -> tuple[torch.Tensor, torch.Tensor]:
        f = _liger("rms_norm", "LigerRMSNormFunction").apply
        q, k = a[0], a[1]
        return f(q.view(-1, q.shape[-1]), a[2], EPS).view(q.shape), f(
            k.view(-1, k.shape[-1]), a[3], EPS
        ).view(k.shape)

    def fi(a: Args) -> tuple[torch.Tensor, torch.Tensor]:
        f = _fi("norm", "rmsnorm")
        return f(a[0], a[2], EPS), f(a[1], a[3], EPS)

    return [Peer("Liger", liger, _ret), Peer("FlashInfer", fi, _ret, fi_module="norm")]


# --------------------------------------------------------------------------------------------
# activation

INTER = 14336


def _act_shapes(ts: Sequence[int] = ALL_T) -> list[Shape]:
    return [Shape(t, (("I", INTER),)) for t in ts]


def _make_act(s: Shape, g: torch.Generator, dev: str) -> Args:
    return (_randn((s.T, 2 * s.get("I")), g, dev),)


def _act_bytes(s: Shape) -> int:
    return 3 * s.T * s.get("I") * 2


def eager_silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def eager_gelu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d]) * x[..., d:]


def eager_gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d], approximate="tanh") * x[..., d:]


def _act_ref(kind: str) -> Callable[[Args], Outputs]:
    def ref(a: Args) -> Outputs:
        x = a[0].float()
        d = x.shape[-1] // 2
        if kind == "silu":
            y = F.silu(x[..., :d])
        elif kind == "gelu":
            y = F.gelu(x[..., :d])
        else:
            y = F.gelu(x[..., :d], approximate="tanh")
        return (y * x[..., d:],)

    return ref


def _split(a: Args) -> Args:
    x = a[0]
    d = x.shape[-1] // 2
    return (x[..., :d].contiguous(), x[..., d:].contiguous())


def _act_peers(kind: str) -> list[Peer | tuple[str, str]]:
    fi = Peer(
        "FlashInfer", lambda a: _fi("activation", f"{kind}_and_mul")(a[0]), _ret, fi_module=f"{kind}_and_mul"
    )
    if kind == "silu":

        def liger_silu(a: Args) -> torch.Tensor:
            mod = _import("liger_kernel.ops.swiglu")
            fused = getattr(mod, "LigerFusedGateUpSiLUMulFunction", None)
            if fused is not None:  # one [T, 2I] tensor, no split copies
                return fused.apply(a[0])  # type: ignore[no-any-return]
            d = a[0].shape[-1] // 2
            return mod.LigerSiLUMulFunction.apply(a[0][..., :d], a[0][..., d:])  # type: ignore[no-any-return]

        return [Peer("Liger", liger_silu, _ret), fi]
    if kind == "gelu_tanh":
        # Liger's GeGLU takes separate gate and up tensors (its MLP computes them separately)
        return [
            Peer(
                "Liger",
                lambda a: _liger("geglu", "LigerGELUMulFunction").apply(a[0], a[1]),
                _ret,
                prepare=_split,
            ),
            fi,
        ]
    return [("Liger", "no exact-erf GELU-and-mul op in Liger-Kernel"), fi]


# --------------------------------------------------------------------------------------------
# rope

MAX_POS = 32768


def _rope_shapes(ts: Sequence[int] = ALL_T) -> list[Shape]:
    return [Shape(t, (("Hq", 32), ("Hk", 8), ("D", 128))) for t in ts]


def _make_rope(s: Shape, g: torch.Generator, dev: str) -> Args:
    T, Hq, Hk, D = s.T, s.get("Hq"), s.get("Hk"), s.get("D")
    pos = torch.randint(0, MAX_POS, (T,), generator=g, device=dev, dtype=torch.int64)
    inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, device=dev, dtype=torch.float32) / D))
    freqs = torch.arange(MAX_POS, device=dev, dtype=torch.float32)[:, None] * inv[None, :]
    cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1)  # [max_pos, D] float32 (cos | sin)
    return (pos, _randn((T, Hq * D), g, dev), _randn((T, Hk * D), g, dev), D, cache)


def _rope_bytes(s: Shape) -> int:
    T, Hq, Hk, D = s.T, s.get("Hq"), s.get("Hk"), s.get("D")
    return 2 * T * (Hq + Hk) * D * 2 + T * 8 + min(T, MAX_POS) * D * 4


def _rope_apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, D: int) -> torch.Tensor:
    shape = x.shape
    x = x.view(shape[0], -1, D)
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    c, s_ = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s_, x2 * c + x1 * s_], dim=-1).reshape(shape)


def eager_rope(
    pos: torch.Tensor, q: torch.Tensor, k: torch.Tensor, D: int, cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cache.index_select(0, pos).to(q.dtype).chunk(2, dim=-1)
    return _rope_apply(q, cos, sin, D), _rope_apply(k, cos, sin, D)


def _rope_ref(a: Args) -> Outputs:
    pos, q, k, D, cache = a
    cos, sin = cache.index_select(0, pos).float().chunk(2, dim=-1)
    return _rope_apply(q.float(), cos, sin, D), _rope_apply(k.float(), cos, sin, D)


def _rope_peers() -> list[Peer | tuple[str, str]]:
    return [
        (
            "Liger",
            "Liger's RoPE takes HF-layout cos/sin per position ([B, H, T, D]); no positions + cos_sin_cache API",
        ),
        Peer(
            "FlashInfer",
            lambda a: _fi("rope", "apply_rope_with_cos_sin_cache_inplace")(
                a[0], a[1], a[2], a[3], a[4], True
            ),
            lambda a, r: (a[1], a[2]),
            fi_module="rope",
        ),
    ]


# --------------------------------------------------------------------------------------------
# fp8 quantization

QH = 4096
GROUP = 128


def _quant_shapes(ts: Sequence[int] = ALL_T) -> list[Shape]:
    return [Shape(t, (("H", QH),)) for t in ts]


def _make_quant(s: Shape, g: torch.Generator, dev: str) -> Args:
    return (_randn((s.T, s.get("H")), g, dev),)


def _ptq_bytes(s: Shape) -> int:
    return s.T * s.get("H") * (2 + 1) + s.T * 4


def _ptgq_bytes(s: Shape) -> int:
    return s.T * s.get("H") * (2 + 1) + s.T * (s.get("H") // GROUP) * 4


def eager_per_token_quant_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    amax = x.abs().amax(dim=-1, keepdim=True).float()
    scale = (amax / FP8_MAX).clamp(min=1.0 / (FP8_MAX * 512.0))
    q = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def eager_per_token_group_quant_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    T, H = x.shape
    xg = x.view(T, H // GROUP, GROUP).float()
    scale = xg.abs().amax(dim=-1, keepdim=True).clamp(min=1e-10) / FP8_MAX
    q = (xg / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(T, H)
    return q, scale.view(T, H // GROUP)


def _ptq_ref(a: Args) -> Outputs:
    q, s = eager_per_token_quant_fp8(a[0].float())
    return q, s


def _ptgq_ref(a: Args) -> Outputs:
    q, s = eager_per_token_group_quant_fp8(a[0].float())
    return q, s


def _ptgq_peers() -> list[Peer | tuple[str, str]]:
    return [
        ("Liger", "no fp8 quantization op in Liger-Kernel"),
        Peer(
            "FlashInfer",
            lambda a: _fi("quantization", "per_token_group_quant_8bit")(
                a[0], GROUP, eps=1e-10, backend="cuda"
            ),
            _ret,
            fi_module="quantization",
        ),
    ]


def _silu_quant_bytes(s: Shape) -> int:
    return s.T * s.get("I") * (2 * 2 + 1) + s.T * (s.get("I") // GROUP) * 4


def eager_silu_and_mul_quant_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What an engine runs without the fused op: silu_and_mul in x's dtype, then the group quant."""
    return eager_per_token_group_quant_fp8(eager_silu_and_mul(x))


def _silu_quant_ref(a: Args) -> Outputs:
    x = a[0].float()
    d = x.shape[-1] // 2
    q, s = eager_per_token_group_quant_fp8(F.silu(x[..., :d]) * x[..., d:])
    return q, s


def _silu_quant_peers() -> list[Peer | tuple[str, str]]:
    def fi(a: Args) -> Any:
        act = _fi("activation", "silu_and_mul")(a[0])
        return _fi("quantization", "per_token_group_quant_8bit")(act, GROUP, eps=1e-10, backend="cuda")

    return [
        ("Liger", "no fp8 quantization op in Liger-Kernel"),
        Peer("FlashInfer", fi, _ret, fi_module="quantization"),
    ]


# --------------------------------------------------------------------------------------------
# moe.topk_softmax


def _topk_shapes(ts: Sequence[int] = (1, 128, 4096, 32768)) -> list[Shape]:
    return [Shape(t, (("E", e), ("k", 8))) for e in (64, 256) for t in ts]


def _make_topk(s: Shape, g: torch.Generator, dev: str) -> Args:
    return (_randn((s.T, s.get("E")), g, dev, dtype=torch.float32), s.get("k"))


def _topk_bytes(s: Shape) -> int:
    return s.T * s.get("E") * 4 + s.T * s.get("k") * (4 + 4)


def eager_topk_softmax(g: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    w, i = torch.softmax(g, dim=-1, dtype=torch.float32).topk(k, dim=-1)
    return w, i


def _topk_ref(a: Args) -> Outputs:
    p = torch.softmax(a[0].float(), dim=-1)
    w, i = p.topk(a[1], dim=-1)
    return w, i, p


def _topk_outputs(a: Args, ret: Any) -> Outputs:
    ts = [r for r in (ret if isinstance(ret, (tuple, list)) else (ret,)) if isinstance(r, torch.Tensor)]
    w = next(t for t in ts if t.is_floating_point())
    i = next(t for t in ts if not t.is_floating_point())
    return w, i


# --------------------------------------------------------------------------------------------
# kvcache.reshape_and_cache (flash layout: [num_blocks, block_size, kv_heads, head_dim])

BLOCK = 16


def _kv_shapes(ts: Sequence[int] = ALL_T) -> list[Shape]:
    return [Shape(t, (("Hk", 8), ("D", 128), ("block", BLOCK))) for t in ts]


def _make_kv(s: Shape, g: torch.Generator, dev: str) -> Args:
    T, Hk, D, B = s.T, s.get("Hk"), s.get("D"), s.get("block")
    nblocks = max(4, math.ceil(2 * T / B))
    slots = torch.randperm(nblocks * B, generator=g, device=dev)[:T].to(torch.int64)
    kc = torch.zeros(nblocks, B, Hk, D, device=dev, dtype=DT)
    vc = torch.zeros(nblocks, B, Hk, D, device=dev, dtype=DT)
    return (_randn((T, Hk, D), g, dev), _randn((T, Hk, D), g, dev), kc, vc, slots)


def _kv_bytes(s: Shape) -> int:
    T, Hk, D = s.T, s.get("Hk"), s.get("D")
    return 4 * T * Hk * D * 2 + T * 8


def eager_reshape_and_cache(
    k: torch.Tensor, v: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slots: torch.Tensor
) -> None:
    kc.view(-1, k.shape[1], k.shape[2])[slots] = k
    vc.view(-1, v.shape[1], v.shape[2])[slots] = v


def _kv_ref(a: Args) -> Outputs:
    return a[0].float(), a[1].float()


def _kv_outputs(a: Args, ret: Any) -> Outputs:
    k, v, kc, vc, slots = a[:5]
    return kc.view(-1, k.shape[1], k.shape[2])[slots], vc.view(-1, v.shape[1], v.shape[2])[slots]


def _kv_peers() -> list[Peer | tuple[str, str]]:
    def prep(a: Args) -> Args:
        k, v, kc, vc, slots = a
        T = k.shape[0]
        B = kc.shape[1]
        i32 = dict(device=k.device, dtype=torch.int32)
        s = slots.to(torch.int32)
        # one single-token "request" per token: page slot // B, position slot % B
        return (
            k,
            v,
            kc,
            vc,
            slots,
            torch.arange(T, **i32),
            s % B,
            s // B,
            torch.arange(T + 1, **i32),
            s % B + 1,
        )

    def fi(a: Args) -> None:
        k, v, kc, vc, _slots, bidx, pos, kv_indices, kv_indptr, last = a
        _fi("page", "append_paged_kv_cache")(
            k, v, bidx, pos, (kc, vc), kv_indices, kv_indptr, last, kv_layout="NHD"
        )

    return [
        ("Liger", "no KV-cache op in Liger-Kernel"),
        Peer("FlashInfer", fi, _kv_outputs, prepare=prep, fi_module="page"),
    ]


# --------------------------------------------------------------------------------------------
# the table


def _q(shapes: Sequence[Shape], picks: Sequence[int]) -> list[Shape]:
    return [s for s in shapes if s.T in picks and (not s.dims or s.dims[0][1] == shapes[0].dims[0][1])][:2]


def cases(extra: bool = False) -> list[OpCase]:
    """The GPU suite's cases; ``extra``: also the ops added since (``_extra_cases``, which the
    CPU suite times)."""
    L, A = "opmux.kernels.ops.layernorm", "opmux.kernels.ops.activation"
    norm = _norm_shapes((4096, 8192))
    gnorm = _norm_shapes((4096,))
    out: list[OpCase] = [
        OpCase(
            "layernorm.rmsnorm",
            "rmsnorm",
            f"{L}:rmsnorm",
            norm,
            _q(norm, (128, 4096)),
            _make_norm,
            _norm_bytes,
            lambda a: (rms_ref(a[0], a[1]),),
            lambda a: (
                (
                    a[0],
                    a[1],
                    EPS,
                ),
                {},
            ),
            _ret_or((0,)),
            eager_rmsnorm,
            _ret,
            lambda: _norm_peers(False),
        ),
        OpCase(
            "layernorm.fused_add_rmsnorm",
            "rmsnorm",
            f"{L}:fused_add_rmsnorm",
            norm,
            _q(norm, (128, 4096)),
            _make_add_norm,
            _add_norm_bytes,
            _add_ref(0.0),
            lambda a: (
                (
                    a[0],
                    a[1],
                    a[2],
                    EPS,
                ),
                {},
            ),
            lambda a, r: (a[0], a[1]),
            eager_fused_add_rmsnorm,
            _ret,
            lambda: _add_norm_peers(False),
            kinds=("float", "float"),
            mutates=(0, 1),
        ),
        OpCase(
            "activation.silu_and_mul",
            "activation",
            f"{A}:silu_and_mul",
            _act_shapes(),
            _q(_act_shapes(), (128, 4096)),
            _make_act,
            _act_bytes,
            _act_ref("silu"),
            lambda a: ((a[0],), {}),
            _ret_or((0,)),
            eager_silu_and_mul,
            _ret,
            lambda: _act_peers("silu"),
        ),
        OpCase(
            "rope.rotary_embedding",
            "rope",
            "opmux.kernels.ops.rope:rotary_embedding",
            _rope_shapes(),
            _q(_rope_shapes(), (128, 4096)),
            _make_rope,
            _rope_bytes,
            _rope_ref,
            lambda a: (
                (
                    a[0],
                    a[1],
                    a[2],
                    a[3],
                    a[4],
                ),
                {"is_neox": True},
            ),
            _ret_or((1, 2)),
            eager_rope,
            _ret,
            _rope_peers,
            kinds=("float", "float"),
            mutates=(1, 2),
            notes="neox; q 32x128, k 8x128; positions int64 in [0, 32768); float32 cos_sin_cache [32768, 128]",
        ),
        OpCase(
            "quantization.per_token_quant_fp8",
            "quant",
            "opmux.kernels.ops.quantization:per_token_quant_fp8",
            _quant_shapes(),
            _q(_quant_shapes(), (128, 4096)),
            _make_quant,
            _ptq_bytes,
            _ptq_ref,
            lambda a: ((a[0],), {}),
            _ret,
            eager_per_token_quant_fp8,
            _ret,
            lambda: [
                ("Liger", "no fp8 quantization op in Liger-Kernel"),
                ("FlashInfer", "no per-token (row-wise) fp8 quantization API in FlashInfer 0.7.4"),
            ],
            kinds=("fp8", "float"),
        ),
        OpCase(
            "quantization.per_token_group_quant_fp8",
            "quant",
            "opmux.kernels.ops.quantization:per_token_group_quant_fp8",
            # and decode-size wide rows: the MLP-down input of a Llama-3-8B step (split rows)
            [*_quant_shapes(), *(Shape(t, (("H", INTER),)) for t in (1, 16, 128))],
            _q(_quant_shapes(), (128, 4096)),
            _make_quant,
            _ptgq_bytes,
            _ptgq_ref,
            lambda a: (
                (
                    a[0],
                    GROUP,
                ),
                {},
            ),
            _ret,
            eager_per_token_group_quant_fp8,
            _ret,
            _ptgq_peers,
            kinds=("fp8", "float"),
            notes="group 128, row-major float32 scales",
        ),
        OpCase(
            "quantization.silu_and_mul_per_token_group_quant_fp8",
            "quant",
            "opmux.kernels.ops.quantization:silu_and_mul_per_token_group_quant_fp8",
            _act_shapes(),
            _q(_act_shapes(), (128, 4096)),
            _make_act,
            _silu_quant_bytes,
            _silu_quant_ref,
            lambda a: ((a[0], GROUP), {}),
            _ret,
            eager_silu_and_mul_quant_fp8,
            _ret,
            _silu_quant_peers,
            kinds=("fp8", "float"),
            notes=f"x [T, 2 x {INTER}] -> fp8 [T, {INTER}], group 128, row-major float32 scales; the peers run "
            "silu_and_mul then the group quantization (FlashInfer: its two kernels; torch.compile: the two "
            "eager functions compiled as one)",
        ),
        OpCase(
            "layernorm.gemma_rmsnorm",
            "rmsnorm",
            f"{L}:gemma_rmsnorm",
            gnorm,
            _q(gnorm, (128, 4096)),
            _make_norm,
            _norm_bytes,
            lambda a: (rms_ref(a[0], a[1], EPS, 1.0),),
            lambda a: (
                (
                    a[0],
                    a[1],
                    EPS,
                ),
                {},
            ),
            _ret_or((0,)),
            eager_gemma_rmsnorm,
            _ret,
            lambda: _norm_peers(True),
        ),
        OpCase(
            "layernorm.gemma_fused_add_rmsnorm",
            "rmsnorm",
            f"{L}:gemma_fused_add_rmsnorm",
            gnorm,
            _q(gnorm, (128, 4096)),
            _make_add_norm,
            _add_norm_bytes,
            _add_ref(1.0),
            lambda a: (
                (
                    a[0],
                    a[1],
                    a[2],
                    EPS,
                ),
                {},
            ),
            lambda a, r: (a[0], a[1]),
            eager_gemma_fused_add_rmsnorm,
            _ret,
            lambda: _add_norm_peers(True),
            kinds=("float", "float"),
            mutates=(0, 1),
        ),
        OpCase(
            "layernorm.qk_norm",
            "rmsnorm",
            f"{L}:qk_norm",
            _qk_shapes(),
            _q(_qk_shapes(), (128, 4096)),
            _make_qk,
            lambda s: 2 * 2 * s.T * (s.get("Hq") + s.get("Hk")) * s.get("D") + 4 * s.get("D"),
            lambda a: (rms_ref(a[0], a[2]), rms_ref(a[1], a[3])),
            lambda a: (
                (
                    a[0],
                    a[1],
                    a[2],
                    a[3],
                    EPS,
                ),
                {},
            ),
            _ret_or((0, 1)),
            eager_qk_norm,
            _ret,
            _qk_peers,
            kinds=("float", "float"),
            mutates=(0, 1),
            notes="q [T, 32, 128], k [T, 8, 128], per-head RMSNorm",
        ),
        OpCase(
            "activation.gelu_and_mul",
            "activation",
            f"{A}:gelu_and_mul",
            _act_shapes(),
            _q(_act_shapes(), (128, 4096)),
            _make_act,
            _act_bytes,
            _act_ref("gelu"),
            lambda a: ((a[0],), {}),
            _ret_or((0,)),
            eager_gelu_and_mul,
            _ret,
            lambda: _act_peers("gelu"),
        ),
        OpCase(
            "activation.gelu_tanh_and_mul",
            "activation",
            f"{A}:gelu_tanh_and_mul",
            _act_shapes(),
            _q(_act_shapes(), (128, 4096)),
            _make_act,
            _act_bytes,
            _act_ref("gelu_tanh"),
            lambda a: ((a[0],), {}),
            _ret_or((0,)),
            eager_gelu_tanh_and_mul,
            _ret,
            lambda: _act_peers("gelu_tanh"),
        ),
        OpCase(
            "moe.topk_softmax",
            "moe",
            "opmux.kernels.ops.moe:topk_softmax",
            _topk_shapes(),
            _q(_topk_shapes(), (128, 4096)),
            _make_topk,
            _topk_bytes,
            _topk_ref,
            lambda a: (
                (
                    a[0],
                    a[1],
                ),
                {"renormalize": False},
            ),
            _topk_outputs,
            eager_topk_softmax,
            _topk_outputs,
            lambda: [
                ("Liger", "no MoE routing op in Liger-Kernel"),
                ("FlashInfer", "no standalone topk_softmax API in FlashInfer 0.7.4"),
            ],
            kinds=("topk", "topk"),
            notes="float32 router logits, k=8, renormalize=False",
        ),
        OpCase(
            "kvcache.reshape_and_cache",
            "kvcache",
            "opmux.kernels.ops.kvcache:reshape_and_cache",
            _kv_shapes(),
            _q(_kv_shapes(), (128, 4096)),
            _make_kv,
            _kv_bytes,
            _kv_ref,
            lambda a: (
                (
                    a[0],
                    a[1],
                    a[2],
                    a[3],
                    a[4],
                ),
                {},
            ),
            _kv_outputs,
            eager_reshape_and_cache,
            _kv_outputs,
            _kv_peers,
            kinds=("exact", "exact"),
            mutates=(2, 3),
            notes="8 kv heads x 128, block 16, cache [blocks, 16, 8, 128] (flash layout), random distinct slots",
        ),
    ]
    return out + _extra_cases() if extra else out


# --------------------------------------------------------------------------------------------
# the ops added after the first GPU suite: timed by the CPU suite (bench_cpu.py asks for
# cases(extra=True)); complete cases (references, outputs) the GPU suite can take up the same way


def _act_shapes_h(ts: Sequence[int] = ALL_T) -> list[Shape]:
    return [Shape(t, (("H", INTER),)) for t in ts]


def _make_elementwise(s: Shape, g: torch.Generator, dev: str) -> Args:
    return (_randn((s.T, s.get("H")), g, dev),)


def _elementwise_bytes(s: Shape) -> int:
    return 2 * s.T * s.get("H") * 2


def eager_mul_and_silu(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return x[..., :d] * F.silu(x[..., d:])


def eager_fatrelu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.threshold(x[..., :d], 0.0, 0.0) * x[..., d:]


SWIGLU_LIMIT = 7.0
OAI_ALPHA = 1.702


def eager_swiglustep_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]).clamp(max=SWIGLU_LIMIT) * x[..., d:].clamp(-SWIGLU_LIMIT, SWIGLU_LIMIT)


def eager_swigluoai_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate = x[..., ::2].clamp(max=SWIGLU_LIMIT)
    up = x[..., 1::2].clamp(-SWIGLU_LIMIT, SWIGLU_LIMIT)
    return (up + 1) * (gate * torch.sigmoid(gate * OAI_ALPHA))


def eager_gelu_new(x: torch.Tensor) -> torch.Tensor:  # Hugging Face's NewGELUActivation
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def eager_gelu_fast(x: torch.Tensor) -> torch.Tensor:  # Hugging Face's FastGELUActivation
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def eager_gelu_quick(x: torch.Tensor) -> torch.Tensor:  # Hugging Face's QuickGELUActivation
    return x * torch.sigmoid(1.702 * x)


def _fp32_of(eager: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[Args], Outputs]:
    """The float32 reference of an activation: its eager form on the input in float32."""
    return lambda a: (eager(a[0].float()),)


# -- rmsnorm with static fp8 quantization


def _make_norm_quant(s: Shape, g: torch.Generator, dev: str) -> Args:
    x, w = _make_norm(s, g, dev)
    return (x, w, torch.tensor([0.02], device=dev, dtype=torch.float32))


def _make_add_norm_quant(s: Shape, g: torch.Generator, dev: str) -> Args:
    x, r, w = _make_add_norm(s, g, dev)
    return (x, r, w, torch.tensor([0.02], device=dev, dtype=torch.float32))


def _static_fp8(y: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (y.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def eager_rmsnorm_static_quant_fp8(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return _static_fp8(eager_rmsnorm(x, w), scale)


def eager_fused_add_rmsnorm_static_quant_fp8(
    x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    y, r = eager_fused_add_rmsnorm(x, r, w)
    return _static_fp8(y, scale), r


def _norm_quant_bytes(s: Shape) -> int:
    return s.T * s.get("H") * (2 + 1) + s.get("H") * 2


def _add_norm_quant_bytes(s: Shape) -> int:
    return s.T * s.get("H") * (3 * 2 + 1) + s.get("H") * 2


# -- moe.topk_sigmoid (DeepSeek-V3-like: 256 experts, top 8, chosen by sigmoid + correction bias)


def _sigmoid_shapes(ts: Sequence[int] = (1, 128, 4096, 32768)) -> list[Shape]:
    return [Shape(t, (("E", e), ("k", 8))) for e in (256, 64) for t in ts]


def _make_sigmoid(s: Shape, g: torch.Generator, dev: str) -> Args:
    E = s.get("E")
    return (_randn((s.T, E), g, dev), _randn((E,), g, dev, dtype=torch.float32, scale=0.1), s.get("k"))


def _sigmoid_bytes(s: Shape) -> int:
    return s.T * s.get("E") * 2 + s.get("E") * 4 + s.T * s.get("k") * (4 + 4)


def eager_topk_sigmoid(g: torch.Tensor, bias: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    s = torch.sigmoid(g.float())
    i = torch.topk(s + bias, k, dim=-1).indices
    return s.gather(-1, i), i


def _sigmoid_ref(a: Args) -> Outputs:
    s = torch.sigmoid(a[0].float())
    w, i = eager_topk_sigmoid(a[0].float(), a[1], a[2])
    order = w.argsort(dim=-1, descending=True)  # compare() orders the outputs by weight
    return w.gather(-1, order), i.gather(-1, order), s


# -- moe.batched_moe_align_block_size (vLLM's batched experts: E local experts, T tokens each at most)

ALIGN_E, ALIGN_K, ALIGN_BLOCK = 64, 8, 64


def _batched_shapes(ts: Sequence[int] = ALL_T) -> list[Shape]:
    return [Shape(t, (("E", ALIGN_E), ("k", ALIGN_K), ("block", ALIGN_BLOCK))) for t in ts]


def _make_batched(s: Shape, g: torch.Generator, dev: str) -> Args:
    T, E, k = s.T, s.get("E"), s.get("k")
    ids = torch.rand(T, E, generator=g, device=dev).topk(min(k, E), dim=-1).indices  # T tokens routed
    counts = torch.bincount(ids.flatten(), minlength=E).to(torch.int32)
    return (counts, T, s.get("block"))


def _batched_bytes(s: Shape) -> int:
    E, bs = s.get("E"), s.get("block")
    n = E * ((s.T + bs - 1) // bs * bs)
    return E * 4 + n * 4 + n // bs * 4 + 4


def eager_batched_moe_align_block_size(
    counts: torch.Tensor, m: int, bs: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """vLLM's batched layout with static shapes: expert x's rows x * m + j (j < counts[x]) at
    its padded offset, the rest of sorted_ids e * m; each block's expert, -1 past the total."""
    e = counts.shape[0]
    n = e * ((m + bs - 1) // bs * bs)
    c = counts.long()
    padded = (c + bs - 1) // bs * bs
    ends = padded.cumsum(0)
    j = torch.arange(m, device=counts.device)
    rows = torch.arange(e, device=counts.device)[:, None] * m + j
    pos = torch.where(j < c[:, None], (ends - padded)[:, None] + j, n)  # n: a slot past the end
    out = torch.full((n + 1,), e * m, dtype=torch.int32, device=counts.device)
    out.scatter_(0, pos.flatten(), rows.flatten().to(torch.int32))
    blocks = torch.arange(n // bs, device=counts.device)
    owner = torch.searchsorted(ends // bs, blocks, right=True)
    expert_ids = torch.where(blocks < ends[-1] // bs, owner, -1).to(torch.int32)
    return out[:n], expert_ids, ends[-1:].to(torch.int32)


def _batched_ref(a: Args) -> Outputs:
    return eager_batched_moe_align_block_size(*a)


# -- kvcache.copy_blocks (one cache of the flash layout; the blocks of T tokens copied)


def _copy_shapes(ts: Sequence[int] = ALL_T) -> list[Shape]:
    return [Shape(t, (("Hk", 8), ("D", 128), ("block", BLOCK))) for t in ts]


def _copy_pairs(s: Shape) -> int:
    return max(1, s.T // s.get("block"))


def _make_copy(s: Shape, g: torch.Generator, dev: str) -> Args:
    Hk, D, B, n = s.get("Hk"), s.get("D"), s.get("block"), _copy_pairs(s)
    nblocks = 2 * n + 4
    perm = torch.randperm(nblocks, generator=g, device=dev)
    mapping = torch.stack([perm[:n], perm[n : 2 * n]], dim=1).contiguous()  # sources, distinct targets
    return (_randn((nblocks, B, Hk, D), g, dev), mapping)


def _copy_bytes(s: Shape) -> int:
    n = _copy_pairs(s)
    return 2 * n * s.get("block") * s.get("Hk") * s.get("D") * 2 + n * 16


def eager_copy_blocks(cache: torch.Tensor, mapping: torch.Tensor) -> None:
    cache[mapping[:, 1]] = cache[mapping[:, 0]]


def _copy_outputs(a: Args, ret: Any) -> Outputs:
    return (a[0][a[1][:, 1]],)


def _copy_ref(a: Args) -> Outputs:
    return (a[0][a[1][:, 0]].float(),)


# -- kvcache.concat_and_cache_mla (DeepSeek's MLA: kv_lora_rank 512 + rope 64, block 64)

MLA_RANK, MLA_PE, MLA_BLOCK = 512, 64, 64


def _mla_shapes(ts: Sequence[int] = ALL_T) -> list[Shape]:
    return [Shape(t, (("rank", MLA_RANK), ("pe", MLA_PE), ("block", MLA_BLOCK))) for t in ts]


def _make_mla(s: Shape, g: torch.Generator, dev: str) -> Args:
    T, R, P, B = s.T, s.get("rank"), s.get("pe"), s.get("block")
    nblocks = max(4, math.ceil(2 * T / B))
    slots = torch.randperm(nblocks * B, generator=g, device=dev)[:T].to(torch.int64)
    cache = torch.zeros(nblocks, B, R + P, device=dev, dtype=DT)
    return (_randn((T, R), g, dev), _randn((T, P), g, dev), cache, slots)


def _mla_bytes(s: Shape) -> int:
    return 2 * s.T * (s.get("rank") + s.get("pe")) * 2 + s.T * 8


def eager_concat_and_cache_mla(
    kv_c: torch.Tensor, k_pe: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor
) -> None:
    cache.view(-1, cache.shape[-1])[slots] = torch.cat([kv_c, k_pe], dim=-1)


def _mla_outputs(a: Args, ret: Any) -> Outputs:
    return (a[2].view(-1, a[2].shape[-1])[a[3]],)


def _mla_ref(a: Args) -> Outputs:
    return (torch.cat([a[0], a[1]], dim=-1).float(),)


# -- kvcache.gather_cache (MLA's latent cache read back for chunked prefill: sequences of up to
# 512 tokens through their block tables)

GATHER_SEQ = 512


def _gather_shapes(ts: Sequence[int] = ALL_T) -> list[Shape]:
    return [Shape(t, (("entry", MLA_RANK + MLA_PE), ("block", MLA_BLOCK))) for t in ts]


def _make_gather(s: Shape, g: torch.Generator, dev: str) -> Args:
    T, W, B = s.T, s.get("entry"), s.get("block")
    L = min(T, GATHER_SEQ)
    batch = -(-T // L)
    width = -(-L // B)
    nblocks = 2 * batch * width + 4
    table = torch.randperm(nblocks, generator=g, device=dev)[: batch * width].view(batch, width)
    lens = torch.full((batch,), L, dtype=torch.int64, device=dev)
    lens[-1] = T - L * (batch - 1)
    cu = torch.cat([lens.new_zeros(1), lens.cumsum(0)]).to(torch.int32)
    src = _randn((nblocks, B, W), g, dev)
    dst = torch.zeros(T, W, device=dev, dtype=DT)
    return (src, dst, table.to(torch.int32).contiguous(), cu)


def _gather_bytes(s: Shape) -> int:
    return 2 * s.T * s.get("entry") * 2


def eager_gather_cache(
    src: torch.Tensor, dst: torch.Tensor, block_table: torch.Tensor, cu_seq_lens: torch.Tensor
) -> None:
    bs = src.shape[1]
    tok = torch.arange(dst.shape[0], device=dst.device)
    cu = cu_seq_lens.long()
    seq = torch.searchsorted(cu[1:], tok, right=True)  # the sequence of each dst row
    i = tok - cu[seq]
    dst.copy_(src[block_table[seq, i // bs].long(), i % bs])


def _gather_ref(a: Args) -> Outputs:
    dst = a[1].clone()
    eager_gather_cache(a[0], dst, a[2], a[3])
    return (dst.float(),)


def _none(why: str) -> Callable[[], list[Peer | tuple[str, str]]]:
    return lambda: [("Liger", why), ("FlashInfer", why)]


# -- quantization: per-tensor fp8, group int8, static fp8 (the #13 features' ops)


def _pt_bytes(s: Shape) -> int:
    return s.T * s.get("H") * (2 + 2 + 1) + 4  # two passes over x (amax, then q)


def eager_per_tensor_quant_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = (x.abs().amax().float() / FP8_MAX).view(1)
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def eager_per_token_group_quant_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    T, H = x.shape
    xg = x.view(T, H // GROUP, GROUP).float()
    scale = xg.abs().amax(dim=-1, keepdim=True).clamp(min=1e-10) / 127.0
    q = (xg * (1.0 / scale)).clamp(-128.0, 127.0).trunc().to(torch.int8).view(T, H)
    return q, scale.view(T, H // GROUP)


def _make_static_quant(s: Shape, g: torch.Generator, dev: str) -> Args:
    return (_randn((s.T, s.get("H")), g, dev), torch.tensor([0.01], device=dev, dtype=torch.float32))


def _static_quant_bytes(s: Shape) -> int:
    return s.T * s.get("H") * (2 + 1) + 4


def eager_static_quant_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return _static_fp8(x, scale)


# -- moe.moe_align_block_size (vLLM's layout: experts in order, each padded to the block size)


def _align_shapes(ts: Sequence[int] = ALL_T) -> list[Shape]:
    return [Shape(t, (("E", ALIGN_E), ("k", ALIGN_K), ("block", ALIGN_BLOCK))) for t in ts]


def _make_align(s: Shape, g: torch.Generator, dev: str) -> Args:
    T, E, k = s.T, s.get("E"), s.get("k")
    ids = torch.rand(T, E, generator=g, device=dev).topk(min(k, E), dim=-1).indices.to(torch.int32)
    return (ids, s.get("block"), E)


def _align_bytes(s: Shape) -> int:
    n, E, bs = s.T * s.get("k"), s.get("E"), s.get("block")
    padded = n + E * (bs - 1)
    return n * 4 + padded * 4 + (padded + bs - 1) // bs * 4 + 4


def eager_moe_align_block_size(
    topk_ids: torch.Tensor, bs: int, e: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Static shapes (the most a layout can need): each expert's entries in token order at its
    padded offset, the rest of sorted_ids numel; each block's expert, -1 past the total."""
    flat = topk_ids.flatten().long()
    n = flat.numel()
    max_padded = n + e * (bs - 1)
    counts = torch.bincount(flat, minlength=e)
    padded = (counts + bs - 1) // bs * bs
    ends = padded.cumsum(0)
    order = torch.argsort(flat, stable=True)
    se = flat[order]
    pos = (ends - padded)[se] + torch.arange(n, device=flat.device) - (counts.cumsum(0) - counts)[se]
    out = torch.full((max_padded,), n, dtype=torch.int32, device=flat.device)
    out.scatter_(0, pos, order.to(torch.int32))
    blocks = torch.arange((max_padded + bs - 1) // bs, device=flat.device)
    owner = torch.searchsorted(ends // bs, blocks, right=True)
    expert_ids = torch.where(blocks < ends[-1] // bs, owner, -1).to(torch.int32)
    return out, expert_ids, ends[-1:].to(torch.int32)


def _extra_cases() -> list[OpCase]:
    L, A = "opmux.kernels.ops.layernorm", "opmux.kernels.ops.activation"
    M, K = "opmux.kernels.ops.moe", "opmux.kernels.ops.kvcache"

    def x1(a: Args) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return ((a[0],), {})

    out: list[OpCase] = []
    gated = (
        ("mul_and_silu", eager_mul_and_silu, ""),
        ("fatrelu_and_mul", eager_fatrelu_and_mul, "threshold 0"),
        ("swiglustep_and_mul", eager_swiglustep_and_mul, "limit 7"),
        ("swigluoai_and_mul", eager_swigluoai_and_mul, "gpt-oss: interleaved gate/up, alpha 1.702, limit 7"),
    )
    for name, eager, notes in gated:
        out.append(
            OpCase(
                f"activation.{name}",
                "activation",
                f"{A}:{name}",
                _act_shapes(),
                _q(_act_shapes(), (128, 4096)),
                _make_act,
                _act_bytes,
                _fp32_of(eager),
                x1,
                _ret_or((0,)),
                eager,
                _ret,
                _none("no such activation op"),
                notes=notes,
            )
        )
    for name, eager in (
        ("gelu_new", eager_gelu_new),
        ("gelu_fast", eager_gelu_fast),
        ("gelu_quick", eager_gelu_quick),
    ):
        out.append(
            OpCase(
                f"activation.{name}",
                "activation",
                f"{A}:{name}",
                _act_shapes_h(),
                _q(_act_shapes_h(), (128, 4096)),
                _make_elementwise,
                _elementwise_bytes,
                _fp32_of(eager),
                x1,
                _ret_or((0,)),
                eager,
                _ret,
                _none("no element-wise gelu op"),
                notes="element-wise on [T, 14336]",
            )
        )
    qnorm = _norm_shapes((4096,))
    out += [
        OpCase(
            "layernorm.rmsnorm_static_quant_fp8",
            "rmsnorm",
            f"{L}:rmsnorm_static_quant_fp8",
            qnorm,
            _q(qnorm, (128, 4096)),
            _make_norm_quant,
            _norm_quant_bytes,
            lambda a: (_static_fp8(rms_ref(a[0], a[1]), a[2]),),
            lambda a: ((a[0], a[1], a[2], EPS), {}),
            _ret_or((0,)),
            eager_rmsnorm_static_quant_fp8,
            _ret,
            _none("no fused rmsnorm + static fp8 quantization op"),
            kinds=("fp8",),
            notes="per-tensor float32 scale",
        ),
        OpCase(
            "layernorm.fused_add_rmsnorm_static_quant_fp8",
            "rmsnorm",
            f"{L}:fused_add_rmsnorm_static_quant_fp8",
            qnorm,
            _q(qnorm, (128, 4096)),
            _make_add_norm_quant,
            _add_norm_quant_bytes,
            lambda a: (_static_fp8(_add_ref(0.0)(a[:3])[0], a[3]), a[0].float() + a[1].float()),
            lambda a: ((a[0], a[1], a[2], a[3], EPS), {}),
            lambda a, r: (_first(r), a[1]),
            eager_fused_add_rmsnorm_static_quant_fp8,
            _ret,
            _none("no fused add + rmsnorm + static fp8 quantization op"),
            kinds=("fp8", "float"),
            mutates=(1,),
            notes="residual += x in place; per-tensor float32 scale",
        ),
        OpCase(
            "moe.topk_sigmoid",
            "moe",
            f"{M}:topk_sigmoid",
            _sigmoid_shapes(),
            _q(_sigmoid_shapes(), (128, 4096)),
            _make_sigmoid,
            _sigmoid_bytes,
            _sigmoid_ref,
            lambda a: ((a[0], a[2]), {"correction_bias": a[1]}),
            _topk_outputs,
            eager_topk_sigmoid,
            _topk_outputs,
            _none("no standalone topk_sigmoid API"),
            kinds=("topk", "topk"),
            notes="256 experts, k=8, chosen by sigmoid + float32 correction bias, renormalize=False",
        ),
        OpCase(
            "moe.batched_moe_align_block_size",
            "moe",
            f"{M}:batched_moe_align_block_size",
            _batched_shapes(),
            _q(_batched_shapes(), (128, 4096)),
            _make_batched,
            _batched_bytes,
            _batched_ref,
            lambda a: ((a[0], a[1], a[2]), {}),
            _ret,
            eager_batched_moe_align_block_size,
            _ret,
            _none("no batched moe_align_block_size API"),
            kinds=("exact", "exact", "exact"),
            notes="64 experts, counts of T tokens routed to 8 each, max_tokens_per_batch T, block 64",
        ),
        OpCase(
            "kvcache.copy_blocks",
            "kvcache",
            f"{K}:copy_blocks",
            _copy_shapes(),
            _q(_copy_shapes(), (128, 4096)),
            _make_copy,
            _copy_bytes,
            _copy_ref,
            lambda a: ((a[0], a[1]), {}),
            _copy_outputs,
            eager_copy_blocks,
            _copy_outputs,
            _none("no copy_blocks API"),
            kinds=("exact",),
            mutates=(0,),
            notes="cache [blocks, 16, 8, 128], max(1, T / 16) (src, dst) pairs: the blocks of T tokens",
        ),
        OpCase(
            "kvcache.concat_and_cache_mla",
            "kvcache",
            f"{K}:concat_and_cache_mla",
            _mla_shapes(),
            _q(_mla_shapes(), (128, 4096)),
            _make_mla,
            _mla_bytes,
            _mla_ref,
            lambda a: ((a[0], a[1], a[2], a[3]), {}),
            _mla_outputs,
            eager_concat_and_cache_mla,
            _mla_outputs,
            _none("no MLA cache-write API"),
            kinds=("exact",),
            mutates=(2,),
            notes="kv_c [T, 512], k_pe [T, 64], cache [blocks, 64, 576], random distinct slots",
        ),
        OpCase(
            "kvcache.gather_cache",
            "kvcache",
            f"{K}:gather_cache",
            _gather_shapes(),
            _q(_gather_shapes(), (128, 4096)),
            _make_gather,
            _gather_bytes,
            _gather_ref,
            lambda a: ((a[0], a[1], a[2], a[3]), {}),
            lambda a, r: (a[1],),
            eager_gather_cache,
            lambda a, r: (a[1],),
            _none("no gather_cache API"),
            kinds=("exact",),
            mutates=(1,),
            notes="MLA cache [blocks, 64, 576]; sequences of min(T, 512) tokens through int32 block tables",
        ),
        OpCase(
            "quantization.per_tensor_quant_fp8",
            "quant",
            "opmux.kernels.ops.quantization:per_tensor_quant_fp8",
            _quant_shapes(),
            _q(_quant_shapes(), (128, 4096)),
            _make_quant,
            _pt_bytes,
            lambda a: eager_per_tensor_quant_fp8(a[0].float()),
            lambda a: ((a[0],), {}),
            _ret,
            eager_per_tensor_quant_fp8,
            _ret,
            _none("no per-tensor fp8 quantization op"),
            kinds=("fp8", "float"),
            notes="dynamic: scale = amax / 448 over the whole tensor (two passes)",
        ),
        OpCase(
            "quantization.per_token_group_quant_int8",
            "quant",
            "opmux.kernels.ops.quantization:per_token_group_quant_int8",
            _quant_shapes(),
            _q(_quant_shapes(), (128, 4096)),
            _make_quant,
            _ptgq_bytes,
            lambda a: eager_per_token_group_quant_int8(a[0].float()),
            lambda a: ((a[0], GROUP), {}),
            _ret,
            eager_per_token_group_quant_int8,
            _ret,
            _none("no int8 group quantization op"),
            kinds=("float", "float"),
            notes="group 128, q truncated toward zero (sgl-kernel's int8_t conversion)",
        ),
        OpCase(
            "quantization.static_quant_fp8",
            "quant",
            "opmux.kernels.ops.quantization:static_quant_fp8",
            _quant_shapes(),
            _q(_quant_shapes(), (128, 4096)),
            _make_static_quant,
            _static_quant_bytes,
            lambda a: (_static_fp8(a[0].float(), a[1]),),
            lambda a: ((a[0], a[1]), {}),
            _ret_or((0,)),
            eager_static_quant_fp8,
            _ret,
            _none("no static fp8 quantization op"),
            kinds=("fp8",),
            notes="per-tensor float32 scale",
        ),
        OpCase(
            "moe.moe_align_block_size",
            "moe",
            "opmux.kernels.ops.moe:moe_align_block_size",
            _align_shapes(),
            _q(_align_shapes(), (128, 4096)),
            _make_align,
            _align_bytes,
            lambda a: eager_moe_align_block_size(*a),
            lambda a: ((a[0], a[1], a[2]), {}),
            _ret,
            eager_moe_align_block_size,
            _ret,
            _none("no moe_align_block_size API"),
            kinds=("exact", "exact", "exact"),
            notes="64 experts, T tokens routed to 8 each (int32 ids), block 64",
        ),
    ]
    return out


# --------------------------------------------------------------------------------------------
# correctness

TOL = {"float": 1e-2, "fp8": 3e-2, "exact": 0.0, "topk": 1e-2}


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.float(), ref.float()
    if o.shape != r.shape:
        o = o.reshape(r.shape)
    if not bool(torch.isfinite(o).all()):
        return math.inf
    den = float(r.norm())
    num = float((o - r).norm())
    return num / den if den > 0 else num


def compare(case: OpCase, outs: Outputs, ref: Outputs) -> tuple[bool, float, str]:
    """(ok, worst relative error, detail) of ``outs`` against the float32 reference."""
    if case.kinds[0] == "topk":
        w, i = outs[0], outs[1]
        p = ref[2]
        order = w.float().argsort(dim=-1, descending=True)
        w = w.float().gather(-1, order)
        i = i.long().gather(-1, order)
        e1 = rel_l2(w, ref[0])
        e2 = rel_l2(p.gather(-1, i), ref[0])  # probabilities at the chosen ids (ties allowed)
        err = max(e1, e2)
        return err <= TOL["topk"], err, f"weights {e1:.2e}, p[ids] {e2:.2e}"
    worst, parts = 0.0, []
    ok = True
    if len(outs) < len(case.kinds):
        return False, math.inf, f"{len(outs)} outputs, expected {len(case.kinds)}"
    for n, (kind, o, r) in enumerate(zip(case.kinds, outs, ref, strict=False)):
        if tuple(o.shape) != tuple(r.shape) and o.numel() != r.numel():
            return False, math.inf, f"output {n}: shape {tuple(o.shape)} != {tuple(r.shape)}"
        if kind == "fp8" and FP8 is not None and o.dtype != FP8:
            return False, math.inf, f"output {n}: dtype {o.dtype}, expected float8_e4m3fn"
        e = rel_l2(o, r)
        worst = max(worst, e)
        parts.append(f"{e:.2e}")
        if e > TOL[kind]:
            ok = False
    return ok, worst, "rel. L2 " + ", ".join(parts)


def clone_args(args: Args) -> Args:
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
