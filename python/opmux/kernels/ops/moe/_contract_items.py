"""The moe ops' contracts, as data (``ops/_contract.py``); their checks and serving lanes are
generated (``python tools/gen_contracts.py``). The ids' and counts' ranges, read from tensor
contents, stay in the values hooks of ``op.py`` (CPU only; the CUDA kernels skip or clamp)."""

from __future__ import annotations

from .._contract import FLOATS, Arg, Contract, Rule, Scalar

_I32 = ("int32",)
_INT32 = "2147483648"

# -- topk_softmax, topk_sigmoid: gating [T, E] -> (weights float32 [T, k], ids int32/int64 [T, k])
_GATING = (
    Arg("gating_output", "T, E", dtypes=FLOATS, note=" with E >= 1"),
    Rule("E >= 1", "gating_output has shape {tuple(gating_output.shape)}, expected [T, E] with E >= 1"),
    Scalar("topk", "positive_int"),
    Rule("topk <= E", "topk {topk} exceeds the number of experts {E}"),
    Scalar("renormalize", "bool"),
)


def _route_out(name: str, dtypes: tuple[str, ...], out: bool = True) -> Arg:
    """A routing output (or token_expert_indices, filled when given): [T, k] rows held apart."""
    return Arg(
        name,
        "T, topk",
        dtypes=dtypes,
        device_of="gating_output",
        layout="rows_apart",
        out=out,
        expect="[{T}, {topk}]",
        dtype_hint="has dtype {dtype}; expected " + " or ".join(dtypes),
    )


_ROUTE = (
    Arg(
        "correction_bias",
        "E",
        dtypes=("float32",),
        device_of="gating_output",
        layout="vector",
        note=" (one per expert)",
    ),
    _route_out("topk_weights", ("float32",)),
    _route_out("topk_ids", ("int32", "int64")),
    _route_out("token_expert_indices", _I32, out=False),
)
_ROUTE_KERNEL = (
    "topk_weights",
    "topk_ids",
    "token_expert_indices",
    "token_expert_indices is not None",
    "gating_output",
    "correction_bias",
    "correction_bias is not None",
    "renormalize",
)
TOPK_SOFTMAX = Contract(
    "topk_softmax",
    (
        *_GATING,
        Scalar("bias_on_logits", "bool"),
        Scalar("moe_softcapping", "off_or_positive"),
        *_ROUTE,
    ),
    kernel=(*_ROUTE_KERNEL, "moe_softcapping", "bias_on_logits"),
    result=("topk_weights", "topk_ids"),
    lane_optional=True,
)
TOPK_SIGMOID = Contract(
    "topk_sigmoid",
    (*_GATING, *_ROUTE),
    kernel=_ROUTE_KERNEL,
    result=("topk_weights", "topk_ids"),
    lane_optional=True,
)


def _index_buffer(name: str, size: str, what: str, ref: str, out: bool = True, alloc: str = "") -> Arg:
    """An int32 index buffer the kernels write whole: the caller's may be longer."""
    return Arg(
        name,
        size,
        dtypes=_I32,
        device_of=ref,
        layout="vector",
        out=out,
        at_least=True,
        alloc_shape=alloc,
        note=f" ({what})",
    )


def _fits_int32(name: str) -> Rule:
    """The kernels count in int32: a scalar past it is named here, not as a wrapped value."""
    return Rule(f"{name} < {_INT32}", f"{name} = {{{name}}} does not fit int32 (at most 2147483647)")


