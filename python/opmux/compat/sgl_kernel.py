"""sgl_kernel's names and signatures, running opmux's kernels (docs/compat.md).

``import opmux.compat.sgl_kernel as sgl_kernel`` (or the upstream-test shim) and call as you
would sgl_kernel: outputs go into the buffers you pass; ``enable_pdl`` is accepted wherever
sgl_kernel takes it and passed to the op (programmatic dependent launch on sm_90+; None = on
there, as FlashInfer's default; a no-op off CUDA). The conventions
are sgl_kernel's where they differ from opmux's native API: MoE alignment writes expert id 0 in
unused blocks (opmux: -1) and fills ``cumsum_buffer``. Importing this module imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opmux.kernels.ops._torch import torch

from . import _direct, _gemm
from . import _sgl_sampling as sampling
from ._attention import (
    build_unified_kv_indices,
    context_attention_fwd,
    decode_attention_fwd,
    decode_attention_fwd_grouped,
    decode_attention_fwd_normal,
    extend_attention_fwd,
    extend_attention_fwd_unified,
)
from ._sampling import (
    min_p_sampling_from_probs,
    top_k_mask_logits,
    top_k_renorm_probs,
    top_k_top_p_sampling_from_logits,
    top_k_top_p_sampling_from_probs,
    top_p_renorm_probs,
    top_p_sampling_from_probs,
)

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "FusedSetKVBufferArg",
    "apply_rope_with_cos_sin_cache_inplace",
    "build_unified_kv_indices",
    "context_attention_fwd",
    "decode_attention_fwd",
    "decode_attention_fwd_grouped",
    "decode_attention_fwd_normal",
    "extend_attention_fwd",
    "extend_attention_fwd_unified",
    "fp8_blockwise_scaled_mm",
    "fused_add_rmsnorm",
    "fused_experts",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "gemma_fused_add_rmsnorm",
    "gemma_rmsnorm",
    "min_p_sampling_from_probs",
    "moe_align_block_size",
    "moe_sum",
    "rmsnorm",
    "rotary_embedding",
    "sampling",
    "sgl_per_tensor_quant_fp8",
    "sgl_per_token_group_quant_8bit",
    "sgl_per_token_group_quant_fp8",
    "sgl_per_token_group_quant_int8",
    "sgl_per_token_quant_fp8",
    "silu_and_mul",
    "top_k_mask_logits",
    "top_k_renorm_prob",
    "top_k_renorm_probs",
    "top_k_top_p_sampling_from_logits",
    "top_k_top_p_sampling_from_probs",
    "top_p_renorm_prob",
    "top_p_renorm_probs",
    "top_p_sampling_from_probs",
    "topk_sigmoid",
    "topk_softmax",
    "w8a8_block_fp8_matmul",
]


def _ops(group: str) -> Any:
    import importlib

    return importlib.import_module(f"opmux.kernels.ops.{group}")


# -- norms ------------------------------------------------------------------------------------
def rmsnorm(
    input: Tensor,
    weight: Tensor,
    eps: float = 1e-6,
    out: Tensor | None = None,
    enable_pdl: bool | None = None,
) -> Tensor:
    """``out = input / RMS(input) * weight``; writes ``out`` when given."""
    return _ops("layernorm").rmsnorm(input, weight, float(eps), out, enable_pdl=enable_pdl)  # type: ignore[no-any-return]


def fused_add_rmsnorm(
    input: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6, enable_pdl: bool | None = None
) -> None:
    """``residual += input; input = residual / RMS(residual) * weight``, in place."""
    _ops("layernorm").fused_add_rmsnorm(input, residual, weight, float(eps), enable_pdl=enable_pdl)


def gemma_rmsnorm(
    input: Tensor,
    weight: Tensor,
    eps: float = 1e-6,
    out: Tensor | None = None,
    enable_pdl: bool | None = None,
) -> Tensor:
    """``out = input / RMS(input) * (1 + weight)``."""
    return _ops("layernorm").gemma_rmsnorm(input, weight, float(eps), out, enable_pdl=enable_pdl)  # type: ignore[no-any-return]


def gemma_fused_add_rmsnorm(
    input: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6, enable_pdl: bool | None = None
) -> None:
    _ops("layernorm").gemma_fused_add_rmsnorm(input, residual, weight, float(eps), enable_pdl=enable_pdl)


# -- activations ------------------------------------------------------------------------------
def _gated(name: str, input: Tensor, out: Tensor | None) -> Tensor:
    if input.shape[-1] * input.dtype.itemsize % 16 != 0:  # sgl_kernel's own precondition
        raise ValueError("The pointers must be multiple of 16 bytes.")
    if out is not None:  # sgl_kernel asserts these
        bad = AssertionError
        _direct.need(input.ndim == out.ndim, f"{input.ndim} != {out.ndim}", bad)
        _direct.need(input.shape[:-1] == out.shape[:-1], f"{input.shape[:-1]} != {out.shape[:-1]}", bad)
        _direct.need(input.shape[-1] == 2 * out.shape[-1], f"{input.shape[-1]} != {2 * out.shape[-1]}", bad)
    return getattr(_ops("activation"), name)(input, out=out)  # type: ignore[no-any-return]


def silu_and_mul(input: Tensor, out: Tensor | None = None) -> Tensor:
    return _gated("silu_and_mul", input, out)


def gelu_and_mul(input: Tensor, out: Tensor | None = None) -> Tensor:
    return _gated("gelu_and_mul", input, out)


def gelu_tanh_and_mul(input: Tensor, out: Tensor | None = None) -> Tensor:
    return _gated("gelu_tanh_and_mul", input, out)


# -- rotary embedding -------------------------------------------------------------------------
def rotary_embedding(
    positions: Tensor,
    query: Tensor,
    key: Tensor | None,
    head_size: int,
    cos_sin_cache: Tensor,
    is_neox: bool = True,
) -> None:
    """In place; ``key`` may be None (only ``query`` rotates)."""
    from ._rope import rope

    rope(positions, query, key, head_size, cos_sin_cache, is_neox)


@dataclass
class FusedSetKVBufferArg:
    """sgl_kernel's fused KV write: after rotation, ``k_buffer[cache_loc] = key`` and
    ``v_buffer[cache_loc] = value`` (rows of ``[*, num_heads * head_size]``)."""

    value: Tensor
    k_buffer: Tensor
    v_buffer: Tensor
    k_scale: float | None
    v_scale: float | None
    cache_loc: Tensor


def apply_rope_with_cos_sin_cache_inplace(
    positions: Tensor,
    query: Tensor,
    key: Tensor,
    head_size: int,
    cos_sin_cache: Tensor,
    is_neox: bool = True,
    fused_set_kv_buffer_arg: FusedSetKVBufferArg | None = None,
    enable_pdl: bool | None = None,
) -> None:
    """FlashInfer's rope (fp32 math, float32 cache), in place on ``query`` and ``key``."""
    if cos_sin_cache.dtype != torch.float32:
        raise ValueError("cos_sin_cache should be float32")
    a = fused_set_kv_buffer_arg
    if a is not None:
        _direct.need(a.k_scale is None, "k_scale is not yet supported")
        _direct.need(a.v_scale is None, "v_scale is not yet supported")
        _direct.need(a.cache_loc.dtype == torch.int64, f"a.cache_loc.dtype={a.cache_loc.dtype}")
    from ._rope import rope

    rope(positions.long(), query, key, head_size, cos_sin_cache, is_neox)
    if a is not None:
        loc = a.cache_loc
        a.k_buffer.view(a.k_buffer.shape[0], -1).index_copy_(0, loc, key.reshape(loc.numel(), -1))
        a.v_buffer.view(a.v_buffer.shape[0], -1).index_copy_(0, loc, a.value.reshape(loc.numel(), -1))


