"""MoE routing ops: one declaration each (``ops/_decl.py``).

``topk_softmax``: ``x = moe_softcapping * tanh(logit / moe_softcapping)`` (when > 0), softmax
over experts in fp32; the top-k experts are chosen by ``x`` (the same order as by probability,
but well defined where fp32 softmax underflows to equal zeros); equal keys are broken by the
LOWER expert index, in every backend. ``correction_bias`` [E] (float32): by default DeepSeek's
routing (vLLM's ``e_score_correction_bias``): experts chosen by ``softmax + bias``, weighted by
the softmax; with ``bias_on_logits`` sgl-kernel's: the bias is added to ``x`` before the softmax
(choice and weights). With ``renormalize`` the k weights are divided by their sum. Outputs go
to the caller's ``topk_weights`` (float32) / ``topk_ids`` (int32 or int64, written directly)
when given; ``token_expert_indices`` (int32), when given, gets ``[i, j] = j * T + i``.

``moe_align_block_size`` (vLLM's layout): for each expert in order, the flat indices
``t * k + j`` of ``topk_ids`` (int32 or int64, read directly) routed to it, in increasing
(token) order, padded with ``T * k`` to a multiple of ``block_size``. With ``expert_map``
(expert parallelism, int32 [E]: global id -> local id, -1 when not on this rank) each id is
mapped first and entries mapped to -1 are left out. Outputs: ``sorted_token_ids`` (the op's
own: ``T*k + E*(block_size-1)`` entries; a caller's: at least ``T*k + min(E, T*k)*(block_size-1)``,
every unused slot set to ``T * k`` unless ``pad_sorted_token_ids=False``, which leaves them as
they are), ``expert_ids`` (one per block; blocks past the total hold ``unused_expert_id``, -1 by
default, 0 in both engines), ``num_tokens_post_padded`` ``[total]``, and, when given,
``cumsum_buffer[e]`` = expert e's first slot (``[E]`` the total). Expert ids (and mapped ids)
outside ``[0, E)`` raise ``ValueError`` for CPU tensors; on CUDA they are skipped (a device
check would cost a synchronisation), so a kernel never writes out of bounds.
"""

from __future__ import annotations

import math
from functools import partial
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


def _buffer(
    op: str, name: str, buf: Tensor, shape: tuple[int, ...], dtypes: tuple[Any, ...], ref: Tensor
) -> Tensor:
    """A caller's output buffer: ``shape``, one of ``dtypes``, on ``ref``'s device, rows with a
    unit last stride (the row stride is free)."""
    _checks.tensor(op, name, buf)
    if buf.dtype not in dtypes:
        raise TypeError(
            f"{op}: {name} has dtype {_checks._dt(buf.dtype)}; expected {' or '.join(_checks._dt(d) for d in dtypes)}"
        )
    if tuple(buf.shape) != shape:
        raise ValueError(f"{op}: {name} has shape {tuple(buf.shape)}, expected {list(shape)}")
    _checks.same_device(op, "gating_output" if op == _TK else "topk_ids", ref, **{name: buf})
    if len(shape) == 2 and shape[1] > 1 and buf.stride(1) != 1:
        raise ValueError(f"{op}: {name} has a non-contiguous last dimension (stride {buf.stride(1)})")
    if len(shape) == 2 and shape[0] > 1 and buf.stride(0) < shape[1]:
        raise ValueError(f"{op}: {name} rows overlap (strides {buf.stride()})")
    return buf