# -- moe_align_block_size: topk_ids [T, k] -> (sorted_token_ids, expert_ids, num_tokens_post_padded)
#: every slot the padded layout may need (each expert padded by fewer than block_size) ...
_MAX_PADDED = "T * k + num_experts * (block_size - 1)"
#: ... and what a caller's buffer must hold (at most min(E, T*k) experts are used)
_NEED = "T * k + min(num_experts, T * k) * (block_size - 1)"
MOE_ALIGN = Contract(
    "moe_align",
    (
        Arg(
            "topk_ids",
            "T, k",
            dtypes=("int32", "int64"),
            layout="contiguous",
            dtype_hint="has dtype {dtype}, expected int32",
            layout_hint="is non-contiguous (strides {{t}.stride()}); pass {t}.contiguous()",
        ),
        Scalar("block_size", "positive_int"),
        Scalar("num_experts", "positive_int"),
        _fits_int32("block_size"),
        _fits_int32("num_experts"),
        Scalar("pad_sorted_token_ids", "bool"),
        Scalar("unused_expert_id", "int32"),
        Rule(f"{_MAX_PADDED} < {_INT32}", f"{{{_MAX_PADDED}}} padded slots do not fit int32"),
        # moe_cuda.cu: W * E counters + E + 1 slots of shared memory, W >= 1, within 48 KiB
        Rule(
            "num_experts <= 6143",
            "num_experts {num_experts} is too large for this kernel (max 6143)",
            device="cuda",
            name="align_smem",
        ),
        Arg(
            "expert_map",
            "num_experts",
            dtypes=_I32,
            device_of="topk_ids",
            layout="vector",
            note=" (global expert id -> local id, or -1)",
        ),
        _index_buffer(
            "sorted_token_ids", _NEED, "T*k + min(E, T*k)*(block_size-1)", "topk_ids", alloc=_MAX_PADDED
        ),
        _index_buffer(
            "expert_ids",
            f"({_NEED}) // block_size",
            "one per block",
            "topk_ids",
            alloc=f"cdiv({_MAX_PADDED}, block_size)",
        ),
        _index_buffer("num_tokens_post_padded", "1", "the padded total", "topk_ids"),
        _index_buffer("cumsum_buffer", "num_experts + 1", "num_experts + 1", "topk_ids", out=False),
    ),
    kernel=(
        "sorted_token_ids",
        "expert_ids",
        "num_tokens_post_padded",
        "cumsum_buffer",
        "cumsum_buffer is not None",
        "topk_ids",
        "expert_map",
        "expert_map is not None",
        "block_size",
        "num_experts",
        "sorted_token_ids is None or pad_sorted_token_ids",  # the op's own buffer is always padded
        "unused_expert_id",
    ),
    result=("sorted_token_ids", "expert_ids", "num_tokens_post_padded"),
    values_cpp="align_values_ok(device_type, topk_ids, num_experts, expert_map)",
    values_header="opmux/moe_values.h",
    lane_optional=True,
)

# -- batched_moe_align_block_size: expert_num_tokens int32 [E] -> the same three outputs
#: the padded slots: E experts of max_tokens_per_batch rows, each rounded up to whole blocks
_SLOTS = "E * (cdiv(max_tokens_per_batch, block_size) * block_size)"
BATCHED_ALIGN = Contract(
    "batched_align",
    (
        Arg(
            "expert_num_tokens",
            "E",
            dtypes=_I32,
            layout="vector",
            note=" with E >= 1",
            layout_hint="has stride {{t}.stride(0)}; it must be dense",
        ),
        Rule(
            "E >= 1", "expert_num_tokens has shape {tuple(expert_num_tokens.shape)}, expected [E] with E >= 1"
        ),
        Scalar("max_tokens_per_batch", "positive_int"),
        Scalar("block_size", "positive_int"),
        # (the int32 bounds of the scalars first: implied by the slots' bound, and no C++ overflow)
        Rule(
            f"max_tokens_per_batch < {_INT32} and block_size < {_INT32} and {_SLOTS} < {_INT32} "
            f"and E * max_tokens_per_batch < {_INT32}",
            "{E} experts of {max_tokens_per_batch} tokens padded to blocks of {block_size} "
            f"({{{_SLOTS}}} slots) do not fit int32",
        ),
        _index_buffer(
            "sorted_ids", _SLOTS, "E * round_up(max_tokens_per_batch, block_size)", "expert_num_tokens"
        ),
        _index_buffer(
            "expert_ids", "E * cdiv(max_tokens_per_batch, block_size)", "one per block", "expert_num_tokens"
        ),
        _index_buffer("num_tokens_post_padded", "1", "the padded total", "expert_num_tokens"),
    ),
    kernel=(
        "sorted_ids",
        "expert_ids",
        "num_tokens_post_padded",
        "expert_num_tokens",
        "max_tokens_per_batch",
        "block_size",
    ),
    result=("sorted_ids", "expert_ids", "num_tokens_post_padded"),
    values_cpp="device_type != kDLCPU || counts_in_range(expert_num_tokens, max_tokens_per_batch)",
    values_header="opmux/moe_values.h",
)
