"""MoE routing ops: one declaration each (``ops/_decl.py``).

``topk_softmax``: softmax over experts in fp32; the top-k experts are chosen by gating logit
(the same order as by probability, but well defined where fp32 softmax underflows to equal
zeros); equal logits are broken by the LOWER expert index, in every backend. With
``renormalize`` the k weights are divided by their sum.

``moe_align_block_size`` (vLLM's layout): for each expert in order, the flat indices
``t * k + j`` of ``topk_ids`` routed to it, in increasing (token) order, padded with ``T * k``
to a multiple of ``block_size``. ``sorted_token_ids`` has ``T*k + E*(block_size-1)`` entries
(the rest hold ``T * k``), ``expert_ids`` one entry per block of ``block_size`` (``-1`` past
``num_tokens_post_padded``), ``num_tokens_post_padded`` is ``[total padded count]``; ``topk_ids``
is int32 or int64 (narrowed to int32 by the contract, out-of-range ids kept out of range). Expert ids
outside ``[0, E)`` raise ``ValueError`` for CPU tensors; on CUDA they are skipped (a device
check would cost a synchronisation), so a kernel never writes out of bounds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import _checks
from .._common import INT32_EXACT, TOLERANCES
from .._decl import declare

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

_TK = "moe.topk_softmax"
_AL = "moe.moe_align_block_size"


def check_topk(op: str, g: Tensor, topk: int, renormalize: bool = False) -> tuple[tuple[Any, ...], Any]:
    _checks.tensor(_TK, "gating_output", g)
    _checks.float_dtype(_TK, "gating_output", g)
    if g.dim() != 2 or g.shape[1] == 0:
        raise ValueError(f"{_TK}: gating_output has shape {tuple(g.shape)}, expected [T, E] with E >= 1")
    k = _checks.positive_int(_TK, "topk", topk)
    if k > g.shape[1]:
        raise ValueError(f"{_TK}: topk {k} exceeds the number of experts {g.shape[1]}")
    _checks.rows(_TK, "gating_output", g, g.shape[1])
    if not isinstance(renormalize, bool):
        raise TypeError(f"{_TK}: renormalize must be a bool, got {renormalize!r}")
    t = g.shape[0]
    w = torch.empty((t, k), dtype=torch.float32, device=g.device)
    ids = torch.empty((t, k), dtype=torch.int32, device=g.device)
    return (w, ids, g, renormalize), (w, ids)


def _check_ids_range(ids: Tensor, num_experts: int) -> None:
    """CPU only (free there); on CUDA the kernels skip bad ids instead of synchronising."""
    if ids.is_cpu and ids.numel():
        lo, hi = torch.aminmax(ids)  # one pass; the rest only when something is wrong
        if int(lo) >= 0 and int(hi) < num_experts:
            return
        bad = ((ids < 0) | (ids >= num_experts)).nonzero()
        if bad.numel():
            where = tuple(bad[0].tolist())
            raise ValueError(
                f"{_AL}: topk_ids{list(where)} = {int(ids[where])} is out of range "
                f"[0, {num_experts}) (num_experts)"
            )


def check_align(op: str, ids: Tensor, block_size: int, num_experts: int) -> tuple[tuple[Any, ...], Any]:
    """-> ((sorted_token_ids, expert_ids, num_tokens_post_padded, ids, block_size, num_experts),
    the three outputs), outputs uninitialised."""
    _checks.tensor(_AL, "topk_ids", ids)
    if ids.dtype != torch.int64:
        _checks.exact_dtype(_AL, "topk_ids", ids, torch.int32)
    if ids.dim() != 2:
        raise ValueError(f"{_AL}: topk_ids has shape {tuple(ids.shape)}, expected [T, k]")
    if not ids.is_contiguous():
        raise ValueError(
            f"{_AL}: topk_ids is non-contiguous (strides {ids.stride()}); pass topk_ids.contiguous()"
        )
    bs = _checks.positive_int(_AL, "block_size", block_size)
    e = _checks.positive_int(_AL, "num_experts", num_experts)
    for name, v in (("block_size", bs), ("num_experts", e)):
        if v >= 2**31:  # the kernels count in int32: report it here, not as a wrapped expert id
            raise ValueError(f"{_AL}: {name} = {v} does not fit int32 (at most {2**31 - 1})")
    max_padded = ids.numel() + e * (bs - 1)
    if max_padded >= 2**31:
        raise ValueError(f"{_AL}: {max_padded} padded slots do not fit int32")
    if ids.dtype == torch.int64:  # the kernels read int32: ids outside [0, E) stay outside
        ids = ids.clamp(-1, e).to(torch.int32)
    dev = ids.device
    out = (
        torch.empty(max_padded, dtype=torch.int32, device=dev),
        torch.empty((max_padded + bs - 1) // bs, dtype=torch.int32, device=dev),
        torch.empty(1, dtype=torch.int32, device=dev),
    )
    return (*out, ids, bs, e), out


def values_align(ids: Tensor, block_size: int, num_experts: int) -> None:
    _check_ids_range(ids, num_experts)


def ref_topk(gating_output: Tensor, topk: int, renormalize: bool = False) -> tuple[Tensor, Tensor]:
    g = gating_output.float()
    probs = torch.softmax(g, dim=-1)
    # stable descending sort: equal logits keep index order, so the lower id wins
    ids = torch.sort(g, dim=-1, descending=True, stable=True).indices[:, :topk]
    w = probs.gather(-1, ids)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    return w, ids.to(torch.int32)


def torch_topk(w: Tensor, ids: Tensor, gating_output: Tensor, renormalize: bool) -> None:
    g = gating_output.float()
    # stable argsort: logit order, equal logits by lower index
    order = torch.argsort(g, dim=-1, descending=True, stable=True)[:, : w.shape[1]]
    lse = torch.logsumexp(g, dim=-1, keepdim=True)
    wk = torch.exp(g.gather(-1, order) - lse)
    if renormalize:
        wk = wk / wk.sum(-1, keepdim=True)
    w.copy_(wk)
    ids.copy_(order)


def ref_align(topk_ids: Tensor, block_size: int, num_experts: int) -> tuple[Tensor, Tensor, Tensor]:
    flat = topk_ids.flatten()
    n = flat.numel()
    if n and (int(flat.min()) < 0 or int(flat.max()) >= num_experts):
        _check_ids_range(topk_ids.cpu(), num_experts)
    max_padded = n + num_experts * (block_size - 1)
    dev = topk_ids.device
    sorted_ids = torch.full((max_padded,), n, dtype=torch.int32, device=dev)
    expert_ids = torch.full(((max_padded + block_size - 1) // block_size,), -1, dtype=torch.int32, device=dev)
    pos = 0
    for e in range(num_experts):
        idx = (flat == e).nonzero().flatten()  # increasing: token order within the expert
        c = idx.numel()
        sorted_ids[pos : pos + c] = idx.to(torch.int32)
        padded = (c + block_size - 1) // block_size * block_size
        expert_ids[pos // block_size : (pos + padded) // block_size] = e
        pos += padded
    return sorted_ids, expert_ids, torch.tensor([pos], dtype=torch.int32, device=dev)


def torch_align(
    sorted_ids: Tensor, expert_ids: Tensor, post: Tensor, topk_ids: Tensor, block_size: int, num_experts: int
) -> None:
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


topk_softmax = declare(
    _TK,
    "(Tensor gating_output, int topk, bool renormalize=False) -> (Tensor, Tensor)",
    doc="gating [T, E] -> (softmax weights fp32 [T, k], expert ids int32 [T, k]); ties -> lower id",
    check=check_topk,
    reference=ref_topk,
    torch=torch_topk,
    # weights are float32 whatever the gating dtype; expert ids must match exactly
    tolerances=(*TOLERANCES, INT32_EXACT),
)
moe_align_block_size = declare(
    _AL,
    "(Tensor topk_ids, int block_size, int num_experts) -> (Tensor, Tensor, Tensor)",
    doc="topk_ids [T, k] -> (sorted_token_ids, expert_ids, num_tokens_post_padded), vLLM layout",
    check=check_align,
    values=values_align,
    reference=ref_align,
    torch=torch_align,
    dtypes=("int32", "int64"),  # int64 ids (vLLM's, sgl's) are narrowed by the contract
    tolerances=(INT32_EXACT, ("int64", (0.0, 0.0))),
)