def check_topk(
    op: str,
    g: Tensor,
    topk: int,
    renormalize: bool = False,
    correction_bias: Tensor | None = None,
    moe_softcapping: float = 0.0,
    bias_on_logits: bool = False,
    topk_weights: Tensor | None = None,
    topk_ids: Tensor | None = None,
    token_expert_indices: Tensor | None = None,
) -> tuple[tuple[Any, ...], Any]:
    """-> ((w, ids, tei, has_tei, g, bias, has_bias, renormalize, softcap, bias_on_logits), (w, ids));
    absent optional tensors are passed as another (unread) tensor with its flag False."""
    try:  # the serving call (no bias, no buffers), each attribute read once; else the full checks
        gs, dev = g.shape, g.device
        if (
            correction_bias is None
            and topk_weights is None
            and topk_ids is None
            and token_expert_indices is None
            and type(topk) is int
            and type(renormalize) is bool
            and type(bias_on_logits) is bool
            and type(moe_softcapping) is float
            and 0.0 <= moe_softcapping < math.inf
            and len(gs) == 2
            and 0 < topk <= gs[1]
            and g.dtype in _checks.FLOAT_DTYPES
            and (gs[1] == 1 or g.stride()[1] == 1)
            and isinstance(g, torch.Tensor)
        ):
            w = torch.empty(gs[0], topk, dtype=torch.float32, device=dev)
            ids_ = torch.empty(gs[0], topk, dtype=torch.int32, device=dev)
            fast = (w, ids_, ids_, False, g, g, False, renormalize, moe_softcapping, bias_on_logits)
            return fast, (w, ids_)
    except Exception:  # not a tensor, ...: the full checks say what is wrong
        pass
    _checks.no_caller_outputs_when_compiling(
        _TK, "topk_weights / topk_ids / token_expert_indices", topk_weights, topk_ids, token_expert_indices
    )
    _checks.tensor(_TK, "gating_output", g)
    _checks.float_dtype(_TK, "gating_output", g)
    if g.dim() != 2 or g.shape[1] == 0:
        raise ValueError(f"{_TK}: gating_output has shape {tuple(g.shape)}, expected [T, E] with E >= 1")
    k = _checks.positive_int(_TK, "topk", topk)
    t, e = g.shape
    if k > e:
        raise ValueError(f"{_TK}: topk {k} exceeds the number of experts {e}")
    _checks.rows(_TK, "gating_output", g, e)
    for name, flag in (("renormalize", renormalize), ("bias_on_logits", bias_on_logits)):
        if not isinstance(flag, bool):
            raise TypeError(f"{_TK}: {name} must be a bool, got {flag!r}")
    if isinstance(moe_softcapping, bool) or not isinstance(moe_softcapping, (int, float)):
        raise TypeError(f"{_TK}: moe_softcapping must be a float, got {moe_softcapping!r}")
    cap = float(moe_softcapping)
    if not (0.0 <= cap < math.inf):
        raise ValueError(f"{_TK}: moe_softcapping must be finite and >= 0 (0: off), got {moe_softcapping!r}")
    if correction_bias is not None:
        _checks.tensor(_TK, "correction_bias", correction_bias)
        _checks.exact_dtype(_TK, "correction_bias", correction_bias, torch.float32)
        _checks.same_device(_TK, "gating_output", g, correction_bias=correction_bias)
        _checks.vector(_TK, "correction_bias", correction_bias, e, "one per expert")
    w = (
        torch.empty((t, k), dtype=torch.float32, device=g.device)
        if topk_weights is None
        else _buffer(_TK, "topk_weights", topk_weights, (t, k), (torch.float32,), g)
    )
    ids = (
        torch.empty((t, k), dtype=torch.int32, device=g.device)
        if topk_ids is None
        else _buffer(_TK, "topk_ids", topk_ids, (t, k), (torch.int32, torch.int64), g)
    )
    tei = token_expert_indices
    if tei is not None:
        _buffer(_TK, "token_expert_indices", tei, (t, k), (torch.int32,), g)
    bias = correction_bias
    kargs = (
        w,
        ids,
        ids if tei is None else tei,
        tei is not None,
        g,
        g if bias is None else bias,
        bias is not None,
    )
    return (*kargs, renormalize, cap, bias_on_logits), (w, ids)


def _int32(device: torch.device, n: int) -> Tensor:
    return torch.empty(n, dtype=torch.int32, device=device)