# -- fp8 / int8 quantization ------------------------------------------------------------------
# Every entry point is one opmux quantization op writing into the caller's buffers (out_q /
# out_scale): the op's contract checks them, its kernel writes them (no copy, no torch path).
def _quant() -> Any:
    return _ops("quantization")


def _bounds(op: str, names: str, got: tuple[float, float], want: tuple[float, float]) -> None:
    _direct.need(
        (float(got[0]), float(got[1])) == want,
        f"{op}: {names} must be {want[0]:g}/{want[1]:g}, got {got[0]}/{got[1]}",
    )


def sgl_per_token_quant_fp8(input: Tensor, output_q: Tensor, output_s: Tensor) -> None:
    """Per-token dynamic fp8 into ``output_q`` and ``output_s`` ([T] or [T, 1]):
    scale = max(amax / 448, 1 / (448 * 512)), q = x / scale. sgl's kernel multiplies by the
    reciprocal, but its own test compares it with vLLM's (which divides) at 1e-3, i.e. bit for
    bit: the kernel divides here (the op's ``divide_by_scale``), so both engines' names agree."""
    _quant().per_token_quant_fp8(input, None, True, output_q, output_s)


def sgl_per_token_group_quant_fp8(
    input: Tensor,
    output_q: Tensor,
    output_s: Tensor,
    group_size: int,
    eps: float,
    fp8_min: float,
    fp8_max: float,
    scale_ue8m0: bool = False,
) -> None:
    """Per-token-group dynamic fp8 into ``output_q`` / ``output_s``: float32 scales with any
    strides (row-major, column-major, TMA-aligned column-major); with ``scale_ue8m0`` the
    scales are rounded up to powers of two and an int32 ``output_s`` receives sgl's packed
    layout (four UE8M0 exponent bytes per int32, ``[T, ceil(G / 4)]``)."""
    _bounds("sgl_per_token_group_quant_fp8", "fp8_min/fp8_max", (fp8_min, fp8_max), (-448.0, 448.0))
    _quant().per_token_group_quant_fp8(
        input, int(group_size), float(eps), False, False, bool(scale_ue8m0), False, output_q, output_s
    )


