"""The engines' fused MoE experts on ``moe.fused_experts``: argument mapping and the refusals.

opmux's op runs two forms: weights in ``hidden``'s dtype (bf16 / fp16 / fp32), and fp8 e4m3
weights with 128x128 block scales (the activations quantized per 1x128 group on the fly:
DeepSeek-V3's recipe, the engines' ``use_fp8_w8a8`` with ``block_shape=[128, 128]``). Every
other quantized form the engines' entry points take (int8 / int4 weights, per-tensor or
per-channel fp8, other block shapes, static activation scales, zero points, biases, mx / nv
formats) is refused with ``NotImplementedError`` naming the argument, never run approximately.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from opmux.kernels.ops._torch import torch

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["SUPPORTED", "refuse", "run"]

#: what the compat entry points run, quoted in every refusal
SUPPORTED = (
    "opmux runs weights in the activations' dtype (bf16 / fp16 / fp32), or use_fp8_w8a8 with "
    "block_shape [128, 128] (float8_e4m3fn weights, float32 128x128 block scales w1_scale "
    "[E, cdiv(2N, 128), cdiv(K, 128)] / w2_scale [E, cdiv(K, 128), cdiv(N, 128)], activations "
    "quantized per 1x128 group on the fly); activations silu, gelu, swigluoai"
)
ACTIVATIONS = ("silu", "gelu", "swigluoai")


def refuse(name: str, what: str) -> None:
    raise NotImplementedError(f"{name}: {what} is not supported by opmux; {SUPPORTED}")


def _moe() -> Any:
    import opmux.kernels.ops.moe as moe

    return moe


def run(
    name: str,
    hidden: Tensor,
    w1: Tensor,
    w2: Tensor,
    topk_weights: Tensor,
    topk_ids: Tensor,
    *,
    inplace: bool,
    activation: str,
    apply_router_weight_on_input: bool,
    expert_map: Tensor | None,
    use_fp8_w8a8: bool,
    block_shape: Sequence[int] | None,
    w1_scale: Tensor | None,
    w2_scale: Tensor | None,
    unsupported: Sequence[tuple[str, bool]] = (),
    vllm_rounding: bool = False,
) -> Tensor:
    """One call of ``moe.fused_experts`` for an engine's arguments. ``unsupported``: (what,
    present) pairs of the engine's other forms, refused when present. ``inplace`` writes the
    result into ``hidden`` (the op's ``out=hidden``) and returns it. ``vllm_rounding``: the op's
    vLLM rounding points (vLLM's entries: its activation and fp8 group quantization round so)."""
    for what, present in unsupported:
        if present:
            refuse(name, what)
    if activation not in ACTIVATIONS:
        refuse(name, f"activation {activation!r}")
    fp8 = torch.float8_e4m3fn
    if use_fp8_w8a8:
        if block_shape is None:
            refuse(name, "use_fp8_w8a8 without block_shape (per-tensor / per-channel fp8 scales)")
        if list(block_shape) != [128, 128]:  # type: ignore[arg-type]
            refuse(name, f"block_shape {list(block_shape)}")  # type: ignore[arg-type]
        if w1.dtype != fp8 or w2.dtype != fp8:
            refuse(name, f"use_fp8_w8a8 with w1 / w2 of dtype {w1.dtype} / {w2.dtype} (not float8_e4m3fn)")
        if w1_scale is None or w2_scale is None:
            raise ValueError(f"{name}: use_fp8_w8a8 needs w1_scale and w2_scale (128x128 block scales)")
    else:
        if block_shape is not None:
            refuse(name, f"block_shape {list(block_shape)} without use_fp8_w8a8")
        if w1.dtype == fp8 or w2.dtype == fp8:
            raise ValueError(
                f"{name}: w1 / w2 are float8_e4m3fn but use_fp8_w8a8 is not set; pass use_fp8_w8a8=True "
                "with block_shape [128, 128] and the block scales"
            )
        if w1_scale is not None or w2_scale is not None:
            refuse(name, "w1_scale / w2_scale without use_fp8_w8a8 (weight-only quantization)")
    if topk_weights.dtype != torch.float32:
        topk_weights = topk_weights.float()  # [M, topk]: the op reads float32 weights
    if topk_ids.dtype not in (torch.int32, torch.int64):
        topk_ids = topk_ids.long()
    if expert_map is not None and expert_map.dtype != torch.int32:
        expert_map = expert_map.int()
    for s in (w1_scale, w2_scale):
        if s is not None and s.dtype != torch.float32:
            refuse(name, f"block scales of dtype {s.dtype} (float32 only)")
    return _moe().fused_experts(  # type: ignore[no-any-return]
        hidden,
        w1,
        w2,
        topk_weights,
        topk_ids,
        activation,
        bool(apply_router_weight_on_input),
        expert_map,
        w1_scale if use_fp8_w8a8 else None,
        w2_scale if use_fp8_w8a8 else None,
        vllm_rounding,
        out=hidden if inplace else None,
    )


def route_softmax(
    gating_output: Tensor, topk: int, renormalize: bool, ids_dtype: Any = None
) -> tuple[Tensor, ...]:
    """Softmax top-k by ``moe.topk_softmax``: float32 weights, ids (int32 unless
    ``ids_dtype``) and vLLM's ``token_expert_indices``."""
    m, dev = gating_output.shape[0], gating_output.device
    w = torch.empty(m, topk, dtype=torch.float32, device=dev)
    ids = torch.empty(m, topk, dtype=torch.int32 if ids_dtype is None else ids_dtype, device=dev)
    tei = torch.empty(m, topk, dtype=torch.int32, device=dev)
    _moe().topk_softmax(
        gating_output, int(topk), bool(renormalize), topk_weights=w, topk_ids=ids, token_expert_indices=tei
    )
    return w, ids, tei
