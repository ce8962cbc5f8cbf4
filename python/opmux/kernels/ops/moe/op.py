"""MoE routing ops: the reference and every backend, as static methods the spec points at.

``topk_softmax``: softmax over experts in fp32; the top-k experts are chosen by gating logit
(the same order as by probability, but well defined where fp32 softmax underflows to equal
zeros); equal logits are broken by the LOWER expert index, in every backend. With
``renormalize`` the k weights are divided by their sum.

``moe_align_block_size`` (vLLM's layout): for each expert in order, the flat indices
``t * k + j`` of ``topk_ids`` routed to it, in increasing (token) order, padded with ``T * k``
to a multiple of ``block_size``. ``sorted_token_ids`` has ``T*k + E*(block_size-1)`` entries
(the rest hold ``T * k``), ``expert_ids`` one entry per block of ``block_size`` (``-1`` past
``num_tokens_post_padded``), ``num_tokens_post_padded`` is ``[total padded count]``. Expert ids
outside ``[0, E)`` raise ``ValueError`` for CPU tensors; on CUDA they are skipped (a device
check would cost a synchronisation), so a kernel never writes out of bounds.
"""

from __future__ import annotations

import torch

from ...fused_op import BaseFusedOp
from .. import _checks, _native

_TK = "moe.topk_softmax"
_AL = "moe.moe_align_block_size"