def _check_ids_range(ids: Tensor, num_experts: int, expert_map: Tensor | None = None) -> None:
    """CPU only (free there); on CUDA the kernels skip bad ids instead of synchronising."""
    if ids.is_cpu and ids.numel():
        if not _checks.in_range(ids, 0, num_experts):  # the rest only when something is wrong
            bad = ((ids < 0) | (ids >= num_experts)).nonzero()
            where = tuple(bad[0].tolist())
            raise ValueError(
                f"{_AL}: topk_ids{list(where)} = {int(ids[where])} is out of range "
                f"[0, {num_experts}) (num_experts)"
            )
    if expert_map is not None and expert_map.is_cpu and expert_map.numel():
        if not _checks.in_range(expert_map, -1, num_experts):
            e = int(((expert_map < -1) | (expert_map >= num_experts)).nonzero()[0, 0])
            raise ValueError(
                f"{_AL}: expert_map[{e}] = {int(expert_map[e])} is out of range: local expert ids are "
                f"[0, {num_experts}), or -1 for an expert not on this rank"
            )


def _align_bound(numel: int, num_experts: int, block_size: int) -> int:
    """An upper bound of the padded total: every used expert (at most min(E, numel)) pads by
    fewer than block_size slots."""
    return numel + min(num_experts, numel) * (block_size - 1)


def _vec_buffer(name: str, buf: Tensor, n: int, what: str, ref: Tensor) -> Tensor:
    """A caller's int32 vector of at least ``n`` elements (dense); the kernels write all of it."""
    _checks.tensor(_AL, name, buf)
    _checks.exact_dtype(_AL, name, buf, torch.int32)
    _checks.same_device(_AL, "topk_ids", ref, **{name: buf})
    if buf.dim() != 1 or buf.shape[0] < n:
        raise ValueError(
            f"{_AL}: {name} has shape {tuple(buf.shape)}, expected a vector of at least {n} ({what})"
        )
    if buf.shape[0] > 1 and buf.stride(0) != 1:
        raise ValueError(f"{_AL}: {name} has stride {buf.stride(0)}; it must be dense")
    return buf


