"""``vllm._custom_ops`` names and signatures (and the ``torch.ops._C`` activations), running
opmux's kernels (docs/compat.md).

The conventions are vLLM's where they differ from opmux's native API: the activations and
rotary_embedding run their ops' ``vllm_rounding`` kernel mode (the gated activations round the
activation to the input dtype before the product, as vLLM's kernels do, bit for bit); dynamic
per-token and group fp8 quantization divide by the scale (opmux multiplies by its
reciprocal), static and per-tensor quantization multiply by the reciprocal (as vLLM does); MoE
alignment writes expert id 0 in unused blocks; ``topk_softmax`` fills ``token_expert_indices``.
Importing this module imports no torch.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from opmux.kernels.ops._torch import torch

from . import _direct, _fp8, _gemm
from ._attention import chunked_prefill_paged_decode, unified_attention
from ._attention import vllm_context_attention_fwd as context_attention_fwd
from ._attention import vllm_decode_attention_fwd as decode_attention_fwd

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "batched_moe_align_block_size",
    "chunked_prefill_paged_decode",
    "concat_and_cache_mla",
    "context_attention_fwd",
    "convert_fp8",
    "copy_blocks",
    "copy_blocks_mla",
    "cutlass_scaled_mm",
    "decode_attention_fwd",
    "dynamic_per_token_scaled_fp8_quant",
    "dynamic_scaled_fp8_quant",
    "fatrelu_and_mul",
    "fused_add_rms_norm",
    "fused_add_rms_norm_static_fp8_quant",
    "fused_experts",
    "fused_moe",
    "fused_topk",
    "gather_cache",
    "gelu_and_mul",
    "gelu_fast",
    "gelu_new",
    "gelu_quick",
    "gelu_tanh_and_mul",
    "gemma_fused_add_rms_norm",
    "gemma_rms_norm",
    "moe_align_block_size",
    "mul_and_silu",
    "per_token_group_quant_fp8",
    "reshape_and_cache",
    "reshape_and_cache_flash",
    "rms_norm",
    "rms_norm_static_fp8_quant",
    "rotary_embedding",
    "scaled_fp8_quant",
    "silu_and_mul",
    "static_scaled_fp8_quant",
    "swap_blocks",
    "swigluoai_and_mul",
    "swiglustep_and_mul_triton",
    "topk_sigmoid",
    "topk_softmax",
    "unified_attention",
    "w8a8_block_fp8_matmul",
    "w8a8_triton_block_scaled_mm",
]

_ONES: dict[tuple[Any, ...], Tensor] = {}


def _ops(group: str) -> Any:
    import importlib

    return importlib.import_module(f"opmux.kernels.ops.{group}")


def _weight(weight: Tensor | None, input: Tensor) -> Tensor:
    """vLLM accepts ``weight=None`` (no scaling): a cached vector of ones."""
    if weight is not None:
        return weight
    key = (input.shape[-1], input.dtype, input.device)
    ones = _ONES.get(key)
    if ones is None:
        ones = _ONES[key] = torch.ones(input.shape[-1], dtype=input.dtype, device=input.device)
    return ones


# -- norms ------------------------------------------------------------------------------------
def rms_norm(out: Tensor, input: Tensor, weight: Tensor | None, epsilon: float) -> None:
    _ops("layernorm").rmsnorm(input, _weight(weight, input), float(epsilon), out)


def fused_add_rms_norm(input: Tensor, residual: Tensor, weight: Tensor | None, epsilon: float) -> None:
    _ops("layernorm").fused_add_rmsnorm(input, residual, _weight(weight, input), float(epsilon))


def gemma_rms_norm(out: Tensor, input: Tensor, weight: Tensor, epsilon: float) -> None:
    """vLLM's ``GemmaRMSNorm`` (``x * rsqrt(mean(x^2) + eps) * (1 + w)``, the multiply in fp32)
    in ``rms_norm``'s form: opmux's ``layernorm.gemma_rmsnorm`` into ``out``."""
    _ops("layernorm").gemma_rmsnorm(input, weight, float(epsilon), out)


def gemma_fused_add_rms_norm(input: Tensor, residual: Tensor, weight: Tensor, epsilon: float) -> None:
    """In place, ``fused_add_rms_norm``'s form: ``residual += input``, ``input =
    gemma_rmsnorm(residual)`` (opmux's ``layernorm.gemma_fused_add_rmsnorm``; the residual keeps
    the input dtype)."""
    _ops("layernorm").gemma_fused_add_rmsnorm(input, residual, weight, float(epsilon))


def rms_norm_static_fp8_quant(
    out: Tensor, input: Tensor, weight: Tensor, scale: Tensor, epsilon: float
) -> None:
    """``out = fp8(rms_norm(input) * (1 / scale))``, ``scale`` one float32 element: opmux's
    ``layernorm.rmsnorm_static_quant_fp8`` into ``out``. The norm is rounded to the input dtype
    before the quantization, as vLLM's kernel does, so ``out`` is bit-equal to ``rms_norm``
    followed by ``static_scaled_fp8_quant`` (what vLLM's test compares it with)."""
    _ops("layernorm").rmsnorm_static_quant_fp8(input, weight, scale, float(epsilon), out)


def fused_add_rms_norm_static_fp8_quant(
    out: Tensor, input: Tensor, residual: Tensor, weight: Tensor, scale: Tensor, epsilon: float
) -> None:
    """``residual += input`` (in place), ``out = fp8(rms_norm(residual) * (1 / scale))``;
    ``input`` is only read (vLLM's kernel leaves it as it is): opmux's
    ``layernorm.fused_add_rmsnorm_static_quant_fp8``."""
    _ops("layernorm").fused_add_rmsnorm_static_quant_fp8(input, residual, weight, scale, float(epsilon), out)


# -- activations (torch.ops._C.<name>(out, input)) --------------------------------------------
def _gated(name: str, out: Tensor, input: Tensor) -> None:
    """vLLM computes ``act(x)`` in fp32 (IEEE ``expf`` / ``erff`` / ``tanhf`` and division), rounds
    it to the input dtype, then multiplies in the input dtype (a second rounding; float32 has
    nothing to round): opmux's activation op in its ``vllm_rounding`` kernel mode, into ``out``.
    CPU tensors take vLLM's CPU form instead (``_cpu_native``)."""
    if isinstance(input, torch.Tensor) and input.device.type == "cpu":
        _cpu_native(name, out, input)
    else:
        getattr(_ops("activation"), name)(input, True, out)


#: op name -> vLLM's CPU form behind the op's contract (made on first use)
_CPU_FORMS: dict[str, Any] = {}


def _cpu_native(name: str, out: Tensor, input: Tensor) -> None:
    """vLLM's layers on its CPU platform: ``SiluAndMul`` and ``MulAndSilu`` run their
    ``forward_native`` there (``vllm/model_executor/layers/activation.py``), i.e. torch's CPU
    ``F.silu`` / ``F.gelu`` on the strided half and the product in the input dtype, and vLLM's
    test compares every gated activation with that expression bit for bit (``atol=0``). torch's
    CPU vector math (Sleef ``expf``, ATen's ``erf`` / ``tanh``) is not an algorithm a kernel of
    ours reproduces, so on the CPU these entries evaluate the same torch expressions, written
    into ``out`` (``torch.mul(..., out=out)``, no copy), behind the op's whole contract
    (``with_contract``: its checks, then the generic guard), so the errors are the op's. For
    opmux's faster CPU kernel call the op itself."""
    form = _CPU_FORMS.get(name)
    if form is None:
        from opmux.kernels.fused_op import with_contract
        from opmux.kernels.ops.activation import op as decls

        form = _CPU_FORMS[name] = with_contract(getattr(decls, name), partial(_forward_native, name))
    form(input, True, out)


def _forward_native(name: str, x: Tensor, vllm_rounding: bool, out: Tensor) -> None:
    F = torch.nn.functional
    d = x.shape[-1] // 2
    gate, up = (x[..., d:], x[..., :d]) if name == "mul_and_silu" else (x[..., :d], x[..., d:])
    # inference mode: an ``out`` made under it may be written outside it, as the op's kernels do
    with torch.inference_mode():
        if name in ("silu_and_mul", "mul_and_silu"):
            act = F.silu(gate)
        else:
            act = F.gelu(gate, approximate="tanh" if name == "gelu_tanh_and_mul" else "none")
        if name == "mul_and_silu":
            torch.mul(up, act, out=out)  # forward_native: x[..., :d] * F.silu(x[..., d:])
        else:
            torch.mul(act, up, out=out)


def silu_and_mul(out: Tensor, input: Tensor) -> None:
    _gated("silu_and_mul", out, input)


def gelu_and_mul(out: Tensor, input: Tensor) -> None:
    _gated("gelu_and_mul", out, input)


def gelu_tanh_and_mul(out: Tensor, input: Tensor) -> None:
    _gated("gelu_tanh_and_mul", out, input)


def mul_and_silu(out: Tensor, input: Tensor) -> None:
    """``input[..., :d] * silu(input[..., d:])`` in vLLM's rounding: opmux's
    ``activation.mul_and_silu`` with ``vllm_rounding=True`` (silu by IEEE expf and division,
    rounded to the input dtype, then the product in that dtype), into ``out``."""
    _gated("mul_and_silu", out, input)


def fatrelu_and_mul(out: Tensor, input: Tensor, threshold: float = 0.0) -> None:
    """``threshold(input[..., :d]) * input[..., d:]``: opmux's ``activation.fatrelu_and_mul``
    (one rounding of an exact product: the same bits as vLLM's kernel)."""
    _ops("activation").fatrelu_and_mul(input, float(threshold), out)


def swigluoai_and_mul(out: Tensor, input: Tensor, alpha: float = 1.702, limit: float = 7.0) -> None:
    """gpt-oss's clamped SwiGLU over interleaved (gate, up) pairs: opmux's
    ``activation.swigluoai_and_mul`` into ``out``."""
    _ops("activation").swigluoai_and_mul(input, float(alpha), float(limit), out)


def swiglustep_and_mul_triton(output: Tensor, input: Tensor, limit: float = 7.0) -> None:
    """vLLM's Triton op (``vllm.model_executor.layers.activation``): ``min(silu(gate), limit) *
    clamp(up, -limit, limit)`` into ``output``, opmux's ``activation.swiglustep_and_mul``."""
    _ops("activation").swiglustep_and_mul(input, float(limit), output)


def gelu_new(out: Tensor, input: Tensor) -> None:
    """opmux's ``activation.gelu_new`` in vLLM's rounding (``vllm_rounding=True``: each step of
    vLLM's ``gelu_new_kernel`` rounded to the input dtype, as it and its test's reference do)."""
    _ops("activation").gelu_new(input, True, out)


def gelu_fast(out: Tensor, input: Tensor) -> None:
    """opmux's ``activation.gelu_fast`` in vLLM's rounding (``gelu_fast_kernel``'s steps)."""
    _ops("activation").gelu_fast(input, True, out)


def gelu_quick(out: Tensor, input: Tensor) -> None:
    """opmux's ``activation.gelu_quick`` (float math, one rounding: vLLM's kernel's too)."""
    _ops("activation").gelu_quick(input, out)


# -- rotary embedding -------------------------------------------------------------------------
def rotary_embedding(
    positions: Tensor,
    query: Tensor,
    key: Tensor | None,
    head_size: int,
    cos_sin_cache: Tensor,
    is_neox: bool,
    rope_dim_offset: int = 0,
    inverse: bool = False,
) -> None:
    """In place on ``query`` and ``key`` (``key=None``: query only), in vLLM's rounding: opmux's
    ``rope.rotary_embedding`` with ``vllm_rounding=True`` (cos / sin, each product and each sum
    rounded to the input dtype, as vLLM's kernel and its test's reference compute in it)."""
    if rope_dim_offset or inverse:
        raise NotImplementedError("rotary_embedding: rope_dim_offset and inverse are not supported by opmux")
    from ._rope import rope

    rope(positions, query, key, head_size, cos_sin_cache, is_neox, vllm_rounding=True)


# -- fp8 quantization -------------------------------------------------------------------------
# Each entry point is one opmux quantization op writing into the caller's buffers (out_q /
# out_scale). vLLM's per-token and group kernels divide by the scale: the ops' divide_by_scale
# does that in the kernel, bit-equal; static and per-tensor quantization multiply by the
# reciprocal, as vLLM's do.
def _quant() -> Any:
    return _ops("quantization")


def _rows_of(out: Tensor, input: Tensor) -> tuple[Tensor, Tensor]:
    """``input`` as [T, H] rows and the first T rows of ``out`` (vLLM pads ``out``'s rows)."""
    h = input.shape[-1]
    x = input if input.dim() == 2 else input.reshape(-1, h)
    t = x.shape[0]
    _direct.need(
        out.dim() >= 1 and out.shape[-1] == h and out.numel() >= t * h,
        f"vllm fp8 quant: out has shape {tuple(out.shape)} for input {tuple(input.shape)}",
    )
    q = out if out.shape == x.shape else out.view(-1, h)[:t]
    return x, q


def dynamic_per_token_scaled_fp8_quant(
    out: Tensor, input: Tensor, scales: Tensor, scale_ub: Tensor | None = None
) -> None:
    """``scales[t] = max(min(amax_t, ub) / 448, 1 / (448 * 512))``, ``out = fp8(x / scale)``
    (vLLM divides: the op's ``divide_by_scale``), both written by opmux's kernel."""
    x, q = _rows_of(out, input)
    t = x.shape[0]
    s = scales if scales.numel() == t else scales.view(-1)[:t]
    _quant().per_token_quant_fp8(x, scale_ub, True, q, s)


def dynamic_scaled_fp8_quant(out: Tensor, input: Tensor, scale: Tensor) -> None:
    """Per-tensor: ``scale = amax / 448`` (written to its first element: vLLM's opcheck passes a
    [T, 1] buffer), ``out = fp8(x * (1 / scale))``."""
    x, q = _rows_of(out, input)
    _quant().per_tensor_quant_fp8(x, None, q, scale if scale.numel() == 1 else scale.view(-1)[:1])


def _static_scales(scale: Tensor, t: int, h: int, group_shape: Any) -> Tensor:
    """vLLM's static scales as opmux's [Gm, Gn] block scales: one element (per tensor), 1-D per
    token ([T], ``group_shape`` (1, -1)) or per channel ([H], (-1, 1)), or 2-D as given."""
    if scale.dim() != 1 or scale.numel() == 1:
        return scale
    per_channel = group_shape is not None and group_shape[0] != 1
    if group_shape is None:
        per_channel = scale.numel() == h and scale.numel() != t
    return scale.view(1, -1) if per_channel else scale.view(-1, 1)


def static_scaled_fp8_quant(out: Tensor, input: Tensor, scale: Tensor, group_shape: Any = None) -> None:
    """``out = fp8(x * (1 / scale))`` with a static scale: one element, per token, per channel or
    2-D group scales (``group_shape``), by opmux's ``static_quant_fp8`` kernel."""
    x, q = _rows_of(out, input)
    _quant().static_quant_fp8(x, _static_scales(scale, x.shape[0], x.shape[1], group_shape), q)


def scaled_fp8_quant(
    input: Tensor,
    scale: Tensor | None = None,
    num_token_padding: int | None = None,
    scale_ub: Tensor | None = None,
    use_per_token_if_dynamic: bool = False,
    output: Tensor | None = None,
    group_shape: Any = None,
) -> tuple[Tensor, Tensor]:
    """vLLM's entry point: static (``scale`` given: per tensor, per token, per channel or 2-D
    groups, ``group_shape``), dynamic per-tensor, or dynamic per-token; ``num_token_padding``
    pads the output rows; ``output`` is written when given."""
    assert input.ndim == 2, f"input must be 2D, got {input.ndim}D"
    shape: tuple[int, ...] = tuple(input.shape)
    if num_token_padding:
        shape = (max(num_token_padding, input.shape[0]), shape[1])
    if output is None:
        output = torch.empty(shape, device=input.device, dtype=torch.float8_e4m3fn)
    else:
        assert num_token_padding is None, "padding not supported if output passed in"
        assert output.dtype == torch.float8_e4m3fn
    if scale is None:
        if use_per_token_if_dynamic:
            scale = torch.empty((shape[0], 1), device=input.device, dtype=torch.float32)
            dynamic_per_token_scaled_fp8_quant(output, input.contiguous(), scale, scale_ub)
        else:
            scale = torch.empty(1, device=input.device, dtype=torch.float32)
            dynamic_scaled_fp8_quant(output, input, scale)
    else:
        static_scaled_fp8_quant(output, input, scale, group_shape)
    return output, scale


def per_token_group_quant_fp8(
    x: Tensor,
    group_size: int,
    eps: float = 1e-10,
    dtype: Any = None,
    column_major_scales: bool = False,
    tma_aligned_scales: bool = False,
    out_q: Tensor | None = None,
    use_ue8m0: bool | None = None,
) -> tuple[Tensor, Tensor]:
    """vLLM's ``fp8_utils.per_token_group_quant_fp8``: ``scale = max(group amax, eps) / 448`` (on
    CUDA ``* fp32(1 / 448)``, vLLM's arithmetic there: the op's ``divide_by_scale``)
    (``use_ue8m0``: rounded up to a power of two), ``q = fp8(x / scale)`` (vLLM divides), by
    opmux's kernel into ``out_q`` when given; scales row-major, column-major or TMA-aligned
    column-major."""
    if dtype is not None and dtype != torch.float8_e4m3fn:
        raise NotImplementedError(f"per_token_group_quant_fp8: dtype {dtype} (opmux: float8_e4m3fn only)")
    return _quant().per_token_group_quant_fp8(  # type: ignore[no-any-return]
        x,
        int(group_size),
        float(eps),
        bool(column_major_scales),
        bool(tma_aligned_scales and column_major_scales),
        bool(use_ue8m0),
        True,
        out_q,
        None,
    )


# -- MoE ----------------------------------------------------------------------------------------
def topk_softmax(
    topk_weights: Tensor,
    topk_ids: Tensor,
    token_expert_indices: Tensor,
    gating_output: Tensor,
    renormalize: bool = False,
    e_score_correction_bias: Tensor | None = None,
) -> None:
    """vLLM's top-k softmax, written by the kernel into ``topk_weights``, ``topk_ids`` (int32
    or int64) and ``token_expert_indices`` (``[i, j] = j * T + i``); ``e_score_correction_bias``
    chooses the experts by softmax + bias and weights them by the softmax."""
    from ._moe import topk

    topk(
        topk_weights, topk_ids, token_expert_indices, gating_output, renormalize, 0.0, e_score_correction_bias
    )


def topk_sigmoid(
    topk_weights: Tensor,
    topk_ids: Tensor,
    token_expert_indices: Tensor,
    gating_output: Tensor,
    renormalize: bool = False,
    e_score_correction_bias: Tensor | None = None,
) -> None:
    """vLLM's top-k sigmoid, written by the kernel into ``topk_weights`` (the sigmoid scores),
    ``topk_ids`` (int32 or int64) and ``token_expert_indices`` (``[i, j] = j * T + i``);
    ``e_score_correction_bias`` chooses the experts by sigmoid + bias, weighted by the sigmoid."""
    from ._moe import topk_sigmoid as route

    route(topk_weights, topk_ids, token_expert_indices, gating_output, renormalize, e_score_correction_bias)


def moe_align_block_size(
    topk_ids: Tensor,
    num_experts: int,
    block_size: int,
    sorted_token_ids: Tensor,
    experts_ids: Tensor,
    num_tokens_post_pad: Tensor,
    expert_map: Tensor | None = None,
) -> None:
    """vLLM's alignment, written by the kernel into the caller's buffers. With ``expert_map``
    (expert parallelism: global id -> local id, -1 when not on this rank) each id is mapped in
    the kernel and entries of other ranks are left out, as vLLM's kernel does."""
    from ._moe import align

    align(
        topk_ids,
        num_experts,
        block_size,
        sorted_token_ids,
        experts_ids,
        num_tokens_post_pad,
        None,
        True,
        expert_map,
    )


def batched_moe_align_block_size(
    max_tokens_per_batch: int,
    block_size: int,
    expert_num_tokens: Tensor,
    sorted_ids: Tensor,
    expert_ids: Tensor,
    num_tokens_post_pad: Tensor,
) -> None:
    """vLLM's batched alignment (tokens already grouped per expert, ``[E, max_tokens_per_batch]``),
    written by opmux's kernel into the caller's buffers: expert e's ``expert_num_tokens[e]`` rows
    ``e * max_tokens_per_batch + j``, padded to ``block_size`` with ``E * max_tokens_per_batch``;
    unused blocks get -1 (vLLM's kernel's fill here, not 0 as in ``moe_align_block_size``)."""
    _ops("moe").batched_moe_align_block_size(
        expert_num_tokens,
        int(max_tokens_per_batch),
        int(block_size),
        sorted_ids=sorted_ids,
        expert_ids=expert_ids,
        num_tokens_post_padded=num_tokens_post_pad,
    )


# -- fused MoE (vllm/model_executor/layers/fused_moe/fused_moe.py) ------------------------------
#: the quantized forms of vLLM's ``FusedMoEQuantConfig`` / keyword flags opmux does not run
_QUANT_FLAGS = (
    "use_int8_w8a8",
    "use_int8_w8a16",
    "use_int4_w4a16",
    "use_mxfp4_w4a4",
    "use_mxfp4_w4a16",
    "use_nvfp4_w4a4",
    "per_act_token_quant",
    "per_out_ch_quant",
)
_QUANT_TENSORS = ("w1_zp", "w2_zp", "a1_scale", "a2_scale", "w1_bias", "w2_bias")


def _quant_args(name: str, quant_config: Any, legacy: dict[str, Any]) -> dict[str, Any]:
    """vLLM's quantization arguments, from ``quant_config`` (a ``FusedMoEQuantConfig``, read by
    attribute) or the keyword flags of its earlier releases / ``fused_experts_impl``."""
    given = [k for k, v in legacy.items() if v is not None and v is not False]
    if quant_config is not None:
        if given:
            raise ValueError(f"{name}: pass quant_config or the keyword flags {given}, not both")
        q: dict[str, Any] = {k: getattr(quant_config, k, None) for k in (*_QUANT_FLAGS, *_QUANT_TENSORS)}
        # the activations' quant dtype (vLLM's ``quant_dtype``): fp8 e4m3 or none; a string
        # ("nvfp4", "mxfp4", "mxfp8", ...) or int8 is a format opmux does not run
        quant_dtype = getattr(quant_config, "quant_dtype", None)
        q["quant_dtype"] = quant_dtype
        q.update(
            use_fp8_w8a8=bool(getattr(quant_config, "use_fp8_w8a8", False)),
            ocp_mx_scheme=getattr(quant_config, "ocp_mx_scheme", None),
            block_shape=getattr(quant_config, "block_shape", None),
            w1_scale=getattr(quant_config, "w1_scale", None),
            w2_scale=getattr(quant_config, "w2_scale", None),
        )
        return q
    q = dict(legacy)
    q["per_act_token_quant"] = q.pop("per_channel_quant", False)
    return q


def _fused_experts(
    name: str,
    hidden_states: Tensor,
    w1: Tensor,
    w2: Tensor,
    topk_weights: Tensor,
    topk_ids: Tensor,
    inplace: bool,
    activation: str,
    apply_router_weight_on_input: bool,
    global_num_experts: int,
    expert_map: Tensor | None,
    q: dict[str, Any],
) -> Tensor:
    from . import _experts

    e = w1.shape[0]
    if expert_map is not None:
        if global_num_experts not in (-1, expert_map.numel()):
            raise ValueError(
                f"{name}: global_num_experts = {global_num_experts} but expert_map has "
                f"{expert_map.numel()} entries (one per global expert)"
            )
    elif global_num_experts not in (-1, e):
        raise ValueError(
            f"{name}: global_num_experts = {global_num_experts} without an expert_map; w1 holds {e} "
            "experts (pass expert_map for expert parallelism)"
        )
    activation = getattr(activation, "value", activation)  # vLLM's MoEActivation enum, or its string
    unsupported = [(f, bool(q.get(f))) for f in _QUANT_FLAGS]
    qd = q.get("quant_dtype")
    unsupported += [(f"quant_dtype {qd}", qd is not None and qd != torch.float8_e4m3fn)]
    unsupported += [(f"ocp_mx_scheme {q.get('ocp_mx_scheme')!r}", q.get("ocp_mx_scheme") is not None)]
    unsupported += [
        (f"{t} (static scales, zero points, biases)", q.get(t) is not None) for t in _QUANT_TENSORS
    ]
    return _experts.run(
        name,
        hidden_states,
        w1,
        w2,
        topk_weights,
        topk_ids,
        inplace=bool(inplace),
        activation=activation,
        apply_router_weight_on_input=apply_router_weight_on_input,
        expert_map=expert_map,
        use_fp8_w8a8=bool(q.get("use_fp8_w8a8")),
        block_shape=q.get("block_shape"),
        w1_scale=q.get("w1_scale"),
        w2_scale=q.get("w2_scale"),
        unsupported=unsupported,
        vllm_rounding=True,  # vLLM's kernels round the activation twice and divide by fp8 scales
    )


def fused_experts(
    hidden_states: Tensor,
    w1: Tensor,
    w2: Tensor,
    topk_weights: Tensor,
    topk_ids: Tensor,
    inplace: bool = False,
    activation: str = "silu",
    apply_router_weight_on_input: bool = False,
    global_num_experts: int = -1,
    expert_map: Tensor | None = None,
    quant_config: Any = None,
    allow_deep_gemm: bool = False,
    *,
    use_fp8_w8a8: bool = False,
    use_int8_w8a8: bool = False,
    use_int8_w8a16: bool = False,
    use_int4_w4a16: bool = False,
    ocp_mx_scheme: str | None = None,
    per_channel_quant: bool = False,
    w1_scale: Tensor | None = None,
    w2_scale: Tensor | None = None,
    w1_zp: Tensor | None = None,
    w2_zp: Tensor | None = None,
    a1_scale: Tensor | None = None,
    a2_scale: Tensor | None = None,
    block_shape: list[int] | None = None,
    w1_bias: Tensor | None = None,
    w2_bias: Tensor | None = None,
) -> Tensor:
    """vLLM's ``fused_experts``: hidden [M, K], w1 [E, 2N, K] (gate rows, then up), w2 [E, K, N],
    routed by ``topk_weights`` / ``topk_ids`` [M, topk]; opmux's ``moe.fused_experts``.
    ``inplace`` writes the result into ``hidden_states`` (returned). Quantization as vLLM's
    current release (``quant_config``, a ``FusedMoEQuantConfig`` read by attribute) or its
    earlier keyword flags (``use_fp8_w8a8``, ``block_shape``, ``w1_scale``, ...): unquantized
    weights, or fp8 with 128x128 block scales; every other form raises ``NotImplementedError``.
    ``expert_map`` (global id -> local id, -1 elsewhere) with ``global_num_experts`` its length.
    ``activation``: a name or vLLM's ``MoEActivation`` (its value). ``allow_deep_gemm`` is
    accepted (opmux runs its own kernel)."""
    q = _quant_args(
        "fused_experts",
        quant_config,
        dict(
            use_fp8_w8a8=use_fp8_w8a8,
            use_int8_w8a8=use_int8_w8a8,
            use_int8_w8a16=use_int8_w8a16,
            use_int4_w4a16=use_int4_w4a16,
            ocp_mx_scheme=ocp_mx_scheme,
            per_channel_quant=per_channel_quant,
            w1_scale=w1_scale,
            w2_scale=w2_scale,
            w1_zp=w1_zp,
            w2_zp=w2_zp,
            a1_scale=a1_scale,
            a2_scale=a2_scale,
            block_shape=block_shape,
            w1_bias=w1_bias,
            w2_bias=w2_bias,
        ),
    )
    return _fused_experts(
        "fused_experts",
        hidden_states,
        w1,
        w2,
        topk_weights,
        topk_ids,
        inplace,
        activation,
        apply_router_weight_on_input,
        global_num_experts,
        expert_map,
        q,
    )


def fused_topk(
    hidden_states: Tensor,
    gating_output: Tensor,
    topk: int,
    renormalize: bool,
    indices_type: Any = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """vLLM's ``fused_topk``: softmax top-k by opmux's ``moe.topk_softmax`` into fresh buffers:
    float32 weights, ids (int32, or ``indices_type``), ``token_expert_indices``."""
    if hidden_states.shape[0] != gating_output.shape[0]:
        raise ValueError(
            f"fused_topk: {hidden_states.shape[0]} tokens in hidden_states, {gating_output.shape[0]} "
            "in gating_output"
        )
    from ._experts import route_softmax

    w, ids, tei = route_softmax(gating_output, topk, renormalize, indices_type)
    return w, ids, tei


def fused_moe(
    hidden_states: Tensor,
    w1: Tensor,
    w2: Tensor,
    gating_output: Tensor,
    topk: int,
    renormalize: bool,
    inplace: bool = False,
    activation: str = "silu",
    apply_router_weight_on_input: bool = False,
    use_grouped_topk: bool = False,
    num_expert_group: int | None = None,
    topk_group: int | None = None,
    custom_routing_function: Any = None,
    global_num_experts: int = -1,
    expert_map: Tensor | None = None,
    quant_config: Any = None,
    *,
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
    """vLLM's ``fused_moe``: route ``gating_output`` [M, E] (softmax top-k by opmux's
    ``moe.topk_softmax``, or ``custom_routing_function(hidden_states, gating_output, topk,
    renormalize)``), then ``fused_experts``. Grouped top-k (``use_grouped_topk``) raises
    ``NotImplementedError``."""
    if use_grouped_topk or num_expert_group is not None or topk_group is not None:
        from ._experts import refuse

        refuse("fused_moe", "grouped top-k routing (use_grouped_topk / num_expert_group / topk_group)")
    q = _quant_args(
        "fused_moe",
        quant_config,
        dict(
            use_fp8_w8a8=use_fp8_w8a8,
            use_int8_w8a8=use_int8_w8a8,
            use_int8_w8a16=use_int8_w8a16,
            use_int4_w4a16=use_int4_w4a16,
            per_channel_quant=per_channel_quant,
            w1_scale=w1_scale,
            w2_scale=w2_scale,
            w1_zp=w1_zp,
            w2_zp=w2_zp,
            a1_scale=a1_scale,
            a2_scale=a2_scale,
            block_shape=block_shape,
        ),
    )
    if custom_routing_function is None:
        topk_weights, topk_ids, _ = fused_topk(hidden_states, gating_output, topk, renormalize)
    else:
        topk_weights, topk_ids = custom_routing_function(hidden_states, gating_output, topk, renormalize)
    return _fused_experts(
        "fused_moe",
        hidden_states,
        w1,
        w2,
        topk_weights,
        topk_ids,
        inplace,
        activation,
        apply_router_weight_on_input,
        global_num_experts,
        expert_map,
        q,
    )


# -- KV cache -----------------------------------------------------------------------------------
def _fp8_cache(kv_cache_dtype: str) -> bool:
    if kv_cache_dtype == "auto":
        return False
    if kv_cache_dtype in ("fp8", "fp8_e4m3"):
        return True
    raise NotImplementedError(f"kv_cache_dtype {kv_cache_dtype!r}: opmux supports 'auto', 'fp8', 'fp8_e4m3'")


def _f32(scale: Tensor) -> Tensor:
    return scale if scale.dtype == torch.float32 else scale.float()


def reshape_and_cache_flash(
    key: Tensor,
    value: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    slot_mapping: Tensor,
    kv_cache_dtype: str,
    k_scale: Tensor,
    v_scale: Tensor,
) -> None:
    """Caches ``[num_blocks, block_size, H, D]``: NHD, or HND passed as its permuted view (any
    block / page / head strides, head_dim dense). ``auto``: entries as they are; ``fp8`` /
    ``fp8_e4m3`` (a uint8 or float8_e4m3fn cache, viewed as e4m3fn): ``fp8(x / scale)``. Both are
    opmux's ``kvcache.reshape_and_cache`` kernel writing the caller's caches."""
    slots = slot_mapping if slot_mapping.dtype == torch.int64 else slot_mapping.long()
    cache = _ops("kvcache")
    if not _fp8_cache(kv_cache_dtype):
        cache.reshape_and_cache(key, value, key_cache, value_cache, slots)
        return
    fp8 = torch.float8_e4m3fn
    kc = key_cache if key_cache.dtype == fp8 else key_cache.view(fp8)
    vc = value_cache if value_cache.dtype == fp8 else value_cache.view(fp8)
    cache.reshape_and_cache(key, value, kc, vc, slots, _f32(k_scale), _f32(v_scale))


def convert_fp8(output: Tensor, input: Tensor, scale: float = 1.0, kv_dtype: str = "fp8") -> None:
    """vLLM's fp8 cache conversion (a torch conversion: opmux has no such op): from fp8 bytes
    (uint8 / e4m3fn) ``output = fp8 * scale``; to fp8 bytes ``output = fp8(input / scale)``
    (saturated)."""
    _fp8_cache(kv_dtype)
    fp8 = torch.float8_e4m3fn
    if input.dtype in (torch.uint8, fp8):
        src = input if input.dtype == fp8 else input.view(fp8)
        output.copy_((src.float() * scale).to(output.dtype))
        return
    q = (input.float() / scale).clamp_(-_fp8.FP8_MAX, _fp8.FP8_MAX).to(fp8)
    output.copy_(
        q if output.dtype == fp8 else q.view(torch.uint8) if output.dtype == torch.uint8 else q.float()
    )


def reshape_and_cache(
    key: Tensor,
    value: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    slot_mapping: Tensor,
    kv_cache_dtype: str,
    k_scale: Tensor,
    v_scale: Tensor,
) -> None:
    """vLLM's paged layout: ``key_cache [num_blocks, H, D // x, block_size, x]``,
    ``value_cache [num_blocks, H, D, block_size]``; ``auto`` or ``fp8`` as
    ``reshape_and_cache_flash`` (opmux's ``kvcache.reshape_and_cache`` kernel takes this layout:
    a 5-D key cache)."""
    reshape_and_cache_flash(
        key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale
    )


# -- KV cache blocks (opmux's kvcache block ops, in place into the caller's caches) -----------
def copy_blocks(key_caches: list[Tensor], value_caches: list[Tensor], block_mapping: Tensor) -> None:
    """``cache[dst] = cache[src]`` for each (src, dst) row of ``block_mapping`` (int64 ``[n, 2]``,
    on the caches' device) in every layer's key and value cache: opmux's ``kvcache.copy_blocks``
    kernel once per cache (vLLM's kernel takes all layers in one launch)."""
    if len(key_caches) != len(value_caches):
        raise ValueError(
            f"copy_blocks: {len(key_caches)} key caches but {len(value_caches)} value caches; one of each per layer"
        )
    op = _ops("kvcache").copy_blocks
    for cache in (*key_caches, *value_caches):
        op(cache, block_mapping)


def copy_blocks_mla(kv_caches: list[Tensor], block_mapping: Tensor) -> None:
    """MLA's one cache per layer: opmux's ``kvcache.copy_blocks`` kernel per cache."""
    op = _ops("kvcache").copy_blocks
    for cache in kv_caches:
        op(cache, block_mapping)


def swap_blocks(src: Tensor, dst: Tensor, block_mapping: Tensor) -> None:
    """``dst[d] = src[s]`` for each (s, d) row of the CPU ``block_mapping``, between any devices:
    opmux's ``kvcache.swap_blocks`` (copy-engine transfers, one per run of consecutive blocks)."""
    _ops("kvcache").swap_blocks(src, dst, block_mapping)


def concat_and_cache_mla(
    kv_c: Tensor, k_pe: Tensor, kv_cache: Tensor, slot_mapping: Tensor, kv_cache_dtype: str, scale: Tensor
) -> None:
    """MLA's latent cache write ``kv_cache[slot] = [kv_c | k_pe]`` (``fp8``: ``fp8(x / scale)``
    into a uint8 or float8_e4m3fn cache) by opmux's ``kvcache.concat_and_cache_mla`` kernel. As
    vLLM, the tokens are ``slot_mapping``'s: rows of ``kv_c`` / ``k_pe`` past them (CUDA-graph
    padding) are not written."""
    n = slot_mapping.shape[0]
    if kv_c.shape[0] != n:
        kv_c, k_pe = kv_c[:n], k_pe[:n]
    slots = slot_mapping if slot_mapping.dtype == torch.int64 else slot_mapping.long()
    op = _ops("kvcache").concat_and_cache_mla
    if not _fp8_cache(kv_cache_dtype):
        op(kv_c, k_pe, kv_cache, slots)
        return
    fp8 = torch.float8_e4m3fn
    op(kv_c, k_pe, kv_cache if kv_cache.dtype == fp8 else kv_cache.view(fp8), slots, _f32(scale))


def gather_cache(
    src_cache: Tensor,
    dst: Tensor,
    block_table: Tensor,
    cu_seq_lens: Tensor,
    batch_size: int,
    seq_starts: Tensor | None = None,
) -> None:
    """The first ``batch_size`` sequences' tokens from ``src_cache`` ``[num_blocks, block_size,
    entry...]`` through ``block_table`` into ``dst`` rows ``cu_seq_lens[b]..`` (``seq_starts``:
    each sequence's first block is ``block_table[b, seq_starts[b] // block_size]``), by opmux's
    ``kvcache.gather_cache`` kernel."""
    b = int(batch_size)
    table = block_table if block_table.shape[0] == b else block_table[:b]
    cu = cu_seq_lens if cu_seq_lens.shape[0] == b + 1 else cu_seq_lens[: b + 1]
    starts = None if seq_starts is None else seq_starts[:b]
    _ops("kvcache").gather_cache(src_cache, dst, table, cu, starts)


# -- block-scaled fp8 GEMM (vllm/model_executor/layers/quantization/utils/fp8_utils.py, _custom_ops) --
def w8a8_block_fp8_matmul(
    A: Tensor, B: Tensor, As: Tensor, Bs: Tensor, block_size: list[int], output_dtype: Any = None
) -> Tensor:
    """vLLM's Triton entry: A [..., K] e4m3, B [N, K], As [..., K/128], Bs [N/128, K/128]."""
    dtype = torch.float16 if output_dtype is None else output_dtype
    return _gemm.triton_block_matmul("w8a8_block_fp8_matmul", A, B, As, Bs, block_size, dtype)


def w8a8_triton_block_scaled_mm(
    A: Tensor, B: Tensor, As: Tensor, Bs: Tensor, block_size: list[int], output_dtype: Any = None
) -> Tensor:
    """vLLM's later name of the same entry."""
    dtype = torch.float16 if output_dtype is None else output_dtype
    return _gemm.triton_block_matmul("w8a8_triton_block_scaled_mm", A, B, As, Bs, block_size, dtype)


def cutlass_scaled_mm(
    a: Tensor, b: Tensor, scale_a: Tensor, scale_b: Tensor, out_dtype: Any, bias: Tensor | None = None
) -> Tensor:
    """vLLM's ``cutlass_scaled_mm`` with block scales: b [K, N] column-major, scale_a [M, K/128],
    scale_b [K/128, N/128]."""
    return _gemm.column_major_matmul("cutlass_scaled_mm", a, b, scale_a, scale_b, out_dtype, bias)