def _check_topk(g: torch.Tensor, topk: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    _checks.tensor(_TK, "gating_output", g)
    _checks.float_dtype(_TK, "gating_output", g)
    if g.dim() != 2 or g.shape[1] == 0:
        raise ValueError(f"{_TK}: gating_output has shape {tuple(g.shape)}, expected [T, E] with E >= 1")
    k = _checks.positive_int(_TK, "topk", topk)
    if k > g.shape[1]:
        raise ValueError(f"{_TK}: topk {k} exceeds the number of experts {g.shape[1]}")
    _checks.rows(_TK, "gating_output", g, g.shape[1])
    t = g.shape[0]
    return (
        torch.empty((t, k), dtype=torch.float32, device=g.device),
        torch.empty((t, k), dtype=torch.int32, device=g.device),
    )


def _check_ids_range(ids: torch.Tensor, num_experts: int) -> None:
    """CPU only (free there); on CUDA the kernels skip bad ids instead of synchronising."""
    if ids.is_cpu and ids.numel():
        bad = ((ids < 0) | (ids >= num_experts)).nonzero()
        if bad.numel():
            where = tuple(bad[0].tolist())
            raise ValueError(
                f"{_AL}: topk_ids{list(where)} = {int(ids[where])} is out of range "
                f"[0, {num_experts}) (num_experts)"
            )


def _check_align(
    ids: torch.Tensor, block_size: int, num_experts: int, values: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (sorted_token_ids, expert_ids, num_tokens_post_padded), uninitialised. ``values``:
    also range-check the ids (CPU only; fake impls pass False: no data under torch.compile)."""
    _checks.tensor(_AL, "topk_ids", ids)
    _checks.exact_dtype(_AL, "topk_ids", ids, torch.int32)
    if ids.dim() != 2:
        raise ValueError(f"{_AL}: topk_ids has shape {tuple(ids.shape)}, expected [T, k]")
    if not ids.is_contiguous():
        raise ValueError(
            f"{_AL}: topk_ids is non-contiguous (strides {ids.stride()}); pass topk_ids.contiguous()"
        )
    bs = _checks.positive_int(_AL, "block_size", block_size)
    e = _checks.positive_int(_AL, "num_experts", num_experts)
    max_padded = ids.numel() + e * (bs - 1)
    if max_padded >= 2**31:
        raise ValueError(f"{_AL}: {max_padded} padded slots do not fit int32")
    if values:
        _check_ids_range(ids, e)
    dev = ids.device
    return (
        torch.empty(max_padded, dtype=torch.int32, device=dev),
        torch.empty((max_padded + bs - 1) // bs, dtype=torch.int32, device=dev),
        torch.empty(1, dtype=torch.int32, device=dev),
    )


class TopkSoftmax(BaseFusedOp[tuple[torch.Tensor, torch.Tensor]]):
    op_name = _TK

    @staticmethod
    def forward_native(
        gating_output: torch.Tensor, topk: int, renormalize: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        g = gating_output.float()
        probs = torch.softmax(g, dim=-1)
        # stable descending sort: equal logits keep index order, so the lower id wins
        ids = torch.sort(g, dim=-1, descending=True, stable=True).indices[:, :topk]
        w = probs.gather(-1, ids)
        if renormalize:
            w = w / w.sum(-1, keepdim=True)
        return w, ids.to(torch.int32)

    @staticmethod
    def forward_torch(
        gating_output: torch.Tensor, topk: int, renormalize: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        g = gating_output.float()
        # stable argsort: logit order, equal logits by lower index
        order = torch.argsort(g, dim=-1, descending=True, stable=True)[:, :topk]
        lse = torch.logsumexp(g, dim=-1, keepdim=True)
        w = torch.exp(g.gather(-1, order) - lse)
        if renormalize:
            w = w / w.sum(-1, keepdim=True)
        return w, order.to(torch.int32)

    @staticmethod
    def forward_triton(
        gating_output: torch.Tensor, topk: int, renormalize: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        w, ids = _check_topk(gating_output, topk, renormalize)
        from . import triton_kernels

        triton_kernels.topk_softmax(gating_output, w, ids, bool(renormalize))
        return w, ids

    @staticmethod
    def forward_jit(
        gating_output: torch.Tensor, topk: int, renormalize: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        w, ids = _check_topk(gating_output, topk, renormalize)
        _native.kernel("jit", _TK, gating_output)(w, ids, gating_output, bool(renormalize))
        return w, ids

    @staticmethod
    def forward_aot(
        gating_output: torch.Tensor, topk: int, renormalize: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        w, ids = _check_topk(gating_output, topk, renormalize)
        _native.kernel("aot", _TK, gating_output)(w, ids, gating_output, bool(renormalize))
        return w, ids


class MoeAlignBlockSize(BaseFusedOp[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]):
    op_name = _AL

    @staticmethod
    def forward_native(
        topk_ids: torch.Tensor, block_size: int, num_experts: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        flat = topk_ids.flatten()
        n = flat.numel()
        if n and (int(flat.min()) < 0 or int(flat.max()) >= num_experts):
            _check_ids_range(topk_ids.cpu(), num_experts)
        max_padded = n + num_experts * (block_size - 1)
        dev = topk_ids.device
        sorted_ids = torch.full((max_padded,), n, dtype=torch.int32, device=dev)
        expert_ids = torch.full(
            ((max_padded + block_size - 1) // block_size,), -1, dtype=torch.int32, device=dev
        )
        pos = 0
        for e in range(num_experts):
            idx = (flat == e).nonzero().flatten()  # increasing: token order within the expert
            c = idx.numel()
            sorted_ids[pos : pos + c] = idx.to(torch.int32)
            padded = (c + block_size - 1) // block_size * block_size
            expert_ids[pos // block_size : (pos + padded) // block_size] = e
            pos += padded
        return sorted_ids, expert_ids, torch.tensor([pos], dtype=torch.int32, device=dev)

    @staticmethod
    def forward_torch(
        topk_ids: torch.Tensor, block_size: int, num_experts: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        sorted_ids, expert_ids, post = _check_align(topk_ids, block_size, num_experts)
        flat = topk_ids.flatten().long()
        n, e, bs = flat.numel(), num_experts, block_size
        valid = (flat >= 0) & (flat < e)
        flat = torch.where(valid, flat, e)  # bad ids (CUDA only; CPU raised) sort last, dropped
        counts = torch.bincount(flat, minlength=e + 1)[:e]
        padded = (counts + bs - 1) // bs * bs
        ends = torch.cumsum(padded, 0)
        starts = ends - padded
        order = torch.argsort(flat, stable=True)
        se = flat[order]
        keep = se < e
        order, se = order[keep], se[keep]
        first = torch.cumsum(counts, 0) - counts  # rank of an expert's first entry in `order`
        pos = starts[se] + torch.arange(se.numel(), device=flat.device) - first[se]
        sorted_ids.fill_(n)
        sorted_ids[pos] = order.to(torch.int32)
        total = ends[-1:] if e else torch.zeros(1, dtype=torch.long, device=flat.device)
        blocks = torch.arange(expert_ids.numel(), device=flat.device)
        owner = torch.searchsorted(ends // bs, blocks, right=True)
        expert_ids.copy_(torch.where(blocks < total // bs, owner, -1))
        post.copy_(total)
        return sorted_ids, expert_ids, post

    @staticmethod
    def forward_triton(
        topk_ids: torch.Tensor, block_size: int, num_experts: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        sorted_ids, expert_ids, post = _check_align(topk_ids, block_size, num_experts)
        from . import triton_kernels

        triton_kernels.moe_align(topk_ids, block_size, num_experts, sorted_ids, expert_ids, post)
        return sorted_ids, expert_ids, post

    @staticmethod
    def forward_jit(
        topk_ids: torch.Tensor, block_size: int, num_experts: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = _check_align(topk_ids, block_size, num_experts)
        _native.kernel("jit", _AL, topk_ids)(*out, topk_ids, int(block_size), int(num_experts))
        return out

    @staticmethod
    def forward_aot(
        topk_ids: torch.Tensor, block_size: int, num_experts: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = _check_align(topk_ids, block_size, num_experts)
        _native.kernel("aot", _AL, topk_ids)(*out, topk_ids, int(block_size), int(num_experts))
        return out
