"""Specs of the moe group (torch-free)."""

from __future__ import annotations

from dataclasses import replace

from ...spec import BackendSpec, OpSpec, Requirement
from .._common import AOT, INT32_EXACT, JIT, TOLERANCES, TORCH, TRITON, priority_without

_M = "opmux.kernels.ops.moe.op"
_PRIORITY = priority_without("torch_npu")


def _backends(cls: str, dtypes: tuple[str, ...] | None = None) -> tuple[BackendSpec, ...]:
    def req(r: Requirement) -> Requirement:
        return r if dtypes is None else replace(r, dtypes=dtypes)

    return (
        BackendSpec("aot", f"{_M}:{cls}.forward_aot", req(AOT)),
        BackendSpec("jit", f"{_M}:{cls}.forward_jit", req(JIT)),
        BackendSpec("triton", f"{_M}:{cls}.forward_triton", req(TRITON)),
        BackendSpec("torch", f"{_M}:{cls}.forward_torch", req(TORCH)),
    )


SPECS = (
    OpSpec(
        name="moe.topk_softmax",
        reference=f"{_M}:TopkSoftmax.forward_native",
        backends=_backends("TopkSoftmax"),
        default_priority=("torch",),
        priority=_PRIORITY,
        # weights are float32 whatever the gating dtype (the harness uses the float32 entry);
        # expert ids must match exactly
        tolerances=(*TOLERANCES, INT32_EXACT),
        samples="opmux.kernels.ops.moe.samples:topk_softmax_samples",
        invalid_samples="opmux.kernels.ops.moe.samples:topk_softmax_invalid",
        doc="gating [T, E] -> (softmax weights fp32 [T, k], expert ids int32 [T, k]); ties -> lower id",
    ),
    OpSpec(
        name="moe.moe_align_block_size",
        reference=f"{_M}:MoeAlignBlockSize.forward_native",
        backends=_backends("MoeAlignBlockSize", ("int32",)),
        default_priority=("torch",),
        priority=_PRIORITY,
        tolerances=(INT32_EXACT,),
        samples="opmux.kernels.ops.moe.samples:moe_align_block_size_samples",
        invalid_samples="opmux.kernels.ops.moe.samples:moe_align_block_size_invalid",
        doc="topk_ids [T, k] -> (sorted_token_ids, expert_ids, num_tokens_post_padded), vLLM layout",
    ),
)