def sgl_per_token_group_quant_int8(
    input: Tensor,
    output_q: Tensor,
    output_s: Tensor,
    group_size: int,
    eps: float,
    int8_min: float,
    int8_max: float,
) -> None:
    """Per-token-group int8 into ``output_q`` / ``output_s``: scale = max(group amax, eps) / 127,
    q = trunc(clamp(x * (1 / scale), -128, 127)) (sgl-kernel's int8_t conversion truncates)."""
    _bounds("sgl_per_token_group_quant_int8", "int8_min/int8_max", (int8_min, int8_max), (-128.0, 127.0))
    _quant().per_token_group_quant_int8(input, int(group_size), float(eps), False, False, output_q, output_s)


def sgl_per_token_group_quant_8bit(
    input: Tensor,
    output_q: Tensor,
    output_s: Tensor,
    group_size: int,
    eps: float,
    fp8_min: float,
    fp8_max: float,
    scale_ue8m0: bool = False,
    fuse_silu_and_mul: bool = False,
    masked_m: Tensor | None = None,
    enable_v2: bool | None = None,
) -> None:
    """sgl_kernel's 8-bit group quant: fp8 or int8 by ``output_q``'s dtype. ``fuse_silu_and_mul``
    quantizes ``silu(x[..., :d]) * x[..., d:]`` with sgl's rounding (the activation rounded to
    the input dtype, the product in the input dtype; torch, then the op); ``masked_m`` ([E] for a [E, M, ...] input) quantizes the
    first ``masked_m[e]`` rows of each expert e, leaves the other rows of ``output_q`` as they
    are and sets their scales to 0 (the scale layout sgl's reference builds: a buffer of zeros
    filled for the valid rows; reads ``masked_m`` on the host). ``enable_v2`` (sgl's kernel
    choice) changes nothing here."""
    if masked_m is not None:
        _direct.need(
            input.dim() == 3,
            f"sgl_per_token_group_quant_8bit: masked_m needs a 3-D input, got {input.dim()}-D",
        )
        _direct.need(
            isinstance(masked_m, torch.Tensor) and masked_m.dim() == 1,
            "sgl_per_token_group_quant_8bit: masked_m must be a 1-D tensor of per-expert counts",
        )
        _direct.need(
            output_s.dim() == 3 and output_s.shape[:2] == input.shape[:2],
            f"sgl_per_token_group_quant_8bit: output_s has shape {tuple(output_s.shape)}, expected "
            f"[{input.shape[0]}, {input.shape[1]}, ...] like input",
        )
        counts = masked_m.tolist()
        # sgl-kernel reads masked_m[e] for e < E and runs rows < masked_m[e]: extra entries are
        # ignored there and a negative count runs nothing; a count past M would write past the
        # buffers, refused here
        _direct.need(
            len(counts) >= input.shape[0] and all(m <= input.shape[1] for m in counts[: input.shape[0]]),
            f"sgl_per_token_group_quant_8bit: masked_m must hold {input.shape[0]} counts of at most "
            f"{input.shape[1]}, got {counts}",
        )
        counts = [max(0, m) for m in counts[: input.shape[0]]]
        for e, m in enumerate(counts):
            if m < output_s.shape[1]:
                output_s[e, m:].zero_()  # the rows the mask leaves out
        for e, m in enumerate(counts):
            if m > 0:
                sgl_per_token_group_quant_8bit(
                    input[e, :m], output_q[e, :m], output_s[e, :m], group_size, eps, fp8_min, fp8_max,
                    scale_ue8m0, fuse_silu_and_mul,
                )  # fmt: skip
        return
    if fuse_silu_and_mul:  # sgl's rounding: silu(gate) in fp32 rounded to the input dtype, * up in that dtype
        d = input.shape[-1] // 2
        act = torch.nn.functional.silu(input[..., :d].float()).to(input.dtype)
        input = act * input[..., d:]
    if output_q.dtype == torch.int8:
        sgl_per_token_group_quant_int8(input, output_q, output_s, group_size, eps, fp8_min, fp8_max)
    else:
        sgl_per_token_group_quant_fp8(
            input, output_q, output_s, group_size, eps, fp8_min, fp8_max, scale_ue8m0
        )