def check_align(
    op: str,
    ids: Tensor,
    block_size: int,
    num_experts: int,
    expert_map: Tensor | None = None,
    pad_sorted_token_ids: bool = True,
    unused_expert_id: int = -1,
    sorted_token_ids: Tensor | None = None,
    expert_ids: Tensor | None = None,
    num_tokens_post_padded: Tensor | None = None,
    cumsum_buffer: Tensor | None = None,
) -> tuple[tuple[Any, ...], Any]:
    """-> ((sorted_token_ids, expert_ids, num_tokens_post_padded, cumsum, has_cumsum, ids,
    expert_map, has_map, block_size, num_experts, pad, unused_expert_id), the three outputs);
    absent optional tensors are passed as another (unread) tensor with its flag False."""
    try:  # the serving call (no map, no buffers), each attribute read once; else the full checks
        if (
            expert_map is None
            and sorted_token_ids is None
            and expert_ids is None
            and num_tokens_post_padded is None
            and cumsum_buffer is None
            and type(block_size) is int
            and type(num_experts) is int
            and type(pad_sorted_token_ids) is bool
            and type(unused_expert_id) is int
            and 0 < block_size < 2**31
            and 0 < num_experts < 2**31
            and abs(unused_expert_id) < 2**31
            and (ids.dtype == torch.int32 or ids.dtype == torch.int64)
            and ids.dim() == 2
            and ids.is_contiguous()
            and isinstance(ids, torch.Tensor)
        ):
            max_padded = ids.numel() + num_experts * (block_size - 1)
            if max_padded < 2**31:
                # int32 ids: new_empty takes their dtype and device (no keyword parsing, ~0.3 us each)
                new = ids.new_empty if ids.dtype == torch.int32 else partial(_int32, ids.device)
                sorted_ids = new(max_padded)
                experts = new((max_padded + block_size - 1) // block_size)
                post = new(1)
                fast = (sorted_ids, experts, post, post, False, ids, ids, False)
                return (*fast, block_size, num_experts, True, unused_expert_id), (sorted_ids, experts, post)
    except Exception:  # not a tensor, ...: the full checks say what is wrong
        pass
    _checks.no_caller_outputs_when_compiling(
        _AL,
        "sorted_token_ids / expert_ids / num_tokens_post_padded / cumsum_buffer",
        sorted_token_ids,
        expert_ids,
        num_tokens_post_padded,
        cumsum_buffer,
    )
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
    if not isinstance(pad_sorted_token_ids, bool):
        raise TypeError(f"{_AL}: pad_sorted_token_ids must be a bool, got {pad_sorted_token_ids!r}")
    if (
        isinstance(unused_expert_id, bool)
        or not isinstance(unused_expert_id, int)
        or abs(unused_expert_id) >= 2**31
    ):
        raise ValueError(f"{_AL}: unused_expert_id must be an int32, got {unused_expert_id!r}")
    numel = ids.numel()
    max_padded = numel + e * (bs - 1)
    if max_padded >= 2**31:
        raise ValueError(f"{_AL}: {max_padded} padded slots do not fit int32")
    if expert_map is not None:
        _checks.tensor(_AL, "expert_map", expert_map)
        _checks.exact_dtype(_AL, "expert_map", expert_map, torch.int32)
        _checks.same_device(_AL, "topk_ids", ids, expert_map=expert_map)
        _checks.vector(_AL, "expert_map", expert_map, e, "global expert id -> local id, or -1")
    dev = ids.device
    need = _align_bound(numel, e, bs)
    if sorted_token_ids is None:
        sorted_ids = torch.empty(max_padded, dtype=torch.int32, device=dev)
        pad = True  # the op's own buffer is always padded
    else:
        sorted_ids = _vec_buffer(
            "sorted_token_ids", sorted_token_ids, need, "T*k + min(E, T*k)*(block_size-1)", ids
        )
        pad = pad_sorted_token_ids
    if expert_ids is None:
        experts = torch.empty((max_padded + bs - 1) // bs, dtype=torch.int32, device=dev)
    else:
        experts = _vec_buffer("expert_ids", expert_ids, need // bs, "one per block", ids)
    if num_tokens_post_padded is None:
        post = torch.empty(1, dtype=torch.int32, device=dev)
    else:
        post = _vec_buffer("num_tokens_post_padded", num_tokens_post_padded, 1, "the padded total", ids)
    if cumsum_buffer is not None:
        _vec_buffer("cumsum_buffer", cumsum_buffer, e + 1, "num_experts + 1", ids)
    kargs = (
        sorted_ids,
        experts,
        post,
        post if cumsum_buffer is None else cumsum_buffer,
        cumsum_buffer is not None,
        ids,
        ids if expert_map is None else expert_map,
        expert_map is not None,
        bs,
        e,
        pad,
        unused_expert_id,
    )
    return kargs, (sorted_ids, experts, post)


def values_align(
    ids: Tensor, block_size: int, num_experts: int, expert_map: Tensor | None = None, *_: Any
) -> None:
    _check_ids_range(ids, num_experts, expert_map)


def _softcap(g: Tensor, cap: float) -> Tensor:
    return g if not cap else torch.tanh(g / cap) * cap


def _token_expert_indices(buf: Tensor, t: int, k: int) -> None:
    """``[i, j] = j * T + i``: the row of token i's j-th copy in the expanded (k-major) input."""
    src = torch.arange(k, device=buf.device, dtype=torch.int64).mul_(t)
    buf.copy_(src.unsqueeze(0) + torch.arange(t, device=buf.device, dtype=torch.int64).unsqueeze(1))


def ref_topk(
    gating_output: Tensor,
    topk: int,
    renormalize: bool = False,
    correction_bias: Tensor | None = None,
    moe_softcapping: float = 0.0,
    bias_on_logits: bool = False,
    topk_weights: Tensor | None = None,
    topk_ids: Tensor | None = None,
    token_expert_indices: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    g = _softcap(gating_output.float(), float(moe_softcapping))
    bias = None if correction_bias is None else correction_bias.float()
    if bias is not None and bias_on_logits:
        g = g + bias
    probs = torch.softmax(g, dim=-1)
    # rank by logit (by softmax + bias for DeepSeek's correction bias); a stable descending
    # sort: equal keys keep index order, so the lower id wins
    key = probs + bias if bias is not None and not bias_on_logits else g
    ids = torch.sort(key, dim=-1, descending=True, stable=True).indices[:, :topk]
    w = probs.gather(-1, ids)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    if token_expert_indices is not None:
        _token_expert_indices(token_expert_indices, g.shape[0], topk)
    w = w if topk_weights is None else topk_weights.copy_(w)
    ids = ids.to(torch.int32) if topk_ids is None else topk_ids.copy_(ids)
    return w, ids


def torch_topk(
    w: Tensor,
    ids: Tensor,
    tei: Tensor,
    has_tei: bool,
    gating_output: Tensor,
    bias: Tensor,
    has_bias: bool,
    renormalize: bool,
    softcap: float,
    bias_on_logits: bool,
) -> None:
    g = _softcap(gating_output.float(), softcap)
    if has_bias and bias_on_logits:
        g = g + bias
    k = w.shape[1]
    lse = torch.logsumexp(g, dim=-1, keepdim=True)
    if has_bias and not bias_on_logits:
        p = torch.softmax(g, dim=-1)
        order = torch.argsort(p + bias, dim=-1, descending=True, stable=True)[:, :k]
        wk = p.gather(-1, order)
    else:
        # stable argsort: logit order, equal logits by lower index
        order = torch.argsort(g, dim=-1, descending=True, stable=True)[:, :k]
        wk = torch.exp(g.gather(-1, order) - lse)
    if renormalize:
        wk = wk / wk.sum(-1, keepdim=True)
    w.copy_(wk)
    ids.copy_(order)
    if has_tei:
        _token_expert_indices(tei, g.shape[0], k)


def _mapped(flat: Tensor, num_experts: int, expert_map: Tensor | None) -> Tensor:
    """Each entry's bin: its expert (through ``expert_map``), or ``num_experts`` when it is not
    placed (mapped to -1; on CUDA also an id out of range)."""
    e = num_experts
    valid = (flat >= 0) & (flat < e)
    flat = torch.where(valid, flat, e)
    if expert_map is not None:
        local = torch.cat([expert_map.long(), expert_map.new_full((1,), -1).long()])[flat]
        flat = torch.where((local >= 0) & (local < e), local, e)
    return flat


def ref_align(
    topk_ids: Tensor,
    block_size: int,
    num_experts: int,
    expert_map: Tensor | None = None,
    pad_sorted_token_ids: bool = True,
    unused_expert_id: int = -1,
    sorted_token_ids: Tensor | None = None,
    expert_ids: Tensor | None = None,
    num_tokens_post_padded: Tensor | None = None,
    cumsum_buffer: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    flat = topk_ids.flatten()
    n = flat.numel()
    if n and (int(flat.min()) < 0 or int(flat.max()) >= num_experts):
        _check_ids_range(topk_ids.cpu(), num_experts)
    if expert_map is not None:
        _check_ids_range(topk_ids[:0].cpu(), num_experts, expert_map.cpu())
    bins = _mapped(flat.long(), num_experts, expert_map)
    max_padded = n + num_experts * (block_size - 1)
    dev = topk_ids.device
    if sorted_token_ids is None:
        sorted_ids = torch.full((max_padded,), n, dtype=torch.int32, device=dev)
    else:
        sorted_ids = sorted_token_ids
        if pad_sorted_token_ids:
            sorted_ids.fill_(n)
    nblocks = (max_padded + block_size - 1) // block_size if expert_ids is None else expert_ids.numel()
    experts = torch.full((nblocks,), unused_expert_id, dtype=torch.int32, device=dev)
    starts = []
    pos = 0
    for e in range(num_experts):
        starts.append(pos)
        idx = (bins == e).nonzero().flatten()  # increasing: token order within the expert
        c = idx.numel()
        sorted_ids[pos : pos + c] = idx.to(torch.int32)
        padded = (c + block_size - 1) // block_size * block_size
        experts[pos // block_size : (pos + padded) // block_size] = e
        pos += padded
    if expert_ids is not None:
        experts = expert_ids.copy_(experts)
    post = torch.tensor([pos], dtype=torch.int32, device=dev)
    if num_tokens_post_padded is not None:
        post = num_tokens_post_padded
        post[0] = pos
    if cumsum_buffer is not None:
        cumsum_buffer[: num_experts + 1].copy_(torch.tensor([*starts, pos], dtype=torch.int32))
    return sorted_ids, experts, post


def torch_align(
    sorted_ids: Tensor,
    expert_ids: Tensor,
    post: Tensor,
    cumsum: Tensor,
    has_cumsum: bool,
    topk_ids: Tensor,
    expert_map: Tensor,
    has_map: bool,
    block_size: int,
    num_experts: int,
    pad: bool,
    fill: int,
) -> None:
    flat = topk_ids.flatten().long()
    n, e, bs = flat.numel(), num_experts, block_size
    flat = _mapped(flat, e, expert_map if has_map else None)  # bad ids (CUDA only) sort last, dropped
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
    if pad:
        sorted_ids.fill_(n)
    sorted_ids[pos] = order.to(torch.int32)
    total = ends[-1:]
    blocks = torch.arange(expert_ids.numel(), device=flat.device)
    owner = torch.searchsorted(ends // bs, blocks, right=True)
    expert_ids.copy_(torch.where(blocks < total // bs, owner, fill))
    post[:1].copy_(total)
    if has_cumsum:
        cumsum[:e].copy_(starts)
        cumsum[e : e + 1].copy_(total)


topk_softmax = declare(
    _TK,
    "(Tensor gating_output, int topk, bool renormalize=False, Tensor? correction_bias=None, "
    "float moe_softcapping=0.0, bool bias_on_logits=False, Tensor(a!)? topk_weights=None, "
    "Tensor(a!)? topk_ids=None, Tensor(a!)? token_expert_indices=None) -> (Tensor, Tensor)",
    doc="gating [T, E] -> (softmax weights fp32 [T, k], expert ids int32/int64 [T, k]); ties -> lower id; "
    "softcap, correction bias (DeepSeek: chosen by softmax + bias; bias_on_logits: sgl-kernel's), "
    "caller buffers, token_expert_indices",
    check=check_topk,
    reference=ref_topk,
    torch=torch_topk,
    # weights are float32 whatever the gating dtype; expert ids must match exactly
    tolerances=(*TOLERANCES, INT32_EXACT, ("int64", (0.0, 0.0))),
)
moe_align_block_size = declare(
    _AL,
    "(Tensor topk_ids, int block_size, int num_experts, Tensor? expert_map=None, "
    "bool pad_sorted_token_ids=True, int unused_expert_id=-1, Tensor(a!)? sorted_token_ids=None, "
    "Tensor(a!)? expert_ids=None, Tensor(a!)? num_tokens_post_padded=None, "
    "Tensor(a!)? cumsum_buffer=None) -> (Tensor, Tensor, Tensor)",
    doc="topk_ids [T, k] -> (sorted_token_ids, expert_ids, num_tokens_post_padded), vLLM layout; "
    "expert_map (global -> local, -1: not on this rank), caller buffers, cumsum_buffer",
    check=check_align,
    values=values_align,
    reference=ref_align,
    torch=torch_align,
    dtypes=("int32", "int64"),  # int64 ids (vLLM's, sgl's) are read as they are
    tolerances=(INT32_EXACT, ("int64", (0.0, 0.0))),
)
