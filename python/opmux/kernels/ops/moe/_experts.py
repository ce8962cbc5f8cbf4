"""``moe.fused_experts``: the experts of a MoE layer, its contract as data and its definition.

``out[t] = sum_j w_j * W2[e_j] @ act(W1[e_j] @ hidden[t])`` over the ``topk`` experts
``e_j = topk_ids[t, j]`` (mapped by ``expert_map`` when given: global id -> local id, -1 for an
expert on another rank, whose term is left out) with weights ``w_j = topk_weights[t, j]``.
``w1 [E, 2N, K]`` holds each expert's gate rows first, then its up rows (``swigluoai``: the
pairs interleaved, gpt-oss's layout, as ``activation.swigluoai_and_mul`` reads them);
``w2 [E, K, N]``. With ``apply_router_weight_on_input`` (``topk == 1``) the weight scales the
first product instead of the last.

Two forms, chosen by ``w1``'s dtype: weights in ``hidden``'s dtype (bf16, fp16, fp32), or fp8
e4m3 weights with 128x128 block scales (``w1_scale [E, cdiv(2N, 128), cdiv(K, 128)]``,
``w2_scale [E, cdiv(K, 128), cdiv(N, 128)]``: DeepSeek-V3's recipe), the activations quantized
per 1x128 group on the fly (``quantization.per_token_group_quant_fp8``).

What every backend computes, and so the definition (``reference``): each product summed in
fp32; the first one's result (``[M * topk, 2N]``, the largest intermediate) rounded to
``hidden``'s dtype, as the engines' caches hold it; the gated activation as the activation ops
define it (fp32, one rounding); each expert's output rounded to that dtype, then the ``topk``
terms summed in fp32.

``vllm_rounding`` takes vLLM's two other rounding points (its compat entry sets it): silu / gelu of
the gate rounded to ``hidden``'s dtype before the product with the up half, and the fp8 groups
quantized by dividing by their scale (``per_token_group_quant_fp8``'s ``divide_by_scale``).

Kernel arguments: ``(out, hidden, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale,
expert_map, activation, apply_router_weight_on_input, vllm_rounding)``; an absent ``expert_map`` / scale is an
empty tensor. Expert ids (and mapped ids) outside their range raise ``ValueError`` for CPU
tensors; on CUDA the routing (``moe.moe_align_block_size``) skips them (a check would cost a
synchronisation), so no kernel reads or writes out of bounds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import _checks
from .._contract import FLOATS, FP8, Arg, Contract, Forms, Rule, Scalar, When

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

OP = "moe.fused_experts"
#: the block of the fp8 recipe: 1x128 activation groups, 128x128 weight blocks
BLOCK = 128
#: the gated activations between the two products (vLLM's names)
ACTIVATIONS = ("silu", "gelu", "swigluoai")
_I32 = ("int32",)


def _scale(name: str, shape: str, what: str) -> Arg:
    return Arg(
        name,
        shape,
        dtypes=("float32",),
        device_of="hidden",
        layout="contiguous",
        note=f" ({what})",
        layout_hint="is non-contiguous (strides {{t}.stride()}); pass {t}.contiguous()",
    )


def _items(fp8: bool) -> tuple[Any, ...]:
    weight = {"dtypes": FP8} if fp8 else {"like": "hidden"}
    dense = "has strides {{t}.stride()}; its last dim must be dense (stride 1)"
    return (
        Arg("hidden", "M, K", dtypes=FLOATS, layout="matrix"),
        Rule("K >= 1", "hidden has shape {tuple(hidden.shape)}; K (its last dim) must be at least 1"),
        Arg("w1", "E, N2, K", device_of="hidden", layout="dense_last", layout_hint=dense, **weight),
        Rule(
            "E >= 1 and N2 >= 2 and N2 % 2 == 0",
            "w1 has shape {tuple(w1.shape)}; expected [E, 2N, K]: E >= 1 experts, each with its "
            "gate and up rows (2N even, N >= 1)",
        ),
        Arg(
            "w2",
            "E, K, N2 // 2",
            device_of="hidden",
            layout="dense_last",
            layout_hint=dense,
            expect="[{E}, {K}, {N2 // 2}] ([E, K, N] for w1 [E, 2N, K])",
            **weight,
        ),
        Arg("topk_weights", "M, topk", dtypes=("float32",), device_of="hidden", layout="matrix"),
        Arg(
            "topk_ids",
            "M, topk",
            dtypes=("int32", "int64"),
            device_of="hidden",
            layout="matrix",
            dtype_hint="has dtype {dtype}; expected int32 or int64",
        ),
        Scalar("activation", "choice", choices=ACTIVATIONS),
        Scalar("apply_router_weight_on_input", "bool"),
        Scalar("vllm_rounding", "bool"),
        Rule(
            "not apply_router_weight_on_input or topk == 1",
            "apply_router_weight_on_input scales each token's one expert input: it needs topk == 1, "
            "got topk = {topk}",
        ),
        Rule("M * topk < 2147483648", "{M} tokens x topk {topk} rows do not fit int32"),
        Arg(
            "expert_map",
            "G",
            dtypes=_I32,
            device_of="hidden",
            layout="vector",
            note=" (global expert id -> local id in [0, E), or -1 for an expert on another rank)",
        ),
        Rule(
            "expert_map is None or G >= 1",
            "expert_map is empty; it maps each global expert id to a local one (or -1): pass one entry per "
            "global expert, or no expert_map",
        ),
        # the form's rule on the scales before their checks (a tensor check of a None scale
        # would speak first, this rule never)
        (
            Rule(
                "w1_scale is not None and w2_scale is not None",
                "fp8 weights need their 128x128 block scales: w1_scale [E, cdiv(2N, 128), cdiv(K, 128)] "
                "and w2_scale [E, cdiv(K, 128), cdiv(N, 128)] (float32)",
            )
            if fp8
            else Rule(
                "w1_scale is None and w2_scale is None",
                "w1_scale / w2_scale are the block scales of float8_e4m3fn weights; w1 has dtype "
                "{str(w1.dtype)[6:]}: pass no scales, or fp8 weights",
            )
        ),
        _scale("w1_scale", "E, cdiv(N2, 128), cdiv(K, 128)", "w1's 128x128 block scales"),
        _scale("w2_scale", "E, cdiv(K, 128), cdiv(N2 // 2, 128)", "w2's 128x128 block scales"),
        Arg("out", "M, K", like="hidden", layout="matrix", out=True),
    )


_KERNEL = (
    "out",
    "hidden",
    "w1",
    "w2",
    "topk_weights",
    "topk_ids",
    "w1_scale",
    "w2_scale",
    "expert_map",
    "activation",
    "apply_router_weight_on_input",
    "vllm_rounding",
)
FUSED_EXPERTS = Forms(
    "fused_experts",
    cases=((((When("w1", dtype="float8_e4m3fn")),), Contract("experts_fp8", _items(True), _KERNEL, "out")),),
    default=Contract("experts", _items(False), _KERNEL, "out"),
)


def check_ids(
    op: str,
    ids: Tensor,
    n_ids: int,
    ids_range: str,
    expert_map: Tensor | None,
    experts: int,
    experts_range: str = "",
) -> None:
    """The one statement of the moe ops' id rules, for CPU tensors (free there; on CUDA the
    routing skips bad ids): every id in ``[0, n_ids)`` (``ids_range`` says what bounds it), every
    ``expert_map`` entry a local expert in ``[0, experts)`` or -1 (``experts_range``: what bounds
    that, or "")."""
    if ids.is_cpu and ids.numel() and not _checks.in_range(ids, 0, n_ids):
        where = tuple(((ids < 0) | (ids >= n_ids)).nonzero()[0].tolist())
        raise ValueError(
            f"{op}: topk_ids{list(where)} = {int(ids[where])} is out of range [0, {n_ids}) ({ids_range})"
        )
    if expert_map is not None and expert_map.is_cpu and expert_map.numel():
        if not _checks.in_range(expert_map, -1, experts):
            e = int(((expert_map < -1) | (expert_map >= experts)).nonzero()[0, 0])
            raise ValueError(
                f"{op}: expert_map[{e}] = {int(expert_map[e])} is out of range: local expert ids are "
                f"[0, {experts}){experts_range}, or -1 for an expert on another rank"
            )


def values(
    hidden: Tensor,
    w1: Tensor,
    w2: Tensor,
    topk_weights: Tensor,
    topk_ids: Tensor,
    activation: str = "silu",
    apply_router_weight_on_input: bool = False,
    expert_map: Tensor | None = None,
    *_: Any,
) -> None:
    """Expert ids in range (CPU tensors: free there; on CUDA the routing skips bad ids)."""
    experts = w1.shape[0]
    n_ids = expert_map.numel() if expert_map is not None else experts
    what = "the expert_map's length" if expert_map is not None else "the number of experts, w1.shape[0]"
    check_ids(OP, topk_ids, n_ids, what, expert_map, experts, " (w1.shape[0])")


# -- the definition --------------------------------------------------------------------------------
def dequantize(w: Tensor, scale: Tensor) -> Tensor:
    """fp8 weights [E, R, C] with 128x128 block scales -> float32."""
    r, c = w.shape[-2:]
    s = scale.repeat_interleave(BLOCK, dim=-2)[..., :r, :].repeat_interleave(BLOCK, dim=-1)[..., :c]
    return w.to(s.dtype) * s


def _qdq(x: Tensor, vllm: bool = False) -> Tensor:
    """The on-the-fly activation quantization (1x128 groups, e4m3), dequantized: what the fp8
    products see of ``x``. The group quant op's definition, on a K padded to whole groups
    (``vllm``: its ``divide_by_scale`` form, vLLM's)."""
    from ..quantization.op import per_token_group_quant_fp8 as quant

    k = x.shape[-1]
    pad = -k % BLOCK
    xp = torch.nn.functional.pad(x, (0, pad)) if pad else x
    q, s = quant.reference(xp, BLOCK, divide_by_scale=vllm)
    out: Tensor = (q.float() * s.repeat_interleave(BLOCK, dim=-1))[..., :k]
    return out


def gated_op(activation: str, vllm: bool = False) -> tuple[str, dict[str, bool]]:
    """The activation op between the products (its name in the ``activation`` group) and its
    keywords: silu / gelu take ``vllm_rounding`` (the gate rounded first, then the product in the
    input's dtype, as vLLM's kernels); swigluoai has one form (vLLM's kernel rounds it once too)."""
    if activation == "swigluoai":
        return "swigluoai_and_mul", {}
    return f"{activation}_and_mul", {"vllm_rounding": vllm}


def gated(h: Tensor, activation: str, vllm: bool = False) -> Tensor:
    """The activation ops' definition (fp32, one rounding to ``h``'s dtype; ``vllm``: vLLM's)."""
    from ..activation import op as act

    name, kw = gated_op(activation, vllm)
    out: Tensor = getattr(act, name).reference(h, **kw)
    return out


def _routes(topk_ids: Tensor, expert_map: Tensor | None) -> Tensor:
    """Each slot's local expert; an id the map does not cover (outside ``[0, G)``: checked on
    the CPU, skipped on CUDA as the routing skips it) gets -1, never an index into the map (a
    negative one would wrap, one past it a device-side assert)."""
    ids = topk_ids.long()
    if expert_map is None:
        return ids
    covered = (ids >= 0) & (ids < expert_map.numel())
    if not expert_map.numel():
        return torch.full_like(ids, -1)
    return torch.where(covered, expert_map.long()[torch.where(covered, ids, 0)], -1)


def _weights(w: Tensor, scale: Tensor | None, e: int) -> Tensor:
    return dequantize(w[e], scale[e]) if scale is not None else w[e]


def reference(
    hidden: Tensor,
    w1: Tensor,
    w2: Tensor,
    topk_weights: Tensor,
    topk_ids: Tensor,
    activation: str = "silu",
    apply_router_weight_on_input: bool = False,
    expert_map: Tensor | None = None,
    w1_scale: Tensor | None = None,
    w2_scale: Tensor | None = None,
    vllm_rounding: bool = False,
    out: Tensor | None = None,
) -> Tensor:
    """The definition: one expert at a time, in the module docstring's arithmetic."""
    dt = hidden.dtype
    # float32 sums; float64 for a float64 call (the parity harness's oracle)
    f = torch.float64 if dt == torch.float64 else torch.float32
    ids = _routes(topk_ids, expert_map)
    acc = torch.zeros(hidden.shape, dtype=f, device=hidden.device)
    for e in range(w1.shape[0]):
        tok, slot = (ids == e).nonzero(as_tuple=True)
        if not tok.numel():
            continue
        x = hidden[tok]
        weight = topk_weights[tok, slot].to(f)[:, None]
        xin = _qdq(x, vllm_rounding) if w1_scale is not None else x
        h = xin.to(f) @ _weights(w1, w1_scale, e).to(f).T
        if apply_router_weight_on_input:
            h = h * weight
        a = gated(h.to(dt), activation, vllm_rounding)
        ain = _qdq(a, vllm_rounding) if w2_scale is not None else a
        y = ain.to(f) @ _weights(w2, w2_scale, e).to(f).T
        if not apply_router_weight_on_input:
            y = y * weight
        acc.index_add_(0, tok, y.to(dt).to(f))
    y = acc.to(dt)
    return y if out is None else out.copy_(y)


def torch_experts(
    out: Tensor,
    hidden: Tensor,
    w1: Tensor,
    w2: Tensor,
    topk_weights: Tensor,
    topk_ids: Tensor,
    w1_scale: Tensor,
    w2_scale: Tensor,
    expert_map: Tensor,
    activation: str,
    apply_router_weight_on_input: bool,
    vllm_rounding: bool,
) -> None:
    """A per-expert loop of torch products (what a user without a kernel runs): in ``hidden``'s
    dtype where the weights are (torch's bf16 / fp16 GEMMs accumulate in fp32), on dequantized
    weights for fp8 (with the activations quantized as the definition says)."""
    dt = hidden.dtype
    fp8 = w1_scale.numel() > 0
    wide = dt == torch.float16
    ids = _routes(topk_ids, expert_map if expert_map.numel() else None)
    acc = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    for e in range(w1.shape[0]):
        tok, slot = (ids == e).nonzero(as_tuple=True)
        if not tok.numel():
            continue
        x = hidden[tok]
        weight = topk_weights[tok, slot][:, None]
        # a product that is weighted before its rounding is taken in fp32 for fp16 (rounded to
        # fp16 first, it would overflow to inf where the weighted one fits, as the definition's)
        if fp8:
            h = (_qdq(x, vllm_rounding) @ dequantize(w1[e], w1_scale[e]).T).to(dt)
        elif apply_router_weight_on_input and wide:
            h = x.float() @ w1[e].float().T
        else:
            h = x @ w1[e].T
        if apply_router_weight_on_input:
            h = (h.float() * weight).to(dt)
        a = gated(h, activation, vllm_rounding)
        if fp8:
            y = _qdq(a, vllm_rounding) @ dequantize(w2[e], w2_scale[e]).T
        elif wide and not apply_router_weight_on_input:
            y = a.float() @ w2[e].float().T
        else:
            y = (a @ w2[e].T).float()
        if not apply_router_weight_on_input:
            y = y * weight
        acc.index_add_(0, tok, y.to(dt).float())
    out.copy_(acc)