def sgl_per_tensor_quant_fp8(input: Tensor, output_q: Tensor, output_s: Tensor, is_static: bool) -> None:
    """Per-tensor fp8 into ``output_q``: with ``is_static`` ``output_s`` holds the scale, else
    the kernel writes ``amax / 448`` into it; q = x * (1 / scale)."""
    _quant().per_tensor_quant_fp8(input, output_s if is_static else None, output_q, output_s)


# -- MoE ----------------------------------------------------------------------------------------
_TK = "moe.topk_softmax"
_AL = "moe.moe_align_block_size"


def topk_softmax(
    topk_weights: Tensor,
    topk_ids: Tensor,
    gating_output: Tensor,
    renormalize: bool | Tensor = False,
    moe_softcapping: float = 0.0,
    correction_bias: Tensor | None = None,
) -> None:
    """Top-k of softmax(gating_output) into ``topk_weights`` (float32) and ``topk_ids`` (int32
    or int64, both written by the kernel). sgl-kernel's ``correction_bias`` is added to the
    (softcapped) logits before the softmax. The older sgl_kernel form ``topk_softmax(topk_weights,
    topk_ids, token_expert_indices, gating_output)`` is accepted too (told apart by a tensor in
    the fourth place); the kernel fills ``token_expert_indices`` there."""
    from ._moe import topk

    if isinstance(renormalize, torch.Tensor):  # (weights, ids, token_expert_indices, gating_output)
        topk(
            topk_weights, topk_ids, gating_output, renormalize, False, moe_softcapping, correction_bias, True
        )
        return
    topk(
        topk_weights, topk_ids, None, gating_output, bool(renormalize), moe_softcapping, correction_bias, True
    )


def topk_sigmoid(
    topk_weights: Tensor,
    topk_ids: Tensor,
    gating_output: Tensor,
    renormalize: bool = False,
    correction_bias: Tensor | None = None,
    routed_scaling_factor: float = 1.0,
    num_fused_shared_experts: int = 0,
) -> None:
    """Top-k of sigmoid(gating_output) into ``topk_weights`` (float32) and ``topk_ids`` (int32
    or int64, both written by the kernel): opmux ``moe.topk_sigmoid``. ``correction_bias``
    (DeepSeek-V3 noaux_tc, sgl-kernel's meaning): the experts are chosen by sigmoid + bias and
    weighted by the plain sigmoid. The later sgl-kernel arguments are accepted at their
    defaults only: a scaling factor or fused shared experts raise ``NotImplementedError``."""
    from ._moe import topk_sigmoid as route

    if routed_scaling_factor != 1.0:
        raise NotImplementedError(
            f"topk_sigmoid: routed_scaling_factor={routed_scaling_factor!r} is not supported by "
            "opmux (valid: 1.0); scale topk_weights after the call"
        )
    if num_fused_shared_experts != 0:
        raise NotImplementedError(
            f"topk_sigmoid: num_fused_shared_experts={num_fused_shared_experts!r} is not supported "
            "by opmux (valid: 0)"
        )
    route(topk_weights, topk_ids, None, gating_output, bool(renormalize), correction_bias)


