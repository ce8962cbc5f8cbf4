"""Public moe ops: eager calls dispatch directly; torch.compile sees torch library ops."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch

from .op import MoeAlignBlockSize, TopkSoftmax, _check_align, _check_topk

__all__ = ["moe_align_block_size", "topk_softmax"]

_topk = TopkSoftmax()
_align = MoeAlignBlockSize()
# bound once: dynamo folds this function to True while tracing; eager pays one call
_compiling = torch.compiler.is_compiling
Backend = str | Sequence[str] | None
_Pair = tuple[torch.Tensor, torch.Tensor]
_Triple = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


@torch.library.custom_op("opmux::topk_softmax", mutates_args=())
def _topk_op(gating_output: torch.Tensor, topk: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return cast(_Pair, _topk(gating_output, topk, renormalize))


@_topk_op.register_fake
def _(gating_output: torch.Tensor, topk: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _check_topk(gating_output, topk, renormalize)


@torch.library.custom_op("opmux::moe_align_block_size", mutates_args=())
def _align_op(
    topk_ids: torch.Tensor, block_size: int, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return cast(_Triple, _align(topk_ids, block_size, num_experts))


@_align_op.register_fake
def _(
    topk_ids: torch.Tensor, block_size: int, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _check_align(topk_ids, block_size, num_experts, values=False)


def topk_softmax(
    gating_output: torch.Tensor, topk: int, renormalize: bool = False, *, backend: Backend = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router top-k: ``gating_output`` ``[T, E]`` (float32/float16/bfloat16) ->
    ``(topk_weights float32 [T, k], topk_ids int32 [T, k])``.

    Weights are the fp32 softmax over all E experts of the chosen experts (divided by their sum
    when ``renormalize``). Experts are ranked by logit, best first; equal logits are broken by
    the lower expert index (deterministic in every backend).
    """
    fn = None if backend is not None or _compiling() else _topk.lookup(gating_output)
    if fn is not None:  # the hot path: a cached backend, called directly
        return fn(gating_output, topk, renormalize)
    if _compiling():
        return cast(_Pair, torch.ops.opmux.topk_softmax(gating_output, topk, renormalize))
    return cast(_Pair, _topk(gating_output, topk, renormalize, backend=backend))


def moe_align_block_size(
    topk_ids: torch.Tensor, block_size: int, num_experts: int, *, backend: Backend = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """vLLM's ``moe_align_block_size``: group the ``T*k`` routed entries by expert, padded to
    multiples of ``block_size``.

    Returns ``(sorted_token_ids, expert_ids, num_tokens_post_padded)``, all int32:
    ``sorted_token_ids`` ``[T*k + E*(block_size-1)]`` holds, expert by expert, the flat indices
    ``t*k + j`` routed to it in increasing order, padded with ``T*k`` (also past the end);
    ``expert_ids`` ``[cdiv(len(sorted_token_ids), block_size)]`` names each block's expert (-1 for
    unused blocks); ``num_tokens_post_padded`` ``[1]`` is the padded total. Ids outside
    ``[0, num_experts)`` raise ValueError for CPU tensors and are skipped on CUDA.
    """
    fn = None if backend is not None or _compiling() else _align.lookup(topk_ids)
    if fn is not None:  # the hot path: a cached backend, called directly
        return fn(topk_ids, block_size, num_experts)
    if _compiling():
        return cast(_Triple, torch.ops.opmux.moe_align_block_size(topk_ids, block_size, num_experts))
    return cast(_Triple, _align(topk_ids, block_size, num_experts, backend=backend))
