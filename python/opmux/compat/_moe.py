"""MoE routing for the compat modules: opmux's kernels write the engines' buffers directly.

Every feature the engines use (caller buffers, int64 ids, softcapping, correction bias,
``token_expert_indices``, ``expert_map``, ``cumsum_buffer``, ``pad_sorted_token_ids``, the
fill value of unused blocks) is a parameter of the opmux op, so each entry point is one call of
the op's public function (its contract, then the selected kernel into the caller's buffers):
no torch fallback, no staging copy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opmux.kernels.ops._torch import torch

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["align", "topk", "topk_sigmoid"]


def _moe() -> Any:
    import opmux.kernels.ops.moe as moe

    return moe


def topk(
    topk_weights: Tensor,
    topk_ids: Tensor,
    token_expert_indices: Tensor | None,
    gating_output: Tensor,
    renormalize: bool,
    softcapping: float = 0.0,
    correction_bias: Tensor | None = None,
    bias_on_logits: bool = False,
) -> None:
    """Softmax top-k into the caller's buffers (``topk_ids`` int32 or int64, written by the
    kernel). ``correction_bias``: DeepSeek's routing (chosen by softmax + bias, weighted by the
    softmax; vLLM) or, with ``bias_on_logits``, added to the logits (sgl-kernel)."""
    k = topk_weights.shape[-1] if topk_weights.dim() == 2 else 0
    bias = correction_bias
    if bias is not None and bias.dtype != torch.float32:
        bias = bias.float()  # [E]: the kernels read float32 (vLLM may keep the bias in bf16)
    _moe().topk_softmax(
        gating_output,
        k,
        bool(renormalize),
        bias,
        float(softcapping),
        bias_on_logits,
        topk_weights=topk_weights,
        topk_ids=topk_ids,
        token_expert_indices=token_expert_indices,
    )


def topk_sigmoid(
    topk_weights: Tensor,
    topk_ids: Tensor,
    token_expert_indices: Tensor | None,
    gating_output: Tensor,
    renormalize: bool,
    correction_bias: Tensor | None = None,
) -> None:
    """Sigmoid top-k into the caller's buffers (``topk_ids`` int32 or int64, written by the
    kernel); ``correction_bias``: chosen by sigmoid + bias, weighted by the sigmoid (vLLM)."""
    k = topk_weights.shape[-1] if topk_weights.dim() == 2 else 0
    bias = correction_bias
    if bias is not None and bias.dtype != torch.float32:
        bias = bias.float()  # [E]: the kernels read float32
    _moe().topk_sigmoid(
        gating_output,
        k,
        bool(renormalize),
        bias,
        topk_weights=topk_weights,
        topk_ids=topk_ids,
        token_expert_indices=token_expert_indices,
    )


def _flat_ids(topk_ids: Tensor) -> Tensor:
    """The engines' reading of ``topk_ids``: ``numel`` consecutive ids from its data pointer
    (both CUDA kernels and sgl's Triton reference index it flat, whatever its strides). A
    contiguous tensor is that already; a strided view (``argsort(...)[:, :k]``) is re-viewed
    over the same memory when it fits its storage, else its values are used."""
    if topk_ids.dim() == 1:
        topk_ids = topk_ids.view(-1, 1)
    if topk_ids.is_contiguous():
        return topk_ids
    t, k = topk_ids.shape[0], topk_ids.shape[-1] if topk_ids.dim() > 1 else 1
    end = (topk_ids.storage_offset() + topk_ids.numel()) * topk_ids.element_size()
    if topk_ids.dim() == 2 and end <= topk_ids.untyped_storage().nbytes():
        return topk_ids.as_strided((t, k), (k, 1))
    return topk_ids.contiguous()


def align(
    topk_ids: Tensor,
    num_experts: int,
    block_size: int,
    sorted_token_ids: Tensor,
    experts_ids: Tensor,
    num_tokens_post_pad: Tensor,
    cumsum_buffer: Tensor | None = None,
    pad_sorted_token_ids: bool = True,
    expert_map: Tensor | None = None,
) -> None:
    """The engines' alignment into their buffers: unused blocks get expert 0 (opmux's own
    default is -1), every unused slot of ``sorted_token_ids`` ``topk_ids.numel()`` (sgl with
    ``pad_sorted_token_ids=False``: left as the caller filled them), ``cumsum_buffer[e]`` expert
    e's first slot; ``expert_map`` (vLLM): ids mapped to local experts, -1 left out."""
    _moe().moe_align_block_size(
        _flat_ids(topk_ids),
        block_size,
        num_experts,
        expert_map,
        bool(pad_sorted_token_ids),
        0,
        sorted_token_ids=sorted_token_ids,
        expert_ids=experts_ids,
        num_tokens_post_padded=num_tokens_post_pad,
        cumsum_buffer=cumsum_buffer,
    )