def moe_sum(input_tensor: Tensor, output_tensor: Tensor) -> None:
    """``output = input.sum(dim=1)`` over the top-k copies (torch: opmux has no such op)."""
    torch.sum(input_tensor, dim=1, out=output_tensor)


def moe_align_block_size(
    topk_ids: Tensor,
    num_experts: int,
    block_size: int,
    sorted_token_ids: Tensor,
    experts_ids: Tensor,
    num_tokens_post_pad: Tensor,
    cumsum_buffer: Tensor,
    pad_sorted_token_ids: bool = False,
) -> None:
    """vLLM/sgl layout, written by the kernel into the caller's buffers: unused blocks get
    expert 0; with ``pad_sorted_token_ids`` every unused slot of ``sorted_token_ids`` gets
    ``topk_ids.numel()`` (without it they keep what the caller put there, as sgl-kernel does);
    ``cumsum_buffer[e]`` is expert e's first padded slot (``cumsum_buffer[E]`` the total).
    ``topk_ids`` is read as sgl-kernel reads it: ``numel`` ids from its data pointer."""
    from ._moe import align

    align(
        topk_ids,
        num_experts,
        block_size,
        sorted_token_ids,
        experts_ids,
        num_tokens_post_pad,
        cumsum_buffer,
        pad_sorted_token_ids,
    )


#: (E, device) -> [0, 1, ..., E-1, -1]: sgl's expert id -1 ("not on this rank") as a map entry
_SKIP_MAPS: dict[tuple[int, Any], Tensor] = {}


def _skip_minus_one(topk_ids: Tensor, experts: int) -> tuple[Tensor, Tensor]:
    """sgl's ``filter_expert``: ids of -1 contribute nothing. The op takes ids in range, so -1
    becomes E (``remainder``) and an expert map sends E to -1, the op's "other rank"."""
    key = (experts, topk_ids.device)
    emap = _SKIP_MAPS.get(key)
    if emap is None:
        emap = torch.arange(experts + 1, dtype=torch.int32, device=topk_ids.device)
        emap[experts] = -1
        _SKIP_MAPS[key] = emap
    return torch.remainder(topk_ids, experts + 1), emap


