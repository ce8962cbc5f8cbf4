"""MoE routing for the compat modules: opmux's kernels into the engines' buffers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from opmux.kernels.ops._torch import torch

from . import _direct

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["align", "topk"]

_TK = "moe.topk_softmax"
_AL = "moe.moe_align_block_size"


def topk(
    topk_weights: Tensor,
    topk_ids: Tensor,
    token_expert_indices: Tensor | None,
    gating_output: Tensor,
    renormalize: bool,
    softcapping: float = 0.0,
    correction_bias: Tensor | None = None,
) -> None:
    """Softmax top-k into the caller's buffers. With ``correction_bias`` the experts are chosen
    by ``softmax + bias`` and weighted by the softmax (the biased routing both engines use);
    ``softcapping > 0`` applies ``cap * tanh(logit / cap)`` first (torch composition for either)."""
    g = gating_output
    if softcapping:
        g = softcapping * torch.tanh(g.float() / softcapping)
    if correction_bias is not None:
        k = topk_weights.shape[-1]
        probs = torch.softmax(g.float(), dim=-1)
        ids = torch.topk(probs + correction_bias.float(), k, dim=-1, sorted=True).indices
        w = probs.gather(-1, ids)
        if renormalize:
            w = w / w.sum(-1, keepdim=True)
        topk_weights.copy_(w)
        topk_ids.copy_(ids)
        _token_expert_indices(token_expert_indices, g.shape[0], k, g.device)
        return
    k = topk_weights.shape[-1] if topk_weights.dim() else 0
    kargs, _ = _direct.check(_TK, g, k, bool(renormalize))
    t = g.shape[0]
    _direct.out_like(_TK, "topk_weights", topk_weights, (t, k), torch.float32, g.device)
    _direct.need(
        topk_ids.dtype in (torch.int32, torch.int64),
        f"{_TK}: topk_ids has dtype {topk_ids.dtype}, expected int32 or int64",
        TypeError,
    )
    _direct.out_like(_TK, "topk_ids", topk_ids, (t, k), topk_ids.dtype, g.device)
    _direct.need(topk_weights.stride(-1) == 1 or k == 1, f"{_TK}: topk_weights needs a unit last stride")
    ids32 = topk_ids if topk_ids.dtype == torch.int32 and topk_ids.is_contiguous() else kargs[1]
    w = topk_weights if topk_weights.is_contiguous() else kargs[0]
    _direct.kernel(_TK, g)(w, ids32, *kargs[2:])
    if ids32 is not topk_ids:
        topk_ids.copy_(ids32)  # int64 ids: the kernels write int32
    if w is not topk_weights:
        topk_weights.copy_(w)
    _token_expert_indices(token_expert_indices, t, k, g.device)


def _token_expert_indices(buf: Tensor | None, t: int, k: int, device: torch.device) -> None:
    """vLLM's ``token_expert_indices[i, j] = j * T + i`` (the row of the expanded input)."""
    if buf is not None:
        src = torch.arange(k, device=device, dtype=buf.dtype).mul_(t)
        buf.copy_(src.unsqueeze(0) + torch.arange(t, device=device, dtype=buf.dtype).unsqueeze(1))


def align(
    topk_ids: Tensor,
    num_experts: int,
    block_size: int,
    sorted_token_ids: Tensor,
    experts_ids: Tensor,
    num_tokens_post_pad: Tensor,
    cumsum_buffer: Tensor | None = None,
) -> None:
    """opmux's alignment kernel writes the first ``max_padded`` slots of the caller's buffers
    directly; the engines' conventions are then applied in place: expert id 0 (not -1) in
    unused blocks, ``numel`` in every further slot, ``cumsum_buffer`` filled."""
    ids = topk_ids if topk_ids.dtype == torch.int32 else topk_ids.to(torch.int32)
    ids = ids if ids.is_contiguous() else ids.contiguous()
    if ids.dim() == 1:
        ids = ids.view(-1, 1)
    kargs, _ = _direct.check(_AL, ids, block_size, num_experts)
    n_sorted, n_blocks = kargs[0].numel(), kargs[1].numel()
    dev = topk_ids.device
    for name, buf, need_n in (
        ("sorted_token_ids", sorted_token_ids, n_sorted),
        ("experts_ids", experts_ids, n_blocks - 1),  # engines size it max_padded // block_size
        ("num_tokens_post_pad", num_tokens_post_pad, 1),
    ):
        _direct.need(
            buf.dtype == torch.int32, f"{_AL}: {name} has dtype {buf.dtype}, expected int32", TypeError
        )
        _direct.need(buf.device == dev, f"{_AL}: {name} is on {buf.device}, expected {dev}")
        _direct.need(
            buf.dim() == 1 and buf.numel() >= need_n and (buf.numel() < 2 or buf.stride(0) == 1),
            f"{_AL}: {name} has shape {tuple(buf.shape)}, expected a dense vector of at least {need_n}",
        )
    # the last block can only be used when the padded total reaches max_padded, which needs
    # a multiple of block_size: a buffer one block short gets the kernel's full vector staged
    direct_blocks = experts_ids.numel() >= n_blocks
    blocks = experts_ids[:n_blocks] if direct_blocks else kargs[1]
    _direct.kernel(_AL, ids)(sorted_token_ids[:n_sorted], blocks, num_tokens_post_pad[:1], *kargs[3:])
    if not direct_blocks:
        experts_ids.copy_(blocks[: experts_ids.numel()])
        n_blocks = experts_ids.numel()
    sorted_token_ids[n_sorted:].fill_(ids.numel())
    experts_ids[:n_blocks].clamp_(min=0)  # unused blocks: expert 0 (opmux writes -1)
    experts_ids[n_blocks:].fill_(0)
    if cumsum_buffer is not None:
        # expert e's first padded slot: block_size times the blocks of experts before it
        counts = torch.bincount(experts_ids[:n_blocks].long(), minlength=num_experts)[:num_experts]
        used = num_tokens_post_pad[:1].long() // block_size
        counts[0] -= torch.clamp(n_blocks - used, min=0).squeeze(0)  # the unused blocks said 0
        cumsum_buffer[0] = 0
        cumsum_buffer[1 : num_experts + 1].copy_(torch.cumsum(counts, 0) * block_size)