def fused_experts(
    hidden_states: Tensor,
    w1: Tensor,
    w2: Tensor,
    topk_output: Any,
    moe_runner_config: Any,
    b1: Tensor | None = None,
    b2: Tensor | None = None,
    use_fp8_w8a8: bool = False,
    use_int8_w8a8: bool = False,
    use_int8_w8a16: bool = False,
    use_int4_w4a16: bool = False,
    per_channel_quant: bool = False,
    w1_scale: Tensor | None = None,
    w2_scale: Tensor | None = None,
    w1_zp: Tensor | None = None,
    w2_zp: Tensor | None = None,
    a1_scale: Tensor | None = None,
    a2_scale: Tensor | None = None,
    block_shape: list[int] | None = None,
) -> Tensor:
    """SGLang's ``fused_experts`` (``sglang.srt.layers.moe.fused_moe_triton.fused_moe``):
    ``topk_output`` a ``StandardTopKOutput`` (or any ``(topk_weights, topk_ids, ...)``), the
    runner's ``MoeRunnerConfig`` read by attribute (``activation``, ``inplace``,
    ``apply_router_weight_on_input``, ``routed_scaling_factor``, ``num_experts`` /
    ``num_local_experts``, ...); opmux's ``moe.fused_experts``. Unquantized weights, or
    ``use_fp8_w8a8`` with ``block_shape=[128, 128]``; every other form (int8 / int4, per-tensor
    or per-channel fp8, static activation scales, zero points, biases ``b1`` / ``b2``,
    ``no_combine``, non-gated experts, a custom swiglu alpha / limit) raises
    ``NotImplementedError``. As SGLang, ids of -1 (experts of another rank) are skipped unless
    the config says every expert is local (``num_experts == num_local_experts``).
    ``routed_scaling_factor`` scales the routing weights (SGLang scales the sum: the same up to
    the last rounding); with ``apply_router_weight_on_input`` it scales the result, as SGLang's."""
    from . import _experts

    topk_weights, topk_ids = topk_output[0], topk_output[1]
    cfg = moe_runner_config
    act = getattr(cfg, "activation", "silu")
    alpha = getattr(cfg, "gemm1_alpha", None)
    limit = getattr(cfg, "gemm1_clamp_limit", None)
    custom_swiglu = (
        (alpha not in (None, 1.702) or limit not in (None, 7.0))
        if act == "swigluoai"
        else (alpha is not None or limit is not None)
    )
    unsupported = [
        ("use_int8_w8a8", use_int8_w8a8),
        ("use_int8_w8a16", use_int8_w8a16),
        ("use_int4_w4a16", use_int4_w4a16),
        ("per_channel_quant", per_channel_quant),
        ("w1_zp / w2_zp (zero points)", w1_zp is not None or w2_zp is not None),
        ("a1_scale / a2_scale (static activation scales)", a1_scale is not None or a2_scale is not None),
        ("b1 / b2 (expert biases)", b1 is not None or b2 is not None),
        ("moe_runner_config.no_combine", bool(getattr(cfg, "no_combine", False))),
        ("moe_runner_config.is_gated=False", not getattr(cfg, "is_gated", True)),
        (
            f"gemm1_alpha {alpha} / gemm1_clamp_limit {limit} (swigluoai's 1.702 / 7.0 only)",
            custom_swiglu,
        ),
        ("moe_runner_config.swiglu_limit", getattr(cfg, "swiglu_limit", None) is not None),
    ]
    for what, present in unsupported:
        if present:
            _experts.refuse("fused_experts", what)
    scale = getattr(cfg, "routed_scaling_factor", None)
    scale = 1.0 if scale is None else float(scale)
    on_input = bool(getattr(cfg, "apply_router_weight_on_input", False))
    if scale != 1.0 and not on_input:  # linear in the weights there: one rounding, as SGLang's
        topk_weights = topk_weights.float() * scale
    num, local = getattr(cfg, "num_experts", None), getattr(cfg, "num_local_experts", None)
    expert_map = None
    if num is None or num != local:
        topk_ids, expert_map = _skip_minus_one(topk_ids, w1.shape[0])
    out = _experts.run(
        "fused_experts",
        hidden_states,
        w1,
        w2,
        topk_weights,
        topk_ids,
        inplace=bool(getattr(cfg, "inplace", True)),
        activation=act,
        apply_router_weight_on_input=on_input,
        expert_map=expert_map,
        use_fp8_w8a8=use_fp8_w8a8,
        block_shape=block_shape,
        w1_scale=w1_scale,
        w2_scale=w2_scale,
    )
    # the router weight went on the input (before the gated activation): the factor scales the
    # combined output, as SGLang's moe_sum_reduce does
    return out.mul_(scale) if scale != 1.0 and on_input else out


# -- block-scaled fp8 GEMM ---------------------------------------------------------------------
def fp8_blockwise_scaled_mm(
    mat_a: Tensor, mat_b: Tensor, scales_a: Tensor, scales_b: Tensor, out_dtype: Any
) -> Tensor:
    """sgl-kernel's CUTLASS entry: mat_b [K, N] column-major, scales_b [K/128, N/128]."""
    return _gemm.column_major_matmul(
        "fp8_blockwise_scaled_mm", mat_a, mat_b, scales_a, scales_b, out_dtype, None
    )


def w8a8_block_fp8_matmul(
    A: Tensor, B: Tensor, As: Tensor, Bs: Tensor, block_size: list[int], output_dtype: Any = None
) -> Tensor:
    """SGLang's Triton entry (sglang.srt.layers.quantization.fp8_kernel)."""
    dtype = torch.float16 if output_dtype is None else output_dtype
    return _gemm.triton_block_matmul("w8a8_block_fp8_matmul", A, B, As, Bs, block_size, dtype)


# -- sampling (FlashInfer's kernels in sgl_kernel; opmux.compat._sampling) -------------------------
#: sgl_kernel's singular aliases
top_k_renorm_prob = top_k_renorm_probs
top_p_renorm_prob = top_p_renorm_probs
